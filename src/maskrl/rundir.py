"""Run folders: which command may write where, one writer at a time, and what a resume may change.

Used by ``maskrl train``, ``sft``, ``demo`` and ``eval`` alike (issue 20, items 1–2):

- :func:`prepare_run_dir`: a folder that holds another run (any of :data:`RUN_FILES`) is refused
  unless the command is told to resume it or to overwrite it (the ``overwrite_output_dir``
  convention of Hugging Face's trainer); ``overwrite`` removes only the files maskrl writes there
  (:data:`RUN_FILES`; other files, and the demo's ``sft-cache/``, are kept).
- :func:`prepare_model_dir`: the same for a model folder (``maskrl sft --out``).
- :func:`run_lock`: a lock file (:data:`LOCK_FILE`: pid, host, command, start time) so that two
  processes never write one folder; a lock whose process is gone (same host) is stale and replaced.
- :func:`resume_changes`: the config keys that differ between a checkpoint and a resume, split into
  those that keep the run's meaning (:data:`SAFE_ON_RESUME`) and those that do not (refused unless
  forced); :func:`record_config` keeps every config a run has had (``config.json`` is the first one,
  ``configs.jsonl`` one line per start or resume).
- :func:`weights_fingerprint`: sha256 of a model's weights (the files of a folder, or the tensors of
  a loaded model), so that evaluations and resumes key on the weights, not on a path.
- :func:`truncate_metrics`: a resumed run's ``metrics.jsonl`` keeps only the steps up to the checkpoint.
- :func:`run_model_folder`: a run folder given where a model is read (``--model``, ``model.path``,
  lm-eval's ``pretrained``) stands for its exported ``model/``; a run without one is a clear error.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

#: the files and folders maskrl writes into a run folder (train, demo); any of them = "holds a run"
RUN_FILES = ("config.json", "configs.jsonl", "metrics.jsonl", "tb", "checkpoints", "model", "summary.json",
             "history.jsonl", "eval_base.jsonl", "eval_final.jsonl", "curves.png", "trackers.json")
#: the lock file of a folder being written (JSON: pid, host, command, started)
LOCK_FILE = ".maskrl.lock"
#: files that mark a model folder written by maskrl (``maskrl sft``, ``train``, ``demo``)
MODEL_MARKERS = ("maskrl_sft.json", "maskrl_prompt.json")
#: config history of a run: one JSON line per start or resume
CONFIG_HISTORY = "configs.jsonl"

#: dotted config keys (or prefixes ending in ".") a resume may change without changing what the run
#: trains: logging, evaluation and checkpoint frequency, the evaluation sampler, memory knobs that give
#: the same update (micro-batching; gradient checkpointing), diagnostics, and sections training does
#: not read (``sft``). ``train.steps`` is safe only when the learning-rate schedule does not depend on
#: it (see :func:`resume_changes`).
SAFE_ON_RESUME = ("output_dir", "plugins", "train.log_every", "train.eval_every", "train.save_every",
                  "train.eval_limit", "train.on_nonfinite", "train.micro_batch_size", "train.max_forward_rows",
                  "model.gradient_checkpointing", "rollout.mismatch_every", "task.eval_limit", "eval.", "sft.")
#: schedules whose rate at a step does not depend on ``train.steps``
STEP_FREE_SCHEDULES = ("constant", "constant_with_warmup")


class RunDirError(ValueError):
    """A run folder cannot be used as asked; the message says which flag or folder to use instead."""


def is_main_process() -> bool:
    """True on the process that owns the run folder: rank 0 of a ``torchrun`` / ``accelerate launch``
    group (environment ``RANK``), or a single process."""
    return int(os.environ.get("RANK", "0") or 0) == 0


# ------------------------------------------------------------------------------------ folders
def run_files(folder: str | os.PathLike) -> list[str]:
    """The entries of :data:`RUN_FILES` present in ``folder`` (empty for a missing folder)."""
    folder = Path(folder)
    return [name for name in RUN_FILES if (folder / name).exists()]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def logged_steps(folder: str | os.PathLike) -> int:
    """How many rows ``folder/metrics.jsonl`` holds (0 without one; unreadable lines are not counted)."""
    path = Path(folder) / "metrics.jsonl"
    if not path.is_file():
        return 0
    n = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            n += isinstance(json.loads(line), dict)
        except json.JSONDecodeError:
            pass
    return n


def describe_run(folder: str | os.PathLike) -> str:
    """What ``folder`` holds, for a message: its :data:`RUN_FILES` and, when it has them, how many
    steps ``metrics.jsonl`` logged (``"config.json, configs.jsonl, metrics.jsonl (3 steps logged), tb"``)."""
    parts = []
    for name in run_files(folder):
        if name == "metrics.jsonl":
            n = logged_steps(folder)
            name += f" ({n} step{'s' if n != 1 else ''} logged)"
        parts.append(name)
    return ", ".join(parts)


def prepare_run_dir(folder: str | os.PathLike, *, overwrite: bool, other: str, resume_flag: str | None = "--resume",
                    command: str = "maskrl", checkpoint: str | os.PathLike | None = None) -> None:
    """Refuse ``folder`` when it holds another run, unless ``overwrite`` (then its run files go).

    Args:
        folder: the run folder (``output_dir``).
        overwrite: remove the entries of :data:`RUN_FILES` in ``folder`` (nothing else) and go on.
        other: how to choose another folder, for the message (e.g. ``"--set output_dir=DIR"``).
        resume_flag: the command's resume flag, named in the message (``None``: it has none).
        command: the command's name, for the log.
        checkpoint: the folder's latest complete checkpoint (``checkpoints/step_K``), or ``None`` when
            it has none; read only with a ``resume_flag``, to say what the flag can do there.

    Raises:
        RunDirError: ``folder`` holds run files and ``overwrite`` is False; one line naming what the
            folder holds and what is possible: with a checkpoint, ``resume_flag`` continues it from
            step K; without one, there is nothing to continue (``resume_flag`` starts the same run again
            from step 0, see ``maskrl train --resume``), so ``--overwrite`` or another folder.
    """
    folder = Path(folder)
    present = run_files(folder)
    if not present:
        return
    if not overwrite:
        what = describe_run(folder)
        if not resume_flag:
            raise RunDirError(f"{folder} holds another run ({what}); pass --overwrite to replace it, "
                              f"or choose another folder ({other})")
        if checkpoint is not None:
            step = Path(checkpoint).name.removeprefix("step_")
            raise RunDirError(f"{folder} holds another run ({what}; latest checkpoint {Path(checkpoint).name}); "
                              f"pass {resume_flag} to continue it from step {step}, --overwrite to replace it, "
                              f"or choose another folder ({other})")
        raise RunDirError(f"{folder} holds a run that saved no checkpoint ({what}), so there is nothing to "
                          f"continue: pass --overwrite to replace it with this run, {resume_flag} to start that "
                          f"run again from step 0 with its own settings, or choose another folder ({other})")
    for name in present:
        _remove(folder / name)
    log.warning("%s: --overwrite: removed %s from %s", command, ", ".join(present), folder)


def check_not_inside_run(path: str | os.PathLike | None, folder: str | os.PathLike, what: str) -> None:
    """Refuse an input ``path`` that lies in a file or folder the run in ``folder`` writes
    (:data:`RUN_FILES`, e.g. ``<output_dir>/model``): the run would replace it while using it.

    Raises:
        RunDirError: naming ``what`` (e.g. ``model.path``), the path and how to fix it.
    """
    if not path:
        return
    p, root = Path(path).resolve(), Path(folder).resolve()
    for name in RUN_FILES:
        target = root / name
        if p == target or target in p.parents:
            raise RunDirError(f"{what} {path} is inside {folder}/{name}, which this run writes (it would be replaced "
                              f"while in use); keep it elsewhere (e.g. maskrl sft --out DIR) or choose another "
                              f"output_dir (--set output_dir=DIR)")


#: keys of a model's own ``config.json`` (transformers: ``model_type`` / ``architectures``; LLaDA:
#: ``d_model``); a run folder's ``config.json`` is the run's config and has none of them
MODEL_CONFIG_KEYS = ("model_type", "architectures", "d_model")


def _is_model_folder(folder: Path) -> bool:
    """True when ``folder`` holds weight files (:data:`WEIGHT_PATTERNS`) or a model's ``config.json``."""
    if any(p.is_file() for pat in WEIGHT_PATTERNS for p in folder.glob(pat)):
        return True
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and any(k in cfg for k in MODEL_CONFIG_KEYS)


def run_model_folder(path: Any, what: str = "--model") -> Any:
    """The model a path names: a training run folder (``maskrl train`` / ``sft`` / ``demo``'s
    ``output_dir``) stands for the model it exported, ``<run>/model``; anything else is returned as given.

    ``<run>/model`` is what ``maskrl eval --model <run>/model`` reads: the weights, tokenizer and
    prompt card, and for a LoRA run the merged float32 weights with the adapter beside them (loaded as
    base + adapter in a lower dtype, :func:`maskrl.models.load`), so a run folder is evaluated exactly
    as its ``model/``. A folder is a run folder when it has no weights and no model ``config.json``
    (:data:`MODEL_CONFIG_KEYS`) of its own and holds run files (:data:`RUN_FILES`). A Hub id, a
    missing path or a model folder is returned unchanged (:func:`maskrl.models.load` reports those).

    Args:
        path: ``str`` or path-like (anything else, e.g. ``None`` or a loaded model, is returned as is).
        what: the flag or field that named it, for the message (``"--model"``, ``"model.path"``).

    Returns:
        ``<run>/model`` (a ``str`` for a ``str`` input, else a ``Path``) or ``path`` itself.

    Raises:
        FileNotFoundError: a run folder without a complete ``model/`` (no ``config.json`` or no
            weights: the run stopped before its end, when ``model/`` is written); the message names
            the run, what it holds, what is missing, its latest checkpoint and how to finish it.
        ValueError: a model folder whose ``.safetensors`` file does not read (cut short, corrupt), naming
            the file (:func:`maskrl.files.check_weights_read`), before anything loads it.
    """
    from maskrl.files import check_weights_read

    if not isinstance(path, (str, os.PathLike)) or not str(path):
        return path
    folder = Path(path).expanduser()
    if not folder.is_dir() or _is_model_folder(folder) or not run_files(folder):
        check_weights_read(folder, what)
        return path
    model = folder / "model"
    weights = model.is_dir() and any(p.is_file() for pat in WEIGHT_PATTERNS for p in model.glob(pat))
    if weights and (model / "config.json").is_file():
        log.info("%s %s is a run folder: using its exported model %s", what, path, model)
        check_weights_read(model, what)
        return str(model) if isinstance(path, str) else model
    from maskrl.training.checkpoint import latest_checkpoint

    missing = "no model/" if not model.is_dir() else \
        f"an incomplete model/ (no {'weights' if not weights else 'config.json'})"
    ckpt = latest_checkpoint(folder)
    how = (f"its latest checkpoint is checkpoints/{ckpt.name}: the same `maskrl train` command with --resume "
           f"finishes the run and exports model/") if ckpt is not None else \
        "it saved no checkpoint either (it stopped before its first save), so there is no model to read"
    raise FileNotFoundError(f"{what} {path} is a training run folder ({describe_run(folder)}) with {missing}: a run "
                            f"exports its model to {model} when it finishes; {how}. Pass a model folder instead "
                            f"(e.g. {what} DIR/model of a finished run)")


def prepare_model_dir(folder: str | os.PathLike, *, overwrite: bool, other: str, command: str = "maskrl sft") -> None:
    """Refuse a non-empty model folder (its lock file aside) unless ``overwrite``; with it, empty the
    folder only when maskrl wrote it (it holds one of :data:`MODEL_MARKERS`).

    Raises:
        RunDirError: ``folder`` is not empty and ``overwrite`` is False, or ``overwrite`` is set but the
            folder was not written by maskrl (it is never removed then).
    """
    folder = Path(folder)
    entries = [p for p in folder.iterdir() if p.name != LOCK_FILE] if folder.is_dir() else []
    if not entries:
        return
    ours = any((folder / m).is_file() for m in MODEL_MARKERS)
    if not overwrite:
        what = "a model" if ours or any(folder.glob("*.safetensors")) else "files"
        raise RunDirError(f"{folder} already holds {what}; pass --overwrite to replace it, or choose "
                          f"another folder ({other})")
    if not ours:
        raise RunDirError(f"--overwrite: {folder} was not written by maskrl (none of "
                          f"{', '.join(MODEL_MARKERS)}); remove it yourself or choose another folder ({other})")
    for p in entries:  # the folder and its lock stay
        _remove(p)
    log.warning("%s: --overwrite: emptied %s", command, folder)


# ------------------------------------------------------------------------------------ lock
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return False
    return True


def read_lock(folder: str | os.PathLike) -> dict | None:
    """The holder of ``folder``'s lock (``{"pid", "host", "command", "started"}``), ``{}`` for a lock file
    that cannot be read yet (being written), ``None`` when there is no lock."""
    path = Path(folder) / LOCK_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        info = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return info if isinstance(info, dict) else {}


def lock_is_stale(info: dict) -> bool:
    """True when the lock's process is known to be gone: same host and no process with its pid."""
    pid, host = info.get("pid"), info.get("host")
    return isinstance(pid, int) and host == socket.gethostname() and not _pid_alive(pid)


@contextlib.contextmanager
def run_lock(folder: str | os.PathLike, command: str) -> Iterator[Path]:
    """Hold ``folder/.maskrl.lock`` for the duration of the ``with`` block (the folder is created).

    The lock is taken with an exclusive create, so of two processes starting at once exactly one gets
    it. A lock left by a process that is gone (same host, pid not running) is replaced with a warning;
    a lock from another host cannot be checked and is respected. Only :func:`is_main_process` should
    take it (other ranks of a multi-process run share the main process's lock).

    The folders it creates (``folder`` and missing parents) are removed again when they are empty at
    release: a command refused after taking the lock (bad data, a bad setting found late) leaves no
    empty run folder behind.

    Yields:
        The lock file's path.

    Raises:
        RunDirError: another live process holds the lock (naming its pid, host, command and start).
    """
    folder = Path(folder)
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with _lock_file(folder, command) as path:
            yield path
    finally:
        for p in created:
            try:
                p.rmdir()  # only an empty folder: anything the command wrote stays
            except OSError:
                break


@contextlib.contextmanager
def _lock_file(folder: Path, command: str) -> Iterator[Path]:
    """:func:`run_lock`'s lock file in an existing ``folder``."""
    path = folder / LOCK_FILE
    me = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
          "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = read_lock(folder)
            if holder is None:  # released in between
                continue
            if lock_is_stale(holder):
                log.warning("%s: removing the stale lock %s of pid %s (no longer running)", command, path,
                            holder.get("pid"))
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            who = (f"pid {holder.get('pid')} on {holder.get('host')} ({holder.get('command')}, since "
                   f"{holder.get('started')})") if holder else "another process (lock being written)"
            raise RunDirError(f"{folder} is in use by {who}; wait for it to finish or choose another "
                              f"folder. If that process is gone, delete {path}")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(me, fh)
        break
    else:  # pragma: no cover - three races in a row
        raise RunDirError(f"could not take the lock {path}")
    try:
        yield path
    finally:
        if read_lock(folder) == me:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold an exclusive advisory lock on ``folder`` (created) for the ``with`` block, waiting while
    another process holds it.

    For what several processes may build or update at once: a cache (the benchmarks' SFT checkpoint
    of a task) is built by the first process while the others wait and then read it; a results file
    is re-read and saved by one process at a time. The lock is ``fcntl.flock`` on the folder itself:
    no lock file is left behind, and the operating system releases it when its process ends, so a
    killed process never leaves a stale lock. Unlike :func:`run_lock` it waits instead of failing.
    On a system without ``fcntl`` (Windows) it does not lock.

    Yields:
        ``folder`` as a :class:`~pathlib.Path`.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield folder
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(fd)  # releases the lock


# ------------------------------------------------------------------------------------ configs
def flatten(cfg: dict, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested config dict (``{"train": {"lr": 1e-4}}`` -> ``{"train.lr": 1e-4}``);
    lists (``credit``, ``plugins``) stay whole values."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


_MISSING = "<absent>"


def config_diff(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old, new)}`` for every key whose value differs (an absent key shows as
    ``"<absent>"``), in sorted key order."""
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k, _MISSING), b.get(k, _MISSING)) for k in sorted(set(a) | set(b))
            if a.get(k, _MISSING) != b.get(k, _MISSING)}


def _is_safe(key: str) -> bool:
    return any(key == s or (s.endswith(".") and key.startswith(s)) for s in SAFE_ON_RESUME)


def _lr_at(train: dict, step: int) -> float:
    """The learning rate of the first optimizer step of RL step ``step + 1`` under ``train``'s schedule."""
    import torch
    from transformers import get_scheduler

    mu = int(train.get("inner_iterations", 1))
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=float(train["lr"]))
    sched = get_scheduler(train["lr_scheduler"], opt, num_warmup_steps=int(train.get("warmup_steps", 0)) * mu,
                          num_training_steps=max(1, int(train["steps"]) * mu))
    return float(train["lr"]) * sched.lr_lambdas[0](step * mu)


def resume_changes(old: dict, new: dict, step: int) -> tuple[list[str], list[str]]:
    """What a resume at ``step`` changes, as ``(safe, unsafe)`` lines ``"key: old -> new"``.

    Safe: keys of :data:`SAFE_ON_RESUME`, a raised ``train.steps`` when the schedule does not
    depend on it (:data:`STEP_FREE_SCHEDULES`) -- the run then just goes on longer --, and a key only
    one of the two configs has (a field added or removed by another maskrl version; flagged as such). Everything else
    changes what the run trains (an objective's field, the learning rate, the data, the rollout
    sampler, the seed, ...) and is unsafe. A changed ``train.steps`` under a ``linear`` or ``cosine``
    schedule is unsafe: the decay is over ``train.steps``, so the learning rate of every later step
    would change; the line gives the rate of step ``step + 1`` before and after.

    Args:
        old: the config in force at the checkpoint (``to_dict`` form).
        new: the config of the resume.
        step: the checkpoint's RL step.
    """
    safe, unsafe = [], []
    for key, (a, b) in config_diff(old, new).items():
        line = f"{key}: {a!r} -> {b!r}"
        if key == "train.steps":
            t_old, t_new = old.get("train", {}), new.get("train", {})
            if step == 0 and isinstance(b, int) and b > 0:  # nothing trained yet: every rate is still ahead
                safe.append(line)
            elif isinstance(b, int) and b <= step:
                unsafe.append(f"{line} (the checkpoint is at step {step}: nothing left to train)")
            elif t_new.get("lr_scheduler") in STEP_FREE_SCHEDULES and t_old.get("lr_scheduler") == t_new.get(
                    "lr_scheduler"):
                safe.append(line)
            else:
                try:
                    lrs = f"{_lr_at(t_old, step):.3g} -> {_lr_at(t_new, step):.3g}"
                except Exception:  # noqa: BLE001 - a malformed old config: no numbers, still unsafe
                    lrs = "changes"
                unsafe.append(f"{line} (lr_scheduler {t_new.get('lr_scheduler')} decays over train.steps: the "
                              f"learning rate of step {step + 1} would jump, {lrs})")
        elif _is_safe(key):
            safe.append(line)
        elif _MISSING in (a, b):  # a field another maskrl version has and this one lacks (or vice versa)
            safe.append(f"{line} (a setting {'new in' if a == _MISSING else 'removed from'} this maskrl version)")
        else:
            unsafe.append(line)
    return safe, unsafe


def record_config(folder: str | os.PathLike, cfg: dict, *, step: int, event: str, changes: list[str] = (),
                  forced: bool = False, checkpoint: str | None = None, weights: str | None = None) -> None:
    """Keep the run's configs: ``config.json`` is written once (the run's first config) and never
    replaced; every start or resume appends ``{"event", "step", "checkpoint", "changes", "forced",
    "init_weights_sha256", "time", "config"}`` to :data:`CONFIG_HISTORY`.

    Args:
        folder: the run folder.
        cfg: the config in force from now on (``to_dict`` form).
        step: the RL step the run starts from (0 for a fresh run).
        event: ``"start"``, ``"resume"`` or ``"restart"`` (``--resume`` of a run that saved no
            checkpoint: it starts again from step 0).
        changes: ``"key: old -> new"`` lines of a resume.
        forced: whether unsafe changes were accepted (``--force``).
        checkpoint: the checkpoint resumed from.
        weights: :func:`weights_fingerprint` of the initial model (``model.path``), if any.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    first = folder / "config.json"
    if not first.exists():
        first.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    rec = {"event": event, "step": step, "checkpoint": checkpoint, "changes": list(changes), "forced": forced,
           "init_weights_sha256": weights,
           "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "config": cfg}
    with open(folder / CONFIG_HISTORY, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec) + "\n")


def config_history(folder: str | os.PathLike) -> list[dict]:
    """The records of :func:`record_config`, oldest first (empty when there are none)."""
    path = Path(folder) / CONFIG_HISTORY
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ------------------------------------------------------------------------------------ fingerprints
#: weight files hashed by :func:`weights_fingerprint` in a model folder
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def weights_fingerprint(model) -> str | None:
    """``"sha256:<hex>"`` of a model's weights, or ``None`` when there are none to hash.

    - a folder: the bytes of its weight files (:data:`WEIGHT_PATTERNS`, sorted by name; each name and
      size is hashed too), so a folder whose weights were replaced gets another fingerprint;
    - a loaded model (a :class:`~maskrl.models.ModelAdapter` or ``torch.nn.Module``): every tensor of
      its ``state_dict`` (name, dtype, shape, bytes), as used (after any dtype cast);
    - anything else (a Hub id, a missing path): ``None``.
    """
    import torch

    from maskrl.scoring import sha256_update_file

    h = hashlib.sha256()
    if isinstance(model, (str, os.PathLike)):
        folder = Path(model)
        if not folder.is_dir():
            return None
        files = sorted({p for pat in WEIGHT_PATTERNS for p in folder.glob(pat) if p.is_file()})
        if not files:
            return None
        for p in files:
            h.update(f"{p.name}\0{p.stat().st_size}\0".encode())
            sha256_update_file(h, p)
        return "sha256:" + h.hexdigest()
    module = getattr(model, "model", model)
    if not isinstance(module, torch.nn.Module):
        return None
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + h.hexdigest()


# ------------------------------------------------------------------------------------ logs
def truncate_metrics(path: str | os.PathLike, step: int) -> int:
    """Keep only the rows of a ``metrics.jsonl`` with ``"step" <= step`` (a resumed run continues from
    there); the file is replaced atomically. A torn last line is dropped. Returns the rows removed."""
    path = Path(path)
    if not path.is_file():
        return 0
    keep, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] > step:
            dropped += 1
        else:
            keep.append(line)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
        os.replace(tmp, path)
    return dropped
