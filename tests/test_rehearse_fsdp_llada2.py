"""The FSDP2 rehearsal (``benchmarks/rehearsal/rehearse_fsdp.py``) on the LLaDA2.0-mini stand-in (issue 52 item
3): the MoE checks find what they look for, and (slow) one LoRA run at width / 16 on 2 gloo processes equals the
1-process update, with the routed experts sharded, the expert bias untouched and gradient checkpointing on."""
from __future__ import annotations

import json
import types

import pytest

from conftest import benchmark_script


def _fsdp():
    return benchmark_script("rehearsal/rehearse_fsdp.py")


def _rank(**changes) -> dict:
    wrap = {"expert_tensors": 24, "experts_all_dtensors": True, "experts_numel_full": 100, "experts_numel_local": 50,
            "trainable_expert_bias": []}
    return {"rank": 0, "wrap": wrap | changes.pop("wrap", {}), "expert_bias_unchanged": True} | changes


def test_moe_checks_name_unsharded_experts_and_a_trained_or_moved_expert_bias():
    faults = _fsdp().moe_faults
    assert faults(_rank()) == []
    assert faults(_rank(wrap={"experts_numel_local": 100})) == ["shard: rank 0: experts not sharded (100 of 100)"]
    assert faults(_rank(wrap={"experts_all_dtensors": False}))[0].startswith("shard: rank 0: experts not sharded")
    assert "trainable ['x.expert_bias']" in faults(_rank(wrap={"trainable_expert_bias": ["x.expert_bias"]}))[0]
    assert "unchanged by the update: False" in faults(_rank(expert_bias_unchanged=False))[0]
    assert faults(_rank(wrap={"expert_tensors": 0, "experts_numel_local": 0, "experts_numel_full": 0})) == []


def test_record_names():
    name = _fsdp().record_name
    args = types.SimpleNamespace(family="llada2", variant="full", layers=2, width_divisor=1)
    assert name("sdar8b_math500_tracerl", args) == "llada2_mini_full_fsdp_L2"
    args = types.SimpleNamespace(family=None, variant="lora", layers=1, width_divisor=16)
    assert name("llada8b_gsm8k_diffu_grpo", args) == "llada8b_gsm8k_diffu_grpo_fsdp_L1_w16"


@pytest.mark.slow
@pytest.mark.numerics
def test_llada2_lora_under_fsdp2_on_two_processes_equals_one_process(tmp_path):
    """About 1-3 minutes: the whole rehearsal at width / 16, 2 blocks (the dense first one and one MoE block)."""
    out = tmp_path / "out"
    assert _fsdp().main(["--recipes", "sdar8b_math500_tracerl", "--family", "llada2", "--variant", "lora",
                         "--layers", "2", "--width-divisor", "16", "--out-dir", str(out), "--work",
                         str(tmp_path / "work"), "--timeout", "900"]) == 0
    rec = json.loads((out / "llada2_mini_lora_fsdp_L2_w16.json").read_text())
    assert rec["faults"] == [] and rec["family"] == "llada2"
    up = rec["update"]
    assert up["keys_equal"] and up["tensors_moved"] > 0 and up["max_abs_diff"] <= 1e-3 * up["update_max_abs"]
    for r in rec["phases"]["fsdp"]["ranks"]:
        w = r["wrap"]
        assert w["every_block_a_unit"] and w["gradient_checkpointing"] and w["expert_tensors"] == 3 * 8
        assert w["experts_numel_local"] * 2 == w["experts_numel_full"] and r["expert_bias_unchanged"]
        assert set(r["decoder_forwards"]) == {"none", "block"}


def test_update_check_allows_one_rounding_of_the_weight_and_a_float32_norm_of_n_entries():
    """Full fine-tuning's measured case: entries one float32 step of the weight apart (7.5e-9 at |w| ~ 0.1)
    pass, 3.7e-11 beyond that passes (1e-3 of the 1e-6 update), 2e-9 beyond does not; a float32 norm of
    99.6 M entries 2.6e-4 from the float64 norm passes (eps·sqrt(n) = 1.2e-3), of 1 M entries it does not."""
    faults = _fsdp().faults_of
    up = {"keys_equal": True, "max_abs_diff": 7.45e-9, "beyond_one_rounding": 3.7e-11, "update_max_abs": 1e-6,
          "grads_bitwise_equal_tensors": 46, "tensors": 46, "grad_norm_float64": 549.911, "grad_entries": 99_641_856}
    rec = {"phases": {"single": {"ranks": [{"metrics": {"grad_norm": 549.770}}]}}, "update": up}
    assert faults(rec) == []
    assert faults(rec | {"update": up | {"beyond_one_rounding": 2e-9}})[0].startswith("update: FSDP vs 1 process")
    assert faults(rec | {"update": up | {"grad_entries": 1_000_000}})[0].startswith("grad_norm: 1 process")
