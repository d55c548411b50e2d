"""LLaDA2.x-mini / -flash (``model_type: "llada2_moe"``, ``LLaDA2MoeModelLM``; inclusionAI): block diffusion
(block 32) on the BailingMoeV2 Mixture-of-Experts decoder, loaded without remote code into maskrl's own
module :class:`maskrl.models.llada2_moe.LLaDA2MoeModelLM` (transformers 5.25 ships no class that can run it:
see that module's docstring and docs/models.md); issue 52 item 1.

Facts relied on (the family's ``configuration_llada2_moe.py`` / ``modeling_llada2_moe.py``, read in the copy
ZHZisZZ/dllm ``dllm/pipelines/llada2/models/`` commit ca17675; dFactory ``configs/model_configs/llada2_mini``
commit 92b6890):

* config keys absent from ``config.json`` take the family's config-class defaults (QK-norm on, partial
  rotary 0.5, ...: :class:`~maskrl.models.llada2_moe.LLaDA2MoeConfig`);
* ``generate()``: ``mask_id`` 156895 (not in ``config.json``), ``eos_id`` 156892 (= ``pad_token_id``),
  ``block_length`` 32 (no config key; a ``block_size`` key, if present, is read), no logit shift, the
  block-causal mask built by ``generate()`` from position 0 (maskrl's :func:`~maskrl.models.adapter.block_causal_mask`).

Refused with a one-line error: experts stored merged (dFactory's ``scripts/moe_convertor.py`` layout,
``model.layers.{l}.mlp.experts.{gate_proj,up_proj,down_proj}`` as ``[E, ...]`` tensors: split them back with
that script's ``split`` mode), a ``score_function`` other than sigmoid, a non-SiLU activation, sliding-window
attention, a scaled RoPE, ``num_experts`` not divisible by ``n_group``. Exports are not built yet (issue 52
item 6): ``save_model`` refuses them.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from maskrl.models.families.base import FAMILIES
from maskrl.models.families.native import NativeFamily, default_rope
from maskrl.models.families.sdar import block_size_of, source_facts
from maskrl.models.loading import checkpoint_files

#: ``generate()``'s defaults (inclusionAI ``modeling_llada2_moe.py``)
LLADA2_MASK_ID, LLADA2_EOS_ID, LLADA2_BLOCK_SIZE = 156895, 156892, 32

#: ``config.json`` keys read into :class:`~maskrl.models.llada2_moe.LLaDA2MoeConfig` (absent ones keep its defaults)
LLADA2_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "use_qkv_bias", "use_qk_norm", "use_bias", "rms_norm_eps",
               "tie_word_embeddings", "max_position_embeddings", "pad_token_id", "eos_token_id", "num_experts",
               "num_shared_experts", "num_experts_per_tok", "n_group", "topk_group", "routed_scaling_factor",
               "moe_intermediate_size", "first_k_dense_replace", "partial_rotary_factor")

_MERGED = re.compile(r"\.mlp\.experts\.(gate_proj|up_proj|down_proj)(\.weight)?$")


def refuse_unsupported(cfg: dict) -> None:
    """Raise ``NotImplementedError`` (naming the key) for a ``config.json`` the module cannot run."""
    what = [(cfg.get("score_function", "sigmoid") != "sigmoid", f"score_function={cfg.get('score_function')!r}"),
            (cfg.get("hidden_act", "silu") != "silu", f"hidden_act={cfg.get('hidden_act')!r}"),
            (bool(cfg.get("use_sliding_window")), "use_sliding_window=True")]
    for bad, text in what:
        if bad:
            raise NotImplementedError(f"LLaDA2 config {text} is not supported (the family's code runs sigmoid "
                                      "routing, SiLU, full attention)")
    experts, groups = cfg.get("num_experts"), cfg.get("n_group", 8)
    if experts and experts % groups:
        raise ValueError(f"LLaDA2 config num_experts={experts} is not divisible by n_group={groups}")


def refuse_merged_experts(folder: Path) -> None:
    """``ValueError`` when the checkpoint stores each layer's experts as one ``[E, ...]`` tensor."""
    merged = sorted(n for n in checkpoint_files(folder) if _MERGED.search(n))
    if merged:
        raise ValueError(f"checkpoint {str(folder)!r} stores its experts merged ({merged[0]}, ...: dFactory's "
                         "converted layout); split them into model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight "
                         "first (dFactory scripts/moe_convertor.py, split mode)")


@FAMILIES.register("llada2")
class LLaDA2(NativeFamily):
    """LLaDA2.x (BailingMoeV2 MoE decoder), block-causal attention (block 32), mask 156895, eos/pad 156892."""

    name = "llada2"
    display_name = "LLaDA2"
    model_types = ("llada2_moe",)
    architectures = ("LLaDA2MoeModelLM",)
    model_class = "LLaDA2MoeModelLM"
    mask_id, eos_id = LLADA2_MASK_ID, LLADA2_EOS_ID
    code_repo = "inclusionAI/LLaDA2.0-mini"

    def transformers_class(self) -> type:
        from maskrl.models.llada2_moe import LLaDA2MoeModelLM

        return LLaDA2MoeModelLM

    def native_config(self, cfg: dict):
        from maskrl.models.llada2_moe import LLaDA2MoeConfig

        refuse_unsupported(cfg)
        theta = default_rope(cfg, self.display_name)["rope_theta"]
        keys = {k: cfg[k] for k in LLADA2_KEYS if cfg.get(k) is not None}
        return LLaDA2MoeConfig(**keys, rope_theta=theta, use_cache=False, mask_token_id=cfg.get("mask_token_id", self.mask_id),
                               block_size=self.block_size(cfg), **source_facts(cfg))

    def block_size(self, cfg: dict) -> int:
        return block_size_of(cfg, "block_size", LLADA2_BLOCK_SIZE, self.display_name)

    def adapter_fields(self, cfg: dict, folder: Path, tokenizer: Any, dtype: torch.dtype, device) -> dict:
        """:meth:`NativeFamily.adapter_fields` after refusing merged experts (:func:`refuse_merged_experts`)."""
        refuse_merged_experts(folder)
        return super().adapter_fields(cfg, folder, tokenizer, dtype, device)

    def save(self, model: torch.nn.Module, adapter, path: Path, facts: dict) -> dict:
        """Not built (issue 52 item 6): ``NotImplementedError``, so that no export is written that neither the
        family's code nor maskrl's loader would read."""
        raise NotImplementedError("save_model: exports of LLaDA2 (llada2_moe) checkpoints are not built yet "
                                  "(issue 52 item 6)")
