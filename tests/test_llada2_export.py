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
    assert {k: cfg.get(k) for k in src if k != "torch_dtype"} == {k: v for k, v in src.items() if k != "torch_dtype"}
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


def _tiny_llada2_with_tokenizer(seed: int = 0):
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
                          max_position_embeddings=512)
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
