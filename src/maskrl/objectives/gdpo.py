"""GDPO (docs/spec.md §1.5): one clipped, length-normalised *sequence* ratio on the ELBO.

The diffusion GDPO of Rojas et al. ("Improving reasoning for diffusion language models via group
diffusion policy optimization", 2025) -- **not** NVIDIA's multi-reward "GDPO" of the same name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from maskrl.objectives.base import OBJECTIVES, Objective, clip_binds, importance_ratio, kl3, kl3_clamped, ratio_clamped
from maskrl.types import LossOutput


@OBJECTIVES.register("gdpo")
@dataclass(frozen=True)
class GDPO(Objective):
    """Registered as ``gdpo``: ``ρ_n = exp((E_n − E_n^old)/|o_n|)`` with ``E_n = Σ_i ℓ_{n,i}`` the
    sequence ELBO (the ``elbo`` likelihood's per-token contributions summed over the mask) and
    ``|o_n|`` its token count (the mean log-ratio clamped to ±20 before ``exp``,
    :func:`~maskrl.objectives.base.importance_ratio`), and

    ``L = −(1/N) Σ_n (1/|o_n|) Σ_i min(ρ_n A_{n,i}, clip(ρ_n, 1−ε, 1+ε) A_{n,i}) + β·(1/N) Σ_n KL3_n``

    with ``KL3_n = kl3(E_n/|o_n|, E_n^ref/|o_n|)``. Without a credit module ``A_{n,i} = A_n = r − mean``
    and the policy term is the usual sequence-level clipped objective ``−min(ρA, clip(ρ)A)``; a credit
    module's per-token advantages are averaged over the sequence inside the min, per token.
    Aggregation is over sequences (the trainer's normaliser is the global sequence count).

    Not NVIDIA's multi-reward GDPO (Group reward-Decoupled normalisation Policy Optimization).

    Attributes:
        clip_eps: ε of the sequence ratio (default 0.2).
        beta: KL weight (default 0: no reference).
        normalize: group advantage normalisation **[choice]** (docs/spec.md §1.3; GDPO: ``"mean"``).
    """

    default_likelihood: ClassVar[str] = "elbo"
    aggregation: ClassVar[str] = "seq_mean"  # read by the trainer: normaliser = number of sequences
    clip_eps: float = 0.2
    beta: float = 0.0
    normalize: str = "mean"

    def __post_init__(self) -> None:
        self.check_fields()

    def clip_range(self) -> tuple[float, float]:
        """``(ε_low, ε_high)`` of the sequence ratio's clip ``[1 − ε_low, 1 + ε_high]`` (GDPO: both ε)."""
        return self.clip_eps, self.clip_eps

    def sequence_log_ratio(self, e: torch.Tensor, e_old: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """``[N]`` log-ratio of each sequence from its ELBOs ``e``, ``e_old`` ``[N]`` and token counts
        ``length`` ``[N]`` (GDPO: ``(E − E^old)/|o|``)."""
        return (e - e_old) / length

    def kl_arguments(self, e: torch.Tensor, e_ref: torch.Tensor,
                     length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The two ``[N]`` log-likelihoods the KL3 compares (GDPO: the length-normalised ELBOs)."""
        return e / length, e_ref / length

    def sequence_advantages(self, advantages: torch.Tensor, m: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """``[N, L]`` advantages entering the min (GDPO: a credit module's per-token ones, as given)."""
        return advantages

    def __call__(self, logp: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor | None,
                 advantages: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> LossOutput:
        """Loss of one (micro-)batch.

        Args:
            logp, logp_old: ``[N, L]`` per-token ELBO contributions under θ / θ_old (same masks).
            logp_ref: ``[N, L]`` under the reference when ``beta > 0``, else ``None``.
            advantages: ``[N, L]`` per-token advantages.
            mask: ``[N, L]`` bool, tokens of each sequence.
            normalizer: global number of sequences (default: this micro-batch's N).

        Returns:
            :class:`LossOutput`; metrics (sequence shares) ``policy_loss``, ``clip_frac`` (each
            sequence's share of tokens where the clip binds -- ``ρ_n > 1 + ε`` with ``A_{n,i} > 0``, or
            ``ρ_n < 1 − ε`` with ``A_{n,i} < 0`` --, 0 or 1 per sequence without a credit module),
            ``ratio_mean``, ``ratio_clamp_frac`` (sequences whose mean log-ratio ``|E_n − E_n^old|/|o_n|``
            exceeds 20, so that ρ_n is held at ``e^{±20}``), and when β > 0 ``kl`` and ``kl_clamp_frac`` (sequences whose mean log-ratio
            the k3 clamp bounds).

        Raises:
            ValueError: ``beta > 0`` without ``logp_ref``.
        """
        m = mask.float()
        length = m.sum(-1).clamp(min=1.0)  # [N]
        denom = normalizer if normalizer is not None else max(logp.shape[0], 1)
        e, e_old = (logp * m).sum(-1), (logp_old * m).sum(-1)  # [N]
        log_ratio = self.sequence_log_ratio(e, e_old, length)  # [N]
        ratio = importance_ratio(log_ratio)  # [N]
        eps_low, eps_high = self.clip_range()
        clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
        advantages = self.sequence_advantages(advantages, m, length)
        per_tok = -torch.minimum(ratio[:, None] * advantages, clipped[:, None] * advantages)  # [N, L]
        per_seq = (per_tok * m).sum(-1) / length  # [N]
        policy_loss = per_seq.sum() / denom
        loss = policy_loss
        real = (m.sum(-1) > 0).float()
        binds = clip_binds(ratio[:, None], advantages, eps_low, eps_high).float()  # [N, L]
        metrics = {"policy_loss": policy_loss.item(),
                   "clip_frac": ((binds * m).sum(-1) / length).sum().item() / denom,
                   "ratio_mean": (ratio.detach() * real).sum().item() / denom,
                   "ratio_clamp_frac": (ratio_clamped(log_ratio).float() * real).sum().item() / denom}
        if self.beta > 0:
            if logp_ref is None:
                raise ValueError("beta > 0 needs logp_ref")
            x, x_ref = self.kl_arguments(e, (logp_ref * m).sum(-1), length)
            kl = (kl3(x, x_ref) * real).sum() / denom
            loss = loss + self.beta * kl
            metrics["kl"] = kl.item()
            metrics["kl_clamp_frac"] = (kl3_clamped(x, x_ref).float() * real).sum().item() / denom
        return LossOutput(loss=loss, metrics=metrics)
