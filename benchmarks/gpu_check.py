"""GPU check: sampler speed and one diffu-GRPO LoRA training step at LLaDA-8B's shape, one command.

    python benchmarks/gpu_check.py                      # on a GPU: --scale full (LLaDA-8B shape, bf16)
    python benchmarks/gpu_check.py --scale tiny         # the same code path, scaled down (CPU default)
    python benchmarks/gpu_check.py --out results.json   # default: benchmarks/results/gpu_check.json

What it measures (docs/scaling.md), on a **randomly initialised** model -- no download needed, and
the numbers depend only on the shape, not on the weights:

1. ``sampler``: :func:`maskrl.sampling.generate` (fixed schedule, τ 0.9) on ``batch`` prompts of
   ``prompt_length`` random tokens; tokens/s = batch · L / seconds, after one warm-up block.
2. ``train_step``: LoRA + gradient checkpointing as in ``configs/llada8b_gsm8k_diffu_grpo.yaml``,
   then ``train_steps`` RL steps of ``RLTrainer`` (μ = 1, G = ``group_size``): a rollout with
   ``generate`` followed by :meth:`RLTrainer.optimize`. Rewards are synthetic (random 0/1 per row,
   no task), so the update direction is meaningless but its cost is real. The first step includes
   CUDA warm-up (kernel selection, allocator growth). Peak GPU memory covers all steps, weights included.

Shapes (``--scale``): ``full`` = LLaDA-8B (Llama blocks, hidden 4096, 32 layers, 32 heads, MLP 12288,
vocab 126464; the loader's own LLaDA -> Llama conversion, :func:`maskrl.models.families.llada.llada_config`),
sampler L 256, block 32, 128 steps, batch 8; ``tiny`` = hidden 64, 2 layers, 4 heads, MLP 192,
vocab 512, L 32, block 8, 16 steps, batch 2. The model is built directly on the target device in
the target dtype (``torch.device`` context + ``from_config(dtype=...)``): no float32 CPU copy.

Output: one JSON object (device name, dtype, shapes, versions, timings in seconds, memory in GiB), and
``plan`` / ``plan_vs_measured``: what ``maskrl plan`` (:func:`maskrl.plan.make_plan`) predicts for the same
step -- peak memory, FLOPs and seconds per step at ``--tflops`` x ``--mfu`` -- beside the measured values,
with the MFU the step actually reached (the plan's FLOPs / measured seconds / peak). Post the JSON with
the GPU's name (docs/scaling.md, "Posting a GPU check").
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from maskrl.config import RunConfig, TrainConfig
from maskrl.objectives import DiffuGRPO
from maskrl.models import ModelAdapter, apply_lora, enable_gradient_checkpointing
from maskrl.models.families.llada import llada_config
from maskrl.sampling import SamplerConfig, generate
from maskrl.tasks.base import Example, Task
from maskrl.trainer import Batch, RLTrainer

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu_check.json"

# LLaDA-config keys (the published config.json names) of each scale
MODELS = {
    "full": {"d_model": 4096, "n_heads": 32, "n_kv_heads": 32, "n_layers": 32, "mlp_hidden_size": 12288,
             "embedding_size": 126464, "rope_theta": 500000.0, "max_sequence_length": 4096,
             "mask_token_id": 126336, "eos_token_id": 126081},
    "tiny": {"d_model": 64, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 192,
             "embedding_size": 512, "rope_theta": 500000.0, "max_sequence_length": 512,
             "mask_token_id": 510, "eos_token_id": 511},
}
RUNS = {
    "full": dict(batch=8, prompt_length=64, gen_length=256, block_length=32, steps=128,
                 prompts=2, group_size=4, micro_batch_size=4, lora_rank=128, lora_alpha=64.0),
    "tiny": dict(batch=2, prompt_length=8, gen_length=32, block_length=8, steps=16,
                 prompts=1, group_size=2, micro_batch_size=2, lora_rank=4, lora_alpha=8.0),
}
TEMPERATURE = 0.9


class _NoTask(Task):
    """Placeholder: the check never calls ``collect()`` (rewards are synthetic)."""

    name = "none"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(scale: str, device: torch.device, dtype: torch.dtype) -> ModelAdapter:
    """A randomly initialised LLaDA-shaped bidirectional Llama, allocated on ``device`` in ``dtype``."""
    from transformers import AutoModelForCausalLM

    cfg = MODELS[scale]
    config = llada_config(cfg)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(0)  # the same random weights on every run; the global RNG is restored after
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    eos = cfg["eos_token_id"]
    return ModelAdapter(model=model, mask_id=cfg["mask_token_id"], eos_id=eos, pad_id=eos, family="llada")


def random_prompts(n: int, length: int, vocab_high: int, device: torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [n, P], mask [n, P])``: random ordinary tokens (ids below every special id), no padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab_high, (n, length), generator=g)
    return ids.to(device), torch.ones((n, length), dtype=torch.bool, device=device)


def bench_sampler(adapter: ModelAdapter, run: dict, device: torch.device, vocab_high: int) -> dict:
    """Seconds and tokens/s of one ``generate`` call (after a one-block warm-up)."""
    cfg = SamplerConfig(gen_length=run["gen_length"], block_length=run["block_length"], steps=run["steps"],
                        temperature=TEMPERATURE)
    ids, mask = random_prompts(run["batch"], run["prompt_length"], vocab_high, device, seed=0)
    gen = torch.Generator(device=device).manual_seed(0)
    per_block = run["steps"] // cfg.num_blocks
    warm = SamplerConfig(gen_length=run["block_length"], block_length=run["block_length"], steps=per_block,
                         temperature=TEMPERATURE)
    generate(adapter, ids, mask, warm, generator=gen)
    _sync(device)
    t0 = time.perf_counter()
    rollout = generate(adapter, ids, mask, cfg, generator=gen)
    _sync(device)
    sec = time.perf_counter() - t0
    forwards = int(rollout.num_steps.max())
    return {"batch": run["batch"], "prompt_length": run["prompt_length"], "gen_length": run["gen_length"],
            "block_length": run["block_length"], "steps": run["steps"], "temperature": TEMPERATURE,
            "schedule": cfg.schedule, "forwards": forwards, "seconds": sec,
            "tokens_per_s": run["batch"] * run["gen_length"] / sec, "forwards_per_s": forwards / sec}


def bench_train(adapter: ModelAdapter, run: dict, device: torch.device, vocab_high: int, n_steps: int,
                out_dir: Path) -> dict:
    """``n_steps`` diffu-GRPO steps (rollout + optimize, μ = 1) with LoRA and gradient checkpointing."""
    policy = apply_lora(adapter, rank=run["lora_rank"], alpha=run["lora_alpha"], dropout=0.05)
    enable_gradient_checkpointing(policy)
    rows = run["prompts"] * run["group_size"]
    cfg = RunConfig(
        output_dir=str(out_dir),
        rollout=SamplerConfig(gen_length=run["gen_length"], block_length=run["block_length"], steps=run["steps"],
                                temperature=TEMPERATURE),
        objective=DiffuGRPO(),
        train=TrainConfig(prompts_per_step=run["prompts"], group_size=run["group_size"], inner_iterations=1,
                          micro_batch_size=run["micro_batch_size"], lr=3e-6, seed=0),
    )
    trainer = RLTrainer(cfg, policy, _NoTask(), [Example(id=0, prompt="", fields={})])
    trainable = sum(p.numel() for p in trainer.policy.model.parameters() if p.requires_grad)
    ids, mask = random_prompts(run["prompts"], run["prompt_length"], vocab_high, device, seed=1)
    ids, mask = ids.repeat_interleave(run["group_size"], 0), mask.repeat_interleave(run["group_size"], 0)
    group_ids = torch.arange(run["prompts"]).repeat_interleave(run["group_size"])
    reward_gen = torch.Generator().manual_seed(2)
    steps = []
    for _ in range(n_steps):
        _sync(device)
        t0 = time.perf_counter()
        trainer.policy_eval.model.eval()
        rollout = generate(trainer.policy_eval, ids, mask, trainer.sampler, generator=trainer.rollout_gen,
                           group_ids=group_ids)
        _sync(device)
        t1 = time.perf_counter()
        rewards = torch.randint(0, 2, (rows,), generator=reward_gen).float().to(device)  # [N] synthetic
        adv = trainer.objective.advantages(rewards, rollout.group_ids)  # [N]
        batch = Batch(rollout=rollout, rewards=rewards, advantages=adv[:, None] * rollout.completion_mask.float(),
                      completions=[""] * rows)
        metrics = trainer.optimize(batch)
        trainer.step_count += 1
        _sync(device)
        t2 = time.perf_counter()
        steps.append({"rollout_seconds": t1 - t0, "optimize_seconds": t2 - t1, "seconds": t2 - t0,
                      "loss_metrics": {k: float(v) for k, v in metrics.items()}})
    return {"prompts": run["prompts"], "group_size": run["group_size"], "rows": rows,
            "micro_batch_size": run["micro_batch_size"], "inner_iterations": 1, "objective": "diffu_grpo",
            "lora_rank": run["lora_rank"], "lora_alpha": run["lora_alpha"], "gradient_checkpointing": True,
            "trainable_params": trainable, "steps": steps, "seconds": steps[-1]["seconds"],
            "rewards": "synthetic (random 0/1 per row)"}


def plan_for(scale: str, run: dict, dtype: torch.dtype, tflops: float, mfu: float, bandwidth: float) -> dict:
    """``maskrl plan`` of the check's training step (same shape, LoRA, checkpointing, B, G, μ 1, micro-batch,
    sampler, prompt length) on one GPU."""
    from maskrl.config import ModelConfig
    from maskrl.plan import GIB, Hardware, ModelShape, make_plan

    m = MODELS[scale]
    shape = ModelShape("llada", m["d_model"], m["n_layers"], m["n_heads"], m["n_kv_heads"], m["mlp_hidden_size"],
                       m["embedding_size"], source="benchmarks/gpu_check.py MODELS")
    cfg = RunConfig(
        model=ModelConfig(dtype=str(dtype).removeprefix("torch."), lora_rank=run["lora_rank"], lora_alpha=run["lora_alpha"],
                          lora_dropout=0.05, gradient_checkpointing=True),
        rollout=SamplerConfig(gen_length=run["gen_length"], block_length=run["block_length"], steps=run["steps"],
                              temperature=TEMPERATURE),
        objective=DiffuGRPO(),
        train=TrainConfig(prompts_per_step=run["prompts"], group_size=run["group_size"], inner_iterations=1,
                          micro_batch_size=run["micro_batch_size"], lr=3e-6, seed=0))
    return make_plan(cfg, Hardware(gpus=1, strategy="single", gpu_memory=1e6 * GIB, tflops=tflops, mfu=mfu,
                                   bandwidth=bandwidth), prompt_length=run["prompt_length"], search=False, shape=shape)


def main(argv: list[str] | None = None) -> dict:
    """Run the check and write the JSON; returns the result dict.

    Raises:
        ValueError: ``--scale full`` without CUDA (an 8B model on CPU is not a check), or an unknown dtype.
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", choices=sorted(MODELS), help="default: full on CUDA, tiny otherwise")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"JSON output path (default {DEFAULT_OUT})")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda, cuda:1, cpu")
    p.add_argument("--dtype", default="", help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--train-steps", type=int, default=2, help="RL steps to time (the first includes warm-up)")
    p.add_argument("--tflops", type=float, default=989.0, help="the GPU's peak dense bf16 TFLOP/s, for the plan (H100 SXM 989)")
    p.add_argument("--mfu", type=float, default=0.4, help="MFU the plan assumes (default 0.4)")
    p.add_argument("--bandwidth", type=float, default=3.35, help="memory bandwidth in TB/s, for the plan (H100 3.35, H200 4.8)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    scale = args.scale or ("full" if device.type == "cuda" else "tiny")
    if scale == "full" and device.type != "cuda":
        raise ValueError("--scale full needs a CUDA device (use --scale tiny on CPU)")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {args.dtype!r}")
    if args.train_steps < 1:
        raise ValueError("--train-steps must be >= 1")
    run = RUNS[scale]

    t0 = time.perf_counter()
    adapter = build_model(scale, device, dtype)
    _sync(device)
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in adapter.model.parameters())
    vocab_high = min(MODELS[scale]["mask_token_id"], MODELS[scale]["eos_token_id"]) - 100
    result = {
        "scale": scale, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": __import__("transformers").__version__, "accelerate": __import__("accelerate").__version__,
        "peft": __import__("peft").__version__, "python": platform.python_version(),
        "model": {"family": "llada (Llama blocks, bidirectional)", "hidden_size": MODELS[scale]["d_model"],
                  "num_layers": MODELS[scale]["n_layers"], "num_heads": MODELS[scale]["n_heads"],
                  "intermediate_size": MODELS[scale]["mlp_hidden_size"], "vocab_size": MODELS[scale]["embedding_size"],
                  "params": n_params, "weights_gib": n_params * torch.finfo(dtype).bits / 8 / 2**30,
                  "build_seconds": build_s},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
    }
    result["sampler"] = bench_sampler(adapter, run, device, vocab_high)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory() as tmp:
        result["train_step"] = bench_train(adapter, run, device, vocab_high, args.train_steps, Path(tmp))
    result["train_step"]["peak_gpu_memory_gib"] = (torch.cuda.max_memory_allocated(device) / 2**30
                                                  if device.type == "cuda" else None)
    result["peak_host_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
    plan = plan_for(scale, run, dtype, args.tflops, args.mfu, args.bandwidth * 1e12)
    pm, pt = plan["memory_gib"], plan["time"]
    rollout_s = pt["seconds_by_phase_term"].get("rollout", 0.0)
    result["plan"] = {"peak_gib": pm["peak"], "peak_by_phase_gib": pm["peak_by_phase"], "static_gib": pm["static"],
                      "flops_per_step": plan["work"]["flops"], "forwards_per_step": plan["work"]["forwards"],
                      "seconds_per_step": pt["seconds_per_step"], "rollout_seconds": rollout_s,
                      "optimize_seconds": pt["compute_seconds_per_step"] - rollout_s,
                      "tflops": args.tflops, "mfu": args.mfu, "bandwidth_tb_s": args.bandwidth}
    last = result["train_step"]["steps"][-1]
    result["plan_vs_measured"] = {
        "peak_memory_gib": {"plan": pm["peak"], "measured": result["train_step"]["peak_gpu_memory_gib"]},
        "seconds_per_step": {"plan": pt["seconds_per_step"], "measured": last["seconds"]},
        "rollout_seconds": {"plan": rollout_s, "measured": last["rollout_seconds"]},
        "optimize_seconds": {"plan": result["plan"]["optimize_seconds"], "measured": last["optimize_seconds"]},
        "achieved_mfu": plan["work"]["flops"] / last["seconds"] / (args.tflops * 1e12),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    s, t = result["sampler"], result["train_step"]
    print(f"{result['device_name']} {result['dtype']} {scale}: sampler {s['tokens_per_s']:.1f} tok/s "
          f"({s['forwards_per_s']:.2f} forwards/s); RL step {t['seconds']:.2f} s "
          f"(rollout {t['steps'][-1]['rollout_seconds']:.2f} s, optimize {t['steps'][-1]['optimize_seconds']:.2f} s); "
          f"peak GPU memory {t['peak_gpu_memory_gib'] if t['peak_gpu_memory_gib'] is not None else 'n/a'} GiB -> {out}")
    return result


if __name__ == "__main__":
    main()
