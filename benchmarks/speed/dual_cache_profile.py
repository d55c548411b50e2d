"""Where a cached rollout's time goes at a small vocabulary, and what the in-place cache writes saved.

Default: torch.profiler's operator table of one ``generate`` with ``cache: none`` and one with
``cache: dual`` on the same random LLaDA-layout model (a bidirectional Llama):

    PYTHONPATH=src python benchmarks/speed/dual_cache_profile.py                 # vocab 8192, width 512, 4 blocks
    PYTHONPATH=src python benchmarks/speed/dual_cache_profile.py --vocab 126464 --rows 12

``--before REV``: the same rollouts timed side by side under this checkout's code and under the code of
git revision ``REV`` (``git archive REV src``), for every cache (none / prefix / dual) x schedule (fixed /
threshold): two worker processes, one per code version, one thread each, alternated cell by cell (which
one goes first alternates too), ``--reps`` repetitions; the tokens of the two must be equal. Writes a
JSON record (``--out``):

    PYTHONPATH=src python benchmarks/speed/dual_cache_profile.py --before b95d8c7 \\
        --out benchmarks/speed/dual_cache_inplace.json

One thread; L ``--gen-length`` in blocks of 32, fixed schedule at two tokens a step, threshold 0.9,
temperature 0.9 (seeded), prompts of ``--prompt-length`` random ids. The profile prints each run's
seconds and its ten most expensive operators (self CPU time), then the share of the data-movement
operators (``index``, ``gather``, ``cat``, ``copy_``, ``scatter_``: the window forward's key/value copies)
and of the Gumbel uniforms (``uniform_``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

MOVES = ("aten::index", "aten::gather", "aten::cat", "aten::copy_", "aten::scatter_")
ROOT = Path(__file__).resolve().parents[2]
CELLS = [(c, s) for c in ("none", "prefix", "dual") for s in ("fixed", "threshold")]


def build(args):
    """The random LLaDA-layout model (bidirectional Llama, seed 0), its prompts ``[rows, P]`` and mask."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from maskrl.models import ModelAdapter

    v, w = args.vocab, args.width
    cfg = LlamaConfig(vocab_size=v, hidden_size=w, intermediate_size=3 * w, num_hidden_layers=args.layers,
                      num_attention_heads=w // 64, num_key_value_heads=w // 64, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
    ad = ModelAdapter(model=model, mask_id=v - 1, eos_id=v - 2, pad_id=v - 2, family="llada")
    ids = torch.randint(10, v - 10, (args.rows, args.prompt_length), generator=torch.Generator().manual_seed(1))
    return ad, ids, torch.ones_like(ids, dtype=torch.bool)


def config(args, cache: str, schedule: str, gen_length: int | None = None):
    from maskrl.sampling import SamplerConfig

    L = gen_length or args.gen_length
    return SamplerConfig(gen_length=L, block_length=32, steps=L // 2, temperature=0.9, cache=cache,
                         schedule=schedule, threshold=0.9)


def profile_run(args) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from maskrl.plan.memory import quiet_profiler_log
    from maskrl.sampling import generate

    ad, ids, mask = build(args)
    out = {}
    for cache in ("none", "dual"):
        with torch.no_grad(), quiet_profiler_log():
            generate(ad, ids, mask, config(args, cache, "fixed", 32), generator=torch.Generator().manual_seed(0))  # warm-up
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                generate(ad, ids, mask, config(args, cache, "fixed"), generator=torch.Generator().manual_seed(0))
            sec = time.perf_counter() - t0
        ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
        total = sum(ops.values())
        out[cache] = {"seconds": sec, "moves_share": sum(ops.get(k, 0) for k in MOVES) / total,
                      "uniform_share": ops.get("aten::uniform_", 0) / total, "mm_share": ops.get("aten::mm", 0) / total}
        print(f"cache {cache}: {sec:.2f} s (profiled); data movement {out[cache]['moves_share']:.1%}, Gumbel "
              f"uniforms {out[cache]['uniform_share']:.1%}, matmuls {out[cache]['mm_share']:.1%}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    return out


def worker(args) -> None:
    """Serve timing requests on stdin (one JSON ``[cache, schedule]`` a line) with the code on ``sys.path``."""
    from maskrl.sampling import generate

    ad, ids, mask = build(args)
    with torch.no_grad():
        generate(ad, ids, mask, config(args, "dual", "fixed", 32), generator=torch.Generator().manual_seed(0))
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            cache, schedule = json.loads(line)
            t0 = time.process_time()
            ro = generate(ad, ids, mask, config(args, cache, schedule), generator=torch.Generator().manual_seed(0))
            sec = time.process_time() - t0
            print(json.dumps({"seconds": sec, "tokens": ro.completion_ids.tolist()}), flush=True)


def side_by_side(args) -> dict:
    """``--before REV``: this checkout vs ``REV``, alternated cell by cell (module docstring)."""
    from maskrl.records import write_record

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from before_after import ask as ask_worker, start, stop

    argv = list(sys.argv[1:])
    procs = start(__file__, args.before, argv)

    def ask(name, cell):
        return ask_worker(procs[name], json.dumps(cell))

    cells = {f"{c}/{s}": {"before_s": [], "after_s": [], "tokens_equal": True} for c, s in CELLS}
    for rep in range(args.reps):
        for i, cell in enumerate(CELLS):
            key = f"{cell[0]}/{cell[1]}"
            order = ("before", "after") if (rep + i) % 2 == 0 else ("after", "before")
            got = {name: ask(name, cell) for name in order}
            cells[key]["before_s"].append(got["before"]["seconds"])
            cells[key]["after_s"].append(got["after"]["seconds"])
            cells[key]["tokens_equal"] &= got["before"]["tokens"] == got["after"]["tokens"]
            r = got["before"]["seconds"] / got["after"]["seconds"]
            print(f"rep {rep} {key}: before {got['before']['seconds']:.2f} s, after {got['after']['seconds']:.2f} s, "
                  f"before/after {r:.2f}, tokens equal {cells[key]['tokens_equal']}", flush=True)
    stop(procs)
    for c in cells.values():
        c["ratio_before_over_after"] = [b / a for b, a in zip(c["before_s"], c["after_s"])]
        c["median_ratio"] = statistics.median(c["ratio_before_over_after"])
    record = {"command": f"PYTHONPATH=src python benchmarks/speed/dual_cache_profile.py {' '.join(argv)}",
              "before": args.before, "threads": 1, "timer": "process CPU seconds of one generate call",
              "cpu_load_1min_at_start": os.getloadavg()[0], "shape": {k: getattr(args, k) for k in
              ("vocab", "width", "layers", "rows", "gen_length", "prompt_length")}, "cells": cells}
    if args.out:
        write_record(args.out, record)
    return record


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--before", help="git revision to time side by side with this checkout")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.worker:
        return worker(args)
    return side_by_side(args) if args.before else profile_run(args)


if __name__ == "__main__":
    main()
