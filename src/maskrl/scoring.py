"""Score completions produced elsewhere (another model, another harness) with a task's reward --
the body of ``maskrl score --task T --predictions FILE.jsonl [--data PATH] --out DIR`` (docs/spec.md §5).

Input: JSONL, one ``{"id": <0-based row index in the task's data file>, "completion": "<text>"}`` per
line (other fields are allowed and ignored). Every line is checked before anything is scored; all
problems (unreadable line, not an object, missing or mistyped field, unknown id, duplicate id, blank
line inside the file) are collected and raised together as one :class:`PredictionsError` naming
their line numbers -- nothing is skipped silently. Rows of the data file without a prediction are
not an error; the summary reports the coverage.

Output in ``out_dir``: ``rows.jsonl`` (``{"id", "line", "reward", "correct"}`` per input line, in
input order), ``summary.json`` (task, counts, accuracy with its Wilson 95 % interval, mean reward,
source files with sha256) and ``summary.md`` (the same as a small Markdown table). Scoring uses only
the :class:`~maskrl.tasks.base.Task` protocol (``load``, ``score_examples``, ``is_correct``,
``metrics``), so it works for every registered task.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from maskrl.tasks.base import Task, get_task

#: how many problems the error message lists before summarising the rest
MAX_LISTED_PROBLEMS = 100


class PredictionsError(ValueError):
    """A predictions file with problems; ``problems`` holds ``"line N: ..."`` strings, all of them."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        listed = problems[:MAX_LISTED_PROBLEMS]
        more = len(problems) - len(listed)
        text = "\n  ".join(listed) + (f"\n  ... and {more} more" if more else "")
        super().__init__(f"{path}: {len(problems)} problem(s) in the predictions file:\n  {text}")


def sha256_update_file(h: "hashlib._Hash", path: str | os.PathLike) -> None:
    """Feed a file's bytes to the hash ``h`` in 1 MiB chunks."""
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB chunks); recorded beside every summary's sources."""
    h = hashlib.sha256()
    sha256_update_file(h, path)
    return h.hexdigest()


def read_predictions(path: str | os.PathLike, valid_ids: set[int] | range) -> list[tuple[int, int, str]]:
    """Read and check a predictions file.

    Args:
        path: the JSONL file.
        valid_ids: the ids (0-based data row indices) a prediction may refer to.

    Returns:
        ``(line_number, id, completion)`` per prediction, in file order (line numbers are 1-based).

    Raises:
        PredictionsError: listing every bad line (see the module docstring), or when the file holds
            no predictions.
        FileNotFoundError: when ``path`` does not exist.
    """
    path = Path(path)
    raw_lines = path.read_bytes().split(b"\n")
    while raw_lines and not raw_lines[-1].strip():  # trailing newline(s) at the end of the file
        raw_lines.pop()
    problems: list[str] = []
    out: list[tuple[int, int, str]] = []
    first_line_of: dict[int, int] = {}
    for lineno, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append(f"line {lineno}: not UTF-8 ({e.reason} at byte {e.start})")
            continue
        if not line.strip():
            problems.append(f"line {lineno}: blank line")
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"line {lineno}: not valid JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(obj, dict):
            problems.append(f"line {lineno}: expected a JSON object, got {type(obj).__name__}")
            continue
        bad = False
        for key in ("id", "completion"):
            if key not in obj:
                problems.append(f"line {lineno}: missing field {key!r}")
                bad = True
        if bad:
            continue
        pid, completion = obj["id"], obj["completion"]
        if not isinstance(pid, int) or isinstance(pid, bool):
            problems.append(f"line {lineno}: field 'id' must be an integer, got {type(pid).__name__} {pid!r:.40}")
            continue
        if not isinstance(completion, str):
            problems.append(f"line {lineno}: field 'completion' must be a string, got {type(completion).__name__}")
            continue
        if pid not in valid_ids:
            problems.append(f"line {lineno}: unknown id {pid} (the data has ids {_describe_ids(valid_ids)})")
            continue
        if pid in first_line_of:
            problems.append(f"line {lineno}: duplicate id {pid} (first on line {first_line_of[pid]})")
            continue
        first_line_of[pid] = lineno
        out.append((lineno, pid, completion))
    if not problems and not out:
        problems.append("line 1: the file holds no predictions")
    if problems:
        raise PredictionsError(path, problems)
    return out


def _describe_ids(ids: set[int] | range) -> str:
    if not ids:
        return "none"
    if min(ids) == 0 and max(ids) + 1 == len(ids):
        return f"0..{max(ids)}"
    return f"{len(ids)} ids between {min(ids)} and {max(ids)}"


#: Markdown header cells matching :func:`metric_cells`
METRIC_HEADER = "| accuracy | 95 % CI (Wilson) | mean reward | 95 % CI |"
METRIC_ALIGN = "| ---: | --- | ---: | --- |"


def metric_cells(metrics: dict) -> str:
    """Markdown table cells ``| accuracy | 95 % CI | mean reward | 95 % CI |`` of an
    :func:`~maskrl.stats.accuracy_summary` block (accuracy in percent, rewards to 4 decimals)."""
    lo, hi = metrics["accuracy_ci95"]
    mlo, mhi = metrics["mean_reward_ci95"]
    return (f"| {100 * metrics['accuracy']:.1f} % | [{100 * lo:.1f}, {100 * hi:.1f}] % "
            f"| {metrics['mean_reward']:.4f} | [{mlo:.4f}, {mhi:.4f}] |")


def file_source(path: str | os.PathLike) -> dict:
    """``{"path": absolute path, "sha256": hex digest}`` of a file, as summaries record their inputs."""
    path = Path(path)
    return {"path": str(path.resolve()), "sha256": sha256_file(path)}


def source_line(name: str, source: dict) -> str:
    """Markdown bullet naming a source file and the start of its sha256."""
    return f"- {name}: `{source['path']}` (sha256 `{source['sha256'][:16]}…`)"


def _markdown(summary: dict) -> str:
    src = summary["sources"]
    return "\n".join([
        f"# {summary['task']}: scored predictions",
        "",
        "| task | n | of data rows " + METRIC_HEADER,
        "| --- | ---: | ---: " + METRIC_ALIGN,
        f"| {summary['task']} | {summary['n']} | {summary['n_data_rows']} " + metric_cells(summary),
        "",
        source_line("predictions", src["predictions"]),
        source_line("data", src["data"]),
        "",
    ])


def score_predictions(task_name: str | Task, predictions_path: str | os.PathLike,
                      data_path: str | os.PathLike | None = None, *, out_dir: str | os.PathLike) -> dict:
    """Score a predictions file with a task's reward and write ``rows.jsonl``, ``summary.json`` and
    ``summary.md`` into ``out_dir`` (created if needed).

    Args:
        task_name: a registered task name (or an already configured :class:`Task`).
        predictions_path: JSONL of ``{"id", "completion"}`` lines (see the module docstring).
        data_path: the task's data file or a data dir holding it (default: the shared data dir).
        out_dir: output directory.

    Returns:
        The summary dict also written to ``summary.json``.

    Raises:
        KeyError: unknown task name (listing the valid ones).
        FileNotFoundError: missing predictions or data file.
        DataError: malformed data file (file and line named).
        PredictionsError: bad predictions, every problem listed with its line number; nothing is
            written in that case.
    """
    task = task_name if isinstance(task_name, Task) else get_task(task_name)
    data_file = task.resolve_path(data_path)
    examples = task.load(data_file)
    by_id = {ex.id: ex for ex in examples}
    preds = read_predictions(predictions_path, set(by_id))

    chosen = [by_id[pid] for _, pid, _ in preds]
    completions = [c for _, _, c in preds]
    rewards = [float(r) for r in task.score_examples(chosen, completions)]
    if len(rewards) != len(preds):
        raise RuntimeError(f"task {task.name!r} returned {len(rewards)} rewards for {len(preds)} completions")
    correct = [task.is_correct(r) for r in rewards]

    summary: dict[str, Any] = {"task": task.name}
    summary.update(task.metrics(chosen, completions, rewards))
    summary["n_data_rows"] = len(examples)
    summary["coverage"] = len(preds) / len(examples) if examples else 0.0
    summary["sources"] = {"predictions": file_source(predictions_path), "data": file_source(data_file)}

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "rows.jsonl", "w", encoding="utf-8") as fh:
        for (lineno, pid, _), r, ok in zip(preds, rewards, correct):
            fh.write(json.dumps({"id": pid, "line": lineno, "reward": r, "correct": bool(ok)}) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(_markdown(summary), encoding="utf-8")
    return summary
