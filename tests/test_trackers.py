"""Trackers through accelerate (issue 23): `train.report_to` drives accelerate's tracker API; W&B in
offline mode (no network here) and TensorBoard receive the metrics and the resolved config."""
import json
import re

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


def test_a_resumed_run_continues_its_wandb_run(tmp_path, monkeypatch, caplog):
    """Issue 50 §1: ``--resume`` with ``report_to: [wandb]`` logs to the same W&B run: the first start
    records a run id in the run folder (trackers.json) and passes it to ``wandb.init``; the resume
    passes the same id with ``resume="allow"`` (W&B offline here), and says that W&B keeps its own
    values of the steps after the checkpoint (it only appends)."""
    import logging

    wandb = pytest.importorskip("wandb")
    from maskrl.training.metrics_log import TRACKER_RUNS

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    passed, init = [], wandb.init
    monkeypatch.setattr(wandb, "init", lambda **kw: passed.append(kw) or init(**kw))
    run = tmp_path / "run"
    args = ["train", "--config", "configs/countdown_diffu_grpo.yaml", *TINY, "--set", f"output_dir={run}",
            "--set", "train.report_to=[wandb]", "--set", "train.steps=3", "--set", "train.save_every=2"]
    assert main(args) == 0
    run_id = json.loads((run / TRACKER_RUNS).read_text())["wandb"]["id"]
    wandb.teardown()
    with caplog.at_level(logging.WARNING, logger="maskrl.trainer"):
        assert main([*args, "--resume", str(run / "checkpoints" / "step_2")]) == 0
    wandb.teardown()
    assert [(kw["id"], kw["resume"]) for kw in passed] == [(run_id, "allow")] * 2
    assert json.loads((run / TRACKER_RUNS).read_text())["wandb"]["id"] == run_id
    assert f"resuming W&B run {run_id} at step 2: W&B already holds 1 later step(s)" in caplog.text
    # both starts wrote into one offline run: W&B names its folders offline-run-<time>-<id>, with "-1", "-2", ...
    # appended where two starts fall in the same second (a quiet machine)
    folders = [p.name for p in tmp_path.glob("wandb/offline-run-*")]
    assert {re.fullmatch(r"offline-run-\d{8}_\d{6}-([0-9a-z]+)(-\d+)?", f).group(1) for f in folders} == {run_id}


def test_tracker_resume_kwargs_fresh_resumed_and_unrecorded(tmp_path, caplog):
    """A fresh run draws and records a W&B id; a resume reads it; a resume of a folder without one says
    that W&B starts a new run (and records it); other trackers say they start a new run on resume."""
    import logging

    from maskrl.training.metrics_log import TRACKER_RUNS, tracker_resume_kwargs

    assert tracker_resume_kwargs(["tensorboard"], tmp_path, None) == {}
    assert not (tmp_path / TRACKER_RUNS).exists()
    fresh = tracker_resume_kwargs(["wandb"], tmp_path, None)["wandb"]
    assert fresh["resume"] == "allow" and len(fresh["id"]) == 16
    again = tracker_resume_kwargs(["wandb"], tmp_path, None)["wandb"]  # a fresh start (--overwrite): a new run
    assert again["id"] != fresh["id"]
    with caplog.at_level(logging.WARNING, logger="maskrl.trainer"):
        assert tracker_resume_kwargs(["wandb", "tensorboard"], tmp_path, 4)["wandb"] == again
        assert caplog.text == ""
        older = tmp_path / "older"
        older.mkdir()
        new = tracker_resume_kwargs(["wandb", "mlflow"], older, 4)["wandb"]
    assert json.loads((older / TRACKER_RUNS).read_text()) == {"wandb": {"id": new["id"]}}
    assert "records no W&B run id" in caplog.text and "W&B starts a new run" in caplog.text
    assert "train.report_to: mlflow starts a new run on this resume at step 4" in caplog.text


def test_an_unreadable_tracker_record_is_said_and_replaced(tmp_path, caplog):
    import logging

    from maskrl.training.metrics_log import TRACKER_RUNS, tracker_resume_kwargs

    (tmp_path / TRACKER_RUNS).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="maskrl.trainer"):
        got = tracker_resume_kwargs(["wandb"], tmp_path, 3)["wandb"]
    assert f"{tmp_path / TRACKER_RUNS} is not a JSON object of tracker runs" in caplog.text
    assert "records no W&B run id" in caplog.text
    assert json.loads((tmp_path / TRACKER_RUNS).read_text()) == {"wandb": {"id": got["id"]}}
