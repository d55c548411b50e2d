"""The built-in default model: a small Llama made bidirectional (docs/spec.md §1.1, issue "main job").

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
               max_positions: int = 512, seed: int = 0, tokenizer: PreTrainedTokenizerFast | None = None,
               block_size: int | None = None) -> ModelAdapter:
    """A randomly initialised tiny bidirectional Llama with the character tokenizer.

    Args:
        hidden_size, num_layers, num_heads, intermediate_size: transformer shape.
        max_positions: longest prompt + completion, in tokens.
        seed: initialisation seed (applied through ``torch.random.fork_rng`` so the global RNG
            state is left untouched).
        tokenizer: defaults to :func:`build_char_tokenizer`.
        block_size: ``None`` (default): full bidirectional attention (LLaDA-style). An int: the tiny
            block-diffusion model (SDAR-style: bidirectional inside blocks of this many tokens, causal
            across blocks, no logit shift), :attr:`ModelAdapter.block_size`.
    """
    tok = tokenizer or build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_positions, rms_norm_eps=1e-5, tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        mask_token_id=tok.mask_token_id, maskrl_family="tiny",
        **({} if block_size is None else {"maskrl_block_size": int(block_size)}),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return ModelAdapter(model=model, mask_id=tok.mask_token_id, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                        shift=False, family="tiny", tokenizer=tok, block_size=block_size)


def load_tiny(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> ModelAdapter:
    """Load a folder written by :func:`save_model` (any family; ``maskrl_*`` keys in config.json).

    The native class comes from the config's ``maskrl_native_model_type`` (maskrl's own layout,
    ``model_type: "maskrl_tiny"``, :mod:`maskrl.models.export`) or else its ``model_type`` (folders of
    earlier versions): ``AutoModelForCausalLM``, or ``AutoModelForMaskedLM`` for 2-D-attention
    models; no remote code.
    """
    import json

    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    raw = json.loads((Path(path) / "config.json").read_text())
    if "maskrl_native_model_type" in raw:
        native = raw.pop("maskrl_native_model_type")
        raw["architectures"] = raw.pop("maskrl_native_architectures", None)
        raw.pop("model_type", None)
        config = AutoConfig.for_model(native, **raw)
    else:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    attention = getattr(config, "maskrl_attention", "4d")
    auto = AutoModelForMaskedLM if attention == "2d" else AutoModelForCausalLM
    model = auto.from_pretrained(path, config=config, dtype=dtype, trust_remote_code=False)
    tok = PreTrainedTokenizerFast.from_pretrained(path) if (Path(path) / "tokenizer.json").exists() else None
    cfg = model.config
    eos = getattr(cfg, "maskrl_eos_id", None)
    pad = getattr(cfg, "maskrl_pad_id", None)
    return ModelAdapter(model=model, mask_id=cfg.mask_token_id,
                        eos_id=eos if eos is not None else cfg.eos_token_id,
                        pad_id=pad if pad is not None else cfg.pad_token_id,
                        shift=bool(getattr(cfg, "maskrl_shift", False)), family=getattr(cfg, "maskrl_family", "tiny"),
                        attention=attention, tokenizer=tok, stop_ids=tuple(getattr(cfg, "maskrl_stop_ids", ()) or ()),
                        block_size=getattr(cfg, "maskrl_block_size", None))
