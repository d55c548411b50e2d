"""Issue 12 item 4: the trainer logs the rollout/theta mismatch every k steps, before the update."""
from __future__ import annotations

import pytest
import torch

import maskrl.sampling as sampling
from maskrl.config import load_config
from maskrl.models import build_tiny
from maskrl.tasks.base import Example
from maskrl.trainer import RLTrainer
from conftest import OddChars


def test_mismatch_logged_every_k_steps_against_the_sampling_weights(tmp_path, monkeypatch):
    cfg = load_config([], [f"output_dir={tmp_path}", "rollout.gen_length=8", "rollout.block_length=4",
                           "rollout.steps=8", "rollout.temperature=1.0", "rollout.cache=dual",
                           "rollout.mismatch_every=2", "train.prompts_per_step=2", "train.group_size=2",
                           "train.inner_iterations=1", "train.lr=1e-2"])
    policy = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    tr = RLTrainer(cfg, policy, OddChars(), [Example(id=i, prompt=f"say {i}") for i in range(4)])
    snapshots, calls = [], []
    real_collect, real_mismatch = tr.collect, sampling.rollout_mismatch

    def collect(*a, **k):
        snapshots.append({n: p.detach().clone() for n, p in tr.policy_eval.model.named_parameters()})
        return real_collect(*a, **k)

    def mismatch(adapter, rollout):
        same = all(torch.equal(p, snapshots[-1][n]) for n, p in adapter.model.named_parameters())
        out = real_mismatch(adapter, rollout)
        calls.append((same, out))
        return out

    tr.collect = collect
    monkeypatch.setattr(sampling, "rollout_mismatch", mismatch)
    hist = tr.train(steps=3, progress=False)
    tr.close()
    assert ["rollout/mismatch" in h for h in hist] == [True, False, True]
    assert len(calls) == 2 and all(same for same, _ in calls)  # computed before the update
    assert hist[0]["rollout/mismatch"] == calls[0][1]["mismatch"] > 0


def test_mismatch_under_sharded_training_is_skipped_and_said_once(tmp_path, monkeypatch, caplog):
    """Under FSDP / DeepSpeed the mismatch forwards (one per distinct commit step of each process's rows)
    would be unequal collectives: not computed, and the run says so once (issue 50 §1: not silently)."""
    import logging
    from types import SimpleNamespace

    import maskrl.trainer

    cfg = load_config([], [f"output_dir={tmp_path}", "rollout.gen_length=8", "rollout.block_length=4",
                           "rollout.steps=4", "rollout.mismatch_every=1"])
    tr = RLTrainer(cfg, build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0),
                   OddChars(), [Example(id=0, prompt="say 0")])
    tr.acc = SimpleNamespace(num_processes=2, distributed_type="FSDP", is_main_process=True)
    monkeypatch.setattr(maskrl.trainer._ckpt, "whole_checkpoints", lambda acc: True)
    monkeypatch.setattr(sampling, "rollout_mismatch", lambda *a: pytest.fail("computed under FSDP"))
    with caplog.at_level(logging.WARNING, logger="maskrl.trainer"):
        assert tr._rollout_mismatch(None) == {} and tr._rollout_mismatch(None) == {}
    assert caplog.text.count("rollout/mismatch is not computed under FSDP") == 1
