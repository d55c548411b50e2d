"""Noise only where a candidate is drawn (docs/sampler.md, "What is drawn where"): a step draws its
Gumbel noise and candidates at the still-masked positions of each row's current block, never at the
committed ones, and no path of the commit rule reads a candidate it did not draw.

The second claim is checked with :func:`conftest.keyed_gumbel_max`, whose noise at a position is
seeded by that position's own logits: under it, drawing the whole block (the sampler before,
``Denoising.draw_whole_block``) and drawing only the masks give the same rollout exactly when every
candidate read was drawn. Without the keying the two differ at τ > 0 (the generator's stream is
consumed differently), which the last test shows.
"""
from __future__ import annotations

import pytest
import torch

from maskrl.sampling import Denoising, SamplerConfig, generate
from maskrl.sampling.commit import gumbel_max
from maskrl.text import encode_prompts
from conftest import keyed_gumbel_max
from test_sampling_blocks import PROMPTS, _v2, block_model, shifted_block_model

FIELDS = ("completion_ids", "commit_step", "commit_prob", "num_steps", "completion_mask")

LLADA = [
    dict(gen_length=16, block_length=4, steps=8, temperature=0.9),
    dict(gen_length=16, block_length=8, steps=8, temperature=0.7, remasking="random"),
    dict(gen_length=16, block_length=4, steps=16, temperature=0.9, suppress_eos=True),
    dict(gen_length=16, block_length=4, schedule="threshold", threshold=0.3, temperature=0.9),
    dict(gen_length=16, block_length=8, schedule="threshold", threshold=0.3, temperature=0.9, suppress_eos=True),
    dict(gen_length=16, block_length=4, steps=8, temperature=0.9, cache="prefix"),
    dict(gen_length=16, block_length=4, schedule="threshold", threshold=0.3, temperature=0.9, cache="dual"),
    dict(gen_length=8, block_length=4, steps=4, temperature=0.9, cfg_scale=1.0),
]
BLOCK = [dict(remasking=r, cache=c) for r in ("sequential", "low_confidence_static", "low_confidence_dynamic",
                                              "entropy_bounded") for c in ("none", "block")]


def _sharp_tiny():
    from maskrl.models import build_tiny

    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    with torch.no_grad():
        a.model.get_output_embeddings().weight.mul_(20.0)  # several commits per threshold step
    return a


def _block_cfg(**over) -> SamplerConfig:
    return SamplerConfig(**{**dict(gen_length=16, block_length=4, steps=16, temperature=0.8, top_k=40, top_p=0.95,
                                   threshold=0.5), **over})


def _both(adapter, prompts, config, monkeypatch):
    """``(drawn at the masks only, drawn over the whole block)`` rollouts under the keyed noise."""
    monkeypatch.setattr("maskrl.sampling.commit.gumbel_max", keyed_gumbel_max)
    ids, mask = encode_prompts(adapter.tokenizer, prompts)
    out = []
    for whole in (False, True):
        monkeypatch.setattr(Denoising, "draw_whole_block", whole)
        out.append(generate(adapter, ids, mask, config, generator=torch.Generator().manual_seed(3)))
    return out


def _assert_same(a, b):
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f


@pytest.mark.parametrize("kw", LLADA, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()
                                                               if k not in ("gen_length", "temperature")))
def test_llada_rule_reads_no_candidate_it_did_not_draw(kw, monkeypatch):
    masks_only, whole = _both(_sharp_tiny(), PROMPTS[:4], SamplerConfig(**kw), monkeypatch)
    _assert_same(masks_only, whole)


@pytest.mark.parametrize("kw", BLOCK, ids=lambda kw: f"{kw['remasking']}-{kw['cache']}")
def test_block_strategies_read_no_candidate_they_did_not_draw(kw, monkeypatch):
    masks_only, whole = _both(block_model(), PROMPTS, _block_cfg(**kw), monkeypatch)
    _assert_same(masks_only, whole)


@pytest.mark.parametrize("first", ["forced", "ranked"])
def test_fast_dllm_v2_sub_blocks_read_no_candidate_they_did_not_draw(first, monkeypatch):
    """Sub-blocks: only the open sub-block's masks are drawn; ``forced``: nothing is drawn at a block's
    first step, whose one commit is the argmax."""
    masks_only, whole = _both(shifted_block_model(), PROMPTS, _v2(block_first=first, temperature=0.8), monkeypatch)
    _assert_same(masks_only, whole)


def _drawn_rows(adapter, config, monkeypatch):
    """``(rows drawn per gumbel_max call, rollout, prompt mask)``: the positions whose noise each step drew."""
    rows = []

    def counting(logits, temperature, generator):
        rows.append(logits.shape[:-1].numel())
        return gumbel_max(logits, temperature, generator)

    monkeypatch.setattr("maskrl.sampling.commit.gumbel_max", counting)
    ids, mask = encode_prompts(adapter.tokenizer, PROMPTS[:4])
    ro = generate(adapter, ids, mask, config, generator=torch.Generator().manual_seed(5))
    return rows, ro, mask


def _masks_in_block(ro, offset: torch.Tensor, b: int) -> list[int]:
    """Per step ``s``: the positions still masked before ``s`` in the block that ``s`` commits into,
    summed over the rows that took step ``s`` (slow: from ``commit_step`` alone)."""
    L = ro.commit_step.shape[1]
    block = (offset[:, None] + torch.arange(L)) // b  # [N, L]
    want = []
    for s in range(int(ro.num_steps.max())):
        total = 0
        for r in range(ro.commit_step.shape[0]):
            now = ro.commit_step[r] == s
            if now.any():
                blk = block[r][now][0]
                total += int(((block[r] == blk) & (ro.commit_step[r] >= s)).sum())
        want.append(total)
    return want


@pytest.mark.parametrize("kw", [dict(gen_length=16, block_length=4, steps=8, temperature=0.9),
                                dict(gen_length=16, block_length=4, schedule="threshold", threshold=0.3,
                                     temperature=0.9)], ids=["fixed", "threshold"])
def test_a_step_draws_noise_at_the_masks_of_its_block_only(kw, monkeypatch):
    """Every step draws one noise row per still-masked position of the rows' current blocks, not b."""
    rows, ro, _ = _drawn_rows(_sharp_tiny(), SamplerConfig(**kw), monkeypatch)
    want = _masks_in_block(ro, torch.zeros(ro.commit_step.shape[0], dtype=torch.long), kw["block_length"])
    assert rows == want
    assert sum(rows) < len(rows) * ro.commit_step.shape[0] * kw["block_length"]  # the whole block: more


def test_a_block_model_step_draws_noise_at_the_masks_of_its_block_only(monkeypatch):
    """The block rule, prompts not aligned to blocks (a row's first block is shared with its prompt)."""
    rows, ro, mask = _drawn_rows(block_model(), _block_cfg(remasking="low_confidence_dynamic"), monkeypatch)
    assert rows == _masks_in_block(ro, mask.long().sum(-1) % 4, 4)


def test_without_the_keyed_noise_the_two_draws_differ(monkeypatch):
    """The draw's stream changed (re-pinned golden digests): plain noise, masks only vs the whole block."""
    ids, mask = encode_prompts(_sharp_tiny().tokenizer, PROMPTS[:4])
    out = []
    for whole in (False, True):
        monkeypatch.setattr(Denoising, "draw_whole_block", whole)
        out.append(generate(_sharp_tiny(), ids, mask, SamplerConfig(**LLADA[0]), generator=torch.Generator().manual_seed(3)))
    assert not torch.equal(out[0].completion_ids, out[1].completion_ids)


def test_draw_speed_benchmark_smoke(tmp_path):
    """``benchmarks/speed/draw_speed.py`` at a toy shape: both draws run, the record is written, and the
    noise rows are the hand count (L 16 in blocks of 8, one token per step: 8 + 7 + ... + 1 = 36 per
    block against 8 · 8)."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "speed"))
    try:
        from conftest import benchmark_script

        mod = benchmark_script("speed/draw_speed.py")
        out = tmp_path / "draw.json"
        mod.main(["--vocabs", "300", "--width", "128", "--layers", "1", "--gen-length", "16", "--block-length", "8",
                  "--prompt-length", "8", "--repeats", "1", "--out", str(out)])
    finally:
        sys.path.pop(0)
    res = json.loads(out.read_text())["results"]["300"]
    assert res["noise_rows"] == {"masks_only": 2 * 36, "whole_block": 2 * 64}
    assert res["median_cpu_s"]["masks_only"] > 0 and res["median_cpu_s"]["whole_block"] > 0
    assert Denoising.draw_whole_block is False  # the switch is put back


@pytest.mark.parametrize("cache", ["none", "block"])
def test_editing_draws_the_committed_positions_it_may_edit(cache, monkeypatch):
    """LLaDA2.1's T2T reads the candidates of the block's committed completion tokens: under editing
    they are drawn too, so the masks-only draw equals the whole-block draw (a draw at the masks alone
    leaves those candidates empty and edits nothing)."""
    cfg = _block_cfg(remasking="low_confidence_dynamic", cache=cache, edit_threshold=0.05, max_post_steps=2)
    masks_only, whole = _both(block_model(), PROMPTS, cfg, monkeypatch)
    _assert_same(masks_only, whole)
