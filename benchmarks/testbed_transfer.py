"""Does the base learn at all, and does what it learns transfer? (issue 22, part 1 diagnostic)

The testbed pilots (``benchmarks/testbed_search.py``) see each training prompt once and move the
validation solved rate by 1-3 points. This script separates "RL does not learn" from "what RL
learns does not transfer to unseen prompts": it trains the table's ``diffu_grpo_state`` base on a
**fixed pool** of ``--pool`` training prompts (every step draws its prompts from that pool, so each
is seen many times) and measures

- the rollout reward on the pool, step by step (``rewards``);
- the pool's sampled mean reward and solved rate (``--samples`` per prompt at the rollout
  temperature, a fixed ``torch.Generator`` seed) before and after;
- the greedy validation solved rate (300 generated rows, never the test file) before and after.

    python benchmarks/testbed_transfer.py --tasks sudoku,countdown --out results/testbed_transfer.json

Each task's record is written as soon as it finishes.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ablation_runs import ROOT, load_results, save_results
from table_protocol import BASES, GEN_KW, cell_recipe
from table_runs import Setup
from maskrl.config import load_config
from maskrl.evaluate import evaluate_examples
from maskrl.pipeline import prompt_formatter
from maskrl.trainer import RLTrainer

#: the SFT length and RL settings of the search's pilots (results/testbed_search/)
SETTINGS = {"sudoku": ["sft.steps=250"], "countdown": ["sft.steps=1000"]}
RL = ["likelihood.p_mask_prompt=0", "objective.beta=0", "train.lr=1e-4", "train.prompts_per_step=8"]


def pool_metrics(policy, setup: Setup, cfg, pool: list, samples: int, seed: int, fmt) -> dict:
    """Sampled mean reward and solved rate of ``pool`` (``samples`` completions per prompt)."""
    rows = [ex for ex in pool for _ in range(samples)]
    res = evaluate_examples(policy, setup.task, rows, cfg.rollout, batch_size=256, prompt_fn=fmt,
                            generator=torch.Generator().manual_seed(seed))
    return {"mean_reward": res.metrics["mean_reward"], "solved": res.metrics["accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="sudoku,countdown")
    ap.add_argument("--pool", type=int, default=8, help="training prompts in the fixed pool")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--val-size", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "results" / "testbed_transfer.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    data = load_results(out)
    for task in [t for t in args.tasks.split(",") if t]:
        key = f"{task}/pool{args.pool}/steps{args.steps}/seed{args.seed}"
        if key in data["runs"]:
            print(f"[transfer] {key}: recorded, skipped", flush=True)
            continue
        t0 = time.process_time()
        setup = Setup(task, BASES[task], SETTINGS[task], "table", args.val_size, gen_kw=GEN_KW.get(task))
        recipe = cell_recipe(BASES[task], "diffu_grpo_state", None, ROOT / "runs" / "table" / "recipes")
        cfg = load_config([recipe], SETTINGS[task] + RL + [
            f"train.steps={args.steps}", f"train.seed={args.seed}", "train.save_every=0",
            f"output_dir={ROOT / 'runs' / 'table' / ('transfer_' + key.replace('/', '_'))}"])
        policy = setup.policy()
        fmt = prompt_formatter(policy, cfg.model.chat_template)
        pool = setup.train[:args.pool]
        before = {"pool": pool_metrics(policy, setup, cfg, pool, args.samples, args.seed, fmt),
                  "val": setup.evaluate(policy, cfg, setup.val)}
        tr = RLTrainer(cfg, policy, setup.task, pool, prompt_fn=fmt)
        hist = tr.train(progress=False)
        tr.close()
        after = {"pool": pool_metrics(tr.policy_eval, setup, cfg, pool, args.samples, args.seed, fmt),
                 "val": setup.evaluate(tr.policy_eval, cfg, setup.val)}
        row = {"task": task, "pool": args.pool, "steps": args.steps, "seed": args.seed, "overrides": SETTINGS[task] + RL,
               "rewards": [h["reward"] for h in hist], "before": before, "after": after,
               "cpu_seconds": time.process_time() - t0}
        data["runs"][key] = row
        save_results(out, data)
        print(f"[transfer] {key}: pool reward {before['pool']['mean_reward']:.3f} -> {after['pool']['mean_reward']:.3f}, "
              f"pool solved {before['pool']['solved']:.3f} -> {after['pool']['solved']:.3f}, "
              f"val solved {before['val']['accuracy']:.3f} -> {after['val']['accuracy']:.3f}", flush=True)


if __name__ == "__main__":
    main()
