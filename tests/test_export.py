"""Exports the field reads (issue 23): a trained LLaDA / Dream policy is written in its family's own
checkpoint layout, the built-in tiny model in a layout no plain causal load accepts, LoRA runs merged.

The LLaDA and Dream checks read the exported folder with a from-scratch loader written here that
knows only the family's documented layout (``config.json`` keys + safetensors tensor names, as in the
published LLaDA-8B-Instruct / Dream-v0-Instruct-7B folders) and runs the plain-PyTorch references of
``test_loaders`` on it; the logits must equal maskrl's.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from maskrl.models import apply_lora, build_tiny, load, save_model
from test_loaders import (DREAM_CFG, LLADA_CFG, _ids, _maxdiff, dream_weights, llada_weights, ref_llada, ref_qwen2,
                          write_folder)

TOL = 1e-5


def read_family_folder(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """From scratch: ``config.json`` as a dict and every tensor of the safetensors file(s) by its name
    (``model.safetensors.index.json``'s ``weight_map`` when present, else ``model.safetensors``)."""
    cfg = json.loads((folder / "config.json").read_text())
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    tensors = {}
    for name in files:
        with safe_open(folder / name, framework="pt") as f:
            tensors |= {k: f.get_tensor(k) for k in f.keys()}
    return cfg, tensors


def _perturb(adapter, seed=5):
    """Stand-in for training: every weight moves, so an export of the *loaded* weights would fail."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)


def _export(tmp_path, config: dict, weights: dict):
    """A family checkpoint loaded by maskrl, perturbed (so written weights differ from the source),
    exported; ``(adapter, export folder, its config.json, its tensors)``."""
    adapter = load(write_folder(tmp_path / "src", config, weights))
    _perturb(adapter)
    out = save_model(adapter, tmp_path / "model")
    return (adapter, out, *read_family_folder(out))


def test_llada_export_is_in_llada_layout_and_gives_maskrls_logits(tmp_path):
    adapter, out, cfg, w = _export(tmp_path, LLADA_CFG, llada_weights())
    assert cfg["model_type"] == "llada" and cfg["architectures"] == ["LLaDAModelLM"]
    assert cfg["auto_map"]["AutoModel"].endswith("modeling_llada.LLaDAModelLM")
    for key in ("d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "embedding_size", "rope_theta",
                "rms_norm_eps", "max_sequence_length", "block_type", "activation_type", "weight_tying"):
        assert cfg[key] == LLADA_CFG[key], key
    assert (cfg["mask_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (60, 61, 62)
    assert set(w) == set(llada_weights())  # exactly LLaDA's tensor names
    ids = _ids()
    with torch.no_grad():
        got = adapter.logits(ids)
    assert _maxdiff(got, ref_llada(w, cfg, ids)) < TOL
    assert _maxdiff(got, ref_llada(llada_weights(), cfg, ids)) > 1e-3  # the trained weights were written
    back = load(out)  # and maskrl reads its own export as the LLaDA family
    assert (back.family, back.mask_id, back.eos_id, back.pad_id, back.stop_ids) == ("llada", 60, 61, 62, (126348,))
    with torch.no_grad():
        assert _maxdiff(back.logits(ids), got) < TOL


def test_dream_export_is_in_dream_layout_and_gives_maskrls_logits(tmp_path):
    adapter, out, cfg, w = _export(tmp_path, DREAM_CFG, dream_weights())
    assert cfg["model_type"] == "Dream" and cfg["architectures"] == ["DreamModel"]
    assert cfg["auto_map"]["AutoModel"].endswith("modeling_dream.DreamModel")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "rope_theta", "rms_norm_eps", "vocab_size", "tie_word_embeddings", "mask_token_id"):
        assert cfg[key] == DREAM_CFG[key], key
    assert set(w) == set(dream_weights())
    ids = _ids()
    with torch.no_grad():
        got = adapter.logits(ids)
    raw = ref_qwen2(w, cfg, ids)  # Dream: row i predicts token i+1; maskrl re-aligns by one
    assert _maxdiff(got[:, 1:], raw[:, :-1]) < TOL
    back = load(out)
    assert (back.family, back.shift, back.mask_id) == ("dream", True, 60)
    with torch.no_grad():
        assert _maxdiff(back.logits(ids), got) < TOL


def test_plain_causal_load_of_a_tiny_export_fails_loudly(tmp_path):
    from transformers import AutoModelForCausalLM

    tiny = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32)
    folder = save_model(tiny, tmp_path / "tiny")
    with pytest.raises(ValueError, match="maskrl_tiny"):
        AutoModelForCausalLM.from_pretrained(folder)
    back = load(folder)  # maskrl's loader reads it
    ids = _ids(2, 8, vocab=90)
    with torch.no_grad():
        assert _maxdiff(back.logits(ids), tiny.logits(ids)) < TOL


def test_plain_causal_load_of_a_family_export_does_not_run_as_llama(tmp_path):
    from transformers import AutoModelForCausalLM

    adapter = load(write_folder(tmp_path / "src", LLADA_CFG, llada_weights()))
    folder = save_model(adapter, tmp_path / "model")
    with pytest.raises(ValueError, match="trust_remote_code"):  # LLaDA's own code is needed, never a causal Llama
        AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False)


def test_lora_export_is_merged_with_the_adapter_beside_it(tmp_path):
    tiny = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32)
    lora = apply_lora(tiny, rank=4)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # LoRA B starts at zero; move it so that merging changes the weights
        for name, p in lora.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    ids = _ids(2, 8, vocab=90)
    with torch.no_grad():
        want = lora.logits(ids)
        base = lora.model.get_base_model()
        before = {k: v.clone() for k, v in base.state_dict().items()}
    folder = save_model(lora, tmp_path / "model")
    assert (folder / "adapter" / "adapter_config.json").is_file()
    assert not (folder / "adapter_config.json").exists()
    back = load(folder)  # `maskrl eval --model run/model` reads it directly
    assert not hasattr(back.model, "peft_config")
    with torch.no_grad():
        assert _maxdiff(back.logits(ids), want) < 1e-4
        with lora.reference():  # adapters off: the base alone, which the export must not be
            assert _maxdiff(back.logits(ids), lora.logits(ids)) > 1e-3
    after = lora.model.get_base_model().state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the live model is not merged
