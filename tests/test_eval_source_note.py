"""A result evaluated on generated rows says so where it is read: without a data folder the demo
evaluates on generated puzzles, not d1's test file, and its final summary, summary.json and model card
carry that sentence (maskrl.evaluate.eval_source_note)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import write_sudoku_csv
from maskrl.evaluate import eval_source_note
from maskrl.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]


def test_note_only_for_generated_rows():
    sudoku, countdown, gsm8k = get_task("sudoku4x4"), get_task("countdown"), get_task("gsm8k")
    assert eval_source_note(sudoku, "file:/data/sudoku4x4/4x4_test_sudoku.csv", 500) is None
    assert eval_source_note(sudoku, "generated:seed=101225", 500) == (
        "evaluated on 500 generated puzzles, not d1's test file (sudoku4x4/4x4_test_sudoku.csv in the data "
        "folder); get the file: see docs/data.md")
    cd = eval_source_note(countdown, "generated:seed=7", 3)
    assert cd.startswith("evaluated on 3 generated problems, not d1's test file (countdown/countdown_cd3_test.jsonl")
    other = eval_source_note(gsm8k, "generated:seed=7", 2)
    assert other == "evaluated on 2 generated rows, not the task's test file (gsm8k/test.jsonl); get the file: see docs/data.md"
    assert (ROOT / "docs" / "data.md").is_file()  # the page the sentence sends the user to


def _demo_cfg(tmp_path, data: str | None):
    from maskrl.config import load_config

    sets = [f"output_dir={tmp_path}/demo", "task.train_size=16", "task.eval_limit=4", "model.tiny.hidden_size=32",
            "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.intermediate_size=32", "sft.steps=1",
            "sft.batch_size=4", "train.steps=1", "train.prompts_per_step=2", "train.group_size=2",
            "train.micro_batch_size=0", "train.eval_every=0"]
    return load_config([ROOT / "configs" / "demo_sudoku.yaml"], sets + ([f"task.data_path={data}"] if data else []))


def test_demo_without_data_says_so_in_its_summary(tmp_path, monkeypatch, capsys):
    import maskrl.data
    from maskrl.demo import run_demo

    monkeypatch.setattr(maskrl.data, "default_data_dir", lambda: None)  # no $MASKRL_DATA_DIR, no ../shared/data
    s = run_demo(_demo_cfg(tmp_path, None))
    note = ("evaluated on 4 generated puzzles, not d1's test file (sudoku4x4/4x4_test_sudoku.csv in the data "
            "folder); get the file: see docs/data.md")
    assert s["eval_source"].startswith("generated:") and s["eval_note"] == note
    assert json.loads((tmp_path / "demo" / "summary.json").read_text())["eval_note"] == note
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1] == f"NOTE: {note}"  # the last line of the final summary, after the table
    assert note in (tmp_path / "demo" / "model" / "README.md").read_text()  # the model card's data line


def test_demo_on_the_test_file_has_no_note(tmp_path, capsys):
    from maskrl.demo import run_demo

    data = write_sudoku_csv(tmp_path / "sudoku.csv", 4, seed=11)
    s = run_demo(_demo_cfg(tmp_path, str(data)))
    assert s["eval_source"] == f"file:{data}" and s["eval_note"] is None
    assert "NOTE:" not in capsys.readouterr().out


def test_missing_data_error_says_what_to_put_where(monkeypatch):
    """A task that cannot generate its rows stops naming its file and the page that says where to get it."""
    import maskrl.data
    import maskrl.tasks.base
    from maskrl.config import load_config

    monkeypatch.setattr(maskrl.tasks.base, "default_data_dir", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"put gsm8k/test\.jsonl in a data folder and set \$MASKRL_DATA_DIR"
                                                r".*docs/data\.md"):
        get_task("gsm8k").resolve_path()
    monkeypatch.setattr(maskrl.data, "default_data_dir", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"no data for task 'gsm8k'.*docs/data\.md"):
        maskrl.data.eval_examples(load_config([], ["task.name=gsm8k"]), get_task("gsm8k"))
