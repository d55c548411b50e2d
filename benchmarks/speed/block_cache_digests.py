"""Digests (sha256, 16 hex digits) of every ``Rollout`` field under ``cache: block`` on the settings of the block
tests: the four strategies with and without early stop at temperature 0 and 1 (batch of 8 with left padding, and
one row), the papers' shapes (L 256 in blocks of 32, TraDo's block 4), Fast-dLLM v2's sub-blocks (shifted,
forced / ranked first position), LLaDA2's editing and plain decoding (tests/data/llada2_tiny), the sdar_tiny
and fast_dllm_v2_tiny checkpoints. Run it before and after a change of the block cache and compare the two
files: a change that keeps the outputs bit for bit gives the same file (on the same CPU).

    PYTHONPATH=src python benchmarks/speed/block_cache_digests.py /tmp/before.json   # then after; cmp
"""
import dataclasses
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import torch

from maskrl.models import load
from maskrl.sampling import SamplerConfig, generate
from maskrl.text import encode_prompts

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sdar_reference", ROOT / "benchmarks" / "references" / "sdar_generate_reference.py")
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)
PROMPTS = ["a", "ab", "abc", "abcd", "x + y = 3", "the cat sat on", "12 * 7", "hello world!"]


def dig(ro) -> dict:
    """Each field of a ``Rollout``: its tensor's sha256 (16 hex digits), else its repr."""
    out = {}
    for f in dataclasses.fields(ro):
        v = getattr(ro, f.name)
        if isinstance(v, torch.Tensor):
            out[f.name] = hashlib.sha256(v.detach().contiguous().numpy().tobytes()).hexdigest()[:16]
        elif v is not None:
            out[f.name] = repr(v)[:64]
    return out


def bm(bs=4, eos=0.0, scale=20.0, shift=False):
    """The tiny block model of the block tests (``tests/test_sampling_blocks.py``)."""
    a = ref.tiny_block_model(eos_bias=eos, scale=scale, block_size=bs)
    a.shift = shift
    return a


def cfg(rule, L=32, b=4, spb=4, **o):
    o.setdefault("eb_threshold", 2.0)
    return SamplerConfig(gen_length=L, block_length=b, steps=spb * L // b, remasking=rule, threshold=0.6, cache="block", **o)


def run(res: dict, name, a, c, prompts=PROMPTS, seed=None, ids_mask=None):
    ids, mask = ids_mask if ids_mask is not None else encode_prompts(a.tokenizer, prompts)
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    res[name] = dig(generate(a, ids, mask, c, generator=g))


def main(out: str) -> None:
    """Writes the digests of every setting to ``out`` (JSON)."""
    res = {}
    for rule in ["sequential", "low_confidence_static", "low_confidence_dynamic", "entropy_bounded"]:
        for es in (False, True):
            a = bm(eos=1.5 if es else 0.0)
            run(res, f"{rule}/es{es}", a, cfg(rule, early_stop=es))
            run(res, f"{rule}/es{es}/one", a, cfg(rule, early_stop=es), prompts=PROMPTS[5:6])
            run(res, f"{rule}/es{es}/t1", a, dataclasses.replace(cfg(rule, early_stop=es), temperature=1.0), seed=5)
    a = bm(eos=1.0)
    run(res, "trado_b4", a, dataclasses.replace(cfg("low_confidence_dynamic", L=128), threshold=0.9, early_stop=True), PROMPTS[:4])
    a = bm(32, eos=1.0)
    run(res, "b32_thr", a, SamplerConfig(gen_length=256, block_length=32, steps=256, schedule="threshold", threshold=0.9, early_stop=True, cache="block"), PROMPTS[:4])
    run(res, "b32_dyn", a, SamplerConfig(gen_length=256, block_length=32, steps=32, remasking="low_confidence_dynamic", threshold=0.9, early_stop=True, cache="block"), PROMPTS[:4])
    for es, first in [(False, "forced"), (True, "forced"), (False, "ranked"), (True, "ranked")]:
        a = bm(8, eos=1.5 if es else 0.0, shift=True)
        c = SamplerConfig(gen_length=32, block_length=8, steps=32, schedule="threshold", threshold=0.5, sub_block_length=4,
                          block_first=first, early_stop=es, cache="block")
        run(res, f"v2/{es}/{first}", a, c)
        run(res, f"v2/{es}/{first}/one", a, c, prompts=PROMPTS[6:7])
    # LLaDA2 tiny: plain and editing
    D = ROOT / "tests" / "data" / "llada2_tiny"
    for eos in (None, 7):
        a = load(D)
        a.block_size = 4
        if eos is not None:
            a.eos_id = eos
        width = 9
        P = [[5, 9, 11], [3, 4, 5, 6, 7, 8, 9], [12], [20, 21, 22, 23, 24]]
        ids = torch.tensor([[a.pad_id] * (width - len(p)) + p for p in P])
        mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in P])
        c = SamplerConfig(gen_length=12, block_length=4, steps=12, schedule="fixed", remasking="low_confidence_dynamic",
                          threshold=0.3, temperature=0.0, edit_threshold=0.2, max_post_steps=3, cache="block", early_stop=eos is not None)
        run(res, f"llada2/edit/{eos}", a, c, ids_mask=(ids, mask))
        run(res, f"llada2/edit/{eos}/t1", a, dataclasses.replace(c, temperature=1.0), ids_mask=(ids, mask), seed=3)
        run(res, f"llada2/plain/{eos}", a, dataclasses.replace(c, edit_threshold=None, gen_length=16, steps=16), ids_mask=(ids, mask))
    # SDAR tiny checkpoint
    a = load(ROOT / "tests" / "data" / "sdar_tiny")
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :3] = False
    mask[2, :1] = False
    for rule in ["low_confidence_static", "low_confidence_dynamic"]:
        run(res, f"sdar_tiny/{rule}", a, SamplerConfig(gen_length=16, block_length=a.block_size, steps=16, remasking=rule, threshold=0.5, cache="block"), ids_mask=(ids, mask))
    a = load(ROOT / "tests" / "data" / "fast_dllm_v2_tiny", tokenizer=False)
    ids = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :4] = False
    run(res, "fdllm_v2_tiny", a, SamplerConfig(gen_length=40, block_length=8, steps=40, schedule="threshold", remasking="low_confidence", threshold=0.5, block_first="forced", sub_block_length=4, cache="block"), ids_mask=(ids, mask))
    Path(out).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(len(res), "settings")


if __name__ == "__main__":
    main(sys.argv[1])
