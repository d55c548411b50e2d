"""The GPU grid, one command on one lent GPU (< 10 minutes): LLaDA-8B sampler speed and one RL step per phase.

    python benchmarks/speed/gpu_grid.py                       # one GPU: LLaDA-8B shape, 32 blocks, bf16
    python benchmarks/speed/gpu_grid.py --bandwidth 4.8       # H200 (the plan's weight-read rule)
    python benchmarks/speed/gpu_grid.py --only b64-none-fixed,b64-none-threshold   # cells a first run skipped
    python benchmarks/speed/gpu_grid.py --smoke               # CPU, tiny stand-in, the same code (test suite)

Model: a **randomly initialised** LLaDA-8B-Instruct (:func:`gpu_check.build_model`: its published
config through the loader's LLaDA -> Llama conversion, built on the device in bf16; no download) with
an id tokenizer of its 126,464 ids (LLaDA's mask 126336 and eos 126081), so candidates span the full
vocabulary. Prompts are ``--prompt-length`` random ids (GSM8K prompts with LLaDA's chat template are
100-200 tokens).

1. **Sampler grid**, GSM8K-256 (L 256, block 32, τ 0.9; ``fixed``: 128 steps, 2 tokens a step;
   ``threshold``: Fast-dLLM's 0.9): batch 1 and 64 × cache ``none`` / ``prefix`` / ``dual`` × schedule.
   Each cell: seconds of one :func:`maskrl.sampling.generate` after a one-block warm-up of the same
   cell, tokens/s (batch · L / seconds), decoder forwards (hooks) and forwards per token
   (forwards / L), beside **the plan's prediction** for the work the cell ran: ``maskrl plan``'s rule
   (:mod:`maskrl.plan`) -- the FLOPs of every recorded forward counted by its ``FlopModel``
   (``FlopCounterMode`` on the meta model, at 1 and 2 blocks and extended to the full depth, exact
   since blocks are identical) at ``--tflops`` × ``--mfu``, or one read of the weights per forward at
   ``--bandwidth``, the slower. A random model's confidences are low: the threshold schedule then
   commits about one token a step (``forwards_per_token`` says it), a real model's fewer forwards.
2. **One RL step per recipe** (``configs/llada8b_gsm8k_diffu_grpo.yaml``,
   ``configs/llada8b_sudoku_dispo_diffu_grpo.yaml``: LoRA r 128, checkpointing, B 2 × G 6, μ 12 unless
   ``--mu``), on the same random model with fresh LoRA and a hashed reward (random 0/1 per completion,
   so advantages and DiSPO's branch rewards vary): seconds of ``rollout`` (``generate`` inside
   ``RLTrainer.collect``), ``credit`` (rewards and credit modules), ``frozen`` (θ_old and reference
   log-probs) and ``theta`` (θ forwards, backwards, updates), beside ``maskrl plan``'s seconds for the
   same phases (computed in a spawned CPU process while the GPU runs).

Time: ``--budget-s`` (default 540 s from the start) bounds the run. Cells run cheapest first; a cell
whose predicted time (its query tokens at the rate of the last cell of its batch size) would pass the
budget is skipped and listed with the prediction (rerun it with ``--only``); the RL steps run when at
least ``--rl-reserve-s`` is left. Output: one JSON (``--out``) rewritten after every cell, and one
printed line per cell.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check  # noqa: E402  (the same random LLaDA model and device helpers)
from id_tokens import hash_reward, id_tokenizer, prompt_texts  # noqa: E402,F401  (maskrl-free helpers)
from maskrl.tasks.base import Task  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_grid.json"
RECIPES = {"diffu_grpo": ROOT / "configs" / "llada8b_gsm8k_diffu_grpo.yaml",
           "dispo": ROOT / "configs" / "llada8b_sudoku_dispo_diffu_grpo.yaml"}
#: the grid at each scale: sampler shape, batches, RL-step overrides
SCALES = {
    "full": dict(gen_length=256, block_length=32, steps=128, batches=(1, 64), prompt_length=128, rl=[]),
    "tiny": dict(gen_length=16, block_length=8, steps=8, batches=(1, 4), prompt_length=8,
                 rl=["rollout.gen_length=16", "rollout.block_length=8", "rollout.steps=8", "train.prompts_per_step=1",
                     "train.group_size=2", "train.micro_batch_size=2", "train.inner_iterations=1", "model.lora_rank=4",
                     "model.lora_alpha=8"]),
}
CACHES, SCHEDULES = ("dual", "prefix", "none"), ("fixed", "threshold")


def build(scale: str, device: torch.device, dtype: torch.dtype):
    """The random LLaDA-shaped model of ``scale`` with :func:`id_tokenizer` (:class:`ModelAdapter`)."""
    a = gpu_check.build_model(scale, device, dtype)
    m = gpu_check.MODELS[scale]
    return dataclasses.replace(a, tokenizer=id_tokenizer(m["embedding_size"], a.mask_id, a.eos_id))


def query_tokens(cache: str, schedule: str, rows: int, prompt: int, run: dict) -> int:
    """Query tokens a cell's forwards process at most (the threshold schedule at one token a step): for
    the skip rule only."""
    L, b = run["gen_length"], run["block_length"]
    per_block = run["steps"] * b // L if schedule == "fixed" else b
    total = 0
    for j in range(L // b):
        window = {"none": prompt + L, "prefix": L - j * b, "dual": b}[cache]
        total += prompt + L + (per_block - 1) * window if cache != "none" else per_block * window
    return rows * total


class FlopRule:
    """``maskrl plan``'s time rule for recorded forwards: FLOPs from :class:`maskrl.plan.FlopModel` at 1
    and 2 blocks, extended to the full depth, at tflops × MFU; or the weight reads, the slower."""

    def __init__(self, shape, dtype: torch.dtype, hw, weight_bytes: int) -> None:
        from maskrl.plan import FlopModel

        self.models = [FlopModel(dataclasses.replace(shape, num_layers=n), dtype, None, False) for n in (1, 2)]
        self.layers, self.hw, self.weight_bytes = shape.num_layers, hw, weight_bytes

    def seconds(self, calls: list[list[int]]) -> dict:
        flops = 0
        for rows, q, past, scored in calls:
            f1, f2 = (m.flops("rollout", rows, q, scored, past) for m in self.models)
            flops += f1 + (self.layers - 1) * (f2 - f1)
        compute = flops / (self.hw.tflops * 1e12 * self.hw.mfu)
        reads = len(calls) * self.weight_bytes / self.hw.bandwidth
        return {"flops": flops, "compute_s": compute, "weight_read_s": reads, "seconds": max(compute, reads)}


def sampler_cell(adapter, batch: int, cache: str, schedule: str, run: dict, prompt: int, vocab_high: int,
                 device: torch.device) -> tuple[dict, list]:
    """One grid cell: warm-up block, then one timed ``generate``; returns ``(row, recorded calls)``."""
    from maskrl.plan.work import _Recorder
    from maskrl.sampling import SamplerConfig, generate
    from maskrl.text import encode_prompts

    kw = dict(block_length=run["block_length"], temperature=gpu_check.TEMPERATURE, schedule=schedule, cache=cache)
    cfg = SamplerConfig(gen_length=run["gen_length"], steps=run["steps"], **kw)
    warm = SamplerConfig(gen_length=run["block_length"], steps=run["steps"] * run["block_length"] // run["gen_length"], **kw)
    ids, mask = encode_prompts(adapter.tokenizer, prompt_texts(batch, prompt, vocab_high, 0), add_bos=False)
    ids, mask = ids.to(device), mask.to(device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        generate(adapter, ids, mask, warm, generator=gen)
        rec = _Recorder(adapter)
        try:
            gpu_check._sync(device)
            t0 = time.perf_counter()
            ro = generate(adapter, ids, mask, cfg, generator=gen)
            gpu_check._sync(device)
            sec = time.perf_counter() - t0
        finally:
            rec.close()
    calls = rec.take()
    L = run["gen_length"]
    return {"cell": f"b{batch}-{cache}-{schedule}", "batch": batch, "cache": cache, "schedule": schedule,
            "gen_length": L, "prompt_length": prompt, "seconds": sec, "tokens_per_s": batch * L / sec,
            "forwards": len(calls), "forwards_per_token": len(calls) / L,
            "mean_steps_per_row": float(ro.num_steps.float().mean())}, calls


class HashReward(Task):
    """A stand-in task: reward 0/1 from a hash of the completion (random, so advantages are non-zero)."""

    name = "hash_reward"

    def reward(self, prompts, completions, **_):
        return hash_reward(completions)


def recipe_config(name: str, scale: str, mu: int | None, out_dir: str):
    from maskrl.config import load_config

    sets = [f"output_dir={out_dir}", "train.report_to=[]"] + SCALES[scale]["rl"]
    if mu:
        sets.append(f"train.inner_iterations={mu}")
    return load_config([RECIPES[name]], sets)


def plan_phases(name: str, scale: str, mu: int | None, prompt: int, hw: dict, threads: int) -> dict:
    """``maskrl plan``'s seconds of one step of recipe ``name`` by phase (rollout, credit, frozen, theta)
    on one GPU (runs in a spawned CPU process)."""
    from maskrl.plan import Hardware, ModelShape, make_plan

    torch.set_num_threads(threads)
    m = gpu_check.MODELS[scale]
    shape = ModelShape("llada", m["d_model"], m["n_layers"], m["n_heads"], m["n_kv_heads"], m["mlp_hidden_size"],
                       m["embedding_size"], source="benchmarks/gpu_check.py MODELS")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = recipe_config(name, scale, mu, tmp)
        p = make_plan(cfg, Hardware(**hw), prompt_length=prompt, search=False, shape=shape)
    by = p["time"]["seconds_by_phase_term"]
    group = {"rollout": ("rollout",), "credit": ("credit",), "frozen": ("theta_old/", "reference/"), "theta": ("theta/",)}
    out = {k: sum(v for t, v in by.items() if any(t == pre or t.startswith(pre) for pre in prefixes))
           for k, prefixes in group.items()}
    out |= {"step_compute_s": p["time"]["compute_seconds_per_step"], "step_s": p["time"]["seconds_per_step"],
            "peak_gib": p["memory_gib"]["peak"], "rollout_peak_gib": p["memory_gib"]["peak_by_phase"].get("rollout")}
    return out


def rl_step(adapter, name: str, scale: str, mu: int | None, prompt: int, vocab_high: int, device: torch.device) -> dict:
    """One RL step of recipe ``name`` with fresh LoRA on ``adapter``'s model; seconds per phase."""
    import maskrl.trainer as trainer_module
    from maskrl.models import apply_lora, enable_gradient_checkpointing
    from maskrl.tasks.base import Example

    with tempfile.TemporaryDirectory() as tmp:
        cfg = recipe_config(name, scale, mu, tmp)
        mc = cfg.model
        policy = apply_lora(adapter, rank=mc.lora_rank, alpha=mc.lora_alpha, dropout=mc.lora_dropout,
                            target_modules=mc.lora_target_modules)
        if mc.gradient_checkpointing:
            enable_gradient_checkpointing(policy)
        texts = prompt_texts(4 * cfg.train.prompts_per_step, prompt, vocab_high, 1)
        trainer = trainer_module.RLTrainer(cfg, policy, HashReward(), [Example(id=i, prompt=t) for i, t in enumerate(texts)])
        spent: dict[str, float] = {}
        real_generate, real_frozen = trainer_module.generate, trainer._frozen_log_probs

        def timed(key, fn):
            def run(*a, **k):
                gpu_check._sync(device)
                t0 = time.perf_counter()
                out = fn(*a, **k)
                gpu_check._sync(device)
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0
                return out
            return run

        trainer_module.generate = timed("rollout", real_generate)
        trainer._frozen_log_probs = timed("frozen", real_frozen)
        try:
            gpu_check._sync(device)
            t0 = time.perf_counter()
            batch = trainer.collect()
            gpu_check._sync(device)
            t1 = time.perf_counter()
            trainer.optimize(batch)
            gpu_check._sync(device)
            t2 = time.perf_counter()
        finally:
            trainer_module.generate = real_generate
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        del trainer
    policy.model.unload()  # peft's public API: the base model without the LoRA layers, for the next recipe
    return {"recipe": name, "mu": cfg.train.inner_iterations, "rows": cfg.train.prompts_per_step * cfg.train.group_size,
            "seconds": {"rollout": spent["rollout"], "credit": t1 - t0 - spent["rollout"], "frozen": spent.get("frozen", 0.0),
                        "theta": t2 - t1 - spent.get("frozen", 0.0), "step": t2 - t0},
            "peak_gpu_memory_gib": peak}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny stand-in (the test suite runs this)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--only", default="", help="comma-separated cells (b64-dual-fixed, ...) and/or rl-diffu_grpo, rl-dispo")
    ap.add_argument("--mu", type=int, default=0, help="inner iterations of the RL steps (default: the recipe's 12)")
    ap.add_argument("--prompt-length", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--rl-reserve-s", type=float, default=150.0)
    ap.add_argument("--tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s (H100 SXM 989, H200 989)")
    ap.add_argument("--mfu", type=float, default=0.4)
    ap.add_argument("--bandwidth", type=float, default=3.35, help="TB/s (H100 SXM 3.35, H200 4.8)")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    scale = "tiny" if args.smoke else "full"
    if args.smoke:
        torch.set_num_threads(1)
    device = torch.device("cpu" if args.smoke else ("cuda" if args.device == "auto" else args.device))
    dtype = torch.float32 if args.smoke else torch.bfloat16
    run = SCALES[scale]
    prompt = args.prompt_length or run["prompt_length"]
    only = {c for c in args.only.split(",") if c}
    hw = dict(gpus=1, strategy="single", tflops=args.tflops, mfu=args.mfu, bandwidth=args.bandwidth * 1e12)
    mu = args.mu or None
    pool = cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    plans = {r: pool.submit(plan_phases, r, scale, mu, prompt, hw, 1 if args.smoke else 8) for r in RECIPES
             if not only or f"rl-{r}" in only}
    adapter = build(scale, device, dtype)
    m = gpu_check.MODELS[scale]
    vocab_high = min(m["mask_token_id"], m["eos_token_id"]) - 100
    from maskrl.plan import GIB, Hardware, ModelShape

    shape = ModelShape("llada", m["d_model"], m["n_layers"], m["n_heads"], m["n_kv_heads"], m["mlp_hidden_size"],
                       m["embedding_size"])
    weight_bytes = sum(p.numel() * p.element_size() for p in adapter.model.parameters())
    rule = FlopRule(shape, dtype, Hardware(gpu_memory=80 * GIB, **hw), weight_bytes)
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": str(dtype),
           "scale": scale, "model": dict(m), "prompt_length": prompt, "hardware_for_plan": hw, "torch": torch.__version__,
           "command": " ".join(["benchmarks/speed/gpu_grid.py"] + (argv if argv is not None else sys.argv[1:])),
           "build_seconds": time.perf_counter() - start, "sampler": [], "skipped": [], "rl_steps": []}

    def write() -> None:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")

    def left() -> float:
        return args.budget_s - (time.perf_counter() - start)

    def cells(batch):
        return [(batch, c, s) for c in CACHES for s in SCHEDULES if not only or f"b{batch}-{c}-{s}" in only]

    rate: dict[int, float] = {}  # seconds per query token of the last cell of each batch size

    def run_cells(todo) -> None:
        for batch, cache, schedule in todo:
            name, q = f"b{batch}-{cache}-{schedule}", query_tokens(cache, schedule, batch, prompt, run)
            guess = q * rate[batch] if batch in rate else None
            if left() <= 0 or (guess is not None and guess > left()):
                out["skipped"].append({"cell": name, "predicted_s": guess, "left_s": left()})
                print(f"{name}: skipped (predicted {guess if guess is None else round(guess, 1)} s, {left():.0f} s left)")
                write()
                continue
            row, calls = sampler_cell(adapter, batch, cache, schedule, run, prompt, vocab_high, device)
            rate[batch] = row["seconds"] / q
            row["plan"] = rule.seconds(calls)
            out["sampler"].append(row)
            write()
            print(f"{name}: {row['tokens_per_s']:.1f} tok/s, {row['seconds']:.2f} s, {row['forwards']} forwards "
                  f"({row['forwards_per_token']:.2f}/token); plan {row['plan']['seconds']:.3g} s", flush=True)

    run_cells(cells(run["batches"][0]))
    big = cells(run["batches"][1])
    run_cells(big[:1])  # the cheapest large cell (dual, fixed) first: it sets the rate for the rest
    for name in plans:
        if left() < args.rl_reserve_s * (0 if args.smoke else 1):
            out["skipped"].append({"cell": f"rl-{name}", "left_s": left()})
            continue
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        row = rl_step(adapter, name, scale, mu, prompt, vocab_high, device)
        row["plan_seconds"] = plans[name].result()
        out["rl_steps"].append(row)
        write()
        s, p = row["seconds"], row["plan_seconds"]
        print(f"rl-{name} (mu {row['mu']}): " + ", ".join(f"{k} {s[k]:.2f} s (plan {p[k]:.3g})" for k in
                                                          ("rollout", "credit", "frozen", "theta"))
              + f"; step {s['step']:.2f} s (plan {p['step_s']:.3g})", flush=True)
    run_cells(big[1:])
    pool.shutdown(cancel_futures=True)
    out["seconds"] = time.perf_counter() - start
    write()
    return out


if __name__ == "__main__":
    main()
