"""Every method on a block-diffusion model (issue 48 item 4; the block twin of tests/test_paper_shapes.py):
one trainer step of every registered base objective x (no credit + each registered credit module) on
the tiny block model (``model.tiny.block_size: 4``: bidirectional inside blocks of 4, causal across
them), with prompts whose length is not a multiple of the block size (the shared prompt block), and
the combinations a block model refuses, refused at config time.

Until the block sampler lands, the rollouts come from today's sampler (semi-autoregressive blocks of 4
completion tokens); the likelihoods score them under the block-causal forward (mean-field, ELBO and SML
through the doubled x_t ⊕ x_0 forward, :mod:`maskrl.likelihood.blocks`).

Checked in every case: the likelihood outputs are ``[N, L]`` float32 and finite where needed, every
loss term's advantages and mask have the completion's shape, every metric and parameter is finite, and
the step changed the model.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import OddChars
from maskrl.config import load_config
from maskrl.config.schema import ConfigError
from maskrl.credit import CREDITS
from maskrl.likelihood.base import tensors_of
from maskrl.models import build_tiny
from maskrl.objectives import OBJECTIVES
from maskrl.tasks.base import Example
from maskrl.trainer import RLTrainer
from test_paper_shapes import CREDIT_FIELDS, STATE_CREDITS

BLOCK, L = 4, 16
PROMPTS = ["say a 1", "hi"]  # 7 and 2 characters: neither fills its last block


def _cases():
    out = []
    for base in OBJECTIVES.names():
        for credit in [None] + CREDITS.names():
            if credit in STATE_CREDITS and base == "spg":
                continue  # spg reads spg_bounds, these credit modules the state likelihood (test_paper_shapes)
            name = f"{base}+{credit or 'none'}"
            out.append(pytest.param(base, (credit,) if credit else (), id=name))
    return out


def _config(tmp_path, base, credits, extra=()):
    table = tmp_path / "pos.json"
    table.write_text(json.dumps({"w_c": {"NOUN": 1.2, "DET": 0.8}}))
    entries = ", ".join(CREDIT_FIELDS[c].replace("POS", str(table)) for c in credits)
    sets = [f"output_dir={tmp_path / 'run'}", f"model.tiny.block_size={BLOCK}", f"rollout.gen_length={L}",
            f"rollout.block_length={BLOCK}", f"rollout.steps={L // 2}", "rollout.temperature=1.0",
            f"objective.name={base}", f"credit=[{entries}]", "train.prompts_per_step=2", "train.group_size=2",
            "train.inner_iterations=2", "train.lr=1e-2", "train.log_every=0"]
    if credits and credits[0] in STATE_CREDITS:
        sets.append("likelihood={name: state, p_mask_prompt: 0.0}")
    return load_config([], sets + list(extra))


def _block_model():
    a = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, block_size=BLOCK, seed=0)
    a.model.eval()
    return a


@pytest.mark.parametrize("base, credits", _cases())
def test_one_trainer_step_on_the_tiny_block_model(tmp_path, base, credits):
    cfg = _config(tmp_path, base, credits)
    tr = RLTrainer(cfg, _block_model(), OddChars(), [Example(id=i, prompt=p) for i, p in enumerate(PROMPTS)])
    assert tr.policy.block_size == BLOCK
    seen = []
    loglik = tr._loglik

    def record(term, adapter, rollout, seed, need):
        out = loglik(term, adapter, rollout, seed, need)
        seen.append((term.name, out, need))
        return out

    tr._loglik = record
    before = [p.detach().clone() for p in tr.policy.model.parameters()]
    metrics = tr.step()
    assert seen, "no likelihood was called"
    for name, out, need in seen:
        for x in tensors_of(out).values():
            assert x.shape == need.shape and x.dtype == torch.float32, name
            assert bool(torch.isfinite(x[need]).all()), f"non-finite log-likelihood in term {name}"
    bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    assert not bad, bad
    after = list(tr.policy.model.parameters())
    assert all(bool(torch.isfinite(p).all()) for p in after)
    assert any(not torch.equal(p0, p1.detach()) for p0, p1 in zip(before, after)), "the step changed no parameter"


def test_block_elbo_is_refused_for_a_full_attention_model_before_any_rollout(tmp_path):
    """EBPO's default likelihood scores block models only: a tiny full-attention config fails at config time,
    a loaded full-attention model when the trainer is built (the rule of the spg_public test below, the other
    way round: one mechanism, ``model_refusal``)."""
    sets = [f"output_dir={tmp_path}", "objective.name=ebpo"]
    with pytest.raises(ConfigError, match="block_size None.*block_elbo.*likelihood: {name: elbo}"):
        load_config([], sets)
    cfg = load_config([], [*sets, f"model.tiny.block_size={BLOCK}"])
    full = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    with pytest.raises(ValueError, match="full-attention model.*block_elbo"):
        RLTrainer(cfg, full, OddChars(), [Example(id=0, prompt="hi")])
    load_config([], [*sets, "likelihood={name: elbo}"])  # the way out the message names


def test_spg_public_masking_is_refused_for_a_block_model_at_config_time(tmp_path):
    extra = ["likelihood={name: spg_bounds, masking: spg_public, nodes: 1, draws: 2}"]
    with pytest.raises(ConfigError, match="block_size 4.*spg_public"):
        _config(tmp_path, "spg", (), extra)
    # a loaded block model (no model.tiny.block_size in the config): the trainer refuses it
    cfg = load_config([], [f"output_dir={tmp_path}", "objective.name=spg", *extra])
    with pytest.raises(ValueError, match="block-diffusion model.*spg_public"):
        RLTrainer(cfg, _block_model(), OddChars(), [Example(id=0, prompt="hi")])


@pytest.mark.parametrize("sets, full, message", [
    (["eval.block_length=4"], False, r"^rollout: block_length \(=16\) must equal the model's block size \(4\)"),
    (["rollout.block_length=4"], False, r"^eval: block_length \(=16\) must equal the model's block size \(4\)"),
    (["rollout.block_length=4", "eval.block_length=4", "eval.cache=prefix"], False, r"^eval: cache='prefix' is LLaDA"),
    (["rollout.cache=block"], True, r"^rollout: cache=block needs a block-diffusion model"),
    (["eval.early_stop=true"], True, r"^eval: early_stop needs a block-diffusion model"),
])
def test_a_runs_samplers_are_checked_against_the_loaded_model_naming_the_section(sets, full, message):
    """The sampler refused these only inside the first generate() -- after ``maskrl demo``'s SFT, and never
    for ``maskrl sft``, whose prompt card kept an eval sampler the model refuses -- naming no section."""
    from maskrl.prompts import check_run_samplers

    cfg = load_config([], sets)
    model = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                       block_size=None if full else BLOCK, seed=0)
    with pytest.raises(ValueError, match=message):
        check_run_samplers(cfg, model)
    if message.startswith("^rollout"):
        check_run_samplers(cfg, model, sections=("eval",))  # maskrl sft uses the eval sampler only


def test_maskrl_sft_refuses_an_eval_sampler_the_block_model_cannot_run_before_training(tmp_path, capsys):
    from maskrl.cli import main

    out = tmp_path / "sft"
    rc = main(["sft", "--set", f"model.tiny.block_size={BLOCK}", "--set", "model.tiny.hidden_size=32",
               "--set", "model.tiny.num_layers=1", "--set", "model.tiny.num_heads=2",
               "--set", "model.tiny.intermediate_size=64", "--set", "task.train_size=8", "--set", "sft.steps=1",
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "eval: block_length (=16) must equal the model's block size (4)" in err, err
    assert not (out / "model.safetensors").exists()
