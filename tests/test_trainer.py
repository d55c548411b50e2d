"""RL trainer: seeded likelihood masks, parameter updates, checkpoint resume."""
from __future__ import annotations

import copy

import pytest
import torch

from maskrl.tasks.base import Example
from maskrl.trainer import RLTrainer, latest_checkpoint
from conftest import OddChars
from conftest import fresh_tiny as _tiny
from conftest import small_cfg as _cfg


def _examples(n=6):
    return [Example(id=i, prompt=f"say a {i}") for i in range(n)]


def _spy(adapter, tag, log):
    """Record the input of every forward of ``adapter`` (all of them go through ``_raw_logits``)."""
    real = adapter._raw_logits

    def raw_logits(input_ids, attention_mask=None):
        log.append((tag, input_ids.clone()))
        return real(input_ids, attention_mask)

    adapter._raw_logits = raw_logits


def _optimize_logging_inputs(tr, batch):
    """Run ``tr.optimize(batch)`` and return the model inputs of θ, θ_old and the reference, in call order."""
    log = []
    _spy(tr.policy, "theta", log)
    _spy(tr.policy_eval, "old", log)
    _spy(tr.reference, "ref", log)
    tr.optimize(batch)
    return {tag: [x for t, x in log if t == tag] for tag in ("theta", "old", "ref")}


def test_masks_shared_by_policy_old_ref_within_iteration_and_fresh_across(tmp_path):
    tr = RLTrainer(_cfg(tmp_path), _tiny(), OddChars(), _examples())
    batch = tr.collect()
    by = _optimize_logging_inputs(tr, batch)
    P = batch.rollout.prompt_ids.shape[1]
    assert [len(v) for v in by.values()] == [2, 2, 2]  # μ = 2 iterations, one micro-batch
    for k in range(2):
        assert torch.equal(by["theta"][k], by["old"][k]) and torch.equal(by["theta"][k], by["ref"][k])
        assert (by["theta"][k][:, P:] == tr.policy.mask_id).all()  # completion fully masked
    masked0 = by["theta"][0][:, :P] == tr.policy.mask_id
    masked1 = by["theta"][1][:, :P] == tr.policy.mask_id
    assert masked0.any() and not torch.equal(masked0, masked1)
    # padding is never masked
    pad = ~batch.rollout.prompt_mask
    assert (by["theta"][0][:, :P][pad] == tr.policy.pad_id).all()


def test_state_likelihood_scores_commit_states_shared_by_policy_old_ref(tmp_path):
    """objective.likelihood=state: every forward of θ, θ_old and the reference sees the same rollout
    states, one per (sequence, commit step), with exactly the later-committed positions masked."""
    tr = RLTrainer(_cfg(tmp_path, **{"likelihood.name": "state"}), _tiny(), OddChars(), _examples())
    assert type(tr.likelihood).__name__ == "State"
    batch = tr.collect()
    by = _optimize_logging_inputs(tr, batch)
    ro = batch.rollout
    P, T = ro.prompt_ids.shape[1], int(ro.num_steps.max())
    assert [len(v) for v in by.values()] == [2, 2, 2]
    for k in range(2):
        x = by["theta"][k]
        assert torch.equal(x, by["old"][k]) and torch.equal(x, by["ref"][k])
        assert x.shape[0] == ro.batch_size * T  # fixed schedule: every step commits in every row
        comp = x[:, P:].view(ro.batch_size, T, -1)
        expect = torch.where(ro.commit_step[:, None] >= torch.arange(T)[None, :, None], tr.policy.mask_id,
                             ro.completion_ids[:, None])
        assert torch.equal(comp, expect)


@pytest.mark.parametrize("likelihood", ["mean_field", "state"])
@pytest.mark.numerics
def test_micro_batching_gives_the_same_update_as_one_batch(tmp_path, likelihood):
    init = _tiny()
    # with one micro-batch the mask seed of micro-batch 0 differs from b's split; p_mask_prompt=0 removes that
    over = {"train.inner_iterations": 1, "likelihood.name": likelihood, "likelihood.p_mask_prompt": 0.0}
    a = RLTrainer(_cfg(tmp_path / "a", **over), copy.deepcopy(init), OddChars(), _examples())
    b = RLTrainer(_cfg(tmp_path / "b", **over, **{"train.micro_batch_size": 2}),
                  copy.deepcopy(init), OddChars(), _examples())
    batch = a.collect()
    a.optimize(batch)
    b.optimize(batch)
    # compare the accumulated gradients (Adam's first step, g/|g|, would amplify float noise of ~0 entries)
    for (n, p), q in zip(a.policy_eval.model.named_parameters(), b.policy_eval.model.parameters()):
        assert p.grad is not None and p.grad.abs().sum() > 0, n
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7, msg=n)


def test_a_few_steps_change_every_trainable_parameter(tmp_path):
    tr = RLTrainer(_cfg(tmp_path), _tiny(), OddChars(), _examples())
    before = {n: p.detach().clone() for n, p in tr.policy_eval.model.named_parameters()}
    hist = tr.train(steps=3, progress=False)
    assert len(hist) == 3 and all("reward" in h and "base/kl" in h for h in hist)
    unchanged = [n for n, p in tr.policy_eval.model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []
    # the reference stays frozen
    ref_same = all(torch.equal(p, before[n]) for n, p in tr.reference.model.named_parameters())
    assert ref_same
    tr.close()
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3


def test_resume_gives_the_same_next_step(tmp_path):
    init = _tiny()
    a = RLTrainer(_cfg(tmp_path / "a"), copy.deepcopy(init), OddChars(), _examples())
    a.step()
    ckpt = a.save_checkpoint(tmp_path / "a" / "checkpoints" / "step_1")
    m2 = a.step()
    assert latest_checkpoint(tmp_path / "a") == ckpt

    b = RLTrainer(_cfg(tmp_path / "b"), copy.deepcopy(init), OddChars(), _examples())
    b.load_checkpoint(ckpt)
    assert b.step_count == 1
    n2 = b.step()
    assert n2["base/policy_loss"] == pytest.approx(m2["base/policy_loss"], rel=1e-5, abs=1e-7)
    assert n2["reward"] == pytest.approx(m2["reward"])
    for p, q in zip(a.policy_eval.model.parameters(), b.policy_eval.model.parameters()):
        torch.testing.assert_close(p, q)


def test_bad_checkpoint_path_is_a_clear_error(tmp_path):
    tr = RLTrainer(_cfg(tmp_path), _tiny(), OddChars(), _examples())
    with pytest.raises(FileNotFoundError, match="not a maskrl checkpoint"):
        tr.load_checkpoint(tmp_path)


@pytest.mark.parametrize("kind, step_one, step_two, after", [("constant_with_warmup", 1e-3, 1e-3, 1e-3),
                                                              ("linear", 1e-3, 5e-4, 0.0)])
def test_lr_schedule_steps_once_per_optimizer_step(tmp_path, kind, step_one, step_two, after):
    """train.lr_scheduler via transformers.get_scheduler over steps × μ optimizer steps (μ = 2 here);
    the logged lr is the rate of the step's first optimizer step."""
    tr = RLTrainer(_cfg(tmp_path, **{"train.steps": 2, "train.lr_scheduler": kind}), _tiny(), OddChars(), _examples())
    lrs = [h["lr"] for h in tr.train(progress=False)]
    assert lrs == pytest.approx([step_one, step_two], abs=1e-12)
    assert tr.scheduler.get_last_lr()[0] == pytest.approx(after, abs=1e-12)


def test_bad_lr_scheduler_is_a_config_error(tmp_path):
    from maskrl.config import ConfigError

    with pytest.raises(ConfigError, match="train.lr_scheduler: unknown 'cosin'; valid: .*cosine"):
        _cfg(tmp_path, **{"train.lr_scheduler": "cosin"})


@pytest.mark.parametrize("likelihood", ["mean_field", "state"])
def test_metrics_do_not_depend_on_micro_batching(tmp_path, likelihood):
    """One metric rule (shares summed over micro-batches): the logged loss metrics of one batch are
    the same for micro-batch sizes 0 (whole batch), 4 and 1 and for a forward-row budget, and equal
    the objective's value on the whole batch. (p_mask_prompt = 0 so that every split sees the same
    inputs; the masks' seeds are per micro-batch.)"""
    init = _tiny()
    over = {"train.inner_iterations": 1, "likelihood.name": likelihood, "likelihood.p_mask_prompt": 0.0,
            "train.prompts_per_step": 3}  # N = 9: micro-batches of 4 leave a remainder of 1
    splits = [{"train.micro_batch_size": 0}, {"train.micro_batch_size": 4}, {"train.micro_batch_size": 1},
              {"train.max_forward_rows": 7}]
    trainers = [RLTrainer(_cfg(tmp_path / str(i), **over, **s), copy.deepcopy(init), OddChars(), _examples())
                for i, s in enumerate(splits)]
    batch = trainers[0].collect()
    assert batch.advantages.abs().sum() > 0
    metrics = [tr.optimize(batch) for tr in trainers]
    keys = {"base/policy_loss", "base/kl", "base/kl_clamp_frac", "base/clip_frac", "base/ratio_mean",
            "base/ratio_clamp_frac", "grad_norm"}
    assert keys <= metrics[0].keys()
    for m in metrics[1:]:
        assert m.keys() == metrics[0].keys()
        for k in keys:
            assert m[k] == pytest.approx(metrics[0][k], rel=1e-4, abs=1e-8), k
    # the whole batch's value: ratio 1 at μ = 1, so ratio_mean is exactly 1 and clip_frac 0
    assert metrics[2]["base/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics[2]["base/clip_frac"] == 0.0 and metrics[2]["base/ratio_clamp_frac"] == 0.0
    # KL of the whole batch, recomputed in one call with the initial weights (the first step's input)
    tr = RLTrainer(_cfg(tmp_path / "ref", **over), copy.deepcopy(init), OddChars(), _examples())
    with torch.no_grad():
        ro, mask = batch.rollout, batch.rollout.completion_mask
        lp = tr.likelihood(tr.policy_eval, ro, None, mask)
        ref = tr.likelihood(tr.reference, ro, None, mask)
        whole = tr.objective(lp, lp, ref, batch.advantages, mask)
    assert metrics[1]["base/kl"] == pytest.approx(whole.metrics["kl"], rel=1e-4, abs=1e-8)


def test_split_rows_respects_sequence_and_row_budgets():
    from maskrl.trainer import split_rows

    rows = torch.tensor([3, 1, 4, 1, 5])
    assert split_rows(rows) == [slice(0, 5)]
    assert split_rows(rows, max_sequences=2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert split_rows(rows, max_rows=5) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert split_rows(rows, max_rows=2) == [slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4), slice(4, 5)]
    assert split_rows(rows, max_sequences=2, max_rows=100) == split_rows(rows, max_sequences=2)
    assert split_rows(torch.zeros(0, dtype=torch.long), max_rows=3) == []


@pytest.mark.numerics
def test_row_budget_gives_the_same_update(tmp_path):
    """train.max_forward_rows splits the state likelihood's rows (one per commit step) into several
    forwards; the accumulated gradient equals the whole batch's."""
    init = _tiny()
    over = {"train.inner_iterations": 1, "likelihood.name": "state", "likelihood.p_mask_prompt": 0.0}
    a = RLTrainer(_cfg(tmp_path / "a", **over), copy.deepcopy(init), OddChars(), _examples())
    b = RLTrainer(_cfg(tmp_path / "b", **over, **{"train.max_forward_rows": 5}), copy.deepcopy(init), OddChars(),
                  _examples())
    batch = a.collect()
    rows = b.likelihood.rows(batch.rollout, batch.rollout.completion_mask)
    assert len(__import__("maskrl.trainer", fromlist=["split_rows"]).split_rows(rows, 0, 5)) > 1
    a.optimize(batch)
    b.optimize(batch)
    for (n, p), q in zip(a.policy_eval.model.named_parameters(), b.policy_eval.model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7, msg=n)


def test_pad_counts_brings_every_process_to_the_most_forwards_per_term():
    from maskrl.trainer import pad_counts

    work = torch.tensor([[3, 9, 0], [3, 0, 0], [2, 4, 1]])  # [P=3 processes, K=3 terms]
    assert pad_counts(work).tolist() == [[0, 0, 1], [0, 9, 1], [1, 5, 0]]
    assert ((work + pad_counts(work)) == work.max(0).values).all()
    assert pad_counts(torch.tensor([[5, 0]])).tolist() == [[0, 0]]  # one process: never pads
    for bad in (torch.zeros(3, dtype=torch.long), torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.bool)):
        with pytest.raises(ValueError, match="work"):
            pad_counts(bad)


def _padding_setup():
    from maskrl.sampling import SamplerConfig, generate
    from maskrl.text import encode_prompts

    a = _tiny()
    ids, mask = encode_prompts(a.tokenizer, ["abc", "hello there", "x"])
    ro = generate(a, ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=1.0),
                  generator=torch.Generator().manual_seed(3))
    return a, ro


def _term(ro, likelihood, name="step"):
    from maskrl.objectives import DiffuGRPO
    from maskrl.types import LossTerm

    return LossTerm(name=name, weight=1.0, rollout=ro, advantages=torch.zeros(ro.completion_ids.shape),
                    mask=ro.completion_mask.clone(), objective=DiffuGRPO(beta=0.0), likelihood=likelihood)


def test_padding_row_picks_the_terms_row_or_the_batchs_and_stays_in_the_row_budget():
    from maskrl.likelihood import MeanField, State
    from maskrl.trainer import padding_row

    _, ro = _padding_setup()
    other = ro.select(slice(1, 3))
    # a term with rows: its own first row, every position asked for (mean_field: 1 forward row)
    r1, need = padding_row(_term(other, MeanField()), ro, max_rows=1)
    assert torch.equal(r1.completion_ids, other.completion_ids[:1]) and need.dtype == torch.bool
    assert need.shape == (1, 8) and bool(need.all())
    # a 0-row term (nothing kept on this process): the batch's first row
    empty = ro.select(torch.zeros(0, dtype=torch.long))
    r0, need = padding_row(_term(empty, MeanField()), ro, max_rows=1)
    assert torch.equal(r0.completion_ids, ro.completion_ids[:1]) and torch.equal(r0.commit_step, ro.commit_step[:1])
    # state: the whole row costs one forward row per commit step (4 here); over the budget -> position 0 only
    steps = int(ro.commit_step[0].unique().numel())
    assert steps == 4
    _, need = padding_row(_term(ro, State()), ro, max_rows=steps)
    assert bool(need.all())
    _, need = padding_row(_term(ro, State()), ro, max_rows=steps - 1)
    assert need.tolist() == [[True] + [False] * 7]
    assert int(State().rows(ro.select(slice(0, 1)), need).sum()) == 1
    with pytest.raises(ValueError, match="no row for a padding forward"):
        padding_row(_term(empty, MeanField()), empty, max_rows=1)


@pytest.mark.parametrize("name", ["mean_field", "state", "stratified", "elbo", "spg_bounds"])
def test_a_padding_forward_runs_the_model_exactly_once(name):
    """What the padding relies on: a dummy call of every built-in likelihood runs one model forward,
    whatever its generator draws (spg_bounds scores one drawn block per call: asking for the whole
    row is what makes it score something every time)."""
    from maskrl.likelihood import LIKELIHOODS
    from maskrl.likelihood.base import tensors_of
    from maskrl.trainer import padding_row

    a, ro = _padding_setup()
    lik = LIKELIHOODS.get(name)()
    calls = []
    a.model.register_forward_pre_hook(lambda *_: calls.append(1))
    pad_ro, need = padding_row(_term(ro, lik), ro, max_rows=64)
    for seed in range(20):
        calls.clear()
        with torch.no_grad():
            out = lik(a, pad_ro, torch.Generator().manual_seed(seed), need)
        assert len(calls) == 1, (name, seed)
        assert all(v.shape == (1, 8) for v in tensors_of(out).values())


def _estimators():
    from maskrl.likelihood import ELBO, LIKELIHOODS, SPGBounds

    every = [(n, LIKELIHOODS.get(n)()) for n in LIKELIHOODS.names()]
    return every + [("elbo-independent", ELBO(coupled=False)), ("elbo-block", ELBO(masking="block")),
                    ("spg_bounds-spg_public", SPGBounds(masking="spg_public", nodes=1, draws=2))]


@pytest.mark.parametrize("name,lik", _estimators(), ids=[n for n, _ in _estimators()])
def test_every_estimator_runs_its_forward_whatever_its_masks_draw(name, lik):
    """Issue 21 §4: a call asking for one position of one row runs exactly one model forward at every
    seed -- also where the masks score nothing asked for (``elbo`` / ``spg_bounds`` drew another
    block, or no node hid the position), where the old code ran none, so FSDP ranks could differ by a
    forward. The output is then 0 and still carries a (zero) gradient to every parameter."""
    from maskrl.likelihood.base import tensors_of

    a, ro = _padding_setup()
    if name == "block_elbo":  # it scores block-diffusion models only: the same model, block-causal
        a.block_size = 4
    calls = []
    a.model.register_forward_pre_hook(lambda *_: calls.append(1))
    need = torch.zeros_like(ro.completion_mask)
    need[1, 6] = True  # block 1 of 2 (block length 4)
    empty = 0
    for seed in range(16):
        calls.clear()
        out = tensors_of(lik(a, ro, torch.Generator().manual_seed(seed), need))
        assert len(calls) == 1, (name, seed)
        assert all(v.shape == (3, 8) and (v[~need] == 0).all() for v in out.values())
        if all((v == 0).all() for v in out.values()):  # the masks scored nothing asked for
            empty += 1
            a.model.zero_grad(set_to_none=True)
            sum(v.sum() for v in out.values()).backward()
            grads = [p.grad for p in a.model.parameters() if p.requires_grad]
            assert all(g is not None and (g == 0).all() for g in grads[-2:])  # the last layers took part
    if name in ("spg_bounds", "elbo-block", "elbo-independent"):
        assert empty > 0, name  # the case of the issue did happen at some seed
    # nothing asked for: rows() == 0 and no forward
    calls.clear()
    lik(a, ro, torch.Generator().manual_seed(0), torch.zeros_like(need))
    assert int(lik.rows(ro, torch.zeros_like(need)).sum()) == 0 and not calls


class _HalfOdd(OddChars):
    """OddChars whose completions count as correct from half their characters odd."""

    correct_threshold = 0.5


def test_correct_reward_trains_on_the_task_correctness_indicator(tmp_path):
    """train.reward=correct: the same rollout, rewards 1[task reward ≥ threshold], advantages from
    them; the task's own rewards kept for logging; credit re-scoring gets the indicator too."""
    task_tr = RLTrainer(_cfg(tmp_path / "t"), _tiny(), _HalfOdd(), _examples())
    corr_tr = RLTrainer(_cfg(tmp_path / "c", **{"train.reward": "correct"}), _tiny(), _HalfOdd(), _examples())
    a, b = task_tr.collect(), corr_tr.collect()
    assert torch.equal(a.rollout.completion_ids, b.rollout.completion_ids)
    want = (a.rewards >= 0.5).float()
    assert 0 < want.sum() < want.numel()  # both values occur: the test can tell the rewards apart
    assert torch.equal(b.rewards, want) and torch.equal(b.task_rewards, a.rewards)
    assert torch.equal(b.advantages[:, 0], corr_tr.objective.advantages(want, b.rollout.group_ids))
    n = b.rollout.batch_size
    ctx = corr_tr._credit_context(_examples(n), b.rewards, b.rollout.group_ids, b.advantages[:, 0], 0)
    assert torch.equal(ctx.score(torch.arange(n), b.rollout.completion_ids), want)
    m = corr_tr.step()  # logs: reward = the indicator's mean, solved from the task's rewards, task_reward beside
    assert m["reward"] == pytest.approx(m["solved"]) and (m["reward"] * n) == pytest.approx(round(m["reward"] * n))
    assert 0.0 < m["task_reward"] < 1.0


def test_bad_train_reward_is_a_config_error(tmp_path):
    from maskrl.config import ConfigError

    with pytest.raises(ConfigError, match="train.reward: unknown 'solved'; valid: task, correct"):
        _cfg(tmp_path, **{"train.reward": "solved"})


def test_named_seeds_return_the_trainers_integers():
    """Every stream's seed (maskrl.training.seeds) is the integer the trainer has always drawn from:
    hand-computed from the formulas (a change here changes every recorded run)."""
    from maskrl.training import seeds

    assert seeds.data_seed(3, 1) == 3 * 7919 + 1 == 23758
    assert seeds.rollout_seed(3, 1) == 3 * 104729 + 17 + 1 == 314205
    # mask_seed((base + 7919 term) * 1000003 + step * 10007 + iteration * 101 + micro-batch) mod 2^63 - 1
    assert seeds.likelihood_seed(3, 2, 1, 4, 0) == 3 * 1_000_003 + 2 * 10_007 + 101 + 4 == 3020128
    assert seeds.likelihood_seed(3, 2, 1, 4, 1) == (3 + 7919) * 1_000_003 + 2 * 10_007 + 101 + 4
    assert seeds.padding_seed(3, 2, 1, 0, 0) == seeds.mask_seed(3, 2, 1, -1) == 3020123
    assert seeds.padding_seed(0, 0, 0, 0, 0) == 2**63 - 2  # -1 mod (2^63 - 1)
    assert seeds.credit_seed(3, 0, 2, 1) == 4 * 1_000_003 + 2 * 10_007 + 1
    assert seeds.observer_seed(3, 0, 2, 1) == 4 * 1_000_003 + 2 * 10_007 + 101 + 1
    # streams of a process that resumes without one of its own: apart from every first stream
    firsts = {seeds.data_seed(3, r) for r in range(8)} | {seeds.rollout_seed(3, r) for r in range(8)}
    resumed = {seeds.resumed_data_seed(3, r, s) for r in range(8) for s in range(4)}
    resumed |= {seeds.resumed_rollout_seed(3, r, s) for r in range(8) for s in range(4)}
    assert len(resumed) == 64 and not resumed & firsts
