"""SPG (SPEC §1.5): the sandwiched policy gradient of Wang et al. 2025 ("SPG: Sandwiched Policy
Gradient for Masked Diffusion Language Models").

A ratio-free policy gradient in which the intractable ``log π(o)`` is replaced by a lower bound for
sequences to reinforce and by an upper bound for sequences to discourage, so that ``A·bound ≤ A·log π``
holds on both sides:

    bound_n = ELBO_n                            if A_n > 0
    bound_n = ω·EUBO_n + (1 − ω)·ELBO_n         if A_n ≤ 0
    L = −(1/N) Σ_n (1/|o_n|) Σ_i A_{n,i}·b_{n,i}

with per-token ``b_{n,i}`` the ELBO contribution (A > 0) or ``ω·EUBO_i + (1 − ω)·ELBO_i`` (A ≤ 0),
``EUBO_i = (1/β) log Σ_r c_r 1[i masked in x_r] p_θ(o_i | x_r)^β``, both from the same block-wise
masks (the ``spg_bounds`` likelihood, which returns them as one complex ``[N, L]`` tensor: real part
ELBO, imaginary part EUBO). With a credit module's per-token advantages the branch is chosen per token
by the sign of ``A_{n,i}``. Defaults β = 1.5 (a likelihood field, ``eubo_beta``), ω = 0.5.

Numerics (users report collapse to one repeated character and NaN log-probs with the EUBO): the EUBO
is computed in log-sum-exp form with log-probs floored (:func:`maskrl.likelihood.elbo.eubo_tokens`),
and this objective raises on non-finite bounds or advantages, naming the rows, instead of stepping.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from maskrl.objectives.base import Objective
from maskrl.types import LossOutput


def sandwich_tokens(elbo_tok: torch.Tensor, eubo_tok: torch.Tensor, advantages: torch.Tensor,
                    omega: float) -> torch.Tensor:
    """Per-token bound ``b [N, L]``: ``elbo`` where ``A > 0``, ``ω·eubo + (1−ω)·elbo`` where ``A ≤ 0``."""
    return torch.where(advantages > 0, elbo_tok, omega * eubo_tok + (1.0 - omega) * elbo_tok)


@dataclass(frozen=True)
class SPG(Objective):
    """Registered as ``spg`` (SPEC §1.5); see the module docstring for the loss.

    Attributes:
        omega: ω, the EUBO share of the bound for A ≤ 0 **[choice]** (default 0.5).
        normalize: group advantage normalisation **[choice]** (SPEC §1.3; default ``"mean"``).

    Aggregation is over sequences (each sequence's token sum divided by its length, then summed and
    divided by the trainer's global sequence count). Ratio-free (θ_old never computed) and without a
    reference.
    """

    default_likelihood: ClassVar[str] = "spg_bounds"
    aggregation: ClassVar[str] = "seq_mean"
    uses_ratio: ClassVar[bool] = False
    omega: float = 0.5
    normalize: str = "mean"

    def __post_init__(self) -> None:
        if not 0.0 <= self.omega <= 1.0:
            raise ValueError(f"omega (={self.omega}) must lie in [0, 1]")
        self.check_fields()

    def __call__(self, logp: torch.Tensor, logp_old: torch.Tensor | None, logp_ref: torch.Tensor | None,
                 advantages: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> LossOutput:
        """Loss of one (micro-)batch.

        Args:
            logp: ``[N, L]`` complex (``spg_bounds``: real ELBO, imaginary EUBO contributions), with grad.
            logp_old, logp_ref: unused.
            advantages: ``[N, L]`` float per-token advantages.
            mask: ``[N, L]`` bool, tokens that count.
            normalizer: global number of sequences (default this micro-batch's N).

        Returns:
            :class:`LossOutput`; metrics (sequence shares): ``policy_loss``, ``elbo``, ``eubo``
            (length-normalised bounds), ``neg_frac`` (share of sequences with mean A ≤ 0).

        Raises:
            ValueError: ``logp`` is not complex (the likelihood is not ``spg_bounds``), or a
                non-finite bound / advantage (names the rows).
        """
        if not logp.is_complex():
            raise ValueError("spg needs the spg_bounds likelihood (ELBO and EUBO per token); got a real tensor "
                             "from another likelihood: set `likelihood: {name: spg_bounds}`")
        elbo_tok, eubo_tok = logp.real, logp.imag
        for name, t in (("ELBO", elbo_tok), ("EUBO", eubo_tok), ("advantages", advantages)):
            bad = ~torch.isfinite(t.detach())
            if bad.any():
                raise ValueError(f"spg: non-finite {name} in rows {bad.any(-1).nonzero().flatten().tolist()[:8]}")
        m = mask.float()
        length = m.sum(-1).clamp(min=1.0)  # [N]
        denom = normalizer if normalizer is not None else max(logp.shape[0], 1)
        b = sandwich_tokens(elbo_tok, eubo_tok, advantages, self.omega)  # [N, L]
        per_seq = -(advantages * b * m).sum(-1) / length  # [N]
        policy_loss = per_seq.sum() / denom
        real = (m.sum(-1) > 0).float()
        mean_a = (advantages.detach() * m).sum(-1) / length
        metrics = {"policy_loss": policy_loss.item(),
                   "elbo": ((elbo_tok.detach() * m).sum(-1) / length).sum().item() / denom,
                   "eubo": ((eubo_tok.detach() * m).sum(-1) / length).sum().item() / denom,
                   "neg_frac": ((mean_a <= 0).float() * real).sum().item() / denom}
        return LossOutput(loss=policy_loss, metrics=metrics)
