"""diffu-GRPO on the demo's tiny Sudoku model, measured on a generated *validation* set.

Used to choose the demo's RL settings without touching the test file: 500 generated 8-blank
puzzles, disjoint from the training puzzles and from ``4x4_test_sudoku.csv``. Starts from the
demo's cached SFT model (run ``make demo`` once, or pass ``--sft DIR``), runs RL with the demo
config plus ``--set`` overrides, and evaluates greedily every ``--every`` steps.

    python benchmarks/demo/sudoku_rl_sweep.py --tag A --set train.lr=5e-5 --set train.steps=60
    -> one JSON line per evaluation appended to benchmarks/results/sudoku_rl_sweep.jsonl

Each line holds the greedy validation accuracy and cell accuracy, plus two diagnostics: ``oneshot``
(greedy, all 16 cells committed in one step from the all-masked state -- the state ``mean_field``
scores) and ``sampled`` (the rollout sampler, tau = 0.9, fixed seed); and, averaged over the last ``--every``
RL steps, the rollout reward and the fraction of groups whose rewards are not all equal.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from maskrl.config import ConfigError, load_config
from maskrl.demo import sft_cache_key
from maskrl.evaluate import evaluate_examples
from maskrl.models import load_tiny
from maskrl.pipeline import task_and_data
from maskrl.sampling import SamplerConfig
from maskrl.trainer import RLTrainer

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--sft", help="SFT model folder (default: the demo's cache for these settings)")
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sudoku_rl_sweep.jsonl"))
    args = ap.parse_args()
    if args.every < 1:
        ap.error(f"--every must be >= 1, got {args.every}")
    torch.set_num_threads(args.threads)
    try:
        cfg = load_config([ROOT / "configs" / "demo_sudoku.yaml"], args.overrides)
    except ConfigError as e:
        ap.error(str(e))
    task, test, _, train = task_and_data(cfg)
    banned = {task.instance_key(e) for e in test} | {task.instance_key(e) for e in train}
    val = task.generate(500, seed=4242, blanks=(8, 8), exclude=banned)
    run_dir = Path(cfg.output_dir) if Path(cfg.output_dir).is_absolute() else ROOT / cfg.output_dir
    sft = Path(args.sft) if args.sft else run_dir / "sft-cache" / sft_cache_key(cfg)
    if not (sft / "config.json").is_file():
        raise SystemExit(f"no SFT model at {sft}: run `make demo` first or pass --sft DIR")
    policy = load_tiny(sft)
    sampler = cfg.eval
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    oneshot = SamplerConfig(gen_length=sampler.gen_length, block_length=sampler.gen_length, steps=1)

    def record(step: int, extra: dict) -> None:
        model = trainer.policy_eval if step else policy
        m = evaluate_examples(model, task, val, sampler, batch_size=250).metrics
        one = evaluate_examples(model, task, val, oneshot, batch_size=250).metrics
        smp = evaluate_examples(model, task, val, cfg.rollout, batch_size=250,
                                generator=torch.Generator().manual_seed(5)).metrics
        row = {"tag": args.tag, "overrides": args.overrides, "step": step, "val_accuracy": m["accuracy"],
               "val_accuracy_ci95": m["accuracy_ci95"], "val_cell_accuracy": m["cell_accuracy"],
               "oneshot_accuracy": one["accuracy"], "sampled_accuracy": smp["accuracy"],
               "sampled_cell_accuracy": smp["cell_accuracy"], **extra}
        print(json.dumps(row), flush=True)
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    trainer = None
    record(0, {})
    trainer = RLTrainer(cfg, policy, task, train)
    t0 = time.time()
    hist = []
    for i in range(cfg.train.steps):
        hist.append(trainer.step())
        if (i + 1) % args.every == 0:
            last = hist[-args.every:]
            record(i + 1, {key: sum(h[key] for h in last) / len(last) for key in ("reward", "informative_groups")}
                   | {"seconds": time.time() - t0})


if __name__ == "__main__":
    main()
