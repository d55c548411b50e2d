"""Benchmarks behind ``maskrl bench ...`` (JSON output; speed claims are ratios from one run).

``maskrl bench sampler`` (issue 12): rollout speed of the one sampler over a grid
``batch {1, 8, 64} x cache {none, prefix, dual} x schedule {fixed, threshold}`` (with ``--block-size``,
the tiny block-diffusion model and its caches ``{none, block}``):

1. speed on a random Llama (4 layers, width 256, the character tokenizer; bidirectional, or block-causal
   with ``block_size``), prompt 64, block 32, at each batch size and completion length: completion tokens
   per second (median and spread over repetitions, settings interleaved within each repetition so that
   load from other processes hits them alike), decoder forward calls and row-forwards per completion
   token, and each setting's ratio to ``none/fixed`` of the same batch and repetition;
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
                     threshold: float = 0.9, block_model: bool = False) -> dict[str, SamplerConfig]:
    """``{"<cache>/<schedule>": SamplerConfig}`` for every cache x schedule (fixed: ``steps``,
    default ``gen_length // 2``); caches ``none, prefix, dual`` for a full-attention model, ``none, block``
    for a block-diffusion one (``block_model``)."""
    steps = steps or max(gen_length // 2, gen_length // block_length)
    caches = ("none", "block") if block_model else tuple(c for c in CACHES if c != "block")
    out = {}
    for cache in caches:
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


def bench_sampler_speed(gen_lengths: Sequence[int] = (64, 128, 256), reps: int = 3, batch: int | Sequence[int] = 8,
                        prompt_length: int = 64, block_length: int = 32, hidden_size: int = 256,
                        num_layers: int = 4, seed: int = 0, log=print, on_cell=None,
                        block_size: int | None = None) -> dict:
    """Tokens/s and forwards per token of every batch size x cache x schedule on a random model (see
    module doc). ``batch``: one batch size or several (the grid's rows); ``block_size``: the tiny
    block-diffusion model with blocks of that many tokens (``block_length`` is set to it) and the caches
    ``none`` / ``block``. ``on_cell(record)`` is called with each measurement as it finishes
    (:class:`~maskrl.bench_record.BenchRecord`).

    Returns:
        ``{"model", "batches", ..., "results": {L: {batch: {setting: {...}}}}}`` (keys as strings).
    """
    from maskrl.models.tiny import build_tiny

    batches = [batch] if isinstance(batch, int) else list(batch)
    block_length = block_size or block_length
    adapter = build_tiny(hidden_size=hidden_size, num_layers=num_layers, num_heads=4,
                         intermediate_size=3 * hidden_size, max_positions=prompt_length + max(gen_lengths), seed=seed,
                         block_size=block_size)
    adapter.model.eval()
    gen = torch.Generator().manual_seed(seed)
    vocab = adapter.model.config.vocab_size
    prompt = torch.randint(5, vocab, (max(batches), prompt_length), generator=gen)
    counter = _ForwardCounter(adapter)
    results: dict = {}
    try:
        for L in gen_lengths:
            settings = sampler_settings(L, block_length, temperature=0.9, block_model=block_size is not None)
            results[str(L)] = {str(n): _grid_row(adapter, counter, prompt[:n], settings, L, reps, log, on_cell)
                               for n in batches}
    finally:
        counter.close()
    return {"model": {"hidden_size": hidden_size, "num_layers": num_layers, "vocab": vocab, "block_size": block_size},
            "batches": batches, "prompt_length": prompt_length, "block_length": block_length, "reps": reps,
            "temperature": 0.9, "threshold": 0.9, "fixed_steps": "L/2", "results": results}


def _grid_row(adapter, counter, prompt, settings, L, reps, log, on_cell) -> dict:
    """One batch size's settings, interleaved within each repetition (:func:`bench_sampler_speed`)."""
    n = prompt.shape[0]
    pmask = torch.ones_like(prompt, dtype=torch.bool)
    times = {k: [] for k in settings}
    fwd = {}
    for rep in range(reps):
        for name, cfg in settings.items():
            counter.reset()
            t0 = time.perf_counter()
            r = generate(adapter, prompt, pmask, cfg, generator=torch.Generator().manual_seed(1000 + rep))
            dt = time.perf_counter() - t0
            times[name].append(dt)
            fwd[name] = {"forward_calls_per_token": counter.calls / (n * L),
                         "row_forwards_per_token": counter.rows / (n * L),
                         "forward_calls": counter.calls, "steps": int(r.num_steps.max()),
                         "query_tokens_per_token": counter.query_tokens / (n * L)}
            log(f"[bench sampler] L={L} batch={n} rep={rep} {name}: {n * L / dt:.0f} tok/s")
            if on_cell is not None:
                on_cell({"part": "speed", "gen_length": L, "batch": n, "rep": rep, "setting": name, "seconds": dt,
                         "tokens_per_s": n * L / dt, **fwd[name]})
    base = times["none/fixed"]
    res = {}
    for name in settings:
        tps = [n * L / t for t in times[name]]
        ratio = [b / t for b, t in zip(base, times[name])]  # same repetition: side by side
        res[name] = {"tokens_per_s": _spread(tps), "speedup_vs_none_fixed": _spread(ratio), **fwd[name]}
    return res


def bench_sampler_accuracy(model_path: str, config_path: str, gen_length: int, block_length: int,
                           limit: int = 0, batch_size: int = 64, log=print, on_cell=None) -> dict:
    """Greedy accuracy (Wilson 95 %) and tokens/s of every cache x schedule on the task's test file;
    ``on_cell(record)`` is called with each setting's record as it finishes.

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
            if on_cell is not None:
                on_cell({"part": task.name, "setting": name, **out[name]})
    finally:
        counter.close()
    base = out["none/fixed"]["seconds"]
    for name in out:
        out[name]["speedup_vs_none_fixed"] = base / out[name]["seconds"]
    return {"task": task.name, "model": str(model_path), "config": str(config_path), "rows": len(examples),
            "gen_length": gen_length, "block_length": block_length, "fixed_steps": gen_length,
            "threshold": 0.9, "results": out}


#: ``--quick``: completion lengths, batch sizes and repetitions of the speed grid (about a minute on a quiet CPU)
QUICK_LENGTHS, QUICK_BATCHES, QUICK_REPS = (64,), (1, 8), 2
#: the full grid's (without ``--quick``)
FULL_LENGTHS, FULL_BATCHES, FULL_REPS = (128,), (1, 8, 64), 3


def parse_counts(text: str | None, flag: str, example: str) -> list[int] | None:
    """A comma-separated list of integers >= 1 (``--gen-length``, ``--batch``), or ``None`` for no text.

    Raises:
        ValueError: naming ``flag`` and the text, on anything else.
    """
    if not text:
        return None
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{flag}: expected comma-separated integers >= 1 such as {example!r}, got {text!r}")
    return values


def run_sampler_bench(out: str | Path, quick: bool = False, gen_lengths: Sequence[int] | None = None,
                      reps: int | None = None, sudoku_model: str | None = None,
                      sudoku_config: str = "configs/demo_sudoku.yaml", countdown_model: str | None = None,
                      countdown_config: str = "configs/countdown_diffu_grpo.yaml", countdown_block: int = 4,
                      parts: Sequence[str] = ("speed", "sudoku", "countdown"), log=print,
                      speed_shape: dict | None = None, batches: Sequence[int] | None = None,
                      block_size: int | None = None) -> dict:
    """``maskrl bench sampler``: the speed grid, plus accuracy tables for the models given; writes
    JSON to ``out`` -- each measurement's record as it finishes (``cells``; a stopped bench keeps
    them), each table when it is complete -- and returns it. ``quick``: completion length 64, batches
    1 and 8, 2 repetitions (24 measurements, about a minute on a quiet machine; default: length 128,
    batches 1, 8 and 64, 3 repetitions). ``parts``: which of ``speed``, ``sudoku``, ``countdown`` to run.
    ``speed_shape``: other model / batch arguments of :func:`bench_sampler_speed` (e.g. ``hidden_size``;
    ``batches`` wins over its ``batch``);
    ``block_size``: bench the tiny block-diffusion model (caches none / block).

    Raises:
        ValueError: naming an unknown part, a batch size or length below 1, or ``reps``, ``block_size`` or
            ``countdown_block`` below 1 (by their ``maskrl bench sampler`` flags), before anything runs.
    """
    import platform

    from maskrl.bench_record import BenchRecord

    bad = set(parts) - {"speed", "sudoku", "countdown"}
    if bad:
        raise ValueError(f"parts: unknown {sorted(bad)}; valid: speed, sudoku, countdown")
    if batches is not None and (not batches or min(batches) < 1):
        raise ValueError(f"batch sizes must be >= 1, got {list(batches)}")
    for flag, value in (("--reps", reps), ("--block-size", block_size), ("--countdown-block", countdown_block)):
        if value is not None and value < 1:  # reps 0 fell back to the default count, silently
            raise ValueError(f"{flag}: must be >= 1, got {value}")
    rec = BenchRecord(out, {"benchmark": "sampler", "quick": quick, "torch": torch.__version__,
                            "threads": torch.get_num_threads(), "machine": platform.machine()})
    if "speed" in parts:
        lengths = gen_lengths or (QUICK_LENGTHS if quick else FULL_LENGTHS)
        shape = dict(speed_shape or {})
        batch = batches or shape.pop("batch", None) or (QUICK_BATCHES if quick else FULL_BATCHES)
        shape.pop("batch", None)
        rec.update(speed=bench_sampler_speed(lengths, reps or (QUICK_REPS if quick else FULL_REPS), batch=batch,
                                             log=log, on_cell=rec.cell, block_size=block_size, **shape))
    for part, model, config, block in (("sudoku", sudoku_model, sudoku_config, 16),
                                       ("countdown", countdown_model, countdown_config, countdown_block)):
        if part not in parts:
            continue
        if model:
            rec.update(**{part: bench_sampler_accuracy(model, config, 16, block, log=log, on_cell=rec.cell)})
        else:
            rec.update(**{part: f"skipped: pass --{part}-model (a `maskrl sft --config {config}` output)"})
    return rec.finish()
