"""SPG (docs/spec.md §1.5): the sandwiched policy gradient of Wang et al. 2025 ("SPG: Sandwiched Policy
Gradient for Masked Diffusion Language Models").

A ratio-free policy gradient in which the intractable ``log π(o)`` is replaced by a lower bound for
sequences to reinforce and by an upper bound for sequences to discourage, so that ``A·bound ≤ A·log π``
holds on both sides:

    bound_n = ELBO_n                            if A_n > 0
    bound_n = ω·EUBO_n + (1 − ω)·ELBO_n         if A_n ≤ 0
    L = −(1/N) Σ_n (1/|o_n|) Σ_i A_{n,i}·b_{n,i}

with per-token ``b_{n,i}`` the ELBO contribution (A > 0) or ``ω·EUBO_i + (1 − ω)·ELBO_i`` (A ≤ 0),
``EUBO_i = (1/β) log Σ_r c_r 1[i masked in x_r] p_θ(o_i | x_r)^β``, both from the same block-wise
masks (the ``spg_bounds`` likelihood returns them as ``PerToken(elbo=..., eubo=...)``; this objective
declares ``reads = ("elbo", "eubo")``). With a credit module's per-token advantages the branch is
chosen per token by the sign of ``A_{n,i}``. Defaults β = 1.5 (a likelihood field, ``eubo_beta``),
ω = 0.5. ``aggregation: token_mean`` weights sequences by length as SPG's released code does
(``Σ_n −A_n·bound_n / Σ_n |o_n|``; with ``likelihood: {name: spg_bounds, masking: spg_public}``).

Numerics (users report collapse to one repeated character and NaN log-probs with the EUBO): the EUBO
is computed in log-sum-exp form with log-probs floored (:func:`maskrl.likelihood.elbo.eubo_tokens`),
and this objective raises on non-finite bounds or advantages, naming the rows, instead of stepping.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from maskrl.likelihood.base import PerToken
from maskrl.objectives.base import AGGREGATIONS, OBJECTIVES, Objective, aggregate
from maskrl.types import LossOutput


def sandwich_tokens(elbo_tok: torch.Tensor, eubo_tok: torch.Tensor, advantages: torch.Tensor,
                    omega: float) -> torch.Tensor:
    """Per-token bound ``b [N, L]``: ``elbo`` where ``A > 0``, ``ω·eubo + (1−ω)·elbo`` where ``A ≤ 0``."""
    return torch.where(advantages > 0, elbo_tok, omega * eubo_tok + (1.0 - omega) * elbo_tok)


@OBJECTIVES.register("spg")
@dataclass(frozen=True)
class SPG(Objective):
    """Registered as ``spg`` (docs/spec.md §1.5); see the module docstring for the loss.

    Attributes:
        omega: ω, the EUBO share of the bound for A ≤ 0 **[choice]** (default 0.5).
        normalize: group advantage normalisation **[choice]** (docs/spec.md §1.3; default ``"mean"``).
        aggregation: **[choice]** ``"seq_mean"`` (default: each sequence's token sum divided by its
            length, then summed and divided by the trainer's global sequence count) or
            ``"token_mean"`` (sum over all tokens / the global token count: SPG's released code).

    Ratio-free (θ_old never computed) and without a reference.
    """

    default_likelihood: ClassVar[str] = "spg_bounds"
    reads: ClassVar[tuple[str, ...]] = ("elbo", "eubo")
    uses_ratio: ClassVar[bool] = False
    omega: float = 0.5
    normalize: str = "mean"
    aggregation: str = "seq_mean"

    def __post_init__(self) -> None:
        if not 0.0 <= self.omega <= 1.0:
            raise ValueError(f"omega (={self.omega}) must lie in [0, 1]")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation {self.aggregation!r} is not one of {AGGREGATIONS}")
        self.check_fields()

    def __call__(self, logp: PerToken, logp_old: PerToken | None, logp_ref: PerToken | None,
                 advantages: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> LossOutput:
        """Loss of one (micro-)batch.

        Args:
            logp: ``PerToken(elbo=[N, L], eubo=[N, L])`` float bound contributions (``spg_bounds``), with grad.
            logp_old, logp_ref: unused.
            advantages: ``[N, L]`` float per-token advantages.
            mask: ``[N, L]`` bool, tokens that count.
            normalizer: global number of sequences (``seq_mean``) or tokens (``token_mean``); default
                this micro-batch's.

        Returns:
            :class:`LossOutput`; metrics (shares, aggregated like the loss): ``policy_loss``, ``elbo``,
            ``eubo`` (length-normalised bounds under ``seq_mean``), ``neg_frac`` (share of tokens with
            A ≤ 0; of sequences when A is constant per sequence and under ``seq_mean``).

        Raises:
            ValueError: ``logp`` has no ``elbo`` / ``eubo`` (the likelihood is not ``spg_bounds``), or
                a non-finite bound / advantage (names the rows).
        """
        if not isinstance(logp, PerToken) or not {"elbo", "eubo"} <= set(logp.names):
            raise ValueError("spg needs the spg_bounds likelihood (ELBO and EUBO per token, a PerToken record); got "
                             f"{type(logp).__name__}: set `likelihood: {{name: spg_bounds}}`")
        elbo_tok, eubo_tok = logp["elbo"], logp["eubo"]
        for name, t in (("ELBO", elbo_tok), ("EUBO", eubo_tok), ("advantages", advantages)):
            bad = ~torch.isfinite(t.detach())
            if bad.any():
                raise ValueError(f"spg: non-finite {name} in rows {bad.any(-1).nonzero().flatten().tolist()[:8]}")
        b = sandwich_tokens(elbo_tok, eubo_tok, advantages, self.omega)  # [N, L]
        policy_loss = aggregate(-advantages * b, mask, self.aggregation, normalizer)
        metrics = {"policy_loss": policy_loss.item(), "elbo": self.share(elbo_tok, mask, normalizer),
                   "eubo": self.share(eubo_tok, mask, normalizer),
                   "neg_frac": self.share((advantages <= 0).float(), mask, normalizer)}
        return LossOutput(loss=policy_loss, metrics=metrics)
