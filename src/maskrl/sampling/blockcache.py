"""The exact key/value cache of a block-diffusion model (``SamplerConfig.cache="block"``; SDAR's
``block_diffusion_generate``, JetAstra/SDAR ``generate.py``): attention is causal across blocks, so the
keys/values of a complete block never change, and a block's denoising steps need only the block itself
recomputed against them.

Per row (blocks counted from its first real token, :func:`~maskrl.models.adapter.block_index`; the
row's first decoding block holds the last ``P mod b`` prompt tokens, which stay fixed):

- its first step forwards columns ``[0, P + b)``: the complete prompt blocks (block-causal among
  themselves) and the first block, and writes their keys/values (a ``"prompt"`` refill);
- each later step of a block forwards the block's ``b`` columns against the cache, writing nothing;
- the first step of each later block forwards the previous block (now complete, no mask left) and this
  one, ``2b`` columns, and writes both (a ``"block"`` refill). SDAR runs that append as a forward of its
  own once the block is full; here it shares the next block's first step (the same keys/values: the
  previous block's queries see only their own and earlier blocks), so a row's blocks cost one forward
  per step and nothing more. Keys written for a block that still holds masks are overwritten by its
  refill before any later block reads them; a row that stops (``early_stop``) or ends never appends.

The store is preallocated per row batch (``[N, H, P + L + b, D]`` per layer, at the first refill) and never
copied whole: a window forward writes its keys/values into it in place and attends its filled prefix
(:meth:`BlockKVCache._attend`), the same keys in the same order as the cache with the window's appended, so
the outputs are those of that concatenation bit for bit (``tests/test_block_cache_inplace.py``).

Every step's logits are the no-cache forward's (:func:`~maskrl.sampling.cache.plan_forwards` with
``cache="none"``: a full block-causal forward) up to float rounding; ``tests/test_sampling_blocks.py``
checks the tokens are equal.
"""
from __future__ import annotations

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling.cache import Hidden, StepForwards
from maskrl.sampling.config import SamplerConfig


class BlockKVCache:
    """Runs a step's :class:`~maskrl.sampling.cache.StepForwards` (``cache="block"``) for one
    :func:`~maskrl.sampling.generate` call, holding per layer ``(keys, values)`` ``[N, H, P + L + b, D]``.

    Args:
        adapter: a block-diffusion model (``block_size`` set, 4-D attention; a shifted one -- Fast-dLLM v2 --
            has each plain step's window start one column left of the block, whose hidden state predicts
            the block's first position).
        config: the sampler settings (``block_length == adapter.block_size``).
        n_rows: N; p_len: prompt columns P.
        pos_ids: ``[N, P + L]`` long RoPE positions (0 at each row's first real token).
        offset: ``[N]`` long, each row's prompt tokens in its first decoding block (real prompt length mod b).
    """

    #: block positions a window forward does not compute (:func:`~maskrl.sampling.cache.plan_forwards`)
    lead = 0

    def __init__(self, adapter: ModelAdapter, config: SamplerConfig, n_rows: int, p_len: int,
                 pos_ids: torch.Tensor, offset: torch.Tensor) -> None:
        self.adapter, self.b, self.p_len, self.n_rows = adapter, config.block_length, p_len, n_rows
        right = pos_ids[:, -1:] + 1 + torch.arange(self.b, device=pos_ids.device)  # b columns past the end
        self.pos_ids = torch.cat([pos_ids, right], 1)  # [N, S + b]: the last block's window never leaves it
        self.offset = offset
        self.shift = 1 if adapter.shift else 0
        self.store: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def run(self, plan: StepForwards, rows: torch.Tensor, xr: torch.Tensor, ar: torch.Tensor,
            start: torch.Tensor) -> list[Hidden]:
        """The plan's window forwards for the step's ``rows [n]`` with pre-step tokens ``xr [n, S]``, key
        validity ``ar [n, S]`` and block starts ``start [n]`` (completion positions of the blocks' first
        masks: 0 for the first block)."""
        pad = torch.full((xr.shape[0], self.b), self.adapter.mask_id, dtype=xr.dtype, device=xr.device)
        x, a = torch.cat([xr, pad], 1), torch.cat([ar, torch.zeros_like(pad, dtype=torch.bool)], 1)
        first_col = self.p_len + start - torch.where(start == 0, self.offset[rows], 0)  # [n] the blocks' columns
        parts = []
        for f in plan.forwards:
            loc = f.rows
            if f.refill == "prompt":
                w0, width = torch.zeros_like(loc), self.p_len + self.b
            else:  # a shifted model's window also holds the column left of the block (it predicts the first)
                back = self.b if f.refill == "block" else self.shift
                w0, width = (first_col[loc] - back).clamp(min=0), self.b + back
            parts.append(Hidden(loc, self._window(rows[loc], x[loc], a[loc], w0, width, bool(f.refill)), w0))
        return parts

    def _window(self, rows: torch.Tensor, x: torch.Tensor, a: torch.Tensor, w0: torch.Tensor, width: int,
                write: bool) -> torch.Tensor:
        """Hidden states ``[g, width, d]`` of columns ``[w0, w0 + width)`` of ``rows [g]`` (batch indices)
        against the cached columns left of ``w0``; with ``write`` their keys/values go into the cache.

        The forward attends the first ``R = max(w0)`` cached columns (each row's columns from its own ``w0``
        on masked), then the window: it writes the window's keys/values in place at columns ``[R, R + W)``
        of the store and attends the store's first ``R + W`` columns (:meth:`_attend`), no copy of the cache
        when the rows are consecutive (all of them, say). Those columns hold no key a row reads later (:meth:`_attend`)."""
        wcols = w0[:, None] + torch.arange(width, device=x.device)  # [g, W]
        pos = self.pos_ids[rows]
        reach = int(w0.max())  # cached columns any row of the forward may attend
        if self.store is None or reach == 0:
            h, kv = self.adapter.decoder_forward(x.gather(1, wcols), a.gather(1, wcols), pos.gather(1, wcols),
                                                 return_kv=write, key_positions=pos.gather(1, wcols))
            if write:
                self._write(rows, wcols, kv)
            return h
        return self._attend(rows, x, a, pos, w0, wcols, reach, write)

    def _attend(self, rows: torch.Tensor, x: torch.Tensor, a: torch.Tensor, pos: torch.Tensor, w0: torch.Tensor,
                wcols: torch.Tensor, reach: int, write: bool) -> torch.Tensor:
        """:meth:`_window` against the cache: the keys attended are the store's columns ``[0, R + W)`` with
        the window's written over ``[R, R + W)`` (``R = reach``), the order the concatenated cache had.

        A row's columns from ``w0 + shift`` on (from ``w0`` in a refill) hold no key it reads before its next
        refill writes them, so the window may go there; a plain step of a shifted model whose ``w0 == R`` would
        overwrite its column ``w0`` (the previous block's last, read by the next refill): it is put back. A
        refill row with ``w0 < R`` gets its keys/values copied to ``[w0, w0 + W)`` afterwards. Rows that are
        not consecutive attend a copy of their caches (every written column copied back in a refill)."""
        g, width = wcols.shape
        cols = torch.arange(reach + width, device=x.device)
        at = (reach + torch.arange(width, device=x.device)).expand(g, -1)  # [g, W] the window's store columns
        r0 = int(rows[0])  # consecutive rows (all of them, say): a view of the store, else a copy of theirs
        view = bool((rows == r0 + torch.arange(rows.numel(), device=rows.device)).all())
        run = slice(r0, r0 + rows.numel()) if view else rows
        past = [(k[run, :, :reach + width], v[run, :, :reach + width]) for k, v in self.store]
        kept = [(k[:, :, reach:reach + self.shift].clone(), v[:, :, reach:reach + self.shift].clone())
                for k, v in past] if view and not write and self.shift else None
        key_mask = torch.cat([a[:, :reach] & (cols[None, :reach] < w0[:, None]), a.gather(1, wcols)], 1)
        key_pos = torch.cat([pos[:, :reach], pos.gather(1, wcols)], 1)
        h, _ = self.adapter.decoder_forward(x.gather(1, wcols), key_mask, pos.gather(1, wcols), past=past,
                                            write_at=at, key_positions=key_pos)
        if kept is not None:
            for (k, v), (k0, v0) in zip(past, kept):
                k[:, :, reach:reach + self.shift] = k0
                v[:, :, reach:reach + self.shift] = v0
        if write:
            moved = torch.ones(g, dtype=torch.bool, device=x.device) if not view else w0 != reach
            if bool(moved.any()):
                self._write(rows[moved], wcols[moved], [(k[moved, :, reach:].clone(), v[moved, :, reach:].clone())
                                                        for k, v in past])
        return h

    def _write(self, rows: torch.Tensor, wcols: torch.Tensor,
               kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if self.store is None:
            s = self.pos_ids.shape[1]
            self.store = [(k.new_zeros((self.n_rows, k.shape[1], s, k.shape[-1])),
                           v.new_zeros((self.n_rows, v.shape[1], s, v.shape[-1]))) for k, v in kv]
        r = rows[:, None]
        for (k_all, v_all), (k, v) in zip(self.store, kv):  # [N, S, H, D] views written at [g, W]
            k_all.transpose(1, 2)[r, wcols] = k.transpose(1, 2)
            v_all.transpose(1, 2)[r, wcols] = v.transpose(1, 2)
