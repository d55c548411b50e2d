"""Which positions each sampler step forwards: no cache, or Fast-dLLM's prefix / dual key/value caches
(Wu et al. 2025, "Fast-dLLM", §3.1-3.2; docs/spec.md §1.2), and the output layer on the positions needed.

The output layer runs only on the positions a step can commit (the current block) plus the positions
observers ask for (:attr:`~maskrl.sampling.StepObserver.logit_scope`); no ``[N, L, V]`` tensor is
built.

``SamplerConfig.cache`` is ``"none"`` (every step one full forward), ``"prefix"`` or ``"dual"``
(refreshed at each row's block start, then window forwards against the cache); what each computes,
when it is exact and what it costs: ``docs/sampler.md`` (the one explanation of the caches).

One forward-count rule (:func:`plan_forwards`) decides, before any forward of a step, which decoder
forwards run, which completion positions each row's forward computes (its *window*), and which rows'
observer views need one extra full forward (asked beyond the window, or an ``exact_logits`` observer
reading a cached row). The step runs exactly that plan, and the rank lockstep
(:class:`~maskrl.sampling.lockstep.RankLockstep`) sends the same counts to the other ranks
(:func:`cached_forward_counts`): on several ranks the forwards per step vary with the rows' block
starts, and every rank pads to the maximum.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling.config import SamplerConfig


@dataclass(frozen=True)
class Forward:
    """One decoder forward of a step: ``rows [g]`` long (indices into the step's ``n`` rows) and
    whether it is a full forward of those rows (``window=False``) or a window forward against the
    cache (``window=True``; the rows of one window forward share their window width). ``refill``
    (``cache="block"`` only): ``"prompt"`` -- the window runs from column 0 through the block (the
    complete prompt blocks, block-causal, and the first block), ``"block"`` -- the previous, now
    complete, block and this one; both write their keys/values into the cache; ``""`` -- the block
    alone, reading the cache."""

    rows: torch.Tensor
    window: bool
    refill: str = ""


@dataclass(frozen=True)
class StepForwards:
    """The plan of one step (:func:`plan_forwards`).

    Attributes:
        forwards: the decoder forwards, in the order they run.
        full: ``[n]`` bool, rows whose step is a full forward (their logits are exact).
        lo, hi: ``[n]`` long, the completion positions ``[lo, hi)`` each row's forward computes.
        inside: ``[n]`` bool, rows whose observer requests lie in their window; ``None`` when no
            observer asks beyond the block.
        redo: ``[n]`` bool, rows whose observer view needs one extra full forward; ``None`` without
            observers.
    """

    forwards: list[Forward]
    full: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    inside: torch.Tensor | None
    redo: torch.Tensor | None

    @property
    def decoder_forwards(self) -> int:
        """Decoder forwards before the step's output layer."""
        return len(self.forwards)

    @property
    def extra_forward(self) -> int:
        """1 if the observers' extra full forward runs at this step, else 0."""
        return int(bool(self.redo.any())) if self.redo is not None else 0

    def computed(self, L: int) -> torch.Tensor:
        """``[n, L]`` bool, the completion positions ``[lo, hi)`` whose logits each row's forward computes."""
        pos = torch.arange(L, device=self.lo.device)
        return (pos[None, :] >= self.lo[:, None]) & (pos[None, :] < self.hi[:, None])


def plan_forwards(cache: str, block_length: int, refresh: torch.Tensor, start: torch.Tensor, L: int,
                  requested: torch.Tensor | None = None, wants_exact: torch.Tensor | None = None,
                  lead: int = 0, block_end: torch.Tensor | None = None) -> StepForwards:
    """The forwards one sampler step runs, their windows, and the rows whose view needs an extra
    full forward (module docstring).

    Args:
        cache: ``"none"``, ``"prefix"`` or ``"dual"``.
        block_length: b.
        refresh: ``[n]`` bool, rows at their block's first step (with a cache, a full forward fills
            the row's cache there); ignored with ``cache="none"``, where every row is a full forward.
        start: ``[n]`` long, each row's block start in the completion.
        L: completion length.
        requested: ``[n, L]`` bool positions observers ask for (``None``: none beyond the block).
        wants_exact: ``[n]`` bool rows an ``exact_logits`` observer reads (``None``: no observers).
        lead: block positions at the left end of a window forward that it does not compute: 1 for a
            shifted (Dream-style) model under ``block_first="forced"``, whose window starts at the
            block (the block's first position, committed at the block's full first step, would need
            the column left of it); 0 otherwise (the window then holds that column too).
        block_end: ``[n]`` long, with ``cache="block"``: the end (exclusive, in the completion) of each
            row's current block. A row's first block ends before ``start + b`` when its prompt's last
            block is partial (blocks are aligned from the prompt's first token), and its window holds
            only that block; ``None``: ``min(start + b, L)``.

    Returns:
        A :class:`StepForwards`: with ``cache="none"`` one full forward of every row; with ``"block"``
        the block cache's window forwards (:func:`_block_plan`); else one full
        forward of the refreshing rows, then one window forward of the others (dual) or one per
        distinct block start, ascending (prefix).
    """
    n = start.shape[0]
    every = torch.arange(n, device=start.device)
    if cache == "block":
        return _block_plan(block_length, refresh, start, L, requested, block_end)
    if cache == "none":
        full = torch.ones(n, dtype=torch.bool, device=start.device)
        forwards = [Forward(every, window=False)]
    else:
        full = refresh
        forwards = [Forward(refresh.nonzero().squeeze(-1), window=False)] if refresh.any() else []
        rest = (~refresh).nonzero().squeeze(-1)
        if rest.numel():
            if cache == "dual":
                forwards.append(Forward(rest, window=True))
            else:
                forwards += [Forward(rest[start[rest] == s], window=True) for s in start[rest].unique()]
    lo = torch.where(full, 0, start + lead)
    hi = torch.where(full, L, start + block_length) if cache == "dual" else torch.full_like(start, L)
    inside = redo = None
    if requested is not None:
        pos = torch.arange(L, device=start.device)
        window = (pos[None, :] >= lo[:, None]) & (pos[None, :] < hi[:, None])  # [n, L]
        inside = ~(requested & ~window).any(-1)
    if wants_exact is not None:
        redo = wants_exact & ~full
        if inside is not None:
            redo = redo | ~inside
    elif inside is not None:
        redo = ~inside
    return StepForwards(forwards, full, lo, hi, inside, redo)


def _block_plan(block_length: int, refresh: torch.Tensor, start: torch.Tensor, L: int,
                requested: torch.Tensor | None, block_end: torch.Tensor | None = None) -> StepForwards:
    """:func:`plan_forwards` for ``cache="block"`` (:mod:`maskrl.sampling.blockcache`): rows at their first
    block refill from column 0, rows at a later block's first step refill the previous block, the others
    read the cache; every row's logits are exact (the cache holds complete blocks only). Rows asking for
    logits beyond their block get the observers' extra full forward."""
    forwards = []
    for rows, refill in ((refresh & (start == 0), "prompt"), (refresh & (start > 0), "block"), (~refresh, "")):
        if rows.any():
            forwards.append(Forward(rows.nonzero().squeeze(-1), window=True, refill=refill))
    full = torch.ones_like(refresh)
    lo, hi = start, (start + block_length).clamp(max=L) if block_end is None else block_end
    inside = redo = None
    if requested is not None:
        pos = torch.arange(L, device=start.device)
        window = (pos[None, :] >= lo[:, None]) & (pos[None, :] < hi[:, None])
        inside = ~(requested & ~window).any(-1)
        redo = ~inside
    return StepForwards(forwards, full, lo, hi, inside, redo)


def cached_forward_counts(config: SamplerConfig, refresh: torch.Tensor, start: torch.Tensor,
                          requested: torch.Tensor | None, L: int,
                          wants_exact: torch.Tensor | None = None, lead: int = 0) -> tuple[int, int]:
    """Forwards one cached sampler step runs (what :func:`~maskrl.sampling.generate` sends to
    ``ranks_max``), by the one rule :func:`plan_forwards`.

    Args:
        config: the sampler (``cache`` ``prefix`` or ``dual``).
        refresh: ``[n]`` bool, rows at their block's first step (a full forward fills the cache).
        start: ``[n]`` long, each row's block start in the completion.
        requested: ``[n, L]`` bool positions observers asked for, or ``None``.
        L: completion length.
        wants_exact: ``[n]`` bool rows an ``exact_logits`` observer reads, or ``None``.
        lead: as in :func:`plan_forwards` (:attr:`KVCache.lead`).

    Returns:
        ``(decoder forwards before the output layer, 1 if the observers' extra full forward runs, else
        0)``: one full forward when a row refreshes; then one window forward for the other rows (dual)
        or one per distinct block start (prefix). The extra forward runs when a row's requests leave
        its window, or an exact-logits observer reads a cached (non-refresh) row.
    """
    plan = plan_forwards(config.cache, config.block_length, refresh, start, L, requested, wants_exact, lead)
    return plan.decoder_forwards, plan.extra_forward


@dataclass(frozen=True)
class Hidden:
    """What one forward gave for ``rows [g]`` (indices into the step's rows): hidden states
    ``hidden [g, W, d]`` over columns ``[w0, w0 + W)`` (``w0 [g]`` long), or, for models without a
    decoder forward, the completion logits ``logits [g, L, V]``."""

    rows: torch.Tensor
    hidden: torch.Tensor | None = None
    w0: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class KVCache:
    """Runs a step's :class:`StepForwards` for one :func:`~maskrl.sampling.generate` call, holding the
    rows' cached keys/values (per layer ``[N, H, S, D]``, filled at each row's block start).

    A window forward writes its fresh keys/values into the store in place and attends the store itself
    (:meth:`~maskrl.models.adapter.ModelAdapter.decoder_forward`'s ``write_at``): no copy of the cache
    when every row of the batch takes part, one copy of those rows' caches otherwise. The window's
    cached columns are never read (each window forward recomputes them), so writing over them changes
    nothing. Under ``cache="dual"`` with ``block_first="ranked"`` each row's store is kept in the order
    its window forwards attend (:func:`others_then_window`, laid out once at the row's block start).

    Args:
        adapter: the model.
        config: the sampler settings (``cache``, ``cfg_scale``).
        n_rows: N, rows of the whole batch.
        p_len: prompt columns P.
        pos_ids: ``[N, P + L]`` RoPE positions of the batch (``None`` for 2-D-attention models).
    """

    def __init__(self, adapter: ModelAdapter, config: SamplerConfig, n_rows: int, p_len: int,
                 pos_ids: torch.Tensor | None) -> None:
        self.adapter, self.config, self.n_rows, self.p_len, self.pos_ids = adapter, config, n_rows, p_len, pos_ids
        #: 1 when a window holds the column left of the block (a shifted model's prediction of the block's
        #: first position); under ``block_first="forced"`` that position is committed at the block's full
        #: first step and the window starts at the block, as Fast-dLLM's Dream variant's does
        self.shift = 1 if adapter.shift and config.block_first == "ranked" else 0
        #: block positions a window forward does not compute (:func:`plan_forwards`' ``lead``)
        self.lead = 1 if adapter.shift and config.block_first == "forced" else 0
        #: the dual cache's window attends the other columns first, then its own (else: sequence order)
        self.permuted = config.cache == "dual" and config.block_first != "forced"
        self.store: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        #: :class:`WindowLayout` per (rows, window starts): constant while those rows stay in their blocks
        self.layouts: dict[tuple, WindowLayout] = {}

    def run(self, plan: StepForwards, rows: torch.Tensor, xr: torch.Tensor, ar: torch.Tensor,
            start: torch.Tensor) -> list[Hidden]:
        """The plan's forwards, in order, for the step's ``rows [n]`` (batch indices) with pre-step
        tokens ``xr [n, S]``, key validity ``ar [n, S]`` and block starts ``start [n]``."""
        return [self._window(f.rows, rows, xr, ar, start) if f.window else self._full(f.rows, rows, xr, ar, start)
                for f in plan.forwards]

    def _span(self, start: torch.Tensor, n_cols: int) -> tuple[torch.Tensor, int]:
        """``(w0 [g], W)``: the window forwards' first column and width for rows at block starts ``start``."""
        w0 = self.p_len + start - self.shift
        width = self.config.block_length + self.shift if self.config.cache == "dual" else n_cols - int(w0[0])
        return w0, width

    def _full(self, loc, rows, xr, ar, start) -> Hidden:
        ad, cached = self.adapter, self.config.cache != "none"
        if not ad.supports_cache or self.config.cfg_scale > 0:  # logits of the whole sequence
            return Hidden(loc, logits=full_logits(ad, xr[loc], ar[loc], self.p_len, self.config.cfg_scale))
        h, kv = ad.decoder_forward(xr[loc], ar[loc], ad.position_ids(ar[loc]), return_kv=cached)
        if cached:
            if self.store is None:
                self.store = [(torch.zeros((self.n_rows, *k.shape[1:]), dtype=k.dtype, device=k.device),
                               torch.zeros((self.n_rows, *v.shape[1:]), dtype=v.dtype, device=v.device)) for k, v in kv]
            order = others_then_window(*self._span(start[loc], xr.shape[1]), xr.shape[1]) if self.permuted else None
            for (k_all, v_all), (k, v) in zip(self.store, kv):
                k_all[rows[loc]] = k if order is None else _columns(k, order)
                v_all[rows[loc]] = v if order is None else _columns(v, order)
        return Hidden(loc, h, torch.zeros(len(loc), dtype=torch.long, device=h.device))

    def _window(self, loc, rows, xr, ar, start) -> Hidden:
        w0, width = self._span(start[loc], xr.shape[1])
        sr = rows[loc]
        every = sr.numel() == self.n_rows and bool((sr == torch.arange(self.n_rows, device=sr.device)).all())
        past = self.store if every else [(k[sr], v[sr]) for k, v in self.store]  # all rows: the store itself
        key = (tuple(sr.tolist()), tuple(w0.tolist()))
        if key not in self.layouts:  # the same rows in the same blocks: the layout of their last step
            order = others_then_window(w0, width, xr.shape[1]) if self.permuted else None
            self.layouts[key] = window_layout(ar[loc], self.pos_ids[sr], w0, width, order)
        return Hidden(loc, window_forward(self.adapter, past, xr[loc], None, None, w0, width, None,
                                          self.layouts[key]), w0)


def full_logits(adapter: ModelAdapter, xr: torch.Tensor, ar: torch.Tensor, p_len: int, cfg_scale: float) -> torch.Tensor:
    """``[n, L, V]`` completion logits of full forwards of ``xr [n, P + L]`` (with classifier-free
    guidance when ``cfg_scale > 0``: the unconditional pass masks the prompt); used for models without
    :meth:`~maskrl.models.adapter.ModelAdapter.decoder_forward` (2-D attention) and for guidance."""
    logits = adapter.logits(xr, ar)
    if cfg_scale > 0:
        uncond = xr.clone()
        uncond[:, :p_len] = torch.where(ar[:, :p_len], adapter.mask_id, uncond[:, :p_len])
        un = adapter.logits(uncond, ar)
        logits = un + (cfg_scale + 1) * (logits - un)
    return logits[:, p_len:]


def window_hidden(adapter: ModelAdapter, kv_store: Sequence[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor,
                  attn: torch.Tensor, pos_ids: torch.Tensor, store_rows: torch.Tensor, w0: torch.Tensor,
                  width: int, in_order: bool = False) -> torch.Tensor:
    """Hidden states of a window of columns recomputed against the cached keys/values of all others
    (Fast-dLLM prefix cache: window = block and everything right of it; dual cache: window = block).

    Args:
        adapter: a model with :attr:`ModelAdapter.supports_cache`.
        kv_store: per layer ``(keys, values)``, each ``[N_all, H, S, D]`` in sequence order, filled by a full
            forward; not modified (the rows' keys/values are copied once, then :func:`window_forward`).
        x, attn, pos_ids: ``[g, S]`` current tokens, key validity (bool) and RoPE positions of the rows.
        store_rows: ``[g]`` long, the rows' indices into ``kv_store``.
        w0: ``[g]`` long, first column of each row's window; width: window length ``W``.
        in_order: attend the keys in sequence order, the window's fresh ones in place of its cached ones
            (Fast-dLLM's dual cache does so; used under ``block_first="forced"``); else the cached keys
            of the other columns first, then the window's (the same attention up to float rounding).

    Returns:
        ``[g, W, d]`` hidden states of columns ``w0 .. w0 + W - 1`` (input of the output layer).

    Raises:
        ValueError: when a window leaves the ``S`` columns.
    """
    order = None if in_order else others_then_window(w0, width, x.shape[1])
    past = [(k[store_rows] if order is None else _columns(k[store_rows], order),
             v[store_rows] if order is None else _columns(v[store_rows], order)) for k, v in kv_store]
    return window_forward(adapter, past, x, attn, pos_ids, w0, width, order)


def others_then_window(w0: torch.Tensor, width: int, n_cols: int) -> torch.Tensor:
    """``[g, S]`` long column order of a window forward that attends the other columns first (ascending),
    then the window's ``[w0, w0 + W)``; raises ``ValueError`` when a window leaves the ``S`` columns."""
    if bool((w0 < 0).any()) or bool((w0 + width > n_cols).any()):
        raise ValueError(f"window [w0, w0 + {width}) leaves the {n_cols} columns")
    g = w0.shape[0]
    cols = torch.arange(n_cols, device=w0.device)
    wcols = w0[:, None] + torch.arange(width, device=w0.device)  # [g, W]
    in_win = (cols[None, :] >= w0[:, None]) & (cols[None, :] < w0[:, None] + width)
    return torch.cat([cols.expand(g, -1)[~in_win].view(g, n_cols - width), wcols], 1)


def _columns(kv: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``kv [g, H, S, D]`` with its columns taken in ``order [g, S]`` (a copy)."""
    return kv.gather(2, order[:, None, :, None].expand(-1, kv.shape[1], -1, kv.shape[-1]))


@dataclass(frozen=True)
class WindowLayout:
    """What a window forward reads besides the tokens, fixed while the rows stay in their blocks
    (:func:`window_layout`): the window's columns ``wcols [g, W]``, the key validity ``key_mask [g, K]`` in the
    store's column order, the store columns ``write_at [g, W]`` the fresh keys/values go to, and the window's
    RoPE positions ``pos [g, W]``."""

    wcols: torch.Tensor
    key_mask: torch.Tensor
    write_at: torch.Tensor
    pos: torch.Tensor


def window_layout(attn: torch.Tensor, pos_ids: torch.Tensor, w0: torch.Tensor, width: int,
                  order: torch.Tensor | None) -> WindowLayout:
    """The :class:`WindowLayout` of windows ``[w0, w0 + W)`` (``w0 [g]`` long) over rows with key validity
    ``attn [g, S]`` and RoPE positions ``pos_ids [g, S]``; ``order`` as in :func:`window_forward`.

    Raises:
        ValueError: when a window leaves the ``S`` columns.
    """
    g, n_cols = attn.shape
    if bool((w0 < 0).any()) or bool((w0 + width > n_cols).any()):
        raise ValueError(f"window [w0, w0 + {width}) leaves the {n_cols} columns")
    wcols = w0[:, None] + torch.arange(width, device=attn.device)  # [g, W]
    if order is None:
        key_mask, write_at = attn.bool(), wcols
    else:
        key_mask = attn.gather(1, order).bool()
        write_at = (n_cols - width + torch.arange(width, device=attn.device)).expand(g, -1)
    return WindowLayout(wcols, key_mask, write_at, pos_ids.gather(1, wcols))


def window_forward(adapter: ModelAdapter, past: Sequence[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor,
                   attn: torch.Tensor, pos_ids: torch.Tensor, w0: torch.Tensor, width: int,
                   order: torch.Tensor | None, layout: WindowLayout | None = None) -> torch.Tensor:
    """The window forward of :func:`window_hidden` on keys/values already laid out: it writes the window's
    fresh keys/values into ``past`` in place and attends ``past`` whole (no copy of the cache).

    Args:
        adapter: a model with :attr:`ModelAdapter.supports_cache`.
        past: per layer ``(keys, values)``, each ``[g, H, S, D]``, the rows' caches in the column order
            ``order``; the window's columns are overwritten.
        x, attn, pos_ids: ``[g, S]`` current tokens, key validity (bool) and RoPE positions (sequence order).
        w0: ``[g]`` long, first column of each row's window; width: window length ``W``.
        order: ``[g, S]`` long (:func:`others_then_window`: the window is the last ``W`` columns of
            ``past``), or ``None``: ``past`` in sequence order (the window at ``[w0, w0 + W)``).
        layout: :func:`window_layout` of these arguments, when the caller kept it from an earlier step of
            the same blocks (``attn``, ``pos_ids`` and ``order`` are then not read); ``None``: built here.

    Returns:
        ``[g, W, d]`` hidden states of columns ``w0 .. w0 + W - 1``.

    Raises:
        ValueError: when a window leaves the ``S`` columns.
    """
    lay = window_layout(attn, pos_ids, w0, width, order) if layout is None else layout
    h, _ = adapter.decoder_forward(x.gather(1, lay.wcols), lay.key_mask, lay.pos, past=list(past),
                                   write_at=lay.write_at)
    return h


def head_at(adapter: ModelAdapter, parts: Sequence[Hidden], cover: torch.Tensor, p_len: int) -> torch.Tensor:
    """Logits at the covered completion positions, flat ``[cover.sum(), V]`` in row-major order.

    Args:
        adapter: the model (its :meth:`~maskrl.models.adapter.ModelAdapter.head` and ``shift``).
        parts: the step's forwards (:class:`Hidden`), together covering every row of ``cover``.
        cover: ``[n, L]`` bool, the positions whose logits are wanted.
        p_len: prompt columns P.

    The output layer runs once, on the gathered hidden states only (models without a decoder forward
    give their logits whole, and those are gathered instead).
    """
    n, L = cover.shape
    shift = 1 if adapter.shift else 0
    if len(parts) == 1 and parts[0].hidden is not None and _in_order(parts[0].rows, n):  # one forward, rows in order
        rr, pp = cover.nonzero(as_tuple=True)  # row-major already
        return adapter.head(parts[0].hidden[rr, p_len + pp - shift - parts[0].w0[rr]])
    fidx = cover.flatten().long().cumsum(0).view(n, L) - 1
    m = int(cover.sum())
    hs, his, ls, lis = [], [], [], []
    for part in parts:
        rr, pp = cover[part.rows].nonzero(as_tuple=True)
        if part.hidden is not None:
            col = p_len + pp - shift - part.w0[rr]
            hs.append(part.hidden[rr, col])
            his.append(fidx[part.rows[rr], pp])
        else:
            ls.append(part.logits[rr, pp])
            lis.append(fidx[part.rows[rr], pp])
    if ls and not hs:
        out = torch.cat(ls)
        return out[torch.cat(lis).argsort()]
    hidden = torch.cat(hs)
    order = torch.cat(his)
    if bool((order[1:] > order[:-1]).all()) or len(order) <= 1:
        return adapter.head(hidden)
    flat_h = hidden.new_empty((m, hidden.shape[-1]))
    flat_h[order] = hidden
    return adapter.head(flat_h)


def _in_order(rows: torch.Tensor, n: int) -> bool:
    """True when ``rows [g]`` is ``0, 1, ..., n - 1``."""
    return rows.numel() == n and bool((rows == torch.arange(n, device=rows.device)).all())


def split_head(adapter: ModelAdapter, parts: Sequence[Hidden], cover: torch.Tensor, first: torch.Tensor | None,
               p_len: int) -> torch.Tensor:
    """:func:`head_at` over ``cover [n, L]`` (flat ``[cover.sum(), V]``, row-major), with the output layer
    run once on the positions ``first [n, L]`` (within ``cover``) alone and once on the rest.

    The rows of ``first`` are therefore those of ``head_at(adapter, parts, first, p_len)`` bit for bit,
    whatever else ``cover`` holds: a matrix product's rows may round differently with the number of rows
    it is given, so observers asking for more positions never move the logits the commit rule reads.
    ``first=None``: one call on ``cover``. Otherwise always two calls, the second on no position when
    ``first`` covers ``cover``: the number of output-layer calls per step is then the same on every rank (under
    FSDP each call is a collective; :meth:`~maskrl.sampling.sampler.Denoising.head_calls`).
    """
    if first is None:
        return head_at(adapter, parts, cover, p_len)
    first = first & cover
    ruled = head_at(adapter, parts, first, p_len)
    rest = cover & ~first
    fidx = cover.flatten().long().cumsum(0).view(cover.shape) - 1  # [n, L] row in the output
    out = ruled.new_empty((int(cover.sum()), ruled.shape[-1]))
    out[fidx[first]] = ruled
    out[fidx[rest]] = head_at(adapter, parts, rest, p_len)
    return out
