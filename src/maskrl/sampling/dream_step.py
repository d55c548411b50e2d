"""One sampler step under Dream's rule (:mod:`maskrl.sampling.dream` says what each piece is and whose
code it follows): the position choice on Dream's layout of the confidences (:class:`DreamLayout`,
:func:`layout_ranks`, :func:`layout_alg_temp`), ``origin`` (:func:`select_origin`), Fast-dLLM's first
position of a block (:func:`forced_candidates`), and the step itself (:func:`dream_step`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from maskrl.sampling.commit import hold_stops, rank_positions
from maskrl.sampling.config import SamplerConfig
from maskrl.sampling.dream import (EXP_CHUNK, DREAM_CONFIDENCES, categorical_probs, demote_stops, dream_confidence,
                                   dream_draw, dream_probs, exp_like)


@dataclass(frozen=True)
class DreamLayout:
    """How Dream's code lays out each row's confidences before ``torch.topk`` / ``multinomial``: a row
    of ``width [n]`` columns, ``-inf`` except at the block's masked positions, block position ``q`` at
    column ``off + q`` (``off [n]``). The layout decides how ``topk`` breaks ties and which numbers
    ``alg_temp``'s draw takes, so it is Dream's own:

    - ``block_first="ranked"``: Dream's ``diffusion_generate``, one row of the whole sequence
      (``width = P + L``, ``off = P + block start``);
    - ``block_first="forced"``: Fast-dLLM's block variant, the block start to the end
      (``width = L - block start``, ``off = 0``), or the block alone under the dual cache (``width = b``).
    """

    width: torch.Tensor
    off: torch.Tensor

    @classmethod
    def of(cls, config: SamplerConfig, p_len: int, start: torch.Tensor) -> "DreamLayout":
        """The layout of rows whose blocks start at completion positions ``start [n]`` long."""
        L, b = config.gen_length, config.block_length
        if config.block_first == "ranked":
            return cls(torch.full_like(start, p_len + L), p_len + start)
        width = torch.full_like(start, b) if config.cache == "dual" else L - start
        return cls(width, torch.zeros_like(start))

    def __getitem__(self, rows: torch.Tensor) -> "DreamLayout":
        return DreamLayout(self.width[rows], self.off[rows])


def _groups(*keys: torch.Tensor) -> list[tuple[list[int], torch.Tensor]]:
    """Rows with equal ``keys`` (each ``[n]`` long): ``[(key values, rows [g])]``."""
    uniq, inv = torch.unique(torch.stack(keys, -1), dim=0, return_inverse=True)
    return [(uniq[g].tolist(), (inv == g).nonzero().squeeze(-1)) for g in range(uniq.shape[0])]


def _spread(score: torch.Tensor, off: torch.Tensor, width: int) -> torch.Tensor:
    """``[g, width]``: ``score [g, b]`` at columns ``off + q``, ``-inf`` elsewhere."""
    cols = off[:, None] + torch.arange(score.shape[-1], device=score.device)
    return score.new_full((score.shape[0], width), float("-inf")).scatter(1, cols, score)


def _mark(idx: torch.Tensor, off: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Columns ``idx [g, k]`` of a layout back to block positions: ``(row, q, order)`` of the ones
    inside the block (``order`` the place in ``idx``)."""
    q = idx - off[:, None]
    ok = (q >= 0) & (q < b)
    rows = torch.arange(idx.shape[0], device=idx.device)[:, None].expand_as(idx)
    order = torch.arange(idx.shape[1], device=idx.device).expand_as(idx)
    return rows[ok], q[ok], order[ok]


def layout_ranks(score: torch.Tensor, k: torch.Tensor, layout: DreamLayout) -> torch.Tensor:
    """``[n, b]`` long: each position's place in ``torch.topk`` of its row's layout (``k [n]`` long
    taken; 0 = first), ``iinfo.max`` for the others. ``score [n, b]`` is ``-inf`` off the masks."""
    n, b = score.shape
    rank = torch.full((n, b), torch.iinfo(torch.long).max, dtype=torch.long, device=score.device)
    for (width, kk), rows in _groups(layout.width, k):
        if kk == 0:
            continue
        idx = torch.topk(_spread(score[rows], layout.off[rows], width), kk, dim=-1).indices
        r, q, order = _mark(idx, layout.off[rows], b)
        part = rank[rows]
        part[r, q] = order
        rank[rows] = part
    return rank


def layout_alg_temp(score: torch.Tensor, k: torch.Tensor, layout: DreamLayout, alg_temp: float,
                    generator: torch.Generator | None, stop: torch.Tensor | None = None) -> torch.Tensor:
    """Dream's ``alg_temp`` position draw: ``multinomial(softmax(row / alg_temp), k)`` without
    replacement on each row's layout, which is ``topk(p / q, k)`` with ``q ~ Exp(1)`` like ``p``
    (:func:`~maskrl.sampling.dream.exp_like`); nothing is drawn for rows that commit nothing (Dream
    draws only when ``k > 0``). ``score [n, b]``, ``k [n]``; returns ``[n, b]`` bool. ``stop [n, b]``
    bool (``suppress_eos``): the same draw, with the masked positions whose candidate is a stop taken
    only after every other masked one (the order of ``p / q`` within each of the two)."""
    n, b = score.shape
    take = torch.zeros((n, b), dtype=torch.bool, device=score.device)
    for (width, kk), rows in _groups(layout.width, k):
        if kk == 0:
            continue
        spread = _spread(score[rows], layout.off[rows], width)
        p = torch.softmax(spread / alg_temp, dim=-1)
        key = p / exp_like(p, generator)
        if stop is None:
            idx = torch.topk(key, kk, dim=-1).indices
        else:  # tiers: masked non-stop, masked stop, the rest; p / q orders each tier
            is_stop = _spread(stop[rows].to(spread.dtype), layout.off[rows], width) > 0
            tier = torch.isfinite(spread).long() * 2 - is_stop.long()
            order = key.argsort(dim=-1, descending=True, stable=True)
            order = order.gather(-1, tier.gather(-1, order).argsort(dim=-1, descending=True, stable=True))
            idx = order[:, :kk]
        r, q, _ = _mark(idx, layout.off[rows], b)
        part = take[rows]
        part[r, q] = True
        take[rows] = part
    return take


def select_origin(eligible: torch.Tensor, p_reveal: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Dream's ``origin``: reveal each ``eligible [n, b]`` position with probability ``p_reveal [n]``;
    one float32 uniform per eligible position, drawn in row-major order; ``[n, b]`` bool."""
    device = generator.device if generator is not None else eligible.device
    u = torch.rand(int(eligible.sum()), generator=generator, device=device).to(eligible.device)
    take = torch.zeros_like(eligible)
    take[eligible] = u < p_reveal[:, None].expand_as(eligible)[eligible]
    return take


def _exp_rows(total: int, width: int, wanted: torch.Tensor, dtype: torch.dtype,
              generator: torch.Generator | None) -> torch.Tensor:
    """Rows ``wanted [f]`` of one ``[total, width]`` draw of ``Exp(1)`` from ``generator``. On a CPU
    generator the draw is made in chunks of rows, which give the same numbers in the same order (torch
    draws them one after the other), so memory stays one chunk; elsewhere it is one draw."""
    device = generator.device if generator is not None else torch.device("cpu")
    step = max(1, EXP_CHUNK // width) if device.type == "cpu" else total
    wanted = wanted.to(device)
    out = torch.empty((wanted.numel(), width), dtype=dtype, device=device)
    for r0 in range(0, total, step):
        block = torch.empty((min(total, r0 + step) - r0, width), dtype=dtype, device=device)
        block.exponential_(generator=generator)
        sel = ((wanted >= r0) & (wanted < r0 + block.shape[0])).nonzero().squeeze(-1)
        if sel.numel():
            out[sel] = block[wanted[sel] - r0]
    return out


def forced_candidates(config: SamplerConfig, raw_first: torch.Tensor, never: torch.Tensor, n_cols: int,
                      cols: torch.Tensor, sequence_logits: Callable[[], Iterable[torch.Tensor]],
                      generator: torch.Generator | None) -> torch.Tensor:
    """Fast-dLLM's candidate for the first position of ``f`` rows' blocks (``block_first="forced"``).

    Fast-dLLM draws it with Dream's ``sample_tokens`` over the logits of every position of the ``[f,
    n_cols]`` sequence at once and keeps the block's first column: greedy, the most probable id;
    sampled, one ``Categorical`` over all ``f · n_cols`` rows (``q ~ Exp(1)`` for each, the rows other
    than the kept ones drawn and discarded), or the greedy id when ``Categorical`` rejects any row.

    Args:
        config: the sampler (temperature, top_k, top_p, dream_dtype).
        raw_first: ``[f, V]`` raw logits of the rows' first block positions.
        never: ``[V]`` bool ids never drawn.
        n_cols: ``P + L``, the sequence length.
        cols: ``[f]`` long, the column of each row's first block position.
        sequence_logits: yields the raw logits of every column of the ``f`` rows, in chunks of
            ``[c, V]`` (used only when sampling, for ``Categorical``'s check).
        generator: the noise source.

    Returns:
        ``[f]`` long candidates.
    """
    dtype = raw_first.dtype if config.dream_dtype == "model" else torch.float32
    probs = dream_probs(raw_first, config.temperature, config.top_k, config.top_p, dtype)
    if config.temperature == 0:
        return dream_draw(probs, never, 0.0, None)
    accepted = all(categorical_probs(dream_probs(z, config.temperature, config.top_k, config.top_p, dtype)) is not None
                   for z in sequence_logits())
    f = raw_first.shape[0]
    wanted = torch.arange(f, device=cols.device) * n_cols + cols
    q = _exp_rows(f * n_cols, probs.shape[-1], wanted, probs.dtype, generator).to(probs.device) if accepted else None
    return dream_draw(probs, never, config.temperature, generator, q=q, accepted=accepted)


def dream_step(config: SamplerConfig, logits: torch.Tensor, raw: torch.Tensor, at: torch.Tensor,
               eligible: torch.Tensor, never: torch.Tensor, *, k: torch.Tensor | None, p_reveal: torch.Tensor | None,
               layout: DreamLayout, stop_fn: Callable[[torch.Tensor], torch.Tensor] | None,
               generator: torch.Generator | None,
               tail: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One ranked commit step under Dream's rule on ``n`` rows' block positions.

    Args:
        config: the sampler (remasking, schedule, threshold, temperature, top_k, top_p, alg_temp, dream_dtype).
        logits: ``[M, V]`` the step's candidate logits (never-valid ids ``-inf``).
        raw: ``[M, V]`` the same positions' raw output-layer logits (Dream's softmax keeps every id).
        at: ``[n, b]`` long, the row of each block position in ``logits`` / ``raw``.
        eligible: ``[n, b]`` bool, positions still masked.
        never: ``[V]`` bool, ids never drawn (``[M]``, ids without a tokenizer entry).
        k: ``[n]`` long commits per row (schedules ``dream`` / ``fixed``); p_reveal: ``[n]`` (``origin``).
        layout: Dream's layout of the rows' confidences (:class:`DreamLayout`).
        stop_fn: ``ids -> bool`` stop-token test (``suppress_eos``), or ``None``.
        generator: the noise source: the candidate draw first, then the position draw (``origin``: the
            uniforms first, then the revealed positions' candidates), as Dream draws.
        tail: ``(rows [m', V], is_block [m'] bool)``: the raw logits Dream's candidate draw runs on
            when it covers more than the block's masks (Fast-dLLM's threshold without the dual cache
            draws every masked position from the block start to the end), in Dream's row-major order,
            ``is_block`` marking the block's eligible positions (in their row-major order); ``None``:
            the block's eligible positions.

    Returns:
        ``(take [n, b] bool, cand [n, b] long)`` (``cand`` meaningful where eligible).
    """
    dtype = raw.dtype if config.dream_dtype == "model" else torch.float32
    tau = config.temperature
    cand = torch.zeros(eligible.shape, dtype=torch.long, device=eligible.device)
    if config.remasking == "origin":
        take = select_origin(eligible, p_reveal, generator)
        revealed = dream_probs(raw[at[take]], tau, config.top_k, config.top_p, dtype)
        cand[take] = dream_draw(revealed, never, tau, generator)
        if stop_fn is None:
            return take, cand
        # candidates exist only where revealed: a revealed stop waits until no other mask is left in the block
        return hold_stops(take, stop_fn(cand) & take, eligible), cand
    if tail is None:
        probs = dream_probs(raw[at[eligible]], tau, config.top_k, config.top_p, dtype)  # [m, V] Dream's mask_logits
        cand[eligible] = dream_draw(probs, never, tau, generator)
    else:
        probs = dream_probs(tail[0], tau, config.top_k, config.top_p, dtype)
        cand[eligible] = dream_draw(probs, never, tau, generator)[tail[1]]
        probs = probs[tail[1]]
    stop = stop_fn(cand) & eligible if stop_fn is not None else None
    if config.remasking not in DREAM_CONFIDENCES:  # LLaDA's remasking with Dream's filters (schedule fixed / dream)
        if config.remasking == "random":
            score = torch.rand(eligible.shape, generator=generator, device=eligible.device)
        else:
            score = torch.softmax(logits[at].float(), dim=-1).gather(-1, cand[..., None]).squeeze(-1)
        rank = rank_positions(demote_stops(score, stop).masked_fill(~eligible, float("-inf")))
        return (rank < k[:, None]) & eligible, cand
    conf = torch.full(eligible.shape, float("-inf"), dtype=dtype, device=eligible.device)
    conf[eligible] = dream_confidence(probs, cand[eligible], config.remasking)
    score = demote_stops(conf, stop).masked_fill(~eligible, float("-inf"))
    if config.schedule == "threshold":  # Fast-dLLM's Dream confidence_threshold
        rank = layout_ranks(score, eligible.sum(-1), layout)
        take = ((rank == 0) | (conf >= config.threshold)) & eligible
        return (hold_stops(take, stop, eligible) if stop is not None else take), cand
    if config.alg_temp > 0:
        return layout_alg_temp(score, k, layout, config.alg_temp, generator, stop) & eligible, cand
    return (layout_ranks(score, k, layout) < k[:, None]) & eligible, cand
