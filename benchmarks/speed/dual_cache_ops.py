"""Operator-level profile of the dual-cache rollout, maskrl beside Fast-dLLM's LLaDA code (batch 1): which
operators each runs, how many, and their self CPU time, grouped by what they do.

Same model, prompt and settings as ``benchmarks/speed/fast_dllm_llada.py`` (Fast-dLLM 24cc59e imported from
``--fast-dllm``, its random LLaDA-layout model at vocab ``--vocab``, L 128 in blocks of 32, prompt 64, greedy,
fixed schedule at two tokens a step and threshold 0.9). One thread; each code is warmed up, then ``--reps``
rollouts per schedule run under ``torch.profiler`` with ``record_shapes``, the two codes alternated; each group's
median over them is kept. Each operator's self time is put in one
group by its name and input shapes (``group_of``): the output layer (a matrix product with V columns), the
decoder's other matrix products, attention (SDPA and Fast-dLLM's compiled wrapper around it), rotary
embeddings (the 4-D ``[.., T, head_dim]`` element-wise operators), the key/value store writes (4-D scatters,
index puts and copies), RMSNorm, the
float64 / vocabulary-wide operators of the commit rule (softmax, argmax / max, copies over V), and the rest.
The profiler adds a per-operator overhead: compare the groups' shares, not their seconds with unprofiled runs.

    PYTHONPATH=src python benchmarks/speed/dual_cache_ops.py --fast-dllm /path/to/Fast-dLLM/llada \\
        --out benchmarks/speed/dual_cache_ops.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fast_dllm_llada import build_models, fast_dllm_call, import_fast_dllm, maskrl_call  # noqa: E402

GROUPS = ("output layer matmul", "decoder matmuls", "attention (SDPA)", "rotary", "KV store write", "RMSNorm",
          "commit rule over V", "other")


def group_of(name: str, shapes: list, vocab: int, head_dim: int) -> str:
    """The group of one operator (module docstring)."""
    flat = [s for s in shapes if isinstance(s, list)]
    has_v = any(s and s[-1] == vocab for s in flat)
    if name in ("aten::mm", "aten::addmm", "aten::bmm"):  # the kernels (aten::linear / matmul: wrappers, "other")
        return "output layer matmul" if has_v else "decoder matmuls"
    if "scaled_dot_product" in name or "Torch-Compiled" in name or "Dynamo" in name or "CompiledFxGraph" in name:
        return "attention (SDPA)"
    if name in ("aten::scatter_", "aten::index_put_", "aten::_index_put_impl_", "aten::copy_") and flat \
            and len(flat[0]) == 4:
        return "KV store write"
    if has_v:
        return "commit rule over V"
    if flat and len(flat[0]) == 4 and flat[0][-1] in (head_dim, head_dim // 2):
        return "rotary"
    if name in ("aten::pow", "aten::mean", "aten::rsqrt", "aten::div_", "aten::sum") and flat and len(flat[0]) == 3:
        return "RMSNorm"
    return "other"


def profile_one(fn) -> tuple[float, dict]:
    """``(process seconds, {group: {"ms": self ms, "calls": n}})`` of one profiled call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    from maskrl.plan.memory import quiet_profiler_log

    with quiet_profiler_log(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.process_time()
        fn()
        sec = time.process_time() - t0
    return sec, prof.key_averages(group_by_input_shape=True)


def table(averages, vocab: int, head_dim: int) -> dict:
    out = {g: {"ms": 0.0, "calls": 0} for g in GROUPS}
    for e in averages:
        g = group_of(e.key, e.input_shapes or [], vocab, head_dim)
        out[g]["ms"] += e.self_cpu_time_total / 1e3
        out[g]["calls"] += e.count
    return out


def median_profile(reps: list[tuple[float, dict]]) -> dict:
    """Per group, the median over repetitions of its ms and calls; the median profiled seconds."""
    groups = {g: {k: statistics.median(r[1][g][k] for r in reps) for k in ("ms", "calls")} for g in GROUPS}
    return {"profiled_s": statistics.median(r[0] for r in reps), "groups": groups}


def main(argv: list[str] | None = None) -> dict:
    from maskrl.machine import cpu_identity
    from maskrl.records import write_record

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast-dllm", type=Path, default=os.environ.get("MASKRL_FAST_DLLM_LLADA"))
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3, help="profiled rollouts per code and schedule (median kept)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.fast_dllm is None:
        ap.error("--fast-dllm (or $MASKRL_FAST_DLLM_LLADA) is required")
    torch.set_num_threads(1)
    shape = argparse.Namespace(vocab=args.vocab, width=256, layers=4, gen_length=128, block_length=32,
                               prompt_length=64, head_scale=8.0, batch=1)
    fd, LLaDAModelLM, LLaDAConfig = import_fast_dllm(Path(args.fast_dllm))
    record = {"command": "PYTHONPATH=src python benchmarks/speed/dual_cache_ops.py --fast-dllm <Fast-dLLM>/llada"
                         + (f" --vocab {args.vocab}" if args.vocab != 8192 else ""),
              "fast_dllm": "NVlabs/Fast-dLLM 24cc59e", "threads": 1, "processor": cpu_identity(),
              "torch": torch.__version__, "cpu_load_1min_at_start": os.getloadavg()[0], "shape": vars(shape),
              "unit": "self CPU ms per rollout under torch.profiler", "schedules": {}}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        ref, ad = build_models(shape, LLaDAModelLM, LLaDAConfig, Path(tmp))
        prompt = torch.randint(0, args.vocab - 3, (1, 64), generator=torch.Generator().manual_seed(1))
        for schedule in ("fixed", "threshold"):
            runs = {"fast_dllm": lambda: fast_dllm_call(fd, ref, prompt, "dual", schedule, shape),
                    "maskrl": lambda: maskrl_call(ad, prompt, "dual", schedule, shape)}
            for fn in runs.values():
                fn()  # warm-up
            got = {name: [] for name in runs}
            for rep in range(args.reps):  # alternated, which one first alternating too
                for name in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):
                    sec, averages = profile_one(runs[name])
                    got[name].append((sec, table(averages, args.vocab, 64)))
            cell = {name: median_profile(reps) for name, reps in got.items()}
            record["schedules"][schedule] = cell
            print(f"dual / {schedule}, batch 1, vocab {args.vocab}: self CPU ms per rollout (calls)")
            print(f"{'group':24s} {'Fast-dLLM':>18s} {'maskrl':>18s}")
            for g in GROUPS:
                f, m = cell["fast_dllm"]["groups"][g], cell["maskrl"]["groups"][g]
                print(f"{g:24s} {f['ms']:9.1f} ({f['calls']:5.0f}) {m['ms']:9.1f} ({m['calls']:5.0f})")
            print(f"{'profiled seconds':24s} {cell['fast_dllm']['profiled_s']:18.3f} {cell['maskrl']['profiled_s']:18.3f}",
                  flush=True)
    record["cpu_load_1min_at_end"] = os.getloadavg()[0]
    if args.out:
        write_record(args.out, record)
    return record


if __name__ == "__main__":
    main()
