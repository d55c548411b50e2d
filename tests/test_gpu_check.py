"""``benchmarks/speed/gpu_check.py --scale tiny`` runs the GPU check's code path on CPU and writes its JSON."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import WAIT_CAP_S

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "speed" / "gpu_check.py"


def test_gpu_check_tiny_on_cpu(tmp_path):
    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--scale", "tiny", "--device", "cpu", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=WAIT_CAP_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert {"device_name", "dtype", "torch", "transformers", "model", "sampler", "train_step"} <= set(r)
    assert r["scale"] == "tiny" and r["device"] == "cpu" and r["dtype"] == "float32"
    assert r["model"]["hidden_size"] == 64 and r["model"]["params"] > 0
    s, t = r["sampler"], r["train_step"]
    assert s["forwards"] == s["steps"] == 16  # fixed schedule: one forward per step
    assert s["tokens_per_s"] == pytest.approx(s["batch"] * s["gen_length"] / s["seconds"])
    for v in (s["seconds"], s["tokens_per_s"], s["forwards_per_s"], t["seconds"], r["peak_host_rss_gib"]):
        assert v > 0
    assert len(t["steps"]) == 2 and all(st["rollout_seconds"] > 0 and st["optimize_seconds"] > 0 for st in t["steps"])
    assert t["trainable_params"] > 0 and t["inner_iterations"] == 1
    assert t["steps"][0]["loss_metrics"]["grad_norm"] > 0  # the LoRA step got a gradient
    assert t["peak_gpu_memory_gib"] is None  # no GPU here
    # maskrl plan's fields beside the measured ones
    pv = r["plan_vs_measured"]
    assert r["plan"]["flops_per_step"] > 0 and r["plan"]["peak_gib"] > 0 and r["plan"]["forwards_per_step"] == 16 + 2
    assert pv["seconds_per_step"]["measured"] == t["steps"][-1]["seconds"] and pv["achieved_mfu"] > 0


def test_gpu_check_full_scale_shape_and_cuda_requirement():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(ValueError, match="CUDA"):
        mod.main(["--scale", "full", "--device", "cpu", "--out", os.devnull])
    # the full shape, built on the meta device (no memory): LLaDA-8B's 8.0 B parameters, bf16
    import torch

    adapter = mod.build_model("full", torch.device("meta"), torch.bfloat16)
    params = list(adapter.model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert sum(p.numel() for p in params) == 8_015_581_184
    cfg = adapter.model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size,
            cfg.vocab_size) == (4096, 32, 32, 12288, 126464)
