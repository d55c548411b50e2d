"""Dream's own decoding rule in the one sampler (``schedule: dream``, ``remasking: maskgit_plus |
topk_margin | entropy | origin``, ``top_k``, ``top_p``, ``alg_temp``, ``block_first: forced``,
``dream_dtype``): its pieces against hand-computed values and against the torch operations Dream's code
calls (so that a torch change that moves Dream's numbers is caught here), and the sampler's invariants.
Token-for-token equality with Dream's and Fast-dLLM's own code: ``tests/test_dream_reference.py``.
"""
import math

import pytest
import torch

from maskrl.sampling import SamplerConfig, generate
from maskrl.sampling.dream import (categorical_probs, demote_stops, dream_commit_counts, dream_confidence, dream_draw,
                                   dream_probs, dream_timesteps, filter_top_k, filter_top_p)
from maskrl.sampling.dream_step import DreamLayout, _exp_rows, dream_step, layout_alg_temp, layout_ranks
from maskrl.text import encode_prompts
from conftest import assert_batch_equals_single, tiny_dream

PROMPTS = ["abc", "hello world", "x", "countdown 1,2,3"]


@pytest.fixture(scope="module")
def dream():
    """A tiny Dream-style model (:func:`conftest.tiny_dream`), output layer x 8: confidences differ
    clearly between positions."""
    return tiny_dream(scale=8.0, max_positions=512)


# ---------------------------------------------------------------------------------------------------
# Dream's draws are torch's: the same numbers from the same generator state.

def test_candidate_draw_is_torchs_categorical():
    """Dream samples with ``Categorical(probs).sample()`` on the global generator; maskrl's draw from a
    generator seeded alike gives the same ids (and with ``never`` ids zeroed, the same ids wherever
    Dream's is not one of them)."""
    probs = torch.softmax(torch.randn(64, 97) * 3, -1)
    never = torch.zeros(97, dtype=torch.bool)
    torch.manual_seed(7)
    want = torch.distributions.Categorical(probs=probs).sample()
    got = dream_draw(probs, never, 0.7, torch.Generator().manual_seed(7))
    assert torch.equal(got, want)
    g = torch.Generator().manual_seed(7)
    assert torch.equal(torch.multinomial(probs, 1, True, generator=g).squeeze(-1), want)
    never[int(want[0])] = True
    got = dream_draw(probs, never, 0.7, torch.Generator().manual_seed(7))
    assert int(got[0]) != int(want[0]) and torch.equal(got[want != want[0]], want[want != want[0]])
    assert torch.equal(dream_draw(probs, never, 0.0, None), probs.masked_fill(never, 0).argmax(-1))


def test_rejected_probabilities_fall_back_to_greedy_without_a_draw():
    """Dream's ``except``: when torch's Categorical rejects bf16 probabilities (their normalised sum
    misses 1 by 1e-6 or more) the candidate is the greedy one and nothing is drawn."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        probs = torch.softmax(torch.randn(64, 100, generator=gen) * 4, -1).to(torch.bfloat16)
        if categorical_probs(probs) is None:
            break
    else:
        pytest.fail("no bf16 batch rejected in 200 tries")
    never = torch.zeros(100, dtype=torch.bool)
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    assert torch.equal(dream_draw(probs, never, 1.0, g), probs.max(-1).indices)
    assert torch.equal(g.get_state(), state)


def test_alg_temp_draw_is_torchs_multinomial_without_replacement():
    score = torch.randn(3, 8)
    score[:, 5:] = float("-inf")
    layout = DreamLayout(torch.full((3,), 8), torch.zeros(3, dtype=torch.long))
    k = torch.full((3,), 2)
    take = layout_alg_temp(score, k, layout, 0.5, torch.Generator().manual_seed(4))
    want = torch.multinomial(torch.softmax(score / 0.5, -1), 2, replacement=False,
                             generator=torch.Generator().manual_seed(4))
    assert torch.equal(take, torch.zeros_like(take).scatter(1, want, True))


def test_exp_rows_in_chunks_are_one_draw():
    """The first position's draw over ``f · (P + L)`` rows is made chunk by chunk: the same numbers,
    and the generator ends where one draw of the whole leaves it."""
    import maskrl.sampling.dream_step as ds

    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    whole = torch.empty(50, 7).exponential_(generator=g1)
    old, ds.EXP_CHUNK = ds.EXP_CHUNK, 20  # 2 rows of 7 per chunk
    try:
        rows = _exp_rows(50, 7, torch.tensor([3, 17, 49]), torch.float32, g2)
    finally:
        ds.EXP_CHUNK = old
    assert torch.equal(rows, whole[[3, 17, 49]])
    assert torch.equal(g1.get_state(), g2.get_state())


def test_ties_break_as_torch_topk_on_dreams_row():
    """Equal confidences: the positions taken are those ``torch.topk`` takes from Dream's row (the
    whole sequence, ``-inf`` off the masks), not the leftmost."""
    score = torch.tensor([[0.5, 1.0, 1.0, 0.2, 1.0, 1.0, 0.3, 1.0]])
    row = torch.full((1, 20), float("-inf"))
    row[0, 12:] = score
    want = torch.topk(row, 3).indices - 12
    rank = layout_ranks(score, torch.tensor([3]), DreamLayout(torch.tensor([20]), torch.tensor([12])))
    assert set((rank[0] < 3).nonzero().squeeze(-1).tolist()) == set(want[0].tolist())
    assert torch.equal(rank[0, want[0]], torch.arange(3))


# ---------------------------------------------------------------------------------------------------
# The pieces against hand-computed values.

def test_dream_schedule_counts_by_hand():
    ts = dream_timesteps(4)  # 1, 0.75025, 0.5005, 0.25075, 0.001
    assert torch.allclose(ts, torch.tensor([1.0, 0.75025, 0.5005, 0.25075, 0.001]))
    m = torch.tensor([16, 12, 8, 4])
    j = torch.tensor([0, 1, 2, 3])
    # 16·(1-0.75025)=3.996 -> 3; 12·(1-0.5005/0.75025)=3.995 -> 3; 8·(1-0.25075/0.5005)=3.992 -> 3; last: all
    assert dream_commit_counts(m, ts, j).tolist() == [3, 3, 3, 4]


def test_confidences_and_filters_by_hand():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]))
    probs = torch.softmax(logits, -1)
    cand = torch.tensor([[1]])
    assert torch.allclose(dream_confidence(probs, cand, "maskgit_plus"), torch.tensor([[0.3]]))
    assert torch.allclose(dream_confidence(probs, cand, "topk_margin"), torch.tensor([[0.2]]))
    ent = sum(q * math.log(q + 1e-10) for q in (0.5, 0.3, 0.15, 0.05))
    assert torch.allclose(dream_confidence(probs, cand, "entropy"), torch.tensor([[ent]]))
    low = torch.finfo(torch.float32).min
    assert filter_top_k(logits, 2)[0, 0, 2:].eq(low).all() and not filter_top_k(logits, 2)[0, 0, :2].eq(low).any()
    # cumulative 0.5, 0.8, 0.95: top_p 0.7 keeps 0.5 and 0.3 (the first past 0.7 is kept)
    kept = filter_top_p(logits, 0.7)[0, 0] != low
    assert kept.tolist() == [True, True, False, False]


def test_mask_logit_stays_in_the_confidence():
    """[M] is never a candidate, but its probability mass stays in Dream's softmax: position 0 has the
    sharper candidate distribution, yet a large [M] logit there makes position 1 the more confident."""
    mask_id = 3
    raw = torch.tensor([[4.0, 0.0, 0.0, 6.0], [2.0, 0.0, 0.0, -9.0]])  # [M = cover positions, V]
    logits = raw.clone()
    logits[:, mask_id] = float("-inf")
    never = torch.zeros(4, dtype=torch.bool)
    never[mask_id] = True
    cfg = SamplerConfig(gen_length=2, block_length=2, steps=2, schedule="fixed", remasking="maskgit_plus")
    at, eligible = torch.tensor([[0, 1]]), torch.ones(1, 2, dtype=torch.bool)
    layout = DreamLayout.of(cfg, 1, torch.tensor([0]))
    kw = dict(k=torch.tensor([1]), p_reveal=None, layout=layout, stop_fn=None, generator=None)
    take, cand = dream_step(cfg, logits, raw, at, eligible, never, **kw)
    # p(0 | pos 0) = e^4 / (e^4 + 2 + e^6) = 0.1177 < p(0 | pos 1) = e^2 / (e^2 + 2 + e^-9) = 0.787
    assert cand.tolist() == [[0, 0]] and take.tolist() == [[False, True]]
    probs = dream_probs(raw, 0.0, None, None, torch.float32)
    assert torch.allclose(probs[:, 0], torch.tensor([math.exp(4) / (math.exp(4) + 2 + math.exp(6)),
                                                     math.exp(2) / (math.exp(2) + 2 + math.exp(-9))]))
    take, _ = dream_step(cfg, logits, logits, at, eligible, never, **kw)  # [M] left out: position 0 first
    assert take.tolist() == [[True, False]]


def test_suppress_eos_ranks_stops_last_under_entropy():
    """Entropy confidences are negative: a stop candidate still ranks after every other one."""
    score = torch.tensor([[-0.1, -3.0, -9.0]])
    stop = torch.tensor([[True, False, False]])
    assert demote_stops(score, stop).argsort(dim=-1, descending=True).tolist() == [[1, 2, 0]]


@pytest.mark.parametrize("kw,field", [
    (dict(remasking="origin"), "schedule 'dream'"),
    (dict(remasking="entropy", schedule="threshold"), "schedule 'fixed' or 'dream'"),
    (dict(remasking="topk_margin", schedule="threshold"), "maskgit_plus"),
    (dict(schedule="threshold", top_k=50), "maskgit_plus"),
    (dict(schedule="threshold", remasking="maskgit_plus", alg_temp=0.5), "alg_temp"),
    (dict(schedule="fixed", remasking="entropy", block_first="forced"), "block_first 'forced'"),
    (dict(schedule="threshold", remasking="random", block_first="forced"), "maskgit_plus"),
    (dict(schedule="dream", block_first="forced", steps=2), "2 per block"),
    (dict(schedule="dream", block_first="forced", suppress_eos=True), "suppress_eos"),
    (dict(schedule="dream", block_first="first"), "block_first"),
    (dict(schedule="dream", dream_dtype="bf16"), "dream_dtype"),
    (dict(schedule="dream", top_k=1), "top_k"),
    (dict(schedule="dream", top_p=0.0), "top_p"),
    (dict(schedule="dream", alg_temp=-1.0), "alg_temp"),
    (dict(schedule="dream", remasking="origin", alg_temp=0.5), "alg_temp"),
    (dict(schedule="dream", steps=7), "steps"),
])
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplerConfig(gen_length=16, block_length=8, steps=kw.pop("steps", 8), **kw)


def test_defaults_keep_llada_rule():
    assert not SamplerConfig().dream_rule
    assert SamplerConfig(schedule="dream").dream_rule
    cfg = SamplerConfig(gen_length=16, block_length=8, schedule="threshold", remasking="maskgit_plus", top_k=50,
                        block_first="forced")
    assert cfg.dream_rule


def test_dream_rule_batch_equals_single_rows(dream):
    """Greedy: a row decodes the same alone or in a batch (its mask count is the batch's average)."""
    cfg = SamplerConfig(gen_length=16, block_length=16, steps=8, schedule="dream", remasking="topk_margin", top_k=50)
    assert_batch_equals_single(dream, PROMPTS, cfg)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("schedule", ["dream", "threshold"])
def test_forced_first_position_commits_alone_at_each_block_start(dream, cache, schedule):
    """``block_first: forced`` (Fast-dLLM's Dream block variant): each block's first step commits its
    first position and nothing else; Dream's schedule then runs its remaining T_b - 1 steps (the
    threshold: until the block is full); every position is committed once, blocks in order."""
    ids, mask = encode_prompts(dream.tokenizer, PROMPTS)
    kw = dict(gen_length=16, block_length=8, steps=8, cache=cache, block_first="forced", temperature=0.7, top_k=50)
    kw.update(schedule="dream", remasking="entropy") if schedule == "dream" else kw.update(
        schedule="threshold", remasking="maskgit_plus", threshold=0.5)
    ro = generate(dream, ids, mask, SamplerConfig(**kw), generator=torch.Generator().manual_seed(2))
    cs = ro.commit_step
    assert (cs >= 0).all()
    for r in range(len(PROMPTS)):
        for blk in range(2):
            steps = cs[r, 8 * blk:8 * blk + 8]
            first = int(steps[0])
            assert (steps[1:] > first).all(), (r, blk, steps)
            if blk:
                assert first > int(cs[r, :8].max())
    if schedule == "dream":
        assert torch.equal(cs[:, [0, 8]], torch.tensor([[0, 4]]).expand(len(PROMPTS), 2))
        assert int(ro.num_steps.max()) == 8


def test_forced_dual_window_keeps_the_sequence_order(dream):
    """Under ``block_first: forced`` the dual cache's window forward attends its keys in sequence order
    (the block's fresh keys in place of its cached ones, as Fast-dLLM's dual cache): the same attention
    as the cached-keys-first order, up to float rounding."""
    from maskrl.sampling.cache import window_hidden

    ids, mask = encode_prompts(dream.tokenizer, ["hello"])
    x = torch.cat([ids, torch.full((1, 24), dream.mask_id)], 1)
    x[0, ids.shape[1]:ids.shape[1] + 8] = torch.arange(20, 28)
    attn = torch.ones_like(x, dtype=torch.bool)
    pos = dream.position_ids(attn)
    with torch.no_grad():
        _, kv = dream.decoder_forward(x, attn, pos, return_kv=True)
        x[0, ids.shape[1] + 8:ids.shape[1] + 11] = torch.arange(30, 33)
        w0 = torch.tensor([ids.shape[1] + 8])
        a = window_hidden(dream, kv, x, attn, pos, torch.tensor([0]), w0, 8, in_order=True)
        b = window_hidden(dream, kv, x, attn, pos, torch.tensor([0]), w0, 8)
    assert torch.allclose(a, b, atol=1e-5) and a.shape == b.shape


@pytest.mark.parametrize("alg", ["entropy", "origin"])
def test_trainer_step_with_state_likelihood_on_dream_rollouts(tmp_path, dream, alg):
    """A Dream-style model sampled with Dream's rule: the state likelihood's rows are the rollout's commit
    states (one per row and commit step, later commits masked), and a full RL step runs to finite metrics."""
    import copy

    from conftest import OddChars
    from conftest import small_cfg
    from maskrl.tasks.base import Example
    from maskrl.trainer import RLTrainer

    cfg = small_cfg(tmp_path, **{"likelihood.name": "state", "rollout.schedule": "dream", "rollout.remasking": alg,
                                 "rollout.top_k": 50, "likelihood.p_mask_prompt": 0.0, "train.inner_iterations": 1})
    tr = RLTrainer(cfg, copy.deepcopy(dream), OddChars(), [Example(id=i, prompt=f"say a {i}") for i in range(6)])
    batch = tr.collect()
    ro = batch.rollout
    assert ro.sampler.schedule == "dream" and ro.sampler.remasking == alg
    assert (ro.commit_step >= 0).all() and ((ro.commit_prob > 0) & (ro.commit_prob <= 1)).all()
    seen = []
    real = tr.policy._raw_logits
    tr.policy._raw_logits = lambda ids, mask=None: (seen.append(ids.clone()), real(ids, mask))[1]
    metrics = tr.optimize(batch)
    tr.policy._raw_logits = real
    P = ro.prompt_ids.shape[1]
    states = torch.cat(seen)[:, P:]
    expect = [torch.where(ro.commit_step[r] >= s, dream.mask_id, ro.completion_ids[r])
              for r in range(ro.batch_size) for s in sorted(set(ro.commit_step[r].tolist()))]
    assert states.shape[0] == len(expect)
    got = {tuple(row.tolist()) for row in states}
    assert got == {tuple(e.tolist()) for e in expect}
    assert all(math.isfinite(float(v)) for v in _flat(metrics))


def _flat(d):
    for v in d.values():
        if isinstance(v, dict):
            yield from _flat(v)
        elif isinstance(v, (int, float)) or (torch.is_tensor(v) and v.numel() == 1):
            yield v


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy", "origin"])
def test_dream_rule_composes_with_the_kv_caches(dream, alg):
    """Dream's rule inside blocks runs under Fast-dLLM's prefix / dual caches; with one step per block
    every step is a block's first (a full forward that refreshes the cache), so the cached rollout
    equals the uncached one exactly; with more steps per block it stays a valid rollout (every
    position committed once, commit steps inside each row's blocks in order)."""
    ids, mask = encode_prompts(dream.tokenizer, PROMPTS)
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    exact = dict(gen_length=16, block_length=4, steps=4, schedule="dream", remasking=alg, top_k=50)
    ref = generate(dream, ids, mask, SamplerConfig(**exact), generator=g())
    for cache in ("prefix", "dual"):
        r = generate(dream, ids, mask, SamplerConfig(**exact, cache=cache), generator=g())
        for f in ("completion_ids", "commit_step", "commit_prob", "num_steps"):
            assert torch.equal(getattr(r, f), getattr(ref, f)), (cache, f)
        multi = generate(dream, ids, mask, SamplerConfig(**{**exact, "steps": 8}, cache=cache), generator=g())
        assert (multi.commit_step >= 0).all() and (multi.commit_step < 8).all()
        blocks = multi.commit_step.view(len(PROMPTS), 4, 4) // 2  # 2 steps per block: block j commits at 2j, 2j+1
        assert torch.equal(blocks, torch.arange(4).view(1, 4, 1).expand_as(blocks))
