"""Dream's own decoding rule in the one sampler (``schedule: dream``, ``remasking: maskgit_plus |
topk_margin | entropy | origin``, ``top_k``, ``top_p``, ``alg_temp``), token for token against a slow,
loop-based re-statement of Dream's ``diffusion_generate`` written from its facts:

- step ``j`` of a block commits ``int(m · (1 - s/t))``, ``t, s`` consecutive entries of
  ``linspace(1, 1e-3, T_b + 1)``, ``m`` the mask count averaged over the batch; the last step commits
  everything left (no blocks = one block of the whole length);
- confidences from Dream's softmax (logits / τ, then top-p, then top-k, ``[M]`` kept in): top-1
  probability, top-1 minus top-2, ``Σ p log(p + 1e-10)``; ``alg_temp`` samples positions;
- ``origin``: one uniform per still-masked position per step, row-major over the batch, revealed when
  below ``1 - s/t``.

The noise convention shared with the sampler (documented in ``maskrl.sampling.dream``): per step, the
candidate draw's float64 uniforms ``[N, b, V]`` first (temperature > 0), then the position draw.
"""
import math

import pytest
import torch

from maskrl.sampling import SamplerConfig, generate
from maskrl.sampling.dream import (demote_stops, dream_commit_counts, dream_confidence, dream_step, dream_timesteps,
                                   filter_top_k, filter_top_p)
from maskrl.text import encode_prompts
from conftest import tiny_dream

PROMPTS = ["abc", "hello world", "x", "countdown 1,2,3"]


@pytest.fixture(scope="module")
def dream():
    """A tiny Dream-style model (:func:`conftest.tiny_dream`), output layer x 8: confidences differ
    clearly between positions."""
    return tiny_dream(scale=8.0, max_positions=512)


# ---------------------------------------------------------------------------------------------------
# The reference: plain Python loops over rows and positions, one vocabulary vector at a time.

def _ref_filter(vec, temperature, top_k, top_p):
    """Dream's sampling logits of one vocabulary vector: / τ, then top-p, then top-k."""
    vec = vec.double() / temperature if temperature > 0 else vec.double()
    low = torch.finfo(torch.float32).min
    out = vec.clone()
    if top_p is not None and top_p < 1:
        order = sorted(range(len(vec)), key=lambda v: -float(vec[v]))
        probs = torch.softmax(vec, 0)
        cum = 0.0
        for i, v in enumerate(order):
            if i > 0 and cum > top_p:
                out[v] = low
            cum += float(probs[v])
    if top_k is not None:
        kth = sorted((float(a) for a in out), reverse=True)[top_k - 1]
        for v in range(len(out)):
            if float(out[v]) < kth:
                out[v] = low
    return out


def ref_dream_generate(ad, prompt_ids, prompt_mask, *, gen_length, block_length, steps, alg, temperature=0.0,
                       top_k=None, top_p=None, alg_temp=0.0, generator=None):
    """Dream's ``diffusion_generate`` restated (blocks: Dream's schedule inside each block)."""
    n, p = prompt_ids.shape
    mask_id = ad.mask_id
    x = torch.cat([prompt_ids, torch.full((n, gen_length), mask_id)], 1)
    attn = torch.cat([prompt_mask.bool(), torch.ones(n, gen_length, dtype=torch.bool)], 1)
    commit_step = torch.full((n, gen_length), -1)
    commit_prob = torch.zeros(n, gen_length)
    num_blocks = gen_length // block_length
    spb = steps // num_blocks
    ts = torch.linspace(1, 1e-3, spb + 1)
    step = 0
    for blk in range(num_blocks):
        lo = blk * block_length
        for j in range(spb):
            with torch.no_grad():
                logits = ad.logits(x, attn)[:, p:].float()  # [n, L, V], position-aligned
            V = logits.shape[-1]
            u_draw = (torch.rand((n, block_length, V), generator=generator, dtype=torch.float64)
                      if temperature > 0 else None)
            cand, conf, prob = {}, {}, {}
            for r in range(n):
                for q in range(block_length):
                    i = lo + q
                    if int(x[r, p + i]) != mask_id:
                        continue
                    raw = logits[r, i]
                    no_m = raw.clone()
                    no_m[mask_id] = float("-inf")
                    f = _ref_filter(no_m, temperature, top_k, top_p)
                    if temperature > 0:
                        keyed = [float(f[v]) - math.log(-math.log(float(u_draw[r, q, v]))) for v in range(V)]
                    else:
                        keyed = [float(f[v]) for v in range(V)]
                    c = max(range(V), key=lambda v: (keyed[v], -v))
                    cand[r, i] = c
                    prob[r, i] = float(torch.softmax(no_m.double(), 0)[c])
                    pm = torch.softmax(_ref_filter(raw, temperature, top_k, top_p).float(), 0)
                    if alg == "maskgit_plus":
                        conf[r, i] = float(pm[c])
                    elif alg == "topk_margin":
                        s = sorted((float(a) for a in pm), reverse=True)
                        conf[r, i] = s[0] - s[1]
                    elif alg == "entropy":
                        conf[r, i] = float((pm * torch.log(pm + 1e-10)).sum())
            t, s = ts[j], ts[j + 1]
            masked = [[lo + q for q in range(block_length) if int(x[r, p + lo + q]) == mask_id] for r in range(n)]
            chosen = [[] for _ in range(n)]
            if alg == "origin":
                p_transfer = float(1 - s / t) if j < spb - 1 else 1.0
                total = sum(len(m) for m in masked)
                u = torch.rand(total, generator=generator)
                idx = 0
                for r in range(n):
                    for i in masked[r]:
                        if float(u[idx]) < p_transfer:
                            chosen[r].append(i)
                        idx += 1
            else:
                m_avg = torch.tensor(sum(len(m) for m in masked), dtype=torch.float32) / n
                k = int(m_avg * (1 - s / t)) if j < spb - 1 else int(m_avg)
                u_pos = (torch.rand((n, block_length), generator=generator, dtype=torch.float64)
                         if alg_temp > 0 else None)
                for r in range(n):
                    if alg_temp > 0:
                        key = {i: conf[r, i] / alg_temp - math.log(-math.log(float(u_pos[r, i - lo]))) for i in masked[r]}
                    else:
                        key = {i: conf[r, i] for i in masked[r]}
                    chosen[r] = sorted(masked[r], key=lambda i: (-key[i], i))[:k]
            for r in range(n):
                for i in chosen[r]:
                    x[r, p + i] = cand[r, i]
                    commit_step[r, i] = step
                    commit_prob[r, i] = prob[r, i]
            step += 1
    return x[:, p:], commit_step, commit_prob


CASES = [
    # (alg, temperature, top_k, gen_length, block_length, steps)
    *[(alg, 0.0, None, 16, 16, 8) for alg in ("maskgit_plus", "topk_margin", "entropy", "origin")],
    *[(alg, 0.0, 50, 16, 16, 16) for alg in ("maskgit_plus", "topk_margin", "entropy", "origin")],
    *[(alg, 0.7, None, 16, 8, 8) for alg in ("maskgit_plus", "topk_margin", "entropy", "origin")],
    *[(alg, 0.7, 50, 16, 16, 12) for alg in ("maskgit_plus", "topk_margin", "entropy", "origin")],
]


@pytest.mark.parametrize("alg,temperature,top_k,L,b,steps", CASES)
def test_dream_rule_equals_reference(dream, alg, temperature, top_k, L, b, steps):
    ids, mask = encode_prompts(dream.tokenizer, PROMPTS)
    assert not bool(mask.all()), "the batch must be left-padded"
    cfg = SamplerConfig(gen_length=L, block_length=b, steps=steps, schedule="dream", remasking=alg,
                        temperature=temperature, top_k=top_k)
    out = generate(dream, ids, mask, cfg, generator=torch.Generator().manual_seed(3))
    tokens, cstep, cprob = ref_dream_generate(dream, ids, mask, gen_length=L, block_length=b, steps=steps, alg=alg,
                                              temperature=temperature, top_k=top_k,
                                              generator=torch.Generator().manual_seed(3))
    assert torch.equal(out.completion_ids, tokens)
    assert torch.equal(out.commit_step, cstep)
    assert torch.allclose(out.commit_prob, cprob, rtol=1e-5, atol=1e-6)
    assert int(out.num_steps.max()) == steps


@pytest.mark.parametrize("alg", ["maskgit_plus", "entropy"])
def test_dream_rule_alg_temp_and_top_p_equal_reference(dream, alg):
    ids, mask = encode_prompts(dream.tokenizer, PROMPTS)
    kw = dict(gen_length=16, block_length=8, steps=8)
    cfg = SamplerConfig(**kw, schedule="dream", remasking=alg, temperature=0.5, top_p=0.9, alg_temp=0.3)
    out = generate(dream, ids, mask, cfg, generator=torch.Generator().manual_seed(5))
    tokens, cstep, _ = ref_dream_generate(dream, ids, mask, **kw, alg=alg, temperature=0.5, top_p=0.9,
                                          alg_temp=0.3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(out.completion_ids, tokens)
    assert torch.equal(out.commit_step, cstep)


def test_dream_rule_at_paper_shape(dream):
    """L 256 in blocks of 32, 128 steps (Fast-dLLM's Dream variant shape), greedy entropy."""
    ids, mask = encode_prompts(dream.tokenizer, PROMPTS[:2])
    kw = dict(gen_length=256, block_length=32, steps=128)
    out = generate(dream, ids, mask, SamplerConfig(**kw, schedule="dream", remasking="entropy"))
    tokens, cstep, _ = ref_dream_generate(dream, ids, mask, **kw, alg="entropy")
    assert torch.equal(out.completion_ids, tokens)
    assert torch.equal(out.commit_step, cstep)


def test_dream_rule_batch_equals_single_rows(dream):
    ids, mask = encode_prompts(dream.tokenizer, PROMPTS)
    cfg = SamplerConfig(gen_length=16, block_length=16, steps=8, schedule="dream", remasking="topk_margin", top_k=50)
    batch = generate(dream, ids, mask, cfg)
    for r, prompt in enumerate(PROMPTS):
        i1, m1 = encode_prompts(dream.tokenizer, [prompt])
        one = generate(dream, i1, m1, cfg)
        assert torch.equal(one.completion_ids[0], batch.completion_ids[r])
        assert torch.equal(one.commit_step[0], batch.commit_step[r])


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
    logits = torch.tensor([[[4.0, 0.0, 0.0, float("-inf")], [2.0, 0.0, 0.0, float("-inf")]]])  # [1, 2, V]
    mask_logit = torch.tensor([[6.0, -9.0]])
    eligible = torch.ones(1, 2, dtype=torch.bool)
    kw = dict(remasking="maskgit_plus", temperature=0.0, top_k=None, top_p=None, alg_temp=0.0,
              k=torch.tensor([1]), p_reveal=None, generator=None)
    take, cand, prob = dream_step(logits, mask_logit, mask_id, eligible, None, **kw)
    assert cand.tolist() == [[0, 0]] and take.tolist() == [[False, True]]
    # p(0 | pos 0) = e^4 / (e^4 + 2 + e^6) = 0.1177 < p(0 | pos 1) = e^2 / (e^2 + 2 + e^-9) = 0.787
    assert torch.allclose(prob, torch.tensor([[math.exp(4) / (math.exp(4) + 2), math.exp(2) / (math.exp(2) + 2)]]))
    take, _, _ = dream_step(logits, None, mask_id, eligible, None, **kw)
    assert take.tolist() == [[True, False]]


def test_suppress_eos_ranks_stops_last_under_entropy():
    """Entropy confidences are negative: a stop candidate still ranks after every other one."""
    score = torch.tensor([[-0.1, -3.0, -9.0]])
    stop = torch.tensor([[True, False, False]])
    assert demote_stops(score, stop).argsort(dim=-1, descending=True).tolist() == [[1, 2, 0]]


@pytest.mark.parametrize("kw,field", [
    (dict(remasking="origin"), "schedule 'dream'"),
    (dict(remasking="entropy", schedule="threshold"), "schedule 'fixed' or 'dream'"),
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
