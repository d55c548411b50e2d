"""One learning result on the tiny block-diffusion model (issue 48 item 5): SFT, then diffu-GRPO with the
state likelihood (TraceRL's rounds on block rollouts), on Sudoku with ``model.tiny.block_size: 4``,
decoded the block way (block 4, one token a step, the exact block cache), a few seeds. Each seed is one
``maskrl demo`` run (its SFT model is the seed's base; the final model is the last RL step's, no
selection); the record holds every seed's base and final greedy accuracy on the same evaluation rows and
the paired (same seed) difference with its exact 95 % t-interval over seeds (:func:`maskrl.stats.t_interval`).

    PYTHONPATH=src python benchmarks/demo/block_learning.py --seeds 0,1,2 --out results/block_learning/sudoku_block4.json

The recipe is configs/demo_sudoku.yaml with the overrides in :data:`OVERRIDES` (fewer RL steps and prompts
than the demo, so that a seed runs in minutes on a shared CPU).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = ["model.tiny.block_size=4", "rollout.block_length=4", "rollout.cache=block", "eval.block_length=4",
             "eval.cache=block", "train.steps=20", "train.prompts_per_step=8", "train.eval_every=0",
             "task.eval_limit=200"]


def run_seed(seed: int, work: Path) -> dict:
    """One ``maskrl demo`` run of the block recipe with ``seed`` (model, SFT order and RL seeds)."""
    from maskrl.config import load_config
    from maskrl.demo import run_demo

    cfg = load_config([ROOT / "configs" / "demo_sudoku.yaml"],
                      OVERRIDES + [f"model.tiny.seed={seed}", f"train.seed={seed}",
                                   f"output_dir={work / f'seed{seed}'}"])
    s = run_demo(cfg, force_sft=True, overwrite=True)  # a fresh SFT per seed, never a cached one
    return {"seed": seed, "base": s["base"], "final": s["final"], "n_eval": s["n_eval"],
            "sft_seconds": s["sft_seconds"], "rl_seconds": s["rl_seconds"], "eval_source": s["eval_source"]}


def summarize(runs: list[dict]) -> dict:
    """Paired differences (final − base, accuracy points) with the exact 95 % t-interval over seeds."""
    from maskrl.stats import t_interval

    d = [100 * (r["final"]["accuracy"] - r["base"]["accuracy"]) for r in runs]
    out = {"differences_points": d, "seeds_above_zero": sum(x > 0 for x in d), "seeds_below_zero": sum(x < 0 for x in d)}
    if len(d) >= 2:
        mean, lo, hi = t_interval(d)
        out |= {"mean_points": mean, "t95": [lo, hi]}
    return out


def main() -> None:
    from maskrl.records import write_record

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--work", default=str(ROOT / "runs" / "block_learning"))
    ap.add_argument("--out", default=str(ROOT / "results" / "block_learning" / "sudoku_block4.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    done = json.loads(out.read_text())["runs"] if out.is_file() else []
    have = {r["seed"] for r in done}
    for seed in (int(s) for s in args.seeds.split(",")):
        if seed in have:
            continue
        t0 = time.time()
        done.append(run_seed(seed, Path(args.work)) | {"wall_seconds": time.time() - t0})
        write_record(out, {"recipe": "configs/demo_sudoku.yaml", "overrides": OVERRIDES,
                           "per_seed_overrides": ["model.tiny.seed=S", "train.seed=S"], "runs": done,
                           "paired": summarize(done), "threads": 1,
                           "machine": "shared 2-core CPU, up to 8 concurrent sessions (wall times show the load)"})
        print(json.dumps(summarize(done)))


if __name__ == "__main__":
    main()
