"""Where a dual-cache rollout's time goes at a small vocabulary: torch.profiler's operator table of one
``generate`` with ``cache: none`` and one with ``cache: dual`` on the same random LLaDA-layout model.

    PYTHONPATH=src python benchmarks/speed/dual_cache_profile.py                 # vocab 8192, width 512, 4 blocks
    PYTHONPATH=src python benchmarks/speed/dual_cache_profile.py --vocab 126464 --rows 12

One thread; fixed schedule, L ``--gen-length`` in blocks of 32 at two tokens a step, τ 0.9, prompts of
``--prompt-length`` random ids. Prints each run's seconds and its ten most expensive operators (self
CPU time), then the share of the data-movement operators (``index``, ``gather``, ``cat``, ``copy_``:
the window forward's key/value copies) and of the Gumbel uniforms (``uniform_``).
"""
from __future__ import annotations

import argparse
import time

import torch

MOVES = ("aten::index", "aten::gather", "aten::cat", "aten::copy_")


def main(argv: list[str] | None = None) -> dict:
    from torch.profiler import ProfilerActivity, profile
    from transformers import LlamaConfig, LlamaForCausalLM

    from maskrl.models import ModelAdapter
    from maskrl.plan.memory import quiet_profiler_log
    from maskrl.sampling import SamplerConfig, generate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--prompt-length", type=int, default=64)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    v, w = args.vocab, args.width
    cfg = LlamaConfig(vocab_size=v, hidden_size=w, intermediate_size=3 * w, num_hidden_layers=args.layers,
                      num_attention_heads=w // 64, num_key_value_heads=w // 64, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
    ad = ModelAdapter(model=model, mask_id=v - 1, eos_id=v - 2, pad_id=v - 2, family="llada")
    ids = torch.randint(10, v - 10, (args.rows, args.prompt_length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    out = {}
    for cache in ("none", "dual"):
        sc = SamplerConfig(gen_length=args.gen_length, block_length=32, steps=args.gen_length // 2, temperature=0.9,
                           cache=cache)
        with torch.no_grad(), quiet_profiler_log():
            generate(ad, ids, mask, SamplerConfig(gen_length=32, block_length=32, steps=16, temperature=0.9, cache=cache),
                     generator=torch.Generator().manual_seed(0))  # warm-up
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                generate(ad, ids, mask, sc, generator=torch.Generator().manual_seed(0))
            sec = time.perf_counter() - t0
        ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
        total = sum(ops.values())
        out[cache] = {"seconds": sec, "moves_share": sum(ops.get(k, 0) for k in MOVES) / total,
                      "uniform_share": ops.get("aten::uniform_", 0) / total, "mm_share": ops.get("aten::mm", 0) / total}
        print(f"cache {cache}: {sec:.2f} s (profiled); data movement {out[cache]['moves_share']:.1%}, Gumbel "
              f"uniforms {out[cache]['uniform_share']:.1%}, matmuls {out[cache]['mm_share']:.1%}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    return out


if __name__ == "__main__":
    main()
