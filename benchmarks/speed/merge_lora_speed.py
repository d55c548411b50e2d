"""Side by side, one process: a rollout through the peft LoRA model against one from the merged copy
(``rollout.merge_lora``, :mod:`maskrl.models.merged`), the copy's build included, alternated.

    python benchmarks/speed/merge_lora_speed.py                 # LLaDA layout, width 1024, 4 blocks, vocab 8192
    python benchmarks/speed/merge_lora_speed.py --width 4096 --layers 1 --vocab 126464 --repeats 2

A random LLaDA-shaped bidirectional Llama (hidden ``--width``, heads width/128, MLP 3x, ``--layers``
blocks, ``--vocab``) in float32 with all-linear LoRA (rank 128, alpha 64, B random so the update is
non-zero); fixed schedule, L ``--gen-length`` in blocks of 32, one step per token, τ 0.9, batch
``--batch``, ``--threads`` CPU threads. Prints one JSON line: the median seconds of each, their ratio,
and whether the completions were equal.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from maskrl.models import ModelAdapter, apply_lora
from maskrl.models.merged import sampling_policy
from maskrl.sampling import SamplerConfig, generate


def random_llada(width: int, layers: int, vocab: int) -> ModelAdapter:
    """A random LLaDA-layout model (bidirectional Llama, hidden ``width``, heads width/128, MLP 3x,
    ``layers`` blocks, ``vocab`` ids, [M] = vocab - 1) in float32, seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=3 * width, num_hidden_layers=layers,
                      num_attention_heads=max(1, width // 128), num_key_value_heads=max(1, width // 128),
                      max_position_embeddings=1024, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
    return ModelAdapter(model=model, mask_id=vocab - 1, eos_id=vocab - 2, pad_id=vocab - 2, family="llada")


def build(width: int, layers: int, vocab: int) -> ModelAdapter:
    """:func:`random_llada` with float32 LoRA (rank 128) whose B is random (seeded)."""
    policy = apply_lora(random_llada(width, layers, vocab), rank=128, alpha=64.0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.01 * torch.randn(p.shape, generator=g))
    policy.model.eval()
    return policy


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    policy = build(args.width, args.layers, args.vocab)
    cfg = SamplerConfig(gen_length=args.gen_length, block_length=32, steps=args.gen_length, temperature=0.9)
    ids = torch.randint(10, args.vocab - 10, (args.batch, args.prompt_length), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids, dtype=torch.bool)
    times: dict[str, list[float]] = {"peft": [], "merged": []}
    outs = {}
    with torch.no_grad():
        for _ in range(args.repeats):
            for name, merge in (("peft", False), ("merged", True)):
                t0 = time.perf_counter()
                with sampling_policy(policy, merge) as sp:  # the merged copy's build is timed too
                    ro = generate(sp, ids, mask, cfg, generator=torch.Generator().manual_seed(3))
                times[name].append(time.perf_counter() - t0)
                outs[name] = ro.completion_ids
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"width": args.width, "layers": args.layers, "vocab": args.vocab, "gen_length": args.gen_length,
           "batch": args.batch, "threads": args.threads, "repeats": args.repeats, "seconds": times,
           "median_peft_s": med["peft"], "median_merged_s": med["merged"], "peft_over_merged": med["peft"] / med["merged"],
           "completions_equal": bool(torch.equal(outs["peft"], outs["merged"]))}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
