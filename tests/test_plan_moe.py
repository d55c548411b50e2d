"""``maskrl plan`` on the LLaDA2 Mixture-of-Experts family: FLOPs counted on the meta device with the balanced
routing of :mod:`maskrl.plan.moe` equal ``FlopCounterMode`` on a real CPU forward routed by the model itself;
resident vs active parameters; LoRA on the experts only when asked."""
from __future__ import annotations

import pytest
import torch

from maskrl.plan import FlopModel, ModelShape, build_adapter, param_memory
from maskrl.plan.flops import _inputs
from maskrl.plan.moe import active_params, balanced_routing

#: a small LLaDA2 shape: 3 layers (the first dense), 16 experts (4 groups of 4, 2 kept), 4 active + 1 shared
TINY_MOE = ModelShape("llada2", 64, 3, 4, 2, 96, 100, head_dim=16, block_size=4, num_experts=16,
                      num_experts_per_tok=4, num_shared_experts=1, moe_intermediate_size=32, first_dense_layers=1,
                      n_group=4, topk_group=2)


def test_balanced_routing_gives_each_token_k_distinct_experts():
    routes = balanced_routing(5, 4, 16)
    per_token = {t: [] for t in range(5)}
    for e, rows, _ in routes:
        for t in rows.tolist():
            per_token[t].append(e)
    assert all(len(set(v)) == 4 for v in per_token.values()) and sum(r.numel() for _, r, _ in routes) == 20


@pytest.mark.parametrize("kind,lora", [("forward", None), ("train", None), ("train", "attention"),
                                       ("train", "experts")])
def test_moe_flops_on_meta_equal_a_real_routed_forward(kind, lora):
    """The meta count (balanced routing, extrapolated from 2 and 3 layers to 4) equals FlopCounterMode around
    the same call on a real CPU model of the shape, whose router picks the experts from its random weights:
    every routing of M tokens to k experts runs the experts' matmuls on M·k token rows in all."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from maskrl.models.scale import rl_train_mode

    shape = ModelShape(**{**TINY_MOE.__dict__, "num_layers": 4})
    spec = None if lora is None else {"rank": 4, "alpha": 8.0, "targets": "all-linear", "experts": lora == "experts"}
    fm = FlopModel(shape, torch.float32, spec, True)
    assert fm.depths == (2, 3)
    real = build_adapter(shape, torch.float32, spec, True, device="cpu")
    rows, seq, scored = 2, 12, 5
    ids, attn, r, c, t = _inputs(real, rows, seq, scored, "cpu")
    ids = torch.randint(0, 90, ids.shape, generator=torch.Generator().manual_seed(0))
    if kind == "train":
        rl_train_mode(real.model)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        if kind == "train":
            real.log_probs_at(ids, attn, r, c, t).sum().backward()
        else:
            with torch.no_grad():
                real.log_probs_at(ids, attn, r, c, t)
    assert fm.flops(kind, rows, seq, scored) == fc.get_total_flops() > 0


def test_resident_and_active_parameters_and_expert_lora():
    """Resident parameters (accelerate's count on the meta model) equal the family's ``parameter_counts``;
    active ones hold k of E routed experts; LoRA adapts the routed experts only with ``experts``."""
    counts = active_params(TINY_MOE)
    expert = 3 * 64 * 32
    assert counts["routed_experts"] == 2 * 16 * expert  # 2 MoE layers
    assert counts["active_per_token"] == counts["total"] - 2 * (16 - 4) * expert
    assert param_memory(TINY_MOE, torch.float32, None)["params"] == counts["total"]
    deep = ModelShape(**{**TINY_MOE.__dict__, "num_layers": 5})  # counted at 2 and 3 layers, extrapolated to 5
    spec = {"rank": 4, "alpha": 8.0, "targets": "all-linear", "experts": True}
    assert param_memory(deep, torch.bfloat16, spec) == param_memory(deep, torch.bfloat16, spec, extrapolate=False)
    base = {"rank": 4, "alpha": 8.0, "targets": "all-linear"}
    attn_only = param_memory(TINY_MOE, torch.float32, base)["adapter_params"]
    with_experts = param_memory(TINY_MOE, torch.float32, base | {"experts": True})["adapter_params"]
    # each routed expert adds LoRA on gate / up (64 -> 32) and down (32 -> 64): 3 x 4 x (64 + 32) entries
    assert with_experts - attn_only == 2 * 16 * 3 * 4 * (64 + 32)


@pytest.mark.slow  # about a minute of CPU: the real-width slice is built and profiled
@pytest.mark.parametrize("kind", ["forward", "train"])
def test_moe_activation_plan_within_15_percent_of_a_real_width_slice(kind):
    """A slice of LLaDA2-mini at its real widths (hidden 2048, 16 / 4 heads of 128, dense MLP 5120, experts of
    512; the dense first layer and one MoE layer of 8 experts, 2 active + 1 shared; a 512-token vocabulary):
    the plan's activation peak (narrow models at widths 128 / 256, fitted and extrapolated) is within 15 % of
    the CPU profiler's peak of the same call on the real-width model (its own routing), and its FLOPs equal
    FlopCounterMode's count of that call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from maskrl.models.scale import rl_train_mode
    from maskrl.plan import ActivationModel, profiled_peak

    shape = ModelShape("llada2", 2048, 2, 16, 4, 5120, 512, head_dim=128, block_size=32, num_experts=8,
                       num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=512, first_dense_layers=1,
                       n_group=4, topk_group=2)
    rows, seq, scored = 2, 256, 64
    planned = ActivationModel(shape, torch.float32, None, False).peak(kind, rows, seq, scored)
    real = build_adapter(shape, torch.float32, None, False, device="cpu")
    ids, attn, r, c, t = _inputs(real, rows, seq, scored, "cpu")
    ids = torch.randint(0, 500, ids.shape, generator=torch.Generator().manual_seed(0))
    if kind == "train":
        rl_train_mode(real.model)
        real.log_probs_at(ids, attn, r, c, t).sum().backward()  # allocate .grad once (counted apart)

        def call():
            real.log_probs_at(ids, attn, r, c, t).sum().backward()
    else:
        def call():
            with torch.no_grad():
                real.log_probs_at(ids, attn, r, c, t)
    measured, _ = profiled_peak(call)
    assert abs(planned - measured) <= 0.15 * measured, (planned, measured)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        call()
    assert FlopModel(shape, torch.float32, None, False).flops(kind, rows, seq, scored) == fc.get_total_flops()
