"""The built-in default model: a small Llama made bidirectional (SPEC §1.1, issue "main job").

It is a stock ``LlamaForCausalLM`` -- so safetensors save/load, accelerate and peft work unchanged
and the code path is the one an 8B LLaDA-style model takes -- that never sees a causal mask: the
adapter passes an all-attend 4-D mask. No logit shift (LLaDA convention).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from maskrl.models.adapter import ModelAdapter
from maskrl.models.tokenizer import build_char_tokenizer


def build_tiny(hidden_size: int = 128, num_layers: int = 4, num_heads: int = 4, intermediate_size: int = 384,
               max_positions: int = 512, seed: int = 0, tokenizer: PreTrainedTokenizerFast | None = None) -> ModelAdapter:
    """A randomly initialised tiny bidirectional Llama with the character tokenizer.

    Args:
        hidden_size, num_layers, num_heads, intermediate_size: transformer shape.
        max_positions: longest prompt + completion, in tokens.
        seed: initialisation seed (applied through ``torch.random.fork_rng`` so the global RNG
            state is left untouched).
        tokenizer: defaults to :func:`build_char_tokenizer`.
    """
    tok = tokenizer or build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_positions, rms_norm_eps=1e-5, tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        mask_token_id=tok.mask_token_id, maskrl_family="tiny",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return ModelAdapter(model=model, mask_id=tok.mask_token_id, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                        shift=False, family="tiny", tokenizer=tok)


def save_model(adapter: ModelAdapter, path: str | os.PathLike) -> Path:
    """Save weights (safetensors), config and tokenizer into ``path``; returns the folder.

    The adapter's family facts (mask / eos / pad / stop ids, logit shift, attention style) are
    written into ``config.json`` as ``maskrl_*`` keys, so :func:`load_tiny` (and
    :func:`maskrl.models.load`) reload any saved policy -- the tiny model, a trained LLaDA (saved as
    its native Llama class) or Dream (Qwen2) -- with the same behaviour. A peft-wrapped model is
    saved through peft's own ``save_pretrained``: the LoRA adapter files only; the live model is
    not modified.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = adapter.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    cfg.maskrl_family = adapter.family
    cfg.mask_token_id = adapter.mask_id
    cfg.maskrl_eos_id = adapter.eos_id
    cfg.maskrl_pad_id = adapter.pad_id
    cfg.maskrl_stop_ids = list(adapter.stop_ids)
    cfg.maskrl_shift = bool(adapter.shift)
    cfg.maskrl_attention = adapter.attention
    model.save_pretrained(path)
    if adapter.tokenizer is not None:
        adapter.tokenizer.save_pretrained(path)
    return path


def load_tiny(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> ModelAdapter:
    """Load a folder written by :func:`save_model` (any family; ``maskrl_*`` keys in config.json).

    The native class comes from the config's ``model_type`` (``AutoModelForCausalLM``, or
    ``AutoModelForMaskedLM`` for 2-D-attention models); no remote code.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    attention = getattr(config, "maskrl_attention", "4d")
    auto = AutoModelForMaskedLM if attention == "2d" else AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=dtype, trust_remote_code=False)
    tok = PreTrainedTokenizerFast.from_pretrained(path) if (Path(path) / "tokenizer.json").exists() else None
    cfg = model.config
    eos = getattr(cfg, "maskrl_eos_id", None)
    pad = getattr(cfg, "maskrl_pad_id", None)
    return ModelAdapter(model=model, mask_id=cfg.mask_token_id,
                        eos_id=eos if eos is not None else cfg.eos_token_id,
                        pad_id=pad if pad is not None else cfg.pad_token_id,
                        shift=bool(getattr(cfg, "maskrl_shift", False)), family=getattr(cfg, "maskrl_family", "tiny"),
                        attention=attention, tokenizer=tok, stop_ids=tuple(getattr(cfg, "maskrl_stop_ids", ()) or ()))
