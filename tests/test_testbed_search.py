"""The testbed search (benchmarks/testbed_search.py, issue 22 part 1): every pilot names a known
cell and valid overrides, and the summary reads a record by hand values."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import table_protocol as tp  # noqa: E402
import testbed_search as ts  # noqa: E402
from maskrl.config import load_config  # noqa: E402


@pytest.mark.parametrize("name", list(ts.PILOTS))
def test_every_pilot_resolves_to_a_valid_recipe(name, tmp_path):
    task, overrides, *cell = ts.PILOTS[name]
    recipe = tp.cell_recipe(tp.BASES[task], cell[0] if cell else "diffu_grpo_state", None, tmp_path)
    cfg = load_config([recipe], overrides)  # raises on an unknown field or a bad value
    assert cfg.train.steps > 0


def test_unknown_pilot_is_refused():
    with pytest.raises(SystemExit, match="unknown pilot 'nope'"):
        ts.run("nope", "0", 10)


def test_summary_row_by_hand(tmp_path, monkeypatch):
    monkeypatch.setattr(ts, "OUT_DIR", tmp_path)
    run = {"task": "sudoku", "cell": "wd1", "seed": 0, "overrides": ["train.lr=1e-4"], "steps": 12,
           "completions": 12 * 48, "rl_cpu_seconds": 99.6, "rewards": [0.5] * 2 + [0.6] * 10,
           "val_curve": [[0, {"accuracy": 0.3}], [10, {"accuracy": 0.45}], [12, {"accuracy": 0.4}]]}
    (tmp_path / "mine.json").write_text(json.dumps({"runs": {"sudoku/wd1/seed0": run}}))
    (row,) = ts.rows()
    assert row["pilot"] == "mine" and row["sft"] == 0.3 and row["final"] == 0.4 and row["best"] == 0.45
    assert row["change"] == pytest.approx(0.1)
    assert row["reward_first10"] == pytest.approx(0.58) and row["reward_last10"] == pytest.approx(0.6)
    line = ts.markdown([row]).splitlines()[-1]
    assert line == "| `mine` | wd1 | 0 | 0.300 | 0.400 | 0.450 | +0.100 | 0.580 → 0.600 | 12 × 48 | 100 |"


def test_ceiling_summary_by_hand():
    import testbed_ceiling as tc

    runs = {f"sudoku/lr0.0001/seed{s}": {"task": "sudoku", "lr": 1e-4, "seed": s, "sft": 0.3, "final": f,
                                          "steps": 80, "batch": 48, "warmup": 0} for s, f in enumerate([0.4, 0.5, 0.6])}
    own = {"sudoku/own/lr0.0001/seed0": {**runs["sudoku/lr0.0001/seed0"], "source": "own", "final": 0.25}}
    lines = tc.summary({"runs": {**runs, **own}}).splitlines()
    assert lines[2] == "| sudoku | ground truth | 0.0001 | 0 | 80 × 48 | 3 | 0.300 | 0.500 [0.252, 0.748] | +0.200 [-0.048, +0.448] |"
    assert lines[3].startswith("| sudoku | own | 0.0001 | 0 | 80 × 48 | 1 | 0.300 | 0.250 ")
    line = lines[2]
    # gains 0.1, 0.2, 0.3: mean 0.2, t(0.975, 2) = 4.303, sd 0.1, half-width 4.303 * 0.1 / sqrt(3) = 0.248
    assert line == "| sudoku | ground truth | 0.0001 | 0 | 80 × 48 | 3 | 0.300 | 0.500 [0.252, 0.748] | +0.200 [-0.048, +0.448] |"


def test_run_sft_calls_on_step_after_every_optimizer_step_and_keeps_training_mode():
    from conftest import fresh_tiny
    from maskrl.sft import run_sft
    from maskrl.tasks.base import Example

    a = fresh_tiny()
    seen = []

    def on_step(k):
        seen.append((k, a.model.training))
        a.model.eval()  # as an evaluation would

    exs = [Example(id=i, prompt=f"q{i}", fields={"t": f"a{i}"}) for i in range(4)]
    run_sft(a, exs, lambda e: e.fields["t"], gen_length=4, steps=3, batch_size=2, lr=1e-3, progress=False, on_step=on_step)
    assert seen == [(1, True), (2, True), (3, True)]


def test_seed_summary_by_hand():
    rows = [{"pilot": "p", "change": c, "rl_cpu_seconds": 200.0 + i} for i, c in enumerate([0.1, 0.2, 0.3])]
    rows.append({"pilot": "single", "change": 0.5, "rl_cpu_seconds": 1.0})
    # mean 0.2, sd 0.1, t(0.975, 2) 4.303: half-width 0.248; mean CPU 201
    assert ts.seed_summary(rows).splitlines()[2] == "| `p` | 3 | +0.200 [-0.048, +0.448] (3+/0−) | 201 |"
    assert ts.seed_summary(rows[3:]) == ""
