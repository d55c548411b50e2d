"""Tensor names of the published checkpoint layouts against transformers' native classes (docs/spec.md §1.1).

LLaDA's table, read by both directions (:class:`maskrl.models.families.llada.LLaDA`):
:func:`maskrl.models.load` renames a checkpoint's tensors into the native class (:func:`llada_to_native`)
and :func:`maskrl.models.save_model` writes the native tensors back under LLaDA's names
(:func:`llada_to_checkpoint`). The other families' names are their native classes' own.

``llada``: LLaDA's OLMo-style names (``GSAI-ML/LLaDA-8B-Instruct``) against
:class:`~transformers.LlamaForCausalLM`'s; the table is in :mod:`maskrl.models.families.llada`'s docstring
(``ff_proj`` is the gate, the block's ``ff_out`` the down projection, the model-level ``ff_out`` the
output layer).
"""
from __future__ import annotations

import re

LLADA_TOP = {"model.transformer.wte.weight": "model.embed_tokens.weight",
             "model.transformer.ln_f.weight": "model.norm.weight",
             "model.transformer.ff_out.weight": "lm_head.weight"}
LLADA_BLOCK = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
               "attn_out": "self_attn.o_proj", "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
               "ff_out": "mlp.down_proj", "attn_norm": "input_layernorm", "ff_norm": "post_attention_layernorm"}
_LLADA_TOP_INV = {v: k for k, v in LLADA_TOP.items()}
_LLADA_BLOCK_INV = {v: k for k, v in LLADA_BLOCK.items()}


def llada_to_native(name: str) -> str | None:
    """Llama name of a LLaDA checkpoint tensor name, ``None`` when it has none."""
    if name in LLADA_TOP:
        return LLADA_TOP[name]
    m = re.fullmatch(r"model\.transformer\.blocks\.(\d+)\.(\w+)\.weight", name)
    if m and m.group(2) in LLADA_BLOCK:
        return f"model.layers.{m.group(1)}.{LLADA_BLOCK[m.group(2)]}.weight"
    return None


def llada_to_checkpoint(native: str) -> str:
    """Inverse of :func:`llada_to_native` (export, error messages); unknown names are returned as-is."""
    if native in _LLADA_TOP_INV:
        return _LLADA_TOP_INV[native]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", native)
    if m and m.group(2) in _LLADA_BLOCK_INV:
        return f"model.transformer.blocks.{m.group(1)}.{_LLADA_BLOCK_INV[m.group(2)]}.weight"
    return native
