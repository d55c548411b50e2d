"""Issue 12: KV caching in the one sampler, logits only where needed, StepView reductions.

The reference for ``cache="none"`` is a frozen copy of the sampler before issue 12
(``tests/_reference_sampler_v0.py``): outputs must be identical bit for bit. That copy draws Gumbel
noise over the whole block, the sampler only at the still-masked positions, so at τ > 0 both draw
with :func:`conftest.keyed_gumbel_max` (each position's noise seeded by its own logits), under which
the two agree exactly when no candidate the sampler did not draw is read.
"""
import sys
from pathlib import Path

import pytest
import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling import SamplerConfig, StepRecorder, StepView, generate, rollout_mismatch, window_hidden
from maskrl.text import encode_prompts
from conftest import assert_batch_equals_single, keyed_gumbel_max, tiny_dream

sys.path.insert(0, str(Path(__file__).parent))
import _reference_sampler_v0 as ref  # noqa: E402

PROMPTS = ["abc", "hello world", "x", "countdown 1,2,3"]
FIELDS = ("completion_ids", "commit_step", "commit_prob", "num_steps", "completion_mask")


def _sharpen(ad):
    """Scale the output layer so threshold rows commit several tokens per step and reach their next
    blocks at different steps (the random tiny model's distributions are nearly flat)."""
    with torch.no_grad():
        ad.model.get_output_embeddings().weight.mul_(20)


def _batch(ad, prompts=PROMPTS):
    return encode_prompts(ad.tokenizer, prompts)


@pytest.fixture
def dream():
    """A tiny Dream-style model (:func:`conftest.tiny_dream`)."""
    return tiny_dream()


CONFIGS = [
    dict(gen_length=16, block_length=8, steps=8),
    dict(gen_length=16, block_length=4, steps=16, suppress_eos=True),
    dict(gen_length=16, block_length=4, schedule="threshold", threshold=0.05),
    dict(gen_length=16, block_length=8, steps=16, temperature=1.0),
    dict(gen_length=8, block_length=4, steps=4, remasking="random", temperature=0.7),
    dict(gen_length=8, block_length=4, steps=4, cfg_scale=1.0),
]


def _keyed_reference_propose(logits, temperature, generator):
    """The frozen sampler's ``_propose`` with :func:`conftest.keyed_gumbel_max`'s noise."""
    tokens = keyed_gumbel_max(logits, temperature)
    return tokens, torch.softmax(logits.float(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


@pytest.mark.parametrize("kw", CONFIGS)
def test_cache_none_is_bit_for_bit_the_pre_issue_sampler(tiny, kw, monkeypatch):
    monkeypatch.setattr("maskrl.sampling.commit.gumbel_max", keyed_gumbel_max)
    monkeypatch.setattr(ref, "_propose", _keyed_reference_propose)
    ids, mask = _batch(tiny)
    new = generate(tiny, ids, mask, SamplerConfig(**kw), generator=torch.Generator().manual_seed(7))
    old = ref.generate(tiny, ids, mask, ref.SamplerConfig(**kw), generator=torch.Generator().manual_seed(7))
    for f in FIELDS:
        assert torch.equal(getattr(new, f), getattr(old, f)), f


def test_cache_none_bit_for_bit_for_shifted_model(dream):
    ids, mask = _batch(dream)
    kw = dict(gen_length=16, block_length=4, schedule="threshold", threshold=0.05)
    new = generate(dream, ids, mask, SamplerConfig(**kw))
    old = ref.generate(dream, ids, mask, ref.SamplerConfig(**kw))
    for f in FIELDS:
        assert torch.equal(getattr(new, f), getattr(old, f)), f


def test_config_cache_validation():
    with pytest.raises(ValueError, match="cache"):
        SamplerConfig(gen_length=8, block_length=4, steps=4, cache="both")
    with pytest.raises(ValueError, match="cfg_scale"):
        SamplerConfig(gen_length=8, block_length=4, steps=4, cache="dual", cfg_scale=1.0)
    with pytest.raises(ValueError, match="mismatch_every"):
        SamplerConfig(gen_length=8, block_length=4, steps=4, mismatch_every=-1)


@pytest.mark.parametrize("model", ["tiny", "dream"])
@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cached_window_forward_at_block_start_equals_full_forward(model, mode, request):
    """At a block-start state (block 1 of 3 all masked, block 0 filled) the window recomputed against
    the cache of every other column gives the full forward's logits (position-aligned, shift included)."""
    ad = request.getfixturevalue(model)
    ids, mask = _batch(ad)
    n, p = ids.shape
    L, b, start = 12, 4, 4
    gen = torch.Generator().manual_seed(0)
    comp = torch.randint(5, 40, (n, L), generator=gen)
    comp[:, start:] = ad.mask_id
    x = torch.cat([ids, comp], 1)
    attn = torch.cat([mask, torch.ones(n, L, dtype=torch.bool)], 1)
    full = ad.logits(x, attn)[:, p:]  # [n, L, V]
    _, kv = ad.decoder_forward(x, attn, ad.position_ids(attn), return_kv=True)
    shift = 1 if ad.shift else 0
    w0 = torch.full((n,), p + start - shift)
    width = (b if mode == "dual" else L - start) + shift
    h = window_hidden(ad, kv, x, attn, ad.position_ids(attn), torch.arange(n), w0, width)
    got = ad.head(h[:, :width - shift])  # window index k predicts completion position start + k
    torch.testing.assert_close(got, full[:, start:start + width - shift], rtol=1e-4, atol=1e-4)


@pytest.mark.numerics
@pytest.mark.parametrize("model", ["tiny", "dream"])
def test_window_written_in_place_equals_the_concatenated_cache_bit_for_bit(model, request):
    """``decoder_forward(write_at=...)`` writes the window's keys/values into the given buffers and attends
    them whole: the same keys in the same order as a fresh cache of the other columns with the window's
    appended (the out-of-place path), so the hidden states are equal bit for bit; the buffers then hold
    the window's own keys/values at the written columns and are left alone elsewhere."""
    from maskrl.sampling.cache import others_then_window, window_forward

    ad = request.getfixturevalue(model)
    ids, mask = _batch(ad)
    n, p = ids.shape
    L, width = 12, 4
    comp = torch.randint(5, 40, (n, L), generator=torch.Generator().manual_seed(0))
    x = torch.cat([ids, comp], 1)
    attn = torch.cat([mask, torch.ones(n, L, dtype=torch.bool)], 1)
    pos = ad.position_ids(attn)
    _, kv = ad.decoder_forward(x, attn, pos, return_kv=True)
    w0 = torch.full((n,), p + 4)
    order = others_then_window(w0, width, x.shape[1])
    keep = order[:, :-width]
    idx = lambda t, cols: t.gather(2, cols[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[-1]))  # noqa: E731
    past = [(idx(k, keep), idx(v, keep)) for k, v in kv]
    wcols = order[:, -width:]
    want, win_kv = ad.decoder_forward(x.gather(1, wcols), attn.gather(1, order), pos.gather(1, wcols), past=past,
                                      return_kv=True)
    store = [(idx(k, order), idx(v, order)) for k, v in kv]
    before = [(k.clone(), v.clone()) for k, v in store]
    got = window_forward(ad, store, x, attn, pos, w0, width, order)
    assert torch.equal(got, want)
    for (k, v), (k0, v0), (wk, wv) in zip(store, before, win_kv):
        assert torch.equal(k[:, :, :-width], k0[:, :, :-width]) and torch.equal(v[:, :, :-width], v0[:, :, :-width])
        assert torch.equal(k[:, :, -width:], wk) and torch.equal(v[:, :, -width:], wv)
    with pytest.raises(ValueError, match="leaves the"):
        window_forward(ad, store, x, attn, pos, w0 + L, width, None)


@pytest.mark.parametrize("model", ["tiny", "dream"])
@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_one_step_per_block_cache_equals_no_cache_exactly(model, mode, request):
    """With one step per block every step is a block start (a full forward), so caching changes
    nothing: same tokens, steps and probabilities bit for bit."""
    ad = request.getfixturevalue(model)
    ids, mask = _batch(ad)
    kw = dict(gen_length=12, block_length=4, steps=3)
    a = generate(ad, ids, mask, SamplerConfig(**kw))
    c = generate(ad, ids, mask, SamplerConfig(**kw, cache=mode))
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(c, f)), f


def _replay_cached_commit_probs(ad, ids, mask, r, mode):
    """Slow reference for a cached rollout: at each step rebuild the cache by a full forward at the
    row's block-start state and recompute the block with window_hidden; commit_prob must match."""
    p = ids.shape[1]
    b = r.sampler.block_length
    shift = 1 if ad.shift else 0
    attn = torch.cat([mask, torch.ones_like(r.completion_ids, dtype=torch.bool)], 1)
    pos = ad.position_ids(attn)
    for i in range(ids.shape[0]):
        for t in range(int(r.num_steps[i])):
            at = r.commit_step[i] == t
            blk = int(at.nonzero()[0, 0]) // b * b
            state = torch.where(r.commit_step[i] >= t, ad.mask_id, r.completion_ids[i])
            first = int(r.commit_step[i, blk:blk + b].min())  # the block's first step
            start_state = torch.where(r.commit_step[i] >= first, ad.mask_id, r.completion_ids[i])
            xs = torch.cat([ids[i], start_state])[None]
            if t == first:
                logits = ad.logits(xs, attn[i:i + 1])[0, p + blk:p + blk + b]
            else:
                _, kv = ad.decoder_forward(xs, attn[i:i + 1], pos[i:i + 1], return_kv=True)
                width = (b if mode == "dual" else r.completion_ids.shape[1] - blk) + shift
                xt = torch.cat([ids[i], state])[None]
                h = window_hidden(ad, kv, xt, attn[i:i + 1], pos[i:i + 1], torch.tensor([0]),
                                  torch.tensor([p + blk - shift]), width)
                logits = ad.head(h[0, :b])  # window index k predicts position blk + k
            logits[:, ad.mask_id] = float("-inf")
            prob = torch.softmax(logits.float(), -1).gather(-1, r.completion_ids[i, blk:blk + b, None]).squeeze(-1)
            torch.testing.assert_close(prob[at[blk:blk + b]], r.commit_prob[i, blk:blk + b][at[blk:blk + b]],
                                       rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", ["tiny", "dream"])
@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize("schedule", ["fixed", "threshold"])
def test_cached_rollout_matches_slow_replay(model, mode, schedule, request):
    ad = request.getfixturevalue(model)
    _sharpen(ad)
    ids, mask = _batch(ad, PROMPTS[:3])
    kw = dict(gen_length=12, block_length=4, steps=12) if schedule == "fixed" else \
        dict(gen_length=12, block_length=4, schedule="threshold", threshold=0.2)
    r = generate(ad, ids, mask, SamplerConfig(**kw, cache=mode))
    if schedule == "threshold":
        assert len(set(r.num_steps.tolist())) > 1
    _replay_cached_commit_probs(ad, ids, mask, r, mode)


@pytest.mark.parametrize("model", ["tiny", "dream"])
@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize("schedule", ["fixed", "threshold"])
@pytest.mark.numerics
def test_cache_batch_equals_single_with_left_padding(model, mode, schedule, request):
    ad = request.getfixturevalue(model)
    _sharpen(ad)
    ids, mask = _batch(ad)
    assert not mask.all()  # the batch is left-padded
    kw = dict(gen_length=16, block_length=4, steps=16) if schedule == "fixed" else \
        dict(gen_length=16, block_length=4, schedule="threshold", threshold=0.2)
    cfg = SamplerConfig(**kw, cache=mode)
    a = generate(ad, ids, mask, cfg)
    if schedule == "threshold":  # rows really move to their next blocks at different steps
        assert len(set(a.num_steps.tolist())) > 1
    assert_batch_equals_single(ad, PROMPTS, cfg, batch=a, commit_prob_tol=(1e-5, 1e-6))


def test_cache_requires_decoder_model_and_single_process(tiny):
    ids, mask = _batch(tiny, PROMPTS[:1])
    with pytest.raises(ValueError, match="all_done"):
        generate(tiny, ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4, cache="dual"),
                 all_done=lambda finished: finished)
    wrapped = ModelAdapter(**{**tiny.__dict__, "attention": "2d"})
    with pytest.raises(ValueError, match="attention"):
        generate(wrapped, ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4, cache="prefix"))


class _Stats:
    """Observer asking for all masked positions; records DPS-like per-step statistics."""

    logit_scope = "masked"

    def __init__(self):
        self.maxlp, self.ent, self.views = StepRecorder(), StepRecorder(), []

    def on_step(self, v: StepView):
        m = v.masked.float()
        self.maxlp.add(v, (v.max_log_prob.nan_to_num(0.0) * m).sum(-1))
        self.ent.add(v, v.entropy)
        self.views.append((v.step, v.rows.clone(), v.covered.clone(), v.exact.clone(), v.logits.clone(),
                           v.masked.clone(), v.max_log_prob.clone(), v.entropy.clone(),
                           v.token_log_prob(v.tokens).clone()))

    def result(self):
        n = 4
        return {"sum_max_logp": self.maxlp.tensor(n), "entropy": self.ent.tensor(n)}


@pytest.mark.parametrize("schedule", ["fixed", "threshold"])
def test_observers_same_shapes_and_unchanged_trajectory_with_cache(tiny, schedule):
    _sharpen(tiny)
    ids, mask = _batch(tiny)
    kw = dict(gen_length=16, block_length=4, steps=16) if schedule == "fixed" else \
        dict(gen_length=16, block_length=4, schedule="threshold", threshold=0.2)
    shapes = {}
    for mode in ("none", "prefix", "dual"):
        obs = _Stats()
        r = generate(tiny, ids, mask, SamplerConfig(**kw, cache=mode), observers=[obs])
        plain = generate(tiny, ids, mask, SamplerConfig(**kw, cache=mode))
        for f in FIELDS:  # observing never changes the rollout
            assert torch.equal(getattr(r, f), getattr(plain, f)), (mode, f)
        t = int(r.num_steps.max())
        assert r.step_stats["sum_max_logp"].shape == (4, t)
        assert r.step_stats["entropy"].shape == (4, t, 16)
        # threshold rows take different numbers of steps: entries beyond a row's last step are NaN
        for i in range(4):
            s = int(r.num_steps[i])
            assert not r.step_stats["sum_max_logp"][i, :s].isnan().any()
            assert r.step_stats["sum_max_logp"][i, s:].isnan().all()
        shapes[mode] = {k: (v.shape[0], v.shape[2:]) for k, v in r.step_stats.items()}
        for step, rows, covered, exact, logits, masked, maxlp, ent, toklp in obs.views:
            in_block = torch.zeros_like(masked)
            for j, i in enumerate(rows.tolist()):
                first = int(masked[j].nonzero()[0, 0]) // 4 * 4 if masked[j].any() else 0
                in_block[j, first:first + 4] = True
            assert torch.equal(covered, masked | in_block)  # scope "masked" (+ the block, always computed)
            assert logits.shape[0] == int(covered.sum())
            beyond = (masked & ~in_block).any(-1)
            if mode == "dual":
                assert exact[beyond].all()  # asked beyond the block: a full forward supplied the view
            if mode == "none":
                assert exact.all()
            # exact rows: the view's logits are theta's full forward at the pre-step state
            for j in exact.nonzero().squeeze(-1).tolist():
                i = int(rows[j])
                state = torch.where(r.commit_step[i] >= step, tiny.mask_id, r.completion_ids[i])
                full = tiny.logits(torch.cat([ids[i], state])[None], torch.cat([mask[i], torch.ones(16, dtype=torch.bool)])[None])
                full = full[0, ids.shape[1]:][covered[j]]
                full[:, tiny.mask_id] = float("-inf")
                k0 = int(covered[:j].sum())
                torch.testing.assert_close(logits[k0:k0 + int(covered[j].sum())], full, rtol=1e-4, atol=1e-4)
    assert shapes["none"] == shapes["prefix"] == shapes["dual"]


@pytest.mark.numerics
def test_step_view_reductions_match_slow_reference(tiny):
    ids, mask = _batch(tiny, PROMPTS[:2])
    obs = _Stats()
    generate(tiny, ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=8), observers=[obs])
    assert len(obs.views) == 8
    for step, rows, covered, exact, logits, masked, maxlp, ent, toklp in obs.views:
        lp = torch.log_softmax(logits.float(), -1)  # [M, V]
        ref_max = torch.full(covered.shape, float("nan"))
        ref_ent = torch.full(covered.shape, float("nan"))
        k = 0
        for j in range(covered.shape[0]):
            for pos in range(covered.shape[1]):
                if covered[j, pos]:
                    row = lp[k]
                    ref_max[j, pos] = row.max()
                    p = row.exp()
                    ref_ent[j, pos] = -sum(p[v] * row[v] for v in range(len(row)) if p[v] > 0)
                    k += 1
        torch.testing.assert_close(maxlp, ref_max, equal_nan=True, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ent, ref_ent, equal_nan=True, rtol=1e-4, atol=1e-5)
        assert toklp.isnan().equal(~covered)
    with pytest.raises(ValueError, match="tokens"):
        StepView(0, torch.tensor([0]), torch.zeros(1, 5), torch.ones(1, 1, dtype=torch.bool), torch.ones(1, dtype=torch.bool),
                 None, None, None, None, 4).token_log_prob(torch.zeros(2, 2, dtype=torch.long))


@pytest.mark.numerics
def test_token_log_prob_of_committed_tokens_is_log_commit_prob(tiny):
    ids, mask = _batch(tiny, PROMPTS[:3])

    class Tok:
        def __init__(self):
            self.rec = StepRecorder()

        def on_step(self, v):
            self.rec.add(v, v.token_log_prob(v.tokens).masked_fill(~v.committed, float("nan")))

        def result(self):
            return {"tok": self.rec.tensor(3)}

    r = generate(tiny, ids, mask, SamplerConfig(gen_length=8, block_length=4, schedule="threshold", threshold=0.05),
                 observers=[Tok()])
    tok = r.step_stats["tok"]  # [N, T, L]
    got = tok.gather(1, r.commit_step[:, None, :]).squeeze(1)  # [N, L]
    torch.testing.assert_close(got, r.commit_prob.log(), rtol=1e-5, atol=1e-6)


def test_step_recorder_places_values_by_row_and_step():
    rec = StepRecorder()
    rows = lambda *r: torch.tensor(r)
    mk = lambda step, rr: StepView(step, rr, None, None, None, None, None, None, None, 4)
    rec.add(mk(0, rows(0, 1, 2)), torch.tensor([1.0, 2.0, 3.0]))
    rec.add(mk(1, rows(0, 2)), torch.tensor([4.0, 5.0]))
    rec.add(mk(2, rows(2)), torch.tensor([6.0]))
    out = rec.tensor(3)
    nan = float("nan")
    torch.testing.assert_close(out, torch.tensor([[1.0, 4.0, nan], [2.0, nan, nan], [3.0, 5.0, 6.0]]), equal_nan=True)
    assert rec.tensor(3, num_steps=5).shape == (3, 5)
    with pytest.raises(ValueError, match="leading"):
        rec.add(mk(3, rows(0, 1)), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="nothing recorded"):
        StepRecorder().tensor(2)


def test_output_layer_runs_only_on_the_block(tiny):
    """No observer: the output layer sees n*b hidden states per step, never n*L."""
    ids, mask = _batch(tiny, PROMPTS[:2])
    sizes = []
    head = tiny.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, i, o: sizes.append(i[0].shape[:-1].numel()))
    try:
        for mode in ("none", "prefix", "dual"):
            sizes.clear()
            generate(tiny, ids, mask, SamplerConfig(gen_length=16, block_length=4, steps=8, cache=mode))
            assert sizes and max(sizes) == 2 * 4, (mode, sizes)
    finally:
        hook.remove()


@pytest.mark.parametrize("model", ["tiny", "dream"])
def test_logits_at_equals_full_logits(model, request):
    ad = request.getfixturevalue(model)
    ids, mask = _batch(ad)
    cols = torch.tensor([[3, 5, ids.shape[1] - 1]] * ids.shape[0])
    got = ad.logits_at(ids, mask, cols)
    full = ad.logits(ids, mask)
    torch.testing.assert_close(got, full.gather(1, cols[..., None].expand(-1, -1, full.shape[-1])))


def test_rollout_mismatch_zero_without_cache_positive_with(tiny):
    ids, mask = _batch(tiny)
    kw = dict(gen_length=16, block_length=4, steps=16)
    r0 = generate(tiny, ids, mask, SamplerConfig(**kw))
    m0 = rollout_mismatch(tiny, r0)
    assert m0["tokens"] == 4 * 16
    assert m0["mismatch"] < 1e-5
    r1 = generate(tiny, ids, mask, SamplerConfig(**kw, cache="dual"))
    m1 = rollout_mismatch(tiny, r1)
    assert m1["mismatch"] > 1e-5
    # slow reference: one full forward per (row, step)
    p = ids.shape[1]
    diffs = []
    for i in range(4):
        for t in range(int(r1.num_steps[i])):
            state = torch.where(r1.commit_step[i] >= t, tiny.mask_id, r1.completion_ids[i])
            lg = tiny.logits(torch.cat([ids[i], state])[None], torch.cat([mask[i], torch.ones(16, dtype=torch.bool)])[None])[0, p:]
            lg[:, tiny.mask_id] = float("-inf")
            lp = torch.log_softmax(lg.float(), -1).gather(-1, r1.completion_ids[i, :, None]).squeeze(-1)
            at = r1.commit_step[i] == t
            diffs.append((r1.commit_prob[i][at].log() - lp[at]).abs())
    d = torch.cat(diffs)
    assert m1["mismatch"] == pytest.approx(d.mean().item(), rel=1e-4, abs=1e-6)
    assert m1["mismatch_max"] == pytest.approx(d.max().item(), rel=1e-4, abs=1e-6)
    rc = generate(tiny, ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4, cfg_scale=1.0))
    with pytest.raises(ValueError, match="cfg_scale"):
        rollout_mismatch(tiny, rc)


@pytest.mark.parametrize("mode", ["none", "prefix", "dual"])
def test_logit_positions_per_step_and_completion_scope(tiny, mode):
    """A DiSPO-like observer asks for every masked position at one chosen step only; another asks for
    the whole completion at every step. Covered sets follow the requests; outside the cached window
    the view comes from a full forward (exact), and the rollout is unchanged."""
    _sharpen(tiny)
    ids, mask = _batch(tiny)
    cfg = SamplerConfig(gen_length=12, block_length=4, schedule="threshold", threshold=0.2, cache=mode)

    class Chosen:
        def __init__(self):
            self.seen = []

        def logit_positions(self, step, rows, masked, block_start):
            return "masked" if step == 2 else "block"

        def on_step(self, v):
            self.seen.append((v.step, v.covered.clone(), v.masked.clone(), v.block_start.clone()))

        def result(self):
            return {}

    class Everything:
        logit_scope = "completion"

        def __init__(self):
            self.ok = []

        def on_step(self, v):
            # outside the cached window (dual: beyond the block; prefix: left of it) -> full forward
            must_be_exact = torch.ones_like(v.exact) if mode in ("none", "dual") else v.block_start > 0
            self.ok.append(bool(v.covered.all()) and v.logits.shape[0] == v.covered.numel()
                           and bool(v.exact[must_be_exact].all()))

        def result(self):
            return {}

    chosen = Chosen()
    r = generate(tiny, ids, mask, cfg, observers=[chosen])
    plain = generate(tiny, ids, mask, cfg)
    assert torch.equal(r.completion_ids, plain.completion_ids) and torch.equal(r.commit_prob, plain.commit_prob)
    for step, covered, masked, start in chosen.seen:
        in_block = torch.zeros_like(masked)
        for j in range(len(start)):
            in_block[j, int(start[j]):int(start[j]) + 4] = True
        assert torch.equal(covered, (masked | in_block) if step == 2 else in_block)
    every = Everything()
    r2 = generate(tiny, ids, mask, cfg, observers=[every])
    assert every.ok and all(every.ok)
    assert torch.equal(r2.completion_ids, plain.completion_ids)

    class Bad:
        logit_scope = "everything"

        def on_step(self, v):
            pass

        def result(self):
            return {}

    with pytest.raises(ValueError, match="scope"):
        generate(tiny, ids, mask, cfg, observers=[Bad()])


def test_cache_keyword_read_once_per_forward_function(monkeypatch):
    """decoder_forward's cache argument name (``cache`` or ``past_key_values``) comes from the decoder
    forward's signature, looked up once per function, not on every call."""
    import inspect

    from maskrl.models import adapter as adapter_mod

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None):
            return input_ids

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None):
            return input_ids

    def wrapped(input_ids=None, **kwargs):  # an instance-level forward (a hook's replacement)
        return input_ids

    wrapped.__wrapped__ = Old.forward
    calls = []
    real = inspect.signature
    monkeypatch.setattr(adapter_mod.inspect, "signature", lambda f: calls.append(f) or real(f))
    adapter_mod._cache_keyword_of.cache_clear()
    new, old = New(), Old()
    assert [adapter_mod._cache_keyword(m.forward) for m in (new, old, New(), new)] == \
        ["cache", "past_key_values", "cache", "cache"]
    assert adapter_mod._cache_keyword(wrapped) == "past_key_values"
    assert len(calls) == 3  # New.forward, Old.forward, wrapped: each once
