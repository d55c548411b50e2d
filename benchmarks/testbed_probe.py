"""Headroom of candidate SFT checkpoints for the controlled table's testbed (issue 22, part 1).

Group-relative RL sharpens what the group already samples: an SFT checkpoint leaves room for RL when
its pass@G at the rollout temperature is far above its greedy accuracy. For each task and each SFT
length this script trains (or reuses) the SFT checkpoint of the task's table recipe with
``sft.steps`` replaced, and measures on the generated **validation** split (never the test file):

- greedy accuracy (τ = 0, the evaluation sampler);
- with the rollout sampler (τ of the recipe), G samples per prompt: the mean sample accuracy and
  pass@g for g = 1, 2, 4, 6, 8, 16 (unbiased estimator of Chen et al. 2021 from n = max g samples).

Each (task, sft steps) record is written to ``--out`` as soon as it is measured (resumable).

    python benchmarks/testbed_probe.py --tasks sudoku,countdown --sft-steps 150,200,250,300 \
        --out results/testbed_probe.json
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from ablation_runs import ROOT, TaskSetup, load_results, save_results
from table_protocol import BASES as RECIPES, GEN_KW
from maskrl.evaluate import evaluate_examples
from maskrl.models import load_tiny
from maskrl.pipeline import prompt_formatter

PASS_K = (1, 2, 4, 6, 8, 16)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``c`` correct of ``n`` samples: 1 − C(n−c, k)/C(n, k) (Chen et al. 2021)."""
    if k > n:
        raise ValueError(f"k (={k}) must be <= n (={n})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def probe(setup: TaskSetup, samples: int, seed: int) -> dict:
    """Greedy accuracy and sampled pass@k of ``setup``'s SFT checkpoint on its validation split."""
    policy = load_tiny(setup.ensure_sft())
    cfg = setup.cfg
    fmt = prompt_formatter(policy, cfg.model.chat_template)
    greedy = evaluate_examples(policy, setup.task, setup.val, cfg.eval, batch_size=250, prompt_fn=fmt)
    rows = [ex for ex in setup.val for _ in range(samples)]
    gen = torch.Generator().manual_seed(seed)
    sampled = evaluate_examples(policy, setup.task, rows, cfg.rollout, batch_size=240, prompt_fn=fmt, generator=gen)
    correct = [sum(1 for r in sampled.rewards[i * samples:(i + 1) * samples] if setup.task.is_correct(r))
               for i in range(len(setup.val))]
    n = len(setup.val)
    out = {"greedy_accuracy": greedy.metrics["accuracy"], "greedy_mean_reward": greedy.metrics.get("mean_reward"),
           "sample_accuracy": sum(correct) / (n * samples), "samples_per_prompt": samples,
           "temperature": cfg.rollout.temperature, "val_size": n}
    for k in PASS_K:
        if k <= samples:
            out[f"pass@{k}"] = sum(pass_at_k(samples, c, k) for c in correct) / n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="sudoku,countdown")
    ap.add_argument("--sft-steps", default="150,200,250,300")
    ap.add_argument("--samples", type=int, default=16, help="samples per validation prompt at the rollout temperature")
    ap.add_argument("--val-size", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default=str(ROOT / "results" / "testbed_probe.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    data = load_results(out)
    for task in [t for t in args.tasks.split(",") if t]:
        for steps in [int(s) for s in args.sft_steps.split(",") if s]:
            key = f"{task}/sft{steps}"
            if key in data["runs"]:
                print(f"[probe] {key}: already in {out}", flush=True)
                continue
            t0 = time.time()
            setup = TaskSetup(task, RECIPES[task], args.overrides + [f"sft.steps={steps}"], "table", args.val_size,
                              gen_kw=GEN_KW.get(task))
            row = {"task": task, "sft_steps": steps, "overrides": args.overrides, **probe(setup, args.samples, args.seed),
                   "sft_dir": str(setup.sft_dir.relative_to(ROOT)), "seconds": time.time() - t0}
            data["runs"][key] = row
            save_results(out, data)
            print(f"[probe] {key}: greedy {row['greedy_accuracy']:.3f} pass@6 {row.get('pass@6', float('nan')):.3f} "
                  f"pass@16 {row.get('pass@16', float('nan')):.3f} ({row['seconds']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
