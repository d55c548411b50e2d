"""What changes sampled and greedy outputs (issue 13 item 10; docs/eval.md "Determinism").

On the built-in tiny model (demo shape, seed 0, an SFT of ``--sft-steps`` steps on generated 4x4 Sudoku
with the demo's ``{puzzle}=`` prompt), 40 held-out puzzles:

* greedy (τ = 0) in float32 vs bfloat16 weights: how many of the 40 completions are equal;
* greedy in batches of 40 vs batches of 8 (float32): how many are equal;
* sampled (τ = 0.9) with the same generator seed in batches of 40 vs 8: how many are equal.

Writes JSON to ``--out`` (default ``benchmarks/fidelity/determinism.json``) and prints it.
Run: ``OMP_NUM_THREADS=1 python benchmarks/fidelity/determinism.py``.
"""
from __future__ import annotations

import argparse
import copy
import json

import torch

from maskrl.evaluate import complete
from maskrl.models import build_tiny
from maskrl.sampling import SamplerConfig
from maskrl.sft import run_sft
from maskrl.tasks import get_task


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--out", default="benchmarks/fidelity/determinism.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    task = get_task("sudoku4x4", "{puzzle}=")
    train = task.generate(2000, seed=1234)
    test = task.generate(args.n, seed=99, exclude=[task.instance_key(e) for e in train])
    a = build_tiny(seed=0)
    run_sft(a, train, task.target, gen_length=16, steps=args.sft_steps, batch_size=64, lr=1e-3, warmup_steps=20,
            progress=False)
    a.model.eval()
    prompts = [ex.prompt for ex in test]
    greedy = SamplerConfig(gen_length=16, block_length=16, steps=16)
    sampled = SamplerConfig(gen_length=16, block_length=16, steps=16, temperature=0.9)

    def run(adapter, cfg, bs, seed=0):
        g = torch.Generator().manual_seed(seed)
        return complete(adapter, prompts, cfg, batch_size=bs, generator=g)

    fp32 = run(a, greedy, args.n)
    b16 = copy.deepcopy(a)
    b16.model.to(torch.bfloat16)
    bf16 = run(b16, greedy, args.n)
    greedy8 = run(a, greedy, 8)
    s40, s8 = run(a, sampled, args.n), run(a, sampled, 8)
    eq = lambda x, y: sum(p == q for p, q in zip(x, y))  # noqa: E731
    res = {"n": args.n, "sft_steps": args.sft_steps,
           "greedy_float32_vs_bfloat16_equal": eq(fp32, bf16),
           "greedy_batch40_vs_batch8_equal": eq(fp32, greedy8),
           "sampled_batch40_vs_batch8_equal_same_seed": eq(s40, s8),
           "solved_float32": sum(task.is_correct(r) for r in task.score_examples(test, fp32)),
           "solved_bfloat16": sum(task.is_correct(r) for r in task.score_examples(test, bf16))}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(res, fh, indent=2)
        fh.write("\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
