"""EBPO (LLaDA2.1 report §3.2, Eqs. 4–5; issue 52 item 4): hand-computed values, a slow loop reference of
the loss and its gradient, the asymmetric clip, and one trainer step on the tiny block model with the
block ELBO (every credit module on top of it: tests/test_block_shapes.py, which runs every registered
base). Against DARE's own code: tests/test_ebpo_dare.py."""
from __future__ import annotations

import math

import pytest
import torch

from maskrl.config import load_config
from maskrl.likelihood.block_elbo import BlockELBO
from maskrl.objectives import EBPO, GDPO, OBJECTIVES


def loop_loss(logp, old, adv, mask, eps_low, eps_high, ratio_norm="none", advantage_mean="outside"):
    """The slow, obvious reference in Python floats: per sequence ρ = exp(Σ_i (ℓ_i − ℓ_i^old)) (or that sum
    over |o|), then min(ρĀ, clip(ρ, 1−ε_low, 1+ε_high)Ā) with Ā the mean of its tokens' advantages
    (``outside``, DARE's), or the mean over its tokens of min(ρA_i, clip(ρ)A_i) (``inside``), then the mean
    over sequences, negated."""
    n, L = logp.shape
    total = 0.0
    for r in range(n):
        toks = [i for i in range(L) if mask[r, i]]
        if not toks:
            continue
        d = sum(float(logp[r, i]) - float(old[r, i]) for i in toks)
        if ratio_norm == "length":
            d /= len(toks)
        rho = math.exp(d)
        clipped = min(max(rho, 1 - eps_low), 1 + eps_high)
        if advantage_mean == "outside":
            a = sum(float(adv[r, i]) for i in toks) / len(toks)
            total += min(rho * a, clipped * a)
            continue
        total += sum(min(rho * float(adv[r, i]), clipped * float(adv[r, i])) for i in toks) / len(toks)
    return -total / n


@pytest.mark.numerics
def test_one_sequence_by_hand():
    """Two tokens with ℓ − ℓ^old = 0.1 and 0.2: log ρ = 0.3 (no length normalisation), ρ = e^0.3 = 1.3498588;
    A = 1 and ε_high = 0.28: the clip binds, loss −1.28. With ratio_norm: length, log ρ = 0.15, ρ = 1.1618342
    < 1.28: loss −1.1618342. With A = −1 and ε_low = 0.2: min(−1.3498588, −1.28) = −1.3498588, loss +1.3498588."""
    logp = torch.tensor([[0.1, 0.2, 5.0]])
    old = torch.zeros(1, 3)
    mask = torch.tensor([[True, True, False]])
    eps = 4 * torch.finfo(torch.float32).eps
    out = EBPO(clip_eps=0.2, clip_eps_high=0.28)(logp, old, None, torch.ones(1, 3), mask)
    assert float(out.loss) == pytest.approx(-1.28, rel=eps)
    assert out.metrics["clip_frac"] == pytest.approx(1.0)
    assert out.metrics["ratio_mean"] == pytest.approx(1.3498588, rel=eps)
    out = EBPO(clip_eps=0.2, clip_eps_high=0.28, ratio_norm="length")(logp, old, None, torch.ones(1, 3), mask)
    assert float(out.loss) == pytest.approx(-1.1618342, rel=eps)
    assert out.metrics["clip_frac"] == 0.0
    out = EBPO(clip_eps=0.2, clip_eps_high=0.28)(logp, old, None, -torch.ones(1, 3), mask)
    assert float(out.loss) == pytest.approx(1.3498588, rel=eps)
    assert out.metrics["clip_frac"] == 0.0  # ρ > 1 + ε_high with A < 0: the unclipped term is the min


@pytest.mark.numerics
@pytest.mark.parametrize("advantage_mean", ["outside", "inside"])
@pytest.mark.parametrize("ratio_norm, eps_high", [("none", None), ("none", 0.28), ("length", 0.28)])
def test_loss_and_gradient_equal_the_loop_reference(ratio_norm, eps_high, advantage_mean):
    g = torch.Generator().manual_seed(0)
    n, L = 6, 5
    old = -torch.rand(n, L, generator=g) * 3
    logp = (old + (torch.rand(n, L, generator=g) - 0.5) * 0.3).requires_grad_()
    adv = torch.randn(n, L, generator=g)  # per-token advantages, as a credit module gives them
    mask = torch.rand(n, L, generator=g) < 0.8
    mask[0] = False  # a row without tokens counts in N and adds nothing
    obj = EBPO(clip_eps=0.2, clip_eps_high=eps_high, ratio_norm=ratio_norm, advantage_mean=advantage_mean)
    got = obj(logp, old, None, adv, mask).loss
    want = loop_loss(logp.detach(), old, adv, mask, 0.2, 0.2 if eps_high is None else eps_high, ratio_norm,
                     advantage_mean)
    assert float(got.detach()) == pytest.approx(want, rel=64 * torch.finfo(torch.float32).eps, abs=1e-7)
    # the gradient against central differences of the loop reference (float64)
    got.backward()
    h = 1e-6
    base = logp.detach().double()
    for r, i in [(1, 0), (2, 3), (4, 4), (5, 1)]:
        up, down = base.clone(), base.clone()
        up[r, i] += h
        down[r, i] -= h
        eh = 0.2 if eps_high is None else eps_high
        num = (loop_loss(up, old.double(), adv, mask, 0.2, eh, ratio_norm, advantage_mean)
               - loop_loss(down, old.double(), adv, mask, 0.2, eh, ratio_norm, advantage_mean)) / (2 * h)
        assert float(logp.grad[r, i]) == pytest.approx(num, rel=1e-4, abs=1e-6), (r, i)


@pytest.mark.numerics
def test_length_normalised_ebpo_with_symmetric_clip_is_gdpo():
    g = torch.Generator().manual_seed(1)
    logp, old = -torch.rand(3, 4, generator=g), -torch.rand(3, 4, generator=g)
    adv, mask = torch.randn(3, 4, generator=g), torch.rand(3, 4, generator=g) < 0.8
    a = EBPO(ratio_norm="length", advantage_mean="inside")(logp, old, None, adv, mask)
    b = GDPO(clip_eps=0.2)(logp, old, None, adv, mask)
    assert torch.equal(a.loss, b.loss)


def test_registered_with_its_defaults_and_refusals():
    assert OBJECTIVES.get("ebpo") is EBPO
    obj = EBPO()
    assert (obj.clip_range(), obj.ratio_norm, obj.beta, obj.normalize) == ((0.2, 0.2), "none", 0.0,
                                                                           "mean_std_unbiased")
    assert obj.default_likelihood == "block_elbo" and not obj.needs_reference
    cfg = load_config([], ["objective={name: ebpo, clip_eps_high: 0.28}", "model.tiny.block_size=4"])  # block_elbo
    assert cfg.objective == EBPO(clip_eps_high=0.28)
    assert type(cfg.likelihood) is BlockELBO
    for bad, match in [({"ratio_norm": "tokens"}, "ratio_norm"), ({"clip_eps": 1.0}, "clip_eps"),
                       ({"clip_eps_high": -0.1}, "clip_eps_high"), ({"beta": -1.0}, "beta")]:
        with pytest.raises(ValueError, match=match):
            EBPO(**bad)
