"""Likelihoods of block-diffusion models (issue 48 item 3): the doubled x_t ⊕ x_0 forward against one
forward per block, and every estimator (ELBO, mean-field, SML, state) against slow references that
build each token's context by hand (clean earlier blocks, its own block as the estimator leaves it)
and run the plain block-causal forward on the prefix up to the end of that block."""
from __future__ import annotations

import pytest
import torch

from maskrl.likelihood import ELBO, MeanField, State, Stratified, gauss_legendre_unit
from maskrl.likelihood.blocks import block_rounds, doubled_block_mask, score_blocks
from maskrl.likelihood.elbo import elbo_masks
from maskrl.models import build_tiny
from maskrl.models.adapter import token_log_probs
from maskrl.types import Rollout

EPS = torch.finfo(torch.float32).eps
BS = 4


def tiny_block(block_size: int = BS):
    return build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, block_size=block_size, seed=1)


def batch(lengths=(7, 4, 9), L=10, seed=0):
    """Left-padded prompts of the given real lengths (not multiples of the block size) and completions."""
    g = torch.Generator().manual_seed(seed)
    n, p = len(lengths), max(lengths)
    prompt = torch.zeros((n, p), dtype=torch.long)
    mask = torch.zeros((n, p), dtype=torch.bool)
    for r, k in enumerate(lengths):
        prompt[r, p - k:] = torch.randint(10, 60, (k,), generator=g)
        mask[r, p - k:] = True
    completion = torch.randint(10, 60, (n, L), generator=g)
    return prompt, mask, completion


def rollout(prompt, mask, completion, commit_step=None):
    n, L = completion.shape
    cs = commit_step if commit_step is not None else torch.arange(L).expand(n, L).clone()
    return Rollout(prompt_ids=prompt, prompt_mask=mask, completion_ids=completion,
                   completion_mask=torch.ones((n, L), dtype=torch.bool), commit_step=cs,
                   commit_prob=torch.ones((n, L)), num_steps=cs.max(-1).values + 1, group_ids=torch.arange(n))


def loop_log_prob(adapter, prompt_row, completion_ctx, completion_noisy, i):
    """Slow reference, one row (no padding): ``log p(completion_noisy... | ...)`` of the token
    ``completion_ctx``'s twin at completion position i -- one plain block-causal forward over the
    context copy's blocks before i's block, then i's block from the noisy copy, nothing after it."""
    bs = adapter.block_size
    p = prompt_row.numel()
    b = (p + i) // bs
    start, end = b * bs, min((b + 1) * bs, p + completion_ctx.numel())
    ctx = torch.cat([prompt_row, completion_ctx])
    noisy = torch.cat([prompt_row, completion_noisy])
    x = torch.cat([ctx[:start], noisy[start:end]])[None]
    return adapter.logits(x)[0, p + i].float()


def reference(adapter, prompt, mask, ctx, noisy, targets, rows, cols):
    """``[M]`` log-probs of ``targets`` at ``(rows, cols)``, one row at a time, left padding stripped."""
    out = []
    for r, i, t in zip(rows.tolist(), cols.tolist(), targets.tolist()):
        pr = prompt[r][mask[r]]
        logits = loop_log_prob(adapter, pr, ctx[r], noisy[r], i)
        out.append(token_log_probs(logits, torch.tensor(t)))
    return torch.stack(out)


def close(got, ref, factor=64.0):
    scale = max(1.0, float(ref.abs().max()))
    tol = factor * EPS * scale
    err = float((got - ref).abs().max())
    assert err <= tol, f"max error {err:.3g} > {tol:.3g}"


# ------------------------------------------------------------------------------------ the mask
def _pairwise(pos, noisy, valid, bs):
    n, t = pos.shape
    out = torch.zeros((n, t, t), dtype=torch.bool)
    for r in range(n):
        for q in range(t):
            for k in range(t):
                bq, bk = int(pos[r, q]) // bs, int(pos[r, k]) // bs
                if not valid[r, k]:
                    continue
                if noisy[r, q] and noisy[r, k]:
                    out[r, q, k] = bq == bk
                elif noisy[r, q]:
                    out[r, q, k] = bk < bq
                elif not noisy[r, k]:
                    out[r, q, k] = bk <= bq
    return out


@pytest.mark.parametrize("bs", [1, 3, 4])
def test_doubled_mask_equals_the_pairwise_rule(bs):
    g = torch.Generator().manual_seed(bs)
    pos = torch.randint(0, 12, (3, 14), generator=g)
    noisy = torch.rand((3, 14), generator=g) < 0.5
    valid = torch.rand((3, 14), generator=g) < 0.8
    got = doubled_block_mask(pos, noisy, valid, bs, torch.float32)[:, 0] == 0
    assert torch.equal(got, _pairwise(pos, noisy, valid, bs))


def test_doubled_mask_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="equal"):
        doubled_block_mask(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool),
                           torch.zeros(2, 3, dtype=torch.bool), 4, torch.float32)


# ------------------------------------------------------------------------------------ the forward
@pytest.mark.numerics
@pytest.mark.parametrize("bs", [1, 4, 5])
def test_one_doubled_forward_equals_one_forward_per_block(bs):
    a = tiny_block(bs)
    prompt, mask, clean = batch()
    g = torch.Generator().manual_seed(7)
    noisy = torch.where(torch.rand(clean.shape, generator=g) < 0.5, a.mask_id, clean)
    rows, cols = (noisy == a.mask_id).nonzero(as_tuple=True)
    targets = clean[rows, cols]
    with torch.no_grad():
        got = score_blocks(a, prompt, mask, noisy, clean, rows, cols, targets)
        ref = reference(a, prompt, mask, clean, noisy, targets, rows, cols)
        close(got, ref)
        for r in range(prompt.shape[0]):  # batch of one (its own padding) vs the batch
            keep = rows == r
            one = score_blocks(a, prompt[r:r + 1], mask[r:r + 1], noisy[r:r + 1], clean[r:r + 1],
                               torch.zeros_like(rows[keep]), cols[keep], targets[keep])
            close(one, got[keep])


@pytest.mark.numerics
def test_noisy_tokens_do_not_see_earlier_blocks_noise():
    """The point of the doubled forward: hiding a token of an earlier block in the noisy copy changes
    nothing for a later block (it reads the context copy), while the plain forward would see it."""
    a = tiny_block()
    prompt, mask, clean = batch(lengths=(4,), L=8)
    noisy = clean.clone()
    noisy[0, 6] = a.mask_id  # block 2 (positions 8..11 -> completion 4..7)
    rows, cols, tg = torch.tensor([0]), torch.tensor([6]), clean[0, 6:7]
    with torch.no_grad():
        base = score_blocks(a, prompt, mask, noisy, clean, rows, cols, tg)
        noisier = noisy.clone()
        noisier[0, 1] = a.mask_id  # an earlier block's token hidden in the noisy copy only
        assert float((score_blocks(a, prompt, mask, noisier, clean, rows, cols, tg) - base).abs()) == 0.0
        ctx = clean.clone()
        ctx[0, 1] = a.mask_id  # ... but the context copy is read
        assert float((score_blocks(a, prompt, mask, noisy, ctx, rows, cols, tg) - base).abs()) > 1e-4


# ------------------------------------------------------------------------------------ estimators
@pytest.mark.numerics
def test_block_elbo_equals_the_per_block_loop():
    a = tiny_block()
    prompt, mask, clean = batch()
    ro = rollout(prompt, mask, clean)
    nodes, draws = 2, 2
    with torch.no_grad():
        got = ELBO(nodes=nodes, draws=draws)(a, ro, torch.Generator().manual_seed(3))
        hide = elbo_masks(clean.shape, nodes, draws, True, torch.Generator().manual_seed(3))  # [J, D, N, L]
        t, w = gauss_legendre_unit(nodes)
        ref = torch.zeros(clean.shape)
        for j in range(nodes):
            for d in range(draws):
                noisy = torch.where(hide[j, d], a.mask_id, clean)
                rows, cols = hide[j, d].nonzero(as_tuple=True)
                lp = reference(a, prompt, mask, clean, noisy, clean[rows, cols], rows, cols)
                ref.index_put_((rows, cols), lp * (w[j] / t[j] / draws), accumulate=True)
    close(got, ref, 256.0)


@pytest.mark.numerics
def test_block_mean_field_scores_each_block_masked_after_clean_blocks():
    a = tiny_block()
    prompt, mask, clean = batch()
    ro = rollout(prompt, mask, clean)
    with torch.no_grad():
        got = MeanField(p_mask_prompt=0.0)(a, ro, None)
        rows, cols = torch.ones_like(clean, dtype=torch.bool).nonzero(as_tuple=True)
        ref = reference(a, prompt, mask, clean, torch.full_like(clean, a.mask_id), clean[rows, cols], rows, cols)
    close(got[rows, cols], ref)


@pytest.mark.numerics
def test_block_sml_scores_each_stratum_after_clean_blocks():
    a = tiny_block()
    prompt, mask, clean = batch()
    ro = rollout(prompt, mask, clean)
    k = 3
    with torch.no_grad():
        got = Stratified(k=k, layout="stride", full=0.25, sml=1.0, p_mask_prompt=0.0)(a, ro, None)
        ref = torch.zeros(clean.shape)
        rows, cols = torch.ones_like(clean, dtype=torch.bool).nonzero(as_tuple=True)
        full = reference(a, prompt, mask, clean, torch.full_like(clean, a.mask_id), clean[rows, cols], rows, cols)
        ref.index_put_((rows, cols), 0.25 * full, accumulate=True)
        for s in range(k):
            hide = (torch.arange(clean.shape[1]) % k == s).expand_as(clean)
            r, c = hide.nonzero(as_tuple=True)
            lp = reference(a, prompt, mask, clean, torch.where(hide, a.mask_id, clean), clean[r, c], r, c)
            ref.index_put_((r, c), lp, accumulate=True)
    close(got, ref, 256.0)


def block_ordered_steps(mask, L, bs, seed=0):
    """Commit steps of a block-by-block decode: each model block (shared prompt block included) gets
    1..3 steps of its own, after every step of the block before."""
    g = torch.Generator().manual_seed(seed)
    n = mask.shape[0]
    cs = torch.zeros((n, L), dtype=torch.long)
    for r in range(n):
        p = int(mask[r].sum())
        blk = (p + torch.arange(L)) // bs
        step = 0
        for b in blk.unique().tolist():
            cols = (blk == b).nonzero()[:, 0]
            k = int(torch.randint(1, 4, (1,), generator=g))
            cs[r, cols] = step + torch.randint(0, k, (cols.numel(),), generator=g)
            step = int(cs[r, cols].max()) + 1
    return cs


def state_reference(a, prompt, mask, clean, cs):
    """Each token at its recorded state x_t (positions with commit_step >= t masked), through the plain
    block-causal forward of the prefix up to the end of its block."""
    out = torch.zeros(clean.shape)
    for r in range(clean.shape[0]):
        for i in range(clean.shape[1]):
            x_t = torch.where(cs[r] >= cs[r, i], a.mask_id, clean[r])
            out[r, i] = reference(a, prompt[r:r + 1], mask[r:r + 1], x_t[None], x_t[None], clean[r:r + 1, i],
                                  torch.tensor([0]), torch.tensor([i]))[0]
    return out


@pytest.mark.numerics
@pytest.mark.parametrize("ordered", [True, False, "mixed"])
def test_block_state_scores_each_token_where_the_model_saw_it(ordered):
    a = tiny_block()
    prompt, mask, clean = batch()
    L = clean.shape[1]
    reverse = torch.arange(L - 1, -1, -1).expand(clean.shape[0], L).clone()  # earlier blocks still masked
    cs = block_ordered_steps(mask, L, BS) if ordered else reverse
    if ordered == "mixed":  # one forward holds rounds of ordered rows and states of the other
        cs[1] = reverse[1]
    ro = rollout(prompt, mask, clean, cs)
    expect = [True, False, True] if ordered == "mixed" else [bool(ordered)] * 3
    assert block_rounds(cs, mask, BS)[0].tolist() == expect
    seen = []
    hook = a.model.register_forward_pre_hook(lambda _m, args, kw: seen.append(kw["input_ids"].shape), with_kwargs=True)
    with torch.no_grad():
        got = State(p_mask_prompt=0.0)(a, ro, None)
    hook.remove()
    with torch.no_grad():
        ref = state_reference(a, prompt, mask, clean, cs)
    close(got, ref, 256.0)
    rows = seen[0][0]
    if ordered is True:  # TraceRL's rounds: one row per within-block step, every block at once
        _, rank = block_rounds(cs, mask, BS)
        assert rows == int((rank.max(-1).values + 1).sum())
        assert rows < int(State().rows(ro).sum())
    elif ordered == "mixed":
        _, rank = block_rounds(cs, mask, BS)
        assert rows == int(rank[0].max() + rank[2].max() + 2) + int(cs[1].unique().numel())
    else:
        assert rows == int(State().rows(ro).sum()) and seen[0][1] == prompt.shape[1] + L  # plain forward


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["mean_field", "elbo", "stratified", "state"])
def test_a_subset_of_positions_changes_nothing_on_a_block_model(name):
    from maskrl.likelihood import LIKELIHOODS

    a = tiny_block()
    prompt, mask, clean = batch()
    ro = rollout(prompt, mask, clean, block_ordered_steps(mask, clean.shape[1], BS))
    est = LIKELIHOODS.get(name)()
    need = torch.rand(clean.shape, generator=torch.Generator().manual_seed(2)) < 0.4
    with torch.no_grad():
        full = est(a, ro, torch.Generator().manual_seed(9))
        part = est(a, ro, torch.Generator().manual_seed(9), need)
    assert bool((part[~need] == 0).all())
    close(part[need], full[need])


def test_block_rounds_by_hand():
    mask = torch.tensor([[False, True, True]])  # P_n = 2: blocks of 4 are positions 0-3 (completion 0, 1), 4-7
    cs = torch.tensor([[1, 0, 2, 2, 3, 4]])
    ordered, rank = block_rounds(cs, mask, 4)
    assert ordered.tolist() == [True]
    assert rank.tolist() == [[1, 0, 0, 0, 1, 2]]
    assert block_rounds(torch.tensor([[1, 0, 2, 1, 3, 4]]), mask, 4)[0].tolist() == [False]


def test_spg_public_is_refused_on_a_block_model():
    a = tiny_block()
    prompt, mask, clean = batch(L=8)
    with pytest.raises(ValueError, match="spg_public"):
        ELBO(nodes=1, draws=1, masking="spg_public", block_length=4)(a, rollout(prompt, mask, clean), None)
