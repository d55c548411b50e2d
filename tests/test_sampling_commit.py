"""The sampler's commit rule and forward plan as pure functions (maskrl.sampling.commit / .cache,
docs/spec.md §1.2), against hand-computed values and slow references; DiSPO's fillings draw with the same
Gumbel-max function as the sampler."""
import math

import pytest
import torch

from maskrl.credit.dispo import draw_fillings
from maskrl.sampling import (SamplerConfig, cached_forward_counts, commit_scores, gumbel_max, plan_forwards, propose,
                             rank_positions, select_fixed, select_threshold)


def test_gumbel_max_is_argmax_of_logits_over_tau_plus_gumbel_noise_in_float64():
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0))
    tau = 0.7
    u = torch.rand(logits.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)  # the same stream
    got = gumbel_max(logits, tau, torch.Generator().manual_seed(4))
    for i in range(3):
        for j in range(5):
            scores = [float(logits[i, j, v]) / tau - math.log(-math.log(float(u[i, j, v]))) for v in range(11)]
            assert int(got[i, j]) == max(range(11), key=scores.__getitem__)
    assert torch.equal(gumbel_max(logits, 0.0, None), logits.argmax(-1))  # tau 0: argmax, nothing drawn
    g = torch.Generator().manual_seed(4)
    gumbel_max(logits, 0.0, g)
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(4).get_state())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_the_in_place_draw_equals_the_out_of_place_formula_and_leaves_the_logits(dtype, tau):
    """The draw runs in place on two float64 buffers; its candidates are those of the out-of-place
    ``argmax(logits.double() / τ - log(-log u))`` (the same stream), and float64 logits are not written."""
    logits = (3 * torch.randn(6, 32, 257, generator=torch.Generator().manual_seed(1))).to(dtype)
    logits[:, :, 5] = float("-inf")  # a removed id (candidate_logits)
    before = logits.clone()
    u = torch.rand(logits.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    want = (logits.double() / tau - torch.log(-torch.log(u))).argmax(-1)
    g = torch.Generator().manual_seed(9)
    assert torch.equal(gumbel_max(logits, tau, g), want)
    assert torch.equal(logits, before)
    same = torch.Generator().manual_seed(9)
    torch.rand(logits.shape, generator=same, dtype=torch.float64)
    assert torch.equal(g.get_state(), same.get_state())  # the stream advanced by exactly the uniforms


def test_the_in_place_draw_holds_two_float64_buffers_at_most():
    """Memory of one draw: the uniforms and one float64 copy of the logits (the out-of-place formula
    held four or more ``[..., V]`` float64 tensors at its peak)."""
    from maskrl.plan import profiled_peak

    logits = torch.randn(4, 32, 4096, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    peak, _ = profiled_peak(lambda: gumbel_max(logits, 0.9, g))
    one = logits.numel() * 8
    assert peak <= 2 * one + 64 * 1024


@pytest.mark.numerics
def test_propose_confidence_is_the_noise_free_probability_of_the_candidate():
    logits = torch.tensor([[[0.0, math.log(3.0), float("-inf")]]])  # softmax (1/4, 3/4, 0)
    tok, prob = propose(logits, 0.0, None)
    assert tok.tolist() == [[1]] and math.isclose(prob.item(), 0.75, rel_tol=1e-6)
    tok, prob = propose(logits, 5.0, torch.Generator().manual_seed(1))  # hot: whichever is drawn, p is untempered
    assert math.isclose(prob.item(), [0.25, 0.75][tok.item()], rel_tol=1e-6)  # float32 softmax


def test_rank_and_selection_by_hand():
    prob = torch.tensor([[0.2, 0.9, 0.5, 0.95]])
    eligible = torch.tensor([[True, True, True, False]])
    score = commit_scores(prob, eligible, "low_confidence", None)
    assert score[0, 3] == float("-inf")
    rank = rank_positions(score)
    assert rank.tolist() == [[2, 0, 1, 3]]
    assert select_fixed(rank, torch.tensor([2]), eligible).tolist() == [[False, True, True, False]]
    # threshold 0.4: the top-ranked one plus every eligible one with c >= 0.4 (0.95 is not eligible)
    assert select_threshold(rank, prob, 0.4, eligible).tolist() == [[False, True, True, False]]
    assert select_threshold(rank, prob, 0.99, eligible).tolist() == [[False, True, False, False]]
    # a confidence equal to the threshold: committed by >= (LLaDA's), not by Fast-dLLM v2's strict >
    assert select_threshold(rank, prob, 0.5, eligible).tolist() == [[False, True, True, False]]
    assert select_threshold(rank, prob, 0.5, eligible, strict=True).tolist() == [[False, True, False, False]]
    ones, all_ = torch.tensor([[1.0, 1.0, 1.0]]), torch.ones(1, 3, dtype=torch.bool)
    top = rank_positions(commit_scores(ones, all_, "low_confidence", None))
    assert select_threshold(top, ones, 1.0, all_).tolist() == [[True, True, True]]
    assert select_threshold(top, ones, 1.0, all_, strict=True).tolist() == [[True, False, False]]
    # ties keep the left-to-right order
    assert rank_positions(torch.tensor([[0.5, 0.5, 0.5]])).tolist() == [[0, 1, 2]]


def test_stop_candidates_rank_after_every_other_candidate():
    prob = torch.tensor([[0.99, 0.1, 0.3]])
    stop = torch.tensor([[True, False, False]])
    eligible = torch.ones_like(stop)
    assert rank_positions(commit_scores(prob, eligible, "low_confidence", None, stop)).tolist() == [[2, 1, 0]]
    rnd = commit_scores(prob, eligible, "random", torch.Generator().manual_seed(0), stop)
    assert rank_positions(rnd)[0, 0] == 2


def test_forward_plan_by_hand():
    start = torch.tensor([0, 4, 4, 8])
    refresh = torch.tensor([True, False, False, False])
    L, b = 16, 4
    dual = plan_forwards("dual", b, refresh, start, L)
    assert [(f.rows.tolist(), f.window) for f in dual.forwards] == [([0], False), ([1, 2, 3], True)]
    assert dual.lo.tolist() == [0, 4, 4, 8] and dual.hi.tolist() == [16, 8, 8, 12]
    prefix = plan_forwards("prefix", b, refresh, start, L)
    assert [(f.rows.tolist(), f.window) for f in prefix.forwards] == [([0], False), ([1, 2], True), ([3], True)]
    assert prefix.hi.tolist() == [16] * 4
    none = plan_forwards("none", b, refresh, start, L)
    assert [(f.rows.tolist(), f.window) for f in none.forwards] == [([0, 1, 2, 3], False)] and none.full.all()
    # an observer asking for position 13 of row 1 (outside its dual window [4, 8)), and an exact one reading row 3
    requested = torch.zeros(4, L, dtype=torch.bool)
    requested[1, 13] = True
    wants_exact = torch.tensor([True, False, False, True])
    plan = plan_forwards("dual", b, refresh, start, L, requested, wants_exact)
    assert plan.inside.tolist() == [True, False, True, True]
    assert plan.redo.tolist() == [False, True, False, True]  # row 0 refreshes: already exact
    assert plan_forwards("prefix", b, refresh, start, L, requested, None).redo.tolist() == [False] * 4
    cfg = SamplerConfig(gen_length=L, block_length=b, steps=8, cache="prefix")
    assert cached_forward_counts(cfg, refresh, start, None, L) == (3, 0)
    assert cached_forward_counts(SamplerConfig(gen_length=L, block_length=b, steps=8, cache="dual"), refresh, start,
                                 requested, L, wants_exact) == (2, 1)


@pytest.mark.numerics
def test_dispo_fillings_draw_with_the_samplers_gumbel_max():
    logits = torch.randn(70, 9, generator=torch.Generator().manual_seed(2))
    tokens, logp = draw_fillings(logits, 3, 0.8, torch.Generator().manual_seed(5), chunk=64)
    g = torch.Generator().manual_seed(5)
    want = torch.empty(3, 70, dtype=torch.long)
    for a in (0, 64):  # chunk by chunk, Z draws each
        for k in range(3):
            want[k, a:a + 64] = gumbel_max(logits[a:a + 64], 0.8, g)
    assert torch.equal(tokens, want)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).gather(-1, want.T).T)
