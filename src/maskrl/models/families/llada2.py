"""LLaDA2.x-mini / -flash (``model_type: "llada2_moe"``, ``LLaDA2MoeModelLM``; inclusionAI): block diffusion
(block 32) on the BailingMoeV2 Mixture-of-Experts decoder, loaded without remote code into maskrl's own
module :class:`maskrl.models.llada2_moe.LLaDA2MoeModelLM` (transformers 5.25 ships no class that can run it:
see that module's docstring and docs/models.md); issue 52 item 1.

Facts relied on (the family's ``configuration_llada2_moe.py`` / ``modeling_llada2_moe.py``, read in the copy
ZHZisZZ/dllm ``dllm/pipelines/llada2/models/`` commit ca17675; dFactory ``configs/model_configs/llada2_mini``
commit 92b6890):

* config keys absent from ``config.json`` take the family's config-class defaults (partial rotary 0.5, ...:
  :class:`~maskrl.models.llada2_moe.LLaDA2MoeConfig`); QK-norm is on unless ``use_qk_norm`` is false *and* the
  checkpoint has no QK-norm weights (:func:`qk_norm_of`: the published modelling code applies it always);
* ``generate()``: ``mask_id`` 156895 (not in ``config.json``), ``eos_id`` 156892 (= ``pad_token_id``),
  ``block_length`` 32 (no config key; a ``block_size`` key, if present, is read), no logit shift, the
  block-causal mask built by ``generate()`` from position 0 (maskrl's :func:`~maskrl.models.adapter.block_causal_mask`).

Refused with a one-line error: experts stored merged (dFactory's ``scripts/moe_convertor.py`` layout,
``model.layers.{l}.mlp.experts.{gate_proj,up_proj,down_proj}`` as ``[E, ...]`` tensors: split them back with
that script's ``split`` mode), a ``score_function`` other than sigmoid, a non-SiLU activation, sliding-window
attention, a scaled RoPE, ``num_experts`` not divisible by ``n_group``.

Exports (:func:`maskrl.models.save_model`, issue 52 item 6): the family's own layout. ``config.json`` is the
source checkpoint's, every key kept as it was (kept whole on the model config as ``maskrl_source_config``;
a model built without one starts from :data:`LLADA2_EXPORT_DEFAULTS`: ``architectures``, the family's
``auto_map``, the routing, norm and dropout fields), with the shape and routing keys maskrl reads rewritten from the
live model (equal unless the model changed), ``torch_dtype`` the written one, ``mask_token_id``, and
``block_size`` only where the source had one or the block is not 32; tensors under the family's names (the
module's own: ``model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight`` one per expert,
``...mlp.gate.expert_bias``), safetensors shards + ``model.safetensors.index.json`` (written for a single file
too: dInfer opens it unconditionally). ``auto_map`` keeps its keys, its entries pointed at the family's code on
the Hub (``inclusionAI/LLaDA2.0-mini--configuration_llada2_moe.LLaDA2MoeConfig``; :func:`hub_auto_map`): an
export holds no modelling code, and SGLang and dInfer read ``config.json`` through ``AutoConfig`` with
``trust_remote_code``. What SGLang's and dInfer's loaders read (config keys, tensor names, files) is recorded
from their source by ``benchmarks/references/llada2_engines_record.py`` and checked on exports by
``tests/test_llada2_engines.py`` (docs/models.md).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from maskrl.models.families.base import FAMILIES
from maskrl.models.families.native import NativeFamily, check, default_rope
from maskrl.models.families.sdar import block_size_of, source_facts
from maskrl.models.loading import INDEX_FILE, SINGLE_FILE, checkpoint_files

#: ``generate()``'s defaults (inclusionAI ``modeling_llada2_moe.py``)
LLADA2_MASK_ID, LLADA2_EOS_ID, LLADA2_BLOCK_SIZE = 156895, 156892, 32

#: ``config.json`` keys read into :class:`~maskrl.models.llada2_moe.LLaDA2MoeConfig` (absent ones keep its defaults)
LLADA2_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "use_qkv_bias", "use_qk_norm", "use_bias", "rms_norm_eps",
               "tie_word_embeddings", "max_position_embeddings", "pad_token_id", "eos_token_id", "num_experts",
               "num_shared_experts", "num_experts_per_tok", "n_group", "topk_group", "routed_scaling_factor",
               "moe_intermediate_size", "first_k_dense_replace", "partial_rotary_factor")

#: ``config.json`` keys of an export made from a model without a source config (the published LLaDA2.0-mini's
#: non-shape keys, dFactory ``configs/model_configs/llada2_mini``)
LLADA2_EXPORT_DEFAULTS = {
    "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
    "auto_map": {"AutoConfig": "inclusionAI/LLaDA2.0-mini--configuration_llada2_moe.LLaDA2MoeConfig",
                 "AutoModel": "inclusionAI/LLaDA2.0-mini--modeling_llada2_moe.LLaDA2MoeModel",
                 "AutoModelForCausalLM": "inclusionAI/LLaDA2.0-mini--modeling_llada2_moe.LLaDA2MoeModelLM"},
    "hidden_act": "silu", "score_function": "sigmoid", "moe_router_enable_expert_bias": True, "router_dtype": "fp32",
    "norm_topk_prob": True, "use_rmsnorm": True, "rope_scaling": None, "use_sliding_window": False, "use_cache": False,
    "attention_dropout": 0.0, "embedding_dropout": 0.0, "output_dropout": 0.0, "initializer_range": 0.02,
    "norm_head": False, "norm_softmax": False, "output_router_logits": False,
}

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


def qk_norm_of(cfg: dict, names) -> bool:
    """Whether the attention normalises each query and key head: ``use_qk_norm`` (absent: on), or on anyway
    when the checkpoint holds ``...attention.query_layernorm.weight`` tensors. The family's published
    ``modeling_llada2_moe.py`` (inclusionAI/LLaDA2.0-mini and 2.1-mini on the Hub, as copied in DARE 83ae8a3 and
    dFactory 92b6890) builds and applies QK-norm unconditionally while its config class defaults
    ``use_qk_norm`` to False, so a checkpoint that code saves may say ``false`` and still be QK-normed;
    other copies (ZHZisZZ/dllm, dInfer, SGLang) follow the key, and then the norm weights exist iff it is on."""
    return cfg.get("use_qk_norm", True) is not False or any(".attention.query_layernorm." in n for n in names)


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
    #: ``generate()``'s threshold rule (0.95; ``steps`` = gen length, 32 a block), on the exact block cache
    block_rule = {"cache": "block", "early_stop": True, "remasking": "low_confidence_dynamic", "threshold": 0.95}

    def transformers_class(self) -> type:
        from maskrl.models.llada2_moe import LLaDA2MoeModelLM

        return LLaDA2MoeModelLM

    def native_config(self, cfg: dict):
        from maskrl.models.llada2_moe import LLaDA2MoeConfig

        refuse_unsupported(cfg)
        theta = default_rope(cfg, self.display_name)["rope_theta"]
        keys = {k: cfg[k] for k in LLADA2_KEYS if cfg.get(k) is not None}
        source = {k: v for k, v in cfg.items() if not k.startswith("maskrl_")}  # an export's own facts are rewritten
        return LLaDA2MoeConfig(**keys, rope_theta=theta, use_cache=False, mask_token_id=cfg.get("mask_token_id", self.mask_id),
                               block_size=self.block_size(cfg), maskrl_source_config=source, **source_facts(cfg))

    def block_size(self, cfg: dict) -> int:
        return block_size_of(cfg, "block_size", LLADA2_BLOCK_SIZE, self.display_name)

    def adapter_fields(self, cfg: dict, folder: Path, tokenizer: Any, dtype: torch.dtype, device) -> dict:
        """:meth:`NativeFamily.adapter_fields` after refusing merged experts (:func:`refuse_merged_experts`),
        with QK-norm on wherever the checkpoint holds its weights (:func:`qk_norm_of`)."""
        refuse_merged_experts(folder)
        cfg = cfg | {"use_qk_norm": qk_norm_of(cfg, checkpoint_files(folder))}
        return super().adapter_fields(cfg, folder, tokenizer, dtype, device)

    def save(self, model: torch.nn.Module, adapter, path: Path, facts: dict) -> dict:
        """:meth:`NativeFamily.save`, plus ``model.safetensors.index.json`` when the weights fit one file
        (dInfer's loader opens the index unconditionally: :func:`write_single_index`)."""
        cfg = super().save(model, adapter, path, facts)
        if type(model).__name__ == self.model_class:
            write_single_index(path)
        return cfg

    def export_config(self, model: torch.nn.Module, adapter) -> dict:
        """The family's ``config.json`` of a :class:`~maskrl.models.llada2_moe.LLaDA2MoeModelLM` (module
        docstring, "Exports").

        Raises:
            NotImplementedError: an adapter without a block size (full attention is not LLaDA2).
        """
        c = model.config
        check(adapter.block_size is not None, self.name, "full attention (block_size None)")
        source = dict(getattr(c, "maskrl_source_config", None) or LLADA2_EXPORT_DEFAULTS)
        live = {k: getattr(c, k) for k in LLADA2_KEYS if getattr(c, k, None) is not None}
        live |= {"rope_theta": c.rope_theta, "vocab_size": int(model.get_input_embeddings().weight.shape[0]),
                 "mask_token_id": int(adapter.mask_id), "pad_token_id": int(adapter.pad_id)}
        out = source | {k: v for k, v in live.items() if not (k in source and source[k] == v)}  # 600000 stays an int
        out["torch_dtype"] = str(model.dtype).removeprefix("torch.")
        out["auto_map"] = hub_auto_map(out.get("auto_map") or LLADA2_EXPORT_DEFAULTS["auto_map"], self.code_repo)
        if "block_size" in source or adapter.block_size != LLADA2_BLOCK_SIZE:
            out["block_size"] = int(adapter.block_size)
        return out

    def how_to_load(self) -> str | None:
        return ("`maskrl.models.load(folder)`, or LLaDA2's own code (`trust_remote_code=True`: `auto_map` names it in "
                f"`{self.code_repo}` on the Hub), SGLang or dInfer; block 32 by default")


def hub_auto_map(auto_map: dict, repo: str) -> dict:
    """``auto_map`` with every entry naming a module in the folder (``"module.Class"``) pointed at ``repo`` on the
    Hub (``"repo--module.Class"``, transformers' form for code in another repository): an export holds no
    modelling code, and SGLang / dInfer read its ``config.json`` through ``AutoConfig.from_pretrained(folder,
    trust_remote_code=True)``, which needs the configuration module. Entries already naming a repository stay."""
    return {k: v if "--" in v else f"{repo}--{v}" for k, v in auto_map.items()}


def write_single_index(path: Path) -> None:
    """Write ``model.safetensors.index.json`` for a single ``model.safetensors`` (shards already have one):
    ``weight_map`` every tensor to that file, ``metadata.total_size`` the bytes of its tensors."""
    import json

    from safetensors import safe_open

    if (path / INDEX_FILE).is_file() or not (path / SINGLE_FILE).is_file():
        return
    with safe_open(path / SINGLE_FILE, framework="pt") as f:
        sizes = {n: f.get_slice(n) for n in f.keys()}
        total = sum(_nbytes(s.get_shape(), s.get_dtype()) for s in sizes.values())
    index = {"metadata": {"total_size": total}, "weight_map": {n: SINGLE_FILE for n in sorted(sizes)}}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


_BYTES = {"F64": 8, "F32": 4, "I64": 8, "I32": 4, "BF16": 2, "F16": 2, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _nbytes(shape: list[int], dtype: str) -> int:
    n = _BYTES[dtype]
    for d in shape:
        n *= d
    return n
