"""DACA-GRPO ablation (issue 9, item 6) on the tiny model, CPU.

Cells: {diffu_grpo (mean_field), wd1} x {base, +DPS, +SML, +both} from the shipped recipes
``configs/daca_<task>_<base>_<variant>.yaml``, plus two reference rows that need no new code:
``state`` (diffu-GRPO with the state likelihood, the demo's recipe) and ``ltr`` (plain GRPO in
left-to-right order: block length 1, one token per step, state likelihood -- JustGRPO, SPEC §2.3).
Every cell starts from one SFT checkpoint per task (cached), runs the same number of RL steps per
seed, and is scored greedily on a generated **validation** split (disjoint from the training rows
and the test file). The test file is only read with ``--test`` (for the final table, after the
recipes are fixed); the JSON records which split each number comes from.

Resumable: each finished (task, cell, seed) run is written to ``--out`` at once and skipped on
the next call with the same step budget. ``--summary`` adds per-cell mean and 95 % t-interval over
seeds and a PNG of mean rollout-reward curves next to the JSON.

    python benchmarks/daca_ablation.py --steps 30 --seeds 0,1,2 --out benchmarks/results/daca_ablation.json
    python benchmarks/daca_ablation.py --steps 1 --seeds 0 --sft-steps 5 --val-size 16 \
        --tasks sudoku --bases diffu_grpo --variants base,dps --extra '' --out /tmp/daca_smoke.json   # smoke
"""
from __future__ import annotations


from ablation_runs import (ROOT, TaskSetup, ablation_parser, plot_curves, require_runs, run_cell, save_results, start,
                           summary_rows)
from maskrl.config import load_config


def cell_config(task: str, cell: str, overrides: list[str]):
    """(recipe path, extra overrides) of a cell: ``<base>_<variant>`` or a reference row."""
    if cell == "state":
        return ROOT / "configs" / f"daca_{task}_diffu_grpo_base.yaml", ["likelihood={name: state, p_mask_prompt: 0.15}"]
    if cell == "ltr":
        path = ROOT / "configs" / f"daca_{task}_diffu_grpo_base.yaml"
        L = load_config([path], overrides).rollout.gen_length
        return path, ["likelihood={name: state, p_mask_prompt: 0.15}", "rollout.block_length=1", f"rollout.steps={L}"]
    return ROOT / "configs" / f"daca_{task}_{cell}.yaml", []


def main() -> None:
    ap = ablation_parser(__doc__, "sudoku,countdown", "daca_ablation.json", merge=False)
    ap.add_argument("--bases", default="diffu_grpo,wd1")
    ap.add_argument("--variants", default="base,dps,sml,both")
    ap.add_argument("--extra", default="state,ltr", help="reference rows ('' for none)")
    ap.add_argument("--steps", type=int, required=True, help="RL steps per run (equal for every cell)")
    ap.add_argument("--sft-steps", type=int, default=0, help="override the recipes' SFT steps (0 = keep)")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    out, data, seeds, tasks = start(args)
    cells = [f"{b}_{v}" for b in args.bases.split(",") if b for v in args.variants.split(",") if v]
    cells += [c for c in args.extra.split(",") if c]
    common = list(args.overrides) + (["sft.steps=%d" % args.sft_steps] if args.sft_steps else [])
    if not args.summary:
        for task in tasks:
            setup = TaskSetup(task, ROOT / "configs" / f"daca_{task}_diffu_grpo_base.yaml", common, "daca", args.val_size,
                              gen_kw={"blanks": (8, 8)} if task == "sudoku" else None)
            for cell in cells:
                path, extra = cell_config(task, cell, common)
                for seed in seeds:
                    run_cell(setup, data, out, task, cell, path, common + extra, args.steps, seed, args.test,
                             group="daca")
    # accuracy = solved rate; mean_reward = the papers' Sudoku metric (cell accuracy) and Countdown's
    # reward with its 0.1 format credit
    require_runs(data, out)
    data["summary"] = summary_rows(data)
    save_results(out, data)
    plot_curves(data, out.with_suffix(".png"), {"rewards": "mean rollout reward"})


if __name__ == "__main__":
    main()
