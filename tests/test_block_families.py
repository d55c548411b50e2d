"""Block-diffusion families loaded without remote code (issue 48): SDAR / TraDo into Qwen3, Fast-dLLM v2 into
Qwen2, their logits against the family's own forward, their exports in the family's layout, and a family
added from outside ``src/``.

``tests/data/sdar_tiny`` is a tiny checkpoint in SDAR's layout with the logits of SDAR's own
``SDARForCausalLM`` under ``generate.py``'s block mask (``benchmarks/references/sdar_reference.py``, JetAstra/SDAR
c2041a8). Fast-dLLM v2 is checked against its own code in ``tests/test_fast_dllm_v2_reference.py``;
here against the slow re-statement of ``tests/block_reference.py`` (itself checked against SDAR's recorded
logits), on a folder written in its layout.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from maskrl.config import load_plugins
from maskrl.models import build_tiny, load, save_model
from maskrl.models.families import FAMILIES
from block_reference import block_lm_logits
from test_export import read_family_folder
from test_loaders import DREAM_CFG, dream_weights, write_folder

SDAR_DIR = Path(__file__).resolve().parent / "data" / "sdar_tiny"
TOY_FAMILY = Path(__file__).resolve().parent / "plugins" / "toy_family.py"
EPS = torch.finfo(torch.float32).eps


def _tol(reference: torch.Tensor) -> float:
    """float32 logits after a few layers: 64 float32 steps of the largest |logit|."""
    return 64 * EPS * float(reference.abs().max())


def _sdar_reference():
    ref = load_file(SDAR_DIR / "reference.safetensors")
    return ref["input_ids"], ref["logits"]


@pytest.mark.numerics
def test_sdar_logits_equal_sdars_own_forward():
    adapter = load(SDAR_DIR)
    ids, ref = _sdar_reference()
    assert type(adapter.model).__name__ == "Qwen3ForCausalLM"
    assert (adapter.family, adapter.block_size, adapter.shift, adapter.mask_id) == ("sdar", 4, False, 95)
    assert (adapter.eos_id, adapter.stop_ids, adapter.pad_id) == (93, (94,), 93)  # config.json, generation_config.json
    with torch.no_grad():
        out = adapter.logits(ids)
    assert (out - ref).abs().max() <= _tol(ref)
    for wrong in (2, None):  # the block size matters: the test can fail
        adapter.block_size = wrong
        with torch.no_grad():
            assert (adapter.logits(ids) - ref).abs().max() > 1000 * _tol(ref)


@pytest.mark.numerics
def test_the_slow_restatement_equals_sdars_own_forward():
    """The reference used for Fast-dLLM v2 reproduces SDAR's own code on SDAR's data."""
    cfg = json.loads((SDAR_DIR / "config.json").read_text())
    ids, ref = _sdar_reference()
    slow = block_lm_logits(load_file(SDAR_DIR / "model.safetensors"), cfg, ids, cfg["block_size"])
    assert (slow.float() - ref).abs().max() <= _tol(ref)


def _fast_dllm_cfg(**changes) -> dict:
    cfg = {k: v for k, v in DREAM_CFG.items() if k not in ("model_type", "architectures", "auto_map")}
    return cfg | {"model_type": "Fast_dLLM_Qwen", "architectures": ["Fast_dLLM_QwenForCausalLM"],
                  "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig",
                               "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
                  "bd_size": 4, "mask_token_id": 59, "eos_token_id": 58, "bos_token_id": 57} | changes


@pytest.mark.numerics
def test_fast_dllm_v2_logits_equal_the_restatement_shifted(tmp_path):
    cfg, w = _fast_dllm_cfg(), dream_weights()
    adapter = load(write_folder(tmp_path / "fd", cfg, w))
    assert type(adapter.model).__name__ == "Qwen2ForCausalLM"
    assert (adapter.family, adapter.block_size, adapter.shift, adapter.mask_id, adapter.eos_id) == \
        ("fast_dllm_v2", 4, True, 59, 58)
    ids = torch.randint(0, 57, (2, 11), generator=torch.Generator().manual_seed(4))
    raw = block_lm_logits(w, cfg, ids, 4).float()
    with torch.no_grad():
        out = adapter.logits(ids)
    assert (out[:, 1:] - raw[:, :-1]).abs().max() <= _tol(raw)  # logits[i] predicts i + 1: re-aligned
    assert (out[:, 0] - raw[:, 0]).abs().max() <= _tol(raw)
    no_size = {k: v for k, v in cfg.items() if k != "bd_size"}
    assert load(write_folder(tmp_path / "fd32", no_size, w)).block_size == 32  # the published models' 32


@pytest.mark.parametrize("change,error,match", [
    ({"use_sliding_window": True}, NotImplementedError, "use_sliding_window"),
    ({"hidden_act": "gelu"}, NotImplementedError, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, NotImplementedError, "rope_scaling"),
    ({"block_size": 0}, ValueError, "block_size=0"),
    ({"block_size": "4"}, ValueError, "block_size='4'"),
])
def test_what_qwen3_cannot_express_is_refused_by_name(tmp_path, change, error, match):
    cfg = json.loads((SDAR_DIR / "config.json").read_text()) | change
    with pytest.raises(error, match=match):
        load(write_folder(tmp_path / "bad", cfg, load_file(SDAR_DIR / "model.safetensors")))


def test_an_sdar_folder_without_declared_ends_takes_sdars_ids(tmp_path):
    cfg = json.loads((SDAR_DIR / "config.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("eos_token_id", "mask_token_id", "block_size")}
    a = load(write_folder(tmp_path / "plain", cfg, load_file(SDAR_DIR / "model.safetensors")), tokenizer=False)
    assert (a.mask_id, a.eos_id, a.pad_id, a.stop_ids, a.block_size) == (151669, 151643, 151643, (151645,), 4)


def _perturbed(adapter, seed=5):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return adapter


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["sdar", "fast_dllm_v2"])
def test_export_is_in_the_familys_layout_and_round_trips(tmp_path, family):
    if family == "sdar":
        src_cfg, src_w = json.loads((SDAR_DIR / "config.json").read_text()), load_file(SDAR_DIR / "model.safetensors")
        src = SDAR_DIR
    else:
        src_cfg, src_w = _fast_dllm_cfg(), dream_weights()
        src = write_folder(tmp_path / "src", src_cfg, src_w)
    adapter = _perturbed(load(src))
    out = save_model(adapter, tmp_path / "export")
    cfg, w = read_family_folder(out)
    size_key = "block_size" if family == "sdar" else "bd_size"
    assert cfg["model_type"] == src_cfg["model_type"] and cfg[size_key] == src_cfg[size_key]
    assert cfg["architectures"] == src_cfg["architectures"] and cfg["auto_map"] == src_cfg["auto_map"]
    assert cfg["mask_token_id"] == src_cfg["mask_token_id"] and "maskrl_family" not in cfg
    assert set(w) == set(src_w)  # the family's own tensor names (Qwen3 / Qwen2), nothing else
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [adapter.eos_id, *adapter.stop_ids]
    ids = torch.randint(0, 57, (2, 10), generator=torch.Generator().manual_seed(2))
    back = load(out)
    assert (back.family, back.block_size, back.shift, back.mask_id, back.eos_id, back.stop_ids) == \
        (adapter.family, adapter.block_size, adapter.shift, adapter.mask_id, adapter.eos_id, adapter.stop_ids)
    with torch.no_grad():
        assert torch.equal(back.logits(ids), adapter.logits(ids))
    raw = block_lm_logits(w, cfg, ids, cfg[size_key]).float()  # the folder read by its layout alone
    with torch.no_grad():
        assert (adapter._raw_logits(ids, None) - raw).abs().max() <= _tol(raw)


def test_an_exported_full_attention_model_is_not_written_as_sdar(tmp_path):
    adapter = load(SDAR_DIR)
    adapter.block_size = None
    with pytest.raises(NotImplementedError, match="full attention"):
        save_model(adapter, tmp_path / "x")


def test_a_family_added_from_outside_src_loads_and_exports(tmp_path):
    """One file (tests/plugins/toy_family.py), no edit to maskrl: detected by its model_type, its
    tensor names and block size read, exported in its own layout and read back."""
    tiny = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0, block_size=3)
    c = tiny.model.config
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "rms_norm_eps", "max_position_embeddings")
    cfg = {k: getattr(c, k) for k in keys} | {"model_type": "toy_block_llama", "toy_block": 3}
    folder = write_folder(tmp_path / "toy", cfg, {"toy." + k: v for k, v in tiny.model.state_dict().items()})
    with pytest.raises(ValueError, match="toy_block_llama"):
        load(folder)
    load_plugins([str(TOY_FAMILY)])
    adapter = load(folder, tokenizer=False)
    assert (adapter.family, adapter.block_size, adapter.mask_id, adapter.eos_id) == ("toy_block", 3, 5, 4)
    ids = torch.randint(6, c.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(adapter.logits(ids), tiny.logits(ids))
    out = save_model(adapter, tmp_path / "export")
    cfg_out, w = read_family_folder(out)
    assert cfg_out["model_type"] == "toy_block_llama" and all(k.startswith("toy.") for k in w)
    with torch.no_grad():
        assert torch.equal(load(out, tokenizer=False).logits(ids), tiny.logits(ids))


def test_the_plugin_family_is_gone_after_its_test():
    assert "toy_block" not in FAMILIES and {"llada", "dream", "sdar", "sdar_moe", "fast_dllm_v2"} <= set(FAMILIES)


def _sdar_moe_checkpoint(tmp_path) -> tuple[Path, dict, dict]:
    """A tiny ``sdar_moe`` folder in SDAR-MoE's layout: Qwen3-MoE keys and per-expert tensor names."""
    cfg = json.loads((SDAR_DIR / "config.json").read_text()) | {
        "model_type": "sdar_moe", "architectures": ["SDARMoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 24, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
    cfg["auto_map"] = {k: v.replace("sdar.SDAR", "sdar_moe.SDARMoe") for k, v in cfg["auto_map"].items()}
    dense = load_file(SDAR_DIR / "model.safetensors")
    g = torch.Generator().manual_seed(7)
    w = {k: v for k, v in dense.items() if ".mlp." not in k}
    hidden = cfg["hidden_size"]
    for i in range(cfg["num_hidden_layers"]):
        w[f"model.layers.{i}.mlp.gate.weight"] = torch.randn(4, hidden, generator=g)
        for e in range(4):
            p = f"model.layers.{i}.mlp.experts.{e}."
            w[p + "gate_proj.weight"] = torch.randn(24, hidden, generator=g) / hidden ** 0.5
            w[p + "up_proj.weight"] = torch.randn(24, hidden, generator=g) / hidden ** 0.5
            w[p + "down_proj.weight"] = torch.randn(hidden, 24, generator=g) / 24 ** 0.5
    return write_folder(tmp_path / "moe", cfg, w), cfg, w


@pytest.mark.numerics
def test_sdar_moe_loads_per_expert_tensors_into_qwen3_moe_and_exports_them_back(tmp_path):
    folder, cfg, w = _sdar_moe_checkpoint(tmp_path)
    adapter = load(folder)
    assert type(adapter.model).__name__ == "Qwen3MoeForCausalLM"
    assert (adapter.family, adapter.block_size, adapter.shift) == ("sdar_moe", 4, False)
    ids, _ = _sdar_reference()
    slow = block_lm_logits(w, cfg, ids, 4).float()
    with torch.no_grad():
        out = adapter.logits(ids)
    assert (out - slow).abs().max() <= _tol(slow)
    exported = save_model(adapter, tmp_path / "export")
    cfg_out, w_out = read_family_folder(exported)
    assert cfg_out["model_type"] == "sdar_moe" and cfg_out["num_experts"] == 4
    assert cfg_out["auto_map"] == cfg["auto_map"]
    assert set(w_out) == set(w) and all(torch.equal(w_out[k], w[k]) for k in w)
    with torch.no_grad():
        assert torch.equal(load(exported).logits(ids), out)
