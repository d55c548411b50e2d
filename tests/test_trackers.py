"""Trackers through accelerate (issue 23): `train.report_to` drives accelerate's tracker API; W&B in
offline mode (no network here) and TensorBoard receive the metrics and the resolved config."""
import json

import pytest

from maskrl.cli import main
from maskrl.config import ConfigError, load_config
from maskrl.trainer import hyperparameters
from conftest import TINY_CLI, TINY_RL, cli_sets

TINY = TINY_CLI + cli_sets(*TINY_RL, "train.steps=2")


def test_wandb_offline_and_tensorboard_receive_metrics_and_config(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    assert main(["train", "--config", "configs/countdown_diffu_grpo.yaml", *TINY, "--set", f"output_dir={run}",
                 "--set", "train.report_to=[wandb,tensorboard]", "--set", "train.tracker_project=maskrl-test"]) == 0
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]  # kept
    wandb.teardown()  # wait until W&B's writer process has flushed the offline run (public API)
    files = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1
    blob = files[0].read_bytes()  # the offline run's record log: metric names and config keys in it
    for needle in (b"commit_nll", b"base/kl", b"train.lr", b"maskrl-test"):
        assert needle in blob, needle
    acc = EventAccumulator(str(run / "tb" / "maskrl-test"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("commit_nll")] == [1, 2]


def test_report_to_names_are_checked():
    with pytest.raises(ConfigError, match="train.report_to: unknown tracker"):
        load_config([], ["train.report_to=[tensorbord]"])
    assert load_config([], ["train.report_to=[]"]).train.report_to == []


def test_a_tracker_that_is_not_installed_is_an_error(tmp_path, tiny, monkeypatch):
    import accelerate.tracking

    from conftest import OddChars, small_cfg
    from maskrl.tasks.base import Example
    from maskrl.trainer import RLTrainer

    # accelerate drops an unavailable tracker with only a warning; maskrl refuses to run without it
    monkeypatch.setattr(accelerate.tracking, "is_mlflow_available", lambda: False)
    with pytest.raises(ConfigError, match="mlflow not available"):
        RLTrainer(small_cfg(tmp_path, **{"train.report_to": "[mlflow]"}), tiny, OddChars(),
                  [Example(id=0, prompt="p")])


def test_hyperparameters_are_flat_scalars():
    hp = hyperparameters(load_config([], ["train.lr=3e-6", "credit=[{name: dps}]"]))
    assert hp["train.lr"] == 3e-6 and hp["objective.name"] == "diffu_grpo"
    assert all(isinstance(v, (bool, int, float, str)) for v in hp.values())
