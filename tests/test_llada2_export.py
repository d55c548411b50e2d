"""Exports of a trained LLaDA2.x policy in the family's own layout (issue 52 item 6): the family's own
``LLaDA2MoeModelLM`` reads them (its logits, recorded by ``benchmarks/references/llada2_export_reference.py``
from ZHZisZZ/dllm ca17675's copy of inclusionAI's code, equal the live policy's), every source ``config.json``
key is kept, the tensors carry the family's per-expert names, :func:`maskrl.models.load` reads them back bit
for bit, and ``maskrl eval`` / the lm-eval model decode them the block way with LLaDA2's threshold rule."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import benchmark_script
from maskrl.models import load, save_model
from test_export import read_family_folder

DATA = Path(__file__).resolve().parent / "data" / "llada2_tiny"
#: a git directory of ZHZisZZ/dllm holding the recorder's commit, where one is at hand
DLLM = Path(os.environ.get("MASKRL_DLLM_GIT", "/work/.mirror/ZHZisZZ+dllm/repo"))
KINDS = ("full", "lora")


def _recorder():
    return benchmark_script("references/llada2_export_reference.py")


def _tol(reference: torch.Tensor, steps: int = 64) -> float:
    """float32 logits after two layers and a LoRA merge: 64 float32 steps of the largest |logit|."""
    return steps * torch.finfo(torch.float32).eps * float(reference.abs().max())


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """``{kind: (live adapter, export folder)}`` for full fine-tuning and LoRA (merged in float32)."""
    tmp = tmp_path_factory.mktemp("llada2_export")
    return {kind: (a, save_model(a, tmp / kind)) for kind, a in _recorder().trained_policies().items()}


@pytest.mark.numerics
@pytest.mark.parametrize("kind", KINDS)
def test_the_familys_own_code_reads_the_export_with_the_live_logits(exports, kind):
    adapter, folder = exports[kind]
    ref = load_file(DATA / "export_reference.safetensors")[kind]
    ids = load_file(DATA / "reference.safetensors")["input_ids"]
    with torch.no_grad():
        live = adapter.logits(ids)
    assert (live - ref).abs().max() <= _tol(ref)
    untrained = load_file(DATA / "reference.safetensors")["logits"]
    assert (ref - untrained).abs().max() > 1000 * _tol(ref)  # training moved them: the test can fail


@pytest.mark.parametrize("kind", KINDS)
def test_config_keys_kept_and_tensors_named_as_the_family_reads_them(exports, kind):
    adapter, folder = exports[kind]
    src = json.loads((DATA / "config.json").read_text())
    cfg, w = read_family_folder(folder)
    kept = {k: v for k, v in src.items() if k not in ("torch_dtype", "auto_map")}
    assert {k: cfg.get(k) for k in kept} == kept
    # auto_map: the same keys and classes, in the family's repository on the Hub (the export holds no code)
    assert cfg["auto_map"] == {k: f"inclusionAI/LLaDA2.0-mini--{v}" for k, v in src["auto_map"].items()}
    assert cfg["torch_dtype"] == "float32" and cfg["block_size"] == 4 and "maskrl_family" not in cfg
    assert (cfg["model_type"], cfg["architectures"], cfg["mask_token_id"]) == ("llada2_moe", ["LLaDA2MoeModelLM"], 95)
    assert set(w) == set(load_file(DATA / "model.safetensors"))  # per-expert names, the expert bias, no LoRA
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in w and "model.layers.1.mlp.gate.expert_bias" in w
    if kind == "lora":
        assert cfg["maskrl_lora"]["update_rel_error"] < 1e-4 and (folder / "adapter" / "adapter_config.json").is_file()


@pytest.mark.parametrize("kind", KINDS)
def test_load_reads_the_export_back_bit_for_bit(exports, kind):
    adapter, folder = exports[kind]
    back = load(folder)
    _, w = read_family_folder(folder)
    state = back.model.state_dict()
    assert all(torch.equal(state[k], w[k]) for k in w)
    assert (back.family, back.block_size, back.mask_id, back.eos_id, back.pad_id) == ("llada2", 4, 95, 93, 93)
    ids = load_file(DATA / "reference.safetensors")["input_ids"]
    if kind == "full":
        with torch.no_grad():
            assert torch.equal(back.logits(ids), adapter.logits(ids))
        assert all(torch.equal(state[k], t) for k, t in adapter.model.state_dict().items())


@pytest.mark.numerics
@pytest.mark.skipif(not DLLM.is_dir(), reason="no ZHZisZZ/dllm checkout here: the recorded logits stand in")
def test_the_familys_own_code_run_here_on_a_fresh_export(exports):
    """Where the family's code is at hand, run it on this run's exports (not only on the recording's)."""
    import subprocess
    import sys

    code = (f"import sys, torch; sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / 'benchmarks' / 'references')!r})\n"
            "from pathlib import Path; from safetensors.torch import load_file, save_file\n"
            "from llada2_reference import import_their_code; from llada2_export_reference import family_logits\n"
            f"c, m = import_their_code(Path({str(DLLM)!r}))\n"
            f"ids = load_file({str(DATA / 'reference.safetensors')!r})['input_ids']\n"
            f"out = {{k: family_logits(Path(f), c, m, ids).contiguous() for k, f in {({k: str(f) for k, (_, f) in exports.items()})!r}.items()}}\n"
            f"save_file(out, {str(next(iter(exports.values()))[1].parent / 'theirs.safetensors')!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)  # their stubs stay in that process
    theirs = load_file(next(iter(exports.values()))[1].parent / "theirs.safetensors")
    ids = load_file(DATA / "reference.safetensors")["input_ids"]
    for kind, (adapter, _) in exports.items():
        with torch.no_grad():
            assert (adapter.logits(ids) - theirs[kind]).abs().max() <= _tol(theirs[kind])


def _tiny_llada2_with_tokenizer(seed: int = 0, max_positions: int = 512):
    """A tiny LLaDA2 built without a source config (the export's defaults fill the family's keys), on the
    character tokenizer, at the family's default block 32."""
    from maskrl.models import ModelAdapter
    from maskrl.models.llada2_moe import LLaDA2MoeConfig, LLaDA2MoeModelLM
    from maskrl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    cfg = LLaDA2MoeConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4, n_group=2,
                          topk_group=1, num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=16,
                          first_k_dense_replace=1, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                          max_position_embeddings=max_positions)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LLaDA2MoeModelLM(cfg).eval()
    return ModelAdapter(model=model, mask_id=tok.mask_token_id, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                        family="llada2", tokenizer=tok, block_size=32)


def test_maskrl_eval_and_lm_eval_decode_the_export_the_block_way(tmp_path):
    from maskrl.cli import main
    from maskrl.lm_eval_model import MaskrlLM
    from maskrl.models.families.llada2 import LLADA2_EXPORT_DEFAULTS

    folder = save_model(_tiny_llada2_with_tokenizer(), tmp_path / "export")
    cfg = json.loads((folder / "config.json").read_text())
    assert {k: cfg[k] for k in LLADA2_EXPORT_DEFAULTS} == LLADA2_EXPORT_DEFAULTS and "block_size" not in cfg
    assert (folder / "tokenizer.json").is_file() and load(folder).block_size == 32
    rule = {"block_length": 32, "steps": 32, "remasking": "low_confidence_dynamic", "threshold": 0.95,
            "cache": "block", "early_stop": True}
    assert main(["eval", "--model", str(folder), "--task", "countdown", "--gen-length", "32", "--limit", "2",
                 "--out", str(tmp_path / "eval")]) == 0
    (r,) = json.loads((tmp_path / "eval" / "summary.json").read_text())["results"]
    assert {k: r["sampler"][k] for k in rule} == rule
    lm = MaskrlLM(pretrained=str(folder), gen_length=32)
    assert {k: getattr(lm.sampler, k) for k in rule} == rule


def test_a_bf16_lora_export_reloads_in_bf16_bit_for_bit_expert_bias_included(tmp_path):
    """The LoRA export is written in float32 (merged); reloaded in bf16 every tensor -- the base, the float32
    adapter and the router's ``expert_bias`` buffer, which the family keeps in the model's dtype -- has the live
    policy's dtype and bits (the rehearsal records' fault: the buffer came back float32)."""
    from maskrl.models import apply_lora

    live = apply_lora(load(DATA, dtype=torch.bfloat16), rank=2)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in live.model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randint(-20, 21, p.shape, generator=g).to(p.dtype) * 1e-3)
    back = load(save_model(live, tmp_path / "lora"), dtype=torch.bfloat16)
    ours, theirs = live.model.state_dict(), back.model.state_dict()
    assert ours.keys() == theirs.keys() and "base_model.model.model.layers.1.mlp.gate.expert_bias" in ours
    assert ours["base_model.model.model.layers.1.mlp.gate.expert_bias"].dtype == torch.bfloat16
    assert [k for k in ours if ours[k].dtype != theirs[k].dtype or not torch.equal(ours[k], theirs[k])] == []


def test_the_published_checkpoint_stores_every_tensor_expert_bias_included_in_bf16():
    """LLaDA2.0-mini's ``model.safetensors.index.json`` (yjyddq/DARE 83ae8a3, ``models/LLaDA2.0-mini/``) gives
    ``total_size`` 32,511,286,784 bytes: 2 bytes for each of the 16,255,638,528 parameters and each of the
    19 × 256 ``expert_bias`` entries (a float32 bias would add 9,728 bytes). So the bias is bf16 on disk, as
    the family's code holds it (a buffer cast with the model) and as :func:`maskrl.models.load` does."""
    from maskrl.models.llada2_moe import LLaDA2MoeConfig, parameter_counts

    mini = LLaDA2MoeConfig(vocab_size=157184, hidden_size=2048, intermediate_size=5120, num_hidden_layers=20,
                           num_attention_heads=16, num_key_value_heads=4, head_dim=128, use_bias=False,
                           num_experts=256, num_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=512,
                           first_k_dense_replace=1)
    bias = (mini.num_hidden_layers - mini.first_k_dense_replace) * mini.num_experts
    assert 2 * (parameter_counts(mini)["total"] + bias) == 32_511_286_784
    assert 2 * parameter_counts(mini)["total"] + 4 * bias != 32_511_286_784
