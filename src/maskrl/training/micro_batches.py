"""The micro-batch plan of one RL step's loss terms (:meth:`maskrl.trainer.RLTrainer.optimize`).

Each loss term is cut into micro-batches under a sequence and a forward-row budget
(:func:`split_rows`), numbered globally over the processes (the likelihood mask seed of a micro-batch
is its global index, so a 2-process run draws the masks of the 1-process run); a term's normaliser is
its token (or sequence) count over the global batch. On several processes each term also gets the
dummy forwards that bring this process to the largest micro-batch count of any (:func:`plan_padding`).
The θ pass then runs :func:`theta_forwards` in order; its last entry carries the DDP gradient sync.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
from accelerate import Accelerator

from maskrl.training.lockstep import gather_work, global_offset, padding_row
from maskrl.types import LossTerm, Rollout


def split_rows(rows: torch.Tensor, max_sequences: int = 0, max_rows: int = 0) -> list[slice]:
    """Consecutive micro-batches of sequences under a sequence and a forward-row budget.

    Args:
        rows: ``[M]`` long, forward rows each sequence costs (a likelihood's ``rows()``).
        max_sequences: at most this many sequences per micro-batch (0 = no limit).
        max_rows: at most this many rows per micro-batch (0 = no limit); a sequence's rows are never
            split, so a sequence over the budget forms a micro-batch of its own.

    Returns:
        Slices covering ``0..M-1`` in order (empty list for ``M = 0``).
    """
    out, start, used = [], 0, 0
    for i, r in enumerate(rows.tolist()):
        n = i - start
        if n and ((max_sequences and n >= max_sequences) or (max_rows and used + r > max_rows)):
            out.append(slice(start, i))
            start, used = i, 0
        used += r
    if rows.numel():
        out.append(slice(start, rows.numel()))
    return out


class MicroBatch(NamedTuple):
    """One real forward of a loss term.

    Attributes:
        index: global micro-batch index (over all processes; the likelihood mask seed's slot).
        rows: the term's sequences it scores (a slice of the term's ``M`` rows).
        forward_rows: forward rows it costs (the likelihood's ``rows()`` summed; > 0).
    """

    index: int
    rows: slice
    forward_rows: int


class Padding(NamedTuple):
    """The dummy forwards of a loss term on this process (several processes only).

    Attributes:
        count: dummy forwards to add after the term's real micro-batches (> 0).
        rollout: the 1-row input of each (:func:`~maskrl.training.lockstep.padding_row`).
        need: ``[1, L]`` bool, the positions each asks for.
    """

    count: int
    rollout: Rollout
    need: torch.Tensor


@dataclass(frozen=True)
class TermPlan:
    """How one loss term is scored this step.

    Attributes:
        index: the term's position in the step's loss terms (0 = the base objective; a mask-seed slot).
        term: the loss term.
        normalizer: its token (``token_mean``) or sequence count over the global batch, divided by the
            process count (each process's gradient is averaged by DDP).
        micro_batches: its real forwards, in order (micro-batches with nothing to score dropped).
        padding: its dummy forwards on this process; ``None``: none.
    """

    index: int
    term: LossTerm
    normalizer: float
    micro_batches: tuple[MicroBatch, ...]
    padding: Padding | None = None


class Forward(NamedTuple):
    """One forward of the θ pass.

    Attributes:
        plan: the term's plan.
        index: the global micro-batch index; for a dummy forward its number ``j`` (0-based).
        rows: the term's rows scored; ``None`` for a dummy forward.
    """

    plan: TermPlan
    index: int
    rows: slice | None


def plan_terms(acc: Accelerator, terms: Sequence[LossTerm], max_sequences: int, max_rows: int) -> list[TermPlan]:
    """Every loss term's normaliser and micro-batches (``train.micro_batch_size``,
    ``train.max_forward_rows``). Collectives: one all-reduce of every term's token and sequence
    counts, then one all-gather per term (its micro-batch count, for the global numbering)."""
    counts = []
    for t in terms:
        counts += [t.mask.sum().float(), torch.tensor(float(t.rollout.batch_size), device=acc.device)]
    totals = acc.reduce(torch.stack(counts), reduction="sum").tolist()
    world = acc.num_processes
    plans = []
    for ti, t in enumerate(terms):
        agg = getattr(t.objective, "aggregation", "token_mean")
        normalizer = (totals[2 * ti] if agg == "token_mean" else totals[2 * ti + 1]) / world
        rows = t.likelihood.rows(t.rollout, t.mask)  # [M]
        splits = split_rows(rows, max_sequences, max_rows)
        first = global_offset(acc, len(splits))
        work = [MicroBatch(first + j, sl, int(rows[sl].sum())) for j, sl in enumerate(splits)]
        plans.append(TermPlan(ti, t, normalizer, tuple(w for w in work if w.forward_rows > 0)))  # nothing to score: no forward
    return plans


def plan_padding(acc: Accelerator, plans: list[TermPlan], base: Rollout,
                 pad_counts: Callable[[torch.Tensor], torch.Tensor]) -> list[TermPlan]:
    """``plans`` with this process's dummy forwards (see :meth:`maskrl.trainer.RLTrainer.optimize`);
    unchanged on one process. One all-gather of each process's micro-batch count and largest
    micro-batch (forward rows) per term; a dummy's row budget is the term's largest real micro-batch
    on any process.

    Args:
        acc: the accelerator.
        plans: the terms' plans (:func:`plan_terms`).
        base: the batch's rollout (``N >= 1`` rows), the dummy row of a term with none here.
        pad_counts: ``[P, K] -> [P, K]`` dummy forwards per process and term
            (:func:`~maskrl.training.lockstep.pad_counts`; passed in so that the trainer's module
            attribute of that name is the one used).
    """
    if acc.num_processes == 1:
        return plans
    local = torch.tensor([[len(p.micro_batches), max((m.forward_rows for m in p.micro_batches), default=0)]
                          for p in plans], dtype=torch.long, device=acc.device)  # [K, 2]
    every = gather_work(acc, local)  # [P, K, 2]
    counts = pad_counts(every[..., 0])[acc.process_index].tolist()  # [K]
    budget = every[..., 1].max(0).values.tolist()  # [K] largest real micro-batch of the term, any process
    return [dataclasses.replace(p, padding=Padding(n, *padding_row(p.term, base, b))) if n > 0 else p
            for p, n, b in zip(plans, counts, budget)]


def theta_forwards(plans: Sequence[TermPlan]) -> list[Forward]:
    """The θ pass in order: each term's real micro-batches, then its dummy forwards."""
    out = []
    for p in plans:
        out += [Forward(p, m.index, m.rows) for m in p.micro_batches]
        out += [Forward(p, j, None) for j in range(p.padding.count if p.padding else 0)]
    return out
