"""Write a trained policy in the checkpoint layout its family's own loaders read (SPEC §1.1; issue 23).

:func:`save_model` picks the layout from the adapter's ``family``:

``llada`` -> LLaDA's published layout (``GSAI-ML/LLaDA-8B-Instruct``)
    ``config.json`` with ``model_type: "llada"``, ``architectures: ["LLaDAModelLM"]``, the OLMo-style
    keys (``d_model``, ``n_heads``, ``n_kv_heads``, ``n_layers``, ``mlp_hidden_size``,
    ``embedding_size``, ``rope_theta``, ``max_sequence_length``, ``block_type: "llama"``, ...) and
    an ``auto_map`` naming LLaDA's own modelling code on the Hub (``GSAI-ML/LLaDA-8B-Instruct--
    modeling_llada.LLaDAModelLM``), so ``AutoModel.from_pretrained(folder, trust_remote_code=True)``
    runs LLaDA's code on these weights. Tensors carry LLaDA's names (``model.transformer.blocks.{i}
    .ff_proj.weight`` ...; the inverse of :func:`maskrl.models.loading.llada_to_native`).
``dream`` -> Dream's published layout (``Dream-org/Dream-v0-Instruct-7B``)
    Qwen2 keys with ``model_type: "Dream"``, ``architectures: ["DreamModel"]``, ``rope_scaling:
    null`` and an ``auto_map`` naming Dream's code on the Hub; Qwen2 tensor names.
``tiny`` (the built-in model) -> maskrl's own layout
    transformers' Llama weights with ``model_type: "maskrl_tiny"`` and ``architectures:
    ["MaskrlTinyDiffusionLM"]``, which transformers maps to no class: a plain
    ``AutoModelForCausalLM.from_pretrained`` raises (naming the model type ``maskrl_tiny``) instead
    of silently building a *causal* Llama (whose logits differ from the bidirectional model's).
    The native class is kept under ``maskrl_native_model_type``; :func:`maskrl.models.load` reads it.
``masked_lm`` -> transformers' own layout of that class (it is bidirectional by construction).

Every layout also carries the adapter's facts as ``maskrl_*`` keys (stop ids, shift, attention) and
``mask_token_id``, and the tokenizer files (``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json`` via ``save_pretrained``). A LoRA (peft) model is merged into a copy of its
base (``merge_and_unload``, peft's public API) and that merged model is exported; the adapter files
are kept beside it in ``adapter/``.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch

from maskrl.models.adapter import ModelAdapter

#: where each family's own modelling code lives (the ``auto_map`` of an export points there)
FAMILY_CODE = {"llada": "GSAI-ML/LLaDA-8B-Instruct", "dream": "Dream-org/Dream-v0-Instruct-7B"}
TINY_MODEL_TYPE = "maskrl_tiny"
TINY_ARCHITECTURE = "MaskrlTinyDiffusionLM"
ADAPTER_DIR = "adapter"


def save_model(adapter: ModelAdapter, path: str | os.PathLike, merge_lora: bool = True) -> Path:
    """Save a policy's weights (safetensors), config and tokenizer into ``path`` in its family's layout.

    See the module docstring for the layouts. :func:`maskrl.models.load` reloads every one of them
    with the same ids, shift and logits.

    Args:
        adapter: the policy (its ``family`` picks the layout; a peft-wrapped model is merged).
        path: output folder (created).
        merge_lora: peft models only: write the merged model plus the adapter files in
            ``path/adapter/`` (default); ``False`` writes only the adapter files into ``path``.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        NotImplementedError: an LLaDA/Dream-family model with a setting the family's config cannot
            express (the setting is named).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = adapter.model
    if hasattr(model, "merge_and_unload"):  # peft
        model.save_pretrained(path / ADAPTER_DIR if merge_lora else path)
        if not merge_lora:
            if adapter.tokenizer is not None:
                adapter.tokenizer.save_pretrained(path)
            return path
        model = copy.deepcopy(model).merge_and_unload()  # the live (training) model is not modified
    facts = _facts(adapter)
    if adapter.family in ("llada", "dream") and type(model).__name__ in ("LlamaForCausalLM", "Qwen2ForCausalLM"):
        to_cfg = llada_export_config if adapter.family == "llada" else dream_export_config
        cfg = to_cfg(model, adapter) | facts
        _write_weights(_state_dict(model, adapter.family), path)
    else:
        model.save_pretrained(path)
        cfg = json.loads((path / "config.json").read_text())
        cfg |= facts | {"maskrl_family": adapter.family}
        if adapter.attention == "4d":  # a decoder class made bidirectional: refuse a plain causal load
            cfg["maskrl_native_model_type"] = cfg["model_type"]
            cfg["maskrl_native_architectures"] = cfg.get("architectures")
            cfg["model_type"], cfg["architectures"] = TINY_MODEL_TYPE, [TINY_ARCHITECTURE]
            cfg["maskrl_loader"] = "maskrl.models.load"
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if adapter.tokenizer is not None:
        adapter.tokenizer.save_pretrained(path)
    return path


def _facts(adapter: ModelAdapter) -> dict:
    return {"mask_token_id": int(adapter.mask_id), "maskrl_eos_id": int(adapter.eos_id),
            "maskrl_pad_id": int(adapter.pad_id), "maskrl_stop_ids": [int(s) for s in adapter.stop_ids],
            "maskrl_shift": bool(adapter.shift), "maskrl_attention": adapter.attention,
            "maskrl_loader": "maskrl.models.load"}


def _check(cond: bool, family: str, what: str) -> None:
    if not cond:
        raise NotImplementedError(f"save_model: this {family} model has {what}, which the {family} "
                                  f"checkpoint layout cannot express")


def _rope_theta(c) -> float:
    params = getattr(c, "rope_parameters", None) or {}
    _check(params.get("rope_type", "default") == "default", "model", f"rope_type {params.get('rope_type')!r}")
    return float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def _tied(c) -> bool:
    return bool(getattr(c, "tie_word_embeddings", False))


def llada_export_config(model, adapter: ModelAdapter) -> dict:
    """LLaDA ``config.json`` dict of a native ``LlamaForCausalLM`` (inverse of
    :func:`maskrl.models.loading.llada_config`; keys of the published LLaDA-8B-Instruct config).

    Raises:
        NotImplementedError: biases, a head dim other than ``d_model / n_heads``, a non-SiLU
            activation or a scaled RoPE (LLaDA's Llama block has none of them).
    """
    c = model.config
    d, heads = int(c.hidden_size), int(c.num_attention_heads)
    _check(not getattr(c, "attention_bias", False) and not getattr(c, "mlp_bias", False), "llada", "biases")
    _check(getattr(c, "head_dim", None) in (None, d // heads), "llada", f"head_dim {getattr(c, 'head_dim', None)}")
    _check(c.hidden_act == "silu", "llada", f"hidden_act {c.hidden_act!r}")
    vocab = int(model.get_input_embeddings().weight.shape[0])
    repo = FAMILY_CODE["llada"]
    return {
        "architectures": ["LLaDAModelLM"], "model_type": "llada",
        "auto_map": {"AutoConfig": f"{repo}--configuration_llada.LLaDAConfig",
                     "AutoModelForCausalLM": f"{repo}--modeling_llada.LLaDAModelLM",
                     "AutoModel": f"{repo}--modeling_llada.LLaDAModelLM"},
        "d_model": d, "n_heads": heads, "n_kv_heads": int(c.num_key_value_heads), "n_layers": int(c.num_hidden_layers),
        "mlp_hidden_size": int(c.intermediate_size), "mlp_ratio": max(1, int(c.intermediate_size) // d),
        "embedding_size": vocab, "vocab_size": vocab, "rope_theta": _rope_theta(c), "rms_norm_eps": float(c.rms_norm_eps),
        "max_sequence_length": int(c.max_position_embeddings), "weight_tying": _tied(c),
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


def dream_export_config(model, adapter: ModelAdapter) -> dict:
    """Dream ``config.json`` dict of a native ``Qwen2ForCausalLM`` (Qwen2 keys, ``model_type: "Dream"``,
    keys of the published Dream-v0-Instruct-7B config).

    Raises:
        NotImplementedError: sliding-window attention or a scaled RoPE.
    """
    c = model.config
    _check(not getattr(c, "use_sliding_window", False), "dream", "sliding-window attention")
    _check(c.hidden_act == "silu", "dream", f"hidden_act {c.hidden_act!r}")
    repo = FAMILY_CODE["dream"]
    out = {
        "architectures": ["DreamModel"], "model_type": "Dream",
        "auto_map": {"AutoConfig": f"{repo}--configuration_dream.DreamConfig",
                     "AutoModel": f"{repo}--modeling_dream.DreamModel"},
        "hidden_act": "silu", "hidden_size": int(c.hidden_size), "intermediate_size": int(c.intermediate_size),
        "num_hidden_layers": int(c.num_hidden_layers), "num_attention_heads": int(c.num_attention_heads),
        "num_key_value_heads": int(c.num_key_value_heads), "max_position_embeddings": int(c.max_position_embeddings),
        "max_window_layers": int(getattr(c, "max_window_layers", None) or c.num_hidden_layers),
        "rms_norm_eps": float(c.rms_norm_eps), "rope_theta": _rope_theta(c), "rope_scaling": None,
        "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": _tied(c),
        "vocab_size": int(model.get_input_embeddings().weight.shape[0]), "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": False, "torch_dtype": str(model.dtype).removeprefix("torch."),
        "mask_token_id": int(adapter.mask_id), "eos_token_id": int(adapter.eos_id), "pad_token_id": int(adapter.pad_id),
        "bos_token_id": int(c.bos_token_id if getattr(c, "bos_token_id", None) is not None else adapter.eos_id),
    }
    head_dim = getattr(c, "head_dim", None)
    if head_dim not in (None, c.hidden_size // c.num_attention_heads):
        out["head_dim"] = int(head_dim)
    return out


def _state_dict(model, family: str) -> dict[str, torch.Tensor]:
    """The model's tensors under the family's checkpoint names (tied output layer left out)."""
    from maskrl.models.names import llada_to_checkpoint

    state = model.state_dict()
    if _tied(model.config):
        state.pop("lm_head.weight", None)
    rename = llada_to_checkpoint if family == "llada" else (lambda n: n)
    out = {}
    for name, t in state.items():
        new = rename(name)
        if family == "llada" and new == name:
            raise NotImplementedError(f"save_model: tensor {name!r} has no name in the LLaDA layout")
        out[new] = t.detach().contiguous()
    return out


def _write_weights(state: dict[str, torch.Tensor], path: Path, max_shard_size: str = "5GB") -> None:
    """safetensors shards (+ ``model.safetensors.index.json`` when more than one) through
    ``huggingface_hub.save_torch_state_dict``."""
    from huggingface_hub import save_torch_state_dict

    save_torch_state_dict({k: v.cpu() for k, v in state.items()}, path, max_shard_size=max_shard_size,
                          metadata={"format": "pt"})


MODEL_CARD = "README.md"


def write_model_card(folder: str | os.PathLike, *, base_model: str, task: str, recipe: dict, data: str,
                     steps: str, evaluation: list[tuple[str, dict]] | None = None, family: str | None = None) -> Path:
    """Write ``folder/README.md``: how the model in ``folder`` was made and how to load it.

    Args:
        folder: the exported model folder.
        base_model: the model training started from (a path / Hub id, or the built-in tiny model).
        task: the task name.
        recipe: the resolved run configuration (``maskrl.config.to_dict``), written as YAML.
        data: where the training and evaluation rows came from (free text).
        steps: what training ran (e.g. ``"SFT 600 steps"``, ``"RL 60 steps"``).
        evaluation: ``[(name, metrics)]`` rows of the run's evaluation table (numbers only are shown);
            ``None`` or empty: "not evaluated during this run".
        family: ``llada`` | ``dream`` | ``tiny`` | ``masked_lm`` (how to load it).

    Returns:
        The path of the card.
    """
    import yaml

    folder = Path(folder)
    loaders = {"llada": "LLaDA's own code (`AutoModel.from_pretrained(folder, trust_remote_code=True)`, "
                        f"code from `{FAMILY_CODE['llada']}`) or `maskrl.models.load(folder)`",
               "dream": "Dream's own code (`AutoModel.from_pretrained(folder, trust_remote_code=True)`, "
                        f"code from `{FAMILY_CODE['dream']}`) or `maskrl.models.load(folder)`"}
    how = loaders.get(family or "", "`maskrl.models.load(folder)` only: this is a bidirectional masked-diffusion "
                                    "model, and a plain `AutoModelForCausalLM` load is refused on purpose")
    lines = ["---", "library_name: maskrl", "tags: [masked-diffusion, dllm, maskrl]", "---", "",
             f"# {folder.name}: {task}", "",
             f"- **base model**: {base_model}", f"- **task**: {task}", f"- **data**: {data}",
             f"- **training**: {steps}", f"- **load with**: {how}",
             "- **evaluate**: `maskrl eval --model <this folder> --task " + task + "` (reads `maskrl_prompt.json`)", ""]
    lines += ["## Evaluation", ""]
    rows = [(name, {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
            for name, m in (evaluation or [])]
    keys = sorted({k for _, m in rows for k in m})
    if rows and keys:
        lines += ["| model | " + " | ".join(keys) + " |", "| --- " * (len(keys) + 1) + "|"]
        lines += ["| " + name + " | " + " | ".join(f"{m[k]:.4g}" if k in m else "" for k in keys) + " |"
                  for name, m in rows]
    else:
        lines.append("Not evaluated during this run.")
    lines += ["", "## Recipe (resolved configuration)", "", "```yaml",
              yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True).rstrip(), "```", ""]
    path = folder / MODEL_CARD
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
