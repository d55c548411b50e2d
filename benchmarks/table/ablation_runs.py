"""What the controlled table's runs share (first written for the per-method ablations, whose scripts are
retired; see ``benchmarks/README.md``): one cached SFT checkpoint per task, generated validation splits
disjoint from the training rows and the test file, resumable per-run record files, mean and 95 %
t-intervals over seeds, and each record's provenance (hashes, code commit, software).

A *cell* is a recipe plus overrides; a *run* is (task, cell, seed, step budget). Every run starts
from the same SFT checkpoint, trains the same number of RL steps, and is scored greedily on the
validation split (and on the test file only when asked). Each finished run is written to its record
file at once, so an interrupted table resumes where it stopped.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from maskrl.records import portable
from typing import Callable

import torch

from maskrl.config import load_config
from maskrl.demo import sft_cache_key
from maskrl.evaluate import evaluate_examples
from maskrl.models import load_tiny, save_model
from maskrl.stats import t_interval as stats_t_interval
from maskrl.pipeline import PROMPT_CARD, load_policy, prompt_formatter, save_prompt_card, sft_from_config, task_and_data
from maskrl.rundir import folder_lock
from maskrl.trainer import RLTrainer

ROOT = Path(__file__).resolve().parents[2]
EVAL_KEYS = ("accuracy", "cell_accuracy", "mean_reward")


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95 % Student-t interval with the exact quantile (:func:`maskrl.stats.t_interval`;
    the mean alone for one value); NaN for a list holding a NaN (a field some records lack)."""
    if any(isinstance(v, float) and math.isnan(v) for v in values):
        return (float("nan"),) * 3
    return stats_t_interval(values)


def differences(d: list[float]) -> dict:
    """Differences ``d`` (one per seed, e.g. cell − base or final − SFT): their mean, 95 % t-interval
    (:func:`t_interval`) and how many are above / below zero."""
    m, lo, hi = t_interval(d)
    return {"mean": m, "ci95": [lo, hi], "positive": sum(x > 0 for x in d), "negative": sum(x < 0 for x in d)}


def format_differences(x: dict | None) -> str:
    """``+m [+lo, +hi] (p+/n−)`` for a :func:`differences` dict; ``–`` for none."""
    if not x:
        return "–"
    lo, hi = x["ci95"]
    return f"{x['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}] ({x['positive']}+/{x['negative']}−)"


def load_results(path: Path, must_exist: bool = False) -> dict:
    """The results file at ``path`` (``{"runs": {...}, ...}``); an empty one when it does not exist
    (unless ``must_exist``).

    Raises:
        SystemExit: the file is missing and ``must_exist``, or it is not a results file.
    """
    if not path.is_file():
        if must_exist:
            raise SystemExit(f"error: no results file {path}")
        return {"runs": {}}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"error: {path} is not a results file (not JSON: {e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), dict):
        raise SystemExit(f"error: {path} is not a results file (no 'runs' object)")
    return data


def save_results(path: Path, data: dict) -> None:
    """Write a results file with machine-independent paths (:func:`maskrl.records.portable`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(portable(data), indent=1) + "\n")
    os.replace(tmp, path)  # an interrupted write never leaves half a file


def already_recorded(path: Path, key: str, settings: dict, tag: str) -> bool:
    """Whether the results file at ``path`` (as it is on disk now) holds run ``key``, recorded with
    ``settings`` (printed as skipped under ``[tag]``).

    Raises:
        SystemExit: ``key`` is recorded with other values of ``settings`` (resuming would mix them).
    """
    old = load_results(path)["runs"].get(key)
    if old is None:
        return False
    settings = portable(settings)  # as the record names them
    if any(old.get(k) != v for k, v in settings.items()):
        raise SystemExit(f"error: run {key} is already in {path} with other settings "
                         f"({ {k: old.get(k) for k in settings} }; now {settings}): use another --out or remove it")
    print(f"[{tag}] {key}: recorded, skipped", flush=True)
    return True


def update_results(path: Path, change) -> dict:
    """Apply ``change(data)`` to the results file at ``path`` as it is on disk now, under an exclusive
    lock on its folder (:func:`maskrl.rundir.folder_lock`), and save it: several processes may record
    runs into one file side by side without losing each other's records. Returns the saved data.

    Raises:
        SystemExit: ``path`` holds something that is not a results file (:func:`load_results`).
    """
    with folder_lock(path.parent):
        data = load_results(path)
        change(data)
        save_results(path, data)
        return data


#: the selection split's generator seed (every choice: recipes, grid points) and the confirmation split's
#: (only final cells, scored once each); both are generated disjoint from training rows, the test file
#: and each other (TaskSetup)
SELECTION_SEED = 4242
CONFIRM_SEED = 5353


def file_sha256(path: Path) -> str:
    """Hex sha256 of the file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_sha256(folder: Path) -> str:
    """Hex sha256 over a saved model folder's weight files (``*.safetensors``, ``*.bin``; name and bytes,
    in sorted order): the identity of the weights, whatever the cache key of the settings says.

    Raises:
        FileNotFoundError: the folder holds no weight file.
    """
    files = sorted(p for p in Path(folder).rglob("*") if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not files:
        raise FileNotFoundError(f"no weight file (*.safetensors, *.bin) in {folder}")
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(folder)).encode() + b"\0" + file_sha256(p).encode())
    return h.hexdigest()


_CODE: dict | None = None


def code_version() -> dict:
    """``{"commit", "dirty"}`` of the checkout this process runs (``git rev-parse HEAD`` at the first call,
    and whether ``src/``, ``benchmarks/`` or ``configs/`` differ from it); ``commit`` None outside git."""
    global _CODE
    if _CODE is None:
        import subprocess

        try:
            commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                    check=True).stdout.strip()
            dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src", "benchmarks",
                                         "configs"], capture_output=True, text=True, check=True).stdout.strip())
        except (OSError, subprocess.CalledProcessError):
            commit, dirty = None, None
        _CODE = {"commit": commit, "dirty": dirty}
    return dict(_CODE)


def software() -> dict:
    """The torch version, CPU kernel set (``torch.backends.cpu.get_cpu_capability()``), thread count and
    processor (:func:`maskrl.machine.cpu_identity`): the key under which a record's last bits hold
    (:func:`maskrl.machine.float_key`; one kernel set on two processors can round differently)."""
    from maskrl.machine import cpu_identity

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "processor": cpu_identity()}


class TaskSetup:
    """Task, training rows, test file, selection split and (optionally) confirmation split of one task,
    and its SFT checkpoint.

    ``base_recipe`` decides the SFT model (its ``model``, ``sft``, ``task`` sections): every cell of
    the task must share them. The SFT checkpoint is cached under ``runs/<group>/<name>_sft/<hash>``.
    The *selection* split (``self.val``: every choice is made on it) is generated with ``val_seed``
    (``task.generate``, disjoint from the training and test rows) where the task has a generator, else
    the last ``val_size`` training rows, removed from training. The *confirmation* split
    (``self.confirm``, ``confirm_size`` rows, empty for 0: only final cells are scored on it, once each)
    is generated with ``confirm_seed`` disjoint from the training, test and selection rows (a fixed
    data set: the ``confirm_size`` training rows before the selection rows, removed from training).

    ``require_file``: the test file (whose rows every split excludes) must be a local file; without
    one (no ``../shared/data``, ``$MASKRL_DATA_DIR`` or ``task.data_path``) the pipeline would fall back
    to generated rows, which changes every split and every number.

    Raises:
        SystemExit: a task without a generator whose training rows cannot spare the held-out rows; or
            ``require_file`` and the evaluation rows are generated.
    """

    def __init__(self, name: str, base_recipe: Path, overrides: list[str], group: str, val_size: int,
                 val_seed: int = SELECTION_SEED, gen_kw: dict | None = None, log: Callable[[str], None] = print,
                 confirm_size: int = 0, confirm_seed: int = CONFIRM_SEED, require_file: bool = False):
        self.cfg = load_config([base_recipe], overrides)
        self.task, self.test, self.source, self.train = task_and_data(self.cfg)
        if require_file and not self.source.startswith("file:"):
            raise SystemExit(f"error: task {name}: no local data file (evaluation rows {self.source}); the splits "
                             "exclude the test file's rows, so generated stand-ins change every number. Put the data "
                             "in ../shared/data or $MASKRL_DATA_DIR, or pass --generated-data to run on generated rows")
        self.confirm: list = []
        if hasattr(self.task, "generate"):
            key = self.task.instance_key
            banned = {key(e) for e in self.test} | {key(e) for e in self.train}
            self.val = self.task.generate(val_size, seed=val_seed, exclude=banned, **(gen_kw or {}))
            if confirm_size:
                self.confirm = self.task.generate(confirm_size, seed=confirm_seed,
                                                  exclude=banned | {key(e) for e in self.val}, **(gen_kw or {}))
            split_source = "generated"
        else:  # a fixed data set (GSM8K, MATH): the held-out rows come out of the training rows
            if len(self.train) <= val_size + confirm_size:
                raise SystemExit(f"error: task {name}: {len(self.train)} training rows cannot spare {val_size} "
                                 f"selection + {confirm_size} confirmation rows (--val-size, --confirm-size)")
            self.train, self.val = self.train[:-val_size], self.train[-val_size:]
            if confirm_size:
                self.train, self.confirm = self.train[:-confirm_size], self.train[-confirm_size:]
            split_source = "held out of the training rows"
        self.splits = {"train": {"source": "generated" if hasattr(self.task, "generate") else "file",
                                 "seed": self.cfg.task.train_seed, "size": len(self.train)},
                       "selection": {"source": split_source, "seed": val_seed if split_source == "generated" else None,
                                     "size": len(self.val)},
                       "confirmation": ({"source": split_source, "seed": confirm_seed if split_source == "generated"
                                         else None, "size": len(self.confirm)} if confirm_size else None),
                       "test": {"source": self.source, "size": len(self.test)}}
        self.sft_dir = ROOT / "runs" / group / f"{name}_sft" / sft_cache_key(self.cfg)
        self.name, self.group, self.log = name, group, log
        self._sft_sha: str | None = None

    def data_provenance(self) -> dict:
        """Where the test file's rows (which every split excludes) came from: ``{"source": "file", "path",
        "sha256"}`` or ``{"source": "generated", "seed"}``."""
        if self.source.startswith("file:"):
            path = Path(self.source[len("file:"):])
            return {"source": "file", "path": str(path), "sha256": file_sha256(path) if path.is_file() else None}
        seed = self.source.partition("seed=")[2]
        return {"source": "generated", "seed": int(seed) if seed.isdigit() else seed}

    def sft_provenance(self) -> dict:
        """The starting checkpoint: ``{"path", "settings_key", "sha256"}`` of the cached SFT folder (the
        weights' hash, :func:`checkpoint_sha256`), or ``{"model"}`` for a recipe's own checkpoint."""
        if self.cfg.model.path:
            return {"model": str(self.cfg.model.path), "sha256": None}
        folder = self.ensure_sft()
        if self._sft_sha is None:
            self._sft_sha = checkpoint_sha256(folder)
        rel = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
        return {"path": str(rel), "settings_key": folder.name, "sha256": self._sft_sha}

    def provenance(self) -> dict:
        """Everything a record needs to be traced: the SFT checkpoint, the data source, the splits (names,
        seeds, sizes), the code commit and the software (:func:`code_version`, :func:`software`)."""
        return {"sft": self.sft_provenance(), "data": self.data_provenance(), "splits": self.splits,
                "code": code_version(), **software()}

    def ensure_sft(self) -> Path:
        """Train the SFT checkpoint unless it is cached (only when a run or table needs it); its folder."""
        name, group, log = self.name, self.group, self.log
        with folder_lock(self.sft_dir.parent):  # processes side by side: the first trains it, the others wait
            if not (self.sft_dir / "maskrl_sft.json").is_file():
                log(f"[{group}] SFT {name} ({self.cfg.sft.steps} steps, minutes on CPU; --set sft.steps=N for a "
                    f"smoke run) -> {self.sft_dir}")
                policy = load_policy(self.cfg)
                hist = sft_from_config(self.cfg, policy, self.task, self.train, progress=False)
                save_model(policy, self.sft_dir)
                (self.sft_dir / "maskrl_sft.json").write_text(json.dumps({"steps": self.cfg.sft.steps,
                                                                          "last": hist[-1] if hist else {}}))
            if not (self.sft_dir / PROMPT_CARD).is_file():  # how it was trained (maskrl eval, estimate-pos-weights)
                save_prompt_card(self.sft_dir, self.task, self.cfg.model.chat_template, self.cfg.eval)
        return self.sft_dir

    def evaluate(self, policy, cfg, rows) -> dict:
        fmt = prompt_formatter(policy, cfg.model.chat_template)
        m = evaluate_examples(policy, self.task, rows, cfg.eval, batch_size=250, prompt_fn=fmt).metrics
        return {k: m[k] for k in EVAL_KEYS if k in m}

    def trainer(self, recipe: Path, overrides: list[str]) -> RLTrainer:
        """An RL trainer of ``recipe`` + ``overrides`` on the SFT checkpoint."""
        cfg = load_config([recipe], overrides)
        policy = load_tiny(self.ensure_sft())
        return RLTrainer(cfg, policy, self.task, self.train, prompt_fn=prompt_formatter(policy, cfg.model.chat_template))


