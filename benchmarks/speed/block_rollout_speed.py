"""Rollout speed of the tiny block-diffusion model against the full-attention tiny model (issue 48 item 2,
"Numbers"; docs/sampler.md, "Block-diffusion models").

Both are ``build_tiny()`` at the default width (128 wide, 4 layers, the character vocabulary) with the same
seed, so the same weights: the block model only adds the block-causal mask (``block_size``). Both get the
same changes, so that greedy rows end at a stop id at various lengths (an untrained model's near-uniform
attention and ~0.05 logits give every position the same argmax): queries and keys x10, attention output
x4, output layer x20, eos logit + ``--eos-bias``. They decode the same ``L`` with the same rule (LLaDA's
``low_confidence``, greedy, ``--tokens-per-step`` per step) from the same left-padded prompts; greedy, so
``early_stop`` returns the same tokens (tests/test_sampling_blocks.py). Measured, on one CPU thread,
median of ``--repeats`` timed runs after one warm-up:

- full attention with Fast-dLLM's ``dual`` (approximate) cache, blocks of 32;
- the block model (blocks of 32 and of 4): ``cache: block`` (the exact cache), without and with
  ``early_stop: true``;
- with ``--with-none`` also ``cache: none`` for both (a full forward per step; slow).

``tok_per_s`` counts the ``N·L`` completion positions a rollout returns (pads after a stop included: the
trainer gets them all), ``valid_tok_per_s`` the positions up to and including each row's first stop,
``query_tokens`` the decoder forwards' query positions (the work).

    PYTHONPATH=src python benchmarks/speed/block_rollout_speed.py --out benchmarks/speed/block_rollout_speed.json

``--before REV``: the block cache's rollouts timed side by side under this checkout's code and under git
revision ``REV``'s (``git archive REV src``): two worker processes, one per code version, one thread each,
alternated cell by cell (which goes first alternates too), ``--repeats`` repetitions, process CPU seconds of
one ``generate``; every ``Rollout`` field of the two must be equal (a digest of each). Cells: blocks of 32
and of 4 at L ``--gen-length`` (without and with early stop) and at L 256 (the papers' shape):

    PYTHONPATH=src python benchmarks/speed/block_rollout_speed.py --before 65cdc2e --repeats 3 \\
        --out benchmarks/speed/block_cache_inplace.json
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["a", "ab", "abc", "abcd", "x + y = 3", "the cat sat on", "12 * 7", "hello world!"]


def model(block_size: int | None, eos_bias: float):
    from maskrl.models import build_tiny

    adapter = build_tiny(seed=0, block_size=block_size)
    adapter.model.eval()
    head = adapter.model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        for layer in adapter.model.model.layers:
            layer.self_attn.q_proj.weight.mul_(10.0)
            layer.self_attn.k_proj.weight.mul_(10.0)
            layer.self_attn.o_proj.weight.mul_(4.0)
        biased.weight.copy_(head.weight * 20.0)
        biased.bias.zero_()
        biased.bias[adapter.eos_id] = eos_bias
    adapter.model.lm_head = biased.eval()
    return adapter


def cases(L: int, per_step: int, with_none: bool) -> list[tuple[str, int | None, dict]]:
    """(name, model block size, SamplerConfig fields)."""
    out = [("full/b32/none", None, {"block_length": 32, "cache": "none"})] if with_none else []
    out.append(("full/b32/dual", None, {"block_length": 32, "cache": "dual"}))
    for b in (32, 4):
        out += [(f"block/b{b}/none", b, {"block_length": b, "cache": "none"})] if with_none else []
        out += [(f"block/b{b}/block", b, {"block_length": b, "cache": "block"}),
                (f"block/b{b}/block+early_stop", b, {"block_length": b, "cache": "block", "early_stop": True})]
    return [(n, bs, {**f, "gen_length": L, "steps": L // per_step}) for n, bs, f in out]


def run(adapter, cfg, ids, mask, repeats: int) -> dict:
    from maskrl.sampling import generate

    queries = []
    hook = adapter.model.get_decoder().register_forward_hook(
        lambda m, a, kw, out: queries.append(kw["input_ids"].numel()), with_kwargs=True)
    try:
        generate(adapter, ids, mask, cfg)  # warm-up
        times = []
        for _ in range(repeats):
            queries.clear()
            t0 = time.perf_counter()
            ro = generate(adapter, ids, mask, cfg)
            times.append(time.perf_counter() - t0)
    finally:
        hook.remove()
    t = statistics.median(times)
    return {"seconds": round(t, 4), "tok_per_s": round(ro.completion_ids.numel() / t, 1),
            "valid_tok_per_s": round(int(ro.completion_mask.sum()) / t, 1),
            "valid_tokens": int(ro.completion_mask.sum()), "row_lengths": ro.completion_mask.sum(-1).tolist(),
            "steps": int(ro.num_steps.max()),
            "query_tokens": sum(queries)}


def before_cells(L: int) -> list[tuple[str, int, dict]]:
    """(name, block size, SamplerConfig fields) of ``--before``: the block cache at L and at L 256."""
    out = []
    for length in dict.fromkeys((L, 256)):
        for b in (32, 4):
            out.append((f"L{length}/b{b}", b, {"gen_length": length, "block_length": b, "cache": "block"}))
            if length == L:
                out.append((f"L{length}/b{b}/early_stop", b, {"gen_length": length, "block_length": b,
                                                              "cache": "block", "early_stop": True}))
    return out


def worker(args) -> None:
    """Serve ``--before`` timing requests on stdin (one cell name a line) with the code on ``sys.path``."""
    from maskrl.sampling import SamplerConfig, generate
    from maskrl.text import encode_prompts

    models = {bs: model(bs, args.eos_bias) for bs in (32, 4)}
    ids, mask = encode_prompts(models[4].tokenizer, PROMPTS)
    cells = {n: (bs, SamplerConfig(**f, steps=f["gen_length"] // args.tokens_per_step))
             for n, bs, f in before_cells(args.gen_length)}
    with torch.no_grad():
        generate(models[4], ids, mask, SamplerConfig(gen_length=32, block_length=4, steps=16, cache="block"))
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            bs, cfg = cells[line.strip()]
            t0 = time.process_time()
            ro = generate(models[bs], ids, mask, cfg)
            sec = time.process_time() - t0
            digest = {f.name: hashlib.sha256(getattr(ro, f.name).detach().contiguous().numpy().tobytes()).hexdigest()
                      for f in dataclasses.fields(ro) if isinstance(getattr(ro, f.name), torch.Tensor)}
            print(json.dumps({"seconds": sec, "digest": digest}), flush=True)


def side_by_side(args, argv: list[str]) -> dict:
    """``--before REV``: this checkout vs ``REV``, alternated cell by cell (module docstring)."""
    from maskrl.records import write_record

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from before_after import ask, start, stop

    procs = start(__file__, args.before, argv)
    names = [n for n, _, _ in before_cells(args.gen_length)]
    cells = {n: {"before_s": [], "after_s": [], "rollouts_equal": True} for n in names}
    for rep in range(args.repeats):
        for i, key in enumerate(names):
            got = {name: ask(procs[name], key) for name in (("before", "after") if (rep + i) % 2 == 0 else ("after", "before"))}
            c = cells[key]
            c["before_s"].append(got["before"]["seconds"])
            c["after_s"].append(got["after"]["seconds"])
            c["rollouts_equal"] &= got["before"]["digest"] == got["after"]["digest"]
            print(f"rep {rep} {key}: before {c['before_s'][-1]:.2f} s, after {c['after_s'][-1]:.2f} s, "
                  f"equal {c['rollouts_equal']}", flush=True)
    stop(procs)
    for c in cells.values():
        c["ratio_before_over_after"] = [round(b / a, 3) for b, a in zip(c["before_s"], c["after_s"])]
        c["median_ratio"] = statistics.median(c["ratio_before_over_after"])
    record = {"command": f"PYTHONPATH=src python benchmarks/speed/block_rollout_speed.py {' '.join(argv)}",
              "before": args.before, "threads": 1, "timer": "process CPU seconds of one generate call",
              "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
              "cpu_load_1min_at_start": os.getloadavg()[0], "rows": len(PROMPTS),
              "tokens_per_step": args.tokens_per_step, "cells": cells}
    write_record(args.out, record)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--tokens-per-step", type=int, default=2)
    ap.add_argument("--eos-bias", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--with-none", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "speed" / "block_rollout_speed.json")
    ap.add_argument("--before", help="git revision whose block cache is timed side by side with this checkout's")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    raw = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(raw)
    torch.set_num_threads(1)
    if args.worker:
        worker(args)
        return 0
    if args.before:
        side_by_side(args, raw)
        return 0
    from maskrl.sampling import SamplerConfig
    from maskrl.text import encode_prompts

    models = {bs: model(bs, args.eos_bias) for bs in (None, 32, 4)}
    ids, mask = encode_prompts(models[None].tokenizer, PROMPTS)
    record = {"command": "PYTHONPATH=src python benchmarks/speed/block_rollout_speed.py", "args": vars(args) | {"out": args.out.name},
              "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "threads": 1,
              "rows": len(PROMPTS), "prompt_columns": ids.shape[1], "results": {}}
    for name, bs, fields in cases(args.gen_length, args.tokens_per_step, args.with_none):
        res = run(models[bs], SamplerConfig(**fields), ids, mask, args.repeats)
        record["results"][name] = res
        print(name, res, flush=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
