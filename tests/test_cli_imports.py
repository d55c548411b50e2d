"""``maskrl --help``, ``maskrl <command> --help`` and config errors answer without importing torch or
transformers (issue 50 §6): each case runs the CLI in a fresh interpreter and reports which of the two
modules were imported by the time it answered."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
import maskrl.cli
sys.argv = ["maskrl"] + json.loads(sys.argv[1])
try:
    rc = maskrl.cli.main()
except SystemExit as e:
    rc = e.code
print(json.dumps({"rc": rc, "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules)}),
      file=sys.stderr)
"""


def _answer(argv: list[str], cwd: Path) -> tuple[dict, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=300)
    last = out.stderr.strip().splitlines()[-1]
    return json.loads(last), out.stdout + out.stderr


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["sft", "--help"], ["plan", "--help"],
                                  ["config", "--help"], ["eval", "--help"], ["generate", "--help"]],
                         ids=lambda a: " ".join(a))
def test_help_imports_neither_torch_nor_transformers(argv, tmp_path):
    got, text = _answer(argv, tmp_path)
    assert got["rc"] == 0, text
    assert "usage: maskrl" in text
    assert got["heavy"] == [], f"maskrl {' '.join(argv)} imported {got['heavy']}"


@pytest.mark.parametrize("argv,message", [
    (["config", "--set", "train.lrr=1"], "unknown key 'train.lrr'"),
    (["train", "--set", "train.lr=abc"], "train.lr: expected a number, got 'abc'"),
    (["sft", "--set", "model.nme=x"], "unknown key 'model.nme'"),
    (["plan", "--set", "rollout.remasking=bogus"], "rollout.remasking"),
    (["train", "--config", "typo.yaml"], "unknown key 'sft.stepz'"),
], ids=["config-typo", "train-bad-value", "sft-typo", "plan-bad-choice", "train-yaml-typo"])
def test_config_errors_import_neither_torch_nor_transformers(argv, message, tmp_path):
    (tmp_path / "typo.yaml").write_text("sft:\n  stepz: 3\n")
    got, text = _answer(argv, tmp_path)
    assert got["rc"] == 2, text
    assert message in text
    assert got["heavy"] == [], f"maskrl {' '.join(argv)} imported {got['heavy']} before the error"
    assert not (tmp_path / "runs").exists(), "a refused command wrote a run folder"


def test_the_probe_sees_torch_when_a_command_needs_it(tmp_path):
    """The check can fail: a config error inside a component (the objective's fields come from its
    class, whose module computes with torch) is answered after torch is imported."""
    got, text = _answer(["config", "--set", "objective.bogus=1"], tmp_path)
    assert got["rc"] == 2 and "unknown key 'objective.bogus'" in text
    assert "torch" in got["heavy"]
