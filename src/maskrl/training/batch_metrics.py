"""The logged numbers that describe a step's batch, for the whole global batch on any number of processes.

Each process holds its share of the batch (``train.prompts_per_step`` prompts × ``train.group_size``
completions). A ratio of the whole batch is not the mean of the processes' ratios when their
denominators differ (tokens, rows with a valid token), so every such metric is kept as the sums it
divides (:func:`batch_counts`), the sums are added over the processes (:func:`sum_over_processes`, one
all-reduce) and only then divided (:func:`batch_metrics`). On one process the values are those of the
process's batch, computed exactly as before (``informative_groups`` and ``completion_tokens`` keep their
float32 rounding). The rewards (``reward``, ``reward_std``, ``task_reward``, ``solved``) are gathered
row by row by the trainer itself. What stays per process is listed in docs/metrics.md.
"""
from __future__ import annotations

import logging

import torch
from accelerate import Accelerator

from maskrl.advantages import informative_group_counts
from maskrl.credit.base import Share, combine
from maskrl.health import DIAGNOSTIC_COUNTS, diagnostic_counts, diagnostics_from_counts
from maskrl.types import Rollout

#: the sums behind the batch metrics: the rollout diagnostics' (:data:`maskrl.health.DIAGNOSTIC_COUNTS`),
#: informative and all groups, and all rows (the rows ``completion_tokens`` averages over)
log = logging.getLogger(__name__)

BATCH_COUNTS = DIAGNOSTIC_COUNTS + ("informative", "groups", "sequences")


def batch_counts(rewards: torch.Tensor, rollout: Rollout) -> dict[str, float]:
    """The sums of :data:`BATCH_COUNTS` for this process's share of the batch.

    Args:
        rewards: ``[N]`` float, the training rewards of the rows (the advantages' source).
        rollout: the share's rollout (``N`` rows: ``completion_ids`` / ``completion_mask`` /
            ``commit_prob`` ``[N, L]``, ``group_ids`` ``[N]``).

    Returns:
        ``{name: float}`` in :data:`BATCH_COUNTS` order.
    """
    counts = diagnostic_counts(rollout.completion_ids, rollout.completion_mask, rollout.commit_prob)
    informative, groups = informative_group_counts(rewards, rollout.group_ids)
    counts.update(informative=float(informative), groups=float(groups), sequences=float(rollout.batch_size))
    return {k: counts[k] for k in BATCH_COUNTS}


def sum_over_processes(acc: Accelerator, counts: dict[str, float]) -> dict[str, float]:
    """``counts`` added over ``acc``'s processes (one float64 all-reduce, a collective: every rank calls
    it with the same keys); ``counts`` itself on one process."""
    if acc.num_processes == 1:
        return counts
    vals = torch.tensor([counts[k] for k in counts], dtype=torch.float64, device=acc.device)
    return dict(zip(counts, acc.reduce(vals, reduction="sum").tolist()))


def _float32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def batch_metrics(counts: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """The batch's metrics from :func:`batch_counts` (summed over processes: those of the global batch).

    Returns:
        ``(diagnostics, groups)``: the rollout diagnostics (:func:`maskrl.health.diagnostics_from_counts`:
        ``commit_nll``, ``distinct_frac``, ``longest_run``, ``empty_frac``, ``degenerate_frac``) and
        ``{"informative_groups": informative / groups, "completion_tokens": valid tokens / rows}``
        (rounded to float32, as the float32 means they were; 0.0 without groups or rows).
    """
    return diagnostics_from_counts(counts), {
        "informative_groups": _float32(counts["informative"] / max(counts["groups"], 1)),
        "completion_tokens": _float32(counts["tokens"] / max(counts["sequences"], 1)),
    }


def credit_metrics_over_processes(acc: Accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """The credit modules' metrics of the whole batch: every process's values gathered (one object
    all-gather, a collective) and combined per key (:func:`maskrl.credit.base.combine`: a
    :class:`~maskrl.credit.base.Share` by its own rule, over the processes that report it; a plain
    float by its mean over processes, a process without it counting 0, keys then in sorted order);
    on one process the values themselves, as plain floats.

    Raises:
        ValueError: one key reported as different kinds of share on different processes.
    """
    if acc.num_processes == 1:
        return {k: float(v) for k, v in metrics.items()}
    from accelerate.utils import gather_object

    everyone = gather_object([dict(metrics)])  # [P] by rank, on every process
    out = {}
    for key in sorted(set().union(*everyone)):
        values = [m[key] for m in everyone if key in m]
        if not any(isinstance(v, Share) for v in values):
            values = [m.get(key, 0.0) for m in everyone]
        try:
            out[key] = combine(values)
        except ValueError as e:
            raise ValueError(f"metric {key}: {e}") from None
    return out


def reward_metrics(rewards: torch.Tensor, task_rewards: torch.Tensor, solved: torch.Tensor) -> dict[str, float]:
    """``reward``, ``reward_std``, ``task_reward`` and ``solved`` of the gathered batch.

    Args:
        rewards: ``[N]`` float, the training rewards of every row of the global batch (gathered).
        task_rewards: ``[N]`` float, the task's own rewards (equal to ``rewards`` without shaping).
        solved: ``[N]`` bool, the rows the task counts as solved.
    """
    return {"reward": rewards.mean().item(), "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "task_reward": task_rewards.mean().item(), "solved": solved.float().mean().item()}


def mismatch_metrics(acc: Accelerator, policy, batch, warn: bool = True) -> dict[str, float]:
    """``{"rollout/mismatch": ...}`` of the whole batch (:func:`maskrl.sampling.rollout_mismatch`: the mean
    over every process's committed tokens). Under FSDP / DeepSpeed on several processes, whose forwards
    are collectives while each process runs one per distinct commit step of its rows, it is not computed
    (``{}``), with a warning from the main process when ``warn``. ``batch``: the step's collected batch
    (its ``rollout`` is read only when the mismatch is computed)."""
    from maskrl.credit.base import ShareMean
    from maskrl.training import checkpoint

    if acc.num_processes > 1 and checkpoint.whole_checkpoints(acc):
        if warn and acc.is_main_process:
            log.warning("rollout.mismatch_every: rollout/mismatch is not computed under %s (its forwards would "
                        "differ between processes); it is logged on one process or under DDP", acc.distributed_type)
        return {}
    from maskrl.sampling import rollout_mismatch

    m = rollout_mismatch(policy, batch.rollout)
    return credit_metrics_over_processes(acc, {"rollout/mismatch": ShareMean(m["mismatch"], m["tokens"])})
