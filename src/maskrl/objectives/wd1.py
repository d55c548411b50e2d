"""wd1 (docs/spec.md §1.5): ratio-free weighted log-likelihood over the group.

``L = −Σ_n softmax(A)_n ℓ(o_n) + Σ_n softmax(−A)_n ℓ(o_n)``, the softmaxes over the G completions of
one prompt, ``ℓ(o_n)`` the summed per-token log-likelihood (mean-field by default). The loss is linear
in ℓ: the group structure enters only through the per-sequence weight
``w_n = softmax(A)_n − softmax(−A)_n``, which :meth:`WD1.advantages` computes (it is the only place
that sees the group ids) and the trainer broadcasts over the tokens as the "advantage". A credit
module may then reshape it per token (DPS: ``w_n·(1 + λ·δ̄)``), and the loss is
``−Σ_{n,i} w_{n,i} ℓ_{n,i}`` divided by the trainer's global normaliser. Because it is linear in ℓ,
SML's second term ``γ·L_wd1(ℓ^SML)`` (docs/spec.md §2.2) equals ``L_wd1(γ·ℓ^SML)`` and is obtained with the
``stratified`` likelihood's ``full: 1, sml: γ`` (one call, one forward).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from maskrl.advantages import group_advantages
from maskrl.objectives.base import OBJECTIVES, Objective, kl3, kl3_clamped
from maskrl.types import LossOutput

WD1_AGGREGATIONS = ("seq_sum", "seq_mean", "token_mean")


def group_softmax(x: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x [N]`` within each group of ``group_ids [N]`` (float32 ``[N]``, sums to 1 per group)."""
    if x.shape != group_ids.shape or x.dim() != 1:
        raise ValueError(f"x {tuple(x.shape)} and group_ids {tuple(group_ids.shape)} must both be [N]")
    x = x.float()
    _, g = torch.unique(group_ids, return_inverse=True)
    n_groups = int(g.max().item()) + 1 if g.numel() else 0
    gmax = torch.full((n_groups,), float("-inf"), dtype=x.dtype, device=x.device).scatter_reduce(
        0, g, x, reduce="amax", include_self=True)
    e = torch.exp(x - gmax[g])
    denom = torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add(0, g, e)
    return e / denom[g]


@OBJECTIVES.register("wd1")
@dataclass(frozen=True)
class WD1(Objective):
    """Registered as ``wd1`` (docs/spec.md §1.5; Tang et al., "wd1: weighted policy optimization for reasoning
    in diffusion language models", 2025).

    ``advantages(r, g)`` returns ``w_n = softmax_g(A)_n − softmax_g(−A)_n`` (float32 ``[N]``) with
    ``A`` the group advantages under ``normalize``; ``__call__`` returns
    ``L = −Σ_{n,i} mask·w_{n,i}·ℓ_{n,i} / normalizer (+ β·KL3)``. Ratio-free: θ_old is never computed.

    Attributes:
        normalize: group advantage normalisation before the softmax **[choice]** (docs/spec.md §1.3; ``"mean"``;
            softmax is shift-invariant, so ``mean`` equals using the raw rewards).
        aggregation: **[choice]** ``"seq_sum"`` (default, docs/spec.md: ``ℓ(o_n)`` the *summed* log-prob; the sum
            over sequences is divided by the global number of sequences N, so the loss is (1/G)·the
            per-prompt wd1 loss averaged over prompts), ``"seq_mean"`` (each sequence's ℓ averaged over
            its tokens, then summed / N) or ``"token_mean"`` (summed over all tokens / their global
            count).
        beta: weight of an optional k3 KL to the reference (default 0: no reference, as wd1).
    """

    uses_ratio: ClassVar[bool] = False
    normalize: str = "mean"
    aggregation: str = "seq_sum"
    beta: float = 0.0

    def __post_init__(self) -> None:
        self.check_fields()
        if self.aggregation not in WD1_AGGREGATIONS:
            raise ValueError(f"aggregation {self.aggregation!r} is not one of {WD1_AGGREGATIONS}")

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Per-sequence wd1 weights ``softmax_g(A) − softmax_g(−A)``: ``[N]`` float32 in (−1, 1),
        summing to 0 within each group (0 for every member of a group with equal rewards)."""
        a = group_advantages(rewards, group_ids, self.normalize)
        return (group_softmax(a, group_ids) - group_softmax(-a, group_ids)).float()

    def _reduce(self, per_token: torch.Tensor, mask: torch.Tensor, normalizer: float | None) -> torch.Tensor:
        m = mask.to(per_token.dtype)
        if self.aggregation == "token_mean":
            denom = normalizer if normalizer is not None else m.sum().clamp(min=1.0)
            return (per_token * m).sum() / denom
        per_seq = (per_token * m).sum(-1)
        if self.aggregation == "seq_mean":
            per_seq = per_seq / m.sum(-1).clamp(min=1.0)
        denom = normalizer if normalizer is not None else max(per_token.shape[0], 1)
        return per_seq.sum() / denom

    def _fraction(self, flags: torch.Tensor, mask: torch.Tensor, normalizer: float | None) -> float:
        """A share of a 0/1 per-token quantity that sums to a fraction over micro-batches: under
        ``token_mean`` over tokens, otherwise each sequence's mean over its tokens, over sequences."""
        if self.aggregation == "token_mean":
            return self._reduce(flags, mask, normalizer).item()
        m = mask.to(flags.dtype)
        denom = normalizer if normalizer is not None else max(flags.shape[0], 1)
        return (((flags * m).sum(-1) / m.sum(-1).clamp(min=1.0)).sum() / denom).item()

    def __call__(self, logp: torch.Tensor, logp_old: torch.Tensor | None, logp_ref: torch.Tensor | None,
                 advantages: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> LossOutput:
        """Loss of one (micro-)batch.

        Args:
            logp: ``[N, L]`` ℓ under θ (with grad).
            logp_old: unused (ratio-free).
            logp_ref: ``[N, L]`` ℓ under the reference when ``beta > 0``, else ``None``.
            advantages: ``[N, L]`` float, the weights ``w`` of :meth:`advantages` per token.
            mask: ``[N, L]`` bool, tokens that count.
            normalizer: global number of sequences (``seq_*``) or tokens (``token_mean``); default the
                micro-batch's own.

        Returns:
            :class:`LossOutput`; metrics ``policy_loss``, ``pos_weight`` (share of ``max(w, 0)``),
            ``kl`` when β > 0 -- shares aggregated like the loss -- and ``kl_clamp_frac`` when β > 0
            (the fraction of tokens where the k3 clamp binds, per sequence then over sequences
            unless ``token_mean``).

        Raises:
            ValueError: ``beta > 0`` without ``logp_ref``.
        """
        policy_loss = self._reduce(-advantages * logp, mask, normalizer)
        loss = policy_loss
        metrics = {"policy_loss": policy_loss.item(),
                   "pos_weight": self._reduce(advantages.detach().clamp(min=0).float(), mask, normalizer).item()}
        if self.beta > 0:
            if logp_ref is None:
                raise ValueError("beta > 0 needs logp_ref")
            kl = self._reduce(kl3(logp, logp_ref), mask, normalizer)
            loss = loss + self.beta * kl
            metrics["kl"] = kl.item()
            metrics["kl_clamp_frac"] = self._fraction(kl3_clamped(logp, logp_ref).float(), mask, normalizer)
        return LossOutput(loss=loss, metrics=metrics)
