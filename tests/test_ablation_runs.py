"""What the controlled table's runs share (benchmarks/table/ablation_runs.py): intervals, resumable record
files, the task setup's splits and provenance hashes."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from conftest import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "table"))

from ablation_runs import already_recorded, load_results, save_results, t_interval, update_results  # noqa: E402


def test_t_interval_by_hand():
    m, lo, hi = t_interval([1.0, 2.0, 3.0])  # sd 1, exact t_{0.975, 2} = 0.95 / sqrt(2 .975 .025) = 4.30265...
    assert m == 2.0 and hi - m == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025) / math.sqrt(3), rel=1e-12) and m - lo == pytest.approx(hi - m)
    assert t_interval([0.5]) == (0.5, 0.5, 0.5)
    assert all(math.isnan(x) for x in t_interval([0.5, float("nan")]))  # a field some records lack


def test_resumable_file(tmp_path):
    runs = {f"t/c/seed{s}/steps5": {"task": "t", "cell": "c", "seed": s, "steps": 5,
                                    "val": {"accuracy": a, "mean_reward": a}} for s, a in enumerate([0.2, 0.4])}
    out = tmp_path / "r.json"
    save_results(out, {"runs": runs})
    assert load_results(out)["runs"] == runs and load_results(tmp_path / "none.json") == {"runs": {}}


def test_bad_result_files_are_clear_errors(tmp_path):
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "obj.json").write_text("{}")
    for name, msg in (("empty.json", "not JSON"), ("obj.json", "no 'runs'")):
        with pytest.raises(SystemExit, match=msg):
            load_results(tmp_path / name)


def test_task_setup_holds_validation_out_of_a_fixed_data_set():
    """A task without a generator (GSM8K, MATH, a user's file; here the shipped file-task example): the
    validation rows are the last ``val_size`` training rows, removed from training; too few rows is
    an error naming --val-size."""
    from ablation_runs import TaskSetup

    recipe = Path(__file__).resolve().parents[1] / "configs" / "byo_file_task.yaml"
    setup = TaskSetup("byo", recipe, [], "test", val_size=20, log=lambda _: None)
    assert not hasattr(setup.task, "generate") and len(setup.val) == 20
    assert not {e.prompt for e in setup.val} & {e.prompt for e in setup.train}
    with pytest.raises(SystemExit, match="--val-size"):
        TaskSetup("byo", recipe, [], "test", val_size=10**6, log=lambda _: None)


def _record_many(path: str, prefix: str, n: int) -> None:
    for i in range(n):
        update_results(Path(path), lambda d, i=i: d["runs"].__setitem__(f"{prefix}/{i}", {"i": i}))


def test_two_processes_recording_side_by_side_lose_nothing(tmp_path):
    """Two table processes writing one records file (issue 22: "two runs side by side"): every
    record of both survives, because each write re-reads the file under a lock."""
    import multiprocessing as mp

    out = tmp_path / "table.json"
    save_results(out, {"runs": {"old/0": {"i": -1}}})
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_record_many, args=(str(out), p, 25)) for p in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        assert wait_for(f"recording process {p.name}", p) == 0
    runs = load_results(out)["runs"]
    assert set(runs) == {"old/0"} | {f"{p}/{i}" for p in "ab" for i in range(25)}


def test_already_recorded_skips_the_same_settings_and_refuses_others(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert not already_recorded(out, "t/c/seed0", {"steps": 2}, "x")  # no file yet
    save_results(out, {"runs": {"t/c/seed0": {"steps": 2, "val": 0.5}}})
    assert not already_recorded(out, "t/c/seed1", {"steps": 2}, "x")
    assert already_recorded(out, "t/c/seed0", {"steps": 2}, "x")
    assert "[x] t/c/seed0: recorded, skipped" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"t/c/seed0 is already in .* other settings \(\{'steps': 2\}; now \{'steps': 3\}\)"):
        already_recorded(out, "t/c/seed0", {"steps": 3}, "x")


def test_provenance_hashes(tmp_path):
    import hashlib

    from ablation_runs import checkpoint_sha256, code_version, file_sha256, software
    from maskrl.machine import cpu_identity, float_key

    f = tmp_path / "x.csv"
    f.write_bytes(b"a,b\n1,2\n" * 100_000)  # several read chunks
    assert file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    ck = tmp_path / "ck"
    ck.mkdir()
    with pytest.raises(FileNotFoundError, match="no weight file"):
        checkpoint_sha256(ck)
    (ck / "model.safetensors").write_bytes(b"\x00\x01")
    (ck / "config.json").write_text("{}")
    first = checkpoint_sha256(ck)
    want = hashlib.sha256(b"model.safetensors\0" + hashlib.sha256(b"\x00\x01").hexdigest().encode()).hexdigest()
    assert first == want
    (ck / "config.json").write_text('{"other": 1}')
    assert checkpoint_sha256(ck) == first  # the weights' identity, not the metadata's
    (ck / "model.safetensors").write_bytes(b"\x00\x02")
    assert checkpoint_sha256(ck) != first
    code = code_version()
    assert set(code) == {"commit", "dirty"} and (code["commit"] is None or len(code["commit"]) == 40)
    sw = software()
    assert set(sw) == {"torch", "cpu_capability", "threads", "processor"}
    assert sw["processor"] == cpu_identity() and float_key().endswith(sw["processor"])  # the bits' key, in parts
