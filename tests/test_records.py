"""Committed records name no machine's paths (issue 51 item 7): :mod:`maskrl.records`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from maskrl.records import PROJECT_ROOT, absolute_paths, expand, portable, portable_path, write_record

DATA, WORK = "/mnt/d/shared/data", "/scratch/rh"


@pytest.mark.parametrize("path, expected", [
    ("/mnt/d/shared/data/sudoku4x4/4x4_test_sudoku.csv", "<data>/sudoku4x4/4x4_test_sudoku.csv"),
    ("/scratch/rh/standins/llada_L1_w1_s0", "<work>/standins/llada_L1_w1_s0"),
    ("/scratch/rh", "<work>"),
    (str(PROJECT_ROOT / "configs" / "demo_sudoku.yaml"), "configs/demo_sudoku.yaml"),
    ("/opt/venv/bin/accelerate", "accelerate"),
    ("/root/.cache/maskrl/wordmath/test.jsonl", "<outside>/test.jsonl"),
    ("/mnt/d/shared/database/x.csv", "<outside>/x.csv"),  # a sibling whose name starts like the data folder
    ("relative/file.json", "relative/file.json"),
])
def test_portable_path_names_each_kind_of_folder(path, expected):
    assert portable_path(path, work=WORK, data_dir=DATA) == expected


def test_portable_rewrites_paths_inside_commands_overrides_and_sources_and_expand_undoes_work_and_data():
    record = {"test_source": f"file:{DATA}/countdown/countdown_cd3_test.jsonl",
              "command": f"/usr/bin/accelerate launch -m maskrl.cli train --config {PROJECT_ROOT}/configs/a.yaml",
              "overrides": [f"model.path={WORK}/standins/x", "train.lr=1e-5"], "rate": "3/4 tokens/s", "n": 3}
    out = portable(record, work=WORK, data_dir=DATA)
    assert out == {"test_source": "file:<data>/countdown/countdown_cd3_test.jsonl",
                   "command": "accelerate launch -m maskrl.cli train --config configs/a.yaml",
                   "overrides": ["model.path=<work>/standins/x", "train.lr=1e-5"], "rate": "3/4 tokens/s", "n": 3}
    assert absolute_paths(out) == []
    assert expand(out["overrides"], work="/new/rh") == ["model.path=/new/rh/standins/x", "train.lr=1e-5"]
    assert expand(out["test_source"], data_dir="/d") == "file:/d/countdown/countdown_cd3_test.jsonl"
    with pytest.raises(ValueError, match="<work>"):
        expand("output_dir=<work>/a")


def test_write_record_writes_portable_json(tmp_path):
    path = write_record(tmp_path / "r" / "x.json", {"p": f"{WORK}/a"}, work=WORK)
    assert json.loads(path.read_text()) == {"p": "<work>/a"}


def _committed_json() -> list[Path]:
    files = [p for d in ("results", "benchmarks", "tests") for p in (PROJECT_ROOT / d).rglob("*.json")]
    return sorted(p for p in files if ".pytest_cache" not in p.parts)


def test_no_committed_record_names_an_absolute_path():
    found = {}
    for path in _committed_json():
        paths = absolute_paths(json.loads(path.read_text()))
        if paths:
            found[str(path.relative_to(PROJECT_ROOT))] = paths[:3]
    assert not found, f"records naming a machine's absolute paths (write them with maskrl.records): {found}"
