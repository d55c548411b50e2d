"""One run of the controlled table: the task's setup (its data splits, the cached SFT checkpoint and that
model's step-0 scores) and :func:`run`, which trains one (task, cell, seed), scores the splits the protocol
names and writes the run's record at once (the protocol: :mod:`controlled_table`'s docstring)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ablation_runs import ROOT, TaskSetup, already_recorded, update_results
from maskrl.config import to_dict
from maskrl.models import load_tiny
from maskrl.pipeline import load_policy, prompt_formatter
from maskrl.rundir import folder_lock
from maskrl.trainer import RLTrainer
from table_protocol import CELLS, run_key


class Setup(TaskSetup):
    """:class:`TaskSetup` whose model is the recipe's ``model.path`` when it names one (e.g. an 8B
    checkpoint; no SFT then), else the cached tiny SFT checkpoint."""

    def policy(self):
        if self.cfg.model.path:
            return load_policy(self.cfg)
        return load_tiny(self.ensure_sft())

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._sft_val: dict[str, dict] = {}

    def sft_val(self, policy, cfg) -> dict:
        """Validation metrics of ``policy``, the freshly loaded starting model (step 0 of every curve),
        under ``cfg``'s evaluation settings, scored once per setting: every cell of the task starts
        from the same checkpoint and greedy scoring draws nothing, so each run would recompute the
        same numbers."""
        key = json.dumps([to_dict(cfg.eval), cfg.model.chat_template], sort_keys=True, default=str)
        if key not in self._sft_val:
            self._sft_val[key] = self.evaluate(policy, cfg, self.val)
        return dict(self._sft_val[key])


def pos_table(setup: Setup, task: str, out: Path, samples: int) -> Path:
    """DTCA's offline POS table (docs/spec.md §3.1) of the task's SFT checkpoint, written once to ``out`` (processes
    side by side: the first estimates it, the others wait for it, :func:`maskrl.rundir.folder_lock`)."""
    with folder_lock(out.parent):
        if not out.is_file():
            from maskrl.pos import run_estimate

            model = setup.cfg.model.path or str(setup.ensure_sft())
            print(f"[table] POS table of {model} ({samples} samples) -> {out}", flush=True)
            run_estimate(model, setup.cfg.task.name, samples, str(out), progress=False)
    return out


def run_settings(overrides: list[str], val_size: int, eval_every: int, confirm_size: int = 0) -> dict:
    """The settings a recorded run must share with a resumed one (:func:`ablation_runs.already_recorded`);
    the confirmation size only where a confirmation split is scored (the older records have none)."""
    settings = {"overrides": overrides, "val_size": val_size, "eval_every": eval_every}
    if confirm_size:
        settings["confirm_size"] = confirm_size
    return settings


def run(setup: Setup, out: Path, task: str, name: str, recipe: Path, overrides: list[str], seed: int,
        eval_every: int, test: bool, runs_dir: Path, point: str = "", confirm: bool = False) -> dict | None:
    """Train one (task, cell, seed) run unless ``out`` records it already (as it is on disk now: other
    processes may be filling the same file); add its record to ``out`` at once.

    The validation curve is scored on the selection split (``setup.val``); with ``confirm`` the final
    model is also scored once on the confirmation split (``setup.confirm``), with ``test`` once on the
    test file. The record says which splits it scored (``scored_on``), how often it read the test file
    (``test_reads``, 0 unless ``test``) and the confirmation split (``confirmation_reads``), and carries
    :meth:`TaskSetup.provenance`; ``point`` (a grid point's label) goes into its key.
    """
    key = run_key(task, name, seed, point)
    settings = run_settings(overrides, len(setup.val), eval_every, len(setup.confirm) if confirm else 0)
    if already_recorded(out, key, settings, "table"):
        return None
    if confirm and not setup.confirm:
        raise SystemExit(f"error: {key}: no confirmation split to score (--confirm-size)")
    from maskrl.config import load_config

    cfg = load_config([recipe], overrides + [f"train.seed={seed}", f"output_dir={runs_dir / key.replace('/', '_')}",
                                             "train.save_every=0", f"train.eval_every={eval_every}"])
    policy = setup.policy()
    fmt = prompt_formatter(policy, cfg.model.chat_template)
    curve = [[0, setup.sft_val(policy, cfg)]]  # the SFT model: step 0 of every curve
    t0, c0 = time.time(), time.process_time()
    state = {}

    def eval_fn(step: int) -> dict:
        t, c = time.time(), time.process_time()
        m = setup.evaluate(state["trainer"].policy_eval, cfg, setup.val)
        curve.append([step, m])
        state["eval_seconds"] = state.get("eval_seconds", 0.0) + time.time() - t
        state["eval_cpu"] = state.get("eval_cpu", 0.0) + time.process_time() - c
        return m

    tr = RLTrainer(cfg, policy, setup.task, setup.train, prompt_fn=fmt, eval_fn=eval_fn if eval_every else None)
    state["trainer"] = tr
    hist = tr.train(progress=False)
    tr.close()
    if not curve or curve[-1][0] != tr.step_count:
        eval_fn(tr.step_count)
    rl_seconds = time.time() - t0 - state.get("eval_seconds", 0.0)
    # CPU seconds of this process (all threads): the budget on one core, robust to a loaded machine
    rl_cpu_seconds = time.process_time() - c0 - state.get("eval_cpu", 0.0)
    row = {"task": task, "cell": name, "kind": CELLS[name]["kind"], "base": CELLS[name]["base"], "seed": seed,
           "steps": tr.step_count, "optimizer_steps": tr.step_count * cfg.train.inner_iterations,
           "completions": tr.step_count * cfg.train.prompts_per_step * cfg.train.group_size,
           "rl_seconds": rl_seconds, "rl_cpu_seconds": rl_cpu_seconds, "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "val": curve[-1][1], "val_curve": curve, "rewards": [h["reward"] for h in hist],
           "recipe": str(recipe.relative_to(ROOT)) if recipe.is_relative_to(ROOT) else str(recipe), **settings}
    if point:
        row["grid_point"] = point
    mism = [h["rollout/mismatch"] for h in hist if "rollout/mismatch" in h]
    if mism:
        row["rollout_mismatch"] = mism
    row["scored_on"] = ["selection"]
    if confirm:
        row["confirmation"] = setup.evaluate(tr.policy_eval, cfg, setup.confirm)
        row["confirmation_reads"] = 1
        row["scored_on"].append("confirmation")
    row["test_reads"] = 0
    if test:
        row["test"] = setup.evaluate(tr.policy_eval, cfg, setup.test)
        row["test_source"], row["test_reads"] = setup.source, 1
        row["scored_on"].append("test")
    row["provenance"] = setup.provenance()
    update_results(out, lambda d: d["runs"].__setitem__(key, row))  # keeps other processes' records
    print(f"[table] {key}: val accuracy {row['val']['accuracy']:.3f} ({rl_seconds:.0f} s RL)", flush=True)
    return row


def pos_table_for(setup: Setup, task: str, names, pos_dir: Path, smoke: bool, samples: int) -> Path | None:
    """The POS table the cells ``names`` need (:func:`pos_table`, ``<pos_dir>/<task>_<SFT key>.json``;
    ``_smoke`` with ``smoke``), or None when none of them is a DTCA cell."""
    if any(e.get("pos_weights") == "<table>" for n in names for e in CELLS.get(n, {}).get("credit", [])):
        tag = "smoke" if smoke else setup.sft_dir.name
        return pos_table(setup, task, pos_dir / f"{task}_{tag}.json", samples)
    return None
