"""Importance ratios with a huge but finite log-ratio (docs/spec.md §1.5): ρ = exp(clamp(ℓ − ℓ_old, ±20)).

Unclamped, ``ℓ − ℓ_old = 100`` gives ``ρ = inf`` in float32: the loss is ``inf`` for A < 0 and the
gradient NaN for A > 0 (``0·inf`` in exp's backward, although the clip cuts that token). Every
ratio objective (diffu-GRPO, RLDF, GDPO; DiSPO's step term is a DiffuGRPO) must give a finite loss,
finite gradients and the hand-computed values, and be bit for bit unchanged inside the bound.
"""
from __future__ import annotations

import math

import pytest
import torch

from maskrl.objectives import GDPO, KL_LOG_RATIO_BOUND, RATIO_LOG_BOUND, RLDF, DiffuGRPO, importance_ratio, \
    ratio_clamped

E20 = math.exp(20.0)


def _one(obj, d: float, a: float):
    """Loss and gradient of one token with log-ratio ``d`` and advantage ``a`` (float32)."""
    lp = torch.tensor([[d]], requires_grad=True)
    out = obj(lp, torch.zeros(1, 1), None, torch.tensor([[a]]), torch.ones(1, 1, dtype=torch.bool))
    out.loss.backward()
    return out, lp.grad.item()


def test_the_fault_unclamped_exp_overflows_to_nan_gradients():
    """What the clamp prevents: exp(100) = inf, and the clipped branch's zero gradient times inf is NaN."""
    lp = torch.tensor([100.0], requires_grad=True)
    rho = torch.exp(lp)
    assert torch.isinf(rho).all()
    (-torch.minimum(rho * 1.0, rho.clamp(0.5, 1.5) * 1.0)).sum().backward()
    assert torch.isnan(lp.grad).all()


def test_bound_is_the_kl_bound_and_the_helpers_by_hand():
    assert RATIO_LOG_BOUND == KL_LOG_RATIO_BOUND == 20.0
    d = torch.tensor([100.0, -100.0, 20.0, -20.0, 0.3, float("inf"), float("-inf")], requires_grad=True)
    rho = importance_ratio(d)
    torch.testing.assert_close(rho.detach(), torch.tensor([E20, math.exp(-20), E20, math.exp(-20), math.exp(0.3),
                                                           E20, math.exp(-20)]))
    assert ratio_clamped(d).tolist() == [True, True, False, False, False, True, True]
    rho.sum().backward()
    # d/dd exp(clamp(d)) = exp(d) inside [−20, 20] (boundaries included), 0 outside
    torch.testing.assert_close(d.grad, torch.tensor([0.0, 0.0, E20, math.exp(-20), math.exp(0.3), 0.0, 0.0]))
    assert torch.isnan(importance_ratio(torch.tensor([float("nan")]))).all()  # NaN is not hidden
    assert torch.isfinite(importance_ratio(torch.tensor([100.0]).bfloat16()) * -3.0).all()


@pytest.mark.parametrize("obj", [DiffuGRPO(clip_eps=0.5, beta=0.0), RLDF(clip_eps=0.5, beta=0.0)],
                         ids=["diffu_grpo", "rldf"])
@pytest.mark.parametrize("d,a,loss", [
    (100.0, 1.0, -1.5),             # ρ held at e^20 > 1 + ε, A > 0: clip binds, −(1 + ε)A
    (100.0, -1.0, E20),             # A < 0: min is the unclipped −ρA = e^20 (finite), token held
    (-100.0, 1.0, -math.exp(-20)),  # ρ held at e^−20 < 1 − ε, A > 0: unclipped −ρA
    (-100.0, -1.0, 0.5),            # A < 0: clip binds, −(1 − ε)A
    (100.0, 3.0, -4.5), (-100.0, -3.0, 1.5), (100.0, -3.0, 3 * E20),
])
def test_per_token_ratio_at_log_ratio_100_by_hand(obj, d, a, loss):
    out, grad = _one(obj, d, a)
    assert math.isfinite(out.loss.item()) and out.loss.item() == pytest.approx(loss, rel=1e-6)
    assert grad == 0.0  # clip-bound or clamp-held: no gradient, and not NaN
    assert out.metrics["ratio_clamp_frac"] == 1.0
    assert out.metrics["clip_frac"] == float((d > 0) == (a > 0))
    assert out.metrics["ratio_mean"] == pytest.approx(E20 if d > 0 else math.exp(-20), rel=1e-6)


def test_mixed_row_finite_gradient_and_in_bound_tokens_by_hand():
    """Six tokens: the four held ones above and two inside the bound (d = ±0.3, A = ±2); token mean.
    The in-bound tokens keep their hand-computed gradient −A·e^d/6; the held ones get 0."""
    d = torch.tensor([[100.0, 100.0, -100.0, -100.0, 0.3, -0.3]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 2.0, -2.0]])
    mask = torch.ones(1, 6, dtype=torch.bool)
    out = DiffuGRPO(clip_eps=0.5, beta=0.0)(d, torch.zeros(1, 6), None, adv, mask)
    per_tok = [-1.5, E20, -math.exp(-20), 0.5, -2 * math.exp(0.3), 2 * math.exp(-0.3)]
    assert out.loss.item() == pytest.approx(sum(per_tok) / 6, rel=1e-6)
    assert out.metrics["ratio_clamp_frac"] == pytest.approx(4 / 6)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 6)
    out.loss.backward()
    torch.testing.assert_close(d.grad, torch.tensor([[0, 0, 0, 0, -2 * math.exp(0.3) / 6, 2 * math.exp(-0.3) / 6]]))
    # a held token on a padding position (mask 0) leaves everything finite too (0·e^20, not 0·inf)
    d2 = torch.tensor([[0.3, 100.0]], requires_grad=True)
    out = DiffuGRPO(clip_eps=0.5, beta=0.0)(d2, torch.zeros(1, 2), None, torch.tensor([[2.0, -1.0]]),
                                           torch.tensor([[True, False]]))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-2 * math.exp(0.3), rel=1e-6) and out.metrics["ratio_clamp_frac"] == 0.0
    torch.testing.assert_close(d2.grad, torch.tensor([[-2 * math.exp(0.3), 0.0]]))


def _unclamped_reference(logp, old, adv, mask, eps):
    """The pre-clamp diffu-GRPO policy term, written out: the values inside the bound must not move."""
    ratio = torch.exp(logp - old)
    per = -torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    m = mask.float()
    return (per * m).sum() / m.sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_unchanged_bit_for_bit_inside_the_bound(dtype):
    g = torch.Generator().manual_seed(5)
    logp = -torch.rand(4, 7, generator=g, dtype=dtype) * 3
    old = logp + torch.randn(4, 7, generator=g, dtype=dtype) * 2.0  # many ratios outside the clip range
    old[0, 0] = logp[0, 0] - 20.0  # exactly on the bound: still inside
    adv = torch.randn(4, 7, generator=g, dtype=dtype)
    mask = torch.rand(4, 7, generator=g) > 0.2
    lp1, lp2 = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    out = DiffuGRPO(clip_eps=0.2, beta=0.0)(lp1, old, None, adv, mask)
    ref = _unclamped_reference(lp2, old, adv, mask, 0.2)
    assert torch.equal(out.loss.detach(), ref.detach())
    out.loss.backward()
    ref.backward()
    assert torch.equal(lp1.grad, lp2.grad)
    assert out.metrics["ratio_clamp_frac"] == 0.0


def test_gdpo_sequence_ratio_at_mean_log_ratio_100_by_hand():
    """Four 2-token sequences with mean log-ratio ±100 and A = ±1 (ε = 0.2), one inside the bound
    (0.1, A = 2): per sequence −min(ρA, clip(ρ)A), divided by N = 5."""
    d = torch.tensor([[100.0, 100.0], [100.0, 100.0], [-100.0, -100.0], [-100.0, -100.0], [0.05, 0.15]],
                     requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0])[:, None].expand(5, 2)
    mask = torch.ones(5, 2, dtype=torch.bool)
    out = GDPO(clip_eps=0.2)(d, torch.zeros(5, 2), None, adv, mask)
    per_seq = [-1.2, E20, -math.exp(-20), 0.8, -2 * math.exp(0.1)]
    assert math.isfinite(out.loss.item()) and out.loss.item() == pytest.approx(sum(per_seq) / 5, rel=1e-6)
    assert out.metrics["ratio_clamp_frac"] == pytest.approx(4 / 5)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 5)
    out.loss.backward()
    # ∂/∂ℓ_i of −A·exp(mean ℓ) / N = −A·ρ/(|o|·N) = −2·e^0.1/10 for the in-bound sequence's tokens
    g_in = -2 * math.exp(0.1) / 10
    torch.testing.assert_close(d.grad, torch.tensor([[0.0, 0.0]] * 4 + [[g_in, g_in]]))


def test_gdpo_unchanged_bit_for_bit_inside_the_bound():
    g = torch.Generator().manual_seed(9)
    logp = -torch.rand(3, 5, generator=g) * 3
    old = logp + torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 1, generator=g).expand(3, 5)
    mask = torch.rand(3, 5, generator=g) > 0.2
    lp1, lp2 = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    out = GDPO(clip_eps=0.2)(lp1, old, None, adv, mask)
    m = mask.float()
    length = m.sum(-1).clamp(min=1.0)
    ratio = torch.exp(((lp2 * m).sum(-1) - (old * m).sum(-1)) / length)
    per_tok = -torch.minimum(ratio[:, None] * adv, ratio.clamp(0.8, 1.2)[:, None] * adv)
    ref = ((per_tok * m).sum(-1) / length).sum() / 3
    assert torch.equal(out.loss.detach(), ref.detach())
    out.loss.backward()
    ref.backward()
    assert torch.equal(lp1.grad, lp2.grad) and out.metrics["ratio_clamp_frac"] == 0.0
