"""Several processes in step: the collectives that keep every rank's forwards and decisions equal.

Under FSDP / ZeRO-3 every forward is a collective, so every process must run as many sampler
forwards (:func:`all_ranks_done`, :func:`ranks_max`) and likelihood forwards per loss term
(:func:`pad_counts`, :func:`padding_row`, see :meth:`maskrl.trainer.RLTrainer.optimize`) as every
other, and every decision that skips work (a signal, a non-finite value) must be the same on every
rank (:func:`any_process`). Each hook is ``None`` / the identity on a single process, where nothing
changes. Every function here that takes an ``Accelerator`` and runs on several processes is a
collective: every rank must call it, in the same order.
"""
from __future__ import annotations

from typing import Callable

import torch
from accelerate import Accelerator

from maskrl.types import LossTerm, Rollout


def all_ranks_done(acc: Accelerator) -> Callable[[bool], bool] | None:
    """The sampler's ``all_done`` hook over ``acc``'s processes; ``None`` on a single process.

    ``all_done(finished)`` all-reduces this rank's "no row left" flag (one scalar, on ``acc.device``)
    and returns True when every rank has finished (see :func:`maskrl.sampling.generate`). Every rank
    must call it the same number of times (it is a collective).
    """
    if acc.num_processes == 1:
        return None

    def all_done(finished: bool) -> bool:
        busy = torch.tensor([0.0 if finished else 1.0], device=acc.device)
        return acc.reduce(busy, reduction="sum").item() == 0.0

    return all_done


def ranks_max(acc: Accelerator) -> Callable[[list[int]], list[int]] | None:
    """The cached sampler's ``ranks_max`` hook over ``acc``'s processes; ``None`` on a single process.

    ``ranks_max(values)`` gathers every rank's list of ints (one all-gather, on ``acc.device``) and
    returns their element-wise maximum (see :func:`maskrl.sampling.generate`). Every rank must call it
    the same number of times (it is a collective).
    """
    if acc.num_processes == 1:
        return None

    def fn(values: list[int]) -> list[int]:
        t = torch.tensor([values], dtype=torch.long, device=acc.device)  # [1, k]
        return acc.gather(t).view(acc.num_processes, -1).max(0).values.tolist()

    return fn


def pad_counts(work: torch.Tensor) -> torch.Tensor:
    """Dummy forwards each process adds so that all run as many forwards per loss term.

    Args:
        work: ``[P, K]`` integer, forward micro-batches of term k on process p (after dropping those
            with nothing to score).

    Returns:
        ``[P, K]`` long, ``max_p work[p, k] - work[p, k]``: every process then runs
        ``max_p work[p, k]`` forwards for term k (in each of the θ_old, reference and θ passes).

    Raises:
        ValueError: ``work`` is not a 2-D integer tensor.
    """
    if work.dim() != 2 or work.is_floating_point() or work.dtype == torch.bool:
        raise ValueError(f"work must be a [P, K] integer tensor, got shape {tuple(work.shape)} and dtype {work.dtype}")
    work = work.long()
    return work.max(0, keepdim=True).values - work


def padding_row(term: LossTerm, base: Rollout, max_rows: int) -> tuple[Rollout, torch.Tensor]:
    """The input of a dummy forward of ``term`` (see :meth:`maskrl.trainer.RLTrainer.optimize`).

    The row is the term's first row, or ``base``'s first row when the term has none on this process
    (a credit term that kept nothing here). Every completion position is asked for (``need`` all
    True; every built-in estimator runs its forward whatever its masks draw), unless that costs more
    than ``max_rows`` forward rows (the term's likelihood's ``rows()``; e.g. ``state`` at T commit
    steps); then only position 0 is, the cheapest call the likelihood has.

    Args:
        term: the loss term (its ``rollout`` has ``M >= 0`` rows; its ``likelihood`` is asked for
            ``rows()``).
        base: a rollout with at least one row (the batch's, ``N`` rows), same completion length L.
        max_rows: the forward-row budget of the dummy (the largest real micro-batch of the term).

    Returns:
        ``(rollout, need)``: a 1-row :class:`Rollout` and ``[1, L]`` bool.

    Raises:
        ValueError: ``term`` and ``base`` both have no row.
    """
    src = term.rollout if term.rollout.batch_size else base
    if not src.batch_size:
        raise ValueError(f"loss term {term.name!r}: no row for a padding forward (the term and the batch are empty)")
    ro = src.select(slice(0, 1))
    need = torch.ones_like(ro.completion_mask, dtype=torch.bool)  # [1, L]
    if int(term.likelihood.rows(ro, need).sum()) > max_rows:
        need = torch.zeros_like(need)
        need[0, 0] = True
    return ro, need


def global_offset(acc: Accelerator, count: int) -> int:
    """Sum of ``count`` over the processes before this one (global micro-batch numbering); one
    all-gather on several processes, 0 on one."""
    if acc.num_processes == 1:
        return 0
    counts = acc.gather(torch.tensor([count], device=acc.device)).tolist()
    return int(sum(counts[: acc.process_index]))


def gather_work(acc: Accelerator, local: torch.Tensor) -> torch.Tensor:
    """Every process's ``[K, 2]`` long table (per loss term: real micro-batches, largest micro-batch in
    forward rows) as ``[P, K, 2]`` on the CPU; one all-gather."""
    k = local.shape[0]
    return acc.gather(local[None]).view(acc.num_processes, k, 2).cpu()


def any_process(acc: Accelerator, flag: bool) -> bool:
    """``flag`` or-ed over the processes (one all-reduce on several processes; ``flag`` on one)."""
    if acc.num_processes == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=acc.device)
    return acc.reduce(t, reduction="sum").item() > 0


def mean_over_processes(acc: Accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """Each metric averaged over the processes (a key missing on a process counts as 0 there; keys
    then in sorted order); ``metrics`` itself on one process. One object all-gather and one all-reduce."""
    if acc.num_processes == 1:
        return metrics
    from accelerate.utils import gather_object

    keys = sorted(set(k for ks in gather_object([sorted(metrics)]) for k in ks))
    vals = torch.tensor([metrics.get(k, 0.0) for k in keys], dtype=torch.float64, device=acc.device)
    return dict(zip(keys, acc.reduce(vals, reduction="mean").tolist()))
