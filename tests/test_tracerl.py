"""TraceRL's trajectory objective (issue 48 item 4): hand-computed values and a loop reference of the
loss as dLLM-RL's ``train/rl_trado.py`` states it (per-token clipped ratio at the trace states, k3 KL
to θ_old, sums over each sequence's tokens divided by the padded length, mean over sequences)."""
from __future__ import annotations

import math

import pytest
import torch

from maskrl.config import load_config
from maskrl.likelihood import State
from maskrl.objectives import OBJECTIVES, TraceRL


def loop_loss(logp, old, ref, adv, mask, eps, beta, kl_to="old"):
    """The slow, obvious reference, one token at a time in Python floats."""
    n, L = logp.shape
    policy = kl = 0.0
    for r in range(n):
        for i in range(L):
            if not mask[r, i]:
                continue
            d = float(logp[r, i] - old[r, i])
            rho = math.exp(d)
            a = float(adv[r, i])
            policy += min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a) / L
            target = float(old[r, i] if kl_to == "old" else ref[r, i])
            q = target - float(logp[r, i])
            kl += (math.exp(q) - q - 1.0) / L
    return -policy / n + beta * kl / n


@pytest.mark.numerics
def test_single_token_by_hand():
    """ρ = 1.5, A = 1, ε = 0.2: the clip binds, min(1.5, 1.2) = 1.2; L = 2 (one token counts), N = 1:
    policy −1.2/2 = −0.6; k3 of θ_old/θ = 1/1.5 + ln 1.5 − 1 = 0.0721318, times β/L = 0.01/2."""
    logp = torch.tensor([[math.log(1.5), 0.0]])
    old = torch.zeros(1, 2)
    out = TraceRL()(logp, old, None, torch.ones(1, 2), torch.tensor([[True, False]]))
    k3 = 1 / 1.5 + math.log(1.5) - 1
    assert k3 == pytest.approx(0.0721318, abs=1e-7)
    assert float(out.loss) == pytest.approx(-0.6 + 0.01 * k3 / 2, rel=4 * torch.finfo(torch.float32).eps)
    assert out.metrics["clip_frac"] == pytest.approx(0.5)  # 1 clipped token / L, over 1 sequence


@pytest.mark.numerics
@pytest.mark.parametrize("kl_to", ["old", "reference"])
def test_loss_equals_the_loop_reference(kl_to):
    g = torch.Generator().manual_seed(0)
    n, L = 4, 7
    logp = -torch.rand(n, L, generator=g) * 3
    old = logp + (torch.rand(n, L, generator=g) - 0.5)
    ref = logp + (torch.rand(n, L, generator=g) - 0.5)
    adv = torch.randn(n, 1, generator=g).expand(n, L)
    mask = torch.rand(n, L, generator=g) < 0.7
    obj = TraceRL(clip_eps=0.2, beta=0.05, kl_to=kl_to)
    got = float(obj(logp, old, ref if kl_to == "reference" else None, adv, mask).loss)
    want = loop_loss(logp, old, ref, adv, mask, 0.2, 0.05, kl_to)
    assert got == pytest.approx(want, rel=64 * torch.finfo(torch.float32).eps, abs=1e-7)


def test_gradient_at_theta_old_is_minus_advantage_over_length():
    """At θ = θ_old (μ = 1) ρ = 1 and the θ_old-KL has zero gradient: ∂L/∂ℓ_ni = −A_n / (L·N)."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]], requires_grad=True)
    adv = torch.tensor([[2.0] * 3, [-1.0] * 3])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    TraceRL()(logp, logp.detach(), None, adv, mask).loss.backward()
    want = torch.where(mask, -adv / (3 * 2), torch.zeros(()))
    assert torch.equal(logp.grad, want)


def test_reference_only_for_kl_to_reference():
    assert not TraceRL().needs_reference
    assert TraceRL(kl_to="reference").needs_reference
    assert not TraceRL(kl_to="reference", beta=0.0).needs_reference
    with pytest.raises(ValueError, match="needs logp_ref"):
        TraceRL(kl_to="reference")(torch.zeros(1, 2), torch.zeros(1, 2), None, torch.ones(1, 2),
                                   torch.ones(1, 2, dtype=torch.bool))


@pytest.mark.parametrize("field, value, match", [("kl_to", "ref", "kl_to"), ("aggregation", "sum", "aggregation"),
                                                 ("clip_eps", -0.1, "clip_eps"), ("beta", -1.0, "beta")])
def test_bad_fields_are_refused(field, value, match):
    with pytest.raises(ValueError, match=match):
        TraceRL(**{field: value})


def test_config_defaults_follow_dllm_rl_rl_trado():
    cfg = load_config([], ["objective={name: tracerl}"])
    assert cfg.objective == TraceRL(clip_eps=0.2, beta=0.01, kl_to="old", aggregation="length", normalize="mean_std")
    assert cfg.likelihood == State(p_mask_prompt=0.0)  # the trace states, clean prompt
    assert OBJECTIVES.get("tracerl") is TraceRL


def test_group_advantages_are_z_scores():
    adv = TraceRL().advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 0, 1, 1]))
    assert adv[:4].tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0])  # mean 0.5, population std 0.5
    assert adv[4:].tolist() == [0.0, 0.0]  # equal rewards: 0, as dLLM-RL's z_score_normalize
