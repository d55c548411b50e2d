"""LLaDA2.1's token-to-token editing ("M2T + T2T", ``SamplerConfig.edit_threshold``; docs/spec.md §1.2,
docs/sampler.md): besides committing masks (M2T, the block strategy's rule), a step replaces every
already-committed completion token of the row's current block whose candidate differs from it and whose
confidence exceeds ``edit_threshold`` (T2T); once the block has no mask left, it takes up to
``max_post_steps`` further steps that only edit, and ends at the first of them that edits nothing.

Source: the family's ``generate()`` for LLaDA2.1 (inclusionAI's Hub ``modeling_llada2_moe.py``, read in
the copy ZHZisZZ/dllm commit ca176752 ``dllm/pipelines/llada21/models/modeling_llada21_moe.py``):
``editable = ~mask & ~prompt`` on the block's state before the step, ``edit = editable & (x0_p >
editing_threshold) & (x0 != token)``, both index sets written with ``x0``; the block loop counts a step whose
block holds no mask before it as a post step, stops before the forward once post steps exceed
``max_post_steps``, and stops after a step that started with no mask and edited nothing.

Which rollout readers take edited rollouts (:func:`edit_refusal`): an edited position's ``commit_step`` is
the step of its last write and ``commit_prob`` the probability of its final token at that step, so the
states "positions with ``commit_step >= t`` masked" are no longer the states the sampler saw (an edited
position held another token before, never ``[M]``): readers of those states or of per-step observers are
refused; readers of the final completion alone take edited rollouts.
"""
from __future__ import annotations

import torch

#: rollout readers that replay the sampler's states (``commit_step`` as the step a position left ``[M]``),
#: read ``commit_prob`` as the probability of a masked position, or observe the steps: refused with editing
EDIT_REFUSED = {
    "likelihood": {"state": "scores each token at the state its commit_step names"},
    "credit": {"dps": "reads per-step log-probabilities and births (commit_step)",
               "dispo": "branches from the recorded step states",
               "dtca": "weighs steps by commit_prob at commit_step",
               "rldf_steps": "re-scores the masked positions of recorded step states"},
}


def select_edits(cand: torch.Tensor, conf: torch.Tensor, current: torch.Tensor, editable: torch.Tensor,
                 threshold: float) -> torch.Tensor:
    """T2T: the positions a step edits, ``editable & (conf > threshold) & (cand != current)``.

    Args:
        cand: ``[n, b]`` long candidates (the step's draw; the argmax at τ = 0).
        conf: ``[n, b]`` float confidences of the candidates (the block strategy's).
        current: ``[n, b]`` long tokens before the step.
        editable: ``[n, b]`` bool, committed completion positions of the row's current block before the step.
        threshold: ``edit_threshold``, compared strictly (the family's ``>``).

    Returns:
        ``[n, b]`` bool.
    """
    return editable & (conf > threshold) & (cand != current)


def edit_block_done(had_masks: torch.Tensor, filled: torch.Tensor, edited: torch.Tensor, post_steps: torch.Tensor,
                    max_post_steps: int) -> torch.Tensor:
    """``[n]`` bool: the rows whose block ends after this step under editing. ``had_masks`` / ``filled`` /
    ``edited``: ``[n]`` bool, the block held a mask before the step / holds none after it / the step edited;
    ``post_steps``: ``[n]`` long steps of this block, this one included, that started with no mask. A block
    ends after a post step that edited nothing, or once it is filled and ``max_post_steps`` post steps are
    spent (the family's loop would stop before the next forward)."""
    return (~had_masks & ~edited) | (filled & (post_steps >= max_post_steps))


def refuse_edited(rollout, who: str) -> None:
    """``ValueError`` naming ``who`` when ``rollout`` was sampled with ``edit_threshold`` set (its
    ``sampler``): for the readers of :data:`EDIT_REFUSED`, called on the data itself, so that a direct API call
    is refused as the config check refuses a run."""
    if getattr(getattr(rollout, "sampler", None), "edit_threshold", None) is not None:
        raise ValueError(f"{who}: the rollout was sampled with edit_threshold (LLaDA2.1's token editing), which "
                         "records each position's last write, not the states the sampler saw; it cannot be read here "
                         "(docs/sampler.md, LLaDA2.x)")


def edit_refusal(likelihood: str, credits: list[str], mismatch_every: int) -> str | None:
    """Why a run cannot train on edited rollouts (``rollout.edit_threshold`` set), or ``None``: the
    ``likelihood`` / ``credits`` names of :data:`EDIT_REFUSED`, and ``rollout.mismatch_every > 0`` (it
    re-scores each token at its commit state)."""
    if likelihood in EDIT_REFUSED["likelihood"]:
        return f"likelihood {likelihood!r} {EDIT_REFUSED['likelihood'][likelihood]}"
    for name in credits:
        if name in EDIT_REFUSED["credit"]:
            return f"credit module {name!r} {EDIT_REFUSED['credit'][name]}"
    if mismatch_every:
        return "rollout.mismatch_every re-scores each token at the state its commit_step names"
    return None
