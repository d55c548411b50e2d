"""The 8B rehearsal on one GPU at full depth: one shipped recipe, bf16, plan against measured per phase.

    python benchmarks/rehearsal/gpu_rehearse.py                                  # a GPU: LLaDA-8B stand-in, 32 blocks
    python benchmarks/rehearsal/gpu_rehearse.py --recipe dream7b_gsm8k_diffu_grpo
    python benchmarks/rehearsal/gpu_rehearse.py --device cpu --layers 1 --width-divisor 16 --gen-length 32   # CPU test

The model is :mod:`maskrl.models.standins`' stand-in of the recipe's family at its published depth (32 /
28 blocks, ~16 GB of bf16 weights written to ``--work`` once) -- the real width, heads, MLP, vocabulary
and ids, random weights -- loaded through ``maskrl.models.load`` as the real checkpoint would be. The run
is the recipe as shipped (L 256 in blocks of 32 at its steps, G, LoRA r 128 on every linear layer, bf16
base, gradient checkpointing, its likelihood, objective and credit modules) except μ (``--mu``, default
2) and ``--steps`` RL steps (default 2) on 1 prompt per step (``--prompts``), with the rehearsal's hashed
reward (``benchmarks/rehearsal/rehearse_plugin.py``). Through the library's public pieces (``maskrl.pipeline``,
``RLTrainer.collect`` / ``optimize`` / ``save_checkpoint``, ``export_model``, ``maskrl.models.load``,
``maskrl.evaluate.run_harness``), each phase is timed and its peak memory read (GPU:
``torch.cuda.max_memory_allocated``, reset before the phase; CPU: the process's ``VmHWM``, reset through
``/proc/self/clear_refs``):

``load`` (stand-in -> LoRA -> device), ``rollout`` and ``optimize`` of each step, ``checkpoint``,
``export`` (merged ``model/``), ``reload`` (the export read back), ``eval`` (greedy, ``--eval-rows`` rows).

``maskrl plan`` (:func:`maskrl.plan.make_plan`, one process, ``single``) of the same config and prompt
length is printed beside it: per-phase peak (rollout vs the plan's rollout phase, optimize vs the largest of
its θ_old / reference / θ phases), FLOPs and seconds per step at ``--tflops`` × ``--mfu``. Expect it to
finish in under 10 minutes on an H100 / H200 (writing the stand-in is a few minutes of it). Output: one JSON
(``--out``, default ``benchmarks/results/gpu_rehearse.json``) and a table on stdout.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "rehearsal"))
import rehearse_launch  # noqa: E402  (the rehearsal's recipe reduction, plug-in and stand-in)
import rehearse_memory  # noqa: E402  (the rehearsal's memory readers)

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_rehearse.json"
GIB = 2**30


class PhaseMeter:
    """Time and peak memory of named phases (GPU allocator peak, or the process's ``VmHWM`` on CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.rows = device, []

    def __call__(self, name: str, fn):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
        else:
            rehearse_memory.reset_peak()
            before = rehearse_memory.proc_status()["VmRSS"]
        t0 = time.time()
        out = fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
        else:
            peak, reserved = rehearse_memory.proc_status()["VmHWM"], None
        self.rows.append({"phase": name, "seconds": time.time() - t0, "peak_gib": peak / GIB,
                          "reserved_gib": None if reserved is None else reserved / GIB, "before_gib": before / GIB})
        return out


def files_vs_plan(run: Path, rows: dict, files_gib: dict) -> dict:
    """The checkpoint folder's weights + optimizer files and the export's safetensors against the plan's
    ``files_gib``; and what the export added to the device's memory above the phase's start (plan: 0,
    the merged float32 copy is made on the CPU) -- ``maskrl.plan.memory.files_gib``."""
    ckpt = next((run / "checkpoints").glob("step_*"))
    written = sum(f.stat().st_size for pat in ("model*.safetensors", "optimizer*.bin") for f in ckpt.glob(pat))
    export = sum(f.stat().st_size for f in (run / "model").rglob("*.safetensors"))
    ex = rows["export"]
    return {"checkpoint_size": {"plan_gib": files_gib["checkpoint"], "measured_gib": written / GIB},
            "export_size": {"plan_gib": files_gib["export_disk"], "measured_gib": export / GIB},
            "export_device_extra": {"plan_gib": 0.0 if ex["reserved_gib"] is not None else files_gib["export_host"],
                                    "measured_gib": ex["peak_gib"] - ex["before_gib"]}}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="llada8b_gsm8k_diffu_grpo")
    p.add_argument("--device", default="auto")
    p.add_argument("--layers", type=int, default=0, help="blocks (default: the published 32 / 28)")
    p.add_argument("--width-divisor", type=int, default=1)
    p.add_argument("--gen-length", type=int, default=0, help="default: the recipe's L (256)")
    p.add_argument("--steps", type=int, default=2, help="RL steps")
    p.add_argument("--mu", type=int, default=2, help="inner iterations (the recipes' 12 makes a step ~6x longer)")
    p.add_argument("--prompts", type=int, default=1, help="prompts per step (G from the recipe)")
    p.add_argument("--eval-rows", type=int, default=4)
    p.add_argument("--tflops", type=float, default=989.0)
    p.add_argument("--mfu", type=float, default=0.4)
    p.add_argument("--bandwidth", type=float, default=3.35, help="TB/s")
    p.add_argument("--work", default="/tmp/maskrl_gpu_rehearse")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    args = p.parse_args(argv)

    from maskrl.config import to_dict
    from maskrl.evaluate import run_harness
    from maskrl.models import load
    from maskrl.pipeline import export_model, load_policy, prompt_formatter, task_and_data
    from maskrl.plan import Hardware, make_plan
    from maskrl.trainer import RLTrainer

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    shipped = rehearse_launch.load_recipe(args.recipe)
    family = "dream" if shipped.model.path.startswith("Dream") else "llada"
    layers = args.layers or (32 if family == "llada" else 28)
    work = Path(args.work)
    t0 = time.time()
    standin = rehearse_launch.ensure_standin(work, family, layers, args.width_divisor)
    write_s = time.time() - t0
    L = args.gen_length or shipped.rollout.gen_length
    r, e = shipped.rollout, shipped.eval
    ov = [f"model.path={standin}", f"output_dir={work / 'run'}", f"task.name=rehearse_{shipped.task.name}",
          "task.train_size=64", f"task.eval_limit={args.eval_rows}", f"rollout.gen_length={L}",
          f"rollout.block_length={min(r.block_length, L)}", f"rollout.steps={max(1, L * r.steps // r.gen_length)}",
          f"eval.gen_length={L}", f"eval.block_length={min(e.block_length, L)}",
          f"eval.steps={max(1, L * e.steps // e.gen_length)}", f"train.prompts_per_step={args.prompts}",
          f"train.inner_iterations={min(args.mu, shipped.train.inner_iterations)}", f"train.steps={args.steps}",
          "train.save_every=0", "train.eval_every=0", "train.report_to=[]"]
    cfg = rehearse_launch.load_recipe(args.recipe, ov)
    meter = PhaseMeter(device)

    def build():
        task, held, _, train = task_and_data(cfg)
        policy = load_policy(cfg)
        fmt = prompt_formatter(policy, cfg.model.chat_template)
        return task, held, RLTrainer(cfg, policy, task, train, prompt_fn=fmt), fmt

    task, held, trainer, fmt = meter("load", build)
    steps = []
    for k in range(args.steps):
        batch = meter(f"rollout_{k + 1}", trainer.collect)
        metrics = meter(f"optimize_{k + 1}", lambda: trainer.optimize(batch))
        steps.append({"prompt_tokens": int(batch.rollout.prompt_ids.shape[1]) if hasattr(batch.rollout, "prompt_ids")
                      else None, "grad_norm": metrics.get("grad_norm")})
        trainer.step_count += 1
    run = work / "run"
    meter("checkpoint", lambda: trainer.save_checkpoint(run / "checkpoints" / f"step_{trainer.step_count}"))
    meter("export", lambda: export_model(run / "model", trainer.policy_eval, cfg, task, data="rehearsal",
                                         steps=f"{trainer.step_count} RL steps"))
    del trainer, batch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    exp = meter("reload", lambda: load(run / "model", dtype=cfg.model.dtype, device=device))
    meter("eval", lambda: run_harness(model=exp, task_name=task.name, limit=args.eval_rows, out_dir=work / "eval",
                                      batch_size=args.eval_rows, progress=False, overwrite=True,
                                      gen_lengths=cfg.eval.gen_length, block_length=cfg.eval.block_length,
                                      steps=cfg.eval.steps, chat_template=cfg.model.chat_template))
    del exp
    gc.collect()

    # the plan of the same step: the longest prompt of the training rows, as maskrl plan measures it
    from maskrl.plan import estimate_prompt_length

    P, how = estimate_prompt_length(cfg)
    t1 = time.time()
    plan = make_plan(cfg, Hardware(gpus=1, strategy="single", gpu_memory=1e6 * GIB, tflops=args.tflops, mfu=args.mfu,
                                   bandwidth=args.bandwidth * 1e12), prompt_length=P, search=False)
    plan_s = time.time() - t1
    pk = plan["memory_gib"]["peak_by_phase"]
    by_phase = plan["time"]["seconds_by_phase_term"]
    rows = {row["phase"]: row for row in meter.rows}
    compare = []
    for k in range(args.steps):
        ro, op = rows[f"rollout_{k + 1}"], rows[f"optimize_{k + 1}"]
        plan_opt = max(v for ph, v in pk.items() if ph != "rollout")
        compare.append({"step": k + 1,
                        "rollout": {"plan_peak_gib": pk.get("rollout"), "measured_peak_gib": ro["peak_gib"],
                                    "plan_seconds": by_phase.get("rollout"), "measured_seconds": ro["seconds"]},
                        "optimize": {"plan_peak_gib": plan_opt, "measured_peak_gib": op["peak_gib"],
                                     "plan_seconds": sum(v for ph, v in by_phase.items() if ph != "rollout"),
                                     "measured_seconds": op["seconds"]}})
    result = {"benchmark": "gpu_rehearse", "recipe": args.recipe, "family": family, "layers": layers,
              "width_divisor": args.width_divisor, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "standin_write_seconds": write_s, "prompt_length": P, "prompt_length_source": how,
              "config": {k: to_dict(cfg)[k] for k in ("model", "rollout", "train", "objective", "likelihood", "credit")},
              "phases": meter.rows, "steps": steps, "plan": {"peak_by_phase_gib": pk, "peak_gib": plan["memory_gib"]["peak"],
                                                             "static_gib": plan["memory_gib"]["static"],
                                                             "flops_per_step": plan["work"]["flops"],
                                                             "seconds_per_step": plan["time"]["seconds_per_step"],
                                                             "seconds": plan_s},
              "plan_vs_measured": compare, "files": files_vs_plan(run, rows, plan["files_gib"]),
              "total_seconds": time.time() - t0,
              "memory_note": ("GPU: torch.cuda.max_memory_allocated per phase (weights included); the plan counts "
                              "the same tensors" if device.type == "cuda" else
                              "CPU: the process's VmHWM per phase, which includes the interpreter and libraries "
                              "(the plan does not)")}
    print(f"{'phase':<14}{'seconds':>10}{'peak GiB':>10}{'plan GiB':>10}{'plan s':>10}")
    for row in meter.rows:
        c = next((x for x in compare if row["phase"] in (f"rollout_{x['step']}", f"optimize_{x['step']}")), None)
        kind = "rollout" if row["phase"].startswith("rollout") else "optimize"
        pg = c[kind]["plan_peak_gib"] if c else None
        ps = c[kind]["plan_seconds"] if c else None
        print(f"{row['phase']:<14}{row['seconds']:>10.2f}{row['peak_gib']:>10.2f}"
              f"{'' if pg is None else f'{pg:.2f}':>10}{'' if ps is None else f'{ps:.2f}':>10}")
    for k, v in result["files"].items():
        print(f"{k:<34}measured {v['measured_gib']:8.3f} GiB   plan {v['plan_gib']:8.3f} GiB")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out} ({result['total_seconds']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
