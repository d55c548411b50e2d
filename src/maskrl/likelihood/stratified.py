"""Stratified Masking Likelihood (SML; docs/spec.md §2.2, DACA-GRPO).

The valid completion positions of each sequence are split into K disjoint strata Π_1..Π_K
(``layout: random`` -- an equal-size partition from the caller's generator, sizes differing by at
most one -- or ``stride``: position i in stratum i mod K). For stratum s the input hides Π_s alone
and shows every other completion token, *the tokens after the completion's first stop token
included* (docs/spec.md §2.2: on LLaDA that end-of-text tail is most of a 256-token completion; hiding it,
as this estimator did before issue 19, moved per-token log-probs by up to 0.21 nats on the tiny
model and 10 nats on its 40×-sharpened copy, ``benchmarks/fidelity/fidelity_sml_dps.py``); the prompt is masked as in mean-field (one draw
per sequence, shared by its rows). ``ℓ^SML_i = log p_θ(o_i | q^m, o_{¬Π_s})`` for i ∈ Π_s: every
valid position is scored exactly once. Positions past the end belong to no stratum and are never
hidden; when asked for (the trainer asks only in its padding forwards, whose values it drops) they
are read, visible, in the row of the stratum the layout deals them, a value of no use. Only the
all-hidden mean-field row hides them.

The estimator returns ``ℓ = full·ℓ^full + sml·ℓ^SML`` with ``ℓ^full`` the mean-field log-prob (the
all-hidden row, same prompt mask), computed in the same batched forward as one more row:

- ratio-based bases (diffu_grpo, gdpo): ``full = sml = ½`` is docs/spec.md's ``sml_mix: 0.5`` -- the mixed ℓ
  enters the ratio for θ, θ_old and θ_ref alike (the defaults);
- ratio-free wd1: ``full = 1, sml = γ`` gives ``L_wd1(ℓ^full) + γ·L_wd1(ℓ^SML)`` exactly, because
  wd1's loss is linear in ℓ;
- ``full = 0, sml = 1`` is pure SML (K = 1: mean-field, when the completion has no tail after its
  stop token; K = L: the leave-one-out pseudo-likelihood).

On a block-diffusion model (``adapter.block_size`` set) a token of block b is scored as the model
denoises b: the earlier blocks clean, its own block with the stratum (or, in the mean-field row,
everything) hidden -- ``ℓ^SML_i = log p_θ(o_i | q^m, o_{<b}, o_{b ∖ Π_s})`` -- through the doubled x_t ⊕ x_0
forward (:mod:`maskrl.likelihood.blocks`; later blocks are never seen).

All K (+1) rows of all sequences go through one forward (the trainer's ``max_forward_rows`` splits
sequences, never a sequence's rows); the output layer runs only at each row's scored positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from maskrl.likelihood.base import LIKELIHOODS, needed
from maskrl.likelihood.blocks import score_rows
from maskrl.likelihood.mean_field import mask_prompt
from maskrl.models.adapter import ModelAdapter
from maskrl.types import Rollout

LAYOUTS = ("random", "stride")


def strata(completion_mask: torch.Tensor, k: int, layout: str, generator: torch.Generator | None) -> torch.Tensor:
    """Stratum of every completion position.

    Args:
        completion_mask: ``[N, L]`` bool, valid positions.
        k: number of strata K >= 1.
        layout: ``"random"`` (one ``[N, L]`` uniform draw from ``generator``; the valid positions in a
            random order are dealt round-robin, so stratum sizes differ by at most one) or ``"stride"``
            (position i -> i mod K; no draw).
        generator: source of the random layout.

    Returns:
        ``[N, L]`` long in ``0..K-1``.

    Raises:
        ValueError: unknown ``layout`` or ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k (={k}) must be >= 1")
    n, L = completion_mask.shape
    device = completion_mask.device
    if layout == "stride":
        return (torch.arange(L, device=device) % k).expand(n, L).clone()
    if layout != "random":
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    u = torch.rand((n, L), generator=generator, device=device)
    key = torch.where(completion_mask.bool(), u, u + 2.0)  # valid positions first, in random order
    order = key.argsort(-1)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(L, device=device).expand(n, L).contiguous())
    return rank % k


def stratified(adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None, k: int = 4,
               layout: str = "random", full: float = 0.5, sml: float = 0.5, p_mask_prompt: float = 0.15,
               need: torch.Tensor | None = None) -> torch.Tensor:
    """``full·ℓ^full + sml·ℓ^SML`` per token (see the module docstring).

    Args:
        adapter: the policy (grad mode is the caller's).
        rollout: ``prompt_ids [N, P]``, ``prompt_mask [N, P]``, ``completion_ids [N, L]``,
            ``completion_mask [N, L]``.
        generator: draws the prompt mask, then the random layout (same state for θ, θ_old, θ_ref =>
            identical inputs).
        k, layout: strata (see :func:`strata`).
        full, sml: weights of the mean-field and the SML log-probs (>= 0).
        p_mask_prompt: prompt masking probability (default 0.15, as mean-field).
        need: ``[N, L]`` bool, positions to score (default all).

    Returns:
        ``[N, L]`` float32; 0 where ``need`` is False.
    """
    need = needed(rollout, need)
    n, L = rollout.completion_ids.shape
    device = rollout.completion_ids.device
    prompt = mask_prompt(rollout.prompt_ids, rollout.prompt_mask, adapter.mask_id, p_mask_prompt, generator)
    valid = rollout.completion_mask.bool()
    s_of = strata(valid, k, layout, generator)  # [N, L]
    # input rows per sequence: strata 0..K-1 (when sml > 0), then the all-hidden row (when full > 0)
    kinds = (list(range(k)) if sml > 0 else []) + ([k] if full > 0 else [])
    r = len(kinds)
    kind = torch.tensor(kinds, dtype=torch.long, device=device)  # [r]
    # docs/spec.md §2.2: a stratum row hides its valid positions only (the tail after the stop token stays visible)
    hide = ((s_of[:, None, :] == kind[None, :, None]) & valid[:, None, :]) | (kind[None, :, None] == k)  # [N, r, L]
    scored = need[:, None, :] & ((s_of[:, None, :] == kind[None, :, None]) | (kind[None, :, None] == k))
    hide, scored = hide.reshape(n * r, L), scored.reshape(n * r, L)
    seq_of = torch.arange(n, device=device).repeat_interleave(r)
    weight = torch.tensor([full if kd == k else sml for kd in kinds], dtype=torch.float32, device=device).repeat(n)
    r_idx, i_idx = scored.nonzero(as_tuple=True)  # [M]
    if r_idx.numel() == 0:
        return torch.zeros((n, L), dtype=torch.float32, device=device)
    run, row_of = torch.unique(r_idx, return_inverse=True)  # rows with something to score
    x_comp = torch.where(hide[run], adapter.mask_id, rollout.completion_ids[seq_of[run]])
    s = seq_of[r_idx]
    lp = score_rows(adapter, prompt[seq_of[run]], rollout.prompt_mask[seq_of[run]], x_comp,
                    rollout.completion_ids[seq_of[run]], row_of, i_idx, rollout.completion_ids[s, i_idx])  # [M]
    out = torch.zeros((n, L), dtype=torch.float32, device=device)
    return out.index_put((s, i_idx), lp * weight[r_idx], accumulate=True)


@LIKELIHOODS.register("stratified")
@dataclass(frozen=True)
class Stratified:
    """Registered as ``stratified`` (docs/spec.md §2.2, SML): ``ℓ = full·ℓ^full + sml·ℓ^SML``.

    Attributes:
        k: number of strata K **[choice]** (default 4: each token sees 75 % of the completion).
        layout: **[choice]** ``"random"`` (from the shared generator) or ``"stride"`` (i mod K).
        full: weight of the mean-field log-prob (default 0.5 = docs/spec.md ``sml_mix: 0.5`` for ratio bases;
            wd1 + SML: 1).
        sml: weight of the SML log-prob (default 0.5; wd1 + SML: γ = 1; pure SML: ``full: 0, sml: 1``).
        p_mask_prompt: prompt masking probability **[choice]** (default 0.15, as mean-field).
    """

    k: int = 4
    layout: str = "random"
    full: float = 0.5
    sml: float = 0.5
    p_mask_prompt: float = 0.15

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k (={self.k}) must be >= 1")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} is not one of {LAYOUTS}")
        if self.full < 0 or self.sml < 0 or self.full + self.sml == 0:
            raise ValueError(f"full (={self.full}) and sml (={self.sml}) must be >= 0 and not both 0")
        if not 0.0 <= self.p_mask_prompt <= 1.0:
            raise ValueError(f"p_mask_prompt (={self.p_mask_prompt}) must lie in [0, 1]")

    def rows(self, rollout: Rollout, need: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` long: ``K·[sml > 0] + [full > 0]`` per sequence with a needed position, else 0 (an
        upper bound: strata holding no needed position are not run)."""
        per = self.k * (self.sml > 0) + (self.full > 0)
        return needed(rollout, need).any(-1).long() * per

    def __call__(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                 need: torch.Tensor | None = None) -> torch.Tensor:
        """See :func:`stratified`; ``[N, L]`` float32."""
        return stratified(adapter, rollout, generator, self.k, self.layout, self.full, self.sml, self.p_mask_prompt,
                          need)
