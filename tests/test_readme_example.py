"""The README's code is real: its "Library in five lines" runs as written, and its "Extending maskrl"
credit module loads as a plug-in and trains."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from maskrl.config import load_config
from maskrl.models import build_tiny
from maskrl.tasks.base import Example
from maskrl.trainer import RLTrainer
from conftest import OddChars

README = Path(__file__).resolve().parents[1] / "README.md"


def _example(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", text, re.S)
    assert m, f"README.md has no python block after <!-- example: {name} -->"
    return m.group(1)


def test_readme_credit_module_runs_as_a_plugin(tmp_path):
    code = _example("credit module")
    assert len(code.strip().splitlines()) <= 30
    plugin = tmp_path / "my_credit.py"
    plugin.write_text(code)
    cfg = load_config([], [f"output_dir={tmp_path / 'out'}", "rollout.gen_length=8", "rollout.block_length=8",
                           "rollout.steps=8", "rollout.temperature=1.0", "train.prompts_per_step=2",
                           "train.group_size=3", "train.inner_iterations=1", "credit=[{name: low_confidence, lam: 1.0}]"],
                      plugins=[str(plugin)])
    policy = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    tr = RLTrainer(cfg, policy, OddChars(), [Example(id=i, prompt=f"q{i}") for i in range(4)])
    batch = tr.collect()
    ro = batch.rollout
    valid = ro.completion_mask.float()
    w = (1 + (1 - ro.commit_prob)) * valid
    w = w * valid.sum(-1, keepdim=True) / w.sum(-1, keepdim=True)
    base = tr.objective.advantages(batch.rewards, ro.group_ids)[:, None] * valid
    torch.testing.assert_close(batch.advantages, base * w)
    assert batch.metrics["low_confidence/w_max"] > 1.0
    m = tr.optimize(batch)
    assert "base/policy_loss" in m


def test_readme_library_example_runs_as_written():
    code = _example("library")
    statements = [ln for ln in code.splitlines() if ln.strip() and not ln.lstrip().startswith(("from ", "import "))]
    assert len(statements) <= 5, statements  # "five lines": the imports aside
    scope: dict = {}
    exec(compile(code, "README.md (library example)", "exec"), scope)
    ro = scope["rollout"]
    assert ro.commit_step.shape == ro.commit_prob.shape == (1, 16)
    # a fixed schedule of 16 steps over 16 positions commits one token per step, each exactly once
    assert sorted(ro.commit_step[0].tolist()) == list(range(16))
    assert bool(((ro.commit_prob > 0) & (ro.commit_prob <= 1)).all())
