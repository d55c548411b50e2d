import pytest
import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling import SamplerConfig, StepView, generate
from maskrl.text import decode_completions, encode_prompts
from conftest import assert_batch_equals_single

PROMPTS = ["abc", "hello world", "x", "countdown 1,2,3"]


def _batch(tiny, prompts=PROMPTS):
    return encode_prompts(tiny.tokenizer, prompts)


def test_config_validation_names_the_argument():
    with pytest.raises(ValueError, match="block_length"):
        SamplerConfig(gen_length=10, block_length=4, steps=10)
    with pytest.raises(ValueError, match="steps"):
        SamplerConfig(gen_length=16, block_length=4, steps=6)
    with pytest.raises(ValueError, match="schedule"):
        SamplerConfig(gen_length=16, block_length=4, steps=8, schedule="nope")


@pytest.mark.parametrize("field", ["temperature", "threshold", "cfg_scale", "alg_temp", "top_p", "eb_threshold",
                                   "edit_threshold"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_config_refuses_non_finite_numbers_naming_the_field(field, value):
    """NaN passed every range check written as ``x < 0`` (temperature NaN decoded every prompt to an
    empty completion, silently) and +inf ran into the loop's 'uncommitted positions' RuntimeError."""
    with pytest.raises(ValueError, match=rf"^{field} \(={value}\) must be a finite number"):
        SamplerConfig(gen_length=16, block_length=16, steps=16, **{field: value})


def test_commits_per_step_split_evenly_remainder_first():
    cfg = SamplerConfig(gen_length=20, block_length=10, steps=8)  # 4 steps per block, 10 masks
    assert cfg.commits_per_step() == [3, 3, 2, 2]


def test_fixed_schedule_exact_commits_blocks_left_to_right(tiny):
    ids, mask = _batch(tiny)
    cfg = SamplerConfig(gen_length=20, block_length=10, steps=8)
    r = generate(tiny, ids, mask, cfg)
    k = cfg.commits_per_step()
    for row in range(ids.shape[0]):
        counts = torch.bincount(r.commit_step[row], minlength=8).tolist()
        assert counts == k + k  # exact number of commits per step
        # block 0 positions committed in steps 0-3, block 1 in steps 4-7
        assert r.commit_step[row, :10].max() < 4 <= r.commit_step[row, 10:].min()
    assert (r.num_steps == 8).all()
    assert (r.completion_ids != tiny.mask_id).all()
    assert ((r.commit_prob > 0) & (r.commit_prob <= 1)).all()


def test_no_remasking_and_commit_prob_matches_logits(tiny):
    """Replay the trajectory: at each step the committed tokens were masked before and the
    recorded commit_prob equals softmax(logits)[token] of that step's state."""
    ids, mask = _batch(tiny, PROMPTS[:2])
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4)
    r = generate(tiny, ids, mask, cfg)
    P = ids.shape[1]
    for t in range(4):
        state = torch.where(r.commit_step >= t, tiny.mask_id, r.completion_ids)  # x_t
        logits = tiny.logits(torch.cat([ids, state], 1), torch.cat([mask, torch.ones_like(state, dtype=torch.bool)], 1))[:, P:]
        logits[..., tiny.mask_id] = float("-inf")
        probs = torch.softmax(logits, -1)
        at = r.commit_step == t
        assert at.any()
        p = probs.gather(-1, r.completion_ids[..., None]).squeeze(-1)
        torch.testing.assert_close(p[at], r.commit_prob[at], rtol=1e-4, atol=1e-5)
        # greedy: the committed token is the argmax of that step
        assert (probs.argmax(-1)[at] == r.completion_ids[at]).all()


def test_greedy_is_deterministic_and_batch_equals_single(tiny):
    ids, mask = _batch(tiny)
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8)
    a = generate(tiny, ids, mask, cfg)
    b = generate(tiny, ids, mask, cfg)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert_batch_equals_single(tiny, PROMPTS, cfg, batch=a)


def test_threshold_batch_equals_single(tiny):
    ids, mask = _batch(tiny)
    cfg = SamplerConfig(gen_length=16, block_length=8, schedule="threshold", threshold=0.05)
    assert_batch_equals_single(tiny, PROMPTS, cfg, batch=generate(tiny, ids, mask, cfg))


def test_threshold_commits_top1_plus_confident(tiny):
    """Each step commits the most confident in-block mask plus every other one with c >= threshold."""
    ids, mask = _batch(tiny, PROMPTS[:2])
    thr = 0.03
    cfg = SamplerConfig(gen_length=8, block_length=4, schedule="threshold", threshold=thr)
    seen = []

    class Spy:
        def on_step(self, v: StepView):
            conf = v.dense(torch.softmax(v.logits.float(), -1).max(-1).values)  # [n, L] greedy confidence
            for r in range(v.rows.numel()):
                s = int(v.block_start[r])
                blk = torch.zeros_like(v.masked[r])
                blk[s:s + 4] = True
                elig = v.masked[r] & blk
                c = torch.where(elig, conf[r], torch.tensor(-1.0))
                expected = elig & ((c >= thr) | (torch.arange(8) == c.argmax()))
                seen.append(torch.equal(expected, v.committed[r]))

        def result(self):
            return {}

    r = generate(tiny, ids, mask, cfg, observers=[Spy()])
    assert seen and all(seen)
    # blocks strictly left to right
    for row in range(2):
        assert r.commit_step[row, :4].max() < r.commit_step[row, 4:].min()


def test_temperature_sampling_seeded(tiny):
    ids, mask = _batch(tiny)
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=4, temperature=1.0)
    g = lambda s: torch.Generator().manual_seed(s)
    a = generate(tiny, ids, mask, cfg, generator=g(1))
    b = generate(tiny, ids, mask, cfg, generator=g(1))
    c = generate(tiny, ids, mask, cfg, generator=g(2))
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    with pytest.raises(ValueError, match="generator"):
        generate(tiny, ids, mask, cfg)


def test_observer_gets_each_step_and_fills_step_stats(tiny):
    ids, mask = _batch(tiny, PROMPTS[:3])
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4)

    class MeanMaxLogProb:
        def __init__(self):
            self.rows = []

        logit_scope = "masked"

        def on_step(self, v):
            lp = v.max_log_prob.nan_to_num(0.0)  # [n, L], covered = masked positions
            m = v.masked.float()
            self.rows.append((lp * m).sum(-1) / m.sum(-1))

        def result(self):
            return {"mean_max_logp": torch.stack(self.rows, 1)}  # [N, T]

    r = generate(tiny, ids, mask, cfg, observers=[MeanMaxLogProb()])
    assert r.step_stats["mean_max_logp"].shape == (3, 4)
    plain = generate(tiny, ids, mask, cfg)
    assert plain.step_stats == {}
    assert torch.equal(plain.completion_ids, r.completion_ids)


def test_completion_mask_stops_after_first_eos(tiny):
    ids, mask = _batch(tiny, PROMPTS[:1])
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=8)
    # bias the model to emit eos at one position via a wrapper model
    class EosAt3(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **kw):
            out = self.inner(**kw)
            logits = out.logits.clone()
            logits[:, -5, tiny.eos_id] = 1e4  # completion position 3
            out.logits = logits
            return out

    a = ModelAdapter(**{**tiny.__dict__, "model": EosAt3(tiny.model)})
    r = generate(a, ids, mask, cfg)
    assert r.completion_ids[0, 3] == tiny.eos_id
    assert r.completion_mask[0].tolist() == [True] * 4 + [False] * 4
    text = decode_completions(tiny.tokenizer, r.completion_ids, r.completion_mask)[0]
    assert len(text) == 3


def test_random_remasking_and_cfg_run(tiny):
    ids, mask = _batch(tiny, PROMPTS[:2])
    g = torch.Generator().manual_seed(0)
    r = generate(tiny, ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4, remasking="random"), generator=g)
    assert (r.completion_ids != tiny.mask_id).all()
    r2 = generate(tiny, ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4, cfg_scale=1.0))
    assert (r2.completion_ids != tiny.mask_id).all()


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_generate_records_no_autograd_graph_whatever_the_callers_grad_mode(tiny, cache):
    """Sampling is not differentiated: ``generate`` runs under ``torch.no_grad`` itself, so a caller outside
    ``no_grad`` (evaluation, ``maskrl bench sampler``) neither builds a graph through every forward (time) nor
    keeps one alive through the cache and the Rollout (memory), and gets the same Rollout."""
    assert any(p.requires_grad for p in tiny.model.parameters())  # else nothing could be recorded
    ids, mask = _batch(tiny)
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, cache=cache)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        r = generate(tiny, ids, mask, cfg, observers=[StepRecorderForTest()])
    assert saved == [] and torch.is_grad_enabled()
    assert r.commit_prob.grad_fn is None and not r.commit_prob.requires_grad
    with torch.no_grad():
        q = generate(tiny, ids, mask, cfg, observers=[StepRecorderForTest()])
    assert torch.equal(r.completion_ids, q.completion_ids) and torch.equal(r.commit_prob, q.commit_prob)
    torch.testing.assert_close(r.step_stats["max_log_prob"], q.step_stats["max_log_prob"], rtol=0, atol=0,
                               equal_nan=True)  # NaN off the masked positions


class StepRecorderForTest:
    """An observer keeping each step's max log-probability at the masked positions (float: a graph would
    reach it if the sampler recorded one)."""

    logit_scope = "masked"

    def __init__(self):
        self.steps = []

    def on_step(self, v):
        self.steps.append(v.max_log_prob)

    def result(self):
        return {"max_log_prob": torch.stack(self.steps, 1)}
