"""benchmarks/references/grader_parity.py on the puzzle tasks (fast; the math tasks need math-verify workers and
run in the benchmark itself): every d1 generation is matched to a data row, d1's rules as
re-implemented give d1's published numbers, and maskrl's rewards meet issue 15's targets."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from maskrl.tasks import default_data_dir

ROOT = Path(__file__).resolve().parents[1]
DATA = default_data_dir()
pytestmark = pytest.mark.skipif(DATA is None or not (DATA / "d1-generations").is_dir(),
                                reason="needs shared/data/d1-generations")


def _bench():
    spec = importlib.util.spec_from_file_location("grader_parity", ROOT / "benchmarks" / "references" / "grader_parity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_puzzle_tasks_reproduce_d1_and_meet_targets(tmp_path):
    bench = _bench()
    out, dis = tmp_path / "t.json", tmp_path / "d.jsonl"
    table = bench.run(DATA / "d1-generations", DATA, out, dis, tasks=("countdown", "sudoku"))
    rows = {(r["task"], r["length"]): r for r in table["rows"]}
    assert set(rows) == {(t, L) for t in ("countdown", "sudoku4x4") for L in (128, 256)}
    for (task, L), r in rows.items():
        assert r["items"] == r["matched"] == 256
        assert r["d1_rules"] == pytest.approx(r["d1_paper"], abs=0.05), "d1's rules reproduce its table"
        assert r["target_met"], r
        tol = 1.5 if task == "countdown" else 0.6
        assert abs(r["maskrl"] - r["d1_paper"]) <= tol
    assert json.loads(out.read_text())["rows"] == table["rows"]
    lines = [json.loads(x) for x in dis.read_text().splitlines()]
    assert len(lines) == sum(r["disagreements_with_d1_rules"] for r in table["rows"])
    assert all({"question", "generation", "maskrl_score", "d1_score"} <= set(x) for x in lines)


def test_d1_rules_on_known_shapes():
    bench = _bench()
    item = {"question": "Numbers: [49, 55, 53]\nTarget: 51", "ground_truth": [[49, 55, 53], 51],
            "generations": "</reasoning>\n<answer>\n\\boxed{55 - 53}\n</answer><|eot_id|>"}
    assert bench.d1_grade("countdown", item) == (0.0, "55 - 53")
    item = {"question": "q", "ground_truth": 43500.0,
            "generations": "<answer>\n\\boxed{43,500}\n</answer><|eot_id|>"}
    assert bench.d1_grade("gsm8k", item) == (0.0, "43.0")          # d1 reads 43,500 as 43
    item = {"question": "q", "ground_truth": "\\frac{1}{2}", "generations": "<answer>\\boxed{0.5}</answer>"}
    assert bench.d1_grade("math500", item) == (1.0, "0.5")         # MATH normalisation: 0.5 -> 1/2
