"""The sampler's rank lockstep: every rank runs the same forwards in the same order (FSDP / ZeRO-3,
where every forward is a collective), whatever its own rows need.

Two hooks (:func:`~maskrl.sampling.generate`): ``all_done`` for the uncached sampler (one forward of
the same shape per step: a finished rank keeps running one until every rank has finished) and
``ranks_max`` for the cached one, whose forwards per step vary with the rows' block starts
(:mod:`maskrl.sampling.cache`): each rank sends (has rows, decoder forwards, observers' extra
forward) once per step, before any forward, and pads with dummy forwards of one row to the maxima.

A credit module that runs extra forwards at steps it chooses (DTCA / DiSPO-style) must broadcast
those choices from rank 0 under FSDP / ZeRO-3, or the collectives diverge.
"""
from __future__ import annotations

from typing import Callable

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling.cache import StepForwards

STOP, IDLE, DECODE = "stop", "idle", "decode"


def dummy_forwards(adapter: ModelAdapter, x: torch.Tensor, attn: torch.Tensor, decoder: int, heads: int,
                   first_heads: int = 1) -> None:
    """``decoder`` decoder forwards of one row ``x [1, S]``, then ``heads`` × (decoder forward + output
    layer on one position), the first of them with ``first_heads`` output-layer calls (a step's split
    output layer); results discarded (multi-rank padding of the cached sampler)."""
    pos = adapter.position_ids(attn)
    for _ in range(decoder):
        adapter.decoder_forward(x, attn, pos)
    for i in range(heads):
        h, _ = adapter.decoder_forward(x, attn, pos)
        for _ in range(first_heads if i == 0 else 1):
            adapter.head(h[:, :1])


class RankLockstep:
    """Keeps one :func:`~maskrl.sampling.generate` call's forwards in step with the other ranks'.

    Args:
        adapter: the model.
        cached: ``config.cache != "none"`` (then ``ranks_max`` is used and ``all_done`` is not called).
        cfg_scale: classifier-free guidance scale (a guided step runs two forwards).
        all_done: ``all_done(finished) -> bool``, True when every rank has finished (an all-reduce);
            ``None``: this rank stops as soon as its rows finish.
        ranks_max: ``ranks_max(values) -> values``, the element-wise maximum of a list of ints over
            ranks (one collective); ``None``: single process.
        step_heads: output-layer calls of a decoding step after its decoder forwards (1, or 2 where the
            sampler splits them: :meth:`~maskrl.sampling.sampler.Denoising.head_calls`), the same on every rank.

    Per loop iteration the sampler calls :meth:`wait` (``"stop"``, ``"idle"``: this rank has no
    row and ran the others' forwards, or ``"decode"``), then on a decoding step :meth:`share` before
    any forward, :meth:`pad_decoders` before the output layer and :meth:`pad_extra` after the
    observers.
    """

    def __init__(self, adapter: ModelAdapter, cached: bool, cfg_scale: float,
                 all_done: Callable[[bool], bool] | None, ranks_max: Callable[[list[int]], list[int]] | None,
                 step_heads: int = 1) -> None:
        self.adapter, self.cfg_scale, self.step_heads = adapter, cfg_scale, step_heads
        self.sync = ranks_max if cached else None
        self.all_done = all_done if self.sync is None else None
        self.d_loc = self.e_loc = self.d_max = self.e_max = 0

    def wait(self, finished: bool, x: torch.Tensor, attn: torch.Tensor) -> str:
        """``STOP``, ``IDLE`` (after this rank's share of the others' forwards, on ``x[:1]``) or
        ``DECODE``; ``finished``: this rank has no row left."""
        if self.sync is not None:
            if not finished:
                return DECODE
            busy, d_max, e_max = self.sync([0, 0, 0])
            if not busy:
                return STOP
            dummy_forwards(self.adapter, x[:1], attn[:1], max(d_max - 1, 0), 1 + e_max, self.step_heads)  # the others', in order
            return IDLE
        if self.all_done is not None:
            # Threshold rows finish at different steps, so ranks would leave the loop at different
            # times and the per-forward collectives of FSDP / ZeRO-3 would go out of step.
            if self.all_done(finished):
                return STOP
            if finished:  # others still decode: keep their collectives company, change nothing
                for _ in range(2 if self.cfg_scale > 0 else 1):
                    self.adapter.logits(x[:1], attn[:1])
                return IDLE
            return DECODE
        return STOP if finished else DECODE

    def share(self, plan: StepForwards) -> None:
        """Send this step's forward counts (``ranks_max``) and keep the ranks' maxima."""
        if self.sync is not None:
            self.d_loc, self.e_loc = plan.decoder_forwards, plan.extra_forward
            _, self.d_max, self.e_max = self.sync([1, self.d_loc, self.e_loc])

    def pad_decoders(self, x: torch.Tensor, attn: torch.Tensor) -> None:
        """Pad this rank's decoder forwards to the ranks' maximum, before the output layer."""
        if self.sync is not None:
            dummy_forwards(self.adapter, x[:1], attn[:1], self.d_max - self.d_loc, 0)

    def pad_extra(self, x: torch.Tensor, attn: torch.Tensor) -> None:
        """Run the observers' extra full forward when another rank ran it and this one did not."""
        if self.sync is not None and self.e_max > self.e_loc:
            dummy_forwards(self.adapter, x[:1], attn[:1], 0, 1)
