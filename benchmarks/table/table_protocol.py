"""The controlled table's protocol as data: the cells (each replaces whole component sections of a task's
base recipe), the base recipes they start from, the tuning grid (learning rates, β, the ladder it extends
along, each arm's best point) and the confirmation seeds, and where each run's record goes (record files,
run keys). Pure definitions over the records, no model and no data: the runner (:mod:`table_runs`), the
pages (:mod:`table_pages`, :mod:`table_verdicts`) and the command line (:mod:`controlled_table`, whose
docstring states the protocol) read them."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

from ablation_runs import ROOT


#: record files: the first table, its GPU cells, the third-round table ("the recipe that learns"); the page
OUT = ROOT / "results" / "controlled_table.json"
OUT_8B = ROOT / "results" / "controlled_table_8b.json"
R3 = OUT.parent / "controlled_table_r3.json"
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
SML_MIX = {"name": "stratified", "k": 4, "layout": "random", "full": 0.5, "sml": 0.5, "p_mask_prompt": 0.15}  # docs/spec.md §2.2
SML_WD1 = {"name": "stratified", "k": 4, "layout": "random", "full": 1.0, "sml": 1.0, "p_mask_prompt": 0.15}
DPS = {"name": "dps", "lam": 0.5, "dps_target": "confidence", "dps_scope": "all", "dps_normalize": "auto", "clip": 2.0}
DISPO = {"name": "dispo", "z": 2, "timing": "late", "power": 4.0, "alpha_base": 1.0, "alpha_step": 0.1, "clip_eps": 0.5,
         "p_mask_prompt": 0.15}  # docs/spec.md §4, alpha_step 0.1 after SFT
RLDF_STEPS = {"name": "rldf_steps", "k": 4, "temperature": 1.0, "keep_threshold": 0.6}  # docs/spec.md §1.5 rldf
THRESHOLD = {"schedule": "threshold", "threshold": 0.9}
ELBO = {"name": "elbo", "nodes": 2, "draws": 1}
SPG_BOUNDS = {"name": "spg_bounds", "nodes": 2, "draws": 1, "masking": "block", "block_length": 0, "eubo_beta": 1.5,
              "p_mask_prompt": 0.0}


def dtca(pos: bool = True, calibration: bool = True) -> dict:
    """DTCA's credit entry (docs/spec.md §3); ``pos_weights`` is filled in per task (:func:`pos_table`)."""
    return {"name": "dtca", "coverage": 0.7, "min_steps": 2, "max_steps": 32, "pos_credit": pos, "calibration": calibration,
            "keep_threshold": 0.6, "pos_weights": "<table>", "tagger": "maskrl.pos:spacy_pos_classes"}


def cell(kind: str, base: str | None, objective: dict, likelihood: dict, credit: list | None = None,
         rollout: dict | None = None, train: dict | None = None, note: str = "") -> dict:
    return {"kind": kind, "base": base, "objective": objective, "likelihood": likelihood, "credit": credit or [],
            "rollout": rollout or {}, "train": train or {}, "note": note}


#: every cell: its kind, the cell its paired difference is taken against, and its sections
CELLS: dict[str, dict] = {
    # bases (docs/spec.md §1.5, §2.3)
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
                raise SystemExit(f"error: cell {name} needs a POS table (DTCA, docs/spec.md §3.1)")
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
    path.write_text(f"# controlled table cell {name} over {base_yaml.name} (benchmarks/table/controlled_table.py)\n"
                    + yaml.safe_dump(data, sort_keys=False))
    return path


def gpu_base(task: str, out_dir: Path) -> Path:
    """Write the GPU table base of ``task`` to ``out_dir`` and return its path: the shipped 8B recipe
    :data:`RECIPES_8B` ``[task]`` with what every cell of a table shares pinned (the module docstring):
    ``train.inner_iterations`` 1, ``rollout.schedule`` fixed at ``gen_length // 2`` steps (docs/spec.md §1.2,
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
                    "(benchmarks/table/controlled_table.py gpu_base)\n" + yaml.safe_dump(data, sort_keys=False))
    return path


def run_key(task: str, name: str, seed: int, point: str = "") -> str:
    """A record's key: ``<task>/<cell>/seed<s>``, with the grid point (``lr=...``) before the seed in a grid file."""
    return f"{task}/{name}/" + (f"{point}/" if point else "") + f"seed{seed}"


def curve_area(curve: list) -> float:
    """Trapezoid area under accuracy-vs-step divided by the last step (the run's mean accuracy)."""
    pts = [(s, m["accuracy"]) for s, m in curve]
    if len(pts) < 2 or pts[-1][0] == 0:
        return pts[-1][1] if pts else float("nan")
    area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in zip(pts, pts[1:]))
    return area / pts[-1][0]


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
#: point (the cached-rollout pair is one base with two samplers, not a base and a credit arm);
#: ``sft_claim``: the family's base carries the headline claim over the SFT model, so ``--test-final``
#: also reads the SFT model on the test file (once, beside the arms)
GRID_FAMILIES: dict[str, dict] = {
    "spg": {"arms": ("spg", "dispo@spg", "dispo-kl@spg"), "beta": ()},
    "rldf": {"arms": ("rldf", "dtca@rldf"), "beta": (0.01, 0.04)},
    "wd1": {"arms": ("wd1", "sml@wd1", "dps@wd1"), "beta": ()},
    "state": {"arms": ("diffu_grpo_state", "dispo@diffu_grpo_state", "dps@diffu_grpo_state"), "beta": (0.04, 0.1),
              "sft_claim": True},
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
