"""What every likelihood estimator shares (SPEC §1.4; ARCHITECTURE.md "Budgets in forward rows").

An estimator is a frozen dataclass registered in :data:`maskrl.likelihood.LIKELIHOODS`. Its fields
are its hyper-parameters (the YAML section ``likelihood: {name: ..., **fields}``); it is called as
``estimator(adapter, rollout, generator, need) -> ℓ [N, L]`` and says what a call costs with
``estimator.rows(rollout, need) -> [N]`` (forward rows per sequence), so that the trainer can split
work to ``train.max_forward_rows`` without running it. ``need`` (``[N, L]`` bool, default: every
position) names the positions whose log-prob is wanted; the others come back as 0 and cost nothing
in the output layer.
"""
from __future__ import annotations

from typing import Protocol

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.types import Rollout


class Likelihood(Protocol):
    """Protocol of a registered likelihood estimator (see the module docstring)."""

    def rows(self, rollout: Rollout, need: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` long: forward rows a call on ``rollout`` costs per sequence."""
        ...

    def __call__(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                 need: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, L]`` float32 per-token log-probs (0 where ``need`` is False)."""
        ...


def needed(rollout: Rollout, need: torch.Tensor | None) -> torch.Tensor:
    """``need`` checked against the rollout (``[N, L]`` bool), or all True when ``None``.

    Raises:
        ValueError: if ``need`` is not ``[N, L]``.
    """
    shape = rollout.completion_ids.shape
    if need is None:
        return torch.ones(shape, dtype=torch.bool, device=rollout.completion_ids.device)
    if need.shape != shape:
        raise ValueError(f"need has shape {tuple(need.shape)}, expected the completion's {tuple(shape)}")
    return need.bool()


def score_positions(adapter: ModelAdapter, prompt: torch.Tensor, prompt_mask: torch.Tensor,
                    completion: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                    targets: torch.Tensor) -> torch.Tensor:
    """The one scoring helper of every estimator: log-probs of ``targets`` at chosen completion
    positions of R input rows, with the output layer applied to those positions only
    (:meth:`maskrl.models.adapter.ModelAdapter.log_probs_at`).

    Args:
        adapter: the model.
        prompt: ``[R, P]`` long, the (possibly masked) prompts of the input rows.
        prompt_mask: ``[R, P]`` bool, True on real prompt tokens.
        completion: ``[R, L]`` long, the completion part of each input row (``[M]`` where hidden).
        rows: ``[M]`` long, input row of each scored position.
        cols: ``[M]`` long, completion position (0..L-1) of each scored token.
        targets: ``[M]`` long, the tokens to score.

    Returns:
        ``[M]`` float32 log-probabilities.
    """
    x = torch.cat([prompt, completion], 1)  # [R, P+L]
    attn = torch.cat([prompt_mask.bool(), torch.ones_like(completion, dtype=torch.bool)], 1)
    return adapter.log_probs_at(x, attn, rows, cols + prompt.shape[1], targets)


def scatter_scores(values: torch.Tensor, n_idx: torch.Tensor, i_idx: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``[N, L]`` float32 zeros with ``values [M]`` written at ``(n_idx, i_idx)`` (differentiable)."""
    out = torch.zeros(shape, dtype=torch.float32, device=values.device)
    return out.index_put((n_idx, i_idx), values)
