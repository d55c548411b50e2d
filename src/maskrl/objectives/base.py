"""What every objective shares: token-loss aggregation and the KL estimator (SPEC §1.5)."""
from __future__ import annotations

import torch

AGGREGATIONS = ("token_mean", "seq_mean")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean",
              normalizer: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss to a scalar -- the one place every objective aggregates.

    Args:
        per_token: ``[N, L]`` float.
        mask: ``[N, L]`` bool/float, 1 on tokens that count.
        mode: **[choice]** ``"token_mean"`` (sum over all valid tokens / their number, d1) or
            ``"seq_mean"`` (mean over each sequence's tokens, then over sequences).
        normalizer: for ``token_mean``, divide by this instead of ``mask.sum()`` (micro-batching:
            the token count of the whole batch); for ``seq_mean``, the number of sequences.

    Returns:
        Scalar tensor.
    """
    m = mask.to(per_token.dtype)
    if mode == "token_mean":
        denom = normalizer if normalizer is not None else m.sum().clamp(min=1.0)
        return (per_token * m).sum() / denom
    if mode == "seq_mean":
        per_seq = (per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        denom = normalizer if normalizer is not None else max(per_token.shape[0], 1)
        return per_seq.sum() / denom
    raise ValueError(f"aggregation {mode!r} is not one of {AGGREGATIONS}")


def kl3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token ``k3`` KL estimate ``exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1`` (≥ 0), SPEC §1.5."""
    d = logp_ref - logp
    return torch.exp(d) - d - 1.0
