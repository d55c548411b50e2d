"""Issue 11 item 1: SPG (docs/spec.md §1.5) -- block-wise masking ELBO, the EUBO in log-sum-exp form, the
sandwiched loss; hand values, a loop reference, and a hostile batch that stays finite. Issue 19
item 1: with blocks both bounds cover the whole completion (uniform-p model, hand case), and the
masking of SPG's released code (``spg_public``) against a sequence-level reference."""
from __future__ import annotations

import math

import pytest
import torch

from maskrl.likelihood import LIKELIHOODS, PerToken, SPGBounds
from maskrl.likelihood.elbo import (LOGP_FLOOR, block_layout, elbo_masks, eubo_tokens, gauss_legendre_unit,
                                    spg_bounds, spg_public_layout)
from maskrl.types import Rollout
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
    terms = [[[[] for _ in range(draws)] for _ in range(L)] for _ in range(n)]  # [seq][pos][draw]
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
                        terms[s][i][d].append(w[j] / t[j] * math.exp(beta * lp))
    # docs/spec.md §1.5: each draw's drawn-block log, scaled by n_blocks / D outside the log
    eu = torch.tensor([[sum(nb / draws * math.log(sum(v)) / beta for v in pos if v) for pos in row] for row in terms],
                      dtype=torch.float64)
    return el, eu


@pytest.mark.numerics
def test_spg_bounds_match_a_loop_reference(tiny):
    ro = _rollout(tiny)
    with torch.no_grad():
        out = spg_bounds(tiny, ro, torch.Generator().manual_seed(7), nodes=2, draws=2, masking="block",
                         block_length=4, eubo_beta=1.5)
        est = SPGBounds(nodes=2, draws=2, block_length=4)(tiny, ro, torch.Generator().manual_seed(7))
    assert isinstance(out, PerToken) and out.names == ("elbo", "eubo")
    assert all(out[k].dtype == torch.float32 and torch.equal(out[k], est[k]) for k in out.names)
    el, eu = _loop_reference(tiny, ro, 7, 2, 2, 4, 1.5)
    torch.testing.assert_close(out.elbo.double(), el, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.eubo.double(), eu, rtol=1e-4, atol=1e-5)
    # a subset of positions gives the same values there (masks do not depend on `need`)
    need = torch.zeros_like(ro.completion_mask)
    need[:, ::3] = True
    with torch.no_grad():
        sub = SPGBounds(nodes=2, draws=2, block_length=4)(tiny, ro, torch.Generator().manual_seed(7), need)
    for k in ("elbo", "eubo"):
        assert torch.equal(sub[k][need], out[k][need]) and (sub[k][~need] == 0).all()


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
    el.requires_grad_()
    logp = PerToken(elbo=el, eubo=eu)
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[True, True], [True, False]])
    out = SPG(omega=0.25)(logp, None, None, adv, mask)
    seq0 = -(1.0 * -1.0 + 1.0 * -2.0)  # A > 0: ELBO (token sum)
    seq1 = -(-2.0 * (0.25 * -0.2 + 0.75 * -0.5))  # A <= 0: ω·EUBO + (1−ω)·ELBO, one valid token
    assert out.loss.item() == pytest.approx((seq0 / 2 + seq1 / 1) / 2, rel=1e-6)  # seq_mean
    out.loss.backward()
    assert el.grad is not None
    # token_mean (SPG's released code): Σ_n −A_n·bound_n / Σ_n |o_n|
    tok = SPG(omega=0.25, aggregation="token_mean")(logp, None, None, adv, mask)
    assert tok.loss.item() == pytest.approx((seq0 + seq1) / 3, rel=1e-6)
    assert tok.metrics["neg_frac"] == pytest.approx(1 / 3) and out.metrics["neg_frac"] == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="aggregation"):
        SPG(aggregation="sum")
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
    assert torch.isfinite(logp.elbo).all() and torch.isfinite(logp.eubo).all()
    adv = torch.tensor([1.0, -1.0, -1.0])[:, None].expand(3, 8)
    el, eu = logp.elbo.detach().requires_grad_(), logp.eubo.detach().requires_grad_()
    loss = SPG()(PerToken(elbo=el, eubo=eu), None, None, adv, torch.ones(3, 8, dtype=torch.bool)).loss
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(el.grad).all() and torch.isfinite(eu.grad).all()


def test_spg_objective_rejects_nonfinite_bounds():
    el = torch.tensor([[-1.0, float("nan")]])
    with pytest.raises(ValueError, match=r"non-finite ELBO in rows \[0\]"):
        SPG()(PerToken(elbo=el, eubo=el), None, None, torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool))


# ------------------------------------------------------------- issue 19 item 1: bounds of every block
class ConstantModel:
    """A model whose every token has probability ``p`` wherever it is asked (``log_probs_at`` only,
    what :func:`maskrl.likelihood.base.score_positions` calls); counts its forwards."""

    mask_id = 99

    def __init__(self, p: float):
        self.lp, self.forwards = math.log(p), 0

    def log_probs_at(self, x, attn, rows, cols, targets):
        self.forwards += 1
        return torch.full(rows.shape, self.lp)


def _plain_rollout(n, L, valid=None):
    z = torch.zeros(n, L, dtype=torch.long)
    valid = torch.ones(n, L, dtype=torch.bool) if valid is None else valid
    return Rollout(prompt_ids=torch.ones(n, 3, dtype=torch.long), prompt_mask=torch.ones(n, 3, dtype=torch.bool),
                   completion_ids=z + 5, completion_mask=valid, commit_step=z, commit_prob=torch.ones(n, L),
                   num_steps=torch.ones(n, dtype=torch.long), group_ids=torch.arange(n))


@pytest.mark.parametrize("draws", [1, 2])
def test_both_bounds_cover_the_whole_completion_whatever_the_block_count(draws):
    """Every token has p = 1/V: the ELBO is −L·log V in expectation, and the EUBO's one-draw log
    estimate (coupled 2-node masks: each token hidden at exactly one node j, with probability t_j) is
    L·(−log V + (1/β) Σ_j t_j log(w_j/t_j)) -- for 1, 2, 4 and 8 blocks alike. Before the fix, 4 blocks
    gave 0.20× the one-block EUBO (the n_blocks factor sat inside the log). 5 standard errors of the
    mean over N sequences."""
    V, L, N, beta = 64, 16, 6000, 1.5
    t, w = gauss_legendre_unit(2)
    want_eubo = L * (-math.log(V) + sum(tj * math.log(wj / tj) for tj, wj in zip(t, w)) / beta)
    want_elbo = -L * math.log(V)
    ro = _plain_rollout(N, L)
    for nb in (1, 2, 4, 8):
        out = SPGBounds(draws=draws, block_length=L // nb, eubo_beta=beta)(ConstantModel(1 / V), ro,
                                                                           torch.Generator().manual_seed(nb))
        for got, want in ((out.elbo.sum(-1).double(), want_elbo), (out.eubo.sum(-1).double(), want_eubo)):
            se = got.std().item() / math.sqrt(N)
            # E[Σ] / its one-block value (the ratio) is 1 within 5 standard errors
            ratio = got.mean().item() / want
            assert abs(ratio - 1.0) < 5 * se / abs(want) + 1e-9, (nb, ratio, se)


def test_block_bounds_hand_case():
    """L = 4 in 2 blocks, one node (t = ½, w = 1), one draw, β = 2, p = ½ everywhere: a hidden token
    of the drawn block gets ELBO 2·(1/½)·log ½ = −4 log 2 and EUBO 2·(1/2)·log((1/½)·(½)²) = −log 2
    (the old code: (1/2)·log(2·(1/½)·(½)²) = 0); every other position 0."""
    ro = _plain_rollout(1, 4)
    seen = set()
    for seed in range(12):
        out = spg_bounds(ConstantModel(0.5), ro, torch.Generator().manual_seed(seed), nodes=1, draws=1,
                         block_length=2, eubo_beta=2.0)
        hit = out.elbo[0] != 0
        assert torch.equal(hit, out.eubo[0] != 0)
        if not hit.any():
            continue
        blocks = {int(i) // 2 for i in hit.nonzero().flatten()}
        assert len(blocks) == 1
        seen |= blocks
        torch.testing.assert_close(out.elbo[0][hit], torch.full((int(hit.sum()),), -4 * math.log(2)))
        torch.testing.assert_close(out.eubo[0][hit], torch.full((int(hit.sum()),), -math.log(2)))
    assert seen == {0, 1}


# ----------------------------------------------------------- masking: spg_public (SPG's released code)
def test_spg_public_layout_follows_spgs_code():
    """Per draw: distinct blocks (all valid); in block k between 1 and n_k hidden valid tokens,
    later positions and positions after the stop token hidden, earlier ones clean (p = 0)."""
    n, L, b, D = 400, 12, 4, 3
    valid = torch.ones(n, L, dtype=torch.bool)
    valid[: n // 2, 7:] = False  # half the rows stop at position 6: 2 blocks hold a valid token
    hide, ph, blocks = spg_public_layout(valid, torch.ones(n, 2, dtype=torch.bool), D, b, 0.0,
                                         torch.Generator().manual_seed(0))
    assert hide.shape == (D, n, L) and ph.shape == (D, n, 2) and blocks.shape == (D, n) and not ph.any()
    assert (blocks[:, : n // 2] < 2).all()  # rows stopping at 6 only draw blocks 0 and 1
    counts = torch.zeros(b + 1)
    for d in range(D):
        for s in range(n):
            h, v, k = hide[d, s], valid[s], int(blocks[d, s])
            assert h[~v].all()
            assert not h[: k * b].any() and h[(k + 1) * b:].all()
            n_k = int(v[k * b:(k + 1) * b].sum())
            m = int((h & v)[k * b:(k + 1) * b].sum())
            assert 1 <= m <= n_k
            if n_k == b:
                counts[m] += 1
    freq = counts[1:] / counts.sum()  # m ~ U{1..4} in full blocks
    assert (freq - 0.25).abs().max() < 5 * math.sqrt(0.25 * 0.75 / counts.sum())
    # full rows: the D blocks are distinct
    assert all(len(set(blocks[:, s].tolist())) == D for s in range(n // 2, n))


def test_spg_public_block_choice_and_perturbation():
    """SPG maps a uniform block index modulo the blocks holding a valid token (3 of 4 here: block 0
    twice as likely as 1 and 2); ``p_mask_prompt`` hides real prompt tokens and clean earlier
    completion tokens with that probability, nothing else (5 sigma)."""
    n, L, b = 6000, 16, 4
    valid = torch.ones(n, L, dtype=torch.bool)
    valid[:, 10:] = False
    pm = torch.ones(n, 5, dtype=torch.bool)
    pm[:, :2] = False  # left padding
    hide, ph, blocks = spg_public_layout(valid, pm, 1, b, 0.3, torch.Generator().manual_seed(1))
    blk = torch.arange(L) // b
    k = blocks[0]
    freq = torch.bincount(k, minlength=3).float() / n
    want = torch.tensor([0.5, 0.25, 0.25])
    assert ((freq - want).abs() < 5 * (want * (1 - want) / n).sqrt()).all()
    assert not ph[:, :, :2].any()
    rate = ph[0, :, 2:].float().mean().item()
    assert abs(rate - 0.3) < 5 * math.sqrt(0.21 / (3 * n))
    clean = (blk[None] < k[:, None]) & valid
    r = hide[0][clean].float().mean().item()
    assert abs(r - 0.3) < 5 * math.sqrt(0.21 / int(clean.sum()))


def _spg_sequence_reference(adapter, ro, hide, prompt_hide, beta):
    """SPG's sequence-level bounds from its description (``_get_per_seq_logps``), one full forward per
    (sequence, draw): ELBO = |o|·mean_d(mean over scored of log p); EUBO = |o|·mean over U of
    (1/β) log mean_d(p^β·1[scored]/t̂_d), t̂_d = S_d/|o|."""
    D, n, L = hide.shape
    el, eu = [], []
    for s in range(n):
        v = ro.completion_mask[s]
        length = int(v.sum())
        per_draw, avg = [], torch.zeros(L, dtype=torch.float64)
        for d in range(D):
            comp = torch.where(hide[d, s], adapter.mask_id, ro.completion_ids[s])
            prompt = torch.where(prompt_hide[d, s], adapter.mask_id, ro.prompt_ids[s])
            x = torch.cat([prompt, comp])[None]
            attn = torch.cat([ro.prompt_mask[s], torch.ones(L, dtype=torch.bool)])[None]
            with torch.no_grad():
                lsm = torch.log_softmax(adapter.logits(x, attn)[0, -L:].double(), -1)
            lp = lsm.gather(-1, ro.completion_ids[s][:, None])[:, 0]
            sc = hide[d, s] & v
            per_draw.append(lp[sc].mean().item())
            avg += torch.where(sc, lp.exp() ** beta / (int(sc.sum()) / length), 0.0) / D
        el.append(length * sum(per_draw) / D)
        u = avg > 0
        eu.append(length * (avg[u].log() / beta).mean().item())
    return torch.tensor(el, dtype=torch.float64), torch.tensor(eu, dtype=torch.float64)


def test_spg_public_matches_spgs_sequence_bounds(tiny):
    import dataclasses

    ro = _rollout(tiny, L=8, b=4)
    valid = torch.ones(3, 8, dtype=torch.bool)
    valid[1, 3:] = False  # a stop token at 2: one block holds valid tokens
    valid[2, 6:] = False
    ro = dataclasses.replace(ro, completion_mask=valid)
    est = SPGBounds(masking="spg_public", nodes=1, draws=2, p_mask_prompt=0.3, block_length=4)
    with torch.no_grad():
        out = est(tiny, ro, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    hide, ph, _ = spg_public_layout(ro.completion_mask, ro.prompt_mask, 2, 4, 0.3, g)
    el, eu = _spg_sequence_reference(tiny, ro, hide, ph, 1.5)
    torch.testing.assert_close(out.elbo.sum(-1).double(), el, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.eubo.sum(-1).double(), eu, rtol=1e-4, atol=1e-4)
    assert (out.elbo[~ro.completion_mask] == 0).all() and (out.eubo[~ro.completion_mask] == 0).all()
    assert int(est.rows(ro).sum()) == 2 * ro.batch_size
    need = torch.zeros_like(valid)
    need[:, 1::2] = True  # a subset: the same values there (coefficients count every scored token, not `need`)
    with torch.no_grad():
        sub = est(tiny, ro, torch.Generator().manual_seed(3), need)
    for k in ("elbo", "eubo"):
        torch.testing.assert_close(sub[k][need], out[k][need], rtol=1e-5, atol=1e-6)
        assert (sub[k][~need] == 0).all()


def test_spg_public_is_validated():
    with pytest.raises(ValueError, match="nodes"):
        SPGBounds(masking="spg_public")  # nodes 2 by default: SPG's code has no quadrature nodes
    with pytest.raises(ValueError, match="draws"):  # 3 distinct blocks of 2
        SPGBounds(masking="spg_public", nodes=1, draws=3, block_length=4)(ConstantModel(0.5), _plain_rollout(1, 8),
                                                                          torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="masking"):
        SPGBounds(masking="blocks")


def test_a_trainer_step_with_spgs_released_scheme(tmp_path):
    """The line for SPG's released code in docs/credit_methods.md builds and trains: spg_public masking
    (2 distinct blocks of 2, clean-token perturbation) and length-weighted (token_mean) aggregation."""
    from conftest import OddChars, fresh_tiny, small_cfg
    from maskrl.tasks.base import Example
    from maskrl.trainer import RLTrainer

    cfg = small_cfg(tmp_path, **{"objective.name": "spg", "objective.aggregation": "token_mean",
                                 "likelihood.masking": "spg_public", "likelihood.nodes": 1, "likelihood.draws": 2,
                                 "likelihood.p_mask_prompt": 0.15})
    assert isinstance(cfg.likelihood, SPGBounds) and cfg.likelihood.masking == "spg_public"
    a = fresh_tiny()
    w0 = [p.detach().clone() for p in a.model.parameters()]
    m = RLTrainer(cfg, a, OddChars(), [Example(id=i, prompt=f"say {i}") for i in range(4)]).step()
    assert all(math.isfinite(m[k]) for k in ("base/policy_loss", "base/elbo", "base/eubo"))
    assert any(not torch.equal(p, q) for p, q in zip(w0, a.model.parameters()))
