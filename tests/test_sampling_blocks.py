"""Block decoding of block-diffusion models in the one sampler (issue 48 item 2; docs/sampler.md,
"Block-diffusion models"): the strategies' pure rules against hand values and slow references, prompt
alignment, the exact block cache against the no-cache forward, batch against single rows, per-row
early stop, the papers' shapes, the refusals, and the credit modules on block rollouts."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from maskrl.sampling import (SamplerConfig, block_candidates, generate, select_block, select_dynamic,
                             select_entropy_bounded, select_sequential)
from maskrl.text import encode_prompts
from conftest import assert_batch_equals_single

PROMPTS = ["a", "ab", "abc", "abcd", "x + y = 3", "the cat sat on", "12 * 7", "hello world!"]


def block_model(block_size: int = 4, eos_bias: float = 0.0, scale: float = 20.0):
    """The tiny block model of ``benchmarks/references/sdar_generate_reference.py`` (sharpened attention, ``[MASK]`` logit -20)."""
    from conftest import benchmark_script

    mod = benchmark_script("references/sdar_generate_reference.py", "sdar_reference")
    return mod.tiny_block_model(eos_bias=eos_bias, scale=scale, block_size=block_size)


# ------------------------------------------------------------------ the pure rules
def test_sequential_takes_the_first_masks_left_to_right():
    eligible = torch.tensor([[False, True, True, True], [True, False, True, True]])
    got = select_sequential(eligible, torch.tensor([2, 1]))
    assert got.tolist() == [[False, True, True, False], [True, False, False, False]]


def test_dynamic_takes_every_confident_mask_when_enough_else_the_top_count():
    conf = torch.tensor([[0.95, 0.5, 0.92, 0.1], [0.95, 0.9, 0.3, 0.2]])
    eligible = torch.ones(2, 4, dtype=torch.bool)
    assert select_dynamic(conf, eligible, torch.tensor([1, 1]), 0.9).tolist() == [
        [True, False, True, False], [True, False, False, False]]  # 0.9 is not above 0.9 (SDAR's '>')
    assert select_dynamic(conf, eligible, torch.tensor([3, 2]), 0.9).tolist() == [
        [True, True, True, False], [True, True, False, False]]


@pytest.mark.parametrize("rule", ["sequential", "low_confidence_static", "low_confidence_dynamic"])
def test_a_count_above_the_masks_left_is_capped_and_never_takes_a_filled_position(rule):
    """SDAR's quirk: its top-k of a count above the masks left also picks filled positions; here never."""
    conf = torch.tensor([[0.99, 0.2, 0.3, 0.98]])
    eligible = torch.tensor([[False, True, True, False]])
    got = select_block(rule, eligible, torch.tensor([4]), conf, None, 0.9, 0.35)
    assert got.tolist() == [[False, True, True, False]]


def _eb_reference(h: list[float], gamma: float) -> set[int]:
    """Slow EB-sampler: the largest k whose k lowest entropies have sum - max <= gamma (k >= 1)."""
    order = sorted(range(len(h)), key=lambda i: (h[i], i))
    best = 1
    for k in range(1, len(h) + 1):
        pick = [h[i] for i in order[:k]]
        if sum(pick) - max(pick) <= gamma:
            best = k
    return set(order[:best])


def test_entropy_bounded_hand_values_and_slow_reference():
    h = torch.tensor([[1.0, 0.1, 0.3, 0.2]])
    got = select_entropy_bounded(h, torch.ones(1, 4, dtype=torch.bool), 0.35)
    assert got.tolist() == [[False, True, True, True]]  # 0.1 + 0.2 + 0.3 - 0.3 = 0.3 <= 0.35; + 1.0: 0.6
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        h = torch.rand(1, 6, generator=g) * 2
        eligible = torch.rand(1, 6, generator=g) < 0.7
        eligible[0, 0] = True
        gamma = float(torch.rand(1, generator=g)) * 1.5
        got = select_entropy_bounded(h, eligible, gamma)[0].nonzero().squeeze(-1).tolist()
        idx = eligible[0].nonzero().squeeze(-1).tolist()
        want = {idx[i] for i in _eb_reference([float(h[0, i]) for i in idx], gamma)}
        assert set(got) == want


@pytest.mark.numerics
def test_candidates_greedy_limit_and_filters():
    logits = torch.tensor([[[2.0, 1.0, 0.0, float("-inf")]]])
    cand, conf, prob, ent = block_candidates(logits.clone(), 0.0, None, 1.0, None, entropy=True)
    p = torch.softmax(logits, -1)[0, 0]
    assert cand.item() == 0 and abs(conf.item() - p[0].item()) <= 4 * torch.finfo(torch.float32).eps
    assert abs(ent.item() + float((p[:3] * p[:3].log()).sum())) <= 8 * torch.finfo(torch.float32).eps
    _, conf1, prob1, _ = block_candidates(logits.clone(), 0.0, 1, 1.0, None)
    assert conf1.item() == 1.0 and prob1.item() == prob.item()  # top-k 1: the filtered distribution is one id
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([block_candidates(logits.clone(), 1.0, None, 1.0, g)[0] for _ in range(400)]).flatten()
    assert 3 not in draws.tolist() and (draws == 0).float().mean().item() > 0.5


# ------------------------------------------------------------------ the sampler on block models
RULES = ["sequential", "low_confidence_static", "low_confidence_dynamic", "entropy_bounded", "low_confidence"]


def _cfg(rule: str, L: int = 32, b: int = 4, spb: int = 4, **over) -> SamplerConfig:
    over.setdefault("eb_threshold", 2.0)
    return SamplerConfig(gen_length=L, block_length=b, steps=spb * L // b, remasking=rule, threshold=0.6, **over)


def _same(r1, r2, prob_tol: float = 64 * torch.finfo(torch.float32).eps) -> None:
    assert torch.equal(r1.completion_ids, r2.completion_ids)
    assert torch.equal(r1.commit_step, r2.commit_step) and torch.equal(r1.num_steps, r2.num_steps)
    assert torch.equal(r1.completion_mask, r2.completion_mask)
    assert (r1.commit_prob - r2.commit_prob).abs().max() <= prob_tol


@pytest.mark.numerics
@pytest.mark.parametrize("rule, early_stop", [(r, False) for r in RULES] + [("low_confidence_dynamic", True)])
def test_block_cache_equals_the_no_cache_forward(rule, early_stop):
    a = block_model(eos_bias=1.5 if early_stop else 0.0)
    ids, mask = encode_prompts(a.tokenizer, PROMPTS)  # left-padded, every P mod 4
    ref = generate(a, ids, mask, _cfg(rule, early_stop=early_stop))
    got = generate(a, ids, mask, _cfg(rule, early_stop=early_stop, cache="block"))
    _same(ref, got)
    assert ref.num_steps.unique().numel() > 1 or rule in ("sequential", "low_confidence_static", "low_confidence")


def test_no_cache_path_is_block_causal_and_prompt_aligned():
    """The first decoding block is shared with the prompt's partial block; the sampler's first-step logits
    equal the model's block-causal logits of [prompt ; masks] (the reference forward)."""
    a = block_model()
    seen = []

    class Watch:
        def on_step(self, view):
            if view.step == 0:
                seen.append((view.covered.clone(), view.logits.clone()))

        def result(self):
            return {}

    ids, mask = encode_prompts(a.tokenizer, ["abc"])  # 4 tokens with bos? P mod 4 decides the first block
    P = ids.shape[1]
    generate(a, ids, mask, _cfg("low_confidence_static"), observers=[Watch()])
    covered, logits = seen[0]
    first = (4 - P % 4) % 4 or 4
    assert covered[0].nonzero().squeeze(-1).tolist() == list(range(first))
    x = torch.cat([ids, torch.full((1, 32), a.mask_id)], 1)
    with torch.no_grad():
        want = a.logits(x)[0, P:P + first]
    want[:, a.mask_id] = float("-inf")
    assert torch.allclose(logits, want, atol=64 * torch.finfo(torch.float32).eps * float(want[torch.isfinite(want)].abs().max()))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("cache", ["none", "block"])
def test_batch_equals_single_rows_with_left_padding(rule, cache):
    a = block_model(eos_bias=1.5)
    assert_batch_equals_single(a, PROMPTS, _cfg(rule, cache=cache, early_stop=True))


@pytest.mark.numerics
def test_early_stop_rows_drop_out_and_pad_after_their_stop():
    a = block_model(eos_bias=1.5)
    ids, mask = encode_prompts(a.tokenizer, PROMPTS)
    calls = []
    hook = a.model.get_decoder().register_forward_hook(lambda m, args, kw, out: calls.append(kw["input_ids"].shape[0]),
                                                      with_kwargs=True)
    try:
        full = generate(a, ids, mask, _cfg("low_confidence_dynamic", cache="block"))
        n_full, calls[:] = sum(calls), []
        stop = generate(a, ids, mask, _cfg("low_confidence_dynamic", cache="block", early_stop=True))
        n_stop = sum(calls)
    finally:
        hook.remove()
    ended = ~full.completion_mask.all(-1)
    assert ended.sum() >= 2 and (~ended).any()  # some rows stop, some run to L
    assert torch.equal(stop.completion_mask, full.completion_mask)
    assert torch.equal(stop.completion_ids[stop.completion_mask], full.completion_ids[full.completion_mask])
    differ = stop.completion_ids != full.completion_ids  # the positions a stopped row never decoded
    assert differ.any() and not (differ & stop.completion_mask).any()
    assert (stop.completion_ids[differ] == a.pad_id).all() and (stop.commit_prob[differ] == 1.0).all()
    assert torch.equal(stop.commit_step[differ], (stop.num_steps[:, None] - 1).expand_as(differ)[differ])
    assert (stop.num_steps[ended] < full.num_steps[ended]).all() and torch.equal(stop.num_steps[~ended], full.num_steps[~ended])
    assert n_stop < n_full  # stopped rows leave the forwards (rows summed over every decoder forward)
    assert (stop.commit_step >= 0).all() and (stop.commit_step < stop.num_steps[:, None]).all()


@pytest.mark.numerics
@pytest.mark.parametrize("shape", ["b32_threshold", "b32_dynamic", "trado_b4"])
def test_the_papers_shapes(shape):
    """L 256 in blocks of 32 (Fast-dLLM's threshold 0.9 and SDAR's dynamic 0.9, 4 steps a block), with stop
    tails; TraDo's recipe (block 4, 4 steps a block, dynamic at 0.9): cache equals no cache, batch equals
    single rows."""
    if shape == "trado_b4":
        a, cfg = block_model(eos_bias=1.0), _cfg("low_confidence_dynamic", L=128, b=4, spb=4)
    else:
        a = block_model(block_size=32, eos_bias=1.0)
        rule = {"schedule": "threshold"} if shape == "b32_threshold" else {"remasking": "low_confidence_dynamic"}
        cfg = SamplerConfig(gen_length=256, block_length=32, steps=256 if shape == "b32_threshold" else 32, **rule)
    cfg = dataclasses.replace(cfg, threshold=0.9, early_stop=True)
    prompts = PROMPTS[:4]
    ids, mask = encode_prompts(a.tokenizer, prompts)
    ref = generate(a, ids, mask, cfg)
    got = generate(a, ids, mask, dataclasses.replace(cfg, cache="block"))
    _same(ref, got)
    assert_batch_equals_single(a, prompts, dataclasses.replace(cfg, cache="block"), batch=got)
    assert (~got.completion_mask.all(-1)).any() and got.completion_mask.all(-1).any()  # stop tails and full rows


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("over, match", [
    ({"cache": "prefix"}, "exact block cache"), ({"cache": "dual"}, "exact block cache"),
    ({"block_length": 8, "gen_length": 32, "steps": 32}, "model's block size"),
    ({"schedule": "dream", "remasking": "entropy"}, "not defined on block-diffusion"),
])
def test_block_models_refuse_what_they_do_not_have(over, match):
    a = block_model()
    ids, mask = encode_prompts(a.tokenizer, ["ab"])
    with pytest.raises(ValueError, match=match):
        generate(a, ids, mask, dataclasses.replace(_cfg("low_confidence_static"), **{"remasking": "low_confidence", **over}))


@pytest.mark.parametrize("over", [{"cache": "block"}, {"early_stop": True}])
def test_full_attention_models_refuse_the_block_cache_and_early_stop(tiny, over):
    ids, mask = encode_prompts(tiny.tokenizer, ["ab"])
    with pytest.raises(ValueError, match="needs a block-diffusion model"):
        generate(tiny, ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=8, **over))


@pytest.mark.parametrize("over, match", [
    ({"schedule": "threshold"}, "needs schedule 'fixed'"), ({"suppress_eos": True}, "takes none of"),
    ({"alg_temp": 0.5}, "takes none of"), ({"eb_threshold": 0.0}, "eb_threshold"),
])
def test_config_refuses_bad_block_rule_settings(over, match):
    with pytest.raises(ValueError, match=match):
        SamplerConfig(gen_length=8, block_length=4, steps=8, remasking="low_confidence_dynamic", **over)


# ------------------------------------------------------------------ credit modules on block rollouts
@pytest.mark.parametrize("credit, objective, cache", list(itertools.product(
    ["dps", "dtca", "dispo"], ["diffu_grpo"], ["none", "block"])) + [("dtca", "rldf", "block")])
def test_credit_modules_train_on_block_rollouts(tmp_path, credit, objective, cache):
    """One RL step of the trainer on the tiny block model (rollouts from the same generate()), with each
    credit module reading its observers' statistics."""
    from maskrl.models import build_tiny
    from maskrl.trainer import RLTrainer
    from maskrl.tasks.base import Example
    from conftest import OddChars, small_cfg

    over = {"rollout.remasking": "low_confidence_dynamic", "rollout.cache": cache, "rollout.early_stop": "true",
            "rollout.threshold": 0.5, "rollout.gen_length": 12, "rollout.steps": 12,
            "credit": f"[{{name: {credit}}}]", "objective.name": objective}
    if credit == "dtca":
        over.update({"credit": "[{name: dtca, calibration: false, pos_credit: false}]", "likelihood": "state"})
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0, block_size=4)
    tr = RLTrainer(small_cfg(tmp_path, **over), a, OddChars(), [Example(id=i, prompt=f"say {i}") for i in range(4)])
    hist = tr.train(steps=1, progress=False)
    tr.close()
    assert any(k.startswith(f"credit/{credit}/") for k in hist[0]), sorted(hist[0])
    assert len(hist) == 1 and all(torch.isfinite(torch.tensor(v)) for v in hist[0].values() if isinstance(v, float))


def test_maskrl_generate_decodes_a_saved_block_model_with_the_block_cache(tmp_path, capsys):
    import json

    from maskrl.cli import main
    from maskrl.models import build_tiny, save_model

    save_model(build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, block_size=4), tmp_path / "m")
    args = ["generate", "--model", str(tmp_path / "m"), "--prompt", "abc", "--prompt", "hello", "--gen-length", "8",
            "--block-length", "4", "--steps", "8", "--remasking", "low_confidence_dynamic", "--no-chat-template"]
    assert main(args + ["--cache", "block", "--early-stop"]) == 0
    cached = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(args) == 0
    plain = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in cached] == ["abc", "hello"]
    # early stop pads after the stop id; the text up to it is the same
    assert all(a["completion"] == b["completion"][:len(a["completion"])] for a, b in zip(cached, plain))


# ------------------------------------------------------------------ Fast-dLLM v2's rule (shifted block models)
def test_open_sub_block_is_the_first_sub_block_holding_a_mask():
    from maskrl.sampling.commit import open_sub_block

    eligible = torch.tensor([[False, False, True, True, True, False, True, True],
                             [False, False, False, True, True, True, False, False]])
    # row 1's window starts 2 positions into its block; its last two positions are the next block's
    position = torch.arange(8).expand(2, 8) + torch.tensor([[0], [2]])
    got = open_sub_block(position, eligible, 8, 4)
    assert got[0].tolist() == [True] * 4 + [False] * 4
    assert got[1].tolist() == [False, False, True, True, True, True, False, False]  # offsets 4..7 of its block


def _v2(L: int = 32, b: int = 8, **over) -> SamplerConfig:
    over.setdefault("block_first", "forced")
    return SamplerConfig(gen_length=L, block_length=b, steps=L, schedule="threshold", threshold=0.5,
                         sub_block_length=b // 2, **over)


def shifted_block_model(eos_bias: float = 0.0):
    a = block_model(block_size=8, eos_bias=eos_bias)
    a.shift = True  # Fast-dLLM v2's layout: the hidden state at i predicts the token at i + 1
    return a


@pytest.mark.numerics
@pytest.mark.parametrize("early_stop, first", [(False, "forced"), (True, "forced"), (False, "ranked")])
def test_v2_block_cache_equals_no_cache_and_batch_equals_single(early_stop, first):
    """``ranked``: a shifted block model's first block position ranked with the others, from the column left
    of the block (which the cached windows must hold)."""
    a = shifted_block_model(eos_bias=1.5 if early_stop else 0.0)
    ids, mask = encode_prompts(a.tokenizer, PROMPTS)
    ref = generate(a, ids, mask, _v2(early_stop=early_stop, block_first=first))
    got = generate(a, ids, mask, _v2(early_stop=early_stop, block_first=first, cache="block"))
    _same(ref, got)
    assert_batch_equals_single(a, PROMPTS, _v2(early_stop=early_stop, block_first=first, cache="block"), batch=got)


@pytest.mark.numerics
def test_v2_block_first_position_is_the_previous_blocks_argmax_and_sub_blocks_go_in_order():
    a = shifted_block_model()
    ids, mask = encode_prompts(a.tokenizer, PROMPTS)
    ro = generate(a, ids, mask, _v2(cache="block"))
    b, sub, checked = 8, 4, 0
    for r in range(len(PROMPTS)):
        p_r = int(mask[r].sum())
        x = torch.cat([ids[r:r + 1], ro.completion_ids[r:r + 1]], 1)
        for i in range(ro.gen_length):
            if (p_r + i) % b:
                continue  # not the first position of a block
            state = x.clone()
            state[0, ids.shape[1] + i:] = a.mask_id  # the block and everything after it still masked
            with torch.no_grad():
                z = a.logits(state, torch.cat([mask[r:r + 1], torch.ones(1, ro.gen_length, dtype=torch.bool)], 1))
            z[0, :, a.mask_id] = float("-inf")
            assert int(z[0, ids.shape[1] + i].argmax()) == int(ro.completion_ids[r, i])
            alone = ro.commit_step[r] == ro.commit_step[r, i]
            assert int(alone.sum()) == 1  # committed alone, at a step of its own
            checked += 1
        block = (torch.arange(ro.gen_length) + p_r) // b
        part = ((torch.arange(ro.gen_length) + p_r) % b) // sub
        for k in block.unique():
            inb = block == k
            for s in range(b // sub - 1):
                lo, hi = inb & (part == s), inb & (part == s + 1)
                if lo.any() and hi.any():
                    assert ro.commit_step[r][lo].max() <= ro.commit_step[r][hi].min()
    assert checked >= len(PROMPTS) * 2


def test_v2_rule_is_refused_on_full_attention_models(tiny):
    ids, mask = encode_prompts(tiny.tokenizer, ["ab"])
    with pytest.raises(ValueError, match="Fast-dLLM v2's and needs a block-diffusion model"):
        generate(tiny, ids, mask, _v2(L=8, b=4))


def test_sub_block_length_must_divide_the_block():
    with pytest.raises(ValueError, match="sub_block_length"):
        SamplerConfig(gen_length=8, block_length=4, steps=8, sub_block_length=3)


@pytest.mark.numerics
@pytest.mark.parametrize("block, P, L", [(4, None, 16), (8, None, 16), (32, 8, 32), (32, 60, 64)])
def test_an_observer_asking_beyond_a_partial_first_block_gets_the_no_cache_logits(block, P, L):
    """Blocks are aligned from the prompt's first token, so a row whose prompt ends inside a block decodes
    a first block shorter than b, and its cached window holds that block only. An exact-logits observer
    (DiSPO's branching) asking for every masked position must then get the extra full forward: with the
    block cache, the logits it sees equal those without a cache (before the fix the plan took the first
    block as ``[start, start + b)`` and read past the window: IndexError)."""
    a = block_model(block_size=block)

    class AskAll:
        exact_logits = True

        def __init__(self):
            self.seen = []

        def logit_positions(self, step, rows, masked, block_start):
            return masked

        def on_step(self, view):
            want = view.masked & view.covered
            vidx = view.covered.flatten().long().cumsum(0).view(view.covered.shape) - 1
            self.seen.append((view.step, view.rows.clone(), want.clone(), view.logits[vidx[want]].detach().clone()))

        def result(self):
            return {}

    if P is None:
        ids, mask = encode_prompts(a.tokenizer, PROMPTS)
    else:  # two rows of exactly P tokens (one alignment, as a group of rollouts of one prompt)
        ids = torch.randint(5, 50, (2, P), generator=torch.Generator().manual_seed(P))
        mask = torch.ones_like(ids, dtype=torch.bool)
    assert any(int(m.sum()) % block for m in mask)  # a partial first block
    got = {}
    for cache in ("none", "block"):
        obs = AskAll()
        r = generate(a, ids, mask, _cfg("low_confidence_static", L=L, b=block, cache=cache), observers=[obs])
        got[cache] = (r, obs.seen)
    _same(got["none"][0], got["block"][0])
    assert len(got["none"][1]) == len(got["block"][1])
    for (s0, r0, w0, l0), (s1, r1, w1, l1) in zip(got["none"][1], got["block"][1]):
        assert s0 == s1 and torch.equal(r0, r1) and torch.equal(w0, w1)
        scale = max(1.0, float(l0[l0.isfinite()].abs().max())) if l0.numel() else 1.0
        torch.testing.assert_close(l1, l0, rtol=0, atol=64 * torch.finfo(torch.float32).eps * scale)
