"""``benchmarks/rehearsal/gpu_rehearse.py`` (the one-GPU 8B rehearsal, issue 32) runs end to end on the CPU at a
narrow width, so the script a lent device runs is one that works."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_rehearse_runs_on_cpu_and_its_files_match_the_plan(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks" / "rehearsal"))
    try:
        import gpu_rehearse
    finally:
        sys.path.pop(0)
    out = gpu_rehearse.main(["--device", "cpu", "--layers", "1", "--width-divisor", "16", "--gen-length", "8",
                             "--steps", "1", "--mu", "1", "--eval-rows", "1", "--work", str(tmp_path / "w"),
                             "--out", str(tmp_path / "gpu_rehearse.json")])
    assert [r["phase"] for r in out["phases"]] == ["load", "rollout_1", "optimize_1", "checkpoint", "export",
                                                   "reload", "eval"]
    assert (tmp_path / "gpu_rehearse.json").is_file() and out["layers"] == 1 and out["device"] == "cpu"
    f = out["files"]
    # the checkpoint holds LoRA r 128 and AdamW (12 B an entry), not the bf16 base; the export is float32
    assert f["checkpoint_size"]["measured_gib"] == pytest.approx(f["checkpoint_size"]["plan_gib"], rel=0.05)
    assert f["export_size"]["measured_gib"] == pytest.approx(f["export_size"]["plan_gib"], rel=0.05)
    assert f["checkpoint_size"]["measured_gib"] < 0.1 * f["export_size"]["measured_gib"]
    step = out["plan_vs_measured"][0]
    assert step["rollout"]["plan_peak_gib"] > 0 and step["optimize"]["measured_peak_gib"] > 0
