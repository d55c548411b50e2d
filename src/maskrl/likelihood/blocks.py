"""Likelihoods of block-diffusion models: the doubled x_t ⊕ x_0 forward (SDAR / TraDo, dLLM-RL's TraceRL
trainer, DARE's and dFactory's block actors; issue 48).

A block-diffusion model (:attr:`maskrl.models.adapter.ModelAdapter.block_size`) attends bidirectionally
inside a block and causally across blocks (blocks = position // block_size, positions from each row's
first real token, so the prompt's last partial block is shared with the first completion tokens). It
generates block by block: when block b is denoised, every earlier block is **clean** (committed) and
the later blocks do not exist yet. So the model's term for block b is ``log p_θ(o_b | o_{<b}, x_t^b)``
with a *clean* prefix, whatever another block's noise is: an estimator whose row hides positions of
several blocks (a random ELBO mask, the all-masked mean-field row, an SML stratum) must not let block
b see the earlier blocks' hidden positions.

One forward gives every block its own term: the row holds a **noisy copy** (``x_t``) and a **context
copy** (``x_0``, normally the clean completion), both with the same position ids, and
:func:`doubled_block_mask` lets

- a noisy token attend the noisy tokens of its own block and the context tokens of *earlier* blocks;
- a context token attend the context tokens of its own and earlier blocks (block-causal).

A noisy token of block b therefore sees exactly the per-block input "context prefix of blocks < b,
then block b noisy" (tested against one forward per block, ``tests/test_likelihood_blocks.py``).
The noisy copy starts at the first block that holds a completion position of some row (the prompt's
full blocks are not copied: they are never scored and no noisy token of another block reads them).
With ``context == noisy`` the doubled forward equals the plain block-causal forward of the noisy row,
which :func:`score_rows` then runs instead.

Cost: a doubled row holds ``P + L`` context columns and ``L`` plus at most ``block_size − 1`` noisy ones,
about 2× the FLOPs of a plain row (dense attention over ``T2²``), in place of one forward per block
(``benchmarks/speed/block_elbo.py``). ``train.max_forward_rows`` and the estimators' ``rows()`` count a doubled
row as one row.

Sources: SDAR (JetAstra/SDAR, training), dLLM-RL ``train/rl_trado.py`` (``make_basic_block_attention``;
its prompt blocks are counted back from the completion's start, ours from position 0 as in SDAR's
``generate.py`` and :func:`maskrl.models.adapter.block_causal_mask`).
"""
from __future__ import annotations

import torch

from maskrl.likelihood.base import score_positions
from maskrl.models.adapter import ModelAdapter, block_index


def doubled_block_mask(position_ids: torch.Tensor, noisy: torch.Tensor, valid: torch.Tensor, block_size: int,
                       dtype: torch.dtype) -> torch.Tensor:
    """Additive 4-D attention mask of the doubled x_t ⊕ x_0 row of a block-diffusion model.

    Query ``q`` may attend key ``k`` iff ``k`` is a real token and, with ``b(·) = position // block_size``:
    both context tokens and ``b(k) <= b(q)``; or both noisy and ``b(k) == b(q)``; or ``q`` noisy, ``k``
    context and ``b(k) < b(q)``. Columns may come in any order (the rule reads only each column's
    position, copy and validity).

    Args:
        position_ids: ``[N, T]`` long RoPE positions of every column (a noisy column has the position of
            its context twin).
        noisy: ``[N, T]`` bool, True on the noisy copy's columns.
        valid: ``[N, T]`` bool, True on real tokens (padding is attended by nobody).
        block_size: tokens per block (>= 1).
        dtype: float dtype of the model's activations.

    Returns:
        ``[N, 1, T, T]`` tensor of ``dtype``: 0 where attending is allowed, ``finfo(dtype).min`` elsewhere.

    Raises:
        ValueError: the three inputs differ in shape, or ``block_size < 1``.
    """
    if not position_ids.shape == noisy.shape == valid.shape or position_ids.dim() != 2:
        raise ValueError(f"position_ids {tuple(position_ids.shape)}, noisy {tuple(noisy.shape)} and valid "
                         f"{tuple(valid.shape)} must be equal [N, T] shapes")
    if block_size < 1:
        raise ValueError(f"block_size (={block_size}) must be >= 1")
    blk = block_index(position_ids, block_size)
    bq, bk = blk[:, :, None], blk[:, None, :]  # [N, T(query), 1], [N, 1, T(key)]
    nq, nk = noisy.bool()[:, :, None], noisy.bool()[:, None, :]
    allowed = ((~nq & ~nk & (bk <= bq)) | (nq & nk & (bk == bq)) | (nq & ~nk & (bk < bq))) & valid.bool()[:, None, :]
    out = torch.zeros(allowed.shape, dtype=dtype, device=position_ids.device)
    return out.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def noisy_start(prompt_mask: torch.Tensor, block_size: int) -> int:
    """First column (of ``[prompt, completion]``) the noisy copy needs: the start of the earliest block
    that holds a completion position in some row, ``P − max_n(P_n mod block_size)`` (``P_n`` the row's
    real prompt tokens, ``prompt_mask [N, P]``)."""
    p_len = prompt_mask.shape[1]
    lead = int((prompt_mask.long().sum(-1) % block_size).max()) if prompt_mask.shape[0] else 0
    return p_len - lead


def doubled_rows(prompt: torch.Tensor, prompt_mask: torch.Tensor, noisy: torch.Tensor, context: torch.Tensor,
                 block_size: int, dtype: torch.dtype, completion_valid: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The doubled input rows: ``(ids [R, T2], mask [R, 1, T2, T2], position_ids [R, T2], offset)``.

    Row r is ``[prompt, noisy][c0:] ⊕ [prompt, context]`` (noisy copy first, from column
    ``c0 =`` :func:`noisy_start`), ``T2 = (P + L − c0) + (P + L)``; completion position i of the noisy
    copy is column ``i + offset``.

    Args:
        prompt: ``[R, P]`` long, left-padded (possibly masked) prompts.
        prompt_mask: ``[R, P]`` bool, real prompt tokens.
        noisy: ``[R, L]`` long, the noisy completions (x_t).
        context: ``[R, L]`` long, what the earlier blocks show (x_0).
        block_size: tokens per block.
        dtype: the model's float dtype (of the mask).
        completion_valid: ``[R, L]`` bool, a prefix of each completion: the positions after it are
            attended by nobody, as if absent (DARE's block actors drop them; default: all present).
    """
    x_noisy, x_ctx = torch.cat([prompt, noisy], 1), torch.cat([prompt, context], 1)  # [R, T]
    comp = torch.ones_like(noisy, dtype=torch.bool) if completion_valid is None else completion_valid.bool()
    valid = torch.cat([prompt_mask.bool(), comp], 1)
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)  # 0 at each row's first real token (ModelAdapter.position_ids)
    c0 = noisy_start(prompt_mask, block_size)
    ids = torch.cat([x_noisy[:, c0:], x_ctx], 1)
    positions = torch.cat([pos[:, c0:], pos], 1)
    keep = torch.cat([valid[:, c0:], valid], 1)
    is_noisy = torch.zeros_like(keep)
    is_noisy[:, : x_noisy.shape[1] - c0] = True
    mask = doubled_block_mask(positions, is_noisy, keep, block_size, dtype)
    return ids, mask, positions, prompt.shape[1] - c0


def score_blocks(adapter: ModelAdapter, prompt: torch.Tensor, prompt_mask: torch.Tensor, noisy: torch.Tensor,
                 context: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, targets: torch.Tensor,
                 completion_valid: torch.Tensor | None = None) -> torch.Tensor:
    """``log p_θ(targets[m] | context blocks before its block, its block of noisy[rows[m]])`` at completion
    position ``cols[m]``, for every m in one doubled forward (module docstring); the output layer runs on
    the M scored positions only.

    Args:
        adapter: a block-diffusion model (``block_size`` set, no logit shift).
        prompt, prompt_mask: ``[R, P]`` the rows' prompts and real-token masks.
        noisy, context: ``[R, L]`` long, each row's noisy completion and its context completion.
        rows, cols, targets: ``[M]`` long, input row, completion position and token of each score.
        completion_valid: ``[R, L]`` bool or ``None``, as :func:`doubled_rows`.

    Returns:
        ``[M]`` float32 log-probabilities.

    Raises:
        ValueError: the adapter has no ``block_size``, or has a logit shift (Fast-dLLM v2's doubled
            forward is not built here).
    """
    if adapter.block_size is None:
        raise ValueError("score_blocks needs a block-diffusion adapter (block_size set)")
    if adapter.shift:
        raise ValueError("the doubled x_t ⊕ x_0 forward of a shifted block model (Fast-dLLM v2) is not built; "
                         "its first-in-block predictions read the previous block's last row")
    ids, mask, positions, offset = doubled_rows(prompt, prompt_mask, noisy, context, int(adapter.block_size),
                                                adapter.dtype, completion_valid)
    return adapter.log_probs_at(ids, None, rows, cols + offset, targets, layout=(mask, positions))


def block_logits(adapter: ModelAdapter, prompt: torch.Tensor, prompt_mask: torch.Tensor, noisy: torch.Tensor,
                 context: torch.Tensor) -> torch.Tensor:
    """Logits of every completion position of ``noisy`` when its block is as in ``noisy`` and the earlier
    blocks as in ``context``: the doubled forward's noisy copy (:func:`doubled_rows`), e.g. each block's
    greedy prediction with the block masked and the earlier blocks clean (the lm-eval model's
    ``is_greedy``).

    Args:
        adapter: a block-diffusion model (``block_size`` set, no logit shift).
        prompt, prompt_mask: ``[R, P]`` the rows' prompts and real-token masks.
        noisy, context: ``[R, L]`` long.

    Returns:
        ``[R, L, V]`` logits in the model's dtype.

    Raises:
        ValueError: as :func:`score_blocks`.
    """
    if adapter.block_size is None or adapter.shift:
        raise ValueError("block_logits needs a block-diffusion adapter without a logit shift (block_size set)")
    ids, mask, positions, offset = doubled_rows(prompt, prompt_mask, noisy, context, int(adapter.block_size),
                                                adapter.dtype)
    logits = adapter._raw_logits(ids, None, layout=(mask, positions))  # the package's own adapter
    return logits[:, offset: offset + noisy.shape[1]]


def score_rows(adapter: ModelAdapter, prompt: torch.Tensor, prompt_mask: torch.Tensor, noisy: torch.Tensor,
               context: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The scoring forward of every estimator: the plain forward of ``noisy``
    (:func:`~maskrl.likelihood.base.score_positions`) for a full-attention model, or for a block model
    whose rows all have ``context == noisy`` (the doubled forward would equal it); else
    :func:`score_blocks`. Same arguments and result as :func:`score_blocks`; always one forward."""
    if getattr(adapter, "block_size", None) is None or torch.equal(noisy, context):
        return score_positions(adapter, prompt, prompt_mask, noisy, rows, cols, targets)
    return score_blocks(adapter, prompt, prompt_mask, noisy, context, rows, cols, targets)


def block_rounds(commit_step: torch.Tensor, prompt_mask: torch.Tensor,
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The within-block denoising rounds of block rollouts (dLLM-RL's TraceRL ``one_round_vectorized``).

    Args:
        commit_step: ``[N, L]`` long, >= 0.
        prompt_mask: ``[N, P]`` bool (a row's completion starts at position ``P_n``, so its blocks are
            ``(P_n + i) // block_size``).
        block_size: tokens per block.

    Returns:
        ``(ordered [N] bool, rank [N, L] long)``: ``ordered[n]`` when row n decoded its blocks in order
        (every commit step of a block is below every commit step of the next block), so that at each
        step the earlier blocks were clean; ``rank[n, i]``: how many distinct commit steps of i's block
        come before i's (round r of a block masks its positions of rank >= r and commits those of rank r).
    """
    n, L = commit_step.shape
    device = commit_step.device
    cs = commit_step.long()
    first = prompt_mask.long().sum(-1)  # [N] P_n
    blk = (first[:, None] + torch.arange(L, device=device)[None]) // block_size
    blk = blk - blk[:, :1]  # [N, L] local block 0..
    nb = int(blk.max()) + 1 if cs.numel() else 1
    slot = torch.arange(n, device=device)[:, None] * nb + blk  # [N, L] (row, block)
    big = int(cs.max()) + 1 if cs.numel() else 1
    flat_slot, flat_cs = slot.reshape(-1), cs.reshape(-1)
    lo = torch.full((n * nb,), big, dtype=torch.long, device=device).scatter_reduce(0, flat_slot, flat_cs, "amin")
    hi = torch.full((n * nb,), -1, dtype=torch.long, device=device).scatter_reduce(0, flat_slot, flat_cs, "amax")
    lo, hi = lo.view(n, nb), hi.view(n, nb)
    present = hi >= 0
    ordered = ((hi[:, :-1] < lo[:, 1:]) | ~present[:, 1:]).all(-1)
    key = slot * big + cs  # unique per (row, block, step)
    uniq, dense = torch.unique(key, return_inverse=True)  # dense ids sorted by (row, block, step)
    first_id = torch.full((n * nb,), uniq.numel(), dtype=torch.long, device=device).scatter_reduce(
        0, flat_slot, dense.reshape(-1), "amin")
    rank = dense - first_id[slot]
    return ordered, rank


#: why ``masking: spg_public`` (:mod:`maskrl.likelihood.elbo`) is refused on a block-diffusion model
SPG_PUBLIC_BLOCKS = ("masking: spg_public hides clean context tokens left of the drawn block and scores every later "
                     "block; a block-diffusion model's ELBO conditions each block on the clean earlier blocks: use "
                     "masking: block or random")


def model_refusal(likelihood: object, block_model: bool) -> str | None:
    """Why ``likelihood`` cannot score a block-diffusion model (``block_model``) or a full-attention one, or
    ``None`` when it can: the estimator's own ``refusal(block_model)`` where it defines one (the ELBO's
    ``masking: spg_public`` refuses block models, :data:`SPG_PUBLIC_BLOCKS`; ``block_elbo`` refuses
    full-attention ones), else ``None``. Read at config time (a tiny model, ``model.tiny.block_size``) and by
    the trainer (a loaded model), so that the error comes before any rollout."""
    refusal = getattr(likelihood, "refusal", None)
    return refusal(block_model) if callable(refusal) else None
