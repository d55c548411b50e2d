"""CPU check of ``maskrl plan`` (issue 21 §2): the plan against measured peak memory and counted FLOPs of
real trainer steps, at several shapes, side by side (JSON).

    python benchmarks/rehearsal/plan_check.py              # all shapes -> results/plan_check.json (committed)
    python benchmarks/rehearsal/plan_check.py --quick      # two small shapes

Each shape runs in a fresh subprocess (``--child``), so its memory is its own:

1. imports everything and runs (then drops) one step of a throw-away model, so that lazy imports are
   done; ``base`` = resident memory now (``/proc/self/statm``);
2. builds the recipe's model (the built-in tiny Llama at the shape's width / depth, LoRA and
   checkpointing as the shape says) and the trainer (:func:`maskrl.plan.synthetic_trainer`: prompts of
   P tokens, random rewards, completions L long), and runs a first RL step (rollout + ``optimize``)
   under ``FlopCounterMode`` with SDPA's math backend (PyTorch's CPU flash kernel is not registered
   with the counter; the math backend computes attention with counted ``bmm``s): ``measured_flops``;
   this step also creates the AdamW states, which the plan's peak counts (it plans a step of a run
   in progress, not the first);
3. resets the kernel's peak-resident-memory mark (``echo 5 > /proc/self/clear_refs``) and runs a
   second step with the default kernels: ``measured_peak`` = ``VmHWM`` (``/proc/self/status``) −
   ``base``: weights, reference copy, gradients, AdamW states and the step's activations, as the
   plan's ``peak`` counts them. glibc is told to ``mmap`` every block ≥ 64 KiB
   (``MALLOC_MMAP_THRESHOLD_=65536``) so that freed tensors leave the resident set.

The parent makes the plan of the same config (``maskrl.plan.make_plan``, one process, ``single``) and
writes both, with ``memory_error`` = plan / measured − 1 (target |·| ≤ 0.15) and ``flops_equal``.
The plan's activations come from narrow models and the CPU profiler; the measurement is the operating
system's peak RSS of the real step, an independent instrument.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "results" / "plan_check.json"

#: (name, --set overrides): width, depth, length, rows, LoRA, checkpointing, likelihood vary
SHAPES = [
    ("w256_l64_rows16_full_nockpt", ["model.tiny.hidden_size=256", "model.tiny.num_layers=2", "model.tiny.num_heads=4",
                                      "model.tiny.intermediate_size=768", "rollout.gen_length=64",
                                      "rollout.block_length=32", "rollout.steps=32", "train.prompts_per_step=2",
                                      "train.group_size=8", "train.inner_iterations=2"]),
    ("w512_l128_rows8_lora_ckpt", ["model.tiny.hidden_size=512", "model.tiny.num_layers=2", "model.tiny.num_heads=8",
                                    "model.tiny.intermediate_size=1536", "model.lora_rank=16",
                                    "model.gradient_checkpointing=true", "rollout.gen_length=128",
                                    "rollout.block_length=32", "rollout.steps=64", "train.prompts_per_step=2",
                                    "train.group_size=4", "train.inner_iterations=2"]),
    ("w256_l32_state_rows64_ckpt", ["model.tiny.hidden_size=256", "model.tiny.num_layers=4", "model.tiny.num_heads=4",
                                     "model.tiny.intermediate_size=768", "model.gradient_checkpointing=true",
                                     "likelihood.name=state", "rollout.gen_length=32", "rollout.block_length=32",
                                     "rollout.steps=16", "train.prompts_per_step=2", "train.group_size=4",
                                     "train.inner_iterations=1", "train.max_forward_rows=32"]),
    ("w384_l128_rows12_lora_nockpt_mb4", ["model.tiny.hidden_size=384", "model.tiny.num_layers=3",
                                           "model.tiny.num_heads=6", "model.tiny.intermediate_size=1024",
                                           "model.lora_rank=8", "rollout.gen_length=128", "rollout.block_length=64",
                                           "rollout.steps=64", "train.prompts_per_step=2", "train.group_size=6",
                                           "train.inner_iterations=2", "train.micro_batch_size=4"]),
    # issue 48: DiSPO on a block-diffusion model sampling from the merged LoRA copy, its MLP wide enough (as an
    # 8B model's at one layer) that peft's merge -- float32 ΔW of the largest matrix -- is the step's peak
    ("w1024_i12288_block_dispo_lora_merged", ["model.tiny.hidden_size=1024", "model.tiny.num_layers=1",
                                            "model.tiny.num_heads=8", "model.tiny.intermediate_size=12288",
                                            "model.tiny.block_size=4", "model.lora_rank=16",
                                            "model.gradient_checkpointing=true", "rollout.merge_lora=true",
                                            "rollout.cache=block", "rollout.early_stop=true",
                                            "rollout.remasking=low_confidence_dynamic", "rollout.threshold=0.9",
                                            "rollout.gen_length=32", "rollout.block_length=4", "rollout.steps=32",
                                            "likelihood.name=mean_field", "likelihood.p_mask_prompt=0.15",
                                            "credit=[{name: dispo, z: 2, timing: late}]", "train.prompts_per_step=1",
                                            "train.group_size=2", "train.inner_iterations=2"]),
]
BASE = ["task.name=countdown", "rollout.temperature=0.9", "objective.name=diffu_grpo", "train.lr=1e-4"]
PROMPT_LENGTH = 64


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> None:
    """Reset the kernel's peak resident set mark (``VmHWM``) to the current resident set (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def _peak_rss() -> int:
    """``VmHWM`` of this process in bytes: the peak resident set since start or the last reset."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM line in /proc/self/status (plan_check measures memory on Linux only)")


def child(overrides: list[str]) -> dict:
    """One shape in this (fresh) process: counted FLOPs of a first step, measured peak memory of a second
    (the module docstring)."""
    import gc

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from maskrl.config import load_config
    from maskrl.plan import synthetic_trainer

    torch.set_num_threads(1)
    cfg = load_config([], BASE + overrides)
    warm = load_config([], BASE + ["model.tiny.hidden_size=16", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
                                   "model.tiny.intermediate_size=16", "rollout.gen_length=8", "rollout.block_length=8",
                                   "rollout.steps=8", "train.prompts_per_step=1", "train.group_size=2",
                                   "train.inner_iterations=2"] + [o for o in overrides if o.startswith(("model.lora",
                                   "model.gradient", "likelihood"))])
    t = synthetic_trainer(warm, 8)
    t.step()  # imports, kernels, optimizer code paths
    del t
    gc.collect()
    base = _rss()
    trainer = synthetic_trainer(cfg, PROMPT_LENGTH)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        trainer.step()
    gc.collect()
    _reset_peak_rss()
    t0 = time.time()
    trainer.step()
    seconds = time.time() - t0
    peak = _peak_rss() - base
    static = _rss() - base  # weights, reference copy, AdamW states, kept after the step
    return {"measured_peak_bytes": peak, "base_rss_bytes": base, "rss_after_step_bytes": static,
            "measured_flops": int(fc.get_total_flops()), "step_seconds": seconds}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--quick", action="store_true", help="the first two shapes only")
    p.add_argument("--only", help="comma-separated shape names")
    p.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return {}
    from maskrl.config import load_config
    from maskrl.plan import GIB, Hardware, make_plan

    records = []
    shapes = SHAPES[:2] if args.quick else SHAPES
    if args.only:
        shapes = [s for s in shapes if s[0] in args.only.split(",")]
    for name, overrides in shapes:
        cfg = load_config([], BASE + overrides)
        t0 = time.time()
        plan = make_plan(cfg, Hardware(gpus=1, strategy="single", gpu_memory=1e15), prompt_length=PROMPT_LENGTH,
                         search=False)
        plan_s = time.time() - t0
        # glibc: serve every block >= 64 KiB by mmap, so that freed tensors go back to the OS and the
        # peak RSS is the peak of live memory rather than of a fragmented heap
        env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
        out = subprocess.run([sys.executable, __file__, "--child", *overrides], capture_output=True, text=True, env=env)
        if out.returncode:
            raise RuntimeError(f"shape {name} failed:\n{out.stderr[-3000:]}")
        meas = json.loads(out.stdout.strip().splitlines()[-1])
        planned = plan["memory_gib"]["peak"] * GIB
        rec = {"shape": name, "overrides": overrides, "prompt_length": PROMPT_LENGTH,
               "plan_peak_gib": plan["memory_gib"]["peak"], "measured_peak_gib": meas["measured_peak_bytes"] / GIB,
               "memory_error": planned / meas["measured_peak_bytes"] - 1,
               "plan_memory_gib": plan["memory_gib"],
               "plan_flops": plan["work"]["flops"], "measured_flops": meas["measured_flops"],
               "flops_equal": plan["work"]["flops"] == meas["measured_flops"],
               "measured": meas, "plan_work": plan["work"]["by_phase_term"], "plan_seconds": plan_s, "step_seconds": meas["step_seconds"]}
        records.append(rec)
        _write(args.out, argv, records)  # after every shape, so that a long run keeps what it measured
        print(f"{name}: memory plan {rec['plan_peak_gib']:.3f} GiB vs measured {rec['measured_peak_gib']:.3f} GiB "
              f"({100 * rec['memory_error']:+.1f} %); FLOPs plan {rec['plan_flops']:.4g} vs counted "
              f"{rec['measured_flops']:.4g} ({'equal' if rec['flops_equal'] else 'DIFFERENT'})", flush=True)
    return _write(args.out, argv, records)


def _write(out: str, argv, records: list[dict]) -> dict:
    result = {"benchmark": "plan_check", "command": " ".join(["python", "benchmarks/rehearsal/plan_check.py"] + (argv or sys.argv[1:])),
              "target": "|memory_error| <= 0.15, flops_equal", "records": records,
              "all_within_15pct": all(abs(r["memory_error"]) <= 0.15 for r in records),
              "all_flops_equal": all(r["flops_equal"] for r in records)}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
