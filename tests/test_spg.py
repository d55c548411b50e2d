"""Issue 11 item 1: SPG (SPEC §1.5) -- block-wise masking ELBO, the EUBO in log-sum-exp form, the
sandwiched loss; hand values, a loop reference, and a hostile batch that stays finite."""
from __future__ import annotations

import math

import pytest
import torch

from maskrl.likelihood import LIKELIHOODS, SPGBounds
from maskrl.likelihood.elbo import LOGP_FLOOR, block_layout, elbo, elbo_masks, eubo_tokens, gauss_legendre_unit
from maskrl.likelihood.mean_field import mask_prompt
from maskrl.text import encode_prompts
from maskrl.objectives import OBJECTIVES, SPG
from maskrl.sampling import SamplerConfig, generate


def _rollout(adapter, L=8, b=4):
    ids, mask = encode_prompts(adapter.tokenizer, ["ab", "a longer prompt", "c"])
    cfg = SamplerConfig(gen_length=L, block_length=b, steps=L, temperature=1.0)
    return generate(adapter, ids, mask, cfg, generator=torch.Generator().manual_seed(0))


def test_registered():
    assert OBJECTIVES.get("spg") is SPG and LIKELIHOODS.get("spg_bounds") is SPGBounds
    assert SPG().default_likelihood == "spg_bounds" and SPG().omega == 0.5 and SPGBounds().eubo_beta == 1.5
    assert SPGBounds().masking == "block"
    with pytest.raises(ValueError, match="omega"):
        SPG(omega=1.5)
    with pytest.raises(ValueError, match="eubo_beta"):
        SPGBounds(eubo_beta=0.0)


@pytest.mark.numerics
def test_eubo_hand_values():
    lp = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.1)])
    coef = torch.tensor([1.0, 2.0, 3.0])
    slot = torch.tensor([0, 0, 2])
    out = eubo_tokens(lp, coef, slot, 4, 1.5)
    want0 = math.log(1.0 * 0.5 ** 1.5 + 2.0 * 0.25 ** 1.5) / 1.5
    want2 = math.log(3.0 * 0.1 ** 1.5) / 1.5
    torch.testing.assert_close(out, torch.tensor([want0, 0.0, want2, 0.0]), rtol=1e-6, atol=1e-6)


def test_block_layout_and_masks():
    g = torch.Generator().manual_seed(3)
    scored, after = block_layout((5, 12), 2, 4, g)
    assert scored.shape == (2, 5, 12) and (scored.sum(-1) == 4).all()
    for d in range(2):
        for n in range(5):
            k = int(scored[d, n].nonzero()[0]) // 4
            assert scored[d, n, 4 * k: 4 * k + 4].all() and after[d, n, 4 * k + 4:].all() and not after[d, n, :4 * k + 4].any()
    m = elbo_masks((5, 12), 2, 2, True, torch.Generator().manual_seed(1), masking="block", block_length=4)
    assert m.shape == (2, 2, 5, 12)
    with pytest.raises(ValueError, match="block_length"):
        block_layout((2, 10), 1, 4, g)


def _loop_reference(adapter, ro, seed, nodes, draws, block_length, beta):
    """Slow obvious SPG bounds: the same masks, one full forward per (sequence, node, draw)."""
    g = torch.Generator().manual_seed(seed)
    n, L = ro.completion_ids.shape
    prompt = mask_prompt(ro.prompt_ids, ro.prompt_mask, adapter.mask_id, 0.0, g)
    scored_blk, after = block_layout((n, L), draws, block_length, g)
    inner = elbo_masks((n, L), nodes, draws, True, g, "cpu", "random")
    t, w = gauss_legendre_unit(nodes)
    nb = L // block_length
    el = torch.zeros(n, L, dtype=torch.float64)
    terms = [[[] for _ in range(L)] for _ in range(n)]
    for s in range(n):
        for j in range(nodes):
            for d in range(draws):
                score = inner[j, d, s] & scored_blk[d, s]
                hide = score | after[d, s]
                comp = torch.where(hide, adapter.mask_id, ro.completion_ids[s])
                x = torch.cat([prompt[s], comp])[None]
                attn = torch.cat([ro.prompt_mask[s], torch.ones(L, dtype=torch.bool)])[None]
                with torch.no_grad():
                    logits = adapter.logits(x, attn)[0, prompt.shape[1]:].double()
                lsm = torch.log_softmax(logits, -1)
                c = nb * w[j] / (draws * t[j])
                for i in range(L):
                    if score[i]:
                        lp = float(lsm[i, ro.completion_ids[s, i]])
                        el[s, i] += c * lp
                        terms[s][i].append(c * math.exp(beta * lp))
    eu = torch.tensor([[math.log(sum(v)) / beta if v else 0.0 for v in row] for row in terms], dtype=torch.float64)
    return el, eu


@pytest.mark.numerics
def test_spg_bounds_match_a_loop_reference(tiny):
    ro = _rollout(tiny)
    with torch.no_grad():
        out = elbo(tiny, ro, torch.Generator().manual_seed(7), nodes=2, draws=2, masking="block", block_length=4,
                   eubo_beta=1.5)
        est = SPGBounds(nodes=2, draws=2, block_length=4)(tiny, ro, torch.Generator().manual_seed(7))
    assert out.dtype == torch.complex64 and torch.equal(out, est)
    el, eu = _loop_reference(tiny, ro, 7, 2, 2, 4, 1.5)
    torch.testing.assert_close(out.real.double(), el, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.imag.double(), eu, rtol=1e-4, atol=1e-5)
    # a subset of positions gives the same values there (masks do not depend on `need`)
    need = torch.zeros_like(ro.completion_mask)
    need[:, ::3] = True
    with torch.no_grad():
        sub = SPGBounds(nodes=2, draws=2, block_length=4)(tiny, ro, torch.Generator().manual_seed(7), need)
    assert torch.equal(sub[need], out[need]) and (sub[~need] == 0).all()


def test_block_choice_is_uniform():
    """The block-wise estimate multiplies block k's terms by n_blocks; it is unbiased for the sum over
    blocks iff k is uniform: check the frequencies (3 blocks, 6000 draws, 5 sigma)."""
    scored, _ = block_layout((6000, 12), 1, 4, torch.Generator().manual_seed(0))
    k = scored[0].float().argmax(-1) // 4
    freq = torch.bincount(k, minlength=3).float() / 6000
    assert (freq - 1 / 3).abs().max() < 5 * math.sqrt((1 / 3) * (2 / 3) / 6000)


def test_spg_loss_hand_values():
    el = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]])
    eu = torch.tensor([[-0.4, -0.8], [-0.2, -0.6]])
    logp = torch.complex(el, eu).requires_grad_()
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[True, True], [True, False]])
    out = SPG(omega=0.25)(logp, None, None, adv, mask)
    seq0 = -(1.0 * -1.0 + 1.0 * -2.0) / 2  # A > 0: ELBO
    seq1 = -(-2.0 * (0.25 * -0.2 + 0.75 * -0.5)) / 1  # A <= 0: ω·EUBO + (1−ω)·ELBO, one valid token
    assert out.loss.item() == pytest.approx((seq0 + seq1) / 2, rel=1e-6)
    out.loss.backward()
    assert logp.grad is not None
    with pytest.raises(ValueError, match="spg_bounds"):
        SPG()(el, None, None, adv, mask)


def test_hostile_batch_stays_finite(tiny):
    """Collapse to one repeated token and log-probs of −inf / −1e38: the bounds, the loss and its
    gradient stay finite (log-sum-exp EUBO, floored log-probs)."""
    lp = torch.tensor([float("-inf"), -1e38, 0.0, -1e-30, -80.0], requires_grad=True)
    coef = torch.tensor([1e-6, 5.0, 1e3, 1.0, 1e-30])
    out = eubo_tokens(lp, coef, torch.tensor([0, 0, 1, 1, 2]), 3, 1.5)
    assert torch.isfinite(out).all() and out[0].item() == pytest.approx((LOGP_FLOOR * 1.5 + math.log(5.0)) / 1.5, rel=1e-5)
    out.sum().backward()
    assert torch.isfinite(lp.grad).all()
    with pytest.raises(ValueError, match="NaN"):
        eubo_tokens(torch.tensor([float("nan")]), torch.ones(1), torch.zeros(1, dtype=torch.long), 1, 1.5)
    # a saturated model (huge output weights): every completion is one repeated token and the other
    # tokens' log-probs are far below float32's exp range
    with torch.no_grad():
        for p in tiny.model.parameters():
            if p.dim() == 2 and p.shape[0] == tiny.model.config.vocab_size:
                p.mul_(1e4)
    ro = _rollout(tiny)
    assert (ro.completion_ids == ro.completion_ids[:, :1]).float().mean() > 0.5  # collapsed
    hostile = ro.completion_ids.clone()
    hostile[:, ::2] = (hostile[:, ::2] + 1) % tiny.model.config.vocab_size  # tokens the model gives p ≈ 0
    hostile[hostile == tiny.mask_id] = tiny.mask_id + 1
    import dataclasses
    ro = dataclasses.replace(ro, completion_ids=hostile)
    logp = SPGBounds(block_length=4)(tiny, ro, torch.Generator().manual_seed(0))
    assert torch.isfinite(logp.real).all() and torch.isfinite(logp.imag).all()
    adv = torch.tensor([1.0, -1.0, -1.0])[:, None].expand(3, 8)
    logp = logp.detach().requires_grad_()
    loss = SPG()(logp, None, None, adv, torch.ones(3, 8, dtype=torch.bool)).loss
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(torch.view_as_real(logp.grad)).all()


def test_spg_objective_rejects_nonfinite_bounds():
    el = torch.tensor([[-1.0, float("nan")]])
    with pytest.raises(ValueError, match=r"non-finite ELBO in rows \[0\]"):
        SPG()(torch.complex(el, el), None, None, torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool))
