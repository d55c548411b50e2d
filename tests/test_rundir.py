"""Run folders (issue 20, items 1-2): a run never replaces or mixes with another run's data, one writer
per folder, resumed logs hold each step once, a resume says what changed and refuses what changes the
run, evaluations key on the weights, and Ctrl-C saves a checkpoint that resumes exactly."""

import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY_CLI, TINY_RL, WAIT_CAP_S, cli_sets, communicate_for, wait_for, write_sudoku_csv
from maskrl import rundir
from maskrl.cli import build_parser, main
from maskrl.models import build_tiny, save_model

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = str(ROOT / "tests" / "plugins" / "slow_task.py")
TINY = TINY_CLI
SMALL = cli_sets(*TINY_RL)


def train_args(run, *more):
    return ["train", "--config", str(ROOT / "configs" / "countdown_diffu_grpo.yaml"), *TINY, *SMALL,
            "--set", f"output_dir={run}", *more]


def steps_of(path):
    return [json.loads(line)["step"] for line in Path(path).read_text().splitlines()]


def weights(folder):
    return load_file(str(Path(folder) / "model.safetensors"))


# ------------------------------------------------------------------------------ folders
def test_train_refuses_a_folder_holding_another_run_until_resume_or_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(run, "--set", "train.steps=2")) == 0
    before = {p: (run / p).read_bytes() for p in ("model/model.safetensors", "metrics.jsonl", "config.json")}
    capsys.readouterr()
    # a forgotten output_dir: the same folder again
    assert main(train_args(run, "--set", "train.steps=1")) == 2
    err = capsys.readouterr().err
    assert "holds another run" in err and "--resume" in err and "--overwrite" in err and "output_dir=DIR" in err
    assert "metrics.jsonl (2 steps logged)" in err and "latest checkpoint step_2" in err
    assert "--resume to continue it from step 2" in err
    assert err.count("\n") == 1  # one line
    assert {p: (run / p).read_bytes() for p in before} == before  # nothing touched
    assert not (run / rundir.LOCK_FILE).exists()  # the lock is released on the error too
    # --overwrite replaces the run: fresh logs, config, checkpoints
    (run / "notes.txt").write_text("mine")
    assert main(train_args(run, "--set", "train.steps=1", "--overwrite")) == 0
    assert steps_of(run / "metrics.jsonl") == [1]
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]
    assert (run / "notes.txt").read_text() == "mine"  # only maskrl's own files are removed
    assert main(train_args(run, "--resume", "--overwrite")) == 2


def test_a_run_that_crashed_before_its_first_checkpoint(tmp_path, capsys, monkeypatch):
    """A run that stopped before saving any checkpoint: the refusal says so and offers what works
    (--overwrite, another folder, or --resume, which starts that run again from step 0); --resume
    does that, says so, replaces the dead attempt's logs and records both attempts; a changed setting
    is refused unless --force; --resume on a folder with no run at all is an error."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from maskrl.trainer import RLTrainer

    run = tmp_path / "run"

    def crash(self, path):
        raise OSError("No space left on device")

    with monkeypatch.context() as m:
        m.setattr(RLTrainer, "save_checkpoint", crash)
        assert main(train_args(run, "--set", "train.steps=2")) == 2
    assert not (run / "checkpoints").exists() and steps_of(run / "metrics.jsonl") == [1, 2]
    capsys.readouterr()
    assert main(train_args(run, "--set", "train.steps=2")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "holds a run that saved no checkpoint (config.json, configs.jsonl, metrics.jsonl (2 steps logged), tb)" in err
    assert "nothing to continue" in err and "--overwrite to replace it" in err and "output_dir=DIR" in err
    assert "--resume to start that run again from step 0" in err and "continue it" not in err
    # a changed setting: refused, naming it and the ways out
    assert main(train_args(run, "--set", "train.steps=2", "--set", "train.lr=1e-2", "--resume")) == 2
    err = capsys.readouterr().err
    assert "saved no checkpoint" in err and "train.lr: 0.0002 -> 0.01" in err and "--force" in err and "--overwrite" in err
    time.sleep(1.1)  # TensorBoard orders event files by their start second (see the resume test)
    assert main(train_args(run, "--set", "train.steps=3", "--resume")) == 0
    err = capsys.readouterr().err
    assert "has no checkpoint" in err and "starting it again from step 0" in err and "train.steps: 2 -> 3" in err
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3]  # the dead attempt's rows are replaced, not kept
    acc = EventAccumulator(str(run / "tb" / "maskrl"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward")] == [1, 2, 3]
    assert [(h["event"], h["step"], h["checkpoint"]) for h in rundir.config_history(run)] == [
        ("start", 0, None), ("restart", 0, None)]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_3"]
    # nothing at all to resume: an error (a mistyped output_dir must not start a run silently)
    assert main(train_args(tmp_path / "typo", "--resume")) == 2
    assert "holds no run to resume" in capsys.readouterr().err


def test_train_refuses_an_initial_model_inside_its_own_output_folder(tmp_path, capsys):
    # `maskrl sft` writes <output_dir>/model by default; training from it into the same output_dir would
    # replace the model it starts from (and its reference), with or without --overwrite
    run = tmp_path / "run"
    save_model(build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0), run / "model")
    before = (run / "model" / "model.safetensors").read_bytes()
    for extra in ([], ["--overwrite"]):
        assert main(train_args(run, "--set", f"model.path={run / 'model'}", "--set", "train.steps=1", *extra)) == 2
        assert "which this run writes" in capsys.readouterr().err
    assert (run / "model" / "model.safetensors").read_bytes() == before


def test_eval_refuses_a_training_runs_folder(tmp_path, sudoku_csv):
    from maskrl.evaluate import run_harness

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text("{}")
    model = build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    for overwrite in ({}, {"overwrite": True}):
        with pytest.raises(ValueError, match="holds a run .*not an evaluation"):
            run_harness(model=model, task_name="sudoku4x4", gen_lengths=[16], block_length=16, steps=4,
                        data_path=sudoku_csv, out_dir=tmp_path / "run", progress=False, prompt_template="{puzzle}=",
                        chat_template=False, **overwrite)
    assert (tmp_path / "run" / "summary.json").read_text() == "{}"


def test_prepare_run_dir_removes_only_run_files_and_keeps_the_sft_cache(tmp_path):
    (tmp_path / "sft-cache" / "abc").mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "tb").mkdir()
    (tmp_path / "other.txt").write_text("x")
    with pytest.raises(rundir.RunDirError, match=r"holds another run \(metrics.jsonl \(1 step logged\), tb\); pass --overwrite to replace"):
        rundir.prepare_run_dir(tmp_path, overwrite=False, other="--set output_dir=DIR", resume_flag=None)
    rundir.prepare_run_dir(tmp_path, overwrite=True, other="--set output_dir=DIR")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt", "sft-cache"]
    rundir.prepare_run_dir(tmp_path, overwrite=False, other="")  # no run files left: accepted


def test_sft_refuses_a_model_folder_unless_overwrite_and_never_removes_a_foreign_one(tmp_path, capsys):
    sft = ["sft", "--config", str(ROOT / "configs" / "countdown_diffu_grpo.yaml"), *TINY, "--set", "sft.steps=1",
           "--set", "sft.batch_size=4", "--set", f"output_dir={tmp_path}/run"]
    out = tmp_path / "sft"
    assert main([*sft, "--out", str(out)]) == 0
    first = (out / "model.safetensors").read_bytes()
    assert main([*sft, "--out", str(out), "--set", "sft.seed=1"]) == 2
    assert "already holds a model" in capsys.readouterr().err and (out / "model.safetensors").read_bytes() == first
    assert main([*sft, "--out", str(out), "--set", "sft.seed=1", "--overwrite"]) == 0
    assert (out / "model.safetensors").read_bytes() != first
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("x")
    assert main([*sft, "--out", str(foreign), "--overwrite"]) == 2
    assert "not written by maskrl" in capsys.readouterr().err and (foreign / "thesis.tex").is_file()
    # the default folder <output_dir>/model of a run that has a model is refused the same way
    run = tmp_path / "run"
    assert main(train_args(run, "--set", "train.steps=1")) == 0
    assert main(sft) == 2
    assert "run/model already holds a model" in capsys.readouterr().err


def _demo_cfg(tmp_path):
    from maskrl.config import load_config

    data = write_sudoku_csv(tmp_path / "sudoku.csv", 4, seed=11)
    return load_config([ROOT / "configs" / "demo_sudoku.yaml"], [
        f"output_dir={tmp_path}/demo", f"task.data_path={data}", "task.train_size=16", "model.tiny.hidden_size=32",
        "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.intermediate_size=32", "sft.steps=2",
        "sft.batch_size=4", "train.steps=2", "train.prompts_per_step=2", "train.group_size=2",
        "train.micro_batch_size=0", "train.eval_every=0"])


def test_demo_rerun_refuses_then_overwrites_with_fresh_logs(tmp_path):
    from maskrl.demo import run_demo

    cfg = _demo_cfg(tmp_path)
    out = tmp_path / "demo"
    run_demo(cfg)
    summary = (out / "summary.json").read_bytes()
    with pytest.raises(rundir.RunDirError, match=r"holds another run .*pass --overwrite to replace it"):
        run_demo(cfg)
    assert (out / "summary.json").read_bytes() == summary and steps_of(out / "metrics.jsonl") == [1, 2]
    s = run_demo(cfg, overwrite=True)
    assert steps_of(out / "metrics.jsonl") == [1, 2]  # not [1, 2, 1, 2]
    assert s["sft_cached"] is True  # the SFT cache survives --overwrite


# ------------------------------------------------------------------------------ lock
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_lock_stops_a_second_writer_and_replaces_a_stale_lock(tmp_path, caplog):
    with rundir.run_lock(tmp_path, "maskrl train") as path:
        info = json.loads(path.read_text())
        assert (info["pid"], info["host"], info["command"]) == (os.getpid(), socket.gethostname(), "maskrl train")
        with pytest.raises(rundir.RunDirError, match=rf"in use by pid {os.getpid()} on .*maskrl train.*delete"):
            with rundir.run_lock(tmp_path, "maskrl eval"):
                pass
    assert not path.exists()
    # a lock whose process is gone is replaced (with a warning)
    path.write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "command": "maskrl train",
                                "started": "earlier"}))
    with rundir.run_lock(tmp_path, "maskrl train"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert "stale lock" in caplog.text
    # a lock from another host cannot be checked: respected
    path.write_text(json.dumps({"pid": 1, "host": "elsewhere", "command": "maskrl train", "started": "now"}))
    with pytest.raises(rundir.RunDirError, match="in use by pid 1 on elsewhere"):
        with rundir.run_lock(tmp_path, "maskrl train"):
            pass
    assert path.exists()  # not ours: left alone


_BUILD_ONCE = """
import sys, time
from pathlib import Path
from maskrl.rundir import folder_lock
cache = Path(sys.argv[1]) / "key"
with folder_lock(cache.parent):
    if not (cache / "done").is_file():
        with open(Path(sys.argv[1]) / "builds.log", "a") as fh:
            fh.write("built\\n")
        time.sleep(0.5)  # a build long enough for the other process to look for the cache meanwhile
        cache.mkdir()
        (cache / "done").write_text("x")
"""


def test_folder_lock_lets_one_of_two_processes_build_a_cache_and_the_other_wait(tmp_path):
    """Two processes that find no cache at once: one builds it, the other waits and reads it (without the
    lock both build, writing one folder at the same time). A killed holder leaves no lock behind."""
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD_ONCE, str(tmp_path)]) for _ in range(2)]
    assert [wait_for("a cache-building process", p) for p in procs] == [0, 0]
    assert (tmp_path / "builds.log").read_text() == "built\n"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom maskrl.rundir import folder_lock\n"
                               "with folder_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    holder.kill()
    wait_for("the killed lock holder", holder)
    with rundir.folder_lock(tmp_path) as folder:  # released by the operating system: no wait, no stale file
        assert folder == tmp_path and sorted(p.name for p in tmp_path.iterdir()) == ["builds.log", "key"]


def test_train_into_a_folder_in_use_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run.mkdir()
        (run / rundir.LOCK_FILE).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname(),
                                                        "command": "maskrl train", "started": "now"}))
        assert main(train_args(run, "--set", "train.steps=1")) == 2
        assert f"in use by pid {sleeper.pid}" in capsys.readouterr().err
        assert not (run / "metrics.jsonl").exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert main(train_args(run, "--set", "train.steps=1")) == 0  # its process is gone: a stale lock


# ------------------------------------------------------------------------------ resume
def test_resume_truncates_metrics_and_tensorboard_to_the_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert main(train_args(run, "--set", "train.steps=3", "--set", "train.save_every=2")) == 0
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3]
    # TensorBoard reads a folder's event files in name order, and a name holds the start second, then
    # host, pid and a per-process counter: a resume within the same second in the same process could
    # sort before the first run's file (a real resume is seconds later, in another process)
    time.sleep(1.1)
    assert main(train_args(run, "--set", "train.steps=3", "--resume", str(run / "checkpoints" / "step_2"))) == 0
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3]  # step 3 redone once, not [1, 2, 3, 3]
    acc = EventAccumulator(str(run / "tb" / "maskrl"))  # accelerate: <logging_dir>/<train.tracker_project>
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward")] == [1, 2, 3]


def test_truncate_metrics_keeps_steps_up_to_the_checkpoint(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 2, "x": 1}\n{"step": 4')
    assert rundir.truncate_metrics(p, 2) == 2  # step 3 and the torn last line
    assert p.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 2, "x": 1}\n'
    assert rundir.truncate_metrics(tmp_path / "none.jsonl", 2) == 0


def test_resume_says_what_changed_refuses_meaning_changes_and_keeps_every_config(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(run, "--set", "train.steps=2", "--set", "train.save_every=1")) == 0
    original = (run / "config.json").read_bytes()
    capsys.readouterr()
    assert main(train_args(run, "--set", "train.steps=3", "--set", "train.lr=1e-2", "--resume")) == 2
    err = capsys.readouterr().err
    assert "train.lr: 0.0002 -> 0.01" in err and "--force" in err and "train.steps" not in err  # steps: safe here
    assert (run / "config.json").read_bytes() == original and steps_of(run / "metrics.jsonl") == [1, 2]
    # safe changes go through and are printed
    assert main(train_args(run, "--set", "train.steps=3", "--set", "train.log_every=1", "--set", "train.eval_every=5",
                           "--resume")) == 0
    assert "train.eval_every: 0 -> 5" in capsys.readouterr().err
    # forced: applied from the next step, recorded
    assert main(train_args(run, "--set", "train.steps=4", "--set", "train.lr=1e-2", "--resume", "--force")) == 0
    lrs = [json.loads(line)["lr"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert lrs[:3] == [2e-4] * 3 and lrs[3] == pytest.approx(1e-2)
    assert (run / "config.json").read_bytes() == original  # the first config stays
    hist = rundir.config_history(run)
    assert [(h["event"], h["step"], h["forced"]) for h in hist] == [("start", 0, False), ("resume", 2, False),
                                                                    ("resume", 3, True)]
    assert "train.lr: 0.0002 -> 0.01" in hist[2]["changes"] and hist[2]["config"]["train"]["lr"] == 1e-2
    assert main(train_args(run, "--set", "train.steps=1", "--force")) == 2  # --force only with --resume



def _rewrite_state(ckpt, **fields):
    """Rewrite a checkpoint's trainer state: ``fields`` set, a field given as ``None`` removed."""
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    for k, v in fields.items():
        state.pop(k) if v is None else state.__setitem__(k, v)
    torch.save(state, ckpt / "trainer_state.pt")


def test_resume_on_another_process_count_is_refused_unless_forced_and_recorded(tmp_path, capsys):
    """A checkpoint of 2 processes resumed on 1: the global batch would halve, so the resume is refused
    before any model is loaded, naming both counts and global batches; ``--force`` applies it (recorded)."""
    run = tmp_path / "run"
    assert main(train_args(run, "--set", "train.steps=2", "--set", "train.save_every=1")) == 0
    ckpt = run / "checkpoints" / "step_2"
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert state["num_processes"] == 1 and len(state["streams"]) == 1  # what a 1-process run records
    _rewrite_state(ckpt, num_processes=2, streams=state["streams"] * 2)  # as 2 processes would have written it
    capsys.readouterr()
    assert main(train_args(run, "--set", "train.steps=3", "--resume")) == 2
    err = capsys.readouterr().err
    assert ("process count 2 -> 1: the global batch (train.prompts_per_step x processes) 2 x 2 = 4 -> 2 x 1 = 2 "
            "prompts per step") in err and "--force" in err
    assert steps_of(run / "metrics.jsonl") == [1, 2]
    assert main(train_args(run, "--set", "train.steps=3", "--resume", "--force")) == 0
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3]
    last = rundir.config_history(run)[-1]
    assert last["forced"] and any(c.startswith("process count 2 -> 1") for c in last["changes"])


def test_resume_of_a_checkpoint_without_a_process_count_warns_and_resumes_exactly(tmp_path, caplog):
    """A checkpoint in the layout of earlier maskrl versions (no process count, process 0's streams at
    the top level only) resumes with a warning, and on one process exactly: its step 3 equals the
    uninterrupted run's."""
    full, run = tmp_path / "full", tmp_path / "run"
    assert main(train_args(full, "--set", "train.steps=3")) == 0
    assert main(train_args(run, "--set", "train.steps=2", "--set", "train.save_every=2")) == 0
    _rewrite_state(run / "checkpoints" / "step_2", num_processes=None, streams=None)
    with caplog.at_level("WARNING", logger="maskrl.trainer"):
        assert main(train_args(run, "--set", "train.steps=3", "--resume")) == 0
    assert "records no process count" in caplog.text

    def row(path):
        return {k: v for k, v in json.loads(path.read_text().splitlines()[-1]).items() if "seconds" not in k}

    assert row(run / "metrics.jsonl") == row(full / "metrics.jsonl")
    a, b = weights(run / "model"), weights(full / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

def test_resume_changes_classifies_keys_and_gives_the_lr_jump():
    base = {"train": {"steps": 60, "lr": 1e-4, "lr_scheduler": "linear", "warmup_steps": 0, "inner_iterations": 1,
                      "eval_every": 10}, "eval": {"steps": 16}, "objective": {"name": "diffu_grpo", "beta": 0.04}}

    def change(**kv):
        new = json.loads(json.dumps(base))
        for k, v in kv.items():
            sec, key = k.split("__")
            new[sec][key] = v
        return rundir.resume_changes(base, new, step=50)

    assert change() == ([], [])
    assert change(train__eval_every=5, eval__steps=8) == (["eval.steps: 16 -> 8", "train.eval_every: 10 -> 5"], [])
    assert change(objective__beta=0.0) == ([], ["objective.beta: 0.04 -> 0.0"])
    # a checkpoint of an older version lacks a field this one has: not a change of the run
    assert change(objective__newer=1) == (["objective.newer: '<absent>' -> 1 (a setting new in this maskrl version)"], [])
    # linear decay over 60 steps: step 51's rate is 1e-4 * 10/60 = 1.67e-5; over 100 steps 1e-4 * 50/100 = 5e-5
    safe, unsafe = change(train__steps=100)
    assert safe == [] and len(unsafe) == 1 and "1.67e-05 -> 5e-05" in unsafe[0] and "step 51" in unsafe[0]
    assert "nothing left to train" in change(train__steps=40)[1][0]
    # at step 0 (a run that saved no checkpoint, started again) every rate is still ahead: safe
    new = json.loads(json.dumps(base))
    new["train"]["steps"] = 100
    assert rundir.resume_changes(base, new, step=0) == (["train.steps: 60 -> 100"], [])
    base["train"]["lr_scheduler"] = "constant_with_warmup"  # the rate does not depend on steps
    assert change(train__steps=100) == (["train.steps: 60 -> 100"], [])
    assert rundir.config_diff({"a": {"b": 1}}, {"a": {"c": 2}}) == {"a.b": (1, "<absent>"), "a.c": ("<absent>", 2)}


def test_resume_refuses_when_the_initial_weights_were_replaced(tmp_path, capsys):
    init = tmp_path / "init"
    save_model(build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0), init)
    run = tmp_path / "run"
    args = train_args(run, "--set", f"model.path={init}", "--set", "train.save_every=1")
    assert main([*args, "--set", "train.steps=1"]) == 0
    save_model(build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=1), init)
    capsys.readouterr()
    assert main([*args, "--set", "train.steps=2", "--resume"]) == 2
    assert "weights at model.path" in capsys.readouterr().err


def test_resume_command_drops_resume_and_overwrite():
    argv = ["train", "--config", "a b.yaml", "--resume", "runs/x/checkpoints/step_3", "--set", "train.lr=1", "--overwrite"]
    args = build_parser().parse_args(argv)
    args.argv = argv
    from maskrl.cli import _resume_command

    assert _resume_command(args) == "maskrl train --config 'a b.yaml' --set train.lr=1 --resume"


# ------------------------------------------------------------------------------ fingerprints and eval
def test_weights_fingerprint_follows_the_bytes(tmp_path):
    a = build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0)
    save_model(a, tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    data = f.read_bytes()
    want = hashlib.sha256(f"model.safetensors\0{len(data)}\0".encode() + data).hexdigest()
    assert rundir.weights_fingerprint(tmp_path / "m") == "sha256:" + want
    assert rundir.weights_fingerprint(tmp_path / "nothing") is None and rundir.weights_fingerprint("org/hub-id") is None
    b = build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0)
    assert rundir.weights_fingerprint(a) == rundir.weights_fingerprint(b)
    with torch.no_grad():
        next(b.model.parameters()).view(-1)[0] += 1e-6
    assert rundir.weights_fingerprint(a) != rundir.weights_fingerprint(b)
    b.model.to(torch.bfloat16)
    assert rundir.weights_fingerprint(b).startswith("sha256:")


@pytest.fixture
def sudoku_csv(tmp_path):
    return write_sudoku_csv(tmp_path / "sudoku.csv", 3, seed=5)


def test_eval_keys_on_the_weights_not_the_path(tmp_path, monkeypatch, sudoku_csv):
    from maskrl.evaluate import run_harness

    model = tmp_path / "model"
    kw = dict(task_name="sudoku4x4", gen_lengths=[16], block_length=16, steps=4, data_path=sudoku_csv, device="cpu",
              progress=False, prompt_template="{puzzle}=", chat_template=False)
    save_model(build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0), model)
    out = tmp_path / "eval"
    first = run_harness(model=model, out_dir=out, **kw)
    rows = (out / "samples_L16.jsonl").read_bytes()
    # the weights in the same folder are replaced by another model's
    save_model(build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=1), model)
    with pytest.raises(ValueError, match=r"--resume: .* other settings \(weights_sha256: "):
        run_harness(model=model, out_dir=out, resume=True, **kw)
    with pytest.raises(ValueError, match=r"holds an evaluation with other settings .*--overwrite"):
        run_harness(model=model, out_dir=out, **kw)
    assert (out / "samples_L16.jsonl").read_bytes() == rows
    second = run_harness(model=model, out_dir=out, overwrite=True, **kw)
    assert second["weights_sha256"] != first["weights_sha256"]
    # default folders: one per weights and settings, so evaluations never replace each other
    monkeypatch.chdir(tmp_path)
    a = run_harness(model=model, **kw)
    save_model(build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0), model)
    b = run_harness(model=model, **kw)
    assert a["out"] != b["out"] and Path(a["out"]).parent == Path(b["out"]).parent == Path("runs/eval/sudoku4x4")
    assert (tmp_path / a["out"] / "summary.json").is_file() and (tmp_path / b["out"] / "summary.json").is_file()
    assert b["weights_sha256"] == first["weights_sha256"]


# ------------------------------------------------------------------------------ interrupt
def test_sigint_saves_a_checkpoint_prints_the_resume_command_and_resumes_exactly(tmp_path, capsys):
    """A real Ctrl-C (SIGINT) mid-run: exit 130, a checkpoint at the step boundary, the resume command;
    the resumed run ends with the same weights, bit for bit, as an uninterrupted one."""
    steps = ["--set", "train.steps=8", "--plugin", PLUGIN, "--set", "task.name=slow_countdown"]
    ref = tmp_path / "ref"
    assert main(train_args(ref, *steps)) == 0

    run = tmp_path / "run"
    gate = tmp_path / "gate"  # the child's reward waits for it from its third batch on: it cannot finish first
    env = dict(os.environ, OMP_NUM_THREADS="1", MASKRL_TEST_REWARD_FREE="2", MASKRL_TEST_REWARD_GATE=str(gate),
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    argv = train_args(run, *steps)
    proc = subprocess.Popen([sys.executable, "-m", "maskrl.cli", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cap = time.monotonic() + WAIT_CAP_S
        while not (run / "metrics.jsonl").is_file() or len(steps_of(run / "metrics.jsonl")) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < cap, f"the training logged no 2 steps in {WAIT_CAP_S:.0f} s (a hang)"
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()  # its third reward waits for the gate
        # while it runs, a second training into the same folder is refused
        assert main(train_args(run, *steps)) == 2
        assert f"in use by pid {proc.pid}" in capsys.readouterr().err
        proc.send_signal(signal.SIGINT)
        gate.write_text("open")
        err = communicate_for("the interrupted training", proc)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    done = steps_of(run / "metrics.jsonl")
    k = done[-1]
    assert 2 <= k < 8 and done == list(range(1, k + 1))
    assert (run / "checkpoints" / f"step_{k}" / "trainer_state.pt").is_file()
    assert not (run / "model").exists() and not (run / rundir.LOCK_FILE).exists()
    line = [x for x in err.splitlines() if x.strip().startswith("maskrl train ")][-1].strip()
    assert f"SIGINT after step {k} of 8: checkpoint saved to {run / 'checkpoints' / f'step_{k}'}" in err
    resume = shlex.split(line)[1:]
    assert resume[-1] == "--resume" and resume[:-1] == argv
    assert main(resume) == 0
    assert steps_of(run / "metrics.jsonl") == list(range(1, 9))
    a, b = weights(ref / "model"), weights(run / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_latest_checkpoint_skips_incomplete_ones(tmp_path):
    from maskrl.trainer import TRAINER_STATE, latest_checkpoint

    for name, complete in (("step_2", True), ("step_10", True), ("step_12", False), ("step_x", False)):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        if complete:
            (tmp_path / "checkpoints" / name / TRAINER_STATE).write_bytes(b"")
    # step_12 was cut off while saving (its trainer state is written last): not a checkpoint to resume
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_10"
    assert latest_checkpoint(tmp_path / "none") is None


@pytest.mark.parametrize("command, argv, hint", [
    ("demo", ["demo", "--config", str(ROOT / "configs" / "demo_sudoku.yaml")], "run it again with --overwrite"),
    ("eval", ["eval", "--model", "m", "--task", "sudoku4x4"], "same command with --resume"),
])
def test_ctrl_c_outside_the_training_loop_is_one_line_and_exit_130(monkeypatch, capsys, command, argv, hint):
    import maskrl.demo
    import maskrl.evaluate

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(maskrl.demo, "run_demo", interrupted)
    monkeypatch.setattr(maskrl.evaluate, "run_harness", interrupted)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err.startswith(f"maskrl {command}: interrupted") and hint in err and err.count("\n") == 1
