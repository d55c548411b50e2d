"""The controlled table: every base × credit module, their compositions and cached rollouts under one
protocol, on one SFT checkpoint per task; the tuning grid and confirmation runs behind its verdicts.

Protocol
- Per task one base recipe (``configs/table/<task>.yaml``: model, task, SFT, samplers, the RL
  budget). A *cell* replaces whole component sections of it (``objective``, ``likelihood``,
  ``credit``) and may set ``rollout`` / ``train`` fields (:data:`CELLS`; ``--list`` prints them).
- Every cell of a task starts from the same SFT checkpoint (cached by its settings' hash) and runs
  the same number of RL steps with the same prompts per step, group size and μ = 1: the same
  completions and the same optimizer steps (``diffu_grpo_mf_mu4`` is the one exception, d1's
  inner iterations, with 4× the optimizer steps; it is labelled).
- Cells are paired by seed: ``train.seed = s`` fixes the prompt order and the rollout generator's
  seed, so seed s of every cell sees the same prompts (rollouts then differ as the models do).
- Two validation splits, generated disjoint from the training rows, the test file and each other:
  the *selection* split (300 rows, seed 4242; every choice is made on it) is scored greedily every
  ``--eval-every`` RL steps and at the end (the curve starts at the SFT model, step 0); the
  *confirmation* split (500 rows, seed 5353) scores only the final models of ``--confirm``, once each.
  The test file only with ``--test``, once per run at its end. Each record says which splits it scored
  (``scored_on``), how often it read the test file (``test_reads``, 0 written out) and the confirmation
  split, and carries its provenance: the SFT weights' sha256, the test file's path and sha256 (or
  ``generated`` and its seed), the splits' seeds and sizes, the code commit, the torch version and CPU
  kernel set (:meth:`ablation_runs.TaskSetup.provenance`). Without a local data file the table stops
  unless ``--generated-data`` asks for generated rows (they change every split and every number).
- ``--grid FAMILY``: each base and its credit arms (:data:`GRID_FAMILIES`) over the same learning-rate
  grid (:data:`GRID_LRS`, and β where the base has one) on the selection split, seeds 0 and 1
  (``results/grid/<task>_<family>.json``), extended one rung of :data:`LR_LADDER` at a time while an
  arm's best point lies at the grid's lowest or highest rate (``--no-extend``: not); ``--confirm
  FAMILY``: each arm at its own best grid point (:func:`best_points`) on 10 fresh paired seeds, scored
  once on the confirmation split (``results/confirm/<task>_<family>.json``, with the SFT model's
  confirmation score); ``--test-final FAMILY``, once every recipe is fixed: the test file read once per
  arm, by its first confirmation seed retrained (``results/test/<task>_<family>.json``). The
  cached-rollout pair (family ``cache``) has no grid: both samplers run at the state base's best point.
- ``--verdicts`` regenerates the top of ``docs/results.md``: for each headline claim (:data:`CLAIMS`)
  the paired difference with its exact t-interval, the paired-t and exact sign-flip p-values
  Holm-corrected over the family, and a verdict (:func:`verdict`), from the confirmation records where
  they exist, else the selection records (marked); the headline figure; generated readings.
- One JSON record per run, written as soon as it finishes (``--out``, default the committed
  ``results/controlled_table.json``): an interrupted table resumes, and the table can be finished
  over several sessions. ``--summary`` regenerates ``docs/results.md`` (markdown) and the curve
  plot from the records alone.

Statistics per cell: mean and 95 % t-interval (exact quantile, ``maskrl.stats``) over seeds of the solved rate and the task's reward
metric (Sudoku: cell accuracy), the paired difference to the cell's base row (same seeds) with its
interval and sign count, the area under the validation curve (trapezoid over steps, divided by the
steps: the mean accuracy along the run) and the first evaluated step at which the seed-mean curve
reaches the base's final accuracy, and the RL wall time.

    python benchmarks/controlled_table.py --tasks sudoku --seeds 0,1,2,3,4            # the CPU table
    python benchmarks/controlled_table.py --summary                                    # docs/results.md
    python benchmarks/controlled_table.py --smoke --out /tmp/table_smoke.json          # every cell, 1 step
    python benchmarks/controlled_table.py --tasks sudoku --grid spg --confirm spg      # fair bases: grid, confirmation
    python benchmarks/controlled_table.py --verdicts                                   # the headline page
    python benchmarks/controlled_table.py --recipes 8b --tasks gsm8k,math500,countdown,sudoku --seeds 0,1,2
        # the GPU cells: the same cells at the papers' shapes (LLaDA-8B-Instruct, L 256, block 32)
    python benchmarks/controlled_table.py --base gsm8k=configs/llada8b_gsm8k_diffu_grpo.yaml --tasks gsm8k ...
        # the same cells over any other base recipe: --base TASK=YAML

GPU cells (``--recipes 8b``): each task's base becomes its shipped LLaDA-8B-Instruct recipe
(:data:`RECIPES_8B`: model, LoRA, dtype, checkpointing, task, sampler and evaluation at L 256 / block 32,
batch and learning rate) with the protocol pinned (:func:`gpu_base`: μ = 1, the fixed schedule at L/2
steps, no KV cache, no credit module -- each cell brings its own); the model is the recipe's checkpoint
(no SFT); GSM8K and MATH500, which have no generator, hold their validation rows out of the training
split. Records go to ``results/controlled_table_8b.json`` unless ``--out`` says otherwise. Every
resolved GPU cell is checked by config validation, and every cell by a dry run on the plan's stand-in
model, in ``tests/test_controlled_table.py``.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch
import yaml

from ablation_runs import (ROOT, TaskSetup, already_recorded, checkpoint_sha256, code_version, differences,
                          format_differences, load_results,
                          save_results,
                          t_interval, update_results)
from maskrl.config import to_dict
from maskrl.evaluate import evaluate_examples
from maskrl.models import load_tiny
from maskrl.pipeline import load_policy, prompt_formatter
from maskrl.trainer import RLTrainer

OUT = ROOT / "results" / "controlled_table.json"
OUT_8B = ROOT / "results" / "controlled_table_8b.json"
DOC = ROOT / "docs" / "results.md"
BASES = {task: ROOT / "configs" / "table" / f"{task}.yaml" for task in ("sudoku", "countdown", "wordmath")}
#: the shipped LLaDA-8B-Instruct recipe each task's GPU cells start from (``--recipes 8b``, :func:`gpu_base`)
RECIPES_8B = {"gsm8k": ROOT / "configs" / "llada8b_gsm8k_diffu_grpo.yaml",
              "math500": ROOT / "configs" / "llada8b_math500_rldf.yaml",
              "countdown": ROOT / "configs" / "llada8b_countdown_daca_wd1.yaml",
              "sudoku": ROOT / "configs" / "llada8b_sudoku_dispo_diffu_grpo.yaml"}
GEN_KW = {"sudoku": {"blanks": (8, 8)}}  # the test file's 500 puzzles all have 8 blanks
SMOKE = ["sft.steps=2", "train.prompts_per_step=2", "train.group_size=2", "train.micro_batch_size=0",
         "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.intermediate_size=64"]

# -- component sections (whole-section replacements) -------------------------------------------
MF = {"name": "mean_field", "p_mask_prompt": 0.15}
STATE = {"name": "state", "p_mask_prompt": 0.15}
DIFFU = {"name": "diffu_grpo", "clip_eps": 0.5, "beta": 0.04}
SML_MIX = {"name": "stratified", "k": 4, "layout": "random", "full": 0.5, "sml": 0.5, "p_mask_prompt": 0.15}  # SPEC §2.2
SML_WD1 = {"name": "stratified", "k": 4, "layout": "random", "full": 1.0, "sml": 1.0, "p_mask_prompt": 0.15}
DPS = {"name": "dps", "lam": 0.5, "dps_target": "confidence", "dps_scope": "all", "dps_normalize": "auto", "clip": 2.0}
DISPO = {"name": "dispo", "z": 2, "timing": "late", "power": 4.0, "alpha_base": 1.0, "alpha_step": 0.1, "clip_eps": 0.5,
         "p_mask_prompt": 0.15}  # SPEC §4, alpha_step 0.1 after SFT
RLDF_STEPS = {"name": "rldf_steps", "k": 4, "temperature": 1.0, "keep_threshold": 0.6}  # SPEC §1.5 rldf
THRESHOLD = {"schedule": "threshold", "threshold": 0.9}
ELBO = {"name": "elbo", "nodes": 2, "draws": 1}
SPG_BOUNDS = {"name": "spg_bounds", "nodes": 2, "draws": 1, "masking": "block", "block_length": 0, "eubo_beta": 1.5,
              "p_mask_prompt": 0.0}


def dtca(pos: bool = True, calibration: bool = True) -> dict:
    """DTCA's credit entry (SPEC §3); ``pos_weights`` is filled in per task (:func:`pos_table`)."""
    return {"name": "dtca", "coverage": 0.7, "min_steps": 2, "max_steps": 32, "pos_credit": pos, "calibration": calibration,
            "keep_threshold": 0.6, "pos_weights": "<table>", "tagger": "maskrl.pos:spacy_pos_classes"}


def cell(kind: str, base: str | None, objective: dict, likelihood: dict, credit: list | None = None,
         rollout: dict | None = None, train: dict | None = None, note: str = "") -> dict:
    return {"kind": kind, "base": base, "objective": objective, "likelihood": likelihood, "credit": credit or [],
            "rollout": rollout or {}, "train": train or {}, "note": note}


#: every cell: its kind, the cell its paired difference is taken against, and its sections
CELLS: dict[str, dict] = {
    # bases (SPEC §1.5, §2.3)
    "diffu_grpo_mf": cell("base", None, DIFFU, MF, note="d1: mean-field likelihood"),
    "diffu_grpo_mf_mu4": cell("base", "diffu_grpo_mf", DIFFU, MF, train={"inner_iterations": 4},
                              note="d1's inner iterations: 4x the optimizer steps of every other cell"),
    "diffu_grpo_state": cell("base", None, DIFFU, STATE, note="each token at the state that committed it"),
    "wd1": cell("base", None, {"name": "wd1"}, MF),
    "gdpo": cell("base", None, {"name": "gdpo"}, ELBO),
    "spg": cell("base", None, {"name": "spg", "omega": 0.5}, SPG_BOUNDS),
    "rldf": cell("base", None, {"name": "rldf"}, {"name": "state", "p_mask_prompt": 0.0}, [RLDF_STEPS], rollout=THRESHOLD),
    "justgrpo": cell("base", None, DIFFU, STATE, rollout={"block_length": 1}, note="left to right, one token per step"),
    # seed methods on the bases their papers use
    "dps@diffu_grpo_mf": cell("method", "diffu_grpo_mf", DIFFU, MF, [DPS]),
    "dps@diffu_grpo_state": cell("method", "diffu_grpo_state", DIFFU, STATE, [DPS]),
    "dps@wd1": cell("method", "wd1", {"name": "wd1"}, MF, [DPS]),
    "dps@gdpo": cell("method", "gdpo", {"name": "gdpo"}, ELBO, [DPS]),
    "sml@diffu_grpo": cell("method", "diffu_grpo_mf", DIFFU, SML_MIX),
    "sml@wd1": cell("method", "wd1", {"name": "wd1"}, SML_WD1),
    "dispo@diffu_grpo_state": cell("method", "diffu_grpo_state", DIFFU, STATE, [DISPO]),
    "dispo@spg": cell("method", "spg", {"name": "spg", "omega": 0.5}, SPG_BOUNDS, [DISPO]),
    "dispo-kl@spg": cell("method", "spg", {"name": "spg", "omega": 0.5}, SPG_BOUNDS,
                         [{**DISPO, "beta": 0.0, "p_mask_prompt": 0.0}],
                         note="DiSPO's step term without the KL to the reference (beta 0) and prompt masking (0) it "
                              "adds over SPG: the branch credit alone (the control of dispo@spg)"),
    "dtca@rldf": cell("method", "rldf", {"name": "rldf"}, {"name": "state", "p_mask_prompt": 0.0}, [dtca()],
                      rollout=THRESHOLD),
    "dtca-cal@rldf": cell("method", "rldf", {"name": "rldf"}, {"name": "state", "p_mask_prompt": 0.0},
                          [dtca(calibration=False)], rollout=THRESHOLD, note="DTCA without entropy-flow calibration"),
    "dtca-pos@rldf": cell("method", "rldf", {"name": "rldf"}, {"name": "state", "p_mask_prompt": 0.0},
                          [dtca(pos=False)], rollout=THRESHOLD, note="DTCA without in-step POS credit"),
    # compositions no paper reports
    "dps+dispo@diffu_grpo_state": cell("composition", "diffu_grpo_state", DIFFU, STATE, [DPS, DISPO]),
    "sml+dispo@diffu_grpo": cell("composition", "sml@diffu_grpo", DIFFU, SML_MIX, [DISPO]),
    "dtca_steps+dps@rldf": cell("composition", "rldf", {"name": "rldf"}, {"name": "state", "p_mask_prompt": 0.0},
                                [DPS, dtca(pos=False, calibration=False)], rollout=THRESHOLD,
                                note="DTCA's step selection alone, with DPS token credit (DPS first: DTCA "
                                     "trains its states on the advantages it receives)"),
    # rollouts: four blocks, with and without the dual KV cache
    "diffu_grpo_state@4blocks": cell("rollout", "diffu_grpo_state", DIFFU, STATE, rollout={"blocks": 4}),
    "diffu_grpo_state@4blocks+dual": cell("rollout", "diffu_grpo_state@4blocks", DIFFU, STATE,
                                          rollout={"blocks": 4, "cache": "dual", "mismatch_every": 5}),
}
#: cells of the second task (the bases, each seed method on its paper's base, the compositions)
SECOND_TASK = [c for c in CELLS if c not in ("diffu_grpo_state@4blocks", "diffu_grpo_state@4blocks+dual",
                                              "dps@diffu_grpo_state", "diffu_grpo_mf_mu4", "dispo-kl@spg")]
#: cells a task runs when --cells is not given: every cell but the grid's controls (DEFAULT_FIRST on the
#: first task, SECOND_TASK on the others): the committed tables' documented commands keep their meaning
DEFAULT_FIRST = [c for c in CELLS if c != "dispo-kl@spg"]


def cell_recipe(base_yaml: Path, name: str, pos_weights: Path | None, out_dir: Path) -> Path:
    """Write the resolved recipe of cell ``name`` over ``base_yaml`` to ``out_dir`` and return its path.

    Raises:
        SystemExit: an unknown cell (lists the known ones), or a DTCA cell without a POS table.
    """
    if name not in CELLS:
        raise SystemExit(f"error: unknown cell {name!r}; known: {', '.join(CELLS)}")
    spec = CELLS[name]
    data = yaml.safe_load(base_yaml.read_text())
    for section in ("objective", "likelihood"):
        data[section] = copy.deepcopy(spec[section])
    credit = copy.deepcopy(spec["credit"])
    for entry in credit:
        if entry.get("pos_weights") == "<table>":
            if pos_weights is None:
                raise SystemExit(f"error: cell {name} needs a POS table (DTCA, SPEC §3.1)")
            entry["pos_weights"] = str(pos_weights.resolve())
    data["credit"] = credit
    for section in ("rollout", "train"):
        data.setdefault(section, {}).update(spec[section])
    blocks = data["rollout"].pop("blocks", None)  # "n blocks" whatever the base's L (4 of 16 tokens, 4 of 256)
    if blocks:
        data["rollout"]["block_length"] = data["rollout"]["gen_length"] // blocks
    if "block_length" in spec["rollout"] and spec["rollout"]["block_length"] == 1:  # JustGRPO: steps = L
        data["rollout"]["steps"] = data["rollout"]["gen_length"]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{base_yaml.stem}__{name.replace('@', '_at_').replace('+', '_and_')}.yaml"
    path.write_text(f"# controlled table cell {name} over {base_yaml.name} (benchmarks/controlled_table.py)\n"
                    + yaml.safe_dump(data, sort_keys=False))
    return path


def gpu_base(task: str, out_dir: Path) -> Path:
    """Write the GPU table base of ``task`` to ``out_dir`` and return its path: the shipped 8B recipe
    :data:`RECIPES_8B` ``[task]`` with what every cell of a table shares pinned (the module docstring):
    ``train.inner_iterations`` 1, ``rollout.schedule`` fixed at ``gen_length // 2`` steps (SPEC §1.2,
    d1's 2 tokens per step), ``rollout.cache`` none, no credit module. Everything else (model, LoRA,
    dtype, checkpointing, task, L, block, τ, evaluation, batch, learning rate) is the recipe's.

    Raises:
        SystemExit: a task without a shipped 8B recipe (lists the known ones).
    """
    if task not in RECIPES_8B:
        raise SystemExit(f"error: no 8B recipe for task {task!r}; known: {', '.join(RECIPES_8B)}")
    src = RECIPES_8B[task]
    data = yaml.safe_load(src.read_text())
    ro = data.setdefault("rollout", {})
    ro.update({"schedule": "fixed", "steps": ro["gen_length"] // 2, "cache": "none"})
    ro.pop("threshold", None)
    data.setdefault("train", {})["inner_iterations"] = 1
    data["credit"] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"table8b_{task}.yaml"
    path.write_text(f"# controlled table GPU base of {task}: {src.name} with the protocol pinned "
                    "(benchmarks/controlled_table.py gpu_base)\n" + yaml.safe_dump(data, sort_keys=False))
    return path


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
    """DTCA's offline POS table (SPEC §3.1) of the task's SFT checkpoint, written once to ``out``."""
    if not out.is_file():
        from maskrl.pos import run_estimate

        model = setup.cfg.model.path or str(setup.ensure_sft())
        print(f"[table] POS table of {model} ({samples} samples) -> {out}", flush=True)
        run_estimate(model, setup.cfg.task.name, samples, str(out), progress=False)
    return out


def run_key(task: str, name: str, seed: int, point: str = "") -> str:
    """A record's key: ``<task>/<cell>/seed<s>``, with the grid point (``lr=...``) before the seed in a grid file."""
    return f"{task}/{name}/" + (f"{point}/" if point else "") + f"seed{seed}"


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


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------
def curve_area(curve: list) -> float:
    """Trapezoid area under accuracy-vs-step divided by the last step (the run's mean accuracy)."""
    pts = [(s, m["accuracy"]) for s, m in curve]
    if len(pts) < 2 or pts[-1][0] == 0:
        return pts[-1][1] if pts else float("nan")
    area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in zip(pts, pts[1:]))
    return area / pts[-1][0]


def mean_curve(rows: list[dict]) -> list[tuple[int, float]]:
    """Seed-mean accuracy at the evaluation steps every run shares."""
    steps = sorted(set.intersection(*[{s for s, _ in r["val_curve"]} for r in rows]))
    return [(s, sum(dict((a, m["accuracy"]) for a, m in r["val_curve"])[s] for r in rows) / len(rows)) for s in steps]


def paired(rows: dict[int, dict], base: dict[int, dict], split: str, metric: str) -> dict | None:
    """Paired (same seed) difference cell − base: mean, 95 % t-interval, signs, seeds."""
    seeds = sorted(s for s in rows if s in base and split in rows[s] and split in base[s] and metric in rows[s][split])
    if not seeds:
        return None
    return {**differences([rows[s][split][metric] - base[s][split][metric] for s in seeds]), "seeds": seeds}


def summarize(data: dict) -> list[dict]:
    """One entry per (task, cell) with every statistic of the module docstring."""
    by: dict[tuple[str, str], dict[int, dict]] = {}
    for r in data["runs"].values():
        by.setdefault((r["task"], r["cell"]), {})[r["seed"]] = r
    out = []
    for (task, name), rows in sorted(by.items(), key=lambda kv: (kv[0][0], list(CELLS).index(kv[0][1]) if kv[0][1] in CELLS else 99)):
        entry = {"task": task, "cell": name, "kind": CELLS.get(name, {}).get("kind"), "base": CELLS.get(name, {}).get("base"),
                 "seeds": sorted(rows), "rl_seconds": t_interval([r["rl_seconds"] for r in rows.values()])[0],
                 "rl_cpu_seconds": t_interval([r.get("rl_cpu_seconds", float("nan")) for r in rows.values()])[0],
                 "optimizer_steps": sorted({r["optimizer_steps"] for r in rows.values()}),
                 "completions": sorted({r["completions"] for r in rows.values()})}
        metrics = [k for k in ("accuracy", "cell_accuracy", "mean_reward") if all(k in r["val"] for r in rows.values())]
        for split in ("val", "test"):
            if all(split in r for r in rows.values()):
                entry[split] = {}
                for k in metrics:
                    m, lo, hi = t_interval([r[split][k] for r in rows.values()])
                    entry[split][k] = {"mean": m, "ci95": [lo, hi]}
        entry["sft_val_accuracy"] = t_interval([r["val_curve"][0][1]["accuracy"] for r in rows.values()])[0]
        entry["val_auc"] = t_interval([curve_area(r["val_curve"]) for r in rows.values()])[0]
        base = by.get((task, entry["base"])) if entry["base"] else None
        if base:
            for split in ("val", "test"):
                p = paired(rows, base, split, "accuracy")
                if p:
                    entry[f"paired_{split}"] = p
            target = mean_curve(list(base.values()))[-1][1]
            entry["steps_to_base_final"] = next((s for s, a in mean_curve(list(rows.values())) if a >= target - 1e-12), None)
        mism = [sum(r["rollout_mismatch"]) / len(r["rollout_mismatch"]) for r in rows.values() if r.get("rollout_mismatch")]
        if mism:  # cached rollouts: the mean |log commit_prob - log p_theta| (nats) of each run, over seeds
            m, lo, hi = t_interval(mism)
            entry["rollout_mismatch"] = {"mean": m, "ci95": [lo, hi], "seeds": len(mism)}
        gain = paired(rows, {s: {"val": {"accuracy": r["val_curve"][0][1]["accuracy"]}} for s, r in rows.items()}, "val", "accuracy")
        entry["gain_over_sft_val"] = gain
        out.append(entry)
    return out


def _ci(x: dict | None, digits: int = 3) -> str:
    if not x:
        return "–"
    lo, hi = x["ci95"]
    return f"{x['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _reach(e: dict) -> str:
    if "steps_to_base_final" not in e:
        return "–"  # a base row: nothing to reach
    s = e["steps_to_base_final"]
    return "not reached" if s is None else str(s)


BEGIN, END = "<!-- controlled-table:begin -->", "<!-- controlled-table:end -->"


def is_main_table(out: Path) -> bool:
    """Whether record file ``out`` is :data:`OUT`, the table whose block and plot keep their plain names."""
    return out.resolve() == OUT.resolve()


def plot_path(doc: Path, out: Path) -> Path:
    """Where record file ``out``'s curves go beside ``doc``: ``<doc>.png`` for :data:`OUT`, else
    ``<doc>_<out stem>.png``."""
    return doc.with_suffix(".png") if is_main_table(out) else doc.with_name(f"{doc.stem}_{out.stem}.png")


def markers(out: Path) -> tuple[str, str]:
    """The begin / end markers of record file ``out``'s block in the results page: :data:`BEGIN` /
    :data:`END` for :data:`OUT`, ``<!-- controlled-table:<stem>:begin -->`` / ``...:end -->`` for any
    other file (the 8B table, a table on another recipe), so summarising one file never replaces
    another's table."""
    if is_main_table(out):
        return BEGIN, END
    return f"<!-- controlled-table:{out.stem}:begin -->", f"<!-- controlled-table:{out.stem}:end -->"


def write_doc(path: Path, table: str, marks: tuple[str, str] = (BEGIN, END)) -> None:
    """Put ``table`` between the ``marks`` (begin, end) of ``path`` (the rest of the file is
    hand-written and kept); a file without them gets them appended."""
    begin, end = marks
    text = path.read_text() if path.is_file() else "# Results\n\n"
    block = f"{begin}\n{table}{end}"
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def markdown(summary: list[dict], out: Path = OUT, runs: dict | None = None, figure: str = "") -> str:
    """The table of :func:`summarize`, one section per task, headed by the command that regenerates
    it from record file ``out``; for a file other than :data:`OUT`, also the ``--set`` overrides its
    ``runs`` were recorded with (one line per task and distinct list); ``figure``: the curve plot's file
    name beside the page, linked under the header."""
    rel = out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out
    default = is_main_table(out)
    cmd = "python benchmarks/controlled_table.py --summary" + ("" if default else f" --out {rel}")
    lines = ["## The controlled table" if default else f"## The controlled table: `{rel}`", "",
             f"Generated by `{cmd}` from the committed records in "
             f"`{rel}`; do not edit between the markers. Protocol: the docstring of "
             "`benchmarks/controlled_table.py`. Intervals are 95 % Student-t over seeds; *paired* is the same-seed "
             "difference to the cell's base row (seeds above / below zero); *AUC* the mean validation accuracy along "
             "the run (step 0 = the SFT model); *reach* the first evaluated step where the seed-mean validation curve "
             "reaches the base's final accuracy (*not reached*: at no evaluated step).", ""]
    if figure:
        lines += [f"Curves: [{figure}]({figure}) (seed mean, band = range over seeds, a base and its credit arms a panel).", ""]
    if not default:
        for task, ov in sorted({(r.get("task", "?"), tuple(r.get("overrides", ()))) for r in (runs or {}).values()}):
            lines += [f"Overrides over the {task} base recipe: " + (" ".join(f"`{o}`" for o in ov) or "none") + ".", ""]
    for task in sorted({e["task"] for e in summary}):
        rows = [e for e in summary if e["task"] == task]
        extra = "cell_accuracy" if any("cell_accuracy" in e.get("val", {}) for e in rows) else "mean_reward"
        lines += [f"### {task}", "",
                  f"| cell | kind | seeds | val solved | val {extra} | Δ val vs SFT (paired) | paired Δ val vs base | "
                  f"test solved | paired Δ test vs base | AUC | reach | RL CPU s |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in rows:
            val, test = e.get("val", {}), e.get("test", {})
            lines.append(f"| {e['cell']} | {e['kind']} | {len(e['seeds'])} | {_ci(val.get('accuracy'))} | "
                         f"{_ci(val.get(extra))} | {format_differences(e.get('gain_over_sft_val'))} | "
                         f"{format_differences(e.get('paired_val'))} | {_ci(test.get('accuracy'))} | {format_differences(e.get('paired_test'))} | "
                         f"{e['val_auc']:.3f} | {_reach(e)} | {e['rl_cpu_seconds']:.0f} |")
        lines.append("")
        for e in rows:
            if e.get("rollout_mismatch"):
                lines += [f"{e['cell']}: rollout mismatch (mean |log commit_prob − log p_θ| at the commit state, nats, "
                          f"per run, then over {e['rollout_mismatch']['seeds']} seeds) {_ci(e['rollout_mismatch'])}", ""]
    return "\n".join(lines) + "\n"


def plot(data: dict, path: Path) -> None:
    """The curves of a record file: every cell's seed-mean validation curve with its seed range, a base and
    its credit arms together, at most 7 cells and the SFT level a panel (:func:`curve_figure`)."""
    curve_figure(data, path, "Validation curves: seed mean, band = range over seeds", cap=7)


def resolve_bases(recipes: str, out_dir: Path) -> dict[str, Path]:
    """Each task's base recipe: :data:`BASES` (``cpu``) or :func:`gpu_base` of every task in
    :data:`RECIPES_8B` (``8b``, written under ``out_dir``).

    Raises:
        SystemExit: an unknown ``recipes`` value.
    """
    if recipes == "cpu":
        return dict(BASES)
    if recipes == "8b":
        return {task: gpu_base(task, out_dir) for task in RECIPES_8B}
    raise SystemExit(f"error: --recipes {recipes!r}: expected cpu or 8b")


# ---------------------------------------------------------------------------------------------
# the tuning grid (--grid) and the confirmation runs (--confirm)
# ---------------------------------------------------------------------------------------------
#: the learning rates every base and its credit arms are tuned over (on the selection split)
GRID_LRS = (2e-5, 5e-5, 1e-4, 2e-4)
#: the learning rates a family's grid extends along, one rung at a time, while an arm's best point lies at
#: the grid's lowest or highest rate (:func:`edge_extension`): the optimum then is inside the grid or at a
#: ladder end, not outside the rates that were tried
LR_LADDER = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3)
GRID_SEEDS = (0, 1)
CONFIRM_SEEDS = tuple(range(10, 20))  # >= 10 paired seeds, none of them a grid seed
GRID_EVERY = 13  # the selection curve every 13 of the 65 steps, as the third-round table
CONFIRM_SIZE = 500
#: what the grid's and the confirmation runs' recipes share over configs/table/<task>.yaml: the third
#: round's "recipe that learns" (10-step warm-up, no prompt masking, 8 prompts x 6, 65 steps), less its lr
GRID_RECIPE = {task: [f"sft.steps={sft}", "train.warmup_steps=10", "likelihood.p_mask_prompt=0",
                      "train.prompts_per_step=8", "train.steps=65"]
               for task, sft in (("sudoku", 250), ("countdown", 1000))}
#: each base with its credit arms; ``beta``: the grid of the objective's KL weight where the base has one
#: (SPG and wd1 have none in their papers' recipes). The same grid for the base and each of its arms.
#: ``tuned_by`` ``(family, arm)``: a family with no grid of its own whose arms all run at that arm's best
#: point (the cached-rollout pair is one base with two samplers, not a base and a credit arm)
GRID_FAMILIES: dict[str, dict] = {
    "spg": {"arms": ("spg", "dispo@spg", "dispo-kl@spg"), "beta": ()},
    "rldf": {"arms": ("rldf", "dtca@rldf"), "beta": (0.01, 0.04)},
    "wd1": {"arms": ("wd1", "sml@wd1", "dps@wd1"), "beta": ()},
    "state": {"arms": ("diffu_grpo_state", "dispo@diffu_grpo_state", "dps@diffu_grpo_state"), "beta": (0.04, 0.1)},
    "mf": {"arms": ("diffu_grpo_mf", "sml@diffu_grpo"), "beta": (0.04, 0.1)},
    "cache": {"arms": ("diffu_grpo_state@4blocks", "diffu_grpo_state@4blocks+dual"), "beta": (0.04, 0.1),
              "tuned_by": ("state", "diffu_grpo_state")},
}


def grid_points(family: str, lrs=GRID_LRS) -> list[tuple[str, list[str]]]:
    """The grid of ``family``: ``(label, overrides)`` per point, lr outer, β inner (``lr=0.0001,beta=0.04``).

    Raises:
        SystemExit: an unknown family (lists the known ones).
    """
    if family not in GRID_FAMILIES:
        raise SystemExit(f"error: unknown grid family {family!r}; known: {', '.join(GRID_FAMILIES)}")
    betas = GRID_FAMILIES[family]["beta"] or (None,)
    return [(f"lr={lr:g}" + ("" if b is None else f",beta={b:g}"),
             [f"train.lr={lr:g}"] + ([] if b is None else [f"objective.beta={b:g}"])) for lr in lrs for b in betas]


def grid_path(kind: str, task: str, family: str, root: Path = OUT.parent) -> Path:
    """``results/grid/<task>_<family>.json`` (``kind`` grid) or ``results/confirm/<task>_<family>.json``."""
    return root / kind / f"{task}_{family}.json"


def point_lr(label: str) -> float:
    """The learning rate of a grid point's label (``lr=0.0001,beta=0.04`` -> 1e-4)."""
    return float(label.split(",")[0].removeprefix("lr="))


def family_lrs(data: dict, task: str, family: str, lrs=GRID_LRS) -> list[float]:
    """``lrs`` and every learning rate the grid records ``data`` hold for ``task``'s arms of ``family``
    (the rungs an extension added), ascending."""
    arms = GRID_FAMILIES[family]["arms"]
    found = {point_lr(r["grid_point"]) for r in data["runs"].values()
             if r.get("task") == task and r.get("cell") in arms and r.get("grid_point")}
    return sorted(set(lrs) | found)


def edge_extension(best: dict[str, dict], lrs, ladder=LR_LADDER) -> list[float]:
    """The rungs of ``ladder`` to add to a grid over ``lrs``: the next lower rung for every arm whose best
    point (``best`` from :func:`best_points`) lies at the lowest rate, the next higher for the highest;
    [] when every best is inside the grid or at a ladder end."""
    add = set()
    for b in best.values():
        lr = point_lr(b["point"])
        lower, higher = [x for x in ladder if x < lr], [x for x in ladder if x > lr]
        if lr == min(lrs) and lower:
            add.add(lower[-1])
        if lr == max(lrs) and higher:
            add.add(higher[0])
    return sorted(add - set(lrs))


def best_points(data: dict, task: str, family: str, seeds, lrs=None, arms=None) -> dict[str, dict]:
    """Each arm's best grid point in grid record file ``data``: the highest seed-mean final selection
    accuracy over ``seeds``, ties broken by the seed-mean AUC (:func:`curve_area`), then by grid order.
    Only points with every seed recorded compete; ``arms`` (default: the family's) limits the arms;
    ``lrs`` (default :func:`family_lrs`: the grid with its recorded extensions) the learning rates.

    Returns:
        ``{arm: {"point", "overrides", "val_mean", "auc", "seeds", "points": {label: val_mean}}}``.

    Raises:
        SystemExit: an arm with no complete grid point (names the missing runs).
    """
    out = {}
    lrs = family_lrs(data, task, family) if lrs is None else lrs
    for arm in arms or GRID_FAMILIES[family]["arms"]:
        scored = []
        for order, (label, over) in enumerate(grid_points(family, lrs)):
            rows = [data["runs"].get(run_key(task, arm, s, label)) for s in seeds]
            if all(rows):
                m = sum(r["val"]["accuracy"] for r in rows) / len(rows)
                auc = sum(curve_area(r["val_curve"]) for r in rows) / len(rows)
                scored.append((-m, -auc, order, label, over, m, auc))
        if not scored:
            missing = [run_key(task, arm, s, label) for label, _ in grid_points(family, lrs) for s in seeds]
            raise SystemExit(f"error: no complete grid point for {task}/{arm} (runs {', '.join(missing[:4])}, ...); "
                             f"run --grid {family} first")
        best = min(scored)
        out[arm] = {"point": best[3], "overrides": best[4], "val_mean": best[5], "auc": best[6], "seeds": list(seeds),
                    "points": {x[3]: x[5] for x in sorted(scored, key=lambda x: x[2])}}
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x != ""]


def parser() -> argparse.ArgumentParser:
    """The command line of :func:`main` (also what the documented commands are checked against)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="sudoku")
    ap.add_argument("--cells", default="", help="comma-separated cells (default: DEFAULT_FIRST on the first task, "
                                                "SECOND_TASK on the others)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--val-size", type=int, default=300, help="rows of the selection split")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="score the selection split every N RL steps (default: the cadence the task's records in "
                         f"--out were made with, else 5; {GRID_EVERY} with --grid / --confirm)")
    ap.add_argument("--test", action="store_true", help="score the test file once per run at its end")
    ap.add_argument("--generated-data", action="store_true",
                    help="allow generated evaluation rows when no local data file exists (changes every split)")
    ap.add_argument("--grid", default="", help=f"comma-separated families ({', '.join(GRID_FAMILIES)}): every arm at "
                                               "every grid point on the selection split (GRID_FAMILIES, GRID_LRS)")
    ap.add_argument("--confirm", default="", help="comma-separated families: each arm at its own best grid point, "
                                                  "scored once on the confirmation split")
    ap.add_argument("--test-final", default="", help="comma-separated families, once every recipe is fixed: each "
                                                     "arm's first confirmation seed retrained at its selected point "
                                                     "and scored once on the test file (results/test/)")
    ap.add_argument("--grid-lrs", default=",".join(f"{x:g}" for x in GRID_LRS))
    ap.add_argument("--supersede", action="store_true",
                    help="with --confirm: move confirmation runs recorded at a point no longer selected to the "
                         "file's 'superseded' list and run those arms again (without it such runs are an error)")
    ap.add_argument("--no-extend", action="store_true",
                    help="do not extend a family's grid along LR_LADDER when an arm's best point is at its edge")
    ap.add_argument("--grid-seeds", default=",".join(map(str, GRID_SEEDS)))
    ap.add_argument("--confirm-seeds", default=",".join(map(str, CONFIRM_SEEDS)))
    ap.add_argument("--confirm-size", type=int, default=CONFIRM_SIZE, help="rows of the confirmation split")
    ap.add_argument("--base", action="append", default=[], help="TASK=YAML: another base recipe for a task")
    ap.add_argument("--recipes", choices=("cpu", "8b"), default="cpu",
                    help="8b: the GPU cells, each task's base its shipped LLaDA-8B recipe (RECIPES_8B, gpu_base)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pos-samples", type=int, default=128)
    ap.add_argument("--smoke", action="store_true", help="every cell, 1 step, tiny shapes (proves each cell runs)")
    ap.add_argument("--out", default=None, help=f"records (default {OUT.relative_to(ROOT)}; with --recipes 8b "
                                                    f"{OUT_8B.relative_to(ROOT)}; with --grid / --confirm "
                                                    "results/{grid,confirm}/<task>_<family>.json)")
    ap.add_argument("--summary", action="store_true", help="only regenerate docs/results.md and the plot")
    ap.add_argument("--verdicts", action="store_true", help="only regenerate the verdict table, the headline figure "
                                                           "and the generated readings of docs/results.md")
    ap.add_argument("--backfill-provenance", action="store_true",
                    help="give the records made before provenance was written an explicit test_reads and a "
                         "'backfilled' provenance block (verifying the SFT checkpoints present)")
    ap.add_argument("--doc", default=str(DOC))
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "table"), help="run folders and resolved cell recipes")
    ap.add_argument("--list", action="store_true", help="print the cells and exit")
    return ap


def eval_cadence(out: Path, task: str, given: int | None) -> int:
    """The validation cadence of ``task``'s runs: ``given`` when set, else the one the task's records in
    ``out`` were made with (so a documented resume command needs no flag), else 5.

    Raises:
        SystemExit: no ``given`` and the task's records hold several cadences.
    """
    if given is not None:
        return given
    seen = {r.get("eval_every") for r in load_results(out)["runs"].values() if r.get("task") == task}
    if len(seen) > 1:
        raise SystemExit(f"error: {out} holds {task} runs at several --eval-every values {sorted(seen)}; pass one")
    return seen.pop() if seen else 5


def planned_runs(args: argparse.Namespace) -> list[dict]:
    """Every run a plain (table) invocation would make or skip: ``{"out", "task", "cell", "seed", "key",
    "settings"}``, without building any data, model or recipe (what the documented-commands test reads)."""
    out = Path(args.out or (OUT_8B if args.recipes == "8b" else OUT))
    overrides = list(args.overrides) + (["train.steps=1"] if args.smoke else [])
    if args.smoke:
        overrides = SMOKE + overrides
    plan = []
    for i, task in enumerate(t for t in args.tasks.split(",") if t):
        every = 0 if args.smoke else eval_cadence(out, task, args.eval_every)
        names = [c for c in args.cells.split(",") if c] or (
            (list(CELLS) if args.smoke else DEFAULT_FIRST) if i == 0 else SECOND_TASK)
        for name in names:
            for seed in _ints(args.seeds):
                plan.append({"out": out, "task": task, "cell": name, "seed": seed, "key": run_key(task, name, seed),
                             "settings": run_settings(overrides, min(args.val_size, 8) if args.smoke else args.val_size,
                                                      every)})
    return plan


def _pos(setup: Setup, task: str, names, pos_dir: Path, smoke: bool, samples: int) -> Path | None:
    if any(e.get("pos_weights") == "<table>" for n in names for e in CELLS.get(n, {}).get("credit", [])):
        tag = "smoke" if smoke else setup.sft_dir.name
        return pos_table(setup, task, pos_dir / f"{task}_{tag}.json", samples)
    return None


def run_families(args: argparse.Namespace, bases: dict[str, Path]) -> list[Path]:
    """``--grid`` and then ``--confirm``: for each task and family, every arm at every grid point on the
    grid seeds (selection split), then each arm at its own best point (:func:`best_points`; a ``tuned_by``
    family's arms at that arm's point) on the confirmation seeds, each scored once on the confirmation
    split. Returns the record files written.

    Raises:
        SystemExit: an unknown family or task, ``--grid`` of a ``tuned_by`` family, or a confirmation
        whose grid has no complete point (each before any run of that family).
    """
    written = []
    lrs = [float(x) for x in args.grid_lrs.split(",") if x]
    runs_dir = Path(args.runs_dir)
    for family in [f for f in ",".join((args.grid, args.confirm, args.test_final)).split(",") if f]:  # before any data
        grid_points(family)  # an unknown family: SystemExit naming the known ones
        tuned_by = GRID_FAMILIES[family].get("tuned_by")
        if tuned_by and family in args.grid.split(","):
            raise SystemExit(f"error: --grid {family}: the family has no grid of its own; its arms run at the best "
                             f"point of {tuned_by[0]}'s {tuned_by[1]} (--grid {tuned_by[0]}, then --confirm {family})")
    for task in [t for t in args.tasks.split(",") if t]:
        if task not in GRID_RECIPE and not args.smoke:
            raise SystemExit(f"error: no grid recipe for task {task!r}; known: {', '.join(GRID_RECIPE)}")
        common = GRID_RECIPE.get(task, []) + (SMOKE if args.smoke else []) + list(args.overrides) \
            + (["train.steps=1"] if args.smoke else [])
        every = 0 if args.smoke else (args.eval_every if args.eval_every is not None else GRID_EVERY)
        val_size = min(args.val_size, 8) if args.smoke else args.val_size
        confirm_size = ((min(args.confirm_size, 8) if args.smoke else args.confirm_size)
                        if args.confirm or args.test_final else 0)
        setup = Setup(task, bases[task], common, "table", val_size, gen_kw=GEN_KW.get(task), confirm_size=confirm_size,
                      require_file=not args.generated_data)
        root = Path(args.out).parent if args.out else OUT.parent
        pos_dir = (root if args.smoke else OUT.parent) / "pos_weights"
        for mode, families in (("grid", args.grid), ("confirm", args.confirm), ("test", args.test_final)):
            for family in [f for f in families.split(",") if f]:
                arms = GRID_FAMILIES[family]["arms"]
                table = _pos(setup, task, arms, pos_dir, args.smoke, args.pos_samples)
                recipes = {a: cell_recipe(bases[task], a, table, runs_dir / "recipes") for a in arms}
                tuned_by = GRID_FAMILIES[family].get("tuned_by")
                gpath = grid_path("grid", task, family, root)
                if mode == "grid":
                    grid = family_lrs(load_results(gpath), task, family, lrs)  # with any extension begun before
                    while grid:
                        for seed in _ints(args.grid_seeds):
                            for label, over in grid_points(family, grid):
                                for arm in arms:
                                    run(setup, gpath, task, arm, recipes[arm], common + over, seed, every, False,
                                        runs_dir / "grid", point=label)
                        data = load_results(gpath)
                        done = family_lrs(data, task, family, lrs)
                        best = best_points(data, task, family, _ints(args.grid_seeds), done)
                        add = [] if args.no_extend else edge_extension(best, done)
                        if add:
                            at = ", ".join(f"{a} at {b['point']}" for a, b in best.items())
                            print(f"[table] {task}/{family}: a best point at the grid's edge ({at}); adding lr "
                                  f"{', '.join(f'{x:g}' for x in add)} (LR_LADDER)", flush=True)
                        grid = add
                    written.append(gpath)
                    continue
                if mode == "test":
                    written.append(test_final(setup, task, family, arms, recipes, common, every, args, root, runs_dir))
                    continue
                if tuned_by:
                    src, src_arm = tuned_by
                    src_data = load_results(grid_path("grid", task, src, root), must_exist=True)
                    chosen = best_points(src_data, task, src, _ints(args.grid_seeds),
                                         family_lrs(src_data, task, src, lrs), arms=[src_arm])[src_arm]
                    best = {arm: {**chosen, "tuned_by": f"{src}/{src_arm}"} for arm in arms}
                else:
                    data = load_results(gpath, must_exist=True)
                    best = best_points(data, task, family, _ints(args.grid_seeds), family_lrs(data, task, family, lrs))
                cpath = grid_path("confirm", task, family, root)
                supersede_stale(cpath, task, {arm: common + best[arm]["overrides"] for arm in arms},
                                {arm: best[arm]["point"] for arm in arms}, args.supersede)
                for seed in _ints(args.confirm_seeds):
                    for arm in arms:
                        run(setup, cpath, task, arm, recipes[arm], common + best[arm]["overrides"], seed, every, False,
                            runs_dir / "confirm", confirm=True)
                if task not in load_results(cpath).get("sft_confirmation", {}):  # the SFT model, scored once
                    policy = setup.policy()
                    sft = setup.evaluate(policy, setup.cfg, setup.confirm)
                    update_results(cpath, lambda d: d.setdefault("sft_confirmation", {}).__setitem__(task, sft))
                update_results(cpath, lambda d: d.__setitem__("selected", best))
                written.append(cpath)
    return written


def supersede_stale(cpath: Path, task: str, want: dict[str, list[str]], points: dict[str, str], move: bool) -> None:
    """Confirmation runs in ``cpath`` of ``task``'s arms (the keys of ``want``) recorded with other overrides
    than ``want[arm]``, the point selected now (the grid grew since they ran): an error naming them, or with
    ``move`` (``--supersede``) moved to the file's ``superseded`` list, kept with their reads, never paired
    again, so those arms run again at their new point.

    Raises:
        SystemExit: stale runs and not ``move`` (names the arms, their recorded and their selected points).
    """
    data = load_results(cpath)
    stale = sorted(k for k, r in data["runs"].items()
                   if r.get("task") == task and r.get("cell") in want and r.get("overrides") != want[r["cell"]])
    if not stale:
        return
    arms = sorted({data["runs"][k]["cell"] for k in stale})
    was = data.get("selected", {})
    moves = ", ".join(f"{a} {was.get(a, {}).get('point', '?')} -> {points[a]}" for a in arms)
    if not move:
        raise SystemExit(f"error: {cpath}: {len(stale)} confirmation runs were recorded at another grid point than the "
                         f"one selected now ({moves}); --supersede moves them to the file's 'superseded' list (kept, "
                         "never paired again) and runs those arms at their new point")

    def change(d):
        for k in stale:
            if k in d["runs"]:
                d.setdefault("superseded", []).append({"key": k, **d["runs"].pop(k)})
    update_results(cpath, change)
    print(f"[table] {cpath}: {len(stale)} confirmation runs superseded ({moves})", flush=True)


def test_final(setup: Setup, task: str, family: str, arms, recipes: dict, common: list[str], every: int,
               args: argparse.Namespace, root: Path, runs_dir: Path) -> Path:
    """``--test-final``: the test file read once per headline cell, after every recipe is fixed. Each arm's
    first confirmation seed is retrained at the point its confirmation file selected (the weights of the
    confirmation runs are not kept) and its final model scored on the confirmation split and, once, on the
    test file (``results/test/<task>_<family>.json``); ``reproduces_confirmation`` says whether the
    retrained model's confirmation score equals the recorded one (it does on the same machine, software
    and CPU kernel set). Returns the record file.

    Raises:
        SystemExit: no confirmation file, no selected point, or no recorded confirmation run of that seed.
    """
    cpath = grid_path("confirm", task, family, root)
    cdata = load_results(cpath, must_exist=True)
    seed = _ints(args.confirm_seeds)[0]
    tpath = grid_path("test", task, family, root)
    for arm in arms:
        key = run_key(task, arm, seed)
        conf = cdata["runs"].get(key)
        if conf is None or arm not in cdata.get("selected", {}):
            raise SystemExit(f"error: --test-final {family}: {cpath} has no confirmation run {key} "
                             f"with its selected point; run --confirm {family} first")
        run(setup, tpath, task, arm, recipes[arm], common + cdata["selected"][arm]["overrides"], seed, every, True,
            runs_dir / "test", confirm=True)
        same = load_results(tpath)["runs"][key]["confirmation"] == conf["confirmation"]
        update_results(tpath, lambda d: d["runs"][key].__setitem__("reproduces_confirmation", same))
        if not same:
            print(f"[table] {key}: the retrained model's confirmation score differs from {cpath}'s (another CPU "
                  "kernel set or software?)", flush=True)
    return tpath


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    code_version()  # the commit this process runs, read now: later commits in the checkout do not change its code
    if args.list:
        for name, spec in CELLS.items():
            print(f"{name:32s} {spec['kind']:12s} base={spec['base']}  {spec['note']}")
        return
    torch.set_num_threads(args.threads)
    if args.verdicts:
        write_verdicts(Path(args.doc), README if Path(args.doc).resolve() == DOC.resolve() else None)
        return
    if args.backfill_provenance:
        paths = [OUT, R3] + sorted((OUT.parent / "testbed_search").glob("*.json"))
        print(f"[table] provenance: {backfill_provenance([p for p in paths if p.is_file()])}", flush=True)
        return
    bases = resolve_bases(args.recipes, Path(args.runs_dir) / "recipes")
    for item in args.base:
        task, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"error: --base {item!r}: expected TASK=YAML")
        bases[task] = Path(path).resolve()
    if args.grid or args.confirm or args.test_final:
        for path in run_families(args, bases):
            print(f"[table] records in {path}", flush=True)
        return
    out = Path(args.out or (OUT_8B if args.recipes == "8b" else OUT))
    load_results(out)  # a file that is not a results file: an error before any run
    if args.smoke:
        args.pos_samples = 2
    plan = planned_runs(args) if not args.summary else []
    by_task: dict[str, list[dict]] = {}
    for p in plan:
        by_task.setdefault(p["task"], []).append(p)
    for task, items in by_task.items():
        if task not in bases:
            raise SystemExit(f"error: no base recipe for task {task!r}; known: {', '.join(bases)} (or --base TASK=YAML)")
        overrides, val_size = items[0]["settings"]["overrides"], items[0]["settings"]["val_size"]
        setup = Setup(task, bases[task], overrides, "table", val_size, gen_kw=GEN_KW.get(task),
                      require_file=not args.generated_data)
        names = list(dict.fromkeys(p["cell"] for p in items))
        table = _pos(setup, task, names, out.parent / "pos_weights", args.smoke, args.pos_samples)
        recipes = Path(args.runs_dir) / "recipes"  # resolved cells (absolute paths inside)
        paths = {n: cell_recipe(bases[task], n, table, recipes) for n in names}
        for p in items:
            run(setup, out, task, p["cell"], paths[p["cell"]], overrides, p["seed"], p["settings"]["eval_every"],
                args.test, Path(args.runs_dir))
    if not load_results(out)["runs"]:
        raise SystemExit(f"error: no runs in {out}; nothing to summarise")
    data = update_results(out, lambda d: d.__setitem__("summary", summarize(d)))
    if not args.smoke:
        doc = Path(args.doc)
        write_doc(doc, markdown(data["summary"], out, data["runs"], plot_path(doc, out).name), markers(out))
        plot(data, plot_path(doc, out))
        print(f"[table] wrote {args.doc}", flush=True)


# ---------------------------------------------------------------------------------------------
# provenance of the records made before it was written (--backfill-provenance)
# ---------------------------------------------------------------------------------------------
def first_commits(path: Path) -> dict[str, str]:
    """For each run key of record file ``path``, the first git commit whose version of the file holds it
    (``git log`` / ``git show``; empty outside git)."""
    import subprocess

    if not path.resolve().is_relative_to(ROOT):
        return {}
    rel = str(path.resolve().relative_to(ROOT))
    try:
        commits = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%H", "--reverse", "--", rel],
                                 capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return {}
    seen: dict[str, str] = {}
    for c in commits:
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{c}:{rel}"], capture_output=True, text=True)
        if shown.returncode:
            continue
        try:
            for key in json.loads(shown.stdout).get("runs", {}):
                seen.setdefault(key, c)
        except json.JSONDecodeError:
            continue
    return seen


def backfill_provenance(paths: list[Path], verify: bool = True) -> dict:
    """Give every record of ``paths`` made before records carried provenance an explicit ``test_reads``
    (1 when it holds a ``test`` score, else 0) and a ``provenance`` block marked ``backfilled``: the SFT
    settings key its overrides give over the task's base recipe (``sft_cache_key``), the test file's path
    and today's sha256, the selection split (seed :data:`ablation_runs.SELECTION_SEED`, its recorded size)
    and the training rows' seed and size, the commit that first recorded it (``recorded_in``; the code it
    ran is that commit or an earlier one), its CPU kernel set and threads; ``torch`` and the code commit
    are unknown (None). With ``verify``, for each SFT checkpoint present under ``runs/table`` whose fresh
    step-0 scores on the selection split equal a record's (all metrics, exactly), that record gets the
    weights' sha256 (``sft.verified``: the same checkpoint and data; else ``sha256`` None).
    Returns counts ``{"records", "backfilled", "verified"}``."""
    from maskrl.config import load_config
    from maskrl.demo import sft_cache_key
    from ablation_runs import SELECTION_SEED, checkpoint_sha256, file_sha256

    fresh: dict[tuple, dict] = {}  # (task, sft key, eval settings) -> the present checkpoint's step-0 metrics, hash
    counts = {"records": 0, "backfilled": 0, "verified": 0}
    for path in paths:
        data = load_results(path, must_exist=True)
        first = first_commits(path)
        todo = {k: r for k, r in data["runs"].items() if "provenance" not in r}
        counts["records"] += len(data["runs"])
        if not todo:
            continue
        filled = {}
        for key, r in todo.items():
            task = r["task"]
            cfg = load_config([BASES[task]], r.get("overrides", []))
            skey = sft_cache_key(cfg)
            folder = ROOT / "runs" / "table" / f"{task}_sft" / skey
            sft = {"path": str(folder.relative_to(ROOT)), "settings_key": skey, "sha256": None, "verified": False}
            ident = (task, skey, json.dumps(to_dict(cfg.eval), sort_keys=True, default=str))
            if verify and (folder / "maskrl_sft.json").is_file():
                if ident not in fresh:
                    setup = Setup(task, BASES[task], r.get("overrides", []), "table", r["val_size"], gen_kw=GEN_KW.get(task),
                                  require_file=True)
                    fresh[ident] = {"val": setup.sft_val(setup.policy(), setup.cfg), "sha256": checkpoint_sha256(folder)}
                f = fresh[ident]
                if r["val_curve"][0][1] == f["val"]:
                    sft.update(sha256=f["sha256"], verified=True)
                    counts["verified"] += 1
            task_obj = __import__("maskrl.tasks", fromlist=["get_task"]).get_task(cfg.task.name, cfg.task.prompt_template or None)
            test = task_obj.resolve_path(cfg.task.data_path or None)
            filled[key] = {
                "test_reads": 1 if "test" in r else 0,
                "provenance": {"backfilled": True, "sft": sft,
                               "data": {"source": "file", "path": str(test), "sha256": file_sha256(test), "checked": "today"},
                               "splits": {"train": {"source": "generated", "seed": cfg.task.train_seed, "size": cfg.task.train_size},
                                          "selection": {"source": "generated", "seed": SELECTION_SEED, "size": r["val_size"]},
                                          "confirmation": None},
                               "code": {"commit": None, "recorded_in": first.get(key)},
                               "torch": None, "cpu_capability": r.get("cpu_capability"), "threads": r.get("threads")}}
        counts["backfilled"] += len(filled)

        def change(d, filled=filled):
            for key, extra in filled.items():
                if key in d["runs"] and "provenance" not in d["runs"][key]:
                    d["runs"][key].update(extra)
        update_results(path, change)
    return counts


# ---------------------------------------------------------------------------------------------
# the headline page: verdicts with corrections, one figure, generated readings (--verdicts)
# ---------------------------------------------------------------------------------------------
R3 = OUT.parent / "controlled_table_r3.json"
#: the smallest gain worth the name (solved rate): a claim is *not reproduced* when the 95 % interval of the
#: gain lies below it, and a "learns as well" claim is *reproduced* when the interval lies above its negative
DELTA_MIN = 0.01
ALPHA = 0.05


def _claim(claim: str, paper: str, task: str, cell: str, base: str, sources: list[Path], kind: str = "superior") -> dict:
    return {"claim": claim, "paper": paper, "task": task, "cell": cell, "base": base, "sources": sources, "kind": kind}


#: the headline comparisons, one family for Holm's correction; ``base`` "sft" pairs each run with its own
#: step 0; ``sources``: record files in order of preference (a confirmation file first, else the selection
#: records). The papers' numbers are at LLaDA-8B-Instruct (SPEC §3-§4; Sudoku's are cell accuracy).
CLAIMS = [
    _claim("diffu-GRPO (state), the recipe that learns, improves its SFT model", "(the testbed: no paper claim)",
           "sudoku", "diffu_grpo_state", "sft", [grid_path("confirm", "sudoku", "state"), R3]),
    _claim("diffu-GRPO (state) improves its SFT model", "(the testbed: no paper claim)",
           "countdown", "diffu_grpo_state", "sft", [grid_path("confirm", "countdown", "state"), R3]),
    _claim("DiSPO improves diffu-GRPO", "Sudoku 14.1 → 31.4 (+17.3)", "sudoku", "dispo@diffu_grpo_state",
           "diffu_grpo_state", [grid_path("confirm", "sudoku", "state"), R3]),
    _claim("DiSPO improves diffu-GRPO", "Countdown 33.9 → 53.9 (+20.0)", "countdown", "dispo@diffu_grpo_state",
           "diffu_grpo_state", [grid_path("confirm", "countdown", "state"), R3]),
    _claim("DiSPO improves SPG", "improves (no number in SPEC §4)", "sudoku", "dispo@spg", "spg",
           [grid_path("confirm", "sudoku", "spg"), R3]),
    _claim("DiSPO's branch credit alone (no step-term KL, no prompt masking) improves SPG", "(control of the row above)",
           "sudoku", "dispo-kl@spg", "spg", [grid_path("confirm", "sudoku", "spg")]),
    _claim("DTCA improves RLDF", "MATH500 +3.6 / +2.0 / +1.4 at 128 / 256 / 512", "sudoku", "dtca@rldf", "rldf",
           [grid_path("confirm", "sudoku", "rldf"), R3]),
    _claim("DPS improves diffu-GRPO (state)", "improves (no number in SPEC §2.1)", "sudoku", "dps@diffu_grpo_state",
           "diffu_grpo_state", [grid_path("confirm", "sudoku", "state"), R3]),
    _claim("DPS improves diffu-GRPO (state)", "improves (no number in SPEC §2.1)", "countdown", "dps@diffu_grpo_state",
           "diffu_grpo_state", [grid_path("confirm", "countdown", "state"), R3]),
    _claim("SML improves wd1", "improves (no number in SPEC §2.2)", "sudoku", "sml@wd1", "wd1",
           [grid_path("confirm", "sudoku", "wd1"), OUT]),
    _claim("SML improves wd1", "improves (no number in SPEC §2.2)", "countdown", "sml@wd1", "wd1",
           [grid_path("confirm", "countdown", "wd1"), OUT]),
    _claim("DPS improves wd1", "improves (no number in SPEC §2.1)", "sudoku", "dps@wd1", "wd1",
           [grid_path("confirm", "sudoku", "wd1"), OUT]),
    _claim("SML improves diffu-GRPO (mean-field)", "improves (no number in SPEC §2.2)", "sudoku", "sml@diffu_grpo",
           "diffu_grpo_mf", [grid_path("confirm", "sudoku", "mf"), OUT]),
    _claim("RL on dual-KV-cached rollouts learns as on exact ones (4 blocks)", "(reported unstable at 8B)", "sudoku",
           "diffu_grpo_state@4blocks+dual", "diffu_grpo_state@4blocks", [grid_path("confirm", "sudoku", "cache"), OUT],
           kind="noninferior"),
]


def claim_differences(claim: dict, need: int = len(CONFIRM_SEEDS)) -> dict | None:
    """The per-seed paired differences (solved rate) of ``claim`` from its first record file holding both
    arms on shared seeds: ``{"d", "seeds", "split", "source", "pending"}``; ``split`` is ``confirmation``
    (final models scored once on it) or ``selection`` (the split the recipes were chosen on). A confirmation
    file is read only once it holds ``need`` paired seeds (the confirmation is complete): before that the
    claim reads the next file and ``pending`` says how many confirmation seeds are recorded (``{"seeds",
    "need", "source"}``, else None), so a half-run confirmation never stands in for the finished one.
    None when no file has them."""
    pending = None
    for path in claim["sources"]:
        if not path.is_file():
            continue
        data = load_results(path)
        confirm = path.parent.name == "confirm"
        split = "confirmation" if confirm else "selection"
        rows: dict[str, dict[int, dict]] = {}
        for r in data["runs"].values():
            if r.get("task") == claim["task"] and "grid_point" not in r:
                rows.setdefault(r["cell"], {})[r["seed"]] = r
        arm = rows.get(claim["cell"], {})
        if claim["base"] == "sft":
            sft = (data.get("sft_confirmation") or {}).get(claim["task"], {}).get("accuracy") if confirm else None
            pairs = {s: (r["confirmation"]["accuracy"], sft) if confirm else (r["val"]["accuracy"], r["val_curve"][0][1]["accuracy"])
                     for s, r in arm.items() if not confirm or ("confirmation" in r and sft is not None)}
        else:
            base = rows.get(claim["base"], {})
            key = "confirmation" if confirm else "val"
            pairs = {s: (arm[s][key]["accuracy"], base[s][key]["accuracy"]) for s in arm
                     if s in base and key in arm[s] and key in base[s]}
        rel = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        if confirm and len(pairs) < need:
            pending = pending or ({"seeds": len(pairs), "need": need, "source": str(rel)} if pairs else None)
            continue
        if len(pairs) >= 2:
            seeds = sorted(pairs)
            return {"d": [pairs[s][0] - pairs[s][1] for s in seeds], "seeds": seeds, "split": split, "source": str(rel),
                    "pending": pending}
    return None


def verdict(stat: dict, kind: str, p_t_holm: float, p_flip_holm: float) -> str:
    """``reproduced`` / ``not reproduced`` / ``undecided`` of one comparison (the rule the page states).

    ``superior``: reproduced when the mean gain is positive and both Holm-corrected p-values (paired t,
    exact sign-flip) are below :data:`ALPHA`; not reproduced when the 95 % interval's upper end is below
    :data:`DELTA_MIN`; else undecided. ``noninferior``: reproduced when the interval's lower end is above
    −:data:`DELTA_MIN`; not reproduced when the mean is negative and both corrected p-values are below
    :data:`ALPHA`; else undecided.
    """
    lo, hi = stat["ci95"]
    significant = p_t_holm < ALPHA and p_flip_holm < ALPHA
    if kind == "superior":
        if stat["mean"] > 0 and significant:
            return "reproduced"
        return "not reproduced" if hi < DELTA_MIN else "undecided"
    if lo > -DELTA_MIN:
        return "reproduced"
    return "not reproduced" if stat["mean"] < 0 and significant else "undecided"


def verdict_rows(claims: list[dict] = CLAIMS) -> list[dict]:
    """Every claim with its statistics (:func:`maskrl.stats.seed_comparison`), Holm-corrected p-values
    over the family of claims that have records, and its verdict."""
    from maskrl.stats import holm, seed_comparison

    rows = []
    for c in claims:
        diff = claim_differences(c)
        rows.append({**c, "sources": [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in c["sources"]],
                     "diff": diff,
                     "stat": seed_comparison(diff["d"]) if diff else None})
    have = [r for r in rows if r["stat"]]
    for key in ("p_t", "p_signflip"):
        for r, adj in zip(have, holm([r["stat"][key] for r in have])):
            r[f"{key}_holm"] = adj
    for r in have:
        r["verdict"] = verdict(r["stat"], r["kind"], r["p_t_holm"], r["p_signflip_holm"])
    return rows


def _where(r: dict) -> str:
    """A verdict row's "split, seeds" cell: ``confirmation, 10``, or ``selection, 5`` with the confirmation
    seeds recorded so far when that run is under way (``selection, 5; confirmation 2 of 10 recorded``)."""
    d = r["diff"]
    pend = d.get("pending")
    return f"{d['split']}, {r['stat']['n']}" + (f"; confirmation {pend['seeds']} of {pend['need']} recorded" if pend else "")


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _p(x: float) -> str:
    return "–" if x is None or math.isnan(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


def record_census(paths: list[Path]) -> dict:
    """Over the record files ``paths``: distinct runs (a run copied into two files counts once), runs with a
    provenance block, test-file reads, confirmation reads."""
    seen, runs, superseded = set(), [], 0
    for p in paths:
        data = load_results(p) if p.is_file() else {"runs": {}}
        superseded += len(data.get("superseded", []))
        for r in list(data["runs"].values()) + data.get("superseded", []):  # superseded runs read splits too
            ident = json.dumps([r.get(k) for k in ("task", "cell", "seed", "overrides", "grid_point", "rewards")])
            if ident not in seen:  # a run copied into two files (the third-round base rows) counts once
                seen.add(ident)
                runs.append(r)
    return {"runs": len(runs), "with_provenance": sum("provenance" in r for r in runs),
            "backfilled": sum(bool(r.get("provenance", {}).get("backfilled")) for r in runs),
            "sft_verified": sum(bool((r.get("provenance", {}).get("sft") or {}).get("sha256")) for r in runs),
            "test_reads": sum(r.get("test_reads", 1 if "test" in r else 0) for r in runs),
            "confirmation_reads": sum(r.get("confirmation_reads", 0) for r in runs), "superseded": superseded}


def verdict_markdown(rows: list[dict], census: dict, figure: str) -> str:
    """The headline block: the verdict table, the rule, the figure link and the generated readings."""
    lines = ["## Verdicts", "",
             "Generated by `python benchmarks/controlled_table.py --verdicts` from the committed records; do not edit "
             "between the markers. Tiny model (4 layers, 128 wide), CPU, the recipe that learns (lr warm-up 10, no "
             "prompt masking in the base likelihood, 8 prompts × 6, 65 steps) unless the source is the first table "
             "(`results/controlled_table.json`: lr 1e-4, 16 prompts × 6, 30 steps). *Ours*: the paired (same seed) "
             "difference in solved rate, points, mean and exact 95 % t-interval over seeds (seeds above / below "
             "zero). *p*: two-sided paired t-test and exact sign-flip permutation test over seeds, each "
             f"Holm-corrected over the {sum(1 for r in rows if r['stat'])} comparisons of the table. *Verdict*: "
             f"**reproduced** when the gain is positive and both corrected p are below {ALPHA}; **not reproduced** "
             f"when the interval lies below +{100 * DELTA_MIN:.0f} point; else **undecided** (the cache row: "
             f"reproduced when the interval lies above −{100 * DELTA_MIN:.0f} point). The papers' numbers are "
             "LLaDA-8B-Instruct's (Sudoku: cell accuracy), so only the direction is compared. *Split*: "
             "`confirmation` = final models scored once on 500 fresh rows that no choice saw; `selection` = the "
             "300 rows every recipe was chosen on, so its p-values are optimistic.", "",
             "| claim | task | paper (LLaDA-8B) | ours: Δ solved, points | p (t / sign-flip), Holm | verdict | split, seeds |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if not r["stat"]:
            lines.append(f"| {r['claim']} | {r['task']} | {r['paper']} | not run yet | – | – | – |")
            continue
        st = r["stat"]
        lines.append(f"| {r['claim']} | {r['task']} | {r['paper']} | {_pts(st['mean'])} [{_pts(st['ci95'][0])}, "
                     f"{_pts(st['ci95'][1])}] ({st['positive']}+/{st['negative']}−) | {_p(r['p_t_holm'])} / "
                     f"{_p(r['p_signflip_holm'])} | **{r['verdict']}** | {_where(r)} |")
    lines += ["", f"![Validation curves of the recipe that learns, seed mean with the seed range]({figure})", "",
              f"Records: {census['runs']} distinct runs, {census['with_provenance']} with a provenance block (SFT "
              f"weights' sha256, data file and sha256, splits, code commit, torch and CPU kernel set). "
              f"{census.get('backfilled', 0)} of the blocks were filled in afterwards for runs made before records "
              f"carried one (`--backfill-provenance`: torch version and code commit unknown, the commit that first "
              f"recorded the run instead); {census.get('sft_verified', 0)} runs carry their SFT checkpoint's weights "
              f"hash, checked for the older ones by re-scoring the retrained checkpoint's step 0 exactly. "
              f"Test-file reads over all of them: **{census['test_reads']}**. "
              f"Confirmation-split reads: {census['confirmation_reads']} (one per final run"
              + (f"; {census['superseded']} of them by runs superseded when a grid grew" if census.get("superseded")
                 else "") + ").", "",
              "Readings (generated):", ""]
    for r in rows:
        if not r["stat"]:
            lines.append(f"- {r['claim']} ({r['task']}): no records yet (`{r['sources'][0]}`).")
            continue
        st, d = r["stat"], r["diff"]
        floor = 2 / 2 ** st["n"]
        lines.append(
            f"- {r['claim']} ({r['task']}, `{d['source']}`, {d['split']} split, seeds {d['seeds'][0]}–{d['seeds'][-1]}): "
            f"{100 * st['mean']:+.2f} points [{100 * st['ci95'][0]:+.2f}, {100 * st['ci95'][1]:+.2f}], {st['positive']} of {st['n']} "
            f"seeds above, {st['negative']} below; d_z {st['d_z']:.2f} [{st['d_z_ci95'][0]:.2f}, {st['d_z_ci95'][1]:.2f}]. "
            f"Paired t p {_p(st['p_t'])} (Holm {_p(r['p_t_holm'])}); sign-flip p {_p(st['p_signflip'])} (Holm "
            f"{_p(r['p_signflip_holm'])}; its floor at {st['n']} seeds is {floor:.4f}); Wilcoxon p {_p(st['p_wilcoxon'])}. "
            f"**{r['verdict'].capitalize()}.**" + (
                f" Its confirmation is under way ({d['pending']['seeds']} of {d['pending']['need']} seeds in "
                f"`{d['pending']['source']}`) and is read once complete." if d.get("pending") else ""))
    return "\n".join(lines) + "\n"


def root_base(name: str) -> str:
    """The base a cell's chain of paired bases ends at (``dps+dispo@diffu_grpo_state`` -> ``diffu_grpo_state``)."""
    while CELLS.get(name, {}).get("base"):
        name = CELLS[name]["base"]
    return name


def curve_panels(cells: list[str], cap: int) -> list[list[str]]:
    """Cells grouped by :func:`root_base` (a base with its credit arms stays together), the groups packed in
    order into panels of at most ``cap`` curves (a group larger than ``cap`` is split)."""
    groups: dict[str, list[str]] = {}
    for c in sorted(cells, key=lambda c: list(CELLS).index(c) if c in CELLS else 99):
        groups.setdefault(root_base(c), []).append(c)
    panels: list[list[str]] = []
    for g in groups.values():
        for i in range(0, len(g), cap):
            part = g[i:i + cap]
            if panels and len(panels[-1]) + len(part) <= cap and not panels[-1][0] == part[0]:
                panels[-1] += part
            else:
                panels.append(list(part))
    return panels


def draw_panel(ax, task: str, cells: list[str], by: dict[str, list[dict]]) -> None:
    """One panel: each cell's seed-mean selection-split solved rate (%) against the RL step, the seed range
    shaded, the SFT model's level dotted, labelled axes, the legend under the panel (off the data)."""
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10").colors
    for i, name in enumerate(cells):
        rows = by[name]
        steps = sorted(set.intersection(*[{s for s, _ in r["val_curve"]} for r in rows]))
        per = [[dict((s, m["accuracy"]) for s, m in r["val_curve"])[s] for r in rows] for s in steps]
        ax.plot(steps, [100 * sum(v) / len(v) for v in per], color=colours[i % 10], marker="o", ms=3,
                linestyle="-" if CELLS.get(name, {}).get("kind") == "base" else "--", label=f"{name} ({len(rows)} seeds)")
        ax.fill_between(steps, [100 * min(v) for v in per], [100 * max(v) for v in per], color=colours[i % 10],
                        alpha=0.13, linewidth=0)
    sft = by[cells[0]][0]["val_curve"][0][1]["accuracy"]
    ax.axhline(100 * sft, color="grey", linestyle=":", linewidth=1.2, label=f"SFT model ({100 * sft:.1f} %)")
    ax.set_title(f"{task}: {' / '.join(dict.fromkeys(root_base(c) for c in cells))}", fontsize=10)
    ax.set_xlabel("RL step")
    ax.set_ylabel("solved rate on the selection split (%)")
    ax.grid(alpha=0.25)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=1, fontsize=8, frameon=False)


def curve_figure(data: dict, path: Path, title: str, cap: int, per_row: int = 4) -> None:
    """Every (task, cell) of ``data`` in panels of at most ``cap`` (≤ 8) curves (:func:`curve_panels`,
    :func:`draw_panel`), ``per_row`` panels a row, Sudoku first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by: dict[str, dict[str, list[dict]]] = {}
    for r in data["runs"].values():
        by.setdefault(r["task"], {}).setdefault(r["cell"], []).append(r)
    panels = [(task, cells) for task in sorted(by, key=lambda t: (t != "sudoku", t))
              for cells in curve_panels(list(by[task]), min(cap, 8))]
    if not panels:
        return
    ncol = min(per_row, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 5.4 * nrow), squeeze=False)
    for k, (task, cells) in enumerate(panels):
        draw_panel(axes[k // ncol][k % ncol], task, cells, by[task])
    for k in range(len(panels), nrow * ncol):
        axes[k // ncol][k % ncol].axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def headline_figure(path: Path, records: Path = R3, cap: int = 5) -> None:
    """The page's figure: the curves of ``records`` (the recipe that learns), a base and its credit arms a
    panel, at most ``cap`` curves each (:func:`curve_figure`)."""
    curve_figure(load_results(records, must_exist=True), path,
                 f"The recipe that learns ({records.name}): seed mean, band = range over seeds", cap)


def _wrap(words: list[str], width: int = 104) -> str:
    """One shell command from ``words``, continued with `` \\`` past ``width`` characters."""
    lines, cur = [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur + " \\")
            cur = "  " + w
        else:
            cur = f"{cur} {w}" if cur else w
    return "\n".join(lines + [cur])


def grid_markdown(root: Path = OUT.parent) -> str:
    """The tuning grids recorded under ``root/grid``: per task and family, each arm's seed-mean final
    selection-split solved rate (%) and seeds at each grid point, and the point it would run at now
    (:func:`best_points` over the seeds every point has; a point at the lowest or highest learning rate is
    marked *grid edge*: the optimum may lie outside the grid), then each task's bases ranked by their best
    point ('' when no grid is recorded)."""
    parts, bases = [], {}
    for path in sorted((root / "grid").glob("*.json")):
        task, _, family = path.stem.partition("_")
        if family not in GRID_FAMILIES:
            continue
        runs = load_results(path)["runs"]
        lrs = family_lrs({"runs": runs}, task, family)
        labels = [lab for lab, _ in grid_points(family, lrs)]
        sft = sorted({round(100 * r["val_curve"][0][1]["accuracy"], 1) for r in runs.values()})
        lines = [f"`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}` ({task}, {family}): seed-mean final "
                 f"solved rate on the selection split, % (seeds); the SFT model: {', '.join(map(str, sft))} %", "",
                 "| arm | " + " | ".join(labels) + " | best so far |", "| --- " * (len(labels) + 2) + "|"]
        for arm in GRID_FAMILIES[family]["arms"]:
            cells, complete = [], {}
            for lab in labels:
                rs = [r for r in runs.values() if r["cell"] == arm and r.get("grid_point") == lab and r["task"] == task]
                if rs:
                    cells.append(f"{100 * sum(r['val']['accuracy'] for r in rs) / len(rs):.1f} ({len(rs)})")
                    complete[lab] = {r["seed"] for r in rs}
                else:
                    cells.append("–")
            shared = set.intersection(*complete.values()) if complete else set()
            best = "–"
            if shared:
                b = best_points({"runs": runs}, task, family, sorted(shared), arms=[arm])[arm]
                edge = ", *grid edge*" if point_lr(b["point"]) in (min(lrs), max(lrs)) else ""
                best = f"{b['point']} ({100 * b['val_mean']:.1f}, seeds {','.join(map(str, b['seeds']))}{edge})"
                if arm == GRID_FAMILIES[family]["arms"][0]:
                    bases.setdefault(task, []).append((b["val_mean"], arm, b["point"], len(b["seeds"])))
            lines.append(f"| {arm} | " + " | ".join(cells) + f" | {best} |")
        parts.append("\n".join(lines) + "\n")
    if not parts:
        return ""
    for task, ranked in bases.items():
        parts.append(f"The {task} bases by their best grid point: " + ", ".join(
            f"{arm} {100 * m:.1f} ({point}, {n} seeds)" for m, arm, point, n in sorted(ranked, reverse=True)) + ".\n")
    return ("### Tuning grid (selection split)\n\nThe same learning-rate grid (and β where the base has one) for each "
            "base and its credit arms, seeds 0 and 1, extended by one rate of the ladder 1e-5 … 1e-3 (`LR_LADDER`) "
            "while an arm's best point lies at the grid's edge (*grid edge* below: an extension is pending, or "
            "the rate is a ladder end); each arm then runs at its own best point on 10 fresh seeds "
            "on the confirmation split (`--confirm`). The cached-rollout pair (`--confirm cache`) has no grid: both "
            "of its samplers run at the state base's best point.\n\n" + "\n".join(parts))


def test_markdown(root: Path = OUT.parent) -> str:
    """The test-file reads recorded under ``root/test`` (``--test-final``): per task, family and arm, the
    retrained seed's solved rate on the test file with its 95 % Wilson interval over the file's rows, its
    confirmation score and whether that reproduces the confirmation record ('' when none is recorded)."""
    from maskrl.stats import wilson_interval

    lines = []
    for path in sorted((root / "test").glob("*.json")):
        task, _, family = path.stem.partition("_")
        for key, r in sorted(load_results(path)["runs"].items()):
            n = r["provenance"]["splits"]["test"]["size"]
            lo, hi = wilson_interval(round(r["test"]["accuracy"] * n), n)
            lines.append(f"| {task} | {family} | {r['cell']} | {r['seed']} | {100 * r['test']['accuracy']:.1f} "
                         f"[{100 * lo:.1f}, {100 * hi:.1f}] ({n} rows) | {100 * r['confirmation']['accuracy']:.1f} | "
                         f"{'yes' if r.get('reproduces_confirmation') else 'no'} |")
    if not lines:
        return ""
    return ("### The test file (read once per headline cell)\n\nAfter every recipe was fixed, each arm's first "
            "confirmation seed retrained at its selected point and scored once on the test file "
            "(`--test-final`); the verdicts above do not read it.\n\n| task | family | arm | seed | test solved, % "
            "[95 % Wilson] | confirmation solved, % | retrained model reproduces its confirmation record |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(lines) + "\n")


def reproduce_commands() -> str:
    """The commands that regenerate the page and resume every record file, read from the records
    themselves (cells, seeds, ``--eval-every`` and ``--set`` overrides per task), as a shell block."""
    import shlex

    py = ["python", "benchmarks/controlled_table.py"]
    out = ["# this block, the verdicts and the figure", "python benchmarks/controlled_table.py --verdicts",
           "# the first table (each task resumes at the cadence its records were made with)",
           "python benchmarks/controlled_table.py --tasks sudoku,countdown --seeds 0,1,2,3,4",
           "python benchmarks/controlled_table.py --summary"]
    if R3.is_file():
        out.append("# the third-round table, one command per task")
        runs = load_results(R3)["runs"].values()
        for task in sorted({r["task"] for r in runs}, key=lambda t: (t != "sudoku", t)):
            rs = [r for r in runs if r["task"] == task]
            cells = sorted({r["cell"] for r in rs}, key=lambda c: list(CELLS).index(c) if c in CELLS else 99)
            (every,) = {r["eval_every"] for r in rs}
            (over,) = {tuple(r["overrides"]) for r in rs}
            words = py + ["--tasks", task, "--cells", ",".join(cells), "--seeds", ",".join(map(str, sorted({r["seed"] for r in rs}))),
                          "--eval-every", str(every), "--out", str(R3.relative_to(ROOT)), "--runs-dir", "runs/table_r3"]
            for o in over:
                words += ["--set", o]
            out.append(_wrap(words))
        out.append(f"python benchmarks/controlled_table.py --summary --out {R3.relative_to(ROOT)}")
    out += ["# the tuning grid on the selection split, then each arm at its best point on the confirmation split",
            "python benchmarks/controlled_table.py --tasks sudoku --grid spg --confirm spg",
            "python benchmarks/controlled_table.py --tasks sudoku --grid state,rldf,wd1,mf --confirm state,rldf,wd1,mf",
            "# the cached-rollout pair at the best point of the state base (no grid of its own)",
            "python benchmarks/controlled_table.py --tasks sudoku --confirm cache",
            "python benchmarks/controlled_table.py --tasks countdown --grid state,wd1 --confirm state,wd1",
            "# the test file, once every recipe is fixed (one retrained model per arm)",
            "python benchmarks/controlled_table.py --tasks sudoku --test-final state,rldf,wd1,mf,spg,cache",
            "python benchmarks/controlled_table.py --tasks countdown --test-final state,wd1",
            "# the testbed pilots, grouped by the seeds and cadence their records were made with"]
    groups: dict[tuple, list[str]] = {}
    for path in sorted((OUT.parent / "testbed_search").glob("*.json")):
        rs = list(load_results(path)["runs"].values())
        if rs:
            every = {r["eval_every"] for r in rs}
            key = (",".join(map(str, sorted(r["seed"] for r in rs))), every.pop() if len(every) == 1 else None)
            groups.setdefault(key, []).append(path.stem)
    for (seeds, every), names in groups.items():
        if every is not None:
            out.append(_wrap(["python", "benchmarks/testbed_search.py", "--run", ",".join(names), "--seeds", seeds,
                              "--eval-every", str(every)]))
    out.append("python benchmarks/testbed_search.py --summary")
    assert all(shlex.split(c.replace("\\\n", " ")) for c in out)
    return "```bash\n" + "\n".join(out) + "\n```\n"


VERDICT_MARKS = ("<!-- verdicts:begin -->", "<!-- verdicts:end -->")
README = ROOT / "README.md"
README_MARKS = ("<!-- results:begin -->", "<!-- results:end -->")
#: the verdict table's rows the README shows, as (task, cell): the testbed and one row per seed method
README_ROWS = [("sudoku", "diffu_grpo_state"), ("sudoku", "dispo@diffu_grpo_state"), ("sudoku", "dispo@spg"),
               ("sudoku", "dtca@rldf"), ("countdown", "dps@diffu_grpo_state"), ("sudoku", "sml@wd1")]


def readme_markdown(rows: list[dict]) -> str:
    """The README's results block: :data:`README_ROWS` of the verdict table (``rows`` from
    :func:`verdict_rows`) and a generated count of the verdicts over every credit-module claim (the rows
    whose base is not the SFT model, less the cached-rollout row), with the confirmation-split rows' numbers.

    Raises:
        KeyError: a :data:`README_ROWS` entry that names no claim.
    """
    by = {(r["task"], r["cell"]): r for r in rows}
    lines = [f"Top rows of the verdict table in [docs/results.md](docs/results.md) (generated by `python "
             f"benchmarks/controlled_table.py --verdicts`; tiny model, paired Δ solved rate in points, exact 95 % "
             f"t-intervals, Holm over {sum(1 for r in rows if r['stat'])} comparisons):", "",
             "| claim | task | ours | verdict | split, seeds |", "| --- | --- | --- | --- | --- |"]
    for key in README_ROWS:
        r, st = by[key], by[key]["stat"]
        ours = f"{_pts(st['mean'])} [{_pts(st['ci95'][0])}, {_pts(st['ci95'][1])}]".replace("-", "−") if st else "not run yet"
        where = _where(r) if st else "–"
        lines.append(f"| {r['claim']} | {r['task'].capitalize()} | {ours} | {r.get('verdict', '–')} | {where} |")
    credit = [r for r in rows if r["stat"] and r["base"] != "sft" and r["kind"] == "superior"]
    count = {v: [r for r in credit if r["verdict"] == v] for v in ("reproduced", "not reproduced", "undecided")}
    text = (f"Of the {len(credit)} credit-module comparisons with records, {len(count['reproduced'])} reproduced, "
            f"{len(count['not reproduced'])} not reproduced, {len(count['undecided'])} undecided.")
    conf = [r for r in credit if r["diff"]["split"] == "confirmation"]
    if conf:
        text += " On the confirmation split: " + "; ".join(
            f"{r['claim']} ({r['task']}) {_pts(r['stat']['mean'])} ({r['stat']['positive']} of {r['stat']['n']} seeds "
            f"above; Holm p {_p(r['p_t_holm'])} paired t, {_p(r['p_signflip_holm'])} sign-flip; {r['verdict']})"
            for r in conf) + "."
    pending = [r for r in rows if r["stat"] and r["diff"]["split"] == "selection"]
    if pending:
        part = sum(1 for r in pending if r["diff"].get("pending"))
        text += (f" {len(pending)} rows still read the selection split (their confirmation runs are not complete"
                 + (f"; {part} of them under way" if part else "") + "), so their p-values are optimistic.")
    return "\n".join(lines + ["", text]) + "\n"


def _replace_block(text: str, marks: tuple[str, str], block: str, where: str) -> str:
    begin, end = marks
    if begin not in text or end not in text:
        raise SystemExit(f"error: {where} has no {begin} ... {end} block to regenerate")
    return text[:text.index(begin)] + f"{begin}\n{block}{end}" + text[text.index(end) + len(end):]


def write_verdicts(doc: Path, readme: Path | None = README) -> list[dict]:
    """``--verdicts``: regenerate the verdict block at the top of ``doc`` and its figure
    (``<doc stem>_headline.png``) from the committed records, and the results block of ``readme`` (None:
    leave it); returns the rows.

    Raises:
        SystemExit: ``readme`` without its :data:`README_MARKS` block.
    """
    rows = verdict_rows()
    figure = doc.with_name(f"{doc.stem}_headline.png")
    headline_figure(figure)
    paths = sorted({Path(p) for c in CLAIMS for p in c["sources"]} | {OUT, R3}
                   | set((OUT.parent / "testbed_search").glob("*.json")) | set((OUT.parent / "grid").glob("*.json"))
                   | set((OUT.parent / "test").glob("*.json")))
    grid, test = grid_markdown(), test_markdown()
    block = verdict_markdown(rows, record_census(paths), figure.name) + ("\n" + test if test else "") + (
        "\n" + grid if grid else "") + (
        "\n### Reproduce\n\nGenerated from the records (each command resumes: recorded runs are skipped, a run "
        "recorded with other settings stops it). Runs are bit-reproducible on the same machine, software, thread "
        "count and CPU kernel set.\n\n" + reproduce_commands())
    begin, end = VERDICT_MARKS
    text = doc.read_text() if doc.is_file() else "# Results\n"
    if begin not in text:  # the block opens the page, under its title
        head, _, rest = text.partition("\n")
        text = f"{head}\n\n{begin}\n{end}\n{rest}"
    doc.write_text(_replace_block(text, VERDICT_MARKS, block, str(doc)))
    print(f"[table] wrote the verdicts of {doc} and {figure}", flush=True)
    if readme is not None:
        readme.write_text(_replace_block(readme.read_text(), README_MARKS, readme_markdown(rows), str(readme)))
        print(f"[table] wrote the results block of {readme}", flush=True)
    return rows


if __name__ == "__main__":
    main()
