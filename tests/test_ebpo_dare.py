"""EBPO against DARE, the open implementation of the LLaDA2.x family (yjyddq/DARE 83ae8a3; docs/spec.md §1.5).

``tests/data/dare_ebpo_reference.json`` was recorded by ``benchmarks/references/dare_ebpo_reference.py``,
which runs DARE's own ``EBPOActorMixin.update_policy`` (on a stand-in actor whose per-(draw, token) ELBO
contributions are a leaf tensor θ) and its ``_forward_process_ebpo``. Here:

- the EBPO loss and its gradient on θ equal DARE's logged loss and the gradient DARE's update left on θ;
- the ``block_elbo`` masks, given DARE's stratification offset, hide per (draw, block) exactly DARE's
  counts with DARE's rates p (the positions differ: each code draws its own permutation);
- the ``block_elbo`` values equal a slow loop over (sequence, draw, hidden token), each one plain
  block-causal forward of the clean earlier blocks and its block as the draw leaves it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from maskrl.advantages import group_advantages
from maskrl.config import load_config
from maskrl.likelihood import LIKELIHOODS, BlockELBO, block_elbo_masks
from maskrl.models import build_tiny
from maskrl.models.adapter import token_log_probs
from maskrl.objectives import EBPO
from test_likelihood_blocks import batch, close, loop_log_prob, rollout, tiny_block

DATA = json.loads((Path(__file__).parent / "data" / "dare_ebpo_reference.json").read_text())
EPS64, EPS32 = torch.finfo(torch.float64).eps, torch.finfo(torch.float32).eps


def _eps(case) -> float:
    """float64's eps, or float32's where DARE rounds to float32 on the way: ``_masked_sequence_mean`` of the
    per-token advantages and the reference's ELBO (``.float()`` in ``ebpo_actor_mixin.py``)."""
    return EPS32 if case["name"] != "sequence_advantages" else EPS64


def _ebpo_inputs(case):
    theta = torch.tensor(case["theta"], dtype=torch.float64, requires_grad=True)  # [B, D, R]
    valid = torch.tensor(case["valid"])
    draws = theta.shape[1]
    per_token = lambda x: (x * valid[:, None]).sum(1) / draws  # noqa: E731  ℓ_i = (1/D) Σ_d θ[n, d, i]
    adv = torch.tensor(case["advantages"], dtype=torch.float64)
    adv = adv[:, None].expand(valid.shape) if adv.dim() == 1 else adv
    old = torch.tensor(case["old"], dtype=torch.float64)
    ref = torch.tensor(case["ref"], dtype=torch.float64)
    return theta, per_token(theta), per_token(old), per_token(ref), adv, valid


def _objective(case, **kw):
    c = case["config"]
    return EBPO(clip_eps=c["clip_ratio_low"], clip_eps_high=c["clip_ratio_high"],
                beta=c["kl_loss_coef"] if c["use_kl_loss"] else 0.0, **kw)


@pytest.mark.numerics
@pytest.mark.parametrize("case", DATA["loss_cases"], ids=[c["name"] for c in DATA["loss_cases"]])
def test_loss_and_gradient_equal_dares_update(case):
    theta, logp, old, ref, adv, valid = _ebpo_inputs(case)
    out = _objective(case)(logp, old, ref, adv, valid)
    out.loss.backward()
    want_grad = torch.tensor(case["grad"], dtype=torch.float64)
    eps = _eps(case)
    assert abs(float(out.loss.detach()) - case["loss"]) <= 64 * eps * max(1.0, abs(case["loss"]))
    assert float((theta.grad - want_grad).abs().max()) <= 64 * eps * max(1.0, float(want_grad.abs().max()))
    assert float(want_grad.abs().max()) > 0.01  # a gradient, not zeros
    if case["config"]["use_kl_loss"]:
        assert out.metrics["kl"] == pytest.approx(case["kl_loss"], rel=64 * eps)


@pytest.mark.numerics
def test_the_per_token_min_is_not_dares_on_credit_advantages():
    """``advantage_mean: inside`` (GDPO's min per token) differs from DARE where the clip binds: the switch
    matters, and the default is DARE's."""
    case = next(c for c in DATA["loss_cases"] if c["name"] == "token_advantages")
    _, logp, old, ref, adv, valid = _ebpo_inputs(case)
    inside = _objective(case, advantage_mean="inside")(logp.detach(), old, ref, adv, valid)
    assert abs(float(inside.loss) - case["loss"]) > 1e-3


@pytest.mark.parametrize("k", range(len(DATA["mask_cases"])))
def test_masks_hide_dares_counts_with_dares_rates(k):
    case = DATA["mask_cases"][k]
    prompt_mask = torch.tensor(case["prompt_mask"])[None]
    valid = torch.tensor(case["valid"])[None]
    want_hide, want_rate = torch.tensor(case["hide"]), torch.tensor(case["rate"])  # [D, L]
    block = case["block_length"]
    for seed in range(3):  # the positions vary with the generator, the counts and rates do not
        hide, rate, blk = block_elbo_masks(prompt_mask, valid, case["draws"], block, torch.Generator().manual_seed(seed),
                                           offset=torch.tensor([case["offset"]]))
        hide, rate, blk = hide[0], rate[0], blk[0]
        assert not (hide & ~valid).any()
        for b in range(int(blk.max()) + 1):
            in_b = blk == b
            assert torch.equal(hide[:, in_b].sum(-1), want_hide[:, in_b].sum(-1)), (seed, b)
            for d in range(case["draws"]):  # one rate per (draw, block): k/n_b, DARE's p_mask
                assert torch.equal(rate[d][hide[d] & in_b], want_rate[d][want_hide[d] & in_b]), (seed, b, d)


@pytest.mark.numerics
@pytest.mark.parametrize("drop_after_stop", [True, False])
def test_block_elbo_equals_the_per_token_loop(drop_after_stop):
    a = tiny_block()
    prompt, mask, clean = batch()
    ro = rollout(prompt, mask, clean)
    valid = torch.ones_like(clean, dtype=torch.bool)
    valid[0, 6:] = False  # completions that stop early: 6 and 9 valid tokens of 10
    valid[2, 9:] = False
    ro = type(ro)(**{**ro.__dict__, "completion_mask": valid})
    est = BlockELBO(draws=3, drop_after_stop=drop_after_stop)
    with torch.no_grad():
        got = est(a, ro, torch.Generator().manual_seed(5))
        hide, rate, _ = block_elbo_masks(mask, valid, 3, a.block_size, torch.Generator().manual_seed(5))
        want = torch.zeros(clean.shape)
        for n, d, i in hide.nonzero().tolist():
            keep = int(valid[n].sum()) if drop_after_stop else clean.shape[1]
            noisy = torch.where(hide[n, d], a.mask_id, clean[n])
            logits = loop_log_prob(a, prompt[n][mask[n]], clean[n][:keep], noisy[:keep], i)
            want[n, i] += float(token_log_probs(logits, clean[n, i])) / float(rate[n, d, i]) / 3
    assert (got[~valid] == 0).all() and (got[valid] < 0).all()
    close(got, want, 256.0)


def test_block_elbo_refuses_a_full_attention_model():
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1)
    prompt, mask, clean = batch()
    with pytest.raises(ValueError, match="block_elbo.*elbo"):
        BlockELBO()(a, rollout(prompt, mask, clean), torch.Generator().manual_seed(0))


def test_grpo_advantages_by_hand():
    """verl's GRPO z-score: rewards (1, 0, 0, 1, 1): mean 0.6, Bessel std √0.3; a group of one: r / (1 + 1e-6)."""
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 2.0])
    a = group_advantages(r, torch.tensor([0, 0, 0, 0, 0, 1]), "mean_std_unbiased")
    std = 0.3 ** 0.5
    want = torch.tensor([0.4 / (std + 1e-6), -0.6 / (std + 1e-6), -0.6 / (std + 1e-6), 0.4 / (std + 1e-6),
                         0.4 / (std + 1e-6), 2.0 / (1 + 1e-6)])
    torch.testing.assert_close(a, want, rtol=4 * torch.finfo(torch.float32).eps, atol=0)


def test_defaults_follow_dare():
    obj = EBPO()
    assert (obj.clip_range(), obj.ratio_norm, obj.advantage_mean, obj.beta, obj.normalize) == (
        (0.2, 0.2), "none", "outside", 0.0, "mean_std_unbiased")
    assert obj.default_likelihood == "block_elbo" and LIKELIHOODS.get("block_elbo") is BlockELBO
    assert BlockELBO() == BlockELBO(draws=16, stratified=True, drop_after_stop=True)  # DARE's mc_num = n_l = 16
    assert type(load_config([], ["objective={name: ebpo}", "model.tiny.block_size=4"]).likelihood) is BlockELBO
    with pytest.raises(ValueError, match="advantage_mean"):
        EBPO(advantage_mean="tokens")
    with pytest.raises(ValueError, match="draws"):
        BlockELBO(draws=0)
