"""What every ablation benchmark shares (``daca_ablation.py``, ``dispo_ablation.py``,
``dtca_ablation.py``): one cached SFT checkpoint per task, a generated validation split disjoint
from the training rows and the test file, resumable per-run results, mean and 95 % t-intervals
over seeds, and curve plots.

A *cell* is a recipe plus overrides; a *run* is (task, cell, seed, step budget). Every run starts
from the same SFT checkpoint, trains the same number of RL steps, and is scored greedily on the
validation split (and on the test file only with ``--test``). Each finished run is written to the
JSON at once, so an interrupted ablation resumes where it stopped.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
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

ROOT = Path(__file__).resolve().parents[1]
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


def merge_results(data: dict, parts: str, extra_keys: tuple[str, ...] = ()) -> dict:
    """Fold the comma-separated result files ``parts`` into ``data`` (runs, and each of
    ``extra_keys``' mappings). Raises SystemExit for a missing or malformed file."""
    for part in [p for p in parts.split(",") if p]:
        other = load_results(Path(part), must_exist=True)
        data["runs"].update(other["runs"])
        for k in extra_keys:
            data.setdefault(k, {}).update(other.get(k, {}))
    return data


def require_runs(data: dict, out: Path) -> None:
    """A summary of nothing is a mistake (a mistyped --out or --merge path): SystemExit."""
    if not data["runs"]:
        raise SystemExit(f"error: no runs in {out} (nor in the --merge files); nothing to summarise")


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


def ablation_parser(doc: str, tasks: str, out_name: str, merge: bool = True) -> argparse.ArgumentParser:
    """The options every ablation script takes (each adds its cells and ``--steps``)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=tasks)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--val-size", type=int, default=300)
    ap.add_argument("--test", action="store_true", help="also score the test file (final table only)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / out_name))
    if merge:
        ap.add_argument("--merge", default="", help="comma-separated result files to merge into --out (with --summary)")
    ap.add_argument("--summary", action="store_true", help="only (re)write the summary and the PNG")
    return ap


def start(args: argparse.Namespace, extra_keys: tuple[str, ...] = ()) -> tuple[Path, dict, list[int], list[str]]:
    """Set the thread count; ``(out path, results with --merge folded in, seeds, tasks)``."""
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    data = merge_results(load_results(out), getattr(args, "merge", ""), extra_keys)
    return out, data, [int(s) for s in args.seeds.split(",") if s != ""], [t for t in args.tasks.split(",") if t]


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


def run_cell(setup: TaskSetup, data: dict, out: Path, task: str, cell: str, recipe: Path, overrides: list[str],
             steps: int, seed: int, test: bool, curves: Callable[[list[dict]], dict] | None = None, group: str = "ablation",
             row_extra: dict | None = None) -> dict | None:
    """Train one run (unless ``key`` is in ``data["runs"]``), score it, write it to ``out`` at once.

    ``curves(history)`` returns per-step series to keep (default: the rollout reward as ``rewards``).
    The run's key is ``<task>/<cell>/seed<seed>/steps<steps>``. Returns the new row, or None when
    the run was already done with the same overrides and validation size.

    Raises:
        SystemExit: the key is in ``data`` with other overrides or another validation size (resuming
            would mix settings; use another --out or remove the run).
    """
    key = f"{task}/{cell}/seed{seed}/steps{steps}"
    if key in data["runs"]:
        old = data["runs"][key]
        if old.get("overrides") != overrides or old.get("val_size") != len(setup.val):
            raise SystemExit(f"error: run {key} is already in {out} with other settings (overrides "
                             f"{old.get('overrides')}, val size {old.get('val_size')}; now {overrides}, "
                             f"{len(setup.val)}): use another --out, or remove that run to redo it")
        print(f"[{group}] {key}: already in {out}, skipped", flush=True)
        return None
    over = overrides + [f"train.steps={steps}", f"train.seed={seed}",
                        f"output_dir={ROOT / 'runs' / group / key.replace('/', '_')}",
                        "train.eval_every=0", "train.save_every=0"]
    t0 = time.time()
    tr = setup.trainer(recipe, over)
    hist = tr.train(progress=False)
    tr.close()
    secs = time.time() - t0
    row = {"task": task, "cell": cell, "seed": seed, "steps": steps, "rl_seconds": secs, "val": setup.evaluate(tr.policy_eval, tr.cfg, setup.val),
           "val_size": len(setup.val), "rewards": [h["reward"] for h in hist],
           "recipe": str(Path(recipe).resolve().relative_to(ROOT)), "overrides": overrides,
           "optimizer_steps": steps * tr.cfg.train.inner_iterations, **(row_extra or {})}
    if curves is not None:
        row.update(curves(hist))
    if test:
        row["test"] = setup.evaluate(tr.policy_eval, tr.cfg, setup.test)
        row["test_source"] = setup.source
    data["runs"][key] = row
    save_results(out, data)  # each finished run at once: an interrupted ablation resumes
    print(f"[{group}] {key}: val accuracy {row['val']['accuracy']:.3f} ({secs:.0f} s)", flush=True)
    return row


def summary_rows(data: dict, metrics: tuple[str, ...] = ("accuracy", "mean_reward")) -> list[dict]:
    """Per (task, cell, steps): seeds, and mean and 95 % t-interval of each metric per split."""
    groups: dict[tuple, list[dict]] = {}
    for row in data["runs"].values():
        groups.setdefault((row["task"], row["cell"], row["steps"]), []).append(row)
    summary = []
    for (task, cell, steps), rows in sorted(groups.items()):
        entry = {"task": task, "cell": cell, "steps": steps, "seeds": sorted(r["seed"] for r in rows)}
        for split in ("val", "test"):
            if all(split in r for r in rows):
                entry[split] = {}
                for metric in metrics:
                    if all(metric in r[split] for r in rows):
                        m, lo, hi = t_interval([r[split][metric] for r in rows])
                        entry[split][f"{metric}_mean"] = m
                        entry[split][f"{metric}_ci95"] = [lo, hi]
        summary.append(entry)
    return summary


def plot_curves(data: dict, path: Path, series: dict[str, str]) -> None:
    """One panel per (task, series): the seed-mean curve of each (cell, steps). ``series`` maps a
    run-row key holding a per-step list to its axis label."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    groups: dict[tuple, list[dict]] = {}
    for row in data["runs"].values():
        groups.setdefault((row["task"], row["cell"], row["steps"]), []).append(row)
    tasks = sorted({t for t, _, _ in groups})
    if not tasks:
        return
    fig, axes = plt.subplots(len(series), len(tasks), figsize=(6 * len(tasks), 3.6 * len(series)), squeeze=False)
    for j, task in enumerate(tasks):
        for i, (key, label) in enumerate(series.items()):
            ax = axes[i][j]
            for (t, cell, steps), rows in sorted(groups.items()):
                curves = [r[key] for r in rows if t == task and key in r]
                if not curves:
                    continue
                n = min(len(c) for c in curves)
                ax.plot(range(1, n + 1), [sum(c[s] for c in curves) / len(curves) for s in range(n)],
                        label=f"{cell}, {steps} steps ({len(curves)} seeds)")
            ax.set_title(task)
            ax.set_xlabel("RL step")
            ax.set_ylabel(label)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
