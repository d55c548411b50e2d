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

``--source own`` trains instead on the policy's **own correct rollouts** (rejection-sampling
fine-tuning, :func:`own_correct_sft`): the recipe's rollout sampler draws ``--batch`` completions per
step (``--batch / G`` prompts × G), and the correct ones are the SFT batch. This is what
group-relative RL's positive advantages reinforce, without its negative gradient.

Each (task, source, lr, seed) record goes to ``--out`` (default ``results/testbed_ceiling.json``) as
it finishes; ``--summary`` prints, per (task, source, lr), the final validation solved rate and its
gain over the SFT checkpoint as a 95 % t-interval over seeds.

    python benchmarks/testbed_ceiling.py --tasks sudoku --set sft.steps=250 --lrs 1e-4,3e-4 --seeds 0,1,2
    python benchmarks/testbed_ceiling.py --tasks sudoku,countdown --source own --lrs 1e-4 --seeds 0,1,2
    python benchmarks/testbed_ceiling.py --summary
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from ablation_runs import ROOT, already_recorded, load_results, t_interval, update_results
from table_protocol import BASES, GEN_KW
from table_runs import Setup
from maskrl.pipeline import prompt_formatter
from maskrl.sft import run_sft

OUT = ROOT / "results" / "testbed_ceiling.json"


def own_correct_sft(setup: Setup, policy, cfg, lr: float, seed: int, steps: int, batch: int, warmup: int,
                    on_step, overrides: list[str]) -> None:
    """``steps`` SFT steps on the policy's **own correct rollouts**: each step samples ``batch // G``
    training prompts × G completions with the recipe's rollout sampler (:meth:`RLTrainer.collect`,
    seed ``seed``), keeps those the task counts as correct and takes one masked-diffusion SFT step
    (:func:`maskrl.sft.sft_loss`) on them with a fresh AdamW (weight decay 0, gradient norm 1,
    ``transformers`` cosine schedule with ``warmup`` steps); a step with no correct rollout makes no
    update. Rejection-sampling fine-tuning: the positive half of group-relative RL without its
    negative gradient or its noise."""
    import tempfile

    import torch
    from transformers import get_scheduler

    from maskrl.config import load_config
    from maskrl.sft import sft_loss
    from maskrl.trainer import RLTrainer

    g = cfg.train.group_size
    if batch % g:
        raise SystemExit(f"error: --batch {batch} is not a multiple of the recipe's group size {g}")
    with tempfile.TemporaryDirectory() as tmp:
        rl_cfg = load_config([BASES[setup.name]], overrides + [f"train.prompts_per_step={batch // g}", f"train.seed={seed}",
                                                               f"output_dir={tmp}", "train.report_to=[]", "objective.beta=0"])
        tr = RLTrainer(rl_cfg, policy, setup.task, setup.train, prompt_fn=prompt_formatter(policy, cfg.model.chat_template))
        params = [p for p in policy.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        sched = get_scheduler("cosine", opt, num_warmup_steps=warmup, num_training_steps=steps)
        gen = torch.Generator().manual_seed(seed)
        for step in range(1, steps + 1):
            b = tr.collect()
            keep = setup.task.is_correct(b.task_rewards)  # [N] bool
            if keep.any():
                ro = b.rollout
                policy.model.train()
                loss = sft_loss(policy, ro.prompt_ids[keep], ro.prompt_mask[keep], ro.completion_ids[keep], gen)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
            sched.step()
            on_step(step)


#: what the continuation trains on: ground-truth answers or the policy's own correct rollouts
SOURCES = ("ground_truth", "own")


def run(setup: Setup, out: Path, task: str, lr: float, seed: int, steps: int, batch: int, warmup: int,
        every: int, overrides: list[str], source: str = "ground_truth") -> dict | None:
    """One continuation; its record is added to ``out`` at once (skipped if recorded)."""
    key = f"{task}/lr{lr:g}/seed{seed}" if source == "ground_truth" else f"{task}/{source}/lr{lr:g}/seed{seed}"
    settings = {"overrides": overrides, "steps": steps, "batch": batch, "warmup": warmup, "eval_every": every,
                "val_size": len(setup.val)}
    if already_recorded(out, key, settings, "ceiling"):
        return None
    cfg = setup.cfg
    policy = setup.policy()
    curve = [[0, setup.sft_val(policy, cfg)["accuracy"]]]

    def score(step: int) -> None:
        if step % every == 0 or step == steps:
            curve.append([step, setup.evaluate(policy, cfg, setup.val)["accuracy"]])

    t0 = time.time()
    if source == "own":
        own_correct_sft(setup, policy, cfg, lr, seed, steps, batch, warmup, score, overrides)
    else:
        run_sft(policy, setup.train, setup.task.target, gen_length=cfg.rollout.gen_length, steps=steps, batch_size=batch,
                lr=lr, warmup_steps=warmup, weight_decay=0.0, seed=seed, log_every=steps,
                prompt_fn=prompt_formatter(policy, cfg.model.chat_template), progress=False, on_step=score)
    row = {"task": task, "source": source, "lr": lr, "seed": seed, "curve": curve, "final": curve[-1][1],
           "sft": curve[0][1], "wall_seconds": time.time() - t0, **settings}
    update_results(out, lambda d: d["runs"].__setitem__(key, row))
    print(f"[ceiling] {key}: {row['sft']:.3f} -> {row['final']:.3f}", flush=True)
    return row


def summary(data: dict) -> str:
    """Markdown: per (task, source, lr) the seeds, SFT, final solved rate and gain (95 % t-intervals);
    one record file holds one warm-up and shape per (task, source, lr) (:func:`run` refuses a second)."""
    by: dict[tuple[str, str, float], list[dict]] = {}
    for r in data["runs"].values():
        by.setdefault((r["task"], r.get("source", "ground_truth"), r["lr"]), []).append(r)
    lines = ["| task | trained on | lr | warm-up steps | steps × batch | seeds | SFT solved | final solved | gain over SFT |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (task, source, lr), rows in sorted(by.items()):
        fin = t_interval([r["final"] for r in rows])
        gain = t_interval([r["final"] - r["sft"] for r in rows])
        lines.append(f"| {task} | {source.replace('_', ' ')} | {lr:g} | {rows[0]['warmup']} | {rows[0]['steps']} × {rows[0]['batch']} | {len(rows)} | {rows[0]['sft']:.3f} "
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
    ap.add_argument("--source", choices=SOURCES, default="ground_truth",
                    help="train on ground-truth answers or on the policy's own correct rollouts")
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
                    run(setup, out, task, lr, seed, args.steps, args.batch, args.warmup, args.eval_every, args.overrides,
                        args.source)
    print(summary(load_results(out)))


if __name__ == "__main__":
    main()
