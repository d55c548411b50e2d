"""``benchmarks/speed/gpu_grid.py --smoke`` (issue 49 §5): the GPU grid's code path on the CPU with a tiny stand-in --
every sampler cell, both recipes' RL step per phase, each beside the plan's prediction, JSON written."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _grid():
    sys.path.insert(0, str(ROOT / "benchmarks" / "speed"))
    try:
        import gpu_grid
    finally:
        sys.path.pop(0)
    return gpu_grid


def test_gpu_grid_smoke_runs_every_cell_and_both_recipes(tmp_path):
    grid = _grid()
    out = grid.main(["--smoke", "--out", str(tmp_path / "grid.json")])
    assert json.loads((tmp_path / "grid.json").read_text()) == json.loads(json.dumps(out))
    cells = {r["cell"]: r for r in out["sampler"]}
    assert set(cells) == {f"b{b}-{c}-{s}" for b in (1, 4) for c in ("none", "prefix", "dual")
                          for s in ("fixed", "threshold")} and not out["skipped"]
    for r in cells.values():
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * r["gen_length"] / r["seconds"])
        assert r["forwards_per_token"] == pytest.approx(r["forwards"] / r["gen_length"])
        assert r["plan"]["flops"] > 0 and r["plan"]["seconds"] == max(r["plan"]["compute_s"], r["plan"]["weight_read_s"])
        if r["schedule"] == "fixed":  # one forward per step, 8 steps (a cache's refresh is the block's first step)
            assert r["forwards"] == 8
        else:
            assert 16 // 8 <= r["forwards"] <= 16
    # a cache does less work than none at the same schedule and batch: the plan's FLOPs say so
    for b in (1, 4):
        assert cells[f"b{b}-dual-fixed"]["plan"]["flops"] < cells[f"b{b}-prefix-fixed"]["plan"]["flops"] \
            < cells[f"b{b}-none-fixed"]["plan"]["flops"]
    assert [r["recipe"] for r in out["rl_steps"]] == ["diffu_grpo", "dispo"]
    for r in out["rl_steps"]:
        s, p = r["seconds"], r["plan_seconds"]
        assert s["rollout"] > 0 and s["theta"] > 0 and s["frozen"] > 0 and s["credit"] >= 0
        assert s["step"] == pytest.approx(s["rollout"] + s["credit"] + s["frozen"] + s["theta"])
        assert p["rollout"] > 0 and p["theta"] > 0 and p["frozen"] > 0 and p["step_s"] > 0


def test_the_budget_skips_cells_and_says_so(tmp_path):
    grid = _grid()
    out = grid.main(["--smoke", "--only", "b1-dual-fixed,b1-none-threshold", "--budget-s", "0",
                     "--out", str(tmp_path / "grid.json")])
    assert out["sampler"] == [] and out["rl_steps"] == []
    assert [s["cell"] for s in out["skipped"]] == ["b1-dual-fixed", "b1-none-threshold"]


def test_query_tokens_count_the_windows_of_each_cache():
    grid = _grid()
    run = {"gen_length": 64, "block_length": 32, "steps": 32}  # 2 blocks, 16 steps each under fixed
    assert grid.query_tokens("none", "fixed", 2, 10, run) == 2 * 2 * 16 * 74
    assert grid.query_tokens("dual", "fixed", 1, 10, run) == 2 * (74 + 15 * 32)
    assert grid.query_tokens("prefix", "threshold", 1, 10, run) == (74 + 31 * 64) + (74 + 31 * 32)
