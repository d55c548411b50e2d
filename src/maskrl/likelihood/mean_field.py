"""Mean-field per-token log-likelihood of a completion (d1; SPEC §1.4 ``mean_field``).

The prompt is masked i.i.d. with probability ``p_mask_prompt`` and the whole completion is masked;
one forward gives ``ℓ_i = log p_θ(o_i | q^m, [M]^L)`` for every completion position. The prompt
mask is drawn from the caller's ``torch.Generator``: θ, θ_old and θ_ref called with generators in
the same state see the same mask.
"""
from __future__ import annotations

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.types import Rollout


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


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[target]`` in float32.

    Args:
        logits: ``[N, L, V]`` any float dtype.
        targets: ``[N, L]`` long.
    Returns:
        ``[N, L]`` float32.
    """
    logits = logits.float()
    return logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def mean_field(adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
               p_mask_prompt: float = 0.15) -> torch.Tensor:
    """Per-token mean-field log-probs of ``rollout.completion_ids`` (SPEC §1.4).

    Args:
        adapter: the policy (its grad mode is the caller's).
        rollout: needs ``prompt_ids [N, P]``, ``prompt_mask [N, P]``, ``completion_ids [N, L]``.
        generator: draws the prompt mask; pass one in the same state for θ, θ_old and θ_ref.
        p_mask_prompt: prompt masking probability **[choice]** (default 0.15, d1).

    Returns:
        ``[N, L]`` float32 log-probabilities (padding positions included; mask them downstream).
    """
    n, p_len = rollout.prompt_ids.shape
    L = rollout.completion_ids.shape[1]
    prompt = mask_prompt(rollout.prompt_ids, rollout.prompt_mask, adapter.mask_id, p_mask_prompt, generator)
    x = torch.cat([prompt, torch.full((n, L), adapter.mask_id, dtype=torch.long, device=prompt.device)], 1)
    attn = torch.cat([rollout.prompt_mask.bool(), torch.ones((n, L), dtype=torch.bool, device=prompt.device)], 1)
    logits = adapter.logits(x, attn)[:, p_len:]  # [N, L, V]
    return token_log_probs(logits, rollout.completion_ids)
