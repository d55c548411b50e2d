"""Fast-dLLM v2 against its own code (``benchmarks/references/fast_dllm_v2_reference.py``; docs/models.md and
docs/sampler.md, "Fast-dLLM v2").

``tests/data/fast_dllm_v2_tiny`` is a tiny checkpoint in Fast-dLLM v2's layout with the logits of its own
``Fast_dLLM_QwenForCausalLM``; ``tests/golden/fast_dllm_v2_reference.json`` holds what its own ``generate``
(and, for the stop settings, NVlabs' ``batch_sample``) decoded from it at temperature 0 (source and commit in
the record). maskrl loads the folder into transformers' Qwen2 and must give the same logits (within 64
float32 steps of the largest logit) and, with Fast-dLLM v2's rule (``schedule: threshold``,
``block_first: forced``, ``sub_block_length``), the same tokens on every row whose decisions are clear of
float noise on the machine running the test (:class:`V2Margins`); more than half the rows must qualify.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from maskrl.models import load
from maskrl.sampling import SamplerConfig, generate

DATA = Path(__file__).resolve().parent / "data" / "fast_dllm_v2_tiny"
RECORD = json.loads((Path(__file__).resolve().parent / "golden" / "fast_dllm_v2_reference.json").read_text())
EPS = torch.finfo(torch.float32).eps
GEN_LENGTH = 40


def _noise(scale: float) -> float:
    """64 float32 steps of the largest logit magnitude (a probability moves by at most twice its logits' error)."""
    return 64 * EPS * scale


@pytest.fixture(scope="module")
def adapter():
    return load(DATA, tokenizer=False)


@pytest.mark.numerics
def test_logits_equal_fast_dllm_v2s_own_forward(adapter):
    ref = load_file(DATA / "reference.safetensors")
    ids, raw = ref["input_ids"], ref["logits"]  # raw: their logits[i] predicts token i + 1
    assert type(adapter.model).__name__ == "Qwen2ForCausalLM"
    assert (adapter.family, adapter.block_size, adapter.shift, adapter.mask_id, adapter.eos_id) == \
        ("fast_dllm_v2", 8, True, 95, 94)
    with torch.no_grad():
        out = adapter.logits(ids)  # position-aligned: column i from the hidden state at i - 1, column 0 its own
    tol = _noise(float(raw.abs().max()))
    assert (out[:, 1:] - raw[:, :-1]).abs().max() <= tol
    assert (out[:, 0] - raw[:, 0]).abs().max() <= tol
    adapter.block_size = 4  # the block size matters: the comparison can fail
    try:
        with torch.no_grad():
            assert (adapter.logits(ids)[:, 1:] - raw[:, :-1]).abs().max() > 1000 * tol
    finally:
        adapter.block_size = 8


def replay(adapter, prompt: list[int], tokens: torch.Tensor, commit_step: torch.Tensor, sub: int, b: int = 8):
    """Replay one decoded row step by step from full forwards of its states (a recomputation, not the
    sampler's): for each step, ``(taken [L] bool, cand_z [L, V] logits without [M], conf [L], open [L] bool,
    forced)`` -- the positions committed, the candidate logits, the confidences of Fast-dLLM v2's rule
    (the argmax candidate's probability under the softmax of every id, ``[M]`` kept, as theirs), the open
    sub-block (the current block's first sub-block still holding a mask) and whether the step is the
    block's forced first position."""
    p, length = len(prompt), tokens.numel()
    pos = p + torch.arange(length)
    for s in commit_step.unique().tolist():
        state = torch.where(commit_step < s, tokens, adapter.mask_id)
        with torch.no_grad():
            z = adapter.logits(torch.tensor([prompt + state.tolist()]))[0, p:].float()  # [L, V] position-aligned
        cand_z = z.clone()
        cand_z[:, adapter.mask_id] = float("-inf")
        conf = torch.softmax(z, -1).gather(-1, cand_z.argmax(-1, keepdim=True)).squeeze(-1)
        taken = commit_step == s
        block = pos // b == pos[taken][0] // b
        masked = (state == adapter.mask_id) & block
        forced = bool(int(taken.sum()) == 1 and (pos[taken] % b == 0).all() and int(masked.sum()) == int(block.sum()))
        part = (pos % b) // sub
        yield taken, cand_z, conf, masked & (part == part[masked].min()), forced


def replay_margin(adapter, prompt: list[int], tokens: torch.Tensor, commit_step: torch.Tensor, threshold: float,
                  sub: int, span: int) -> float:
    """The smallest decision margin of one decoded row under Fast-dLLM v2's rule (:func:`replay`) over its
    first ``span`` positions: the gap between the top two candidate logits at each committed position and,
    in the open sub-block (but at a block's forced first position), the gap between the most and second
    most confident mask and, for ``threshold < 1``, each mask's distance to the threshold."""
    low = 9.0
    for taken, cand_z, conf, open_, forced in replay(adapter, prompt, tokens, commit_step, sub):
        if not taken[:span].any():
            continue
        top2 = cand_z[:span].topk(2, -1).values
        low = min(low, float((top2[:, 0] - top2[:, 1])[taken[:span]].min()))
        if forced:
            continue  # the argmax alone
        c = conf[open_].sort(descending=True).values
        if len(c) > 1:
            low = min(low, float(c[0] - c[1]))
        if threshold < 1:
            low = min(low, float((c - threshold).abs().min()))
    return low


def v2_config(name: str, cache: str) -> SamplerConfig:
    s = RECORD["settings"][name]
    return SamplerConfig(gen_length=GEN_LENGTH, block_length=8, steps=GEN_LENGTH, schedule="threshold",
                         remasking="low_confidence", threshold=s["threshold"], block_first="forced",
                         sub_block_length=s["small_block_size"], cache=cache, early_stop=s["stop"])


def decode(adapter, cfg: SamplerConfig, rows: list[list[int]]):
    """maskrl on ``rows`` as one left-padded batch: the :class:`~maskrl.types.Rollout`."""
    width = max(map(len, rows))
    ids = torch.tensor([[adapter.pad_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    return generate(adapter, ids, mask, cfg)


def _cut(want: list[int], prompt_length: int, eos: int, whole_block: bool = False) -> int:
    """The positions compared: left of maskrl's last block (cut at L), and up to their first stop (or, with
    ``whole_block``, to the end of the stop's block: the positions whose decisions shaped the compared ones)."""
    cut = GEN_LENGTH - (prompt_length + GEN_LENGTH) % 8
    if eos not in want[:cut]:
        return cut
    end = want.index(eos) + 1
    return min(cut, -(-(prompt_length + end) // 8) * 8 - prompt_length) if whole_block else end


def same_as_theirs(want: list[int], got: torch.Tensor, valid: torch.Tensor, prompt_length: int, eos: int) -> bool:
    """Their tokens left of maskrl's last block; where theirs ended at a stop, maskrl's completion ends there
    too (``completion_mask``)."""
    end = _cut(want, prompt_length, eos)
    return got[:end].tolist() == want[:end] and (eos not in want[:end] or not bool(valid[end:].any()))


def _clear_rows(adapter, name: str, cache: str, key: str = "generate"):
    """maskrl's rollout of all prompts under setting ``name`` and the rows whose decisions lie beyond float
    noise (:func:`replay_margin`)."""
    s, rows = RECORD["settings"][name], RECORD["prompts"]
    ro = decode(adapter, v2_config(name, cache), rows)
    clear = []
    for r, prompt in enumerate(rows):
        with torch.no_grad():
            scale = float(adapter.logits(torch.tensor([prompt + ro.completion_ids[r].tolist()])).abs().max())
        span = _cut(s[key][r], len(prompt), adapter.eos_id, whole_block=True)
        if replay_margin(adapter, prompt, ro.completion_ids[r], ro.commit_step[r], s["threshold"],
                         s["small_block_size"], span) > _noise(scale):
            clear.append(r)
    return clear, ro.completion_ids, ro.completion_mask


@pytest.mark.numerics
@pytest.mark.parametrize("cache", ["none", "block"])
@pytest.mark.parametrize("name", sorted(RECORD["settings"]))
def test_maskrl_decodes_what_fast_dllm_v2s_generate_decoded(adapter, name, cache):
    """A batch of all 8 prompts (left-padded) against their ``generate`` (one prompt a call)."""
    s = RECORD["settings"][name]
    clear, ids, valid = _clear_rows(adapter, name, cache)
    assert 2 * len(clear) > len(RECORD["prompts"]), f"only {clear} clear of float noise"
    for r in clear:
        prompt = RECORD["prompts"][r]
        assert same_as_theirs(s["generate"][r], ids[r], valid[r], len(prompt), adapter.eos_id), f"{name} row {r}"
    if s["stop"]:
        assert any(adapter.eos_id in s["generate"][r] for r in clear), "no row that stopped was compared"


@pytest.mark.numerics
@pytest.mark.parametrize("name", [n for n, s in RECORD["settings"].items() if s["stop"]])
def test_maskrl_decodes_what_batch_sample_decoded(adapter, name):
    """NVlabs' ``batch_sample`` on the right-padded batch (its ``eval.py``'s call). Its rows equal its
    ``generate``'s but the row whose prompt (16 tokens, longer than the shortest) ends at a block
    boundary: ``batch_sample`` writes the autoregressive first token only for the rows whose prompt ends
    in the block just completed, so that row's first completion position stays a ``[MASK]`` of the padding
    and is decoded inside the next block, from that column's own output (its shift gives a block's first
    position its own logits), not the argmax of the previous position that its ``generate`` (and maskrl)
    use; that row is left out."""
    s = RECORD["settings"][name]
    clear, ids, valid = _clear_rows(adapter, name, "block", "batch_sample")
    lengths = [len(r) for r in RECORD["prompts"]]
    odd = [r for r, n in enumerate(lengths) if n % 8 == 0 and n > min(lengths)]
    assert odd == [5]
    checked = 0
    for r in clear:
        if r in odd:
            continue
        assert same_as_theirs(s["batch_sample"][r], ids[r], valid[r], lengths[r], adapter.eos_id), f"{name} row {r}"
        checked += 1
    assert 2 * checked > len(lengths) - len(odd)


@pytest.mark.numerics
def test_the_comparison_can_fail(adapter):
    """The same prompts with the sub-blocks off (the whole block open at every step) decode other tokens."""
    s, rows = RECORD["settings"]["t0.5_sub2"], RECORD["prompts"]
    cfg = SamplerConfig(gen_length=GEN_LENGTH, block_length=8, steps=GEN_LENGTH, schedule="threshold",
                        remasking="low_confidence", threshold=0.5, block_first="forced", cache="block")
    ro = decode(adapter, cfg, rows)
    differ = sum(not same_as_theirs(s["generate"][r], ro.completion_ids[r], ro.completion_mask[r], len(p),
                                    adapter.eos_id) for r, p in enumerate(rows))
    assert differ >= 2


def _sharpened(factor: float, row: int | None = None):
    """The tiny checkpoint with its output layer (or only the output row ``row``) times ``factor``."""
    a = load(DATA, tokenizer=False)
    with torch.no_grad():
        w = a.model.lm_head.weight
        (w if row is None else w[row]).mul_(factor)
    return a


@pytest.mark.numerics
def test_threshold_one_commits_one_position_a_step_where_confidences_round_to_one():
    """Fast-dLLM v2 commits ``x1_p > threshold`` (strictly): at threshold 1 only the sub-block's most
    confident mask, even where float32 confidences are exactly 1 (``>=`` would commit all of those)."""
    a = _sharpened(100.0)
    rows = RECORD["prompts"]
    ro = decode(a, v2_config("one_per_step", "block"), rows)
    assert (ro.commit_prob == 1.0).float().mean() > 0.5  # most confidences round to 1
    for r in range(len(rows)):
        steps = ro.commit_step[r]
        assert steps.unique().numel() == steps.numel()  # one position a step


@pytest.mark.numerics
def test_the_confidence_keeps_mask_in_the_softmax():
    """With the ``[MASK]`` output row raised (its probability up to tens of percent), every step of maskrl's
    rule, replayed from full forwards, commits the open sub-block's most confident mask and every mask whose
    confidence -- under the softmax of every id, ``[M]`` kept, as Fast-dLLM v2's ``sample_with_top_p`` --
    exceeds the threshold; confidences with ``[M]`` removed would have chosen otherwise at some steps."""
    a = _sharpened(3.0, row=95)
    rows, thr = RECORD["prompts"], 0.5
    ro = decode(a, SamplerConfig(gen_length=GEN_LENGTH, block_length=8, steps=GEN_LENGTH, schedule="threshold",
                                 remasking="low_confidence", threshold=thr, block_first="forced",
                                 sub_block_length=4, cache="block"), rows)
    checked = other = 0
    for r, prompt in enumerate(rows):
        for taken, cand_z, conf, open_, forced in replay(a, prompt, ro.completion_ids[r], ro.commit_step[r], 4):
            if forced:
                continue
            without = torch.softmax(cand_z, -1).max(-1).values
            chosen = [open_ & ((c > thr) | (c == c.masked_fill(~open_, -1).max())) for c in (conf, without)]
            near = (conf[open_] - thr).abs().min() < _noise(20.0)
            if near:
                continue
            assert torch.equal(taken, chosen[0]), f"row {r}"
            checked += 1
            other += not torch.equal(chosen[0], chosen[1])
    assert checked > 100 and other >= 1
