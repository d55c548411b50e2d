"""The output folder of the benchmark harness (:func:`maskrl.evaluate.run_harness`, ``maskrl eval``;
docs/spec.md §5): its per-length samples files (read back for ``resume``, rewritten atomically), the settings
that must match before a folder is reused, and the default folder keyed by those settings.

The harness writes into ``out_dir`` (default :func:`default_eval_dir`: ``runs/eval/<task>/<key of the
weights' sha256 and the settings>``), holding its lock (:func:`maskrl.rundir.run_lock`) meanwhile:

- ``samples_L{L}.jsonl``: one ``{"id", "gen_length", "prompt", "completion", "reward", "correct"}``
  line per row (``prompt`` is the model input text, after the chat template; ``reward`` is the
  task reward of ``completion``; ``correct`` is ``task.is_correct(reward)``), appended and flushed
  after every batch, rewritten in data order once the length is done;
- ``settings.json``: what ``resume`` checks (the weights' sha256, task, data sha256, block, steps,
  chat template, dtype; plus the model's path, for information);
- ``summary.json``: model, task, data source (path, sha256), per-``L`` accuracy with its Wilson 95 %
  interval, mean reward with a normal 95 % interval, ``n``, the task's extra metrics, sampler
  settings and generation seconds;
- ``summary.md``: a Markdown table, one row per ``L`` (cells as in ``maskrl score``).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Sequence

log = logging.getLogger("maskrl.evaluate")  # the harness's log, as before this module was split off

SETTINGS_FILE = "settings.json"
SAMPLE_KEYS = ("id", "gen_length", "prompt", "completion", "reward", "correct")
#: settings that must match for ``resume`` to reuse stored samples, and for a folder to be rewritten
#: without ``overwrite``: the weights' fingerprint (:func:`maskrl.rundir.weights_fingerprint`), not
#: the model's path, so replaced weights in the same folder never pass for the old ones
RESUME_KEYS = ("weights_sha256", "task", "data_sha256", "block_length", "steps", "chat_template", "dtype")
#: the files :func:`maskrl.evaluate.run_harness` writes (removed by ``overwrite``)
EVAL_FILES = (SETTINGS_FILE, "summary.json", "summary.md")


def samples_path(out_dir: str | os.PathLike, gen_length: int) -> Path:
    """``OUT/samples_L{gen_length}.jsonl``: the per-sample file of one completion length."""
    return Path(out_dir) / f"samples_L{gen_length}.jsonl"


def read_samples(path: str | os.PathLike, prompts: dict[int, str], gen_length: int) -> dict[int, dict]:
    """Rows of a samples file written by :func:`maskrl.evaluate.run_harness`, checked against this evaluation.

    A last line without its newline that is not valid JSON is the trace of an interrupted write: it
    is dropped (that sample is generated again). Every other problem is an error.

    Args:
        path: ``OUT/samples_L{L}.jsonl`` (a missing file holds no rows).
        prompts: ``{id: model input text}`` of the rows being evaluated.
        gen_length: the file's completion length ``L``.

    Returns:
        ``{id: row}`` with the ``{"id", "gen_length", "prompt", "completion", "reward", "correct"}`` rows.

    Raises:
        ValueError: naming file and line for a malformed line, a duplicate id, an id not among
            ``prompts`` (another ``--limit`` or ``--data``), or a row whose ``gen_length`` or
            ``prompt`` differs from this evaluation's.
    """
    path = Path(path)
    if not path.exists():
        return {}
    lines = path.read_bytes().split(b"\n")
    complete_tail = lines[-1] == b""
    if complete_tail:
        lines.pop()
    rows: dict[int, dict] = {}
    for lineno, raw in enumerate(lines, start=1):
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if lineno == len(lines) and not complete_tail:
                log.warning("%s: dropping the truncated last line (interrupted write); it is redone", where)
                break
            raise ValueError(f"{where}: not a valid JSON line ({e}); remove it or evaluate without --resume") from None
        if not isinstance(obj, dict) or any(k not in obj for k in SAMPLE_KEYS):
            raise ValueError(f"{where}: expected an object with fields {', '.join(SAMPLE_KEYS)}")
        pid = obj["id"]
        if not isinstance(pid, int) or isinstance(pid, bool):
            raise ValueError(f"{where}: field 'id' must be an integer, got {pid!r:.40}")
        if pid not in prompts:
            raise ValueError(f"{where}: id {pid} is not among the {len(prompts)} rows of this evaluation "
                             f"(another --limit or --data?); use another --out or drop --resume")
        if pid in rows:
            raise ValueError(f"{where}: duplicate id {pid}")
        if obj["gen_length"] != gen_length:
            raise ValueError(f"{where}: gen_length {obj['gen_length']!r} but the file is for {gen_length}")
        if obj["prompt"] != prompts[pid]:
            raise ValueError(f"{where}: the stored prompt of id {pid} differs from this evaluation's "
                             f"(changed data or chat template?); use another --out or drop --resume")
        if not isinstance(obj["completion"], str) or not isinstance(obj["reward"], (int, float)) \
                or not isinstance(obj["correct"], bool):
            raise ValueError(f"{where}: fields completion (str), reward (number), correct (bool) have wrong types")
        rows[pid] = obj
    return rows


def write_lines(path: Path, rows: Sequence[dict]) -> None:
    """Replace ``path`` atomically by ``rows`` as JSONL (a crash leaves the old or the new file)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def stored_rows(path: Path) -> int:
    """Number of non-empty lines of a samples file (0 when there is none)."""
    if not path.is_file():
        return 0
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def check_settings(out: Path, settings: dict, resume: bool, overwrite: bool,
                    gen_lengths: Sequence[int] = ()) -> None:
    """Check ``out`` before an evaluation writes into it.

    A folder holding a training run (:data:`maskrl.rundir.RUN_FILES`) and no ``settings.json`` is
    refused, ``overwrite`` or not. ``out`` holding samples of other settings (:data:`RESUME_KEYS`: another model's weights, task,
    data, sampler, template or dtype) is refused, with ``resume`` (its rows would pass for this
    evaluation's) and without (they would be replaced), unless ``overwrite``: then the old files are
    removed. Finished samples of the same settings, in the files of ``gen_lengths`` that this
    evaluation writes, are refused without ``resume`` (they would be discarded) unless ``overwrite``.

    Raises:
        ValueError: ``resume`` with ``overwrite``; a run's folder; an unreadable ``settings.json``;
            other settings without ``overwrite`` (naming each key ``old -> new``); finished samples
            without ``resume`` or ``overwrite`` (naming each file and its rows).
    """
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    path = out / SETTINGS_FILE
    from maskrl.rundir import run_files

    if not path.exists() and run_files(out):  # e.g. --out runs/demo: its summary.json is not an evaluation's
        raise ValueError(f"{out} holds a run ({', '.join(run_files(out))}), not an evaluation; use another --out")
    if overwrite:
        for p in [*out.glob("samples_L*.jsonl"), *(out / n for n in EVAL_FILES)]:
            if p.is_file():
                p.unlink()
        return
    if not path.exists():
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e}); use another --out or --overwrite") from None
    diff = [f"{k}: {old.get(k)!r} -> {settings[k]!r}" for k in RESUME_KEYS if old.get(k) != settings[k]]
    if diff and resume:
        raise ValueError(f"--resume: {out} was evaluated with other settings ({'; '.join(diff)}); "
                         f"use another --out, or --overwrite to start afresh")
    if diff:
        raise ValueError(f"{out} holds an evaluation with other settings ({'; '.join(diff)}); pass --overwrite "
                         f"to replace it, or use another --out")
    finished = [(samples_path(out, L), stored_rows(samples_path(out, L))) for L in gen_lengths]
    finished = [(p, n) for p, n in finished if n]
    if finished and not resume:
        files = ", ".join(f"{p} ({n} row{'s' if n != 1 else ''})" for p, n in finished)
        raise ValueError(f"{out} already holds finished samples of this evaluation: {files}; pass --resume to "
                         f"keep them and generate only the missing rows, --overwrite to discard them and start "
                         f"afresh, or use another --out")


def default_eval_dir(task_name: str, settings: dict) -> Path:
    """``runs/eval/<task>/<key>``: ``key`` is the first 12 hex digits of the sha256 of the settings in
    :data:`RESUME_KEYS` (weights fingerprint included), so another model or other settings get their
    own folder and an evaluation is never replaced by another model's."""
    import hashlib

    key = hashlib.sha256(json.dumps({k: settings[k] for k in RESUME_KEYS}, sort_keys=True).encode()).hexdigest()
    return Path("runs") / "eval" / task_name / key[:12]
