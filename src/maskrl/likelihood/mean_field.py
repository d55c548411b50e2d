"""Mean-field per-token log-likelihood of a completion (d1; docs/spec.md §1.4 ``mean_field``).

The prompt is masked i.i.d. with probability ``p_mask_prompt`` and the whole completion is masked;
one forward gives ``ℓ_i = log p_θ(o_i | q^m, [M]^L)`` for every completion position. The prompt
mask is drawn from the caller's ``torch.Generator``: θ, θ_old and θ_ref called with generators in
the same state see the same mask.

A block-diffusion model (``adapter.block_size`` set) never sees a fully masked completion: when it
denoises block b the earlier blocks are clean. Its mean-field score is therefore taken from the first
state of each block, ``ℓ_i = log p_θ(o_i | q^m, o_{<b(i)}, [M] in block b(i))``: the completion is masked
in the noisy copy of one doubled x_t ⊕ x_0 forward whose context copy is the clean completion
(:mod:`maskrl.likelihood.blocks`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from maskrl.likelihood.base import LIKELIHOODS, needed, scatter_scores
from maskrl.likelihood.blocks import score_rows
from maskrl.models.adapter import ModelAdapter, token_log_probs
from maskrl.types import Rollout

__all__ = ["MeanField", "mask_prompt", "mean_field", "token_log_probs"]


def mask_prompt(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, mask_id: int, p: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """Replace each real prompt token by ``mask_id`` with probability ``p``.

    Args:
        prompt_ids: ``[N, P]`` long.
        prompt_mask: ``[N, P]`` bool, True on real tokens (padding is never masked).
        p: masking probability in ``[0, 1]``.
        generator: source of the ``[N, P]`` uniform draw (on the tensors' device).

    Returns:
        ``[N, P]`` long, the masked prompt.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p_mask_prompt (={p}) must lie in [0, 1]")
    if p == 0.0:
        return prompt_ids
    u = torch.rand(prompt_ids.shape, generator=generator, device=prompt_ids.device)  # [N, P]
    return torch.where((u < p) & prompt_mask.bool(), mask_id, prompt_ids)


def mean_field(adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
               p_mask_prompt: float = 0.15, need: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token mean-field log-probs of ``rollout.completion_ids`` (docs/spec.md §1.4).

    Args:
        adapter: the policy (its grad mode is the caller's).
        rollout: needs ``prompt_ids [N, P]``, ``prompt_mask [N, P]``, ``completion_ids [N, L]``.
        generator: draws the prompt mask (for all N rows, whatever ``need`` says); pass one in the
            same state for θ, θ_old and θ_ref.
        p_mask_prompt: prompt masking probability **[choice]** (default 0.15, d1).
        need: ``[N, L]`` bool, positions to score (default all); rows with none are not run.

    Returns:
        ``[N, L]`` float32 log-probabilities, 0 where ``need`` is False (padding positions are
        scored when needed; mask them downstream). For a block model each token is scored with its
        own block masked and the earlier blocks clean (module docstring).
    """
    need = needed(rollout, need)
    n, L = rollout.completion_ids.shape
    prompt = mask_prompt(rollout.prompt_ids, rollout.prompt_mask, adapter.mask_id, p_mask_prompt, generator)
    n_idx, i_idx = need.nonzero(as_tuple=True)  # [M]
    if n_idx.numel() == 0:
        return torch.zeros((n, L), dtype=torch.float32, device=prompt.device)
    run, row_of = torch.unique(n_idx, return_inverse=True)  # [R] rows that have a needed position
    completion = torch.full((run.numel(), L), adapter.mask_id, dtype=torch.long, device=prompt.device)
    lp = score_rows(adapter, prompt[run], rollout.prompt_mask[run], completion, rollout.completion_ids[run], row_of,
                    i_idx, rollout.completion_ids[n_idx, i_idx])  # [M]
    return scatter_scores(lp, n_idx, i_idx, (n, L))


@LIKELIHOODS.register("mean_field")
@dataclass(frozen=True)
class MeanField:
    """Registered as ``mean_field`` (docs/spec.md §1.4; d1): every token scored from the all-masked state.

    Attributes:
        p_mask_prompt: probability of masking each real prompt token **[choice]** (d1: 0.15).
    """

    p_mask_prompt: float = 0.15

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_mask_prompt <= 1.0:
            raise ValueError(f"p_mask_prompt (={self.p_mask_prompt}) must lie in [0, 1]")

    def rows(self, rollout: Rollout, need: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` long: 1 per sequence with a needed position (one forward row), else 0."""
        return needed(rollout, need).any(-1).long()

    def __call__(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                 need: torch.Tensor | None = None) -> torch.Tensor:
        """See :func:`mean_field`; returns ``[N, L]`` float32."""
        return mean_field(adapter, rollout, generator, self.p_mask_prompt, need)
