"""Issue 11 items 2-3: DiSPO (docs/spec.md §4) -- the branching observer and the step loss term."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from maskrl.config import load_config
from maskrl.credit import CREDITS, CreditBatch, CreditContext, DiSPO
from maskrl.credit.dispo import BranchObserver, draw_fractions, draw_fillings, timing_weights
from maskrl.likelihood import State
from maskrl.models import build_tiny
from maskrl.sampling import SamplerConfig, generate
from maskrl.tasks.base import Example
from maskrl.text import encode_prompts
from maskrl.trainer import RLTrainer
from conftest import OddChars

PROMPTS = ["ab", "a longer prompt", "c", "dd"]


def _gen(adapter, cfg, observers=(), seed=0):
    ids, mask = encode_prompts(adapter.tokenizer, PROMPTS)
    return generate(adapter, ids, mask, cfg, generator=torch.Generator().manual_seed(seed), observers=observers,
                    group_ids=torch.tensor([0, 0, 1, 1]))


FIXED = SamplerConfig(gen_length=8, block_length=4, steps=8, temperature=0.9)
THRESH = SamplerConfig(gen_length=8, block_length=4, steps=8, temperature=0.9, schedule="threshold", threshold=0.3)


def test_registered_and_validated():
    assert CREDITS.get("dispo") is DiSPO
    for bad in ({"z": 1}, {"timing": "mid"}, {"alpha_step": -1.0}, {"p_mask_prompt": 2.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DiSPO(**bad)


def test_timing_hand_values():
    torch.testing.assert_close(timing_weights(4, "late"), torch.tensor([0, 1, 16, 81], dtype=torch.float64) / 98)
    torch.testing.assert_close(timing_weights(4, "uniform"), torch.full((4,), 0.25, dtype=torch.float64))
    torch.testing.assert_close(timing_weights(4, "early"), torch.tensor([256, 81, 16, 1], dtype=torch.float64) / 354)
    # threshold schedule: u has density 5u^4 (late), mean 5/6; early mean 1/6
    g = torch.Generator().manual_seed(0)
    for timing, mean in (("late", 5 / 6), ("uniform", 0.5), ("early", 1 / 6)):
        u = draw_fractions(20000, timing, 4.0, g)
        assert abs(u.mean().item() - mean) < 5 * u.std().item() / math.sqrt(20000), timing


@pytest.mark.parametrize("cfg", [FIXED, THRESH, dataclasses.replace(FIXED, cache="prefix"),
                                 dataclasses.replace(THRESH, cache="dual")],
                         ids=["fixed", "threshold", "fixed-prefix-cache", "threshold-dual-cache"])
def test_main_rollout_is_bit_identical_with_branching(tiny, cfg):
    plain = _gen(tiny, cfg)
    obs = DiSPO(z=3, timing="uniform").observers(cfg, torch.Generator().manual_seed(0))
    branched = _gen(tiny, cfg, obs)
    for name in ("completion_ids", "commit_step", "commit_prob", "num_steps", "completion_mask"):
        assert torch.equal(getattr(plain, name), getattr(branched, name)), name
    st = branched.step_stats
    assert (st["dispo_step"] >= 0).all()  # every row branched once
    assert (st["dispo_step"] < branched.num_steps).all()
    # the recorded state is x_t: masked exactly where the final commit step is >= t
    assert torch.equal(st["dispo_masked"], branched.commit_step >= st["dispo_step"][:, None])
    filled = st["dispo_fill"] >= 0
    assert torch.equal(filled, st["dispo_masked"][:, None, :].expand_as(filled))
    assert (st["dispo_fill"][filled] != tiny.mask_id).all()


def test_fixed_schedule_branches_at_the_drawn_step(tiny):
    obs = DiSPO(timing="late").observers(FIXED, torch.Generator().manual_seed(5))[0]
    ro = _gen(tiny, FIXED, [obs])
    assert torch.equal(ro.step_stats["dispo_step"], obs.target)
    assert (obs.target > 0).all()  # late: t = 0 has weight 0


class _Spy:
    """Keeps the logits a step computed at the masked positions of row 0 (asked for at one step)."""

    def __init__(self, step):
        self.step, self.logits = step, None

    def logit_positions(self, step, rows, masked, block_start):
        return masked if step == self.step else "block"

    def on_step(self, view):
        if view.step == self.step:
            vidx = view.covered.flatten().long().cumsum(0).view(view.covered.shape) - 1
            self.logits = view.logits[vidx[0][view.masked[0]]].float().clone()
            self.masked = view.masked[0].clone()

    def result(self):
        return {}


def _chi2_critical(df, z=3.09):  # Wilson–Hilferty 0.999 quantile
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("tau", [0.7, 1.3])
def test_fillings_follow_softmax_logits_over_tau(tiny, tau):
    """χ² goodness of fit of Z = 4000 fillings at one position against softmax(logits/τ) from the
    sampler's own logits; the same counts against τ' = 2τ must be rejected (the test can fail)."""
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=8, temperature=tau)
    # sharpen the random model so that the distribution is far from uniform
    with torch.no_grad():
        for p in tiny.model.parameters():
            if p.dim() == 2 and p.shape[0] == tiny.model.config.vocab_size:
                p.mul_(40.0)
    obs = BranchObserver(z=4000, temperature=tau, timing="uniform", power=4.0, steps=8,
                         generator=torch.Generator().manual_seed(1))
    obs._init(torch.arange(len(PROMPTS)))
    obs.target[:] = 3
    spy = _Spy(3)
    ro = _gen(tiny, cfg, [obs, spy])
    pos = int(spy.masked.nonzero()[0])
    logits = spy.logits[0]  # first masked position of row 0
    counts = torch.bincount(ro.step_stats["dispo_fill"][0, :, pos], minlength=logits.shape[0]).double()

    def chi2(temp):
        p = torch.softmax(logits.double() / temp, -1)
        big = p * 4000 >= 5
        exp = torch.cat([p[big] * 4000, (p[~big].sum() * 4000).reshape(1)])
        obs_ = torch.cat([counts[big], counts[~big].sum().reshape(1)])
        keep = exp > 0
        return float(((obs_[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1

    stat, df = chi2(tau)
    assert df >= 2 and stat < _chi2_critical(df), (stat, df)
    wrong, df2 = chi2(2 * tau)
    assert wrong > _chi2_critical(max(df2, 1)), (wrong, df2)


def test_draw_fillings_log_probs_and_greedy():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, float("-inf")]])
    tok, lp = draw_fillings(logits, 5, 0.0, torch.Generator().manual_seed(0))
    assert (tok[:, 0] == 2).all() and (tok[:, 1] == 0).all()
    torch.testing.assert_close(lp[0], torch.log_softmax(logits, -1)[[0, 1], [2, 0]])
    tok, _ = draw_fillings(logits, 200, 1.0, torch.Generator().manual_seed(0))
    assert (tok[:, 1] != 2).all()  # a -inf logit is never drawn


# ------------------------------------------------------------------ the step term
def _ctx(adapter, rewards_fn, n):
    calls = []

    def score(rows, completions):
        calls.append((rows.clone(), completions.clone()))
        return rewards_fn(rows, completions)

    ctx = CreditContext(rewards=torch.zeros(n), group_ids=torch.zeros(n, dtype=torch.long),
                        sequence_advantages=torch.zeros(n), score=score, reduce=lambda t, op="sum": t,
                        generator=torch.Generator().manual_seed(0), policy=adapter, objective=None, likelihood=None)
    return ctx, calls


def _batch(ro):
    return CreditBatch(rollout=ro, rewards=torch.zeros(ro.batch_size), advantages=ro.completion_mask.float(),
                       loss_mask=ro.completion_mask.clone())


def test_step_term_is_token_local_skips_equal_states_and_uses_mean_baselines(tiny):
    mod = DiSPO(z=3, timing="uniform", alpha_base=0.7, alpha_step=0.25, p_mask_prompt=0.0)
    ro = _gen(tiny, FIXED, mod.observers(FIXED, torch.Generator().manual_seed(0)))
    n, L = ro.completion_ids.shape

    def rewards_fn(rows, completions):  # state of row 0: all equal; others: a token-sum reward
        r = (completions % 7).sum(-1).float()
        return torch.where(rows == 0, torch.ones_like(r), r)

    ctx, calls = _ctx(tiny, rewards_fn, n)
    out = mod(_batch(ro), ctx)
    assert len(calls) == 1 and calls[0][0].tolist() == [i for i in range(n) for _ in range(3)]  # one batched call
    assert out.base_weight == pytest.approx(0.7)
    (term,) = out.terms
    assert term.name == "step" and term.weight == 0.25
    st = ro.step_stats
    r = rewards_fn(calls[0][0], calls[0][1]).view(n, 3)
    keep = r.max(1).values > r.min(1).values
    assert not keep[0] and term.rollout.batch_size == 3 * int(keep.sum())
    src = torch.nonzero(keep).squeeze(-1).repeat_interleave(3)
    # branch completions: the state's committed tokens + the fillings
    want = torch.where(st["dispo_masked"][src], st["dispo_fill"][src].gather(1, torch.arange(len(src)).remainder(3)
                                                                              .view(-1, 1, 1).expand(-1, 1, L)).squeeze(1),
                       ro.completion_ids[src])
    assert torch.equal(term.rollout.completion_ids, want)
    # token-local: only filled positions (up to the branch's first stop), at state t
    assert not (term.mask & ~st["dispo_masked"][src]).any()
    t = st["dispo_step"][src]
    assert (term.rollout.commit_step[st["dispo_masked"][src]] == t.repeat_interleave(st["dispo_masked"][src].sum(-1))).all()
    assert (term.rollout.commit_step[~st["dispo_masked"][src]] < t.repeat_interleave((~st["dispo_masked"][src]).sum(-1))).all()
    # mean baseline per state
    a = (r[keep] - r[keep].mean(1, keepdim=True)).reshape(-1)
    assert torch.equal(term.advantages, a[:, None] * term.mask.float())
    # one forward row per branch, and the state likelihood scores the fillings at x_t exactly as the
    # sampler saw them (θ = θ_old, no prompt masking): log softmax(logits) recorded by the observer
    assert (term.likelihood.rows(term.rollout, term.mask) == term.mask.any(-1).long()).all()
    with torch.no_grad():
        lp = State(p_mask_prompt=0.0)(tiny, term.rollout, None, term.mask)
    rec = st["dispo_logp_old"][src].gather(1, torch.arange(len(src)).remainder(3).view(-1, 1, 1).expand(-1, 1, L)).squeeze(1)
    P = ro.prompt_ids.shape[1]
    for b in range(len(src)):  # loop reference: one full forward of x_t per branch
        m = st["dispo_masked"][src[b]]
        x = torch.cat([ro.prompt_ids[src[b]], torch.where(m, tiny.mask_id, term.rollout.completion_ids[b])])[None]
        attn = torch.cat([ro.prompt_mask[src[b]], torch.ones(L, dtype=torch.bool)])[None]
        with torch.no_grad():
            logits = tiny.logits(x, attn)[0, P:].float()
        tok = term.rollout.completion_ids[b]
        full = torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
        logits[:, tiny.mask_id] = float("-inf")  # the sampler never proposes [M]
        nomask = torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
        k = term.mask[b]
        torch.testing.assert_close(lp[b, k], full[k], rtol=1e-4, atol=1e-5)  # the term scores x_t
        torch.testing.assert_close(rec[b, m], nomask[m], rtol=1e-4, atol=1e-5)  # the observer saw x_t
    assert out.metrics["kept_frac"] == pytest.approx(keep.float().mean().item())
    # distinguishable states by timestep bin, counted by hand from t/T
    frac = (st["dispo_step"][st["dispo_step"] >= 0].float() / ro.num_steps[st["dispo_step"] >= 0].float()).tolist()
    kept = keep.tolist()
    for lo, hi, b in ((0, 1 / 3, "early"), (1 / 3, 2 / 3, "mid"), (2 / 3, 2, "late")):
        assert out.metrics[f"states_{b}"] == sum(lo <= f < hi for f in frac)
        assert out.metrics[f"kept_{b}"] == sum(lo <= f < hi and k for f, k in zip(frac, kept))
    assert sum(out.metrics[f"states_{b}"] for b in ("early", "mid", "late")) == out.metrics["states"]


def test_time_bins_edges():
    from maskrl.credit.dispo import time_bins
    assert time_bins(torch.tensor([0.0, 0.33, 1 / 3, 0.5, 0.66, 2 / 3, 0.99, 1.0])).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]


def test_empty_term_when_every_state_is_skipped_and_none_when_alpha_step_zero(tiny):
    mod = DiSPO(z=2)
    ro = _gen(tiny, FIXED, mod.observers(FIXED, torch.Generator().manual_seed(0)))
    ctx, calls = _ctx(tiny, lambda rows, c: torch.zeros(len(rows)), ro.batch_size)
    out = mod(_batch(ro), ctx)
    # a 0-row term (same term list on every process; no forward)
    (term,) = out.terms
    assert term.rollout.batch_size == 0 and term.mask.shape == (0, 8) and term.likelihood.rows(term.rollout, term.mask).numel() == 0
    assert out.metrics["kept_frac"] == 0.0 and len(calls) == 1
    ctx, calls = _ctx(tiny, lambda rows, c: torch.rand(len(rows)), ro.batch_size)
    out = DiSPO(alpha_step=0.0)(_batch(ro), ctx)
    assert out.terms == () and calls == [] and out.base_weight == 1.0
    with pytest.raises(ValueError, match="dispo_step"):
        mod(_batch(_gen(tiny, FIXED)), ctx)


def _run(tmp_path, credit, objective="diffu_grpo", likelihood="state", schedule="fixed"):
    y = tmp_path / "run.yaml"
    y.write_text(f"""
output_dir: {tmp_path / 'out'}
rollout: {{gen_length: 8, block_length: 4, steps: 4, temperature: 1.0, schedule: {schedule}}}
objective: {{name: {objective}}}
likelihood: {{name: {likelihood}}}
credit: {credit}
train: {{steps: 1, prompts_per_step: 2, group_size: 3, inner_iterations: 2, lr: 1.0e-2}}
""")
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    tr = RLTrainer(load_config([y]), a, OddChars(), [Example(id=i, prompt=f"say {i}") for i in range(4)])
    m = tr.step()
    return [p.detach().clone() for p in a.model.parameters()], m


@pytest.mark.parametrize("objective,likelihood", [("diffu_grpo", "state"), ("spg", "spg_bounds")])
def test_alpha_step_zero_reproduces_the_base_run_bit_for_bit(tmp_path, objective, likelihood):
    w0, m0 = _run(tmp_path, "[]", objective, likelihood)
    w1, m1 = _run(tmp_path, "[{name: dispo, alpha_step: 0.0}]", objective, likelihood)
    assert all(torch.equal(p, q) for p, q in zip(w0, w1))
    assert {k: v for k, v in m0.items() if k.startswith("base/")} == {k: v for k, v in m1.items() if k.startswith("base/")}
    w2, m2 = _run(tmp_path, "[{name: dispo}]", objective, likelihood)  # the step term changes the update
    assert "step/policy_loss" in m2 and any(not torch.equal(p, q) for p, q in zip(w0, w2))


@pytest.mark.parametrize("schedule", ["fixed", "threshold"])
def test_trainer_step_with_dispo_from_yaml(tmp_path, schedule):
    _, m = _run(tmp_path, "[{name: dispo, z: 3, timing: late}]", schedule=schedule)
    assert m["credit/dispo/states"] == 6.0 and 0 < m["credit/dispo/t_frac"] < 1


def test_trainer_step_when_no_state_is_kept(tmp_path):
    """Constant rewards: every state skipped, the 0-row step term costs nothing and the step runs."""
    class Const(OddChars):
        name = "const_dispo"

        def reward(self, prompts, completions, **_):
            return [0.5 for _ in completions]

    y = tmp_path / "run.yaml"
    y.write_text(f"""
output_dir: {tmp_path / 'out'}
rollout: {{gen_length: 8, block_length: 4, steps: 4, temperature: 1.0}}
objective: {{name: diffu_grpo}}
credit: [{{name: dispo}}]
train: {{steps: 1, prompts_per_step: 2, group_size: 3, inner_iterations: 2, lr: 1.0e-2}}
""")
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    m = RLTrainer(load_config([y]), a, Const(), [Example(id=i, prompt=f"say {i}") for i in range(4)]).step()
    assert m["credit/dispo/kept_frac"] == 0.0 and "step/policy_loss" not in m
    assert all(math.isfinite(v) for v in m.values() if isinstance(v, float))


def test_branching_draws_follow_the_run_seed_and_step(tmp_path):
    """The observers' generator comes from the trainer: (train.seed, step) decide the branching
    steps, so seeds differ, a repeated seed repeats, and steps differ within a run."""
    def draws(seed: int, steps: int = 2) -> list[list[int]]:
        y = tmp_path / f"s{seed}.yaml"
        y.write_text(f"""
output_dir: {tmp_path / f'out{seed}'}
rollout: {{gen_length: 16, block_length: 16, steps: 16, temperature: 1.0}}
objective: {{name: diffu_grpo}}
credit: [{{name: dispo, timing: uniform}}]
train: {{steps: {steps}, prompts_per_step: 4, group_size: 4, inner_iterations: 1, lr: 1.0e-3, seed: {seed}}}
""")
        a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
        tr = RLTrainer(load_config([y]), a, OddChars(), [Example(id=i, prompt=f"say {i}") for i in range(8)])
        out = []
        for _ in range(steps):
            out.append(tr.collect().rollout.step_stats["dispo_step"].tolist())
            tr.step_count += 1
        return out

    a0, b0 = draws(0), draws(0)
    a1 = draws(1)
    assert a0 == b0 and a0[0] != a1[0] and a0[0] != a0[1]


CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("task", ["sudoku", "countdown"])
@pytest.mark.parametrize("base", ["diffu_grpo", "spg"])
def test_shipped_dispo_recipes(task, base):
    from maskrl.objectives import OBJECTIVES

    b = load_config([CONFIGS / f"dispo_{task}_{base}_base.yaml"])
    d = load_config([CONFIGS / f"dispo_{task}_{base}_dispo.yaml"])
    for cfg in (b, d):
        assert isinstance(cfg.objective, OBJECTIVES.get(base))
    assert b.credit == [] and len(d.credit) == 1 and isinstance(d.credit[0], DiSPO)
    assert d.credit[0].alpha_step == 0.1 and d.credit[0].timing == "late" and d.credit[0].z == 2
    # the pair differs only in the credit list and the output directory
    for section in ("model", "task", "rollout", "eval", "train", "objective", "likelihood"):
        assert getattr(b, section) == getattr(d, section), section
    if base == "spg":
        assert type(b.likelihood).__name__ == "SPGBounds" and b.likelihood.masking == "block"


def test_skip_equal_false_keeps_every_state_with_zero_advantage(tiny):
    mod = DiSPO(z=2, skip_equal=False)
    ro = _gen(tiny, FIXED, mod.observers(FIXED, torch.Generator().manual_seed(0)))
    ctx, _ = _ctx(tiny, lambda rows, c: torch.zeros(len(rows)), ro.batch_size)
    (term,) = mod(_batch(ro), ctx).terms
    assert term.rollout.batch_size == 2 * ro.batch_size and (term.advantages == 0).all()


def test_threshold_rows_branch_at_their_fraction_or_their_last_step(tiny):
    obs = BranchObserver(z=2, temperature=0.9, timing="late", power=4.0, steps=None,
                         generator=torch.Generator().manual_seed(0))
    obs._init(torch.arange(len(PROMPTS)))
    obs.target[:] = torch.tensor([0.0, 0.5, 0.999, 0.999], dtype=torch.float64)
    ro = _gen(tiny, THRESH, [obs])
    st = ro.step_stats
    committed_before = (~st["dispo_masked"]).sum(-1).double() / 8  # fraction committed in x_t
    assert st["dispo_step"][0] == 0
    t1 = int(st["dispo_step"][1])  # first state with >= half committed
    assert committed_before[1] >= 0.5 and ((ro.commit_step[1] < t1 - 1).sum() < 4 if t1 > 0 else True)
    assert (st["dispo_step"][2:] == ro.num_steps[2:] - 1).all()  # never reached: the last step


@pytest.mark.slow  # minutes of CPU: CI's slow stage (make test-slow)
def test_two_processes_with_unequal_kept_states(tmp_path):
    """Rank 1 keeps no state, rank 0 some: both ranks still have the same term list (a 0-row step term
    on rank 1), the step completes, the weights agree (gloo, 2 CPU processes), and every rank runs the
    same number of model forwards in ``optimize`` (θ_old, reference and θ passes; FSDP / ZeRO-3 need
    it): rank 1 pads with dummy forwards whose loss is ×0, so the weights and loss metrics equal those
    of the same run with the padding turned off (where the forward counts differ)."""
    import subprocess
    import sys

    from test_distributed import _env, _free_port, _run

    worker = str(Path(__file__).resolve().parent / "dispo_dist_worker.py")
    for attempt in range(2):
        port = str(_free_port())
        procs = [subprocess.Popen([sys.executable, worker, str(tmp_path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port)) for r in range(2)]
        failed = _run(procs)
        if failed is None or attempt == 1 or not any(e in failed for e in ("EADDRINUSE", "address already in use")):
            break
    assert failed is None, failed
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))
    for mode in ("nopad", "pad"):
        assert r0[mode]["term_rows"]["step"] > 0 and r1[mode]["term_rows"]["step"] == 0  # kept states differ
        assert r0[mode]["term_rows"]["base"] == r1[mode]["term_rows"]["base"] == 12
        assert all(torch.equal(p, q) for p, q in zip(r0[mode]["weights"], r1[mode]["weights"]))
        assert "step/policy_loss" in r0[mode]["metrics"]
    # without padding rank 0 runs the step term's forwards alone (θ_old: μ = 2 passes, θ: 2, and the
    # reference for its KL, DiSPO's default β = 0.04)
    f0, f1 = r0["nopad"]["forwards"], r1["nopad"]["forwards"]
    assert f0["old"] > f1["old"] and f0["theta"] > f1["theta"] and f0["ref"] > f1["ref"] > 0
    # with it: the same count of every kind on both ranks, rank 0's unchanged
    assert r0["pad"]["forwards"] == r1["pad"]["forwards"] == f0
    pads = sum(f0[k] - f1[k] for k in f0)  # rank 1's dummy forwards; rank 0 runs none
    assert r0["pad"]["metrics"]["pad_forwards"] == pytest.approx(pads / 2)  # averaged over the 2 ranks
    assert r0["nopad"]["metrics"]["pad_forwards"] == 0.0
    # the dummy forwards' loss is ×0: the same update and loss metrics as without them
    assert all(torch.equal(p, q) for p, q in zip(r0["pad"]["weights"], r0["nopad"]["weights"]))
    assert not all(torch.equal(p, q) for p, q in
                   zip(r0["pad"]["weights"], build_tiny(hidden_size=32, num_layers=2, num_heads=2,
                                                        intermediate_size=64, seed=0).model.parameters()))
    # credit metrics are the whole batch's (issue 50 §1; rank 1 kept no state, rank 0 some): counts
    # add up, kept_frac is all kept states over all branched states, not the mean of the ranks' fractions
    from maskrl.credit.base import combine

    l0, l1 = r0["pad"]["credit_local"], r1["pad"]["credit_local"]
    assert l0["dispo/kept_frac"] > 0 == l1["dispo/kept_frac"]
    got = r0["pad"]["metrics"]
    for k in l0:
        assert got[f"credit/{k}"] == r1["pad"]["metrics"][f"credit/{k}"] == combine([l0[k], l1[k]]), k
    states = l0["dispo/states"] + l1["dispo/states"]
    assert got["credit/dispo/states"] == states
    kept = sum(r["dispo/kept_frac"] * r["dispo/states"] for r in (l0, l1))
    assert got["credit/dispo/kept_frac"] == pytest.approx(kept / states, rel=1e-12)
    # (unequal state counts, where the ranks' mean differs: tests/test_credit_shares.py)
    loss_keys = [k for k in r0["pad"]["metrics"] if k.split("/")[0] in ("base", "step") or k == "grad_norm"]
    assert "step/policy_loss" in loss_keys and "base/kl" in loss_keys
    for k in loss_keys:
        assert r0["pad"]["metrics"][k] == r0["nopad"]["metrics"][k], k


@pytest.mark.parametrize("cfg", [dataclasses.replace(FIXED, cache="prefix"), dataclasses.replace(THRESH, cache="prefix"),
                                 dataclasses.replace(THRESH, cache="dual")],
                         ids=["fixed-prefix", "threshold-prefix", "threshold-dual"])
def test_fillings_under_a_cache_come_from_thetas_exact_logits(cfg):
    """Issue 19 item 3: the fillings' recorded log-probs are θ's full-forward log-softmax at x_t (the
    distribution the step term's ratio scores them under), not the key/value cache's approximation."""
    from conftest import sharp_tiny

    a = sharp_tiny()
    ids, mask = encode_prompts(a.tokenizer, PROMPTS)
    obs = DiSPO(z=2, timing="uniform").observers(cfg, torch.Generator().manual_seed(1))
    ro = generate(a, ids, mask, cfg, generator=torch.Generator().manual_seed(0), observers=obs)
    st = ro.step_stats
    checked = 0
    for i in range(ro.batch_size):
        t = int(st["dispo_step"][i])
        sel = st["dispo_masked"][i]
        x = torch.cat([ids[i], torch.where(sel, a.mask_id, ro.completion_ids[i])])[None]
        attn = torch.cat([mask[i], torch.ones(ro.gen_length, dtype=torch.bool)])[None]
        with torch.no_grad():
            z = a.logits(x, attn)[0, ids.shape[1]:].double()
        z[:, a.mask_id] = float("-inf")
        lp = torch.log_softmax(z, -1)
        for k in range(2):
            fill = st["dispo_fill"][i, k]
            want = lp[sel].gather(-1, fill[sel][:, None]).squeeze(-1)
            torch.testing.assert_close(st["dispo_logp_old"][i, k][sel].double(), want, rtol=1e-4, atol=1e-4)
        checked += int(t > 0 and (ro.commit_step[i] < t).any())
    assert checked  # some branch lies past a block's first step, where the cache would have answered


def test_step_term_kl_and_tokens_after_the_stop_are_fields(tiny, tmp_path):
    """Issue 19 item 5: docs/spec.md §4 leaves the step term's KL and the filled tokens after a branch's first
    stop token open; both are fields with documented defaults (β = 0.04, the paper adds a KL; tokens
    after the stop not trained), and each setting changes what the term computes."""
    assert (DiSPO().beta, DiSPO().train_after_stop) == (0.04, False)
    assert DiSPO().needs_reference and not DiSPO(beta=0.0).needs_reference and not DiSPO(alpha_step=0.0).needs_reference
    with pytest.raises(ValueError, match="beta"):
        DiSPO(beta=-0.1)
    ro = _gen(tiny, FIXED, DiSPO(z=2, timing="uniform").observers(FIXED, torch.Generator().manual_seed(0)))
    st = dict(ro.step_stats)
    fill = st["dispo_fill"].clone()  # a stop token as the first filled position of every branch
    first = st["dispo_masked"].long().argmax(-1)  # [N] first masked position of each state
    fill[torch.arange(ro.batch_size), :, first] = tiny.eos_id
    ro = dataclasses.replace(ro, step_stats={**st, "dispo_fill": fill})
    terms = {}
    for after in (False, True):  # continuous random rewards: every state kept, branches in row order
        ctx, _ = _ctx(tiny, lambda rows, c: torch.rand(len(rows), generator=torch.Generator().manual_seed(1)), ro.batch_size)
        (terms[after],) = DiSPO(z=2, timing="uniform", train_after_stop=after)(_batch(ro), ctx).terms
    t0, t1 = terms[False], terms[True]
    filled = st["dispo_masked"].repeat_interleave(2, 0)
    assert t1.rollout.batch_size == 2 * ro.batch_size and torch.equal(t1.mask, filled)  # every filled position
    assert torch.equal(t0.mask, filled & t0.rollout.completion_mask)  # up to and including the first stop
    assert (t0.mask.sum(-1) == 1).all() and (t1.mask.sum(-1) > 1).any()  # the stop is the first filled one
    assert t0.objective.beta == 0.04 and DiSPO(beta=0.0).step_term(_batch(ro), ctx)[0].objective.beta == 0.0
    # in a trainer step: the KL is logged under step/ and needs the reference; β = 0 logs none
    _, m = _run(tmp_path, "[{name: dispo, z: 2, timing: uniform}]", objective="spg", likelihood="spg_bounds")
    assert "step/kl" in m and m["step/kl"] >= 0 and m["step/kl_clamp_frac"] == 0.0
    _, m0 = _run(tmp_path, "[{name: dispo, z: 2, timing: uniform, beta: 0.0}]", objective="spg", likelihood="spg_bounds")
    assert "step/kl" not in m0
