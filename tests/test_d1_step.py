"""benchmarks/speed/d1_step.py: maskrl's side of the RL step against d1's trainer (the d1 side needs d1's own
environment, which CI does not have: its test skips without it)."""
import os
import time
from pathlib import Path

import pytest
import torch
from conftest import benchmark_script

d1_step = benchmark_script("speed/d1_step.py")


def _busy(seconds: float) -> None:
    t0 = time.process_time()
    x = torch.ones(64, 64)
    while time.process_time() - t0 < seconds:
        x = x @ x / 64


def test_clock_takes_a_nested_phase_out_of_the_outer_one():
    clock = d1_step.Clock({"rollout": "reference"})
    inner = clock.wrap("reference", lambda: _busy(0.05))

    def outer():
        _busy(0.02)
        inner()

    outer = clock.wrap("rollout", outer)
    with torch.no_grad():
        picked = clock.wrap(("reference", "theta_forward"), lambda: _busy(0.01))
    clock.begin()
    outer()
    picked()  # grad enabled here: the second name
    out = clock.end()
    assert out["reference"] >= 0.05 and out["theta_forward"] >= 0.01
    assert 0.02 <= out["rollout"] < out["reference"]  # the reference pass is not counted twice
    assert out["step"] == pytest.approx(sum(out[k] for k in (*d1_step.PHASES, "other")))
    assert out["other"] >= -1e-6


def test_patch_d1_adds_the_mu_1_line_once_and_refuses_other_code(tmp_path):
    src = tmp_path / "diffu_grpo_trainer.py"
    src.write_text("        with torch.no_grad():\n" + d1_step.D1_BUG + " self.num_iterations times\n")
    d1_step.patch_d1(src)
    lines = src.read_text().splitlines()
    assert lines[1].strip().startswith("prompt_completion_ids_expanded = prompt_completion_ids.unsqueeze(0).expand(")
    assert lines[2] == "            if self.num_iterations > 1:"
    with pytest.raises(SystemExit, match="not found"):
        d1_step.patch_d1(src)  # patched already
    (tmp_path / "other.py").write_text("x = 1\n")
    with pytest.raises(SystemExit, match="not found"):
        d1_step.patch_d1(tmp_path / "other.py")


def test_smoke_runs_maskrls_side_with_every_phase_timed():
    out = d1_step.main(["--smoke"])
    assert len(out["steps"]) == 2  # warm-up + 1 timed step
    for s in out["steps"]:
        assert all(s[k] > 0 for k in (*d1_step.PHASES, "sampler", "step"))
        assert s["sampler"] <= s["rollout"] and s["other"] >= -1e-6


@pytest.mark.slow
@pytest.mark.skipif(not all(os.environ.get(k) for k in ("MASKRL_D1_PYTHON", "MASKRL_D1_GIT", "MASKRL_LLADA_GIT")),
                    reason="d1's environment and code ($MASKRL_D1_PYTHON, $MASKRL_D1_GIT, $MASKRL_LLADA_GIT) not given")
def test_the_model_built_by_llada_code_loads_in_maskrl_with_equal_logits(tmp_path):
    code = d1_step.export_code(Path(os.environ["MASKRL_D1_GIT"]), Path(os.environ["MASKRL_LLADA_GIT"]), tmp_path / "code")
    spec = {"vocab": 96, "width": 64, "layers": 1, "code": str(code), "folder": str(tmp_path / "model")}
    d1_step.run_worker("build", spec, os.environ["MASKRL_D1_PYTHON"])
    assert d1_step.logit_check(tmp_path / "model") == 0.0
