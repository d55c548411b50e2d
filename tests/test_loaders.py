"""Checkpoint loading (docs/spec.md §1.1): tiny folders in the published LLaDA / Dream layouts.

Each folder carries the published config.json keys and tensor names, random weights, saved as
two safetensors shards plus ``model.safetensors.index.json``. The loaded models are compared with
plain-PyTorch forwards written here from the architecture facts (float64), and each reference is
shown to be sensitive to the facts it encodes (gate/up order, no causal mask, RoPE θ, the shift).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from maskrl.models import build_char_tokenizer, build_tiny, load, save_model
from maskrl.models.adapter import bidirectional_mask

TOL = 1e-5

# --------------------------------------------------------------------------------------------------
# folder builders
# --------------------------------------------------------------------------------------------------
LLADA_CFG = {  # published GSAI-ML/LLaDA-8B-Instruct config.json keys, shrunk dimensions
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                 "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM", "AutoModel": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 32,
    "embedding_dropout": 0.0, "embedding_size": 64, "eos_token_id": 61, "flash_attention": False,
    "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
    "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
    "layer_norm_with_affine": True, "mask_token_id": 60, "max_sequence_length": 64, "mlp_hidden_size": 48,
    "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": 4, "n_kv_heads": 4,
    "n_layers": 2, "pad_token_id": 62, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 64, "weight_tying": False,
}
DREAM_CFG = {  # Qwen2-style keys of Dream-org/Dream-v0-Instruct-7B, shrunk dimensions
    "architectures": ["DreamModel"], "model_type": "Dream",
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "attention_dropout": 0.0, "bos_token_id": 61, "eos_token_id": 61, "pad_token_id": 61, "mask_token_id": 60,
    "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "max_window_layers": 28,
    "rms_norm_eps": 1e-6, "rope_scaling": {"type": "default"}, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": False, "use_sliding_window": False,
    "vocab_size": 64,
}


def _rand(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen) * scale


def llada_weights(cfg=LLADA_CFG, seed=0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, f, v, hd = cfg["d_model"], cfg["mlp_hidden_size"], cfg["embedding_size"], cfg["d_model"] // cfg["n_heads"]
    kv = cfg["n_kv_heads"] * hd
    w = {"model.transformer.wte.weight": _rand(g, v, d),
         "model.transformer.ln_f.weight": 1 + _rand(g, d, scale=0.1),
         "model.transformer.ff_out.weight": _rand(g, v, d, scale=d ** -0.5)}
    for i in range(cfg["n_layers"]):
        b = f"model.transformer.blocks.{i}."
        w |= {b + "q_proj.weight": _rand(g, d, d, scale=d ** -0.5), b + "k_proj.weight": _rand(g, kv, d, scale=d ** -0.5),
              b + "v_proj.weight": _rand(g, kv, d, scale=d ** -0.5), b + "attn_out.weight": _rand(g, d, d, scale=d ** -0.5),
              b + "ff_proj.weight": _rand(g, f, d, scale=d ** -0.5), b + "up_proj.weight": _rand(g, f, d, scale=d ** -0.5),
              b + "ff_out.weight": _rand(g, d, f, scale=f ** -0.5),
              b + "attn_norm.weight": 1 + _rand(g, d, scale=0.1), b + "ff_norm.weight": 1 + _rand(g, d, scale=0.1)}
    return w


def dream_weights(cfg=DREAM_CFG, seed=1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * d // cfg["num_attention_heads"]
    w = {"model.embed_tokens.weight": _rand(g, v, d), "model.norm.weight": 1 + _rand(g, d, scale=0.1),
         "lm_head.weight": _rand(g, v, d, scale=d ** -0.5)}
    for i in range(cfg["num_hidden_layers"]):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        w |= {a + "q_proj.weight": _rand(g, d, d, scale=d ** -0.5), a + "q_proj.bias": _rand(g, d, scale=0.5),
              a + "k_proj.weight": _rand(g, kv, d, scale=d ** -0.5), a + "k_proj.bias": _rand(g, kv, scale=0.5),
              a + "v_proj.weight": _rand(g, kv, d, scale=d ** -0.5), a + "v_proj.bias": _rand(g, kv, scale=0.5),
              a + "o_proj.weight": _rand(g, d, d, scale=d ** -0.5),
              m + "gate_proj.weight": _rand(g, f, d, scale=d ** -0.5), m + "up_proj.weight": _rand(g, f, d, scale=d ** -0.5),
              m + "down_proj.weight": _rand(g, d, f, scale=f ** -0.5),
              f"model.layers.{i}.input_layernorm.weight": 1 + _rand(g, d, scale=0.1),
              f"model.layers.{i}.post_attention_layernorm.weight": 1 + _rand(g, d, scale=0.1)}
    return w


def write_folder(path: Path, cfg: dict, weights: dict[str, torch.Tensor], shards: int = 2) -> Path:
    """config.json + weights as ``shards`` safetensors files with an index (1: a single model.safetensors)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    names = sorted(weights)
    if shards == 1:
        save_file({k: weights[k].contiguous() for k in names}, path / "model.safetensors")
        return path
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: weights[k].contiguous() for k in names[s::shards]}
        save_file(part, path / file, metadata={"format": "pt"})
        weight_map |= {k: file for k in part}
    total = sum(t.numel() * t.element_size() for t in weights.values())
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=2))
    return path


# --------------------------------------------------------------------------------------------------
# plain-PyTorch references (float64)
# --------------------------------------------------------------------------------------------------
def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, theta):
    """Rotate-half RoPE on ``[N, H, T, D]``: pairs (i, i + D/2), frequencies θ^(-2i/D)."""
    t, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)  # [T, D]
    x1, x2 = x[..., : dim // 2], x[..., dim // 2:]
    return x * ang.cos() + torch.cat([-x2, x1], dim=-1) * ang.sin()


def attend(q, k, v, causal=False):
    """Full (non-causal) attention; k/v heads are shared by groups of q heads (head h uses kv h // rep)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        t = s.shape[-1]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def heads(x, n):
    return x.unflatten(-1, (n, -1)).transpose(1, 2)  # [N, T, n*D] -> [N, n, T, D]


def ref_llada(w, cfg, ids, swap_gate_up=False, causal=False, theta=None):
    W = {k: t.double() for k, t in w.items()}
    eps, theta = cfg["rms_norm_eps"], theta or cfg["rope_theta"]
    x = W["model.transformer.wte.weight"][ids]
    for i in range(cfg["n_layers"]):
        b = f"model.transformer.blocks.{i}."
        h = rms(x, W[b + "attn_norm.weight"], eps)
        q, k, v = (heads(h @ W[b + n + ".weight"].T, cfg["n_heads"] if n == "q_proj" else cfg["n_kv_heads"])
                   for n in ("q_proj", "k_proj", "v_proj"))
        a = attend(rope(q, theta), rope(k, theta), v, causal).transpose(1, 2).flatten(2)
        x = x + a @ W[b + "attn_out.weight"].T
        h = rms(x, W[b + "ff_norm.weight"], eps)
        gate, up = h @ W[b + "ff_proj.weight"].T, h @ W[b + "up_proj.weight"].T
        if swap_gate_up:
            gate, up = up, gate
        x = x + (F.silu(gate) * up) @ W[b + "ff_out.weight"].T
    return rms(x, W["model.transformer.ln_f.weight"], eps) @ W["model.transformer.ff_out.weight"].T


def ref_qwen2(w, cfg, ids):
    """Raw (unshifted) logits of a Qwen2 / Dream stack: q/k/v biases, no o_proj bias, GQA."""
    W = {k: t.double() for k, t in w.items()}
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    x = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        h = rms(x, W[f"model.layers.{i}.input_layernorm.weight"], eps)
        q = heads(h @ W[a + "q_proj.weight"].T + W[a + "q_proj.bias"], cfg["num_attention_heads"])
        k = heads(h @ W[a + "k_proj.weight"].T + W[a + "k_proj.bias"], cfg["num_key_value_heads"])
        v = heads(h @ W[a + "v_proj.weight"].T + W[a + "v_proj.bias"], cfg["num_key_value_heads"])
        x = x + attend(rope(q, theta), rope(k, theta), v).transpose(1, 2).flatten(2) @ W[a + "o_proj.weight"].T
        h = rms(x, W[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
        x = x + (F.silu(h @ W[m + "gate_proj.weight"].T) * (h @ W[m + "up_proj.weight"].T)) @ W[m + "down_proj.weight"].T
    return rms(x, W["model.norm.weight"], eps) @ W["lm_head.weight"].T


def _ids(n=2, t=12, vocab=60, seed=3):
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


def _maxdiff(a, b):
    return (a.double() - b.double()).abs().max().item()


# --------------------------------------------------------------------------------------------------
# LLaDA
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llada_dir(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("llada"), LLADA_CFG, llada_weights())


def test_llada_loads_native_llama_and_matches_reference(llada_dir):
    from transformers import LlamaForCausalLM

    assert len(list(llada_dir.glob("model-*.safetensors"))) == 2
    adapter = load(llada_dir)
    assert isinstance(adapter.model, LlamaForCausalLM) and not adapter.model.training
    assert (adapter.family, adapter.shift, adapter.attention) == ("llada", False, "4d")
    assert (adapter.mask_id, adapter.eos_id, adapter.pad_id, adapter.stop_ids) == (60, 61, 62, (126348,))
    assert adapter.tokenizer is None  # folder with config.json + weights only
    cfg = adapter.model.config
    assert cfg.rope_parameters["rope_theta"] == 500000.0 and cfg.rms_norm_eps == 1e-5
    ids = _ids()
    with torch.no_grad():
        got = adapter.logits(ids)
    ref = ref_llada(llada_weights(), LLADA_CFG, ids)
    assert got.shape == (2, 12, 64) and got.dtype == torch.float32
    assert _maxdiff(got, ref) < TOL


def test_llada_reference_is_sensitive_to_the_facts(llada_dir):
    """The comparison above can fail: each wrong fact moves the logits far beyond the tolerance."""
    adapter = load(llada_dir)
    ids = _ids()
    with torch.no_grad():
        got = adapter.logits(ids)
    w = llada_weights()
    for wrong in (dict(swap_gate_up=True), dict(causal=True), dict(theta=10000.0)):
        assert _maxdiff(got, ref_llada(w, LLADA_CFG, ids, **wrong)) > 1e-3, wrong


def test_no_remote_code_is_executed(tmp_path):
    """auto_map points at modelling files; they exist here and would leave a trace if imported."""
    folder = write_folder(tmp_path / "m", LLADA_CFG, llada_weights())
    trace = tmp_path / "executed"
    for name in ("configuration_llada.py", "modeling_llada.py"):
        (folder / name).write_text(f"open({str(trace)!r}, 'w').write('x')\nraise RuntimeError('remote code ran')\n")
    load(folder)
    assert not trace.exists()


@pytest.mark.parametrize("change", ["extra", "missing", "renamed"])
def test_llada_mismatched_tensors_are_refused_by_name(tmp_path, change):
    w = llada_weights()
    if change == "extra":
        w["model.transformer.blocks.0.extra_proj.weight"] = torch.zeros(2, 2)
        needle = "unexpected tensors: model.transformer.blocks.0.extra_proj.weight"
    elif change == "missing":
        del w["model.transformer.blocks.1.up_proj.weight"]
        needle = "missing tensors: model.transformer.blocks.1.up_proj.weight"
    else:  # a block beyond n_layers is unexpected, and the real one missing
        w["model.transformer.blocks.2.q_proj.weight"] = w.pop("model.transformer.blocks.1.q_proj.weight")
        needle = ("missing tensors: model.transformer.blocks.1.q_proj.weight; "
                  "unexpected tensors: model.transformer.blocks.2.q_proj.weight")
    folder = write_folder(tmp_path / change, LLADA_CFG, w)
    with pytest.raises(ValueError) as err:
        load(folder)
    assert needle in str(err.value)


def test_llada_wrong_shape_is_refused(tmp_path):
    cfg = dict(LLADA_CFG, mlp_hidden_size=40)  # the weights have 48
    folder = write_folder(tmp_path / "m", cfg, llada_weights())
    with pytest.raises(ValueError, match=r"model\.transformer\.blocks\.0\.ff_proj\.weight \(48, 32\) \(expected \(40, 32\)\)"):
        load(folder)


@pytest.mark.parametrize("key,value", [("include_bias", True), ("block_type", "sequential"),
                                       ("attention_layer_norm", True), ("activation_type", "swiglu")])
def test_llada_unsupported_config_is_refused(tmp_path, key, value):
    folder = write_folder(tmp_path / "m", dict(LLADA_CFG, **{key: value}), llada_weights())
    with pytest.raises(NotImplementedError, match=key):
        load(folder)


def test_llada_bf16_load(llada_dir):
    adapter = load(llada_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in adapter.model.parameters()} == {torch.bfloat16}
    ids = _ids()
    with torch.no_grad():
        got = adapter.logits(ids)
    ref = ref_llada(llada_weights(), LLADA_CFG, ids)
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    assert _maxdiff(got, ref) < 0.05 * ref.abs().max().item()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_pad_eos_embedding_row_still_trains(tmp_path, family):
    """Llama/Qwen2 would build nn.Embedding(padding_idx=pad) and zero that row's gradient; LLaDA and
    Dream pad with their eos id, whose embedding must keep training."""
    cfg, w = (LLADA_CFG, llada_weights()) if family == "llada" else (DREAM_CFG, dream_weights())
    adapter = load(write_folder(tmp_path / family, cfg, w))
    embed = adapter.model.get_input_embeddings()
    assert embed.padding_idx is None
    ids = torch.tensor([[adapter.pad_id, 5, 7, adapter.eos_id]])
    adapter.logits(ids).square().mean().backward()
    assert embed.weight.grad[adapter.pad_id].abs().sum() > 0
    assert embed.weight.grad[adapter.eos_id].abs().sum() > 0


def test_ids_can_be_overridden_and_default_to_family(tmp_path):
    cfg = {k: v for k, v in LLADA_CFG.items() if k not in ("mask_token_id", "eos_token_id", "pad_token_id")}
    folder = write_folder(tmp_path / "m", cfg, llada_weights())
    adapter = load(folder)
    assert (adapter.mask_id, adapter.eos_id, adapter.pad_id) == (126336, 126081, 126081)
    adapter = load(folder, mask_id=5, eos_id=6, pad_id=7, stop_ids=[8])
    assert (adapter.mask_id, adapter.eos_id, adapter.pad_id, adapter.stop_ids) == (5, 6, 7, (8,))


# --------------------------------------------------------------------------------------------------
# Dream
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shards", [2, 1])
def test_dream_loads_native_qwen2_and_matches_shifted_reference(tmp_path, shards):
    from transformers import Qwen2ForCausalLM

    w = dream_weights()
    adapter = load(write_folder(tmp_path / "dream", DREAM_CFG, w, shards=shards))
    assert isinstance(adapter.model, Qwen2ForCausalLM)
    assert (adapter.family, adapter.shift, adapter.attention) == ("dream", True, "4d")
    assert (adapter.mask_id, adapter.eos_id, adapter.pad_id) == (60, 61, 61)
    assert adapter.model.config.rope_parameters == {"rope_type": "default", "rope_theta": 1000000.0}
    ids = _ids()
    raw_ref = ref_qwen2(w, DREAM_CFG, ids)  # [N, T, V], row i predicts token i+1
    with torch.no_grad():
        mask = bidirectional_mask(torch.ones_like(ids, dtype=torch.bool), torch.float32)
        raw = adapter.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        got = adapter.logits(ids)
    assert _maxdiff(raw, raw_ref) < TOL
    # the adapter's row i is the raw row i-1 (row 0 is a copy of raw row 0)
    assert _maxdiff(got[:, 1:], raw_ref[:, :-1]) < TOL
    assert _maxdiff(got[:, 0], raw_ref[:, 0]) < TOL
    # the wrong shifts fail: none, or one position the other way
    assert _maxdiff(got, raw_ref) > 1e-3
    assert _maxdiff(got[:, :-1], raw_ref[:, 1:]) > 1e-3


def test_dream_unsupported_rope_scaling_is_refused(tmp_path):
    cfg = dict(DREAM_CFG, rope_scaling={"type": "yarn", "factor": 4.0})
    with pytest.raises(NotImplementedError, match="rope_scaling"):
        load(write_folder(tmp_path / "m", cfg, dream_weights()))


def test_dream_missing_bias_is_refused(tmp_path):
    w = dream_weights()
    del w["model.layers.0.self_attn.k_proj.bias"]
    with pytest.raises(ValueError, match=r"missing tensors: model\.layers\.0\.self_attn\.k_proj\.bias"):
        load(write_folder(tmp_path / "m", DREAM_CFG, w))


def test_tokenizer_with_custom_class_loads_without_remote_code(tmp_path):
    folder = write_folder(tmp_path / "m", DREAM_CFG, dream_weights())
    build_char_tokenizer().save_pretrained(folder)
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    tok_cfg |= {"tokenizer_class": "DreamTokenizer",
                "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]}}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    adapter = load(folder)
    assert adapter.tokenizer is not None and adapter.tokenizer("ab").input_ids == build_char_tokenizer()("ab").input_ids
    assert load(folder, tokenizer=False).tokenizer is None


def test_dream_vocab_merges_tokenizer_falls_back_to_qwen2(tmp_path):
    """A DreamTokenizer folder with only vocab.json + merges.txt (no tokenizer.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    folder = write_folder(tmp_path / "m", DREAM_CFG, dream_weights())
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(["the cat sat on the mat"] * 5, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|mask|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.model.save(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "DreamTokenizer", "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>"}))
    tok = load(folder).tokenizer
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert tok.decode(tok("the cat").input_ids) == "the cat" and tok.mask_token_id == 1


# --------------------------------------------------------------------------------------------------
# tiny Llama (4-D mask), tiny folders, masked LMs, errors
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return build_tiny(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)


def test_tiny_llama_4d_mask_is_bidirectional(tiny):
    ids = _ids(1, 10, vocab=90)
    other = ids.clone()
    other[0, -1] = (other[0, -1] + 1) % 90
    with torch.no_grad():
        a, b = tiny.logits(ids), tiny.logits(other)
    assert _maxdiff(a[:, 0], b[:, 0]) > 1e-4  # position 0 sees the last token


@pytest.mark.parametrize("which", ["tiny", "dream"])
def test_left_padding_leaves_real_tokens_unchanged(tiny, tmp_path, which):
    adapter = tiny if which == "tiny" else load(write_folder(tmp_path / "d", DREAM_CFG, dream_weights()))
    ids = _ids(1, 9, vocab=60)
    k = 4
    padded = torch.cat([torch.full((1, k), adapter.pad_id), ids], dim=1)
    mask = torch.cat([torch.zeros(1, k, dtype=torch.bool), torch.ones(1, 9, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        plain = adapter.logits(ids)
        pad = adapter.logits(padded, mask)
        unmasked = adapter.logits(padded)  # padding visible: must differ, or the check is vacuous
    # Shifted (Dream) models predict the first real token from the raw row before it, which is a pad
    # row here and a copy of raw row 0 without padding: that one position is convention, not signal.
    s = 1 if adapter.shift else 0
    assert _maxdiff(pad[:, k + s:], plain[:, s:]) < TOL
    assert _maxdiff(unmasked[:, k + s:], plain[:, s:]) > 1e-4


def test_tiny_folder_roundtrip(tiny, tmp_path):
    folder = save_model(tiny, tmp_path / "tiny")
    adapter = load(folder)
    assert adapter.family == "tiny" and adapter.tokenizer is not None
    assert (adapter.mask_id, adapter.eos_id, adapter.pad_id) == (tiny.mask_id, tiny.eos_id, tiny.pad_id)
    ids = _ids(2, 8, vocab=90)
    with torch.no_grad():
        assert _maxdiff(adapter.logits(ids), tiny.logits(ids)) < TOL


def test_masked_lm_loads_with_2d_attention(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=48, max_position_embeddings=32, pad_token_id=0, mask_token_id=3, sep_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BertForMaskedLM(config).eval()
    model.save_pretrained(tmp_path / "bert", max_shard_size="30KB")
    assert (tmp_path / "bert" / "model.safetensors.index.json").is_file()
    adapter = load(tmp_path / "bert")
    assert (adapter.family, adapter.attention, adapter.shift) == ("masked_lm", "2d", False)
    assert (adapter.mask_id, adapter.eos_id, adapter.pad_id) == (3, 2, 0)
    ids = _ids(2, 8, vocab=64)
    with torch.no_grad():
        assert _maxdiff(adapter.logits(ids), model(input_ids=ids).logits) < TOL


def test_unknown_family_and_missing_files_are_refused(tmp_path):
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        load(tmp_path / "gpt")
    with pytest.raises(FileNotFoundError, match="no model folder"):
        load(tmp_path / "nowhere")
    folder = write_folder(tmp_path / "noweights", LLADA_CFG, llada_weights())
    for f in folder.glob("*.safetensors*"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load(folder)
    folder = write_folder(tmp_path / "noshard", LLADA_CFG, llada_weights())
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        load(folder)


def test_hub_failure_gives_a_clear_error(monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(OSError, match=r"'GSAI-ML/LLaDA-8B-Instruct' is not a local folder.*no network.*--local-dir"):
        load("GSAI-ML/LLaDA-8B-Instruct")



@pytest.mark.parametrize("arg", ["runs/does-not-exist", "./model", "~/no/such/model", "a/b/c", "..\\x"])
def test_path_like_model_args_never_reach_the_hub(arg, tmp_path, monkeypatch):
    """Issue 20 item 3: a mistyped local path (its first folder exists, or it is written like a
    path) is one clear FileNotFoundError, never a Hub download."""
    import huggingface_hub

    def hub(*a, **k):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no model folder at .*nearest existing folder"):
        load(arg)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file"):
        load("afile")


def test_hub_failure_is_one_line(monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise OSError("line one\nline two\nline three")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(OSError) as info:
        load("owner/name")
    assert "\n" not in str(info.value) and "line one" in str(info.value) and info.value.__cause__ is None


def test_unavailable_devices_are_one_clear_error():
    from maskrl.pipeline import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="'cuda:x' is not a device string"):
        resolve_device("cuda:x")
    with pytest.raises(ValueError, match="'gpu' is not a device string"):
        resolve_device("gpu")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=rf"'cuda:{n}' is not available here \({n} CUDA"):
        resolve_device(f"cuda:{n}")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="'mps' is not available here"):
            resolve_device("mps")


# --------------------------------------------------------------------------------------------------
# tied output layers (issue 13 item 7)
# --------------------------------------------------------------------------------------------------
def _tied_reference_logits(adapter, emb):
    """Logits recomputed with the output layer replaced by the embedding (h @ E^T)."""
    ids = _ids()
    model = adapter.model
    with torch.no_grad():
        mask = bidirectional_mask(torch.ones_like(ids, dtype=torch.bool), torch.float32)
        hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        raw = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return raw, hidden @ emb.T


@pytest.mark.parametrize("with_head", [False, True])
def test_dream_tied_checkpoint_loads_tied(tmp_path, with_head):
    w = dream_weights()
    if not with_head:
        del w["lm_head.weight"]  # small Qwen2 conversions store no output layer
    adapter = load(write_folder(tmp_path / "dream", dict(DREAM_CFG, tie_word_embeddings=True), w))
    m = adapter.model
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert torch.equal(m.lm_head.weight, w["model.embed_tokens.weight"])
    raw, ref = _tied_reference_logits(adapter, w["model.embed_tokens.weight"])
    assert _maxdiff(raw, ref) < TOL


def test_llada_weight_tying_loads_tied(tmp_path):
    w = llada_weights()
    del w["model.transformer.ff_out.weight"]
    adapter = load(write_folder(tmp_path / "llada", dict(LLADA_CFG, weight_tying=True), w))
    m = adapter.model
    assert m.lm_head.weight is m.model.embed_tokens.weight
    raw, ref = _tied_reference_logits(adapter, w["model.transformer.wte.weight"])
    assert _maxdiff(raw, ref) < TOL


def test_untied_checkpoint_without_head_is_still_refused(tmp_path):
    w = dream_weights()
    del w["lm_head.weight"]
    with pytest.raises(ValueError, match="missing tensors: lm_head.weight"):
        load(write_folder(tmp_path / "dream", DREAM_CFG, w))


def test_tied_tiny_and_masked_lm_folders_load_tied(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    tiny = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32)
    tiny.model.config.tie_word_embeddings = True
    tiny.model.tie_weights()
    save_model(tiny, tmp_path / "tiny")
    a = load(tmp_path / "tiny")
    assert a.model.lm_head.weight is a.model.model.embed_tokens.weight
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=48, max_position_embeddings=32, pad_token_id=0, mask_token_id=3,
                        sep_token_id=2, tie_word_embeddings=True)
    BertForMaskedLM(config).save_pretrained(tmp_path / "bert")
    b = load(tmp_path / "bert")
    assert b.model.get_output_embeddings().weight is b.model.get_input_embeddings().weight


def test_cli_mistyped_model_path_and_device_are_one_line(tmp_path, monkeypatch, capsys):
    from maskrl.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert main(["eval", "--model", "runs/does-not-exist", "--task", "sudoku4x4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no model folder at 'runs/does-not-exist'" in err[0]
    if not torch.cuda.is_available():
        assert main(["generate", "--model", "runs", "--device", "cuda", "--prompt", "x"]) == 2
        assert "device 'cuda' is not available here" in capsys.readouterr().err


def test_every_end_id_of_the_checkpoint_stops_a_completion(tmp_path):
    """Issue 20 item 3: ``eos_token_id: [eos, end_of_turn]`` (and generation_config.json's list) all
    end a completion: adapter ids, ``completion_mask`` and the sampler's rollout mask."""
    from maskrl.sampling import SamplerConfig, generate

    folder = write_folder(tmp_path / "m", {**LLADA_CFG, "eos_token_id": [61, 59]}, llada_weights())
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [61, 59, 58]}))
    adapter = load(folder, tokenizer=False)
    assert adapter.eos_id == 61 and adapter.stop_ids == (126348, 59, 58)
    ids = torch.tensor([[1, 2, 59, 3, 4], [1, 58, 2, 61, 3], [1, 2, 3, 4, 5]])
    assert adapter.completion_mask(ids).tolist() == [[True, True, True, False, False],
                                                     [True, True, False, False, False], [True] * 5]
    # the sampler: a model that always prefers id 59 writes it first; the completion ends there
    hook = adapter.model.lm_head.register_forward_hook(lambda m, a, out: out + 100.0 * F.one_hot(
        torch.tensor(59), out.shape[-1]).to(out.dtype))
    try:
        ro = generate(adapter, torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long),
                      SamplerConfig(gen_length=4, block_length=4, steps=4))
    finally:
        hook.remove()
    assert ro.completion_ids.tolist() == [[59, 59, 59, 59]]
    assert ro.completion_mask.tolist() == [[True, False, False, False]]
    # a single id keeps working, and the family's end-of-turn id stays a stop id
    single = load(write_folder(tmp_path / "s", LLADA_CFG, llada_weights()), tokenizer=False)
    assert (single.eos_id, single.stop_ids) == (61, (126348,))
