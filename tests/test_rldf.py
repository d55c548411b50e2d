"""RLDF base (docs/spec.md §1.5 ``rldf``): objective defaults, step sampling, state reconstruction, the filter,
REINFORCE vs clipped, and one trainer step through the seam."""
from __future__ import annotations

import math

import pytest
import torch

from maskrl.config import load_config
from maskrl.credit import CREDITS, CreditBatch, CreditContext, RLDFSteps
from maskrl.credit.rldf import (chosen_pairs, keep_filter, masked_at, sample_steps, state_rollout, state_token_stats,
                                step_surprise)
from maskrl.likelihood.state import State
from maskrl.models import build_tiny
from maskrl.objectives import OBJECTIVES, RLDF
from maskrl.sampling import SamplerConfig, generate
from maskrl.tasks.base import Example
from conftest import sharp_tiny as _sharp
from maskrl.text import encode_prompts
from maskrl.trainer import RLTrainer
from conftest import OddChars

THRESH = SamplerConfig(gen_length=12, block_length=4, temperature=1.0, schedule="threshold", threshold=0.5)




def _rollout(adapter, sampler=THRESH):
    ids, mask = encode_prompts(adapter.tokenizer, ["ab", "a longer prompt", "c", "dd e"])
    return generate(adapter, ids, mask, sampler, generator=torch.Generator().manual_seed(0))


def _ctx(policy, n, likelihood=None, objective=None, seed=0):
    return CreditContext(rewards=torch.zeros(n), group_ids=torch.arange(n), sequence_advantages=torch.ones(n),
                         score=None, reduce=lambda t, op="sum": t, generator=torch.Generator().manual_seed(seed),
                         policy=policy, objective=objective or RLDF(), likelihood=likelihood or State())


def test_rldf_objective_defaults_and_registry():
    obj = OBJECTIVES.get("rldf")()
    assert (obj.clip_eps, obj.beta, obj.normalize, obj.aggregation) == (0.2, 0.01, "mean_std", "seq_mean")
    assert RLDF.default_likelihood == "state" and obj.needs_reference
    cfg = load_config([], ["objective.name=rldf", "credit=[{name: rldf_steps}]"])
    assert cfg.objective == RLDF() and isinstance(cfg.likelihood, State)  # the objective's own defaults stand
    assert cfg.credit[0] == RLDFSteps() and CREDITS.name_of(cfg.credit[0]) == "rldf_steps"
    cfg = load_config([], ["objective={name: rldf, clip_eps: 0.3}"])
    assert cfg.objective.clip_eps == 0.3 and cfg.objective.beta == 0.01
    # issue 19 item 5: one default -- the state likelihood with the clean prompt the p >= 0.6 filter and
    # DTCA's calibration read, whether the section is absent or names `state` without the field
    assert RLDF.default_likelihood_fields == {"p_mask_prompt": 0.0}
    for sets in ([], ["likelihood={name: state}"], ["likelihood.name=state"]):
        assert load_config([], ["objective.name=rldf", *sets]).likelihood == State(p_mask_prompt=0.0), sets
    assert load_config([], ["objective.name=rldf", "likelihood={name: state, p_mask_prompt: 0.2}"]).likelihood == \
        State(p_mask_prompt=0.2)  # still a choice
    assert load_config([], ["likelihood={name: state}"]).likelihood == State()  # other objectives: docs/spec.md §1.4's 0.15
    from maskrl.config import explain
    assert "(default likelihood: {name: state, p_mask_prompt: 0.0})" in explain("objective.rldf")
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    assert torch.allclose(RLDF().advantages(r, g), torch.tensor([1.0, -1.0, -1.0, 1.0, 0.0, 0.0]))  # (r-.5)/.5
    for bad in (dict(k=0), dict(temperature=0.0), dict(keep_threshold=1.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RLDFSteps(**bad)


@pytest.mark.numerics
def test_step_surprise_by_hand():
    cs = torch.tensor([[0, 0, 1, 2], [1, 0, 1, 1]])
    p = torch.tensor([[0.5, 0.25, 0.9, 1.0], [0.1, 0.2, 0.4, 0.8]])
    valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
    w, present = step_surprise(cs, p, valid)
    expect = torch.tensor([[-(math.log(0.5) + math.log(0.25)) / 2, -math.log(0.9), 0.0],
                           [-math.log(0.2), -(math.log(0.1) + math.log(0.4) + math.log(0.8)) / 3, 0.0]])
    assert torch.allclose(w, expect) and present.tolist() == [[True, True, False], [True, True, False]]


def test_sampling_without_replacement_follows_the_softmax_and_pads():
    scores = torch.tensor([[0.0, math.log(2.0), math.log(3.0), 5.0, 0.3]])
    present = torch.tensor([[True, True, True, False, True]])  # step 3 not present, despite its big score
    n = 40000
    steps = sample_steps(scores.expand(n, -1), present.expand(n, -1), 3, 1.0, torch.Generator().manual_seed(1))
    assert steps.shape == (n, 3) and (steps != 3).all() and (steps >= 0).all()
    srt = steps.sort(1).values
    assert (srt[:, 1:] != srt[:, :-1]).all()  # no step twice in a row
    pr = torch.softmax(torch.tensor([0.0, math.log(2.0), math.log(3.0), 0.3]), 0)
    idx = {0: 0, 1: 1, 2: 2, 4: 3}
    first = torch.bincount(steps[:, 0], minlength=5).double() / n
    for s, i in idx.items():
        assert abs(first[s].item() - pr[i].item()) < 0.01
    # Plackett-Luce: P(first = 2, second = 1) = p2 · p1 / (1 − p2)
    pl = (pr[2] * pr[1] / (1 - pr[2])).item()
    assert abs(((steps[:, 0] == 2) & (steps[:, 1] == 1)).double().mean().item() - pl) < 0.01
    # temperature flattens: T → large gives near-uniform first picks
    hot = sample_steps(scores.expand(n, -1), present.expand(n, -1), 1, 1e6, torch.Generator().manual_seed(2))
    assert (torch.bincount(hot[:, 0], minlength=5)[[0, 1, 2, 4]].double() / n - 0.25).abs().max() < 0.015
    # fewer present steps than k: all of them, then -1 padding
    few = sample_steps(torch.zeros(2, 3), torch.tensor([[True, False, True], [False, False, False]]), 4, 1.0,
                       torch.Generator().manual_seed(0))
    assert sorted(few[0, :2].tolist()) == [0, 2] and few[0, 2:].tolist() == [-1, -1] and few[1].tolist() == [-1] * 4
    rows, st = chosen_pairs(few)
    assert rows.tolist() == [0, 0] and sorted(st.tolist()) == [0, 2]
    with pytest.raises(ValueError, match="k"):
        sample_steps(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), 0, 1.0, None)


@pytest.mark.numerics
def test_reconstructed_state_masks_exactly_the_later_commits():
    a = _sharp()
    ro = _rollout(a)
    assert (ro.num_steps > 4).all()
    rows = torch.arange(ro.batch_size).repeat_interleave(3)
    steps = torch.stack([torch.tensor([0, 2, int(n) - 1]) for n in ro.num_steps]).reshape(-1)
    sro = state_rollout(ro, rows, steps)
    masked = masked_at(ro.commit_step[rows], steps)
    assert torch.equal(masked, ro.commit_step[rows] >= steps[:, None])
    assert (masked.sum(-1) > 0).all()
    # the state likelihood on the state rows: one forward row per chosen state, values = brute force at x_s
    est = State(p_mask_prompt=0.0)
    assert est.rows(sro, masked).tolist() == [1] * len(rows)
    lp = est(a, sro, torch.Generator().manual_seed(0), masked)
    with torch.no_grad():
        for m in range(len(rows)):
            n, s = int(rows[m]), int(steps[m])
            comp = ro.completion_ids[n].clone()
            comp[ro.commit_step[n] >= s] = a.mask_id  # x_s: exactly the positions committed at s or later
            x = torch.cat([ro.prompt_ids[n], comp])[None]
            attn = torch.cat([ro.prompt_mask[n], torch.ones_like(comp, dtype=torch.bool)])[None]
            ref = torch.log_softmax(a.logits(x, attn)[0, ro.prompt_ids.shape[1]:].float(), -1)
            ref = ref.gather(-1, ro.completion_ids[n][:, None]).squeeze(-1)
            assert torch.allclose(lp[m][masked[m]], ref[masked[m]], atol=1e-5)
            assert (lp[m][~masked[m]] == 0).all()
            # the filter's probabilities and entropies at the same state
            p, h = state_token_stats(a, sro.select(torch.tensor([m])), masked[m:m + 1],
                                     entropy=True)
            full = torch.log_softmax(a.logits(x, attn)[0, ro.prompt_ids.shape[1]:].float(), -1)
            assert torch.allclose(p[0][masked[m]], ref[masked[m]].exp(), atol=1e-5)
            ent = -(full.exp() * full).sum(-1)
            assert torch.allclose(h[0][masked[m]], ent[masked[m]], atol=1e-4)


def test_filter_keeps_own_commits_and_confident_masked_positions():
    masked = torch.tensor([[True, True, True, True, False]])
    own = torch.tensor([[True, False, False, False, False]])
    prob = torch.tensor([[0.1, 0.59, 0.6, 0.9, 0.99]])
    valid = torch.tensor([[True, True, True, False, True]])
    keep = keep_filter(masked, own, prob, valid, 0.6)
    # own commit kept despite p 0.1; 0.59 dropped; 0.6 kept; 0.9 is padding; unmasked never
    assert keep.tolist() == [[True, False, True, False, False]]


def test_rldf_steps_module_builds_the_state_term():
    a = _sharp()
    ro = _rollout(a)
    n = ro.batch_size
    adv = torch.linspace(-1, 1, n)[:, None] * ro.completion_mask.float()
    batch = CreditBatch(rollout=ro, rewards=torch.zeros(n), advantages=adv, loss_mask=ro.completion_mask.clone())
    out = RLDFSteps(k=3)(batch, _ctx(a, n))
    assert out.base_weight == 0.0 and not out.loss_mask.any()
    (term,) = out.terms
    assert term.name == "rldf" and term.rollout.batch_size == 3 * n  # every row has more than 3 steps
    rows = term.rollout.group_ids  # group_ids are arange(N) here: the source row of each state row
    cs, cs_new = ro.commit_step[rows], term.rollout.commit_step
    s = cs_new.max(-1).values  # the chosen step of each state row
    assert torch.equal(cs_new, torch.minimum(cs, s[:, None]))
    for r in range(n):  # three distinct steps per sequence
        assert len(set(s[rows == r].tolist())) == 3
    own = (cs == s[:, None]) & ro.completion_mask[rows]
    assert (term.mask[own]).all() and not term.mask[cs < s[:, None]].any()
    p, _ = state_token_stats(a, term.rollout, cs >= s[:, None])
    other = term.mask & ~own
    assert (p[other] >= 0.6).all() and (p[(cs > s[:, None]) & ~term.mask & ro.completion_mask[rows]] < 0.6).all()
    assert torch.equal(term.advantages, torch.where(term.mask, adv[rows], torch.zeros_like(term.mask, dtype=torch.float)))
    assert torch.equal(term.likelihood.rows(term.rollout, term.mask), torch.ones(3 * n, dtype=torch.long))
    assert set(out.metrics) == {"states_per_seq", "kept_per_state", "filter_keep_frac"}
    # same generator seed, same steps; another seed, other steps
    again = RLDFSteps(k=3)(batch, _ctx(a, n)).terms[0]
    assert torch.equal(again.rollout.commit_step, cs_new)
    with pytest.raises(ValueError, match="state"):
        from maskrl.likelihood.mean_field import MeanField
        RLDFSteps()(batch, _ctx(a, n, likelihood=MeanField()))


def test_reinforce_at_mu_one_and_clipped_above():
    obj = RLDF(beta=0.0)
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -4.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    out = obj(logp, logp.detach(), None, adv, mask, normalizer=2.0)  # μ = 1: ℓ_old = ℓ.detach()
    out.loss.backward()
    # seq_mean: row means over 2 and 3 tokens, then / 2 rows: gradient −A_i / (|row| · 2)
    expect = torch.tensor([[-1 / 4, -1 / 4, 0.0], [2 / 6, 2 / 6, 0.0]])
    assert torch.allclose(logp.grad, expect)
    # ρ ≡ 1: the loss value is −mean A (the gradient is REINFORCE's −A∇ℓ)
    assert math.isclose(out.loss.item(), (-(adv * mask).sum(-1) / mask.sum(-1)).mean().item(), rel_tol=1e-6)
    # μ > 1: a ratio outside [1−ε, 1+ε] in the direction of A is clipped -> no gradient there
    logp2 = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, -0.5]])  # ρ_0 = e^0.5 ≈ 1.65 > 1.2
    a2 = torch.ones(1, 3)
    RLDF(beta=0.0)(logp2, old, None, a2, torch.ones(1, 3, dtype=torch.bool), normalizer=1.0).loss.backward()
    assert logp2.grad[0, 0] == 0.0 and torch.allclose(logp2.grad[0, 1:], torch.tensor([-1 / 3, -1 / 3]))


def test_one_trainer_step_trains_only_the_chosen_states(tmp_path):
    y = tmp_path / "rldf.yaml"
    y.write_text(f"""
output_dir: {tmp_path / 'out'}
rollout: {{gen_length: 8, block_length: 4, temperature: 1.0, schedule: threshold, threshold: 0.5}}
objective: {{name: rldf}}
credit: [{{name: rldf_steps, k: 2}}]
train: {{steps: 1, prompts_per_step: 2, group_size: 3, inner_iterations: 2, lr: 1.0e-2}}
""")
    cfg = load_config([y])
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    before = {k: v.detach().clone() for k, v in a.model.state_dict().items()}
    tr = RLTrainer(cfg, a, OddChars(), [Example(id=i, prompt=f"say {i}") for i in range(4)])
    batch = tr.collect()
    assert batch.base_weight == 0.0 and not batch.loss_mask.any() and [t.name for t in batch.terms] == ["rldf"]
    m = tr.optimize(batch)
    assert "rldf/policy_loss" in m and "rldf/kl" in m and not any(k.startswith("base/") for k in m)
    assert any(not torch.equal(before[k], v) for k, v in a.model.state_dict().items())


def test_filter_statistics_do_not_depend_on_the_chunking():
    a = _sharp()
    ro = _rollout(a)
    rows = torch.arange(ro.batch_size).repeat_interleave(2)
    steps = torch.tensor([1, 3] * ro.batch_size)
    sro = state_rollout(ro, rows, steps)
    need = masked_at(ro.commit_step[rows], steps) & ro.completion_mask[rows]
    p1, h1 = state_token_stats(a, sro, need, entropy=True)
    p2, h2 = state_token_stats(a, sro, need, entropy=True, chunk=3)
    p3, h3 = state_token_stats(a, sro, need, entropy=True, max_elements=1)  # one row per forward
    for p, h in ((p2, h2), (p3, h3)):
        assert torch.allclose(p, p1, atol=1e-6) and torch.allclose(h, h1, atol=1e-5)
    assert ((p1 > 0) == need).all()
    with pytest.raises(ValueError, match="row 0 needs positions of more than one state"):
        state_token_stats(a, ro, ro.completion_mask)  # the raw rollout: each position at its own step


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_step_scores_under_a_cache_read_thetas_exact_commit_probabilities(cache):
    """Issue 19 item 3: with a cache the sampler's ``commit_prob`` comes from cached logits; RLDF (and
    DTCA, which shares :func:`commit_probs`) read θ's exact p_i at each commit state instead, recorded
    by their observer. Without a cache they need no observer and read ``commit_prob`` itself."""
    import dataclasses

    from maskrl.credit import DTCA
    from maskrl.credit.rldf import commit_probs

    a = _sharp()
    cfg = dataclasses.replace(THRESH, cache=cache)
    ids, mask = encode_prompts(a.tokenizer, ["ab", "a longer prompt", "c", "dd e"])
    assert RLDFSteps().observers(THRESH, torch.Generator()) == [] == DTCA().observers(THRESH, torch.Generator())
    obs = RLDFSteps().observers(cfg, torch.Generator())
    assert [type(o).__name__ for o in obs] == [type(o).__name__ for o in DTCA().observers(cfg, torch.Generator())]
    ro = generate(a, ids, mask, cfg, generator=torch.Generator().manual_seed(0), observers=obs)
    p = commit_probs(ro, "test")
    ref = torch.zeros_like(p)
    for i in range(ro.batch_size):  # slow reference: a full forward at every commit state
        for t in ro.commit_step[i].unique().tolist():
            state = torch.where(ro.commit_step[i] >= t, a.mask_id, ro.completion_ids[i])
            x = torch.cat([ids[i], state])[None]
            attn = torch.cat([mask[i], torch.ones_like(state, dtype=torch.bool)])[None]
            with torch.no_grad():
                z = a.logits(x, attn)[0, ids.shape[1]:].double()
            z[:, a.mask_id] = float("-inf")
            at = ro.commit_step[i] == t
            ref[i, at] = torch.softmax(z, -1)[at].gather(-1, ro.completion_ids[i, at][:, None]).squeeze(-1).float()
    torch.testing.assert_close(p, ref, rtol=1e-4, atol=1e-5)
    assert (ro.commit_prob - ref).abs().max() > 1e-3  # the cached values really differ here
    with pytest.raises(ValueError, match="cache"):  # a cached rollout without the observer: no silent fallback
        commit_probs(generate(a, ids, mask, cfg, generator=torch.Generator().manual_seed(0)), "rldf_steps")
    plain = generate(a, ids, mask, THRESH, generator=torch.Generator().manual_seed(0))
    assert commit_probs(plain, "rldf_steps") is plain.commit_prob
