"""What the headline page says about its own protocol (benchmarks/table/table_audit.py, issue 51): choices made
after a confirmation was read, SFT checkpoints per verdict row, what the intervals cover, the census and the
inline verdict references -- each from hand-made records."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "table"))

import ablation_runs  # noqa: E402
import table_audit as ta  # noqa: E402
import table_verdicts as tv  # noqa: E402


def _run(cell, seed, conf, val, lr, sha, step0=0.32):
    return {"task": "sudoku", "cell": cell, "seed": seed, "overrides": ["sft.steps=250", f"train.lr={lr}"],
            "confirmation": {"accuracy": conf}, "val": {"accuracy": val}, "confirm_size": 500,
            "val_curve": [[0, {"accuracy": step0, "cell_accuracy": 0.75}], [65, {"accuracy": val}]],
            "provenance": {"sft": {"sha256": sha, "settings_key": "k1"}}}


def _family(tmp_path, monkeypatch):
    """A confirmation file of three seeds: spg re-ran at lr 1e-05 after the grid grew (its lr 2e-05 runs
    superseded) on checkpoint 'b…'; dispo@spg and dps@spg kept their runs on checkpoint 'a…'."""
    monkeypatch.setattr(ta, "ROOT", tmp_path)
    path = tmp_path / "results" / "confirm" / "sudoku_spg.json"
    a, b = "a" * 64, "b" * 64
    runs = {}
    for s in (10, 11, 12):
        runs[f"spg{s}"] = _run("spg", s, 0.30, 0.33, "1e-05", b)
        runs[f"dispo{s}"] = _run("dispo@spg", s, 0.30 + 0.01 * s - 0.1, 0.34, "0.0001", a)
        runs[f"dps{s}"] = _run("dps@spg", s, 0.29, 0.40, "2e-05", a)
    old = [{"key": f"sudoku/spg/seed{s}", **_run("spg", s, 0.28, 0.33, "2e-05", a)} for s in (10, 11, 12)]
    ablation_runs.save_results(path, {"runs": runs, "superseded": old, "sft_confirmation": {"sudoku": {"accuracy": 0.3}}})
    claims = [tv._claim("DiSPO improves SPG", "p", "sudoku", "dispo@spg", "spg", [path]),
              tv._claim("DPS improves SPG", "p", "sudoku", "dps@spg", "dispo@spg", [path])]
    monkeypatch.setattr(tv, "ROOT", tmp_path)
    return [dict(c, diff=tv.claim_differences(c, need=3)) for c in claims]


def test_after_look_derives_the_touched_claims_from_superseded_runs(tmp_path, monkeypatch):
    spg, dps = _family(tmp_path, monkeypatch)
    look = ta.after_look(spg)
    assert look["family"] == "sudoku_spg" and look["rerun"] == {"spg": ("lr=2e-05", "lr=1e-05", 3)}
    assert look["touched"]
    # before the look the base's confirmation was 0.28: dispo@spg (0.30, 0.31, 0.32) minus 0.28
    assert look["before"] == pytest.approx([0.02, 0.03, 0.04])
    assert spg["diff"]["d"] == pytest.approx([0.0, 0.01, 0.02])  # now: minus 0.30
    other = ta.after_look(dps)  # its arms (dps@spg over dispo@spg) kept their points
    assert other["rerun"] == look["rerun"] and not other["touched"] and other["before"] is None
    note = tv.look_note({**spg, "after_look": look})
    assert "spg re-ran at lr=1e-05 (was lr=2e-05, 3 superseded runs)" in note
    assert "Before, this row read +3.0 [" in note and "seeds 20–29" in note and "chosen after a look" in note
    assert "kept their points" in tv.look_note({**dps, "after_look": other})
    assert ta.after_look({"diff": dict(spg["diff"], superseded=[])}) is None


def test_checkpoints_per_row_and_the_note_with_step0_scores(tmp_path, monkeypatch):
    spg, dps = _family(tmp_path, monkeypatch)
    assert ta.checkpoints(spg) == {"arm": ["a" * 64], "base": ["b" * 64], "shared": False}
    assert ta.checkpoints(dps)["shared"] is True
    note = ta.checkpoint_note([spg, dps])
    assert "DiSPO improves SPG (sudoku): dispo@spg from `aaaaaaaa…`, spg from `bbbbbbbb…` (spg re-run after" in note
    assert "DPS improves SPG" not in note and "same SFT settings (key `k1`)" in note
    assert "identical: 32.0 % solved, cell accuracy 0.75000 in every run, 3 under `aaaaaaaa…`, 3 under `bbbbbbbb…`" in note
    spg["diff"]["runs"][10][1]["val_curve"][0][1]["accuracy"] = 0.31  # one base run's step 0 differs
    assert "step-0 scores on the selection split differ" in ta.checkpoint_note([spg])
    assert ta.checkpoint_note([dps]) == ""
    del spg["diff"]["runs"][11][0]["provenance"]["sft"]
    assert ta.checkpoints(spg)["shared"] is None


def test_coverage_compares_the_same_final_models_on_both_splits(tmp_path, monkeypatch):
    from maskrl.stats import seed_comparison, t_interval

    spg, dps = _family(tmp_path, monkeypatch)
    for r in (spg, dps):
        r["stat"] = seed_comparison(r["diff"]["d"])
    assert ta.selection_differences(spg) == pytest.approx([0.01] * 3)  # 0.34 − 0.33 on the selection split
    text = ta.coverage_markdown([spg, dps], tv._pts)
    m, lo, hi = t_interval(ta.selection_differences(dps))  # 0.40 − 0.34: +6.0, no spread; confirmation −2.0 ± 2.5
    assert f"| DPS improves SPG | sudoku | {tv._pts(dps['stat']['mean'])} [" in text
    assert "500-row confirmation split, seed 5353" in text and "covers the seeds only" in text
    assert f"| {tv._pts(m)} [{tv._pts(lo)}, {tv._pts(hi)}] | **no** |" in text and "in 1 of 2 rows" in text
    assert ta.coverage_markdown([dict(spg, diff=dict(spg["diff"], split="selection"))], tv._pts) == ""


def test_census_counts_processors_and_the_sft_models_reads(tmp_path):
    f = tmp_path / "c.json"
    runs = {"a": {"task": "t", "cell": "x", "seed": 1, "confirmation_reads": 1, "provenance": {"processor": "cpu"}},
            "b": {"task": "t", "cell": "x", "seed": 2, "confirmation_reads": 1, "test_reads": 1, "provenance": {}}}
    ablation_runs.save_results(f, {"runs": runs, "sft_confirmation": {"t": {}}, "sft_test": {"t": {"test_reads": 1}}})
    c = ta.record_census([f])
    assert (c["runs"], c["with_processor"], c["sft_confirmation"], c["sft_test"]) == (2, 1, 1, 1)
    assert (c["confirmation_reads"], c["test_reads"]) == (3, 2)
    text = ta.census_markdown(c)
    assert "1 of them name the processor" in text and "the SFT model's 1 among them, one per confirmation file" in text
    assert "None names the processor" in ta.census_markdown(c | {"with_processor": 0})


def test_inline_verdict_references_follow_the_table():
    row = {"task": "sudoku", "cell": "dispo@spg", "verdict": "undecided", "after_look": {"touched": True},
           "stat": {"mean": -0.008, "ci95": [-0.017, 0.002], "n": 10}, "diff": {"split": "confirmation"}}
    text = "it reads <!-- verdict:sudoku/dispo@spg -->*old words*<!-- /verdict -->, see above."
    out = tv.fill_references(text, [row])
    assert out == ("it reads <!-- verdict:sudoku/dispo@spg -->**undecided (chosen after a look)**, -0.8 [-1.7, +0.2] "
                   "(confirmation split, 10 seeds)<!-- /verdict -->, see above.")
    assert tv.fill_references(out, [row]) == out  # regenerating changes nothing
    with pytest.raises(SystemExit, match="sudoku/nope names no claim"):
        tv.fill_references("<!-- verdict:sudoku/nope --><!-- /verdict -->", [row])


def test_page_cites_the_verdicts_as_they_are():
    """Every inline verdict reference on the committed page says what the table says now."""
    text = tv.ROOT.joinpath("docs", "results.md").read_text()
    assert "<!-- verdict:" in text and tv.fill_references(text, tv.verdict_rows()) == text
    assert json.dumps(ta.PROCESSOR_SINCE)  # a commit named, not a path
