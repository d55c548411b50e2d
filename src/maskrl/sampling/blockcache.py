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
        against the cached columns left of ``w0``; with ``write`` their keys/values go into the cache."""
        cols = torch.arange(x.shape[1], device=x.device)
        wcols = w0[:, None] + torch.arange(width, device=x.device)  # [g, W]
        pos = self.pos_ids[rows]
        past = None
        key_mask, key_pos = a.gather(1, wcols), pos.gather(1, wcols)
        reach = int(w0.max())  # cached columns any row of the forward may attend
        if self.store is not None and reach > 0:
            every = rows.numel() == self.n_rows and bool((rows == torch.arange(self.n_rows, device=rows.device)).all())
            past = [(k[:, :, :reach], v[:, :, :reach]) if every else (k[rows, :, :reach], v[rows, :, :reach])
                    for k, v in self.store]  # all rows: a view, no copy
            key_mask = torch.cat([a[:, :reach] & (cols[None, :reach] < w0[:, None]), key_mask], 1)
            key_pos = torch.cat([pos[:, :reach], key_pos], 1)
        h, kv = self.adapter.decoder_forward(x.gather(1, wcols), key_mask, pos.gather(1, wcols), past=past,
                                             return_kv=write, key_positions=key_pos)
        if write:
            self._write(rows, wcols, kv)
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
