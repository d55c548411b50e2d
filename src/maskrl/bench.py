"""Benchmarks behind ``maskrl bench ...`` (JSON output; speed claims are ratios from one run).

``maskrl bench sampler`` (issue 12): rollout speed of the one sampler for
``{cache none, prefix, dual} x {fixed, threshold}``:

1. speed on a random bidirectional Llama (4 layers, width 256, the character tokenizer), batch 8,
   prompt 64, block 32, at several completion lengths: completion tokens per second (median and
   spread over repetitions, settings interleaved within each repetition so that load from other
   processes hits them alike), row-forwards per completion token, and each setting's ratio to
   ``none/fixed`` of the same repetition;
2. greedy accuracy (Wilson 95 % interval) and tokens/s of trained models on their test files
   (the demo's Sudoku SFT model; a Countdown SFT model evaluated with several blocks).

Sampler settings: fixed schedule with ``steps = L/2`` (two tokens per step, the evaluation default),
threshold schedule with ``threshold = 0.9`` (Fast-dLLM); random-shape runs sample at temperature
0.9 (rollout setting, seeded), accuracy runs are greedy.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Sequence

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling import CACHES, SamplerConfig, generate

__all__ = ["sampler_settings", "bench_sampler_speed", "bench_sampler_accuracy", "run_sampler_bench"]


def sampler_settings(gen_length: int, block_length: int, temperature: float, steps: int | None = None,
                     threshold: float = 0.9) -> dict[str, SamplerConfig]:
    """``{"<cache>/<schedule>": SamplerConfig}`` for every cache x schedule (fixed: ``steps``,
    default ``gen_length // 2``)."""
    steps = steps or max(gen_length // 2, gen_length // block_length)
    out = {}
    for cache in (c for c in CACHES if c != "block"):  # the block cache needs a block-diffusion model
        for sched in ("fixed", "threshold"):  # LLaDA's rule; Dream's (schedule dream) is not benchmarked here
            out[f"{cache}/{sched}"] = SamplerConfig(gen_length=gen_length, block_length=block_length, steps=steps,
                                                    temperature=temperature, schedule=sched, threshold=threshold,
                                                    cache=cache)
    return out


class _ForwardCounter:
    """Counts decoder forwards and the rows / query tokens they processed (a forward hook)."""

    def __init__(self, adapter: ModelAdapter):
        self.calls = self.rows = self.query_tokens = 0
        module = adapter.model.get_decoder() if adapter.supports_cache else adapter.model
        self._hook = module.register_forward_hook(self._on_forward, with_kwargs=True)

    def _on_forward(self, module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.calls += 1
        if ids is not None:
            self.rows += ids.shape[0]
            self.query_tokens += ids.numel()

    def reset(self):
        self.calls = self.rows = self.query_tokens = 0

    def close(self):
        self._hook.remove()


def _spread(values: Sequence[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": list(values)}


def bench_sampler_speed(gen_lengths: Sequence[int] = (64, 128, 256), reps: int = 3, batch: int = 8,
                        prompt_length: int = 64, block_length: int = 32, hidden_size: int = 256,
                        num_layers: int = 4, seed: int = 0, log=print) -> dict:
    """Tokens/s and forwards per token of every cache x schedule on a random model (see module doc)."""
    from maskrl.models.tiny import build_tiny

    adapter = build_tiny(hidden_size=hidden_size, num_layers=num_layers, num_heads=4,
                         intermediate_size=3 * hidden_size, max_positions=prompt_length + max(gen_lengths), seed=seed)
    adapter.model.eval()
    gen = torch.Generator().manual_seed(seed)
    vocab = adapter.model.config.vocab_size
    prompt = torch.randint(5, vocab, (batch, prompt_length), generator=gen)
    pmask = torch.ones_like(prompt, dtype=torch.bool)
    counter = _ForwardCounter(adapter)
    results = {}
    try:
        for L in gen_lengths:
            settings = sampler_settings(L, block_length, temperature=0.9)
            times = {k: [] for k in settings}
            fwd = {}
            for rep in range(reps):
                for name, cfg in settings.items():
                    counter.reset()
                    g = torch.Generator().manual_seed(1000 + rep)
                    t0 = time.perf_counter()
                    r = generate(adapter, prompt, pmask, cfg, generator=g)
                    dt = time.perf_counter() - t0
                    times[name].append(dt)
                    fwd[name] = {"row_forwards_per_token": counter.rows / (batch * L),
                                 "forward_calls": counter.calls, "steps": int(r.num_steps.max()),
                                 "query_tokens_per_token": counter.query_tokens / (batch * L)}
                    log(f"[bench sampler] L={L} rep={rep} {name}: {batch * L / dt:.0f} tok/s")
            base = times["none/fixed"]
            res = {}
            for name in settings:
                tps = [batch * L / t for t in times[name]]
                ratio = [b / t for b, t in zip(base, times[name])]  # same repetition: side by side
                res[name] = {"tokens_per_s": _spread(tps), "speedup_vs_none_fixed": _spread(ratio), **fwd[name]}
            results[str(L)] = res
    finally:
        counter.close()
    return {"model": {"hidden_size": hidden_size, "num_layers": num_layers, "vocab": vocab},
            "batch": batch, "prompt_length": prompt_length, "block_length": block_length, "reps": reps,
            "temperature": 0.9, "threshold": 0.9, "fixed_steps": "L/2", "results": results}


def bench_sampler_accuracy(model_path: str, config_path: str, gen_length: int, block_length: int,
                           limit: int = 0, batch_size: int = 64, log=print) -> dict:
    """Greedy accuracy (Wilson 95 %) and tokens/s of every cache x schedule on the task's test file.

    Args:
        model_path: a folder written by ``maskrl sft --out``.
        config_path: the YAML that trained it (task name and prompt template).
        gen_length, block_length: sampler shape (``gen_length / block_length`` blocks).
        limit: first rows only (0: all).
    """
    from maskrl.config import load_config
    from maskrl.evaluate import evaluate_examples
    from maskrl.models.tiny import load_tiny
    from maskrl.tasks import get_task

    cfg = load_config([config_path], [])
    task = get_task(cfg.task.name, cfg.task.prompt_template or None)
    examples = task.load(task.resolve_path(cfg.task.data_path or None), limit=limit or None)
    adapter = load_tiny(model_path)
    adapter.model.eval()
    counter = _ForwardCounter(adapter)
    out = {}
    try:
        for name, sc in sampler_settings(gen_length, block_length, temperature=0.0, steps=gen_length).items():
            counter.reset()
            t0 = time.perf_counter()
            res = evaluate_examples(adapter, task, examples, sc, batch_size=batch_size)
            dt = time.perf_counter() - t0
            m = res.metrics
            out[name] = {"accuracy": m["accuracy"], "accuracy_ci95": m["accuracy_ci95"], "n": m["n"],
                         "seconds": dt, "tokens_per_s": len(examples) * gen_length / dt,
                         "row_forwards_per_token": counter.rows / (len(examples) * gen_length),
                         **({"cell_accuracy": m["cell_accuracy"]} if "cell_accuracy" in m else {})}
            log(f"[bench sampler] {task.name} {name}: acc {m['accuracy']:.3f} {m['accuracy_ci95']}, "
                f"{out[name]['tokens_per_s']:.0f} tok/s")
    finally:
        counter.close()
    base = out["none/fixed"]["seconds"]
    for name in out:
        out[name]["speedup_vs_none_fixed"] = base / out[name]["seconds"]
    return {"task": task.name, "model": str(model_path), "config": str(config_path), "rows": len(examples),
            "gen_length": gen_length, "block_length": block_length, "fixed_steps": gen_length,
            "threshold": 0.9, "results": out}


def run_sampler_bench(out: str | Path, quick: bool = False, gen_lengths: Sequence[int] | None = None,
                      reps: int | None = None, sudoku_model: str | None = None,
                      sudoku_config: str = "configs/demo_sudoku.yaml", countdown_model: str | None = None,
                      countdown_config: str = "configs/countdown_diffu_grpo.yaml", countdown_block: int = 4,
                      parts: Sequence[str] = ("speed", "sudoku", "countdown"), log=print) -> dict:
    """``maskrl bench sampler``: the speed table, plus accuracy tables for the models given; writes
    JSON to ``out`` and returns it. ``quick``: 3 repetitions (default 5). ``parts``: which of
    ``speed``, ``sudoku``, ``countdown`` to run."""
    import json
    import platform

    report = {"benchmark": "sampler", "quick": quick, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "machine": platform.machine()}
    bad = set(parts) - {"speed", "sudoku", "countdown"}
    if bad:
        raise ValueError(f"parts: unknown {sorted(bad)}; valid: speed, sudoku, countdown")
    if "speed" in parts:
        report["speed"] = bench_sampler_speed(gen_lengths or (64, 128, 256), reps or (3 if quick else 5), log=log)
    if "sudoku" not in parts:
        pass
    elif sudoku_model:
        report["sudoku"] = bench_sampler_accuracy(sudoku_model, sudoku_config, 16, 16, log=log)
    else:
        report["sudoku"] = "skipped: pass --sudoku-model (a `maskrl sft --config configs/demo_sudoku.yaml` output)"
    if "countdown" not in parts:
        pass
    elif countdown_model:
        report["countdown"] = bench_sampler_accuracy(countdown_model, countdown_config, 16, countdown_block, log=log)
    else:
        report["countdown"] = "skipped: pass --countdown-model (a `maskrl sft --config configs/countdown_diffu_grpo.yaml` output)"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    return report
