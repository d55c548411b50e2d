"""docs/spec.md §1.5 ``wd1`` and ``gdpo`` against hand-computed values."""
from __future__ import annotations

import math

import pytest
import torch

from maskrl.objectives import GDPO, OBJECTIVES, WD1
from maskrl.objectives.wd1 import group_softmax


def test_wd1_weights_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 5.0])
    g = torch.tensor([0, 0, 0, 1, 1, 7])
    w = WD1().advantages(r, g)
    # group 0: A = (2/3, -1/3, -1/3)
    e, f = math.exp(2 / 3), math.exp(-1 / 3)
    pos = [e / (e + 2 * f), f / (e + 2 * f), f / (e + 2 * f)]
    neg = [(1 / e) / (1 / e + 2 / f), (1 / f) / (1 / e + 2 / f), (1 / f) / (1 / e + 2 / f)]
    expect = [p - q for p, q in zip(pos, neg)] + [0.0, 0.0, 0.0]  # equal rewards / singleton: weight 0
    torch.testing.assert_close(w, torch.tensor(expect), rtol=1e-6, atol=1e-7)
    assert w.dtype == torch.float32
    s = group_softmax(torch.tensor([0.0, math.log(3.0), 1.0]), torch.tensor([4, 4, 9]))
    torch.testing.assert_close(s, torch.tensor([0.25, 0.75, 1.0]))


def test_wd1_loss_is_linear_in_the_summed_log_likelihood():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.3, -9.0]], requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    w = torch.tensor([0.4, -0.4])[:, None].expand(2, 3)
    out = WD1()(logp, None, None, w, mask)
    # −(1/N) Σ_n w_n Σ_i ℓ_{n,i}:  −(0.4·(−3.5) − 0.4·(−0.5)) / 2 = 0.6
    assert out.loss.item() == pytest.approx(0.6)
    out.loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.2, -0.2, -0.2], [0.2, 0.2, 0.0]]))
    # seq_mean: −(0.4·(−3.5/3) − 0.4·(−0.25)) / 2 ; token_mean: −(0.4·(−3.5) − 0.4·(−0.5)) / 5
    assert WD1(aggregation="seq_mean")(logp, None, None, w, mask).loss.item() == pytest.approx(-(0.4 * -3.5 / 3 + 0.1) / 2)
    assert WD1(aggregation="token_mean")(logp, None, None, w, mask).loss.item() == pytest.approx(1.2 / 5)
    assert WD1.uses_ratio is False and not WD1().needs_reference and WD1(beta=0.1).needs_reference
    # micro-batches with the global normaliser sum to the whole (loss and metrics)
    parts = [WD1()(logp[s], None, None, w[s], mask[s], normalizer=2.0) for s in (slice(0, 1), slice(1, 2))]
    assert sum(p.loss.item() for p in parts) == pytest.approx(out.loss.item())
    for k, v in out.metrics.items():
        assert sum(p.metrics[k] for p in parts) == pytest.approx(v)


def test_wd1_with_reference_adds_k3():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    out = WD1(beta=0.5)(logp, None, ref, torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool))
    kl = math.exp(-0.5) + 0.5 - 1  # per sequence: summed over tokens, / N = 1
    assert out.metrics["kl"] == pytest.approx(kl, rel=1e-6) and out.loss.item() == pytest.approx(0.5 * kl, rel=1e-6)
    with pytest.raises(ValueError, match="logp_ref"):
        WD1(beta=0.5)(logp, None, None, torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="aggregation"):
        WD1(aggregation="token_sum")


def test_gdpo_by_hand():
    # sequence 0: E − E_old = 0.6 over 3 tokens -> ρ = e^0.2 = 1.2214 > 1.2 (clipped, A > 0 -> 1.2·A)
    # sequence 1: E − E_old = −0.2 over 2 tokens -> ρ = e^−0.1 = 0.9048 (inside, A < 0 -> ρ·A)
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -5.0]])
    logp = (old + torch.tensor([[0.2, 0.2, 0.2], [-0.1, -0.1, 3.0]])).requires_grad_()
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = torch.tensor([0.5, -0.5])[:, None].expand(2, 3)
    out = GDPO()(logp, old, None, adv, mask)
    r1 = math.exp(-0.1)
    expect = (-(1.2 * 0.5) - (r1 * -0.5)) / 2
    assert out.loss.item() == pytest.approx(expect, rel=1e-6)
    assert out.metrics["clip_frac"] == pytest.approx(0.5)
    assert out.metrics["ratio_mean"] == pytest.approx((math.exp(0.2) + r1) / 2, rel=1e-6)
    out.loss.backward()
    # clipped sequence: no gradient; the other: d/dℓ_i of −ρA/2 = −(ρ A / |o|) / 2 on its 2 tokens
    g = -(r1 * -0.5 / 2) / 2
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [g, g, 0.0]]))
    assert GDPO.default_likelihood == "elbo" and GDPO().needs_reference is False
    assert "Not NVIDIA's multi-reward" in GDPO.__doc__


def test_gdpo_kl_and_per_token_advantages():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-2.0, -2.0]])
    m = torch.ones(1, 2, dtype=torch.bool)
    out = GDPO(beta=0.1)(logp, logp, ref, torch.zeros(1, 2), m)
    d = (-4.0 - (-3.0)) / 2
    assert out.metrics["kl"] == pytest.approx(math.exp(d) - d - 1)
    # ratio 1: the per-token advantages are averaged: −(1/|o|) Σ_i A_i
    assert GDPO()(logp, logp, None, torch.tensor([[1.0, 3.0]]), m).loss.item() == pytest.approx(-2.0)


def test_gdpo_clip_frac_counts_tokens_where_the_sequence_clip_binds():
    """ε = 0.2. Sequence 0: ρ = e^0.2 = 1.2214 > 1.2 with per-token A = (+1, −1, +1): the clip binds on
    the two positive tokens (2/3). Sequence 1: ρ = e^−0.3 = 0.741 < 0.8 with A = (−1, +1): binds on
    the negative one (1/2). Sequence 2: ρ = e^0.5 > 1.2 with A = −1 everywhere: the unclipped term is the
    min, nothing binds. clip_frac = (2/3 + 1/2 + 0)/3; a 0-token row counts 0."""
    old = torch.zeros(4, 3)
    logp = torch.tensor([[0.2, 0.2, 0.2], [-0.3, -0.3, 9.0], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, True], [False, False, False]])
    adv = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, 5.0], [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    out = GDPO(clip_eps=0.2)(logp, old, None, adv, mask, normalizer=4)
    assert out.metrics["clip_frac"] == pytest.approx((2 / 3 + 1 / 2) / 4, rel=1e-6)
    # a slow loop over sequences and tokens
    total = 0.0
    for n in range(4):
        toks = [i for i in range(3) if mask[n, i]]
        if not toks:
            continue
        rho = math.exp(sum(float(logp[n, i] - old[n, i]) for i in toks) / len(toks))
        hit = sum(1 for i in toks if (rho > 1.2 and adv[n, i] > 0) or (rho < 0.8 and adv[n, i] < 0))
        total += hit / len(toks)
    assert out.metrics["clip_frac"] == pytest.approx(total / 4, rel=1e-6)


def test_gdpo_and_wd1_kl_stay_finite_on_a_large_log_ratio():
    """A sequence whose mean log-ratio to the reference is 100 (GDPO) / a token at 100 (wd1): the k3
    term is held at e^20 − 21 instead of overflowing, and ``kl_clamp_frac`` counts it."""
    logp = torch.tensor([[-101.0, -101.0], [-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0], [-1.0, -2.0]])
    m = torch.ones(2, 2, dtype=torch.bool)
    out = GDPO(beta=0.1)(logp, logp.detach(), ref, torch.zeros(2, 2), m)
    assert torch.isfinite(out.loss)
    assert out.metrics["kl"] == pytest.approx((math.exp(20) - 21) / 2, rel=1e-6)
    assert out.metrics["kl_clamp_frac"] == pytest.approx(0.5)
    out.loss.backward()
    assert torch.isfinite(logp.grad).all()
    lp = torch.tensor([[-101.0, -1.0], [-1.0, -2.0]], requires_grad=True)
    for agg, frac in (("seq_sum", (1 / 2 + 0) / 2), ("seq_mean", (1 / 2 + 0) / 2), ("token_mean", 1 / 4)):
        out = WD1(beta=0.1, aggregation=agg)(lp, None, ref, torch.zeros(2, 2), m)
        assert torch.isfinite(out.loss) and out.metrics["kl_clamp_frac"] == pytest.approx(frac), agg
    # micro-batches with the global normaliser sum to the whole batch's share
    parts = [WD1(beta=0.1)(lp[i:i + 1], None, ref[i:i + 1], torch.zeros(1, 2), m[i:i + 1], normalizer=2)
             for i in range(2)]
    assert sum(p.metrics["kl_clamp_frac"] for p in parts) == pytest.approx(0.25)


def test_registered():
    assert {"wd1", "gdpo", "diffu_grpo"} <= set(OBJECTIVES.names())
