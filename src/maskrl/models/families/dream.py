"""Dream (``model_type: "Dream"``, e.g. ``Dream-org/Dream-v0-Instruct-7B``): Qwen2 config keys and Qwen2
tensor names (q/k/v with bias, o_proj without), loaded into :class:`~transformers.Qwen2ForCausalLM` with
full bidirectional attention; logits are shifted by one (``logits[i]`` predicts token ``i+1``), which the
adapter re-aligns. A ``rope_scaling`` of ``None`` or of type ``"default"`` (a form transformers 5 no
longer accepts from remote code) becomes ``rope_parameters = {"rope_type": "default", "rope_theta": θ}``;
other scalings are refused. Exports: Qwen2 keys with ``model_type: "Dream"``, ``architectures:
["DreamModel"]``, ``rope_scaling: null`` and an ``auto_map`` naming Dream's code on the Hub.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from maskrl.models.families.base import FAMILIES
from maskrl.models.families.native import NativeFamily, check, default_rope, is_tied, rope_theta


if TYPE_CHECKING:
    from maskrl.models.adapter import ModelAdapter


@FAMILIES.register("dream")
class Dream(NativeFamily):
    """Dream: Qwen2 with shifted logits; mask 151666, eos/pad 151643."""

    name = "dream"
    display_name = "Dream"
    model_types = ("dream",)
    architectures = ("Dream*",)
    model_class = "Qwen2ForCausalLM"
    mask_id, eos_id = 151666, 151643
    shift = True
    code_repo = "Dream-org/Dream-v0-Instruct-7B"
    qwen_tokenizer = True

    def native_config(self, cfg: dict):
        return dream_config(cfg)

    def export_config(self, model, adapter) -> dict:
        return dream_export_config(model, adapter)


def dream_config(cfg: dict):
    """:class:`~transformers.Qwen2Config` equivalent to a Dream ``config.json`` dict.

    ``rope_scaling`` ``None`` or ``{"type"/"rope_type": "default"}`` maps to transformers 5's
    ``rope_parameters = {"rope_type": "default", "rope_theta": θ}``.

    Raises:
        NotImplementedError: a RoPE scaling other than default, sliding-window attention, or a
            non-SiLU activation (the key is named).
    """
    from transformers import Qwen2Config

    rope = default_rope(cfg, "Dream")
    if cfg.get("use_sliding_window"):
        raise NotImplementedError("Dream config use_sliding_window=True is not supported (full attention only)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"Dream config hidden_act={cfg['hidden_act']!r}: only 'silu' is supported")
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
            "attention_dropout", "head_dim", "bos_token_id", "eos_token_id")  # no pad: see _NO_PADDING_IDX
    kwargs = {k: cfg[k] for k in keep if cfg.get(k) is not None}
    return Qwen2Config(**kwargs, hidden_act="silu", use_sliding_window=False, use_cache=False,
                       rope_parameters=rope, mask_token_id=cfg.get("mask_token_id", Dream.mask_id))


def dream_export_config(model, adapter: ModelAdapter) -> dict:
    """Dream ``config.json`` dict of a native ``Qwen2ForCausalLM`` (Qwen2 keys, ``model_type: "Dream"``,
    keys of the published Dream-v0-Instruct-7B config).

    Raises:
        NotImplementedError: sliding-window attention or a scaled RoPE.
    """
    c = model.config
    check(not getattr(c, "use_sliding_window", False), "dream", "sliding-window attention")
    check(c.hidden_act == "silu", "dream", f"hidden_act {c.hidden_act!r}")
    repo = Dream.code_repo
    out = {
        "architectures": ["DreamModel"], "model_type": "Dream",
        "auto_map": {"AutoConfig": f"{repo}--configuration_dream.DreamConfig",
                     "AutoModel": f"{repo}--modeling_dream.DreamModel"},
        "hidden_act": "silu", "hidden_size": int(c.hidden_size), "intermediate_size": int(c.intermediate_size),
        "num_hidden_layers": int(c.num_hidden_layers), "num_attention_heads": int(c.num_attention_heads),
        "num_key_value_heads": int(c.num_key_value_heads), "max_position_embeddings": int(c.max_position_embeddings),
        "max_window_layers": int(getattr(c, "max_window_layers", None) or c.num_hidden_layers),
        "rms_norm_eps": float(c.rms_norm_eps), "rope_theta": rope_theta(c), "rope_scaling": None,
        "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": is_tied(c),
        "vocab_size": int(model.get_input_embeddings().weight.shape[0]), "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": False, "torch_dtype": str(model.dtype).removeprefix("torch."),
        "mask_token_id": int(adapter.mask_id), "eos_token_id": int(adapter.eos_id), "pad_token_id": int(adapter.pad_id),
        "bos_token_id": int(c.bos_token_id if getattr(c, "bos_token_id", None) is not None else adapter.eos_id),
    }
    head_dim = getattr(c, "head_dim", None)
    if head_dim not in (None, c.hidden_size // c.num_attention_heads):
        out["head_dim"] = int(head_dim)
    return out
