"""The sampler's loop (docs/spec.md §1.2): :func:`generate` denoises a batch block by block, one step at a time,
as a sequence of named stages (what to forward, the forwards, the output layer, the commit rule, the
write-back, the observers' view, the block advance), with the rank lockstep around them.

Departures from the reference implementations, on purpose:

- the ``[M]`` token's own logit is excluded from candidates (it is never a valid output), and so are
  the ids without a tokenizer entry (the padded output rows of Qwen2-based models such as Dream);
- Gumbel noise (float64) is drawn only for the current block's positions that may be committed at
  the step (still masked; :meth:`Denoising.drawn`), so memory is at most ``N·b·V`` per step rather
  than ``N·L·V`` (Dream's rule draws what Dream's code draws instead, :mod:`maskrl.sampling.dream`);
- in threshold mode each row advances through its blocks independently, so a row's trajectory is the
  same whether it is decoded alone or in a batch; ``steps`` is ignored there (a block ends when it
  has no masks, at most ``block_length`` steps).
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling.blockcache import BlockKVCache
from maskrl.sampling.checks import check_call
from maskrl.sampling.cache import Hidden, KVCache, head_at, plan_forwards, split_head
from maskrl.sampling.commit import (block_candidates, candidate_logits, commit_scores, hold_stops, open_sub_block,
                                    propose, rank_positions, scatter_drawn, select_block, select_fixed,
                                    select_threshold)
from maskrl.sampling.config import SamplerConfig
from maskrl.sampling.dream import EXP_CHUNK, dream_commit_counts, dream_reveal_prob, dream_timesteps
from maskrl.sampling.dream_step import DreamLayout, dream_step, forced_candidates
from maskrl.sampling.edit import edit_block_done, select_edits
from maskrl.sampling.lockstep import IDLE, STOP, RankLockstep
from maskrl.sampling.view import StepObserver, StepRows, observer_view, requested_positions
from maskrl.types import Rollout


class Denoising:
    """The batch being denoised by one :func:`generate` call, and its per-position record.

    Attributes:
        x: ``[N, P + L]`` long, prompt then completion (``[M]`` where not yet committed).
        attn: ``[N, P + L]`` bool key validity; pos_ids: ``[N, P + L]`` RoPE positions (``None`` for
            2-D-attention models).
        commit_step: ``[N, L]`` long (-1 until committed); commit_prob: ``[N, L]`` float32.
        num_steps: ``[N]`` long steps each row took; block: ``[N]`` current block per row;
        block_step: ``[N]`` steps spent in it.
        offset: ``[N]`` long, prompt tokens in each row's first decoding block: its real prompt length
            mod b for a block-diffusion model (blocks counted from its first real token, so the first
            block is shared with the prompt's partial last block and the last one is cut at L), else 0.
        n_blocks: ``[N]`` long blocks each row decodes; stopped: ``[N]`` bool rows ended by ``early_stop``.
        draw_whole_block: class-level switch, False: candidates are drawn only where a step may commit
            one (:meth:`drawn`); True draws them at every position of the block, as the sampler did
            before (the baseline of ``benchmarks/speed/draw_speed.py``; the tests' check that no path
            reads a candidate it did not draw).
    """

    draw_whole_block = False

    def __init__(self, adapter: ModelAdapter, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 config: SamplerConfig) -> None:
        self.adapter, self.config = adapter, config
        device = self.device = adapter.device
        self.n_rows, self.p_len = prompt_ids.shape
        L, self.L, self.b = config.gen_length, config.gen_length, config.block_length
        self.x = torch.cat([prompt_ids.to(device), torch.full((self.n_rows, L), adapter.mask_id, dtype=torch.long,
                                                              device=device)], 1)
        self.attn = torch.cat([prompt_mask.to(device).bool(), torch.ones((self.n_rows, L), dtype=torch.bool,
                                                                         device=device)], 1)
        self.pos_ids = adapter.position_ids(self.attn) if adapter.supports_cache else None  # [N, S]
        self.commit_step = torch.full((self.n_rows, L), -1, dtype=torch.long, device=device)
        self.commit_prob = torch.zeros((self.n_rows, L), dtype=torch.float32, device=device)
        self.num_steps = torch.zeros(self.n_rows, dtype=torch.long, device=device)
        self.block = torch.zeros(self.n_rows, dtype=torch.long, device=device)
        self.block_step = torch.zeros(self.n_rows, dtype=torch.long, device=device)
        self.k_sched = torch.tensor(config.commits_per_step() if config.schedule == "fixed" else [0], device=device)
        if config.schedule == "dream":  # the block's step count; k comes from Dream's time grid
            spb = config.steps // config.num_blocks
            self.k_sched = torch.zeros(spb, dtype=torch.long, device=device)
            self.timesteps = dream_timesteps(spb, device=device)
        self.offsets = torch.arange(self.b, device=device)
        self.positions = torch.arange(L, device=device)
        self.offset = torch.zeros(self.n_rows, dtype=torch.long, device=device)
        if adapter.block_size is not None:
            self.offset = prompt_mask.to(device).long().sum(-1) % self.b
        self.n_blocks = torch.div(self.offset + L + self.b - 1, self.b, rounding_mode="floor")
        self.stopped = torch.zeros(self.n_rows, dtype=torch.bool, device=device)
        self.post_steps = torch.zeros(self.n_rows, dtype=torch.long, device=device)  # edit_threshold: edit-only steps

    def unfinished(self) -> torch.Tensor:
        """``[n]`` long rows with a block left."""
        return (self.block < self.n_blocks).nonzero().squeeze(-1)

    def block_span(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lo [n], hi [n])``: the completion positions ``[lo, hi)`` of the rows' current blocks."""
        first = self.block[rows] * self.b - self.offset[rows]
        return first.clamp(min=0), (first + self.b).clamp(max=self.L)

    def rows_at(self, step: int, rows: torch.Tensor, observers: Sequence[StepObserver]) -> StepRows:
        """The pre-step state of ``rows``, and what the observers ask for at this step."""
        xr, ar = self.x[rows], self.attn[rows]
        masked = xr[:, self.p_len:] == self.adapter.mask_id  # [n, L]
        start, end = self.block_span(rows)  # [n]
        pos = start.clamp(max=self.L - self.b)[:, None] + self.offsets  # [n, b] distinct, holding the block
        in_block = (self.positions[None, :] >= start[:, None]) & (self.positions[None, :] < end[:, None])
        requested, wants_exact = (requested_positions(observers, step, rows, masked, in_block, start) if observers
                                  else (None, None))
        return StepRows(step, rows, xr, ar, masked, start, end, pos, in_block, requested, wants_exact)

    def commits(self, st: StepRows, logits: torch.Tensor, cover: torch.Tensor,
                generator: torch.Generator | None, raw: torch.Tensor | None = None,
                parts: Sequence[Hidden] = ()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The commit rule (:mod:`maskrl.sampling.commit`, or :mod:`maskrl.sampling.dream` when
        ``config.dream_rule``) on the block's ``[n, b]`` positions, from the step's candidate logits
        ``[cover.sum(), V]`` (and, for Dream's rule, the raw output-layer logits ``raw`` of the same
        positions and the step's forwards ``parts``; for Fast-dLLM v2's, ``raw`` is ``[cover.sum()]``, the
        log-sum-exp of each position's raw logits, ``[M]`` kept): ``(take [n, b] bool, cand [n, b] long,
        prob [n, b])``."""
        config, n = self.config, st.rows.numel()
        fidx = cover.flatten().long().cumsum(0).view(n, self.L) - 1  # [n, L] row in logits
        if config.dream_rule:
            return self._dream_commits(st, logits, fidx, generator, raw, parts)
        eligible = st.masked.gather(1, st.pos) & st.in_block.gather(1, st.pos)  # [n, b]
        if config.sub_block_length is not None:
            eligible = eligible & open_sub_block(st.pos + self.offset[st.rows, None], eligible, self.b,
                                                 config.sub_block_length)
        at = fidx.gather(1, st.pos)  # [n, b] row of each block position in logits
        lone = first = None
        if config.block_first == "forced":  # Fast-dLLM v2: a block's first position alone, the argmax
            first = eligible & (st.pos == st.start[:, None]) & ((st.pos + self.offset[st.rows, None]) % self.b == 0)
            lone = (first.any(-1) & (self.block_step[st.rows] == 0))[:, None]  # [n, 1]
        editable = None
        if config.edit_threshold is not None:  # LLaDA2.1's T2T: committed tokens of the block may change
            editable = ~st.masked.gather(1, st.pos) & st.in_block.gather(1, st.pos)
        drawn = self.drawn(eligible, lone, editable)
        rows = at[drawn]  # [m] rows of logits, increasing: drawn lies within cover
        z = logits if rows.numel() == logits.shape[0] else logits[rows]  # [m, V]: no copy when every row is drawn
        if config.block_rule:
            cand, conf, prob, ent = (scatter_drawn(drawn, v, fill) for v, fill in zip(
                block_candidates(z, config.temperature, config.top_k, config.top_p, generator,
                                 config.remasking == "entropy_bounded"), (-1, 0.0, 0.0, 0.0)))
            k = self.k_sched[self.block_step[st.rows].clamp(max=len(self.k_sched) - 1)]  # [n]
            take = select_block(config.remasking, eligible, k, conf, ent, config.threshold, config.eb_threshold)
            if editable is not None:
                current = st.xr[:, self.p_len:].gather(1, st.pos)
                take = take | select_edits(cand, conf, current, editable, config.edit_threshold)
            return take, cand, prob
        cand, prob = propose(z, config.temperature, generator)  # [m]
        # Fast-dLLM v2 ranks by the candidate's probability under the softmax of every id ([M] kept):
        # exp(z[cand] - lse), ``raw`` holding each position's log-sum-exp; the recorded prob stays softmax(z)[cand]
        conf = (z.gather(-1, cand[:, None]).squeeze(-1).float() - raw[at[drawn]]).exp() if config.v2_rule else prob
        cand, prob, conf = (scatter_drawn(drawn, v, fill) for v, fill in zip((cand, prob, conf), (-1, 0.0, 0.0)))
        take = self._llada_commits(st, cand, conf, eligible, generator, strict=config.v2_rule)
        if lone is not None and lone.any():
            one = first & lone  # [n, b]
            zf = logits[at[one]]  # [f, V]
            top = zf.argmax(-1)
            cand[one], prob[one] = top, torch.softmax(zf.float(), -1).gather(-1, top[:, None]).squeeze(-1)
            take = torch.where(lone, first, take)
        return take, cand, prob

    def covers(self, st: StepRows, inside: torch.Tensor | None, observed: bool,
               computed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(cover, ruled)``, each ``[n, L]`` bool: the positions the step's output layer runs on, and those of
        them the commit rule reads (:meth:`ruled`, ``None``: all of ``cover``). With observers, ``cover`` is the
        block and their requests inside the window (:meth:`StepRows.cover`); without, the ruled positions
        alone. ``computed``: the positions the forwards computed (``None``: all; a window with a ``lead``)."""
        ruled = self.ruled(st)
        cover = st.cover(inside) if observed or ruled is None else ruled
        ruled = ruled if observed else None  # unobserved: cover is the ruled positions, one call
        if computed is not None:
            cover = cover & computed
            ruled = ruled & computed if ruled is not None else None
        return cover, ruled

    def head_calls(self, observed: bool) -> int:
        """Output-layer calls per decoding step outside the observers' extra forward: 2 where
        :meth:`covers` splits them (observers, a rule reading the masked positions only), else 1 -- the
        same on every rank, so the rank lockstep pads an idle rank's steps to it (:mod:`~maskrl.sampling.lockstep`)."""
        return 2 if observed and self.ruled_only() else 1

    def ruled_only(self) -> bool:
        """Whether the commit rule reads the block's still-masked positions only (:meth:`ruled`)."""
        config = self.config
        return not (config.dream_rule or config.edit_threshold is not None or self.draw_whole_block)

    def ruled(self, st: StepRows) -> torch.Tensor | None:
        """``[n, L]`` bool: the completion positions whose logits the commit rule reads at this step -- the
        block's still-masked ones (:meth:`drawn` never reaches beyond them) -- or ``None`` where it reads
        the whole block (Dream's rule, editing, :attr:`draw_whole_block`). The step's output layer runs on
        these in a call of their own (:func:`~maskrl.sampling.cache.split_head`): no logits of committed
        positions, and the same bits whether observers ask for more or not."""
        return st.masked & st.in_block if self.ruled_only() else None

    def drawn(self, eligible: torch.Tensor, lone: torch.Tensor | None,
              editable: torch.Tensor | None = None) -> torch.Tensor:
        """``[n, b]`` bool: the block positions a step draws a candidate for (Gumbel noise, confidence):
        the ``eligible`` ones, those of the rows whose step commits their block's first position alone
        (``lone [n, 1]``, Fast-dLLM v2) excepted, plus, under editing (``edit_threshold``), the
        ``editable [n, b]`` committed completion positions of the block, whose candidates T2T reads.
        Any other committed position's candidate is never read (every selection is ``& eligible``), so
        the noise over the rest of the block would be drawn for nothing (docs/sampler.md, "What is drawn
        where"). :attr:`draw_whole_block` draws every position instead, as the sampler did before: the
        baseline ``benchmarks/speed/draw_speed.py`` times."""
        if self.draw_whole_block:
            return torch.ones_like(eligible)
        out = eligible & ~lone if lone is not None else eligible
        return out | editable if editable is not None else out

    def _llada_commits(self, st: StepRows, cand: torch.Tensor, conf: torch.Tensor, eligible: torch.Tensor,
                       generator: torch.Generator | None, strict: bool = False) -> torch.Tensor:
        """LLaDA's rule (fixed or threshold schedule) on the block's candidates ``cand [n, b]`` and
        their confidences ``conf [n, b]`` (read where ``eligible`` only): ``take [n, b]`` bool. ``strict``:
        the threshold is passed only above it (Fast-dLLM v2's code; :attr:`SamplerConfig.v2_rule`)."""
        config = self.config
        stop = self.adapter.is_stop(cand) if config.suppress_eos else None
        rank = rank_positions(commit_scores(conf, eligible, config.remasking, generator, stop))
        if config.schedule == "fixed":
            k = self.k_sched[self.block_step[st.rows].clamp(max=len(self.k_sched) - 1)]  # [n]
            take = select_fixed(rank, k, eligible)
        else:
            take = select_threshold(rank, conf, config.threshold, eligible, strict=strict)
        return hold_stops(take, stop, eligible) if stop is not None else take

    def _dream_commits(self, st: StepRows, logits: torch.Tensor, fidx: torch.Tensor, generator: torch.Generator | None,
                       raw: torch.Tensor, parts: Sequence[Hidden]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Dream's rule on the block's positions: under ``block_first="forced"`` the rows at their
        block's first step commit its first position (:func:`~maskrl.sampling.dream_step.forced_candidates`,
        drawn first), the others a ranked step (:func:`~maskrl.sampling.dream_step.dream_step`)."""
        config = self.config
        at = fidx.gather(1, st.pos)  # [n, b]
        eligible = st.masked.gather(1, st.pos)  # [n, b]
        j = self.block_step[st.rows]
        never = torch.zeros(raw.shape[-1], dtype=torch.bool, device=raw.device)
        never[self.adapter.mask_id] = True
        count = self.adapter.token_count
        if count is not None and count < raw.shape[-1]:
            never[count:] = True
        take = torch.zeros_like(eligible)
        cand = torch.zeros(eligible.shape, dtype=torch.long, device=eligible.device)
        forced = (j == 0) & (config.block_first == "forced")
        f = forced.nonzero().squeeze(-1)
        if f.numel():  # Fast-dLLM's Dream variant: the block's first position, unranked
            take[f, 0] = True
            cand[f, 0] = forced_candidates(config, raw[at[f, 0]], never, st.xr.shape[1], self.p_len + st.start[f],
                                           partial(_sequence_logits, self.adapter, parts, f,
                                                   max(1, EXP_CHUNK // raw.shape[-1])), generator)
        rest = (~forced).nonzero().squeeze(-1)
        if rest.numel():
            jr, er = j[rest], eligible[rest]
            k = p_reveal = None
            if config.schedule == "dream":
                k, p_reveal = dream_commit_counts(er.sum(-1), self.timesteps, jr), dream_reveal_prob(self.timesteps, jr)
            elif config.schedule == "fixed":
                k = self.k_sched[jr.clamp(max=len(self.k_sched) - 1)]
            take[rest], cand[rest] = dream_step(
                config, logits, raw, at[rest], er, never, k=k, p_reveal=p_reveal,
                layout=DreamLayout.of(config, self.p_len, st.start[rest]),
                stop_fn=self.adapter.is_stop if config.suppress_eos else None, generator=generator,
                tail=self._threshold_tail(st, rest, raw, at[rest], er, parts))
        prob = torch.softmax(logits[at].float(), dim=-1).gather(-1, cand[..., None]).squeeze(-1)
        return take, cand, prob

    def _threshold_tail(self, st: StepRows, rest: torch.Tensor, raw: torch.Tensor, at: torch.Tensor,
                        eligible: torch.Tensor, parts: Sequence[Hidden]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Fast-dLLM's Dream threshold without the dual cache draws the candidates of every masked
        position from the block start to the end, not only the block's (its ``mask_index`` is not cut
        to the block there): the rows of that draw in Dream's row-major order, and which of them are
        the block's ``eligible [n', b]`` ones (rows ``at [n', b]`` of ``raw``;
        :func:`~maskrl.sampling.dream_step.dream_step`'s ``tail``). ``None`` when the draw is the
        block's: other settings, or greedy (nothing drawn)."""
        config = self.config
        if not (config.schedule == "threshold" and config.block_first == "forced" and config.cache != "dual"
                and config.temperature > 0):
            return None
        block_raw = raw[at[eligible]]
        after = torch.zeros_like(st.masked)
        after[rest] = st.masked[rest] & (self.positions[None, :] >= st.start[rest, None] + self.b)
        tail_raw = head_at(self.adapter, parts, after, self.p_len) if after.any() else block_raw[:0]
        r_b, q_b = eligible.nonzero(as_tuple=True)
        r_t, p_t = after[rest].nonzero(as_tuple=True)
        keys = torch.cat([r_b * self.L + st.pos[rest][r_b, q_b], r_t * self.L + p_t])
        order = keys.argsort()
        return torch.cat([block_raw, tail_raw])[order], order < r_b.numel()

    def write(self, st: StepRows, take: torch.Tensor, cand: torch.Tensor,
              prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the commits into the batch: ``(committed [n, L] bool, completion after the step [n, L])``."""
        rows, pos, p_len = st.rows, st.pos, self.p_len
        comp = st.xr[:, p_len:]
        committed = torch.zeros_like(st.masked).scatter_(1, pos, take)  # [n, L]
        tokens = comp.scatter(1, pos, torch.where(take, cand, comp.gather(1, pos)))
        self.x[rows, p_len:] = tokens
        self.commit_step[rows] = torch.where(committed, st.index, self.commit_step[rows])
        self.commit_prob[rows] = self.commit_prob[rows].scatter(
            1, pos, torch.where(take, prob, self.commit_prob[rows].gather(1, pos)))
        return committed, tokens

    def advance(self, st: StepRows, tokens: torch.Tensor) -> None:
        """Count the step, and move each row whose block is done (no mask left, or the fixed schedule's
        steps spent; Dream's schedule: its steps spent) to its next block."""
        rows = st.rows
        self.block_step[rows] += 1
        block_done = ~((tokens == self.adapter.mask_id) & st.in_block).any(-1)
        if self.config.schedule == "fixed" and not self.config.block_rule:  # SDAR's counts always empty the block
            block_done = block_done | (self.block_step[rows] >= len(self.k_sched))
        elif self.config.schedule == "dream":  # Dream runs every step of its grid, even one left with no mask
            block_done = self.block_step[rows] >= len(self.k_sched)
        if self.config.edit_threshold is not None:
            block_done = self._edit_done(st, tokens, block_done)
        finished_rows = rows[block_done]
        self.block[finished_rows] += 1
        self.block_step[finished_rows] = 0
        self.post_steps[finished_rows] = 0
        self.num_steps[rows] = st.index + 1
        if self.config.early_stop:
            done = block_done & self.adapter.is_stop(tokens).any(-1)  # later blocks still hold [M] only
            stop_rows = rows[done]
            self.stopped[stop_rows] = True
            self.block[stop_rows] = self.n_blocks[stop_rows]

    def _edit_done(self, st: StepRows, tokens: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
        """``edit_threshold``: ``[n]`` bool rows whose block ends after this step (:func:`edit_block_done`), from
        ``filled [n]`` (no mask left in the block) and the step's edits (committed tokens of the block changed)."""
        had_masks = (st.masked & st.in_block).any(-1)
        edited = ((tokens != st.xr[:, self.p_len:]) & ~st.masked & st.in_block).any(-1)
        self.post_steps[st.rows] += (~had_masks).long()
        return edit_block_done(had_masks, filled, edited, self.post_steps[st.rows], self.config.max_post_steps)

    def rollout(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_ids: torch.Tensor | None,
                observers: Sequence[StepObserver]) -> Rollout:
        """The :class:`~maskrl.types.Rollout` of the finished batch, with the observers' statistics."""
        self._pad_stopped()
        completion = self.x[:, self.p_len:]
        if (self.commit_step < 0).any():  # pragma: no cover - guarded by the schedule arithmetic
            raise RuntimeError("sampler finished with uncommitted positions")
        completion_mask = self.adapter.completion_mask(completion)  # up to and including the first stop token
        stats: dict[str, torch.Tensor] = {}
        for obs in observers:
            stats.update(obs.result())
        device = self.device
        return Rollout(
            prompt_ids=prompt_ids.to(device), prompt_mask=prompt_mask.to(device).bool(), completion_ids=completion,
            completion_mask=completion_mask, commit_step=self.commit_step, commit_prob=self.commit_prob,
            num_steps=self.num_steps, group_ids=(group_ids if group_ids is not None else torch.arange(self.n_rows)).to(device),
            sampler=self.config, step_stats=stats,
        )


    def _pad_stopped(self) -> None:
        """``early_stop``: the positions a stopped row never decoded become ``pad_id``, committed at its
        last step with probability 1 (they lie after its first stop id: outside ``completion_mask``)."""
        if not self.stopped.any():
            return
        left = (self.commit_step < 0) & self.stopped[:, None]  # [N, L]
        comp = self.x[:, self.p_len:]
        comp[left] = self.adapter.pad_id
        self.commit_step[left] = (self.num_steps[:, None] - 1).expand_as(left)[left]
        self.commit_prob[left] = 1.0


def _sequence_logits(adapter: ModelAdapter, parts: Sequence[Hidden], rows: torch.Tensor, chunk: int):
    """Yield the raw output-layer logits of every column of the step's ``rows [f]`` (position-aligned:
    a shifted model's column ``c`` from the hidden state at ``c - 1``, column 0 from its own), in
    chunks of ``[<= chunk, V]``, from the step's full forwards (those rows are at their block's full
    first step). Parts that hold completion logits only (no decoder forward) give those."""
    for part in parts:
        hit = (part.rows[:, None] == rows[None, :]).any(-1)
        if not hit.any():
            continue
        if part.hidden is None:
            yield from part.logits[hit].flatten(0, 1).split(chunk)
            continue
        h = part.hidden[hit]  # [g, S, d], w0 = 0: a full forward
        if adapter.shift:
            h = torch.cat([h[:, :1], h[:, :-1]], dim=1)
        for piece in h.flatten(0, 1).split(chunk):
            yield adapter.head(piece)


def _notify(observers, adapter, st, plan, logits, cover, committed, tokens, dec, to_candidates) -> None:
    """Hand every observer this step's :class:`~maskrl.sampling.StepView` (built once, only when one watches)."""
    if observers:
        view = observer_view(adapter, st, plan, logits, cover, committed, tokens, dec.p_len, dec.pos_ids,
                             dec.b, to_candidates)
        for obs in observers:
            obs.on_step(view)


def _cache_for(adapter: ModelAdapter, config: SamplerConfig, dec: "Denoising") -> BlockKVCache | KVCache:
    """The step forwards' cache: the exact block cache (``cache: block``), else :class:`KVCache` (none,
    prefix or dual; :mod:`maskrl.sampling.cache`)."""
    if config.cache == "block":
        return BlockKVCache(adapter, config, dec.n_rows, dec.p_len, dec.pos_ids, dec.offset)
    return KVCache(adapter, config, dec.n_rows, dec.p_len, dec.pos_ids)


@torch.no_grad()
def generate(adapter: ModelAdapter, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, config: SamplerConfig,
             generator: torch.Generator | None = None, observers: Sequence[StepObserver] = (),
             group_ids: torch.Tensor | None = None, all_done: Callable[[bool], bool] | None = None,
             ranks_max: Callable[[list[int]], list[int]] | None = None) -> Rollout:
    """Denoise ``[prompt ; [M]×L]`` into completions (docs/spec.md §1.2; the package docstring says what is
    recorded, :mod:`maskrl.sampling.cache` which positions each step forwards). Runs under ``torch.no_grad``
    whatever the caller's mode: sampling is never differentiated, and a graph through every forward would
    cost time and keep memory alive through the cache and the Rollout.

    Args:
        adapter: the model.
        prompt_ids: ``[N, P]`` long, left-padded.
        prompt_mask: ``[N, P]`` bool, True on real prompt tokens.
        config: sampler settings.
        generator: ``torch.Generator`` on the model's device for the Gumbel draws and random
            remasking; required when ``temperature > 0``, ``alg_temp > 0`` or ``remasking`` is
            ``"random"`` or ``"origin"``.
        observers: per-step statistic collectors (DPS's log-prob sums, DiSPO's branch fillings),
            called once per step with a :class:`~maskrl.sampling.StepView` of what the sampler
            computed anyway; their ``result()`` fills ``Rollout.step_stats``. Each may declare the
            logits it needs (:class:`~maskrl.sampling.StepObserver`); the output layer runs only on the
            current block plus those positions, and nothing extra is computed when none asks.
        group_ids: ``[N]`` long; defaults to ``arange(N)``.
        all_done: rank synchronisation for sharded models (FSDP / ZeRO-3, where every forward is a
            collective): called once per loop iteration with "this rank has no row left", it must
            return True only when that holds on every rank (an all-reduce); a finished rank runs
            dummy forwards on its last state until then. ``None`` (default): stop when this rank's
            rows finish.
        ranks_max: the same for the cached sampler (``cache != "none"``; ``all_done`` is then not
            called), whose forwards per step vary with the rows' block starts: ``ranks_max(values)``
            returns the element-wise maximum of a list of ints over ranks (one collective per loop
            iteration, before any forward), and every rank pads to the maxima with dummy forwards
            of one row (:class:`~maskrl.sampling.lockstep.RankLockstep`). Either hook leaves the
            Rollout unchanged.

    Returns:
        A :class:`Rollout` (``commit_step``/``commit_prob`` ``[N, L]``, ``num_steps`` ``[N]``).

    Raises:
        ValueError: on mismatched shapes or a missing generator; with ``config.cache != "none"``: a
            model without a decoder forward (``attention="2d"``), ``all_done`` given without
            ``ranks_max``, a shifted model with no prompt column, or (``observer_logits="refuse"``)
            observers that need exact logits.
    """
    check_call(adapter, prompt_ids, prompt_mask, config, generator, observers, all_done, ranks_max)
    dec = Denoising(adapter, prompt_ids, prompt_mask, config)
    cache = _cache_for(adapter, config, dec)
    lock = RankLockstep(adapter, config.cache != "none", config.cfg_scale, all_done, ranks_max, dec.head_calls(bool(observers)))
    to_candidates = partial(candidate_logits, mask_id=adapter.mask_id, token_count=adapter.token_count)
    step = 0
    while True:
        rows = dec.unfinished()  # [n]
        action = lock.wait(rows.numel() == 0, dec.x, dec.attn)
        if action == STOP:
            break
        if action == IDLE:
            continue
        st = dec.rows_at(step, rows, observers)
        plan = plan_forwards(config.cache, dec.b, dec.block_step[rows] == 0, st.start, dec.L, st.requested,
                             st.wants_exact, cache.lead, block_end=st.end)
        lock.share(plan)
        parts = cache.run(plan, rows, st.xr, st.ar, st.start)  # the decoder forwards
        lock.pad_decoders(st.xr, st.ar)
        cover, ruled = dec.covers(st, plan.inside, bool(observers), plan.computed(dec.L) if cache.lead else None)
        head = split_head(adapter, parts, cover, ruled, dec.p_len)  # [cover.sum(), V]: the output layer
        raw = head.clone() if config.dream_rule else None  # Dream's softmax keeps every id ([M] too)
        raw = head.float().logsumexp(-1) if config.v2_rule else raw  # Fast-dLLM v2's too: its normaliser
        logits = to_candidates(head)
        take, cand, prob = dec.commits(st, logits, cover, generator, raw, parts)
        committed, tokens = dec.write(st, take, cand, prob)
        _notify(observers, adapter, st, plan, logits, cover, committed, tokens, dec, to_candidates)
        lock.pad_extra(st.xr, st.ar)
        dec.advance(st, tokens)
        step += 1
    return dec.rollout(prompt_ids, prompt_mask, group_ids, observers)
