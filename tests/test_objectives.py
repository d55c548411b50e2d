import math

import pytest
import torch

from maskrl.advantages import group_advantages
from maskrl.objectives import KL_LOG_RATIO_BOUND, DiffuGRPO, aggregate, clip_binds, kl3, kl3_clamped


@pytest.mark.numerics
def test_group_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.2, 0.8])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    torch.testing.assert_close(group_advantages(r, g, "mean"), torch.tensor([0.5, -0.5, 0.0, -0.2, -0.2, 0.4]))
    # population std of [1, 0, .5] = sqrt(1/6)
    s0 = math.sqrt(1 / 6)
    s1 = math.sqrt(((0.2 - 0.4) ** 2 * 2 + 0.4 ** 2) / 3)
    exp = torch.tensor([0.5 / s0, -0.5 / s0, 0.0, -0.2 / s1, -0.2 / s1, 0.4 / s1])
    torch.testing.assert_close(group_advantages(r, g, "mean_std"), exp)
    # leave-one-out: r_i - mean(others)
    loo = torch.tensor([1 - 0.25, 0 - 0.75, 0.5 - 0.5, 0.2 - 0.5, 0.2 - 0.5, 0.8 - 0.2])
    torch.testing.assert_close(group_advantages(r, g, "leave_one_out"), loo)


def test_group_advantages_std_floor_and_order_invariance():
    r = torch.tensor([1.0, 1.0, 1.0])
    assert torch.equal(group_advantages(r, torch.zeros(3, dtype=torch.long), "mean_std"), torch.zeros(3))
    # interleaved groups give the same per-row values as contiguous ones
    r = torch.tensor([1.0, 0.2, 0.0, 0.2, 0.5, 0.8])
    g = torch.tensor([0, 1, 0, 1, 0, 1])
    torch.testing.assert_close(group_advantages(r, g, "mean"), torch.tensor([0.5, -0.2, -0.5, -0.2, 0.0, 0.4]))
    with pytest.raises(ValueError, match="normalize"):
        group_advantages(r, g, "median")


def test_kl3_hand_values():
    lp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    d = ref - lp
    torch.testing.assert_close(kl3(lp, ref), torch.exp(d) - d - 1)
    assert kl3(lp, lp).abs().max() == 0


def _loop_reference(logp, old, ref, adv, mask, eps, beta, bound=20.0):
    """Slow, obvious per-token loop of docs/spec.md §1.5 diffu_grpo with token-mean aggregation: the loss,
    the share of tokens whose clip binds (the clipped term is strictly the smaller one) and the share
    whose KL log-ratio is clamped to ±bound."""
    total, count, binds, clamped = 0.0, 0, 0, 0
    for n in range(len(logp)):
        for i in range(len(logp[0])):
            if not mask[n][i]:
                continue
            rho = math.exp(logp[n][i] - old[n][i])
            a = adv[n][i]
            clipped = min(max(rho, 1 - eps), 1 + eps) * a
            pol = -min(rho * a, clipped)
            binds += clipped < rho * a
            d = ref[n][i] - logp[n][i]
            clamped += abs(d) > bound
            d = min(max(d, -bound), bound)
            total += pol + beta * (math.exp(d) - d - 1)
            count += 1
    return total / count, binds / count, clamped / count


def test_diffu_grpo_matches_loop_reference():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=g) * 3
    old = logp + torch.randn(3, 5, generator=g) * 0.6  # some ratios outside [0.5, 1.5]
    ref = logp + torch.randn(3, 5, generator=g) * 0.3
    adv = torch.randn(3, 1, generator=g).expand(3, 5)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False
    obj = DiffuGRPO(clip_eps=0.5, beta=0.04)
    out = obj(logp, old, ref, adv, mask)
    expected, binds, clamped = _loop_reference(logp.tolist(), old.tolist(), ref.tolist(), adv.tolist(),
                                               mask.tolist(), 0.5, 0.04)
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    assert 0 < out.metrics["clip_frac"] < 1 and out.metrics["clip_frac"] == pytest.approx(binds)
    assert out.metrics["kl_clamp_frac"] == clamped == 0.0


@pytest.mark.numerics
def test_diffu_grpo_matches_loop_reference_with_clamped_kl_and_both_signs():
    """Random ratios far outside the clip range with advantages of both signs per row, and log-ratios
    to the reference up to ±60 (some beyond the ±20 clamp): loss, clip_frac and kl_clamp_frac equal
    the per-token loop; the loss and its gradient are finite."""
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.8
    ref = logp + torch.randn(4, 6, generator=g, dtype=torch.float64) * 30
    adv = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=g) > 0.2
    lp = logp.clone().requires_grad_()
    out = DiffuGRPO(clip_eps=0.2, beta=0.04)(lp, old, ref, adv, mask)
    expected, binds, clamped = _loop_reference(logp.tolist(), old.tolist(), ref.tolist(), adv.tolist(),
                                               mask.tolist(), 0.2, 0.04)
    assert 0 < clamped < 1 and 0 < binds < 1
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    # metrics are float32 shares (Objective.share): float32 resolution
    assert out.metrics["clip_frac"] == pytest.approx(binds, rel=1e-6)
    assert out.metrics["kl_clamp_frac"] == pytest.approx(clamped, rel=1e-6)
    out.loss.backward()
    assert torch.isfinite(lp.grad).all()


def test_clip_frac_counts_only_tokens_where_the_clip_binds():
    """ε = 0.5, six tokens by hand: (ρ, A) = (2, +1) binds, (2, −1) does not (the unclipped −2 is the
    min), (0.3, −1) binds, (0.3, +1) does not, (1.1, +1) is inside, (2, 0) has no advantage to clip.
    clip_frac = 2/6 (the old |ρ − 1| > ε count would give 5/6)."""
    rho = torch.tensor([[2.0, 2.0, 0.3, 0.3, 1.1, 2.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0, 0.0]])
    mask = torch.ones(1, 6, dtype=torch.bool)
    assert clip_binds(rho, adv, 0.5).tolist() == [[True, False, True, False, False, False]]
    old = torch.zeros(1, 6)
    out = DiffuGRPO(clip_eps=0.5, beta=0.0)(rho.log(), old, None, adv, mask)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 6)
    # exactly the tokens that get no policy gradient
    lp = rho.log().requires_grad_()
    DiffuGRPO(clip_eps=0.5, beta=0.0)(lp, old, None, adv, mask).loss.backward()
    assert (lp.grad[0] == 0).tolist() == [True, False, True, False, False, True]


def test_kl3_clamps_the_log_ratio_before_exp():
    """log π_ref − log π_θ = 100 overflows exp in float32 (inf); clamped to 20 it is e^20 − 21, with
    no gradient through the clamped token; inside the bound nothing changes."""
    lp = torch.tensor([-101.0, -1.0, 50.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.0, -1.5, -1.0, -1.0])
    assert KL_LOG_RATIO_BOUND == 20.0
    assert torch.isinf(torch.exp(ref - lp.detach())).any()  # the fault: unclamped, d = 100 is inf
    k = kl3(lp, ref)
    d_in = torch.tensor([-0.5, 1.0])
    expect = torch.tensor([math.exp(20) - 21, 0.0, math.exp(-20) + 19, 0.0])
    expect[[1, 3]] = torch.exp(d_in) - d_in - 1
    torch.testing.assert_close(k.detach(), expect)
    assert kl3_clamped(lp, ref).tolist() == [True, False, True, False]
    k.sum().backward()
    # d/dℓ of exp(d) − d − 1 with d = ℓ_ref − ℓ is 1 − exp(d); 0 where the clamp binds
    torch.testing.assert_close(lp.grad, torch.tensor([0.0, 1 - math.exp(-0.5), 0.0, 1 - math.e]))
    # bf16 stays finite too; NaN is not hidden
    assert torch.isfinite(kl3(lp.detach().bfloat16(), ref.bfloat16())).all()
    assert torch.isnan(kl3(torch.tensor([float("nan")]), torch.tensor([0.0]))).all()


def test_one_large_log_ratio_gives_a_finite_loss_and_the_clamp_share():
    """The reported case: one token with log π_ref − log π_θ = 100 among 4 valid ones."""
    lp = torch.tensor([[-101.0, -1.0, -1.0, -1.0, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    out = DiffuGRPO(clip_eps=0.5, beta=0.04)(lp, lp.detach(), ref, torch.ones(1, 5), mask)
    assert torch.isfinite(out.loss)
    assert out.metrics["kl"] == pytest.approx((math.exp(20) - 21) / 4, rel=1e-6)
    assert out.metrics["kl_clamp_frac"] == pytest.approx(0.25)
    out.loss.backward()
    assert torch.isfinite(lp.grad).all()


def test_diffu_grpo_hand_computed_single_token():
    # ρ = e^{0.2} ≈ 1.2214 (inside the clip range), A = 2: policy = -2ρ; ℓ_ref = ℓ: KL = 0
    lp, old = torch.tensor([[-1.0]]), torch.tensor([[-1.2]])
    out = DiffuGRPO(clip_eps=0.5, beta=0.04)(lp, old, lp.clone(), torch.tensor([[2.0]]), torch.ones(1, 1, dtype=torch.bool))
    assert out.loss.item() == pytest.approx(-2 * math.exp(0.2), rel=1e-6)
    # ρ = e^{1} ≈ 2.718 > 1.5 and A > 0: clipped to 1.5
    out = DiffuGRPO(clip_eps=0.5, beta=0.0)(torch.tensor([[0.0]]), torch.tensor([[-1.0]]), None,
                                             torch.tensor([[1.0]]), torch.ones(1, 1, dtype=torch.bool))
    assert out.loss.item() == pytest.approx(-1.5)
    # A < 0 and ρ > 1+ε: min picks the unclipped (more negative) term -> loss = -ρA = e
    out = DiffuGRPO(clip_eps=0.5, beta=0.0)(torch.tensor([[0.0]]), torch.tensor([[-1.0]]), None,
                                             torch.tensor([[-1.0]]), torch.ones(1, 1, dtype=torch.bool))
    assert out.loss.item() == pytest.approx(math.e, rel=1e-6)


def test_gradient_at_ratio_one_is_minus_advantage_token_mean():
    lp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    DiffuGRPO(beta=0.0)(lp, lp.detach(), None, adv, mask).loss.backward()
    torch.testing.assert_close(lp.grad, -adv * mask / 5)


def test_aggregate_modes_and_micro_batch_normalizer():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(x, m, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(x, m, "seq_mean").item() == pytest.approx((2 + 4) / 2)
    # two micro-batches with the global normaliser sum to the full-batch value
    parts = aggregate(x[:1], m[:1], "token_mean", 4.0) + aggregate(x[1:], m[1:], "token_mean", 4.0)
    assert parts.item() == pytest.approx(10 / 4)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(x, m, "sum")


def test_informative_groups_counts_groups_with_unequal_rewards():
    from maskrl.advantages import informative_groups

    r = torch.tensor([1.0, 1.0, 0.5, 0.5, 0.0, 0.2, 0.3, 0.3])
    g = torch.tensor([7, 7, 3, 3, 1, 1, 9, 9])  # groups 7 and 3 and 9 constant, group 1 varies
    assert informative_groups(r, g) == pytest.approx(0.25)
    assert informative_groups(r, torch.zeros(8, dtype=torch.long)) == 1.0
    # order of rows does not matter
    p = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    assert informative_groups(r[p], g[p]) == pytest.approx(0.25)
