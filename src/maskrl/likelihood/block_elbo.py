"""EBPO's block ELBO, as the LLaDA2.x family's open EBPO code draws it (docs/spec.md §1.4 ``block_elbo``).

Source: DARE (yjyddq/DARE, commit 83ae8a3), ``verl/trainer/ppo/dllm_core_algos.py``
(``_forward_process_ebpo``, ``compute_ebpo_composite_elbo``) and the LLaDA2 / SDAR EBPO actors
(``verl/workers/actor/{llada2,sdar}_dp_actor_ebpo.py``: one doubled x_t ⊕ x_0 forward per draw, the
token loss ``CE / p``), read, not copied; its recipes use ``mc_num = n_l = 16``.

For a completion o of prompt q whose valid tokens (up to and including the first stop token) fall in
blocks ``o_1 … o_B`` of the model's block size (counted from the row's first real token, so the
first block may be partial, as the model's attention and the sampler count them), and D draws:

    ELBO(o) ≈ (1/D) Σ_d Σ_b (n_b / k_{d,b}) Σ_{i ∈ o_b hidden in draw d} log p_θ(o_i | q, o_{<b}, x^{d}_b),

where ``n_b`` is the number of valid tokens of block b, and draw d hides in block b exactly
``k_{d,b} = min(⌊t_{d,b} n_b⌋ + 1, n_b)`` of them, chosen uniformly. The noise levels are stratified
per sequence over its ``K = D·B`` (draw, block) cells: ``t_{d,b} = (u + (d·B + b)/K) mod 1`` with one
``u ~ U[0, 1)`` per sequence (``stratified: false``: every t independent, uniform). ``ℓ_i`` is position
i's share of that sum, so ``Σ_i ℓ_i`` is the estimate; every valid token's block has ≥ 1 hidden token in
every draw.

On a block-diffusion model each draw is one doubled x_t ⊕ x_0 row (:mod:`maskrl.likelihood.blocks`): a
hidden token of block b sees the clean earlier blocks and its own block as the draw leaves it. The
positions after the valid completion are dropped from the row (attended by nobody), as DARE's actors
drop them (``drop_after_stop``; false keeps them as the sampler left them). A full-attention model has
no such forward and is refused (:data:`NEEDS_BLOCK_MODEL`; DARE runs EBPO on block models only).

Masks depend only on the generator: draws, in this order, ``u [N]`` (stratified) or ``t [N, D, B]``,
then ``[N, D, L]`` uniforms that order each block's tokens (the ``k`` first are hidden).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from maskrl.likelihood.base import LIKELIHOODS, needed, scored_or_one
from maskrl.likelihood.blocks import score_blocks
from maskrl.models.adapter import ModelAdapter
from maskrl.types import Rollout


def completion_blocks(prompt_mask: torch.Tensor, valid: torch.Tensor, block_length: int) -> torch.Tensor:
    """``[N, L]`` long: each completion position's block, counted from the row's first block that holds
    a completion position (0, 1, …), for ``prompt_mask [N, P]`` bool and block size ``block_length``;
    -1 where ``valid [N, L]`` (a prefix of each row) is False."""
    L = valid.shape[1]
    first = prompt_mask.long().sum(-1)  # [N] P_n: completion position i sits at P_n + i
    blk = (first[:, None] + torch.arange(L, device=valid.device)[None]) // block_length
    return torch.where(valid.bool(), blk - blk[:, :1], torch.full_like(blk, -1))


def noise_levels(n_blocks: torch.Tensor, draws: int, generator: torch.Generator | None, stratified: bool = True,
                 offset: torch.Tensor | None = None) -> torch.Tensor:
    """``[N, D, B]`` float32 noise level of each (sequence, draw, block) cell, ``B = max n_blocks``.

    Stratified: ``t = (u_n + c/K_n) mod 1`` with ``c = d·n_b + b`` and ``K_n = D·n_b`` (float32 arithmetic, as
    DARE's); ``u [N]`` drawn from ``generator`` unless ``offset`` gives it. Otherwise i.i.d. uniforms
    ``[N, D, B]``. Cells with ``b >= n_blocks[n]`` are unused.
    """
    n = n_blocks.shape[0]
    device = n_blocks.device
    width = max(int(n_blocks.max()) if n else 0, 1)
    if not stratified:
        return torch.rand((n, draws, width), generator=generator, device=device)
    u = torch.rand(n, generator=generator, device=device) if offset is None else offset.float().to(device)
    nb = n_blocks.clamp(min=1)[:, None, None]  # [N, 1, 1]
    cell = torch.arange(draws, device=device)[None, :, None] * nb + torch.arange(width, device=device)[None, None]
    return (u[:, None, None] + cell.float() / (draws * nb).float()) % 1.0


def block_elbo_masks(prompt_mask: torch.Tensor, valid: torch.Tensor, draws: int, block_length: int,
                     generator: torch.Generator | None, stratified: bool = True, t: torch.Tensor | None = None,
                     offset: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The masks of every draw (module docstring): ``(hide [N, D, L] bool, rate [N, D, L] float32,
    blk [N, L] long)``; ``rate = k_{d,b}/n_b`` (float32) on hidden positions, 1 elsewhere; ``blk`` as
    :func:`completion_blocks`.

    Args:
        prompt_mask: ``[N, P]`` bool, real prompt tokens.
        valid: ``[N, L]`` bool, the completion mask (a prefix of each row).
        draws: D >= 1.
        block_length: the model's block size.
        generator: the source of every draw.
        stratified: see :func:`noise_levels`.
        t: ``[N, D, B]`` noise levels to use instead of drawing them (B >= each row's blocks).
        offset: ``[N]`` the stratification offsets u, instead of drawing them.

    Raises:
        ValueError: ``draws`` < 1, ``block_length`` < 1, or ``t`` outside [0, 1] / too narrow.
    """
    if draws < 1 or block_length < 1:
        raise ValueError(f"draws (={draws}) and block_length (={block_length}) must be >= 1")
    n, L = valid.shape
    device = valid.device
    blk = completion_blocks(prompt_mask, valid, block_length)  # [N, L]
    n_blocks = blk.max(-1).values + 1  # [N] (0 for a row without valid tokens)
    if t is None:
        t = noise_levels(n_blocks, draws, generator, stratified, offset)
    elif bool((t < 0).any() or (t > 1).any()) or t.shape[:2] != (n, draws) or t.shape[2] < int(n_blocks.max()):
        raise ValueError(f"t {tuple(t.shape)} must be [N={n}, D={draws}, >= {int(n_blocks.max())}] levels in [0, 1]")
    t = t.float()
    width = t.shape[2]
    safe = blk.clamp(min=0)  # [N, L]
    size = torch.zeros((n, width), dtype=torch.long, device=device).scatter_add_(1, safe, valid.long())  # [N, B] n_b
    k = torch.minimum(torch.floor(t * size[:, None].float()).long() + 1, size[:, None])  # [N, D, B]
    key = torch.rand((n, draws, L), generator=generator, device=device).double()
    key = torch.where(valid[:, None], safe[:, None].double() + key, float(width) + 1.0)  # a block's tokens together
    rank = key.argsort(-1).argsort(-1)  # [N, D, L] position in (block, uniform) order
    start = (size.cumsum(-1) - size).gather(1, safe)  # [N, L] valid tokens of the earlier blocks
    k_at = k.gather(2, safe[:, None].expand(n, draws, L))  # [N, D, L]
    hide = valid[:, None] & (rank - start[:, None] < k_at)
    rate = (k_at.double() / size.gather(1, safe)[:, None].clamp(min=1).double()).float()
    return hide, torch.where(hide, rate, torch.ones_like(rate)), blk


#: why ``block_elbo`` refuses a full-attention model
NEEDS_BLOCK_MODEL = ("likelihood block_elbo (EBPO's, DARE's) scores a block-diffusion model (model block_size set) "
                     "through its doubled x_t ⊕ x_0 forward; on a full-attention model use likelihood: {name: elbo}")


@LIKELIHOODS.register("block_elbo")
@dataclass(frozen=True)
class BlockELBO:
    """Registered as ``block_elbo`` (docs/spec.md §1.4; EBPO's default, DARE's estimator): per-token
    contributions ``ℓ [N, L]`` float32 to the block ELBO (module docstring), 0 where ``need`` is False.

    Attributes:
        draws: D, Monte-Carlo draws per sequence (DARE's ``mc_num``; its recipes: 16).
        stratified: the noise levels stratified over the (draw, block) cells (DARE) or i.i.d.
        drop_after_stop: positions after the valid completion absent from the doubled rows (DARE).

    Raises:
        ValueError: at construction, ``draws`` < 1.
    """

    draws: int = 16
    stratified: bool = True
    drop_after_stop: bool = True

    def __post_init__(self) -> None:
        if self.draws < 1:
            raise ValueError(f"draws (={self.draws}) must be >= 1")

    def refusal(self, block_model: bool) -> str | None:
        """:func:`~maskrl.likelihood.blocks.model_refusal`: :data:`NEEDS_BLOCK_MODEL` on a full-attention model."""
        return None if block_model else NEEDS_BLOCK_MODEL

    def rows(self, rollout: Rollout, need: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` long: D doubled rows per sequence with a needed valid position, else 0."""
        return (needed(rollout, need) & rollout.completion_mask.bool()).any(-1).long() * self.draws

    def __call__(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                 need: torch.Tensor | None = None) -> torch.Tensor:
        """``ℓ [N, L]`` float32 (module docstring); one doubled forward of the D·N rows that score a needed
        position (of one row, contributing 0, when the masks score none of them).

        Raises:
            ValueError: a full-attention model (:data:`NEEDS_BLOCK_MODEL`).
        """
        if adapter.block_size is None:
            raise ValueError(NEEDS_BLOCK_MODEL)
        valid = rollout.completion_mask.bool()
        need = needed(rollout, need) & valid
        n, L = valid.shape
        out = torch.zeros((n, L), dtype=torch.float32, device=valid.device)
        if not bool(need.any()):
            return out
        hide, rate, _ = block_elbo_masks(rollout.prompt_mask, valid, self.draws, int(adapter.block_size), generator,
                                         self.stratified)
        hide, rate = hide.reshape(n * self.draws, L), rate.reshape(n * self.draws, L)
        seq = torch.arange(n, device=valid.device).repeat_interleave(self.draws)  # [R] row r = (sequence, draw)
        r_idx, i_idx, dummy = scored_or_one(hide & need[seq], seq, need)  # none hidden: one row still runs
        run, row_of = torch.unique(r_idx, return_inverse=True)
        rows = seq[run]
        x = torch.where(hide[run], adapter.mask_id, rollout.completion_ids[rows])
        s = seq[r_idx]
        lp = score_blocks(adapter, rollout.prompt_ids[rows], rollout.prompt_mask[rows], x, rollout.completion_ids[rows],
                          row_of, i_idx, rollout.completion_ids[s, i_idx], valid[rows] if self.drop_after_stop else None)
        if dummy:
            return out + lp.sum() * 0.0
        return out.index_put((s, i_idx), lp / rate[r_idx, i_idx] / self.draws, accumulate=True)
