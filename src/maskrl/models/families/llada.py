"""LLaDA (``model_type: "llada"``, e.g. ``GSAI-ML/LLaDA-8B-Instruct``; remote class ``LLaDAModelLM``):
loaded into :class:`~transformers.LlamaForCausalLM`, full bidirectional attention, no logit shift (docs/spec.md §1.1).

OLMo-style config keys are converted to a :class:`~transformers.LlamaConfig` and the weights are
renamed into :class:`~transformers.LlamaForCausalLM`, which the adapter runs with an all-attend 4-D
mask (no causal mask) and no logit shift. Facts relied on (published ``config.json`` and
``modeling_llada.py`` of LLaDA-8B-Instruct, read from public mirrors):

* config keys ``d_model`` 4096, ``n_heads`` 32, ``n_kv_heads`` 32, ``n_layers`` 32,
  ``mlp_hidden_size`` 12288, ``vocab_size`` = ``embedding_size`` 126464, ``rope_theta`` 500000,
  ``rms_norm_eps`` 1e-5, ``max_sequence_length`` 4096, ``activation_type: "silu"``,
  ``block_type: "llama"``, ``layer_norm_type: "rms"``, ``weight_tying: false``,
  ``include_bias: false``, ``include_qkv_bias: false``, ``attention_layer_norm: false``,
  ``alibi: false``, ``rope: true``, ``input_emb_norm: false``, ``scale_logits: false``,
  ``mask_token_id`` 126336, ``eos_token_id`` = ``pad_token_id`` 126081;
* the Llama block computes ``ff_out(act(ff_proj(x)) * up_proj(x))``: **ff_proj is the gate**
  (SiLU applied), ``up_proj`` the up projection, the block's ``ff_out`` the down projection;
* RMSNorm ``w * x / sqrt(mean(x²) + eps)`` (no bias), RoPE with the rotate-half convention
  (``cat(-x2, x1)`` over the two halves of the head dim, frequencies ``θ^(-2i/d)`` duplicated),
  computed in float32 (``rope_full_precision``), attention scale ``1/sqrt(head_dim)``;
* the model-level ``model.transformer.ff_out`` is the (untied) output projection.

Weight names::

    model.transformer.wte.weight                    -> model.embed_tokens.weight
    model.transformer.blocks.{i}.q_proj.weight      -> model.layers.{i}.self_attn.q_proj.weight
    model.transformer.blocks.{i}.k_proj.weight      -> model.layers.{i}.self_attn.k_proj.weight
    model.transformer.blocks.{i}.v_proj.weight      -> model.layers.{i}.self_attn.v_proj.weight
    model.transformer.blocks.{i}.attn_out.weight    -> model.layers.{i}.self_attn.o_proj.weight
    model.transformer.blocks.{i}.ff_proj.weight     -> model.layers.{i}.mlp.gate_proj.weight
    model.transformer.blocks.{i}.up_proj.weight     -> model.layers.{i}.mlp.up_proj.weight
    model.transformer.blocks.{i}.ff_out.weight      -> model.layers.{i}.mlp.down_proj.weight
    model.transformer.blocks.{i}.attn_norm.weight   -> model.layers.{i}.input_layernorm.weight
    model.transformer.blocks.{i}.ff_norm.weight     -> model.layers.{i}.post_attention_layernorm.weight
    model.transformer.ln_f.weight                   -> model.norm.weight
    model.transformer.ff_out.weight                 -> lm_head.weight

Refused (``NotImplementedError`` naming the key): any config value above that the Llama class
cannot express (biases, QK-norm, ALiBi, non-SiLU / non-Llama blocks, ...). ``weight_tying: true``
becomes ``tie_word_embeddings=True``: the output layer is the embedding and no ``ff_out`` is read.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from maskrl.models.families.base import FAMILIES
from maskrl.models.families.native import NativeFamily, check, is_tied, rope_theta
from maskrl.models.names import llada_to_checkpoint, llada_to_native


if TYPE_CHECKING:
    from maskrl.models.adapter import ModelAdapter


@FAMILIES.register("llada")
class LLaDA(NativeFamily):
    """LLaDA: OLMo-style config and tensor names, Llama blocks; mask 126336, eos/pad 126081, end of turn 126348."""

    name = "llada"
    display_name = "LLaDA"
    model_types = ("llada",)
    architectures = ("LLaDAModelLM",)
    model_class = "LlamaForCausalLM"
    mask_id, eos_id, stop_ids = 126336, 126081, (126348,)
    code_repo = "GSAI-ML/LLaDA-8B-Instruct"

    def native_config(self, cfg: dict):
        return llada_config(cfg)

    def to_native(self, name: str) -> str | None:
        return llada_to_native(name)

    def to_checkpoint(self, native: str) -> str:
        return llada_to_checkpoint(native)

    def export_config(self, model, adapter) -> dict:
        return llada_export_config(model, adapter)


def llada_config(cfg: dict):
    """:class:`~transformers.LlamaConfig` equivalent to a LLaDA (OLMo-style) ``config.json`` dict.

    Raises:
        NotImplementedError: a setting the Llama class cannot express, naming the key and value.
        ValueError: a required key (``d_model``, ``n_heads``, ``n_layers``, vocabulary size) is absent.
    """
    from transformers import LlamaConfig

    expected = {"block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms", "rope": True,
                "alibi": False, "include_bias": False, "include_qkv_bias": False,
                "attention_layer_norm": False, "input_emb_norm": False, "scale_logits": False,
                "bias_for_layer_norm": False, "layer_norm_with_affine": True, "clip_qkv": None,
                "multi_query_attention": None}
    off = (False, None)  # a missing key, null and false all mean "feature off"
    bad = [f"{k}={cfg[k]!r} (supported: {v!r})" for k, v in expected.items()
           if k in cfg and cfg[k] != v and not (v in off and cfg[k] in off)]
    if bad:
        raise NotImplementedError("LLaDA config not expressible as a Llama model: " + ", ".join(bad))
    for key in ("d_model", "n_heads", "n_layers"):
        if key not in cfg:
            raise ValueError(f"LLaDA config.json lacks {key!r}")
    vocab = cfg.get("embedding_size") or cfg.get("vocab_size")
    if not vocab:
        raise ValueError("LLaDA config.json lacks 'embedding_size' / 'vocab_size'")
    d, heads = int(cfg["d_model"]), int(cfg["n_heads"])
    return LlamaConfig(
        vocab_size=int(vocab), hidden_size=d, num_hidden_layers=int(cfg["n_layers"]), num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("n_kv_heads") or heads), head_dim=d // heads,
        intermediate_size=int(cfg.get("mlp_hidden_size") or cfg.get("mlp_ratio", 4) * d), hidden_act="silu",
        rms_norm_eps=float(cfg.get("rms_norm_eps", cfg.get("layer_norm_eps", 1e-5))),
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", 10000.0))},
        max_position_embeddings=int(cfg.get("max_sequence_length", 4096)), attention_bias=False, mlp_bias=False,
        attention_dropout=float(cfg.get("attention_dropout", 0.0)), use_cache=False,
        tie_word_embeddings=bool(cfg.get("weight_tying")),  # OLMo: logits = h @ wte.weight^T, no ff_out
        mask_token_id=cfg.get("mask_token_id", LLaDA.mask_id), eos_token_id=cfg.get("eos_token_id", LLaDA.eos_id),
        pad_token_id=None, bos_token_id=cfg.get("bos_token_id"),  # pad: see _NO_PADDING_IDX
    )


def llada_export_config(model, adapter: ModelAdapter) -> dict:
    """LLaDA ``config.json`` dict of a native ``LlamaForCausalLM`` (inverse of
    :func:`llada_config`; keys of the published LLaDA-8B-Instruct config).

    Raises:
        NotImplementedError: biases, a head dim other than ``d_model / n_heads``, a non-SiLU
            activation or a scaled RoPE (LLaDA's Llama block has none of them).
    """
    c = model.config
    d, heads = int(c.hidden_size), int(c.num_attention_heads)
    check(not getattr(c, "attention_bias", False) and not getattr(c, "mlp_bias", False), "llada", "biases")
    check(getattr(c, "head_dim", None) in (None, d // heads), "llada", f"head_dim {getattr(c, 'head_dim', None)}")
    check(c.hidden_act == "silu", "llada", f"hidden_act {c.hidden_act!r}")
    vocab = int(model.get_input_embeddings().weight.shape[0])
    repo = LLaDA.code_repo
    return {
        "architectures": ["LLaDAModelLM"], "model_type": "llada",
        "auto_map": {"AutoConfig": f"{repo}--configuration_llada.LLaDAConfig",
                     "AutoModelForCausalLM": f"{repo}--modeling_llada.LLaDAModelLM",
                     "AutoModel": f"{repo}--modeling_llada.LLaDAModelLM"},
        "d_model": d, "n_heads": heads, "n_kv_heads": int(c.num_key_value_heads), "n_layers": int(c.num_hidden_layers),
        "mlp_hidden_size": int(c.intermediate_size), "mlp_ratio": max(1, int(c.intermediate_size) // d),
        "embedding_size": vocab, "vocab_size": vocab, "rope_theta": rope_theta(c), "rms_norm_eps": float(c.rms_norm_eps),
        "max_sequence_length": int(c.max_position_embeddings), "weight_tying": is_tied(c),
        "activation_type": "silu", "block_type": "llama", "layer_norm_type": "rms", "layer_norm_with_affine": True,
        "bias_for_layer_norm": False, "include_bias": False, "include_qkv_bias": False, "attention_layer_norm": False,
        "attention_layer_norm_with_affine": True, "alibi": False, "alibi_bias_max": 8.0, "rope": True,
        "rope_full_precision": True, "input_emb_norm": False, "scale_logits": False, "multi_query_attention": None,
        "block_group_size": 1, "flash_attention": False, "attention_dropout": float(getattr(c, "attention_dropout", 0.0)),
        "residual_dropout": 0.0, "embedding_dropout": 0.0, "init_device": "meta", "init_fn": "mitchell",
        "init_std": 0.02, "init_cutoff_factor": None, "use_cache": False, "precision": "amp_bf16",
        "mask_token_id": int(adapter.mask_id), "eos_token_id": int(adapter.eos_id), "pad_token_id": int(adapter.pad_id),
        **({} if getattr(c, "bos_token_id", None) is None else {"bos_token_id": int(c.bos_token_id)}),
    }
