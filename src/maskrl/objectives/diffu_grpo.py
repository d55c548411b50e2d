"""diffu-GRPO (d1; docs/spec.md §1.5): per-token clipped importance ratio plus β·KL3 to the reference."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from maskrl.objectives.base import AGGREGATIONS, OBJECTIVES, Objective, aggregate, clip_binds, importance_ratio, kl3, \
    kl3_clamped, ratio_clamped
from maskrl.types import LossOutput


@OBJECTIVES.register("diffu_grpo")
@dataclass(frozen=True)
class DiffuGRPO(Objective):
    """``L = −agg[min(ρ_i A_i, clip(ρ_i, 1−ε, 1+ε) A_i)] + β·agg[KL3_i]``, ``ρ_i = exp(ℓ_i − ℓ_i^old)``
    with the log-ratio clamped to ±20 before ``exp`` (:func:`~maskrl.objectives.base.importance_ratio`),
    ``KL3_i`` the k3 estimate with its log-ratio clamped the same way
    (:func:`~maskrl.objectives.base.kl3`).

    Attributes:
        clip_eps: ε (default 0.5, d1).
        beta: β, KL weight (default 0.04); 0 skips the reference entirely.
        aggregation: **[choice]** token-loss reduction, see :func:`maskrl.objectives.base.aggregate`.
        normalize: group advantage normalisation **[choice]** (docs/spec.md §1.3; d1: ``"mean"``).

    Its default likelihood is ``mean_field`` as in d1; the YAML section ``likelihood: {name: state}``
    scores each token at its commit state instead (what the Sudoku demo uses).
    """

    clip_eps: float = 0.5
    beta: float = 0.04
    aggregation: str = "token_mean"
    normalize: str = "mean"

    def __post_init__(self) -> None:
        self.check_fields()
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation {self.aggregation!r} is not one of {AGGREGATIONS}")

    def reduce(self, per_token: torch.Tensor, mask: torch.Tensor, normalizer: float | None) -> torch.Tensor:
        """The loss's token reduction (:func:`~maskrl.objectives.base.aggregate` with :attr:`aggregation`)."""
        return aggregate(per_token, mask, self.aggregation, normalizer)

    def kl_target(self, logp_old: torch.Tensor, logp_ref: torch.Tensor | None) -> torch.Tensor:
        """The log-probs the k3 KL term compares θ with: the reference's (``ValueError`` when ``None``)."""
        if logp_ref is None:
            raise ValueError("beta > 0 needs logp_ref")
        return logp_ref

    def __call__(self, logp: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor | None,
                 advantages: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> LossOutput:
        """Loss of one (micro-)batch.

        Args:
            logp: ``[N, L]`` ℓ under θ (with grad).
            logp_old: ``[N, L]`` ℓ under θ_old (the rollout policy), same masks.
            logp_ref: ``[N, L]`` ℓ under the reference, same masks; ``None`` when ``beta == 0``.
            advantages: ``[N, L]`` per-token advantages (``A_i = A`` without a credit module).
            mask: ``[N, L]`` bool, valid completion tokens.
            normalizer: see :func:`aggregate` (micro-batching).

        Returns:
            :class:`LossOutput` with metrics ``policy_loss``, ``kl`` and ``kl_clamp_frac`` (when β > 0;
            the share of tokens where :func:`~maskrl.objectives.base.kl3` clamps the log-ratio),
            ``clip_frac`` (the share of tokens where the clip binds,
            :func:`~maskrl.objectives.base.clip_binds`), ``ratio_mean`` and ``ratio_clamp_frac`` (the
            share of tokens with ``|ℓ − ℓ^old| > 20``, whose ratio is held at ``e^{±20}``), all shares
            aggregated like the loss (:mod:`maskrl.objectives.base`).
        """
        log_ratio = logp - logp_old  # [N, L]
        ratio = importance_ratio(log_ratio)  # [N, L]
        unclipped = ratio * advantages
        clipped = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        policy = -torch.minimum(unclipped, clipped)  # [N, L]
        policy_loss = self.reduce(policy, mask, normalizer)
        loss = policy_loss
        metrics = {"policy_loss": policy_loss.item()}
        if self.beta > 0:
            target = self.kl_target(logp_old, logp_ref)
            kl = self.reduce(kl3(logp, target), mask, normalizer)
            loss = loss + self.beta * kl
            metrics["kl"] = kl.item()
            metrics["kl_clamp_frac"] = self.share(kl3_clamped(logp, target).float(), mask, normalizer)
        metrics["clip_frac"] = self.share(clip_binds(ratio, advantages, self.clip_eps).float(), mask, normalizer)
        metrics["ratio_mean"] = self.share(ratio, mask, normalizer)
        metrics["ratio_clamp_frac"] = self.share(ratio_clamped(log_ratio).float(), mask, normalizer)
        return LossOutput(loss=loss, metrics=metrics)
