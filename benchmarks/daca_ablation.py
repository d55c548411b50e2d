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

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch

from maskrl.config import load_config
from maskrl.demo import sft_cache_key
from maskrl.evaluate import evaluate_examples
from maskrl.models import load_tiny, save_model
from maskrl.pipeline import load_policy, prompt_formatter, sft_from_config, task_and_data
from maskrl.trainer import RLTrainer

ROOT = Path(__file__).resolve().parents[1]
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def cell_config(task: str, cell: str, overrides: list[str]):
    """(recipe path, extra overrides) of a cell: ``<base>_<variant>`` or a reference row."""
    if cell == "state":
        return ROOT / "configs" / f"daca_{task}_diffu_grpo_base.yaml", ["likelihood={name: state, p_mask_prompt: 0.15}"]
    if cell == "ltr":
        path = ROOT / "configs" / f"daca_{task}_diffu_grpo_base.yaml"
        L = load_config([path], overrides).rollout.gen_length
        return path, ["likelihood={name: state, p_mask_prompt: 0.15}", "rollout.block_length=1", f"rollout.steps={L}"]
    return ROOT / "configs" / f"daca_{task}_{cell}.yaml", []


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95 % Student-t interval (the mean alone for one value)."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, m, m
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = T95.get(n - 1, 1.96) * sd / math.sqrt(n)
    return m, m - h, m + h


def load_results(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {"runs": {}}


def save_results(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)  # an interrupted write never leaves half a file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="sudoku,countdown")
    ap.add_argument("--bases", default="diffu_grpo,wd1")
    ap.add_argument("--variants", default="base,dps,sml,both")
    ap.add_argument("--extra", default="state,ltr", help="reference rows ('' for none)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, required=True, help="RL steps per run (equal for every cell)")
    ap.add_argument("--sft-steps", type=int, default=0, help="override the recipes' SFT steps (0 = keep)")
    ap.add_argument("--val-size", type=int, default=300)
    ap.add_argument("--test", action="store_true", help="also score the test file (final table only)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "daca_ablation.json"))
    ap.add_argument("--summary", action="store_true", help="only (re)write the summary and the PNG")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    data = load_results(out)
    seeds = [int(s) for s in args.seeds.split(",") if s != ""]
    cells = [f"{b}_{v}" for b in args.bases.split(",") if b for v in args.variants.split(",") if v]
    cells += [c for c in args.extra.split(",") if c]
    common = list(args.overrides) + (["sft.steps=%d" % args.sft_steps] if args.sft_steps else [])
    if not args.summary:
        for task in [t for t in args.tasks.split(",") if t]:
            run_task(task, cells, seeds, args, common, data, out)
    summarise(data, out)


def run_task(task: str, cells: list[str], seeds: list[int], args, common: list[str], data: dict, out: Path) -> None:
    base_cfg = load_config([ROOT / "configs" / f"daca_{task}_diffu_grpo_base.yaml"], common)
    tk, test, source, train = task_and_data(base_cfg)
    banned = {tk.instance_key(e) for e in test} | {tk.instance_key(e) for e in train}
    gen_kw = {"blanks": (8, 8)} if task == "sudoku" else {}
    val = tk.generate(args.val_size, seed=4242, exclude=banned, **gen_kw)
    sft_dir = ROOT / "runs" / "daca" / f"{task}_sft" / sft_cache_key(base_cfg)
    if not (sft_dir / "maskrl_sft.json").is_file():
        print(f"[daca] SFT {task} ({base_cfg.sft.steps} steps) -> {sft_dir}", flush=True)
        policy = load_policy(base_cfg)
        hist = sft_from_config(base_cfg, policy, tk, train, progress=False)
        save_model(policy, sft_dir)
        (sft_dir / "maskrl_sft.json").write_text(json.dumps({"steps": base_cfg.sft.steps, "last": hist[-1] if hist else {}}))
    for cell in cells:
        for seed in seeds:
            key = f"{task}/{cell}/seed{seed}/steps{args.steps}"
            if key in data["runs"]:
                continue
            path, extra = cell_config(task, cell, common)
            cfg = load_config([path], common + extra + [f"train.steps={args.steps}", f"train.seed={seed}",
                                                        f"output_dir={ROOT / 'runs' / 'daca' / key.replace('/', '_')}",
                                                        "train.eval_every=0", "train.save_every=0"])
            policy = load_tiny(sft_dir)
            fmt = prompt_formatter(policy, cfg.model.chat_template)
            t0 = time.time()
            tr = RLTrainer(cfg, policy, tk, train, prompt_fn=fmt)
            hist = tr.train(progress=False)
            tr.close()
            secs = time.time() - t0
            ev = evaluate_examples(tr.policy_eval, tk, val, cfg.eval, batch_size=250, prompt_fn=fmt).metrics
            row = {"task": task, "cell": cell, "seed": seed, "steps": args.steps, "rl_seconds": secs,
                   "val": {k: ev[k] for k in ("accuracy", "cell_accuracy", "mean_reward") if k in ev},
                   "val_size": len(val), "rewards": [h["reward"] for h in hist], "recipe": str(path.relative_to(ROOT)),
                   "overrides": common + extra}
            if args.test:
                te = evaluate_examples(tr.policy_eval, tk, test, cfg.eval, batch_size=250, prompt_fn=fmt).metrics
                row["test"] = {k: te[k] for k in ("accuracy", "cell_accuracy", "mean_reward") if k in te}
                row["test_source"] = source
            data["runs"][key] = row
            save_results(out, data)  # each finished run at once: an interrupted ablation resumes
            print(f"[daca] {key}: val accuracy {row['val']['accuracy']:.3f} ({secs:.0f} s)", flush=True)


def summarise(data: dict, out: Path) -> None:
    groups: dict[tuple, list[dict]] = {}
    for row in data["runs"].values():
        groups.setdefault((row["task"], row["cell"], row["steps"]), []).append(row)
    summary = []
    for (task, cell, steps), rows in sorted(groups.items()):
        entry = {"task": task, "cell": cell, "steps": steps, "seeds": sorted(r["seed"] for r in rows)}
        for split in ("val", "test"):
            if all(split in r for r in rows):
                entry[split] = {}
                # accuracy = solved rate; mean_reward = the papers' Sudoku metric (cell accuracy) and
                # Countdown's reward with its 0.1 format credit
                for metric in ("accuracy", "mean_reward"):
                    m, lo, hi = t_interval([r[split][metric] for r in rows])
                    entry[split][f"{metric}_mean"] = m
                    entry[split][f"{metric}_ci95"] = [lo, hi]
        summary.append(entry)
    data["summary"] = summary
    save_results(out, data)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    tasks = sorted({t for t, _, _ in groups})
    if not tasks:
        return
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for (t, cell, steps), rows in sorted(groups.items()):
            if t != task:
                continue
            curves = [r["rewards"] for r in rows]
            n = min(len(c) for c in curves)
            ax.plot(range(1, n + 1), [sum(c[i] for c in curves) / len(curves) for i in range(n)],
                    label=f"{cell} ({len(curves)} seeds)")
        ax.set_title(task)
        ax.set_xlabel("RL step")
        ax.set_ylabel("mean rollout reward")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
