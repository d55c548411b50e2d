"""``benchmarks/speed/dual_cache_ops.py``'s grouping of profiled operators."""
from __future__ import annotations

from conftest import benchmark_script


def test_operators_fall_in_their_groups():
    ops = benchmark_script("speed/dual_cache_ops.py", "dual_cache_ops")
    g = lambda name, *shapes: ops.group_of(name, list(shapes), 8192, 64)  # noqa: E731
    assert g("aten::mm", [32, 256], [256, 8192]) == "output layer matmul"
    assert g("aten::mm", [32, 256], [256, 768]) == "decoder matmuls"
    assert g("aten::linear", [1, 32, 256], [8192, 256], []) == "other"  # a wrapper: its kernel is counted
    assert g("aten::copy_", [1, 4, 32, 64], [1, 4, 32, 64], []) == "KV store write"
    assert g("aten::_scaled_dot_product_flash_attention_for_cpu", [1, 4, 32, 64]) == "attention (SDPA)"
    assert g("Torch-Compiled Region: 0/1") == "attention (SDPA)"
    assert g("aten::scatter_", [1, 4, 192, 64], [], [1, 4, 32, 64]) == "KV store write"
    assert g("aten::_index_put_impl_", [1, 4, 192, 64], [], [4, 32, 64]) == "KV store write"
    assert g("aten::_softmax", [1, 32, 8192], [], []) == "commit rule over V"
    assert g("aten::max", [17, 8192], [], []) == "commit rule over V"
    assert g("aten::mul", [1, 4, 192, 64], [1, 1, 192, 64]) == "rotary"
    assert g("aten::neg", [1, 4, 32, 32]) == "rotary"
    assert g("aten::pow", [1, 32, 256], []) == "RMSNorm"
    assert g("aten::add", [1, 32, 256], [1, 32, 256], []) == "other"
