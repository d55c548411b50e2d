"""`maskrl score` body (docs/spec.md §5): scoring another model's completions with a task's reward."""
from __future__ import annotations

import json

import pytest

from maskrl.scoring import PredictionsError, read_predictions, score_predictions
from maskrl.stats import wilson_interval
from maskrl.tasks import TASKS, get_task


def _write(path, lines) -> str:
    path.write_bytes(b"".join((ln if isinstance(ln, bytes) else ln.encode()) + b"\n" for ln in lines))
    return str(path)


def _pred(pid, completion) -> str:
    return json.dumps({"id": pid, "completion": completion})


def _need(task_name: str):
    task = get_task(task_name)
    try:
        task.resolve_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return task


def test_happy_path_sudoku(tmp_path):
    task = _need("sudoku4x4")
    ex = task.load()
    # rows 3, 0, 7 in that order: solved, partly wrong, empty
    partly = ex[0].fields["solution"]
    blank = ex[0].fields["puzzle"].index("0")
    partly = partly[:blank] + ("1" if partly[blank] != "1" else "2") + partly[blank + 1:]
    preds = _write(tmp_path / "p.jsonl", [_pred(3, ex[3].fields["solution"]), _pred(0, partly),
                                          json.dumps({"id": 7, "completion": "", "model": "x"})])
    summary = score_predictions("sudoku4x4", preds, out_dir=tmp_path / "out")
    rows = [json.loads(ln) for ln in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [3, 0, 7]
    assert [r["line"] for r in rows] == [1, 2, 3]
    assert rows[0]["reward"] == 1.0 and rows[0]["correct"] is True
    assert 0.0 < rows[1]["reward"] < 1.0 and rows[1]["correct"] is False
    assert rows[2]["reward"] == 0.0 and rows[2]["correct"] is False
    assert summary["task"] == "sudoku4x4" and summary["n"] == 3 and summary["n_data_rows"] == len(ex)
    assert summary["accuracy"] == pytest.approx(1 / 3)
    assert summary["accuracy_ci95"] == pytest.approx(list(wilson_interval(1, 3)))
    assert summary["mean_reward"] == pytest.approx(sum(r["reward"] for r in rows) / 3)
    assert summary["sources"]["data"]["path"].endswith("4x4_test_sudoku.csv")
    assert len(summary["sources"]["predictions"]["sha256"]) == 64
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| sudoku4x4 | 3 |" in md and "33.3 %" in md


def test_happy_path_gsm8k_with_explicit_data(tmp_path):
    task = _need("gsm8k")
    data = task.resolve_path()
    ex = task.load()
    preds = _write(tmp_path / "p.jsonl", [_pred(1, f"\\boxed{{{ex[1].fields['answer']}}}"), _pred(0, "#### 0.5"),
                                          _pred(1318, ex[1318].fields["solution"] + "\n#### "
                                                + ex[1318].fields["answer"])])
    summary = score_predictions("gsm8k", preds, data_path=data.parent.parent, out_dir=tmp_path / "o")
    assert summary["n"] == 3 and summary["accuracy"] == pytest.approx(2 / 3)
    rows = [json.loads(ln) for ln in (tmp_path / "o" / "rows.jsonl").read_text().splitlines()]
    assert [(r["id"], r["reward"]) for r in rows] == [(1, 1.0), (0, 0.0), (1318, 1.0)]


def test_every_bad_input_is_reported_with_its_line(tmp_path):
    task = _need("countdown")
    n = len(task.load())
    lines = [
        _pred(0, "1+2"),                                   # 1 ok
        b'{"id": 1, "completion": "\xff\xfe"}',            # 2 not UTF-8
        "{not json",                                       # 3 not JSON
        "[1, 2]",                                          # 4 not an object
        json.dumps({"completion": "x"}),                   # 5 missing id
        json.dumps({"id": 2}),                             # 6 missing completion
        json.dumps({"id": "3", "completion": "x"}),        # 7 id not an integer
        json.dumps({"id": True, "completion": "x"}),       # 8 bool is not an id
        json.dumps({"id": 4, "completion": 5}),            # 9 completion not a string
        _pred(n, "x"),                                     # 10 unknown id (one past the end)
        _pred(-1, "x"),                                    # 11 unknown id
        _pred(0, "again"),                                 # 12 duplicate of line 1
        "",                                                # 13 blank line inside the file
        _pred(5, "ok"),                                    # 14 ok
    ]
    preds = _write(tmp_path / "p.jsonl", lines)
    with pytest.raises(PredictionsError) as info:
        score_predictions("countdown", preds, out_dir=tmp_path / "out")
    problems = info.value.problems
    expected = {2: "not UTF-8", 3: "not valid JSON", 4: "expected a JSON object", 5: "missing field 'id'",
                6: "missing field 'completion'", 7: "'id' must be an integer", 8: "'id' must be an integer",
                9: "'completion' must be a string", 10: f"unknown id {n}", 11: "unknown id -1",
                12: "duplicate id 0 (first on line 1)", 13: "blank line"}
    assert len(problems) == len(expected), problems
    for (lineno, text), problem in zip(sorted(expected.items()), problems):
        assert problem.startswith(f"line {lineno}: ") and text in problem, (lineno, problem)
    assert f"{len(expected)} problem(s)" in str(info.value)
    assert not (tmp_path / "out").exists(), "nothing is written when the input is bad"


def test_empty_file_and_trailing_newlines(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(PredictionsError, match="no predictions"):
        read_predictions(empty, range(10))
    ok = tmp_path / "ok.jsonl"
    ok.write_text(_pred(2, "x") + "\n\n\n")
    assert read_predictions(ok, range(10)) == [(1, 2, "x")]


def test_unknown_task_and_missing_files(tmp_path):
    with pytest.raises(KeyError, match="valid tasks"):
        score_predictions("no-such-task", tmp_path / "p.jsonl", out_dir=tmp_path)
    _need("countdown")
    with pytest.raises(FileNotFoundError):
        score_predictions("countdown", tmp_path / "missing.jsonl", out_dir=tmp_path)
    with pytest.raises(FileNotFoundError):
        score_predictions("countdown", tmp_path / "p.jsonl", data_path=tmp_path / "nope.jsonl", out_dir=tmp_path)


@pytest.mark.parametrize("task_name", TASKS.names())
def test_every_registered_task(task_name, tmp_path):
    """Every task scores through the protocol alone; where a task has an SFT target, it scores 1."""
    task = _need(task_name)
    ex = task.load()
    ids = [0, len(ex) - 1]
    has_target = hasattr(task, "target")
    lines = [_pred(i, task.target(ex[i]) if has_target else "") for i in ids] + [_pred(len(ex) // 2, "")]
    summary = score_predictions(task_name, _write(tmp_path / "p.jsonl", lines), out_dir=tmp_path / "o")
    rows = [json.loads(ln) for ln in (tmp_path / "o" / "rows.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ids + [len(ex) // 2]
    assert all(0.0 <= r["reward"] <= 1.0 for r in rows)
    assert rows[-1]["reward"] == 0.0, "an empty completion scores 0"
    if has_target:
        assert [r["correct"] for r in rows[:2]] == [True, True]
    assert summary["n"] == 3 and (tmp_path / "o" / "summary.md").is_file()


def test_cli_score_refuses_to_replace_an_earlier_score_without_overwrite(tmp_path, capsys):
    from maskrl.cli import main

    task = _need("sudoku4x4")
    ex = task.load()
    preds = _write(tmp_path / "p.jsonl", [_pred(0, ex[0].fields["solution"])])
    out = tmp_path / "out"
    assert main(["score", "--task", "sudoku4x4", "--predictions", preds, "--out", str(out)]) == 0
    before = (out / "summary.json").read_text()
    other = _write(tmp_path / "q.jsonl", [_pred(1, "")])
    assert main(["score", "--task", "sudoku4x4", "--predictions", other, "--out", str(out)]) == 2
    assert "rows.jsonl exists (an earlier score); pass --overwrite" in capsys.readouterr().err
    assert (out / "summary.json").read_text() == before  # nothing lost
    assert main(["score", "--task", "sudoku4x4", "--predictions", other, "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["accuracy"] == 0.0
