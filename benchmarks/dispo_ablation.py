"""DiSPO ablation (issue 11, item 5) on the tiny model, CPU.

Cells: {diffu_grpo, spg} x {base, dispo} from the shipped recipes
``configs/dispo_<task>_<base>_<variant>.yaml`` (a pair differs only in its ``credit`` list). Every
cell starts from the task's SFT checkpoint (the DACA ablation's: the recipes share its model, task
and SFT sections, so the cache is shared), runs the same number of RL steps (rollout batches) per
seed, and is scored greedily on a generated **validation** split (disjoint from the training rows
and the test file). The test file is read only with ``--test``. Within a base the update budget is
identical (same rollouts, same optimizer steps); across bases it is not: diffu-GRPO takes μ = 4
optimizer steps per batch, SPG (ratio-free, on-policy) μ = 1. Each row records both.

Reward-distinguishable states (seed 004's analysis): the share of branched states whose Z fillings
get different rewards, by timestep bin (t/T early < 1/3 <= mid < 2/3 <= late). Two sources:
``probe`` (per task, the SFT model, ``timing: uniform`` so every bin is sampled, rollouts only, no
update) and, per DiSPO run, the states branched during training (late-biased, so few are early).

Resumable: each finished run is written to ``--out`` at once and skipped on the next call with the
same step budget.

    python benchmarks/dispo_ablation.py --steps 40 --seeds 0,1,2 --tasks sudoku --out benchmarks/results/dispo_sudoku.json
    python benchmarks/dispo_ablation.py --summary --merge benchmarks/results/dispo_sudoku.json,benchmarks/results/dispo_countdown.json \
        --out benchmarks/results/dispo_ablation.json
    python benchmarks/dispo_ablation.py --steps 1 --seeds 0 --val-size 16 --probe-batches 1 --tasks sudoku \
        --out /tmp/dispo_smoke.json   # smoke
"""
from __future__ import annotations

from pathlib import Path

from ablation_runs import (ROOT, TaskSetup, ablation_parser, plot_curves, require_runs, run_cell, save_results, start,
                           summary_rows)
from maskrl.credit.dispo import BINS


def bin_counts(metric_rows: list[dict], prefix: str) -> dict:
    """Σ over steps of ``<prefix>states_<bin>`` and ``<prefix>kept_<bin>``, and their ratio."""
    out = {}
    for b in BINS:
        states = sum(m.get(f"{prefix}states_{b}", 0.0) for m in metric_rows)
        kept = sum(m.get(f"{prefix}kept_{b}", 0.0) for m in metric_rows)
        out[b] = {"states": states, "kept": kept, "frac": kept / states if states else None}
    return out


def probe(setup: TaskSetup, recipe: Path, common: list[str], batches: int, seed: int = 0) -> dict:
    """Distinguishable-state fractions of the SFT model at uniformly drawn states (no update)."""
    tr = setup.trainer(recipe, common + [f"train.seed={seed}", "credit=[{name: dispo, z: 2, timing: uniform}]",
                                         f"output_dir={ROOT / 'runs' / 'dispo' / 'probe'}"])
    rows = [tr.collect().metrics for _ in range(batches)]
    tr.close()
    return {"batches": batches, "rollouts": batches * tr.tc.prompts_per_step * tr.tc.group_size, "z": 2,
            "timing": "uniform", "model": "sft", "bins": bin_counts(rows, "dispo/")}


def main() -> None:
    ap = ablation_parser(__doc__, "sudoku,countdown", "dispo_ablation.json")
    ap.add_argument("--cells", default="diffu_grpo_base,diffu_grpo_dispo,spg_base,spg_dispo")
    ap.add_argument("--steps", type=int, default=0, help="RL steps per run (equal for every cell)")
    ap.add_argument("--probe-batches", type=int, default=4, help="rollout batches of the SFT-model probe (0 = none)")
    args = ap.parse_args()
    if not args.summary and args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    out, data, seeds, tasks = start(args, ("probe",))
    cells = [c for c in args.cells.split(",") if c]
    if not args.summary:
        for task in tasks:
            base = ROOT / "configs" / f"dispo_{task}_diffu_grpo_base.yaml"
            setup = TaskSetup(task, base, args.overrides, "daca", args.val_size,
                              gen_kw={"blanks": (8, 8)} if task == "sudoku" else None)
            if args.probe_batches and task not in data.setdefault("probe", {}):
                data["probe"][task] = probe(setup, base, args.overrides, args.probe_batches)
                save_results(out, data)
                print(f"[dispo] probe {task}: {data['probe'][task]['bins']}", flush=True)
            for cell in cells:
                for seed in seeds:
                    run_cell(setup, data, out, task, cell, ROOT / "configs" / f"dispo_{task}_{cell}.yaml",
                             args.overrides, args.steps, seed, args.test, group="dispo", curves=_curves)
    require_runs(data, out)
    data["summary"] = summary_rows(data)
    for entry in data["summary"]:
        rows = [r for r in data["runs"].values()
                if (r["task"], r["cell"], r["steps"]) == (entry["task"], entry["cell"], entry["steps"]) and "dispo_bins" in r]
        if rows:
            entry["dispo_bins"] = {b: _pool([r["dispo_bins"][b] for r in rows]) for b in BINS}
    save_results(out, data)
    plot_curves(data, out.with_suffix(".png"), {"rewards": "mean rollout reward", "kept_frac": "DiSPO kept-state share"})


def _pool(parts: list[dict]) -> dict:
    states, kept = sum(p["states"] for p in parts), sum(p["kept"] for p in parts)
    return {"states": states, "kept": kept, "frac": kept / states if states else None}


def _curves(hist: list[dict]) -> dict:
    out = {}
    if any("credit/dispo/kept_frac" in h for h in hist):
        out["kept_frac"] = [h.get("credit/dispo/kept_frac", 0.0) for h in hist]
        out["dispo_bins"] = bin_counts(hist, "credit/dispo/")
    return out


if __name__ == "__main__":
    main()
