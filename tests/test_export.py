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


# ---------------------------------------------------------------- LoRA on a bf16 base: the export is the trained model
def _bf16_base(family: str, tmp_path):
    """The three layouts maskrl exports, each loaded with a bf16 base as the 7-8B recipes do."""
    if family == "tiny":
        a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1)
        for p in a.model.parameters():  # as load(dtype=bf16) does: parameters only, RoPE buffers float32
            p.data = p.data.to(torch.bfloat16)
        return a
    cfg, weights = (LLADA_CFG, llada_weights()) if family == "llada" else (DREAM_CFG, dream_weights())
    return load(write_folder(tmp_path / "src", cfg, weights), dtype=torch.bfloat16)


def _lora_layers(peft_model):
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in peft_model.get_base_model().named_modules() if isinstance(m, LoraLayer)]


def _small_update(lora, rel: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Set every LoRA B so that ΔW = (α/r) B A has rms ``rel`` × rms(W) (a trained update at a small lr:
    for rel 5e-4 below half a bf16 step, 2^-9..2^-8 of |W|, for most entries); returns
    ``{native weight name: ΔW}`` in float64, computed here as (α/r) B A."""
    g = torch.Generator().manual_seed(seed)
    deltas = {}
    with torch.no_grad():
        for name, layer in _lora_layers(lora.model):
            A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
            scale = layer.scaling["default"]
            B.copy_(torch.randn(B.shape, generator=g))
            w = layer.get_base_layer().weight.double()
            d = scale * B.double() @ A.double()
            B.mul_(rel * w.pow(2).mean().sqrt().item() / d.pow(2).mean().sqrt().item())
            deltas[f"{name}.weight"] = scale * B.double() @ A.double()
    return deltas


def _checkpoint_name(family: str, native: str) -> str:
    from maskrl.models.loading import llada_to_checkpoint

    return llada_to_checkpoint(native) if family == "llada" else native


def _float32_policy(lora):
    """The live policy computed in float32: the same (bf16-valued) base weights and adapter, without
    rounding activations to bf16 -- what a float32 export must reproduce to float32 precision."""
    import copy
    import dataclasses

    return dataclasses.replace(lora, model=copy.deepcopy(lora.model).float().eval())


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["tiny", "llada", "dream"])
def test_lora_export_on_a_bf16_base_carries_the_update(tmp_path, family):
    lora = apply_lora(_bf16_base(family, tmp_path), rank=8, alpha=16)
    deltas = _small_update(lora, rel=5e-4)
    base = {f"{n}.weight": layer.get_base_layer().weight.detach().clone() for n, layer in _lora_layers(lora.model)}
    assert {t.dtype for t in base.values()} == {torch.bfloat16}
    # the shape of the fault: merging this update into bf16 weights leaves most entries at the base
    rounded = {k: (base[k].double() + deltas[k]).to(torch.bfloat16) for k in base}
    lost = sum(int((rounded[k] == base[k]).sum()) for k in base) / sum(t.numel() for t in base.values())
    assert lost > 0.5

    folder = save_model(lora, tmp_path / "model")
    cfg, w = read_family_folder(folder)
    # the exported weights hold ΔW (relative error of the exported update, over all adapted weights)
    exported = {k: w[_checkpoint_name(family, k)] for k in base}
    assert {t.dtype for t in exported.values()} == {torch.float32}
    err = sum(float(((exported[k].double() - base[k].double()) - deltas[k]).pow(2).sum()) for k in base) ** 0.5
    norm = sum(float(d.pow(2).sum()) for d in deltas.values()) ** 0.5
    assert err / norm < 1e-3
    equal = sum(int((exported[k].double() == base[k].double()).sum()) for k in base) / sum(t.numel() for t in base.values())
    assert equal < 0.01
    facts = cfg["maskrl_lora"]  # what save_model measured and recorded agrees
    assert (facts["base_dtype"], facts["merged_dtype"], facts["adapter"]) == ("bfloat16", "float32", "adapter")
    assert facts["update_rel_error"] == pytest.approx(err / norm, rel=0.05, abs=1e-7)
    assert facts["equal_to_base"] == pytest.approx(equal, abs=1e-6)

    # the logits of the exported folder -- read by a from-scratch reader of the family's layout, or
    # by maskrl's loader in float32 -- are the live policy's (float32 compute) to float32 precision
    ids = _ids(2, 12, vocab=60)
    live32 = _float32_policy(lora)
    with torch.no_grad():
        want = live32.logits(ids)
        with live32.reference() as ref:
            moved = (want - ref.logits(ids)).double().norm().item()  # what training changed
        if family == "llada":
            got = ref_llada(w, cfg, ids)
        elif family == "dream":
            got = torch.cat([ref_qwen2(w, cfg, ids)[:, :1], ref_qwen2(w, cfg, ids)[:, :-1]], dim=1)
        else:
            got = load(folder).logits(ids)
        assert _maxdiff(got, want) < TOL
        assert (got.double() - want.double()).norm().item() < 0.05 * moved
        back = load(folder)  # float32: the merged weights
        assert not hasattr(back.model, "peft_config")
        assert (back.logits(ids).double() - want.double()).norm().item() < 0.05 * moved


@pytest.mark.parametrize("family", ["tiny", "llada", "dream"])
def test_lora_export_loaded_in_bf16_is_base_plus_adapter(tmp_path, family):
    """``load(export, dtype=bf16)`` (``maskrl eval --dtype bfloat16``, the lm-eval model) rebuilds the
    training policy: the same bf16 base bit for bit plus the float32 adapter, the same logits."""
    lora = apply_lora(_bf16_base(family, tmp_path), rank=8, alpha=16)
    _small_update(lora, rel=5e-4)
    folder = save_model(lora, tmp_path / "model")
    back = load(folder, dtype=torch.bfloat16)
    assert hasattr(back.model, "peft_config") and back.family == lora.family and back.shift == lora.shift
    live = dict(lora.model.named_parameters())
    got = dict(back.model.named_parameters())
    assert set(got) == set(live)
    for name, p in live.items():  # base bf16, adapter float32, values equal
        assert got[name].dtype == p.dtype and torch.equal(got[name], p), name
    ids = _ids(2, 12, vocab=60)
    with torch.no_grad():
        assert _maxdiff(back.logits(ids), lora.logits(ids)) == 0
        with back.reference() as b, lora.reference() as a:  # and its reference is the base
            assert _maxdiff(b.logits(ids), a.logits(ids)) == 0


def test_lossy_merge_dtype_is_refused_and_a_holding_one_is_written(tmp_path):
    from maskrl.models.export import LossyMergeError

    lora = apply_lora(_bf16_base("tiny", tmp_path), rank=8, alpha=16)
    _small_update(lora, rel=5e-4)
    with pytest.raises(LossyMergeError, match=r"bfloat16.*equal the base.*relative error.*merged_dtype=float32"):
        save_model(lora, tmp_path / "lossy", merged_dtype="bfloat16")
    assert not (tmp_path / "lossy" / "model.safetensors").exists()  # nothing lossy was written
    _small_update(lora, rel=0.5)  # an update bf16 can hold (to ~1 %)
    folder = save_model(lora, tmp_path / "held", merged_dtype="bfloat16", max_update_error=0.02)
    cfg, w = read_family_folder(folder)
    assert cfg["maskrl_lora"]["merged_dtype"] == "bfloat16" and cfg["maskrl_lora"]["update_rel_error"] < 0.02
    assert {t.dtype for t in w.values()} == {torch.bfloat16}
    assert not hasattr(load(folder, dtype=torch.bfloat16).model, "peft_config")  # merged weights, as written


def test_a_lora_run_is_evaluated_as_base_plus_adapter_on_every_path(tmp_path):
    """bf16 base, LoRA r 8 at lr 3e-6 (the 7-8B recipes' setting), RL steps: the trainer's periodic
    evaluation (the live policy), the exported folder loaded as ``maskrl eval --dtype bfloat16`` loads
    it, and the same folder in float32 all evaluate the trained policy."""
    from conftest import OddChars, TINY_MODEL, small_cfg

    from maskrl.evaluate import evaluate_examples
    from maskrl.pipeline import load_policy, training_eval_fn
    from maskrl.sampling import SamplerConfig
    from maskrl.trainer import RLTrainer
    from maskrl.tasks.base import Example

    over = dict(s.split("=") for s in TINY_MODEL)
    cfg = small_cfg(tmp_path, **over, **{"model.dtype": "bfloat16", "model.lora_rank": 8, "model.lora_alpha": 16,
                                         "train.lr": 3e-6, "train.inner_iterations": 1})
    policy = load_policy(cfg)
    rows = [Example(id=i, prompt=f"say a {i}") for i in range(6)]
    seen = []
    eval_fn = training_eval_fn(cfg, OddChars(), rows[:3], lambda s: s, lambda: seen.append(trainer.policy_eval) or seen[-1])
    trainer = RLTrainer(cfg, policy, OddChars(), rows, eval_fn=eval_fn)
    for _ in range(3):
        trainer.step()
    live = trainer.policy_eval
    b_norm = sum(float(p.detach().double().norm()) for n, p in live.model.named_parameters() if "lora_B" in n)
    assert b_norm > 0  # training moved the adapter
    folder = save_model(live, tmp_path / "model")
    back = load(folder, dtype=torch.bfloat16)
    back32 = load(folder)
    eval_fn(3)
    assert seen and seen[-1].model is live.model  # the periodic evaluation runs the live base + adapter
    ids = _ids(2, 12, vocab=60)
    live32 = _float32_policy(live)
    with torch.no_grad():
        assert _maxdiff(back.logits(ids), live.logits(ids)) == 0
        want = live32.logits(ids)
        with live32.reference() as ref:
            moved = (want - ref.logits(ids)).double().norm().item()
        assert moved > 0
        assert (back32.logits(ids).double() - want.double()).norm().item() < 0.05 * moved
    sampler = SamplerConfig(gen_length=8, block_length=4, steps=4)
    got, want = (evaluate_examples(a, OddChars(), rows, sampler).completions for a in (back, live))
    assert got == want
