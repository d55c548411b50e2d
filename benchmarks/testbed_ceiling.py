"""How far can the table's RL budget move the SFT checkpoint at all? (issue 22, part 1)

Group-relative RL learns from the policy's own samples; a correct sample carries at most what the
ground-truth answer to the same prompt carries. This script measures the supervised reference at the
RL recipe's shape: from the table's SFT checkpoint (``configs/table/<task>.yaml`` + ``--set``), a
**fresh** AdamW (as every RL run starts with; weight decay 0 as ``train.weight_decay``) continues
masked-diffusion SFT (:func:`maskrl.sft.run_sft`, its warm-up + cosine-to-10 % schedule) on
ground-truth training targets, ``--batch`` sequences per step (the RL step's completions) for
``--steps`` steps (the RL steps), at each ``--lrs`` learning rate, seeds ``--seeds`` (the batch
order and masks). The validation split (generated, 300 rows, the table's; the test file is never
read) is scored greedily every ``--eval-every`` steps.

Each (task, lr, seed) record goes to ``--out`` (default ``results/testbed_ceiling.json``) as it
finishes; ``--summary`` prints, per (task, lr), the final validation solved rate and its gain over
the SFT checkpoint as a 95 % t-interval over seeds.

    python benchmarks/testbed_ceiling.py --tasks sudoku --set sft.steps=250 --lrs 1e-4,3e-4 --seeds 0,1,2
    python benchmarks/testbed_ceiling.py --summary
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from ablation_runs import ROOT, load_results, t_interval, update_results
from controlled_table import BASES, GEN_KW, Setup
from maskrl.pipeline import prompt_formatter
from maskrl.sft import run_sft

OUT = ROOT / "results" / "testbed_ceiling.json"


def run(setup: Setup, out: Path, task: str, lr: float, seed: int, steps: int, batch: int, warmup: int,
        every: int, overrides: list[str]) -> dict | None:
    """One supervised continuation; its record is added to ``out`` at once (skipped if recorded)."""
    key = f"{task}/lr{lr:g}/seed{seed}"
    settings = {"overrides": overrides, "steps": steps, "batch": batch, "warmup": warmup, "eval_every": every,
                "val_size": len(setup.val)}
    old = load_results(out)["runs"].get(key)
    if old is not None:
        if any(old.get(k) != v for k, v in settings.items()):
            raise SystemExit(f"error: {key} is already in {out} with other settings; use another --out or remove it")
        print(f"[ceiling] {key}: recorded, skipped", flush=True)
        return None
    cfg = setup.cfg
    policy = setup.policy()
    curve = [[0, setup.sft_val(policy, cfg)["accuracy"]]]

    def score(step: int) -> None:
        if step % every == 0 or step == steps:
            curve.append([step, setup.evaluate(policy, cfg, setup.val)["accuracy"]])

    t0 = time.time()
    run_sft(policy, setup.train, setup.task.target, gen_length=cfg.rollout.gen_length, steps=steps, batch_size=batch,
            lr=lr, warmup_steps=warmup, weight_decay=0.0, seed=seed, log_every=steps,
            prompt_fn=prompt_formatter(policy, cfg.model.chat_template), progress=False, on_step=score)
    row = {"task": task, "lr": lr, "seed": seed, "curve": curve, "final": curve[-1][1], "sft": curve[0][1],
           "wall_seconds": time.time() - t0, **settings}
    update_results(out, lambda d: d["runs"].__setitem__(key, row))
    print(f"[ceiling] {key}: {row['sft']:.3f} -> {row['final']:.3f}", flush=True)
    return row


def summary(data: dict) -> str:
    """Markdown: per (task, lr) the seeds, SFT, final solved rate and gain (95 % t-intervals); one
    record file holds one warm-up and shape per (task, lr) (:func:`run` refuses a second)."""
    by: dict[tuple[str, float], list[dict]] = {}
    for r in data["runs"].values():
        by.setdefault((r["task"], r["lr"]), []).append(r)
    lines = ["| task | lr | warm-up steps | steps × batch | seeds | SFT solved | final solved | gain over SFT |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (task, lr), rows in sorted(by.items()):
        fin = t_interval([r["final"] for r in rows])
        gain = t_interval([r["final"] - r["sft"] for r in rows])
        lines.append(f"| {task} | {lr:g} | {rows[0]['warmup']} | {rows[0]['steps']} × {rows[0]['batch']} | {len(rows)} | {rows[0]['sft']:.3f} "
                     f"| {fin[0]:.3f} [{fin[1]:.3f}, {fin[2]:.3f}] | {gain[0]:+.3f} [{gain[1]:+.3f}, {gain[2]:+.3f}] |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="sudoku")
    ap.add_argument("--lrs", default="1e-4,3e-4")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--val-size", type=int, default=300)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--summary", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    if not args.summary:
        for task in [t for t in args.tasks.split(",") if t]:
            if task not in BASES:
                raise SystemExit(f"error: unknown task {task!r}; known: {', '.join(BASES)}")
            setup = Setup(task, BASES[task], args.overrides, "table", args.val_size, gen_kw=GEN_KW.get(task))
            for lr in [float(x) for x in args.lrs.split(",") if x]:
                for seed in [int(s) for s in args.seeds.split(",") if s]:
                    run(setup, out, task, lr, seed, args.steps, args.batch, args.warmup, args.eval_every, args.overrides)
    print(summary(load_results(out)))


if __name__ == "__main__":
    main()
