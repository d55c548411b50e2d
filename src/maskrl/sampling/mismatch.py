"""How far a rollout's commit probabilities are from theta's full-forward ones (a cache's cost in
off-policyness, :mod:`maskrl.sampling.cache`)."""
from __future__ import annotations

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling.commit import candidate_logits
from maskrl.types import Rollout


@torch.no_grad()
def rollout_mismatch(adapter: ModelAdapter, rollout: Rollout) -> dict[str, float]:
    """How far the sampler's commit probabilities are from theta's full-forward ones.

    For every committed completion token ``(i, j)`` with commit step ``t``, recompute
    ``log p_theta(y_ij | x_t)`` by a full bidirectional forward at the commit state ``x_t`` (the
    completion with every position committed at step ``>= t`` masked, docs/spec.md §1.4) and compare it with
    the sampler's ``log commit_prob``. With ``cache="none"`` the two agree up to float rounding; with a
    cache the gap is what the cache costs in off-policyness. The output layer runs only at the
    committed positions of each state. Costs one forward of the rows committing at each distinct step.

    Args:
        adapter: the policy that sampled ``rollout`` (same weights).
        rollout: a :class:`~maskrl.types.Rollout` from :func:`generate` (``cfg_scale`` must be 0:
            with guidance the sampler's distribution is not theta's by construction).

    Returns:
        ``{"mismatch": mean |log commit_prob - log p_theta| (nats), "mismatch_max": max of the same,
        "tokens": number of tokens compared}``.

    Raises:
        ValueError: when the rollout used classifier-free guidance.
    """
    if rollout.sampler is not None and rollout.sampler.cfg_scale > 0:
        raise ValueError("rollout_mismatch: the rollout used cfg_scale > 0, whose distribution is not theta's")
    device = adapter.device
    p_len = rollout.prompt_ids.shape[1]
    comp = rollout.completion_ids.to(device)
    cstep = rollout.commit_step.to(device)
    attn = torch.cat([rollout.prompt_mask.to(device).bool(), torch.ones_like(comp, dtype=torch.bool)], 1)
    shift = 1 if adapter.shift else 0
    count = adapter.token_count
    diffs = []
    for t in cstep.unique().tolist():
        if t < 0:
            continue
        at = cstep == t  # [N, L]
        rows = at.any(-1).nonzero().squeeze(-1)
        state = torch.where(cstep[rows] >= t, adapter.mask_id, comp[rows])
        xs = torch.cat([rollout.prompt_ids[rows].to(device), state], 1)
        rr, pp = at[rows].nonzero(as_tuple=True)
        if adapter.supports_cache:
            h, _ = adapter.decoder_forward(xs, attn[rows], adapter.position_ids(attn[rows]))
            logits = adapter.head(h[rr, p_len + pp - shift])  # [m, V]
        else:
            logits = adapter.logits(xs, attn[rows])[rr, p_len + pp]
        logits = candidate_logits(logits.float(), adapter.mask_id, count)  # the sampler's candidate ids
        lp = torch.log_softmax(logits, -1).gather(-1, comp[rows][rr, pp][:, None]).squeeze(-1)
        diffs.append((rollout.commit_prob[rows][rr, pp].to(device).clamp_min(1e-30).log() - lp).abs())
    d = torch.cat(diffs) if diffs else torch.zeros(0, device=device)
    return {"mismatch": d.mean().item() if d.numel() else 0.0, "mismatch_max": d.max().item() if d.numel() else 0.0,
            "tokens": int(d.numel())}
