"""Side by side, one process: a rollout whose Gumbel noise is drawn only at the still-masked positions
of the block (the sampler) against one that draws it over the whole block, committed positions
included (the sampler before; ``Denoising.draw_whole_block``), alternated, at each vocabulary.

    PYTHONPATH=src python benchmarks/speed/draw_speed.py                  # vocab 8192 and 126464 (LLaDA's)
    PYTHONPATH=src python benchmarks/speed/draw_speed.py --vocabs 126464 --repeats 5 --out /tmp/x.json

A random LLaDA-layout bidirectional Llama (``merge_lora_speed.random_llada``: hidden ``--width``, heads
width/128, MLP 3x, ``--layers`` blocks) in float32; fixed schedule, L ``--gen-length`` in blocks of
``--block-length``, ``--tokens-per-step`` commits per step, τ 0.9, batch ``--batch``, prompt
``--prompt-length``, one CPU thread. Per vocabulary: the CPU seconds (``time.process_time``, less
moved by other processes than the wall clock, which is kept too) of each rollout, the medians, their
ratio whole / masks-only, and the noise rows each draws (position-steps). Writes the record with
:func:`maskrl.records.write_record` (``--out``) and prints it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from maskrl.machine import cpu_identity
from maskrl.records import write_record
from maskrl.sampling import Denoising, SamplerConfig, generate
from merge_lora_speed import random_llada

ROOT = Path(__file__).resolve().parents[2]
MODES = (("masks_only", False), ("whole_block", True))


def drawn_rows(commit_step: torch.Tensor, block_length: int) -> tuple[int, int]:
    """``(masks only, whole block)``: noise rows (position-steps) a fixed-schedule rollout drew, from its
    ``commit_step [N, L]``: a position is drawn from its block's first step up to its own commit; the
    whole-block draw covers b positions at each of the block's steps."""
    n, L = commit_step.shape
    blocks = commit_step.view(n, L // block_length, block_length)
    first, last = blocks.min(-1, keepdim=True).values, blocks.max(-1).values
    masks = int((blocks - first + 1).sum())
    whole = int(((last - first.squeeze(-1) + 1) * block_length).sum())
    return masks, whole


def run(adapter, config: SamplerConfig, ids: torch.Tensor, mask: torch.Tensor, repeats: int) -> dict:
    """The two draws alternated ``repeats`` times on one model: CPU / wall seconds and the medians."""
    cpu: dict[str, list[float]] = {m: [] for m, _ in MODES}
    wall: dict[str, list[float]] = {m: [] for m, _ in MODES}
    rows = {}
    with torch.no_grad():
        for rep in range(repeats):
            for name, whole in MODES:
                Denoising.draw_whole_block = whole
                try:
                    c0, w0 = time.process_time(), time.perf_counter()
                    ro = generate(adapter, ids, mask, config, generator=torch.Generator().manual_seed(3 + rep))
                    cpu[name].append(time.process_time() - c0)
                    wall[name].append(time.perf_counter() - w0)
                finally:
                    Denoising.draw_whole_block = False
                rows[name] = drawn_rows(ro.commit_step, config.block_length)[1 if whole else 0]
    med = {m: statistics.median(v) for m, v in cpu.items()}
    return {"cpu_s": cpu, "wall_s": wall, "median_cpu_s": med, "whole_over_masks_only": med["whole_block"] / med["masks_only"],
            "noise_rows": rows, "noise_rows_ratio": rows["whole_block"] / rows["masks_only"]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocabs", default="8192,126464")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--tokens-per-step", type=int, default=1)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "speed" / "draw_speed.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    config = SamplerConfig(gen_length=args.gen_length, block_length=args.block_length,
                           steps=args.gen_length // args.tokens_per_step, temperature=0.9)
    record = {"command": "PYTHONPATH=src python benchmarks/speed/draw_speed.py", "args": vars(args) | {"out": args.out.name},
              "torch": torch.__version__, "processor": cpu_identity(), "threads": 1, "results": {}}
    for vocab in (int(v) for v in args.vocabs.split(",")):
        adapter = random_llada(args.width, args.layers, vocab)
        ids = torch.randint(10, vocab - 10, (args.batch, args.prompt_length), generator=torch.Generator().manual_seed(2))
        res = run(adapter, config, ids, torch.ones_like(ids, dtype=torch.bool), args.repeats)
        record["results"][str(vocab)] = res
        print(vocab, json.dumps(res), flush=True)
        del adapter
    write_record(args.out, record)
    return record


if __name__ == "__main__":
    main()
