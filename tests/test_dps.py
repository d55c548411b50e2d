"""docs/spec.md §2.1 DPS against a slow reference that keeps every step's full logits and computes
S(k, k+1) with loops, under the fixed and the threshold schedule; global-batch normalisation over
two simulated processes; λ = 0 reproduces a trainer step bit for bit."""
from __future__ import annotations

import math
import threading

import pytest
import torch

from maskrl.config import load_config
from maskrl.credit import CREDITS, DPS, CreditBatch, CreditContext, apply_credit
from maskrl.credit.dps import progress_deltas
from maskrl.models import build_tiny
from maskrl.sampling import SamplerConfig, generate
from maskrl.tasks.base import Example
from conftest import sharp_tiny as _sharp
from maskrl.text import encode_prompts
from maskrl.trainer import RLTrainer
from conftest import OddChars


class KeepAll:
    """Reference observer: full per-step logits and masks, per row (float64)."""

    logit_scope = "completion"  # the sampler computes logits at every completion position

    def __init__(self):
        self.steps = []

    def on_step(self, view):
        n, L = view.covered.shape
        assert view.covered.all()
        full = view.logits.double().reshape(n, L, -1)  # [n, L, V], covered in row-major order
        self.steps.append((view.step, view.rows.clone(), full.clone(), view.masked.clone(),
                           view.committed.clone(), view.block_start.clone(), view.block_length))
        assert "log_probs" not in view.__dict__  # nobody built the [n, L, V] log-softmax

    def result(self):
        return {}


def _ref_weights(keep, num_steps, commit_step, lam, mode, scope="all", clip=2.0, final=None, top_k=16):
    """Loops: S(k', k+1) per row and step, δ, z-scores, clipping, token weights ``[N, L]``."""
    N = commit_step.shape[0]
    per_row = {n: {} for n in range(N)}  # n -> k -> (logits [L, V], masked [L], committed [L], block start, b)
    for k, rows, logits, masked, committed, start, b in keep.steps:
        for r, n in enumerate(rows.tolist()):
            per_row[n][k] = (logits[r], masked[r], committed[r], int(start[r]), b)

    floors = []

    def lmp(logits, j, n):
        lp = torch.log_softmax(logits[j], -1)
        if final is None:  # confidence: the step's argmax
            return lp.max().item()
        kth = lp.sort(descending=True).values[top_k - 1].item()
        y = lp[final[n, j]].item()
        floors.append(y < kth)
        return max(y, kth)  # in the top-k: its own value; outside: the k-th value

    deltas = {}  # (n, k) -> δ for valid pairs
    for n in range(N):
        T = int(num_steps[n])
        for k in range(T - 1):
            logits, masked, committed, start, b = per_row[n][k]
            in_scope = [j for j in range(len(masked)) if scope == "all" or start <= j < start + b]
            after = [j for j in in_scope if masked[j] and not committed[j]]  # M_{k+1}
            if not after:
                continue
            s_k = sum(lmp(logits, j, n) for j in after) / len(after)
            nxt = per_row[n][k + 1][0]
            s_k1 = sum(lmp(nxt, j, n) for j in after) / len(after)
            deltas[n, k] = s_k1 - s_k
    norm = {}
    if mode == "pooled":
        vals = list(deltas.values())
        m = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals))
        norm = {key: (v - m) / (sd + 1e-6) for key, v in deltas.items()}
    else:
        for k in {k for _, k in deltas}:
            keys = [key for key in deltas if key[1] == k]
            vals = [deltas[key] for key in keys]
            m = sum(vals) / len(vals)
            sd = math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals))
            norm.update({key: (deltas[key] - m) / (sd + 1e-6) for key in keys})
    w = torch.ones(commit_step.shape, dtype=torch.float64)
    for n in range(N):
        for i in range(commit_step.shape[1]):
            z = norm.get((n, int(commit_step[n, i])), 0.0)
            w[n, i] = 1 + lam * max(-clip, min(clip, z))
    if final is not None:
        assert any(floors) and not all(floors)  # both branches of the floor rule were exercised
    return w, deltas


def _ctx(n, reduce=lambda t, op="sum": t):
    return CreditContext(rewards=torch.zeros(n), group_ids=torch.arange(n), sequence_advantages=torch.ones(n),
                         score=None, reduce=reduce, generator=torch.Generator().manual_seed(0), policy=None,
                         objective=None, likelihood=None)




def _run(tiny, sampler, module, prompts=6):
    texts = ["ab", "a longer prompt", "c", "dd e", "xyz", "q"][:prompts]
    ids, mask = encode_prompts(tiny.tokenizer, texts)
    keep = KeepAll()
    ro = generate(tiny, ids, mask, sampler, generator=torch.Generator().manual_seed(0),
                  observers=[keep, *module.observers(sampler, torch.Generator())])
    n = ro.batch_size
    adv = torch.linspace(-1, 1, n)[:, None] * ro.completion_mask.float()
    batch = CreditBatch(rollout=ro, rewards=torch.zeros(n), advantages=adv, loss_mask=ro.completion_mask.clone())
    return ro, keep, batch


SAMPLERS = {
    "fixed": SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=1.0),
    "threshold": SamplerConfig(gen_length=12, block_length=4, temperature=1.0, schedule="threshold", threshold=0.5),
}


@pytest.mark.parametrize("schedule,mode,scope,target", [
    ("fixed", "per_step", "all", "confidence"), ("fixed", "pooled", "block", "confidence"),
    ("threshold", "pooled", "all", "confidence"), ("threshold", "per_step", "block", "confidence"),
    ("fixed", "per_step", "all", "final"), ("threshold", "pooled", "block", "final")])
@pytest.mark.numerics
def test_dps_matches_the_slow_reference(tiny, schedule, mode, scope, target):
    module = DPS(lam=0.5, dps_normalize=mode, dps_scope=scope, dps_target=target, top_k=4)
    ro, keep, batch = _run(tiny if schedule == "fixed" else _sharp(), SAMPLERS[schedule], module)
    if schedule == "threshold":  # rows really take different numbers of steps
        assert ro.num_steps.unique().numel() > 1
    out = apply_credit([("dps", module)], batch, [_ctx(ro.batch_size)])  # through the checked seam
    w, deltas = _ref_weights(keep, ro.num_steps, ro.commit_step, 0.5, mode, scope,
                             final=ro.completion_ids if target == "final" else None, top_k=4)
    delta, valid = progress_deltas(ro.step_stats["dps_s_next"], ro.step_stats["dps_s_self"], ro.num_steps)
    assert set(deltas) == {tuple(x) for x in valid.nonzero().tolist()}
    # δ: float32 max − logsumexp against float64, a few ulps of the log-probs' scale per mean
    eps = torch.finfo(torch.float32).eps
    scale = max(s[2][s[2].isfinite()].abs().max().item() for s in keep.steps) + math.log(keep.steps[0][2].shape[-1])
    d_err = max(abs(delta[n, k].item() - v) for (n, k), v in deltas.items())
    assert d_err <= 8 * eps * scale
    # w = 1 + λ·clip(z, ±c), z = (δ − mean)/(sd + 1e-6): δ's error e moves z by at most e·(2 + c)/sd
    groups = {}
    for (n, k), v in deltas.items():
        groups.setdefault(k if mode == "per_step" else 0, []).append(v)
    sd = min(math.sqrt(sum((v - sum(g) / len(g)) ** 2 for v in g) / len(g)) for g in groups.values() if len(g) > 1)
    w_tol = 0.5 * (2 + 2.0) * d_err / (sd + 1e-6) + 4 * eps
    torch.testing.assert_close(out.advantages.double(), batch.advantages.double() * w, rtol=0,
                               atol=w_tol * batch.advantages.abs().max().item())
    assert (w != 1).any()
    # the last step of each row: δ = 0, not in the statistics, weight 1 for the tokens born there
    last = ro.num_steps - 1
    assert (delta[torch.arange(ro.batch_size), last] == 0).all() and not valid[torch.arange(ro.batch_size), last].any()
    born_last = ro.commit_step == last[:, None]
    torch.testing.assert_close(out.advantages[born_last], batch.advantages[born_last])
    assert set(out.metrics) >= {"dps/delta_mean", "dps/weight_mean"}


def test_observer_keeps_two_numbers_per_row_and_step(tiny):
    ro, _, _ = _run(tiny, SAMPLERS["fixed"], DPS())
    assert set(ro.step_stats) == {"dps_s_next", "dps_s_self"}
    assert all(v.shape == (ro.batch_size, 6) for v in ro.step_stats.values())


def test_normalisation_is_over_the_global_batch(tiny):
    """Two simulated processes (threads) with a summing reduce give each half the whole batch's δ̄."""
    module = DPS(lam=0.7, dps_normalize="per_step")
    ro, _, batch = _run(tiny, SAMPLERS["fixed"], module)
    whole = module(batch, _ctx(ro.batch_size)).advantages
    barrier, box, results = threading.Barrier(2), {}, {}

    def reduce_for(rank):
        def reduce(t, op="sum"):
            box[rank] = t.clone()
            barrier.wait()
            total = box[0] + box[1]
            barrier.wait()
            return total
        return reduce

    def work(rank, sl):
        half = CreditBatch(rollout=ro.select(sl), rewards=batch.rewards[sl], advantages=batch.advantages[sl],
                           loss_mask=batch.loss_mask[sl])
        results[rank] = module(half, _ctx(half.rollout.batch_size, reduce_for(rank))).advantages

    threads = [threading.Thread(target=work, args=(r, sl)) for r, sl in enumerate((slice(0, 3), slice(3, 6)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.testing.assert_close(torch.cat([results[0], results[1]]), whole, rtol=1e-5, atol=1e-6)


def test_dps_config_and_errors():
    assert "dps" in CREDITS.names()
    with pytest.raises(ValueError, match="dps_target"):
        DPS(dps_target="argmax")
    with pytest.raises(ValueError, match="top_k"):
        DPS(dps_target="final", top_k=0)
    with pytest.raises(ValueError, match="dps_scope"):
        DPS(dps_scope="row")
    with pytest.raises(ValueError, match="dps_normalize"):
        DPS(dps_normalize="z")
    assert DPS().mode(SAMPLERS["threshold"]) == "pooled" and DPS().mode(SAMPLERS["fixed"]) == "per_step"
    cfg = load_config([], ["credit=[{name: dps, lam: 0.25, dps_scope: block}]"])
    assert cfg.credit[0] == DPS(lam=0.25, dps_scope="block")


def _trainer_weights(tmp_path, credit):
    y = tmp_path / f"run{len(credit)}{credit[:12]!r}.yaml".replace(" ", "").replace("'", "")
    y.write_text(f"""
output_dir: {tmp_path / 'out'}
rollout: {{gen_length: 8, block_length: 4, steps: 4, temperature: 1.0}}
objective: {{name: diffu_grpo}}
credit: {credit}
train: {{steps: 1, prompts_per_step: 2, group_size: 3, inner_iterations: 2, lr: 1.0e-2}}
""")
    cfg = load_config([y])
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    tr = RLTrainer(cfg, a, OddChars(), [Example(id=i, prompt=f"say {i}") for i in range(4)])
    m = tr.step()
    return {k: v.detach().clone() for k, v in a.model.state_dict().items()}, m


def test_lambda_zero_reproduces_the_base_step_bit_for_bit(tmp_path):
    base, _ = _trainer_weights(tmp_path, "[]")
    zero, m0 = _trainer_weights(tmp_path, "[{name: dps, lam: 0.0}]")
    half, m1 = _trainer_weights(tmp_path, "[{name: dps, lam: 0.5}]")
    assert all(torch.equal(base[k], zero[k]) for k in base)
    assert "credit/dps/weight_mean" in m0 and m0["credit/dps/weight_mean"] == 1.0
    assert any(not torch.equal(base[k], half[k]) for k in base)  # λ > 0 changes the update


# ------------------------------------------------------------------ issue 19 item 3: DPS under a cache
@torch.no_grad()
def _replayed_deltas(a, ids, mask, ro, scope):
    """Slow reference: δ_k per (row, step) from θ's full forwards at the states of ``ro`` (positions with
    ``commit_step >= k`` masked), float64, confidence target (docs/spec.md §2.1)."""
    out = {}
    b = ro.sampler.block_length
    for i in range(ro.batch_size):
        T, cs = int(ro.num_steps[i]), ro.commit_step[i]
        states = torch.stack([torch.where(cs >= k, a.mask_id, ro.completion_ids[i]) for k in range(T)])
        x = torch.cat([ids[i:i + 1].expand(T, -1), states], 1)
        attn = torch.cat([mask[i:i + 1].expand(T, -1), torch.ones_like(states, dtype=torch.bool)], 1)
        z = a.logits(x, attn)[:, ids.shape[1]:].double()
        z[..., a.mask_id] = float("-inf")
        lmp = torch.log_softmax(z, -1).max(-1).values  # [T, L]
        for k in range(T - 1):
            after = cs > k  # M_{k+1}
            if scope == "block":
                first = int((cs >= k).nonzero()[0, 0]) // b * b
                after = after & (torch.arange(len(cs)) >= first) & (torch.arange(len(cs)) < first + b)
            if after.any():
                out[i, k] = (lmp[k + 1][after].mean() - lmp[k][after].mean()).item()
    return out


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("schedule,scope", [("fixed", "all"), ("fixed", "block"), ("threshold", "all")])
def test_dps_delta_under_a_cache_equals_its_definition(cache, schedule, scope):
    """With a key/value cache the sampler gives DPS exact logits at every step: δ equals the δ of full
    forwards at the cached trajectory's states (before issue 19 it mixed cached logits in: up to 0.2
    nats off on this model, as large as δ's own spread)."""
    import dataclasses

    a = _sharp()
    cfg = dataclasses.replace(SAMPLERS[schedule], gen_length=16, steps=8, cache=cache)
    ids, mask = encode_prompts(a.tokenizer, ["ab", "a longer prompt", "c", "dd e"])
    ro = generate(a, ids, mask, cfg, generator=torch.Generator().manual_seed(0),
                  observers=DPS(dps_scope=scope).observers(cfg, torch.Generator()))
    plain = generate(a, ids, mask, cfg, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ro.completion_ids, plain.completion_ids)  # the cached trajectory, unchanged
    delta, valid = progress_deltas(ro.step_stats["dps_s_next"], ro.step_stats["dps_s_self"], ro.num_steps)
    ref = _replayed_deltas(a, ids, mask, ro, scope)
    assert set(ref) == {tuple(x) for x in valid.nonzero().tolist()}
    spread = torch.tensor(list(ref.values())).std().item()
    assert spread > 0.01  # δ varies: a wrong value would show
    for (n, k), v in ref.items():  # float32 log-softmax of O(10)-nat logits: 1e-5 relative, a few 1e-5 absolute
        assert delta[n, k].item() == pytest.approx(v, abs=5e-5), (n, k)


def test_dps_with_cache_can_be_refused_with_an_error_that_names_the_fields(tmp_path):
    """``rollout.observer_logits: refuse``: the combination fails at config time (and in generate),
    saying why and what to set instead."""
    from maskrl.config import ConfigError

    sets = ["rollout.cache=prefix", "rollout.observer_logits=refuse", "credit=[{name: dps}]",
            f"output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match=r"credit\[0\] \(dps\).*rollout.cache: prefix.*rollout.observer_logits"):
        load_config([], sets)
    load_config([], sets[:1] + sets[2:])  # the default (exact) is accepted
    load_config([], ["rollout.observer_logits=refuse", "credit=[{name: dps}]"])  # no cache: nothing to refuse
    with pytest.raises(ConfigError, match="observer_logits"):
        load_config([], ["rollout.observer_logits=approximate"])
    a = _sharp()
    ids, mask = encode_prompts(a.tokenizer, ["ab"])
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, cache="dual", observer_logits="refuse")
    with pytest.raises(ValueError, match="DPSObserver.*cache='none'"):
        generate(a, ids, mask, cfg, observers=DPS().observers(cfg, torch.Generator()))
