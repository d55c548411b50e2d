"""Run health: non-finite guards and rollout-collapse diagnostics for the RL loop (issue 13).

Pure functions (plus one sampler observer) that :class:`maskrl.trainer.RLTrainer` calls at each stage
of a step. Nothing here changes a number the trainer computes; it only inspects them.

Non-finite numbers (``train.on_nonfinite``)
    A NaN or ±inf in the sampler's logits, a reward, the advantages, a log-probability (θ, θ_old,
    reference), the loss or the gradient norm is caught at the stage where it first appears. The
    error (:class:`NonFiniteError`) names the stage, the RL step and the rows. With
    ``on_nonfinite: skip`` the step is logged and skipped instead: no optimizer update is made with
    it and the ``nonfinite_skips`` metric counts the skipped steps.

Rewards
    A reward that is not a finite real number (``None``, NaN, ±inf, a string, ...) is always an
    error naming the task, the row and the completion (:func:`check_rewards`): it is a bug of the
    reward function, not numerical noise, so it is never skipped silently.

Collapse
    :func:`rollout_diagnostics` summarises how degenerate a batch of completions is (mean
    −log commit_prob of the committed tokens, distinct-token fraction, longest repeated run) and
    :func:`collapse_message` turns them into a warning when most rows are one token repeated.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Sequence

import torch

#: values of ``train.on_nonfinite``
ON_NONFINITE = ("error", "skip")


class NonFiniteError(FloatingPointError):
    """A NaN or ±inf at one stage of an RL step.

    Attributes:
        stage: where it appeared (``"logits"``, ``"advantages"``, ``"log-probs (θ)"``, ``"loss"``,
            ``"grad norm"``, ...).
        step: the RL step (1-based, the step being computed).
        rows: indices of the affected rows in this process's batch (empty when the value is a scalar).
    """

    def __init__(self, stage: str, step: int, rows: Sequence[int] = (), detail: str = "") -> None:
        self.stage, self.step, self.rows = stage, int(step), [int(r) for r in rows]
        where = f", rows {_short(self.rows)}" if self.rows else ""
        super().__init__(f"non-finite {stage} at RL step {self.step}{where}{detail}; the weights were not "
                         f"updated with it (set train.on_nonfinite: skip to skip such steps instead)")


def _short(rows: Sequence[int], limit: int = 10) -> str:
    text = ", ".join(str(r) for r in rows[:limit])
    return f"[{text}{', ...' if len(rows) > limit else ''}] ({len(rows)} of the batch)" if len(rows) > limit \
        else f"[{text}]"


def nonfinite_rows(x: torch.Tensor) -> list[int]:
    """Indices along dim 0 of the rows of ``x`` that hold a NaN or ±inf.

    Args:
        x: ``[N, ...]`` float tensor (a 0-d tensor counts as one row, index 0).

    Returns:
        Sorted row indices (empty when every value is finite).
    """
    bad = ~torch.isfinite(x.detach())
    if bad.dim() == 0:
        return [0] if bool(bad) else []
    return bad.reshape(bad.shape[0], -1).any(-1).nonzero().flatten().tolist()


def check_finite(stage: str, x: torch.Tensor, step: int) -> None:
    """Raise :class:`NonFiniteError` naming ``stage``, ``step`` and the rows when ``x`` is not all finite.

    Args:
        stage: name of the stage, used in the message.
        x: ``[N, ...]`` tensor (or a 0-d scalar such as a loss).
        step: RL step number for the message.
    """
    rows = nonfinite_rows(x)
    if rows:
        raise NonFiniteError(stage, step, rows if x.dim() > 0 else ())


def check_rewards(rewards: Sequence, task_name: str, row_ids: Sequence = (), completions: Sequence[str] = ()) -> list[float]:
    """The rewards as floats, or a ``ValueError`` naming the task and the first bad row.

    Args:
        rewards: what ``Task.score_examples`` returned, one per completion.
        task_name: for the message.
        row_ids: the example id of each row (optional, for the message).
        completions: the completions (optional; the first 60 characters of the bad one are quoted).

    Returns:
        ``list[float]`` of the same length, every value finite.

    Raises:
        ValueError: a reward that is not a real number (``None``, a string, a bool is accepted as
            0/1) or is NaN/±inf; or a reward list of the wrong length.
    """
    rewards = list(rewards)
    if completions and len(rewards) != len(completions):
        raise ValueError(f"task {task_name!r}: reward returned {len(rewards)} values for {len(completions)} completions")
    out = []
    for i, r in enumerate(rewards):
        if isinstance(r, torch.Tensor) and r.numel() == 1:
            r = r.item()
        ok = isinstance(r, Real) and math.isfinite(float(r))
        if not ok:
            rid = f" (example id {row_ids[i]!r})" if i < len(row_ids) else ""
            text = f"; completion {completions[i][:60]!r}" if i < len(completions) else ""
            raise ValueError(f"task {task_name!r}: reward of row {i}{rid} is {r!r}, not a finite number{text}. "
                             "A reward function must return a finite float for every completion "
                             "(e.g. 0.0 for one it cannot score).")
        out.append(float(r))
    return out


class NonFiniteLogits:
    """Sampler observer (:class:`maskrl.sampling.StepObserver`) that records the first denoising step
    whose completion logits hold a NaN or ±inf, and the rows concerned.

    The sampler sets the ``[M]`` column to ``-inf`` itself, and the columns of ids without a tokenizer
    entry (``>= token_count``: the padded output rows of Qwen2-based models such as Dream-7B,
    :func:`~maskrl.sampling.commit.candidate_logits`); those columns are not counted. The observer adds
    nothing to ``Rollout.step_stats``.

    Attributes:
        step: the first sampler step (0-based) with a non-finite logit, or ``None``.
        rows: batch rows (indices into the sampler's ``N``) with a non-finite logit at that step.
    """

    exact_logits = False  # it checks the logits the view holds; no need for theta's exact ones

    def __init__(self, mask_id: int, token_count: int | None = None) -> None:
        self.mask_id, self.token_count = mask_id, token_count
        self.step: int | None = None
        self.rows: list[int] = []

    def on_step(self, view) -> None:
        if self.step is not None:
            return
        lg = view.logits[..., :self.token_count]  # [M, V'] at the covered positions, ids with a tokenizer entry
        # one float32 sum per position over every column but [M] (views, no [M, V] temporaries):
        # a NaN or ±inf anywhere makes it non-finite
        m = self.mask_id
        total = lg[..., :m].sum(-1, dtype=torch.float32) + lg[..., m + 1:].sum(-1, dtype=torch.float32)  # [M]
        bad_pos = ~torch.isfinite(total)  # [M]
        if bad_pos.any():
            row_of = view.covered.nonzero()[:, 0]  # [M] row (0..n-1) of each covered position
            self.step = int(view.step)
            self.rows = view.rows[row_of[bad_pos].unique()].tolist()

    def result(self) -> dict[str, torch.Tensor]:
        return {}


def _longest_run(tokens: list[int]) -> int:
    best = cur = 0
    prev = None
    for t in tokens:
        cur = cur + 1 if t == prev else 1
        prev = t
        best = max(best, cur)
    return best


#: the per-batch sums behind :func:`rollout_diagnostics` (:func:`diagnostic_counts`): they add over
#: processes, the diagnostics of the whole batch are then :func:`diagnostics_from_counts` of the sums
DIAGNOSTIC_COUNTS = ("nll_sum", "tokens", "distinct_sum", "run_sum", "empty", "degenerate", "rows")


def diagnostic_counts(completion_ids: torch.Tensor, completion_mask: torch.Tensor, commit_prob: torch.Tensor,
                      min_tokens: int = 4, run_frac: float = 0.5) -> dict[str, float]:
    """The sums :func:`rollout_diagnostics` divides, for one batch (or one process's share of it).

    Args: as :func:`rollout_diagnostics`.

    Returns:
        :data:`DIAGNOSTIC_COUNTS` as floats: ``nll_sum`` (Σ over valid tokens of ``−log commit_prob``),
        ``tokens`` (valid tokens), ``distinct_sum`` (Σ over rows of distinct / valid tokens),
        ``run_sum`` (Σ over rows of the longest run), ``empty``, ``degenerate`` (row counts) and
        ``rows`` (rows with at least one valid token). Sums of two batches' counts are the counts of
        the two together.

    Raises:
        ValueError: the three tensors are not all ``[N, L]``.
    """
    if completion_ids.shape != completion_mask.shape or completion_ids.shape != commit_prob.shape:
        raise ValueError(f"completion_ids {tuple(completion_ids.shape)}, completion_mask {tuple(completion_mask.shape)} "
                         f"and commit_prob {tuple(commit_prob.shape)} must all be [N, L]")
    m = completion_mask.bool()
    nll_sum = (-(commit_prob.float().clamp(min=1e-12).log()) * m).sum().item()
    length = completion_ids.shape[1] if completion_ids.dim() == 2 else 0
    distinct, runs, degenerate, empty, rows = 0.0, 0.0, 0, 0, 0
    for row, keep in zip(completion_ids.tolist(), m.tolist()):
        toks = [t for t, k in zip(row, keep) if k]
        if not toks:
            continue
        rows += 1
        run, n_distinct = _longest_run(toks), len(set(toks))
        distinct += n_distinct / len(toks)
        runs += run
        is_empty = len(toks) == 1 and length > 1  # the first token is already the stop token
        empty += int(is_empty)
        degenerate += int(is_empty or (len(toks) >= min_tokens and run >= run_frac * len(toks))
                          or (len(toks) >= 2 * min_tokens and n_distinct <= 2))
    return {"nll_sum": nll_sum, "tokens": float(m.sum()), "distinct_sum": distinct, "run_sum": runs,
            "empty": float(empty), "degenerate": float(degenerate), "rows": float(rows)}


def diagnostics_from_counts(counts: dict[str, float]) -> dict[str, float]:
    """The diagnostics of :func:`rollout_diagnostics` from :func:`diagnostic_counts` (of one batch, or
    summed over the processes' shares: then those of the whole batch)."""
    rows = max(counts["rows"], 1)
    return {"commit_nll": counts["nll_sum"] / max(counts["tokens"], 1), "distinct_frac": counts["distinct_sum"] / rows,
            "longest_run": counts["run_sum"] / rows, "empty_frac": counts["empty"] / rows,
            "degenerate_frac": counts["degenerate"] / rows}


def rollout_diagnostics(completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                        commit_prob: torch.Tensor, min_tokens: int = 4, run_frac: float = 0.5) -> dict[str, float]:
    """Per-step collapse diagnostics of a batch of completions
    (:func:`diagnostics_from_counts` of :func:`diagnostic_counts`).

    Args:
        completion_ids: ``[N, L]`` long.
        completion_mask: ``[N, L]`` bool, the valid tokens (up to and including the first stop token).
        commit_prob: ``[N, L]`` float32, noise-free probability of each committed token at its commit
            step (``Rollout.commit_prob``).
        min_tokens: a row of at least this many valid tokens is *degenerate* when one token repeated
            back to back covers at least ``run_frac`` of them; a row of at least ``2 * min_tokens``
            valid tokens is degenerate when it uses at most 2 distinct tokens (a short loop such as
            "abab…"); a row that is only its stop token (``L > 1``) is degenerate (empty).
        run_frac: see ``min_tokens``.

    Returns:
        ``commit_nll``: mean over valid tokens of ``−log commit_prob`` (nats; the model's surprise at
        what it committed; → 0 when every token is committed with probability 1);
        ``distinct_frac``: mean over rows of (distinct valid tokens / valid tokens);
        ``longest_run``: mean over rows of the longest run of one repeated token, in tokens;
        ``empty_frac``: fraction of rows that are only a stop token;
        ``degenerate_frac``: fraction of degenerate rows (see ``min_tokens``; empty rows included).
        Rows without valid tokens are left out of the row means; an empty batch gives zeros.

    Raises:
        ValueError: the three tensors are not all ``[N, L]``.
    """
    return diagnostics_from_counts(diagnostic_counts(completion_ids, completion_mask, commit_prob, min_tokens,
                                                     run_frac))


def collapse_message(diag: dict[str, float], step: int, threshold: float = 0.5) -> str | None:
    """A warning text when at least ``threshold`` of the rows are degenerate (one token repeated over
    half the completion, a two-token loop, or only a stop token; see :func:`rollout_diagnostics`),
    else ``None``."""
    if diag.get("degenerate_frac", 0.0) < threshold:
        return None
    return (f"RL step {step}: the rollouts look collapsed: {diag['degenerate_frac']:.0%} of the completions are "
            f"one token repeated, a loop of two tokens or empty ({diag.get('empty_frac', 0.0):.0%} empty; longest run {diag['longest_run']:.1f} tokens, distinct-token fraction "
            f"{diag['distinct_frac']:.2f}, mean -log commit_prob {diag['commit_nll']:.3f}). A reward near 0 here "
            "is a broken policy, not a hard task: check the model, prompt format and learning rate.")
