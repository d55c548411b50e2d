"""Issue 13 items 1-5: non-finite guards, collapse diagnostics, resume with a longer schedule, dropout
off in the RL forward, bf16 full fine-tuning refused at config time (maskrl.health and its trainer call sites)."""
from __future__ import annotations

import logging
import math

import pytest
import torch

from maskrl.config import ConfigError, load_config
from maskrl.health import (NonFiniteError, NonFiniteLogits, check_rewards, collapse_message, nonfinite_rows,
                           rollout_diagnostics)
from maskrl.models import apply_lora, enable_gradient_checkpointing
from maskrl.models.scale import rl_train_mode
from maskrl.tasks.base import Example, Task
from maskrl.trainer import RLTrainer
from conftest import OddChars
from conftest import fresh_tiny as _tiny
from conftest import small_cfg as _cfg


class BadReward(Task):
    """Returns ``value`` for row 4 and a normal reward for the others."""

    name = "bad_reward"

    def __init__(self, value):
        super().__init__()
        self.value = value

    def reward(self, prompts, completions, **_):
        out = [0.5] * len(completions)
        out[4] = self.value
        return out


def _examples(n=6):
    return [Example(id=100 + i, prompt=f"say a {i}") for i in range(n)]


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _unchanged(before, model):
    return all(torch.allclose(before[n], p.detach(), equal_nan=True, rtol=0, atol=0) for n, p in model.named_parameters())


# ---------------------------------------------------------------- item 1: pure functions
def test_nonfinite_rows_and_error_message():
    x = torch.zeros(4, 3)
    x[1, 2] = float("nan")
    x[3, 0] = float("-inf")
    assert nonfinite_rows(x) == [1, 3]
    assert nonfinite_rows(torch.zeros(2, 2)) == []
    assert nonfinite_rows(torch.tensor(float("inf"))) == [0]
    e = NonFiniteError("loss", 7, [1, 3])
    assert "loss" in str(e) and "step 7" in str(e) and "[1, 3]" in str(e)


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf"), "1.0", [1.0]])
def test_reward_that_is_not_a_finite_number_names_task_and_row(bad):
    comps = [f"c{i}" for i in range(6)]
    with pytest.raises(ValueError) as e:
        check_rewards([0.0, 1.0, 0.5, 0.0, bad, 1.0], "my_task", [10, 11, 12, 13, 14, 15], comps)
    msg = str(e.value)
    assert "'my_task'" in msg and "row 4" in msg and "14" in msg and "'c4'" in msg


def test_check_rewards_accepts_numbers():
    assert check_rewards([0, 1, 0.25, True, torch.tensor(0.5)], "t") == [0.0, 1.0, 0.25, 1.0, 0.5]
    with pytest.raises(ValueError, match="2 values for 3 completions"):
        check_rewards([0.0, 1.0], "t", completions=["a", "b", "c"])


def test_nonfinite_logits_observer_ignores_the_mask_column():
    class View:  # the sampler's StepView: flat [M, V] logits at the covered positions
        def __init__(self, logits, step=0):
            self.step, self.rows = step, torch.tensor([5, 6, 7])
            self.covered = torch.ones(logits.shape[:2], dtype=torch.bool)
            self.logits = logits.reshape(-1, logits.shape[-1])

    obs = NonFiniteLogits(mask_id=2)
    lg = torch.zeros(3, 4, 5)
    lg[..., 2] = float("-inf")  # the sampler's own [M] exclusion
    obs.on_step(View(lg))
    assert obs.step is None
    lg = lg.clone()
    lg[1, 3, 0] = float("nan")
    lg[2, 0, 4] = float("-inf")
    obs.on_step(View(lg, step=3))
    assert obs.step == 3 and obs.rows == [6, 7]
    assert obs.result() == {}


def test_nonfinite_logits_observer_ignores_ids_without_a_tokenizer_entry():
    class View:
        def __init__(self, logits):
            self.step, self.rows = 0, torch.tensor([0, 1])
            self.covered = torch.ones(logits.shape[:2], dtype=torch.bool)
            self.logits = logits.reshape(-1, logits.shape[-1])

    lg = torch.zeros(2, 3, 8)
    lg[..., 2] = float("-inf")
    lg[..., 6:] = float("-inf")  # ids 6, 7: padded output rows, set by the sampler (candidate_logits)
    obs = NonFiniteLogits(mask_id=2, token_count=6)
    obs.on_step(View(lg))
    assert obs.step is None
    lg[1, 0, 5] = float("-inf")  # a real id's logit overflowing is still caught
    obs.on_step(View(lg))
    assert obs.step == 0 and obs.rows == [1]


def test_a_model_with_padded_output_rows_trains(tmp_path):
    """Qwen2-based models (Dream-7B: 152,064 output rows, 151,665 tokenizer ids) train: the sampler's own
    -inf at the padded rows is not a non-finite logit (it stopped every Dream run at its first step)."""
    from test_sampling_candidates import padded_vocab

    ad = padded_vocab()
    assert ad.token_count < ad.model.config.vocab_size
    tr = RLTrainer(_cfg(tmp_path), ad, OddChars(), _examples())
    metrics = tr.step()
    assert metrics["step"] == 1 and tr.nonfinite_skips == 0


# ---------------------------------------------------------------- item 1: in the trainer
def test_nan_weight_is_caught_at_the_logits_and_weights_untouched(tmp_path):
    a = _tiny()
    with torch.no_grad():
        a.model.lm_head.weight[40, 0] = float("nan")
    tr = RLTrainer(_cfg(tmp_path), a, OddChars(), _examples())
    before = _params(a.model)
    with pytest.raises(NonFiniteError) as e:
        tr.step()
    assert e.value.stage == "logits" and e.value.step == 1 and e.value.rows == list(range(6))
    assert "sampler step 0" in str(e.value)
    assert _unchanged(before, a.model)


def test_nan_weight_skip_mode_counts_and_never_updates(tmp_path):
    a = _tiny()
    with torch.no_grad():
        a.model.lm_head.weight[40, 0] = float("nan")
    tr = RLTrainer(_cfg(tmp_path, **{"train.on_nonfinite": "skip", "train.lr_scheduler": "linear",
                                     "train.steps": 4}), a, OddChars(), _examples())
    before = _params(a.model)
    hist = tr.train(steps=2, progress=False)
    assert [h["nonfinite_skips"] for h in hist] == [1, 2]
    assert _unchanged(before, a.model)
    # the schedule stays tied to the step count: μ = 2 scheduler steps per skipped RL step
    assert hist[1]["lr"] == pytest.approx(1e-3 * (1 - 1 / 4))


@pytest.mark.parametrize("stage", ["log-probs (θ)", "loss", "grad norm", "log-probs (reference)"])
@pytest.mark.parametrize("mode", ["error", "skip"])
def test_nonfinite_at_each_later_stage(tmp_path, monkeypatch, stage, mode):
    a = _tiny()
    tr = RLTrainer(_cfg(tmp_path, **{"train.on_nonfinite": mode}), a, OddChars(), _examples())
    if stage == "log-probs (θ)" or stage == "log-probs (reference)":
        real = tr._loglik
        target = tr.policy if stage == "log-probs (θ)" else tr.reference

        def loglik(term, adapter, rollout, seed, need):
            out = real(term, adapter, rollout, seed, need)
            if adapter is target:
                out = out.clone()
                out[1, 0] = float("nan")
            return out

        monkeypatch.setattr(tr, "_loglik", loglik)
    elif stage == "loss":
        real_obj = tr.objective

        class NanLoss:
            def __getattr__(self, name):
                return getattr(real_obj, name)

            def __call__(self, *args, **kw):
                out = real_obj(*args, **kw)
                return type(out)(loss=out.loss * float("nan"), metrics=out.metrics)

        tr.objective = NanLoss()
    else:  # a finite loss whose gradient is not finite
        p = next(q for q in a.model.parameters() if q.requires_grad)
        p.register_hook(lambda g: g * float("inf"))
    before = _params(a.model)
    if mode == "error":
        with pytest.raises(NonFiniteError) as e:
            tr.step()
        assert e.value.stage == stage and e.value.step == 1
        if stage.startswith("log-probs"):
            assert e.value.rows == [1]
    else:
        m = tr.step()
        assert m["nonfinite_skips"] == 1
    assert _unchanged(before, a.model)


def test_overflowing_rewards_are_caught_at_the_advantages(tmp_path):
    class Huge(Task):
        name = "huge"

        def reward(self, prompts, completions, **_):
            return [3e38] * len(completions)

    tr = RLTrainer(_cfg(tmp_path), _tiny(), Huge(), _examples())
    with pytest.raises(NonFiniteError) as e:
        tr.step()
    assert e.value.stage == "advantages"


@pytest.mark.parametrize("value", [None, float("nan")])
def test_reward_function_returning_none_or_nan_in_training(tmp_path, value):
    tr = RLTrainer(_cfg(tmp_path), _tiny(), BadReward(value), _examples())
    with pytest.raises(ValueError, match=r"task 'bad_reward': reward of row 4 \(example id"):
        tr.step()


# ---------------------------------------------------------------- item 2: collapse diagnostics
def test_rollout_diagnostics_hand_computed():
    ids = torch.tensor([[5, 5, 5, 5, 6, 2],    # valid: 5 5 5 5 6 -> run 4 of 5, distinct 2/5
                        [1, 2, 3, 4, 5, 6],    # all valid: run 1, distinct 6/6
                        [7, 7, 0, 0, 0, 0]])   # valid: 7 7 -> too short to be degenerate
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    prob = torch.full((3, 6), 0.5)
    prob[1] = 1.0
    d = rollout_diagnostics(ids, mask, prob)
    n_tok = 5 + 6 + 2
    assert d["commit_nll"] == pytest.approx((7 * math.log(2)) / n_tok)
    assert d["distinct_frac"] == pytest.approx((2 / 5 + 1 + 1 / 2) / 3)
    assert d["longest_run"] == pytest.approx((4 + 1 + 2) / 3)
    assert d["degenerate_frac"] == pytest.approx(1 / 3) and d["empty_frac"] == 0.0
    assert collapse_message(d, 3) is None
    assert "collapsed" in collapse_message({**d, "degenerate_frac": 0.9}, 3)


def test_loops_and_empty_completions_are_degenerate():
    ids = torch.tensor([[3, 4, 3, 4, 3, 4, 3, 4],    # "abab..." loop: run 1 but 2 distinct over 8 tokens
                        [9, 2, 2, 2, 2, 2, 2, 2],    # only the stop token (2) is valid: empty
                        [1, 2, 3, 4, 5, 6, 7, 8]])   # healthy
    mask = torch.tensor([[1] * 8, [1] + [0] * 7, [1] * 8], dtype=torch.bool)
    d = rollout_diagnostics(ids, mask, torch.ones(3, 8))
    assert d["degenerate_frac"] == pytest.approx(2 / 3) and d["empty_frac"] == pytest.approx(1 / 3)
    assert collapse_message(d, 1) is not None


@pytest.mark.parametrize("token", ["!", "1", "<eos>"])
def test_collapse_towards_any_token_is_flagged(tmp_path, caplog, token):
    a = _tiny()
    tid = a.eos_id if token == "<eos>" else a.tokenizer.convert_tokens_to_ids(token)

    def bias(module, args, out):
        out = out.clone()
        out[..., tid] += 50.0
        return out

    a.model.lm_head.register_forward_hook(bias)
    with caplog.at_level(logging.WARNING, logger="maskrl.trainer"):
        m = RLTrainer(_cfg(tmp_path), a, OddChars(), _examples()).step()
    assert m["degenerate_frac"] == 1.0
    assert any("collapsed" in r.getMessage() for r in caplog.records)


def test_collapsed_policy_is_flagged_in_metrics_and_warned(tmp_path, caplog):
    a = _tiny()
    bang = a.tokenizer.convert_tokens_to_ids("!")

    def bias(module, args, out):  # +50 on the "!" logit
        out = out.clone()
        out[..., bang] += 50.0
        return out

    a.model.lm_head.register_forward_hook(bias)
    tr = RLTrainer(_cfg(tmp_path), a, OddChars(), _examples())
    with caplog.at_level(logging.WARNING, logger="maskrl.trainer"):
        m = tr.step()
    assert m["degenerate_frac"] == 1.0 and m["longest_run"] == 8.0
    assert m["distinct_frac"] == pytest.approx(1 / 8) and m["commit_nll"] < 1e-6
    assert any("collapsed" in r.getMessage() for r in caplog.records)


def test_healthy_rollouts_are_not_flagged(tmp_path, caplog):
    tr = RLTrainer(_cfg(tmp_path), _tiny(), OddChars(), _examples())
    with caplog.at_level(logging.WARNING, logger="maskrl.trainer"):
        m = tr.step()
    assert m["degenerate_frac"] < 0.5 and m["distinct_frac"] > 0.5 and m["commit_nll"] > 1.0
    assert not any("collapsed" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- item 3: resume with a longer schedule
def test_resume_with_longer_linear_schedule_follows_the_new_schedule(tmp_path):
    lr = 1e-3
    over = {"train.lr_scheduler": "linear", "train.lr": lr}
    tr = RLTrainer(_cfg(tmp_path, **over, **{"train.steps": 3}), _tiny(), OddChars(), _examples())
    h1 = tr.train(progress=False)
    assert [h["lr"] for h in h1] == pytest.approx([lr, lr * 2 / 3, lr / 3])
    ck3 = tr.save_checkpoint(tmp_path / "checkpoints" / "step_3")
    tr.close()
    tr2 = RLTrainer(_cfg(tmp_path, **over, **{"train.steps": 5}), _tiny(), OddChars(), _examples())
    tr2.load_checkpoint(ck3)
    w3 = _params(tr2.policy_eval.model)
    h2 = tr2.train(progress=False)
    # the 5-step schedule at steps 4 and 5 (0-based 3 and 4): lr (1 - 3/5), lr (1 - 4/5); never 0
    assert [h["step"] for h in h2] == [4, 5]
    assert [h["lr"] for h in h2] == pytest.approx([lr * 2 / 5, lr * 1 / 5])
    assert not _unchanged(w3, tr2.policy_eval.model)
    tr2.close()


def test_resume_with_other_lr_and_mu_uses_this_runs_schedule(tmp_path):
    tr = RLTrainer(_cfg(tmp_path, **{"train.lr_scheduler": "linear", "train.steps": 4}), _tiny(), OddChars(), _examples())
    tr.train(steps=2, progress=False)
    ck = tr.save_checkpoint(tmp_path / "ck")
    tr2 = RLTrainer(_cfg(tmp_path, **{"train.lr_scheduler": "linear", "train.steps": 4, "train.lr": 5e-4,
                                      "train.inner_iterations": 3}), _tiny(), OddChars(), _examples())
    tr2.load_checkpoint(ck)
    assert tr2.step()["lr"] == pytest.approx(5e-4 * (1 - 2 / 4))


@pytest.mark.parametrize("sched,warmup", [("linear", 0), ("cosine", 0), ("constant_with_warmup", 4), ("linear", 2)])
def test_resumed_lr_equals_a_fresh_run_of_the_new_schedule(tmp_path, sched, warmup):
    over = {"train.lr_scheduler": sched, "train.warmup_steps": warmup}
    tr = RLTrainer(_cfg(tmp_path, **over, **{"train.steps": 3}), _tiny(), OddChars(), _examples())
    tr.train(progress=False)
    ck = tr.save_checkpoint(tmp_path / "ck")
    resumed = RLTrainer(_cfg(tmp_path, **over, **{"train.steps": 8}), _tiny(), OddChars(), _examples())
    resumed.load_checkpoint(ck)
    fresh = RLTrainer(_cfg(tmp_path, **over, **{"train.steps": 8}), _tiny(), OddChars(), _examples())
    want = []
    for s in range(8):
        want.append(fresh.optimizer.param_groups[0]["lr"])
        for _ in range(2):  # μ = 2 scheduler steps per RL step
            fresh.optimizer.step()
            fresh.scheduler.step()
    got = [h["lr"] for h in resumed.train(progress=False)]
    assert got == pytest.approx(want[3:], rel=1e-9, abs=1e-15)


# ---------------------------------------------------------------- item 4: dropout in the RL forward
def _lora_with_trained_b(dropout):
    a = apply_lora(_tiny(), rank=4, dropout=dropout)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in a.model.named_parameters():
            if "lora_B" in n:  # a trained adapter: B != 0, so the LoRA branch (and its dropout) matters
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return a


def test_dropout_is_off_in_the_rl_forward_by_default(tmp_path):
    cfg = _cfg(tmp_path, **{"train.lr": 1e-30, "objective.beta": 0.0})
    m = RLTrainer(cfg, _lora_with_trained_b(0.3), OddChars(), _examples()).step()
    assert m["base/ratio_mean"] == pytest.approx(1.0, abs=1e-6) and m["base/clip_frac"] == 0.0


def test_dropout_kept_on_request_moves_the_ratio(tmp_path):
    cfg = _cfg(tmp_path, **{"train.lr": 1e-30, "objective.beta": 0.0, "train.dropout": True})
    m = RLTrainer(cfg, _lora_with_trained_b(0.3), OddChars(), _examples()).step()
    assert abs(m["base/ratio_mean"] - 1.0) > 1e-5


@pytest.mark.parametrize("keep", [False, True])
def test_attention_dropout_of_full_finetuning(tmp_path, keep):
    a = _tiny()
    for layer in a.model.model.layers:
        layer.self_attn.attention_dropout = 0.3  # the model's own (functional) attention dropout
    cfg = _cfg(tmp_path, **{"train.lr": 1e-30, "objective.beta": 0.0, "train.dropout": keep})
    m = RLTrainer(cfg, a, OddChars(), _examples()).step()
    if keep:
        assert abs(m["base/ratio_mean"] - 1.0) > 1e-5
    else:
        assert m["base/ratio_mean"] == pytest.approx(1.0, abs=1e-6) and m["base/clip_frac"] == 0.0


def test_rl_train_mode_keeps_checkpointing_layers_training():
    a = enable_gradient_checkpointing(_tiny())
    a.model.config.attention_dropout = 0.5
    rl_train_mode(a.model)
    layers = a.model.model.layers
    assert all(layer.training for layer in layers)
    assert not any(layer.self_attn.training for layer in layers)  # functional attention dropout off
    rl_train_mode(a.model, dropout=True)
    assert all(m.training for m in a.model.modules())


# ---------------------------------------------------------------- item 5: bf16 full fine-tuning
@pytest.mark.parametrize("dtype", ["bfloat16", "bf16", "float16"])
def test_low_precision_full_finetuning_is_refused_at_config_time(dtype):
    with pytest.raises(ConfigError, match="model.dtype.*full fine-tuning"):
        load_config([], [f"model.dtype={dtype}"])
    cfg = load_config([], [f"model.dtype={dtype}", "model.lora_rank=4"])  # LoRA: fp32 adapter weights
    assert cfg.model.dtype == dtype


def test_unknown_dtype_names_value_and_valid_names():
    with pytest.raises(ConfigError, match=r"model.dtype: dtype 'bf17' is not one of .*bfloat16"):
        load_config([], ["model.dtype=bf17"])


def test_model_dtype_applies_to_the_builtin_model():
    from maskrl.pipeline import load_policy

    cfg = load_config([], ["model.dtype=bf16", "model.lora_rank=2", "model.tiny.hidden_size=32",
                           "model.tiny.num_heads=2", "model.tiny.num_layers=1", "model.tiny.intermediate_size=32"])
    a = load_policy(cfg)
    frozen = {p.dtype for p in a.model.parameters() if not p.requires_grad}
    trained = {p.dtype for p in a.model.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}


@pytest.mark.parametrize("value", [None, float("inf")])
def test_reward_that_is_not_a_number_in_evaluation_names_task_and_row(value):
    from maskrl.evaluate import evaluate_examples
    from maskrl.sampling import SamplerConfig

    with pytest.raises(ValueError, match=r"task 'bad_reward': reward of row 4 \(example id 104\)"):
        evaluate_examples(_tiny(), BadReward(value), _examples(), SamplerConfig(gen_length=4, block_length=4, steps=4))
