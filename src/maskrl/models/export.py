"""Write a trained policy in the checkpoint layout its family's own loaders read (docs/spec.md §1.1; issues 23, 48).

:func:`save_model` asks the adapter's family (:data:`maskrl.models.families.FAMILIES`, by
``adapter.family``) for the layout (:meth:`~maskrl.models.families.Family.save`):

``llada`` -> LLaDA's published layout (``GSAI-ML/LLaDA-8B-Instruct``)
    ``config.json`` with ``model_type: "llada"``, ``architectures: ["LLaDAModelLM"]``, the OLMo-style
    keys (``d_model``, ``n_heads``, ``n_kv_heads``, ``n_layers``, ``mlp_hidden_size``,
    ``embedding_size``, ``rope_theta``, ``max_sequence_length``, ``block_type: "llama"``, ...) and
    an ``auto_map`` naming LLaDA's own modelling code on the Hub (``GSAI-ML/LLaDA-8B-Instruct--
    modeling_llada.LLaDAModelLM``), so ``AutoModel.from_pretrained(folder, trust_remote_code=True)``
    runs LLaDA's code on these weights. Tensors carry LLaDA's names (``model.transformer.blocks.{i}
    .ff_proj.weight`` ...; the inverse of :func:`maskrl.models.names.llada_to_native`).
``dream`` -> Dream's published layout (``Dream-org/Dream-v0-Instruct-7B``)
    Qwen2 keys with ``model_type: "Dream"``, ``architectures: ["DreamModel"]``, ``rope_scaling:
    null`` and an ``auto_map`` naming Dream's code on the Hub; Qwen2 tensor names.
``sdar`` / ``sdar_moe`` -> SDAR's layout (``JetAstra/SDAR-*-Chat``): Qwen3 (Qwen3-MoE) keys and tensor
    names with ``model_type: "sdar"`` (``"sdar_moe"``), ``block_size``, ``mask_token_id``, and the
    source's ``architectures`` / ``auto_map`` when it had them (:mod:`maskrl.models.families.sdar`).
``fast_dllm_v2`` -> Fast-dLLM v2's layout: Qwen2 keys and names, ``model_type: "Fast_dLLM_Qwen"``,
    ``bd_size`` (:mod:`maskrl.models.families.fast_dllm`).
``tiny`` (the built-in model), and any model not in its family's native class -> maskrl's own layout
    transformers' weights with ``model_type: "maskrl_tiny"`` and ``architectures:
    ["MaskrlTinyDiffusionLM"]``, which transformers maps to no class: a plain
    ``AutoModelForCausalLM.from_pretrained`` raises (naming the model type ``maskrl_tiny``) instead
    of silently building a *causal* Llama (whose logits differ from the bidirectional model's).
    The native class is kept under ``maskrl_native_model_type``; :func:`maskrl.models.load` reads it
    (:func:`maskrl.models.families.save_maskrl_layout`).
``masked_lm`` -> transformers' own layout of that class (it is bidirectional by construction).

Every layout also carries the adapter's facts as ``maskrl_*`` keys (stop ids, shift, attention, block
size) and ``mask_token_id``, and the tokenizer files (``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json`` via ``save_pretrained``).

LoRA (peft) runs
----------------
The exported folder is the *trained* model, base + adapter. A LoRA update trained at the 7-8B
recipes' learning rates (docs/spec.md §3, ~1e-6) is far below the resolution of a bf16 base weight (bf16
keeps 8 significant bits: half a step at a weight of 0.05 is 1.2e-4), so adding it to the bf16
weights rounds most of it away. :func:`save_model` therefore merges a float32 copy of the policy
(:func:`cpu_float32_copy`: a float32 copy made on the CPU, never on the GPU; then peft's public
``merge_and_unload``) and writes the
merged weights in float32 by default; the live policy is not modified. A narrower ``merged_dtype``
is written only when rounding to it keeps the update (relative error of the exported update
against the adapter's ``ΔW`` at most ``max_update_error``); otherwise :class:`LossyMergeError`.
The adapter files are kept beside the merged weights in ``adapter/`` and ``config.json`` records
``maskrl_lora`` (base dtype, merged dtype, the measured fraction of adapted entries equal to the base
and the update's relative error, :func:`update_fidelity`). :func:`maskrl.models.load` of such a
folder in another dtype than the merged one (``dtype=torch.bfloat16`` for an 8B model) rebuilds base
+ adapter as in training (:func:`base_plus_adapter`) instead of rounding the merged weights.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.files import usual_file_modes

ADAPTER_DIR = "adapter"


class LossyMergeError(ValueError):
    """A LoRA merge into the requested ``merged_dtype`` would lose the adapter's update (see
    :func:`save_model`); the message gives the measured loss and the way out."""


def save_model(adapter: ModelAdapter, path: str | os.PathLike, merge_lora: bool = True,
               merged_dtype: torch.dtype | str = torch.float32, max_update_error: float = 0.01) -> Path:
    """Save a policy's weights (safetensors), config and tokenizer into ``path`` in its family's layout.

    See the module docstring for the layouts. :func:`maskrl.models.load` reloads every one of them
    with the same ids, shift and logits. Every file written has the mode a new file gets (``0o666``
    less the umask; :func:`maskrl.files.usual_file_modes`).

    Args:
        adapter: the policy (its ``family`` picks the layout; a peft-wrapped model is merged).
        path: output folder (created).
        merge_lora: peft models only: write the merged model plus the adapter files in
            ``path/adapter/`` (default); ``False`` writes only the adapter files into ``path``.
        merged_dtype: peft models only: dtype of the merged weights. The merge is always computed in
            float32 (module docstring); float32 (default) keeps any update. A narrower dtype
            (``"bfloat16"``) halves the folder but is written only if it keeps the update.
        max_update_error: peft models with a narrower ``merged_dtype`` only: the largest accepted
            relative error ``||ΔW_exported − ΔW||_F / ||ΔW||_F`` over all adapted weights
            (:func:`update_fidelity`); 1.0 accepts a merge that lost everything.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        LossyMergeError: ``merged_dtype`` cannot hold the update (the measured error and fraction of
            unchanged entries are named; nothing is written but the adapter files).
        ValueError: an unknown ``merged_dtype``.
        NotImplementedError: a model in its family's native class with a setting the family's
            config cannot express (the setting is named).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = adapter.model
    lora_facts = {}
    if hasattr(model, "merge_and_unload"):  # peft
        model.save_pretrained(path / ADAPTER_DIR if merge_lora else path)
        if not merge_lora:
            if adapter.tokenizer is not None:
                adapter.tokenizer.save_pretrained(path)
            usual_file_modes(path)
            return path
        model, lora_facts = merge_lora_copy(model, merged_dtype, max_update_error)
    facts = _facts(adapter) | ({"maskrl_lora": lora_facts} if lora_facts else {})
    cfg = family_named(adapter.family).save(model, adapter, path, facts)
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if adapter.tokenizer is not None:
        adapter.tokenizer.save_pretrained(path)
    usual_file_modes(path)  # transformers writes model.safetensors through mkstemp (0600)
    return path


def _lora_layers(peft_model) -> list[tuple[str, torch.nn.Module]]:
    """``(name, layer)`` of every LoRA layer (``peft.tuners.lora.LoraLayer``) of a peft model, names
    as in its base model (``get_base_model().named_modules()``): the merged model's module names."""
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in peft_model.get_base_model().named_modules() if isinstance(m, LoraLayer)]


def _active(layer) -> list[str]:
    return [a for a in layer.active_adapters if a in layer.lora_A]


def cpu_float32_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``module`` whose floating-point parameters and buffers are float32 on the CPU, built
    without a second copy on the module's own device: each tensor is copied straight to the CPU (in
    float32) and handed to ``copy.deepcopy`` through its ``memo``, so the copy never exists on the GPU
    (the earlier ``deepcopy(...).to("cpu")`` held a whole second model there -- 16 GiB for an 8B bf16
    base -- for a moment at every export). Ties stay ties; ``requires_grad`` is kept; ``module`` is not
    modified. Host memory: 4 bytes per floating-point entry."""
    memo: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for t in (*module.parameters(), *module.buffers()):
            if id(t) in memo:
                continue
            c = t.detach().to("cpu", torch.float32 if t.is_floating_point() else t.dtype, copy=True)
            memo[id(t)] = torch.nn.Parameter(c, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else c
    return copy.deepcopy(module, memo)


def merge_lora_copy(peft_model, merged_dtype: torch.dtype | str = torch.float32,
                    max_update_error: float = 0.01) -> tuple[torch.nn.Module, dict]:
    """The policy's merged weights in a copy: base + ``ΔW`` computed in float32, on the CPU.

    A copy of ``peft_model`` made on the CPU in float32 (base and adapter; :func:`cpu_float32_copy`, no
    copy on the model's device) is merged with peft's ``merge_and_unload``; the copy is then cast to ``merged_dtype`` if that keeps the update
    (:func:`update_fidelity`). ``peft_model`` itself is not modified.

    Args:
        peft_model: a ``peft.PeftModel`` with LoRA adapters (e.g. a bf16 base with float32 adapters).
        merged_dtype: dtype of the returned weights (float32 default).
        max_update_error: largest accepted relative error of the update when ``merged_dtype`` is
            narrower than float32.

    Returns:
        ``(merged model, facts)``: the base model's class with merged weights, and the dict recorded
        as ``config.json``'s ``maskrl_lora`` -- ``adapter`` (folder name), ``base_dtype``,
        ``merged_dtype``, ``adapted_entries``, ``equal_to_base``, ``update_rel_error``.

    Raises:
        LossyMergeError: rounding to ``merged_dtype`` leaves an update error above ``max_update_error``.
        ValueError: an unknown ``merged_dtype``, or a model without LoRA layers.
    """
    from maskrl.models.dtypes import parse_dtype

    dtype = parse_dtype(merged_dtype)
    layers = _lora_layers(peft_model)
    if not layers:
        raise ValueError("merge_lora_copy: the peft model has no LoRA layers")
    base_dtype = layers[0][1].get_base_layer().weight.dtype
    merged = cpu_float32_copy(peft_model).merge_and_unload()
    fidelity = update_fidelity(peft_model, merged, dtype)
    if dtype != torch.float32:
        if fidelity["update_rel_error"] > max_update_error:
            raise LossyMergeError(
                f"save_model: merging this LoRA policy into {_name(dtype)} weights would lose its update: "
                f"{fidelity['equal_to_base']:.1%} of the {fidelity['adapted_entries']} adapted weight entries would "
                f"equal the base, and the exported update would have relative error "
                f"{fidelity['update_rel_error']:.3g} against the adapter's ΔW (max_update_error={max_update_error}). "
                "Save with merged_dtype=float32 (the default), or keep the adapter alone (merge_lora=False)")
        merged = merged.to(dtype)
    return merged, {"adapter": ADAPTER_DIR, "base_dtype": _name(base_dtype), "merged_dtype": _name(dtype), **fidelity}


#: entries per row slice of :func:`update_fidelity`'s float64 work (32 MiB a float64 copy)
FIDELITY_SLICE = 2**22


def update_fidelity(peft_model, merged: torch.nn.Module | dict[str, torch.Tensor],
                    dtype: torch.dtype | None = None) -> dict:
    """How much of a LoRA adapter's update a merged model holds, over every adapted weight.

    With ``W`` the live base weight, ``ΔW = Σ_active (α / r) B A`` the adapter's update (peft's
    ``get_delta_weight``) and ``W'`` the merged weight (rounded to ``dtype`` when given), all in
    float64:

    * ``equal_to_base``: fraction of entries with ``W' == W`` (an update rounded away);
    * ``update_rel_error``: ``sqrt(Σ ||(W' − W) − ΔW||²) / sqrt(Σ ||ΔW||²)`` (0: the update is held;
      1: it is lost; 0 when ``ΔW`` is all zero and the weights equal);
    * ``adapted_entries``: the number of entries compared.

    Args:
        peft_model: the live ``peft.PeftModel`` (its base weights are ``W``).
        merged: the merged model (module names of the base model) or its ``state_dict``-like
            mapping ``"<module>.weight" -> [out, in]`` tensor.
        dtype: round ``W'`` to this dtype first (what saving in it would keep); ``None``: as is.

    Returns:
        ``{"adapted_entries": int, "equal_to_base": float, "update_rel_error": float}``.

    Raises:
        KeyError: ``merged`` lacks an adapted weight (named).
    """
    weights = merged if isinstance(merged, dict) else None
    entries = equal = 0
    err2 = norm2 = 0.0
    with torch.no_grad():
        for name, layer in _lora_layers(peft_model):
            key = f"{name}.weight"
            if weights is not None:
                if key not in weights:
                    raise KeyError(f"update_fidelity: the merged weights lack {key!r}")
                out = weights[key]
            else:
                out = merged.get_submodule(name).weight
            base = layer.get_base_layer().weight.detach()
            deltas = [layer.get_delta_weight(a).detach() for a in _active(layer)]
            rows = max(1, FIDELITY_SLICE // max(1, base[0].numel()))  # float64 work in row slices, not whole copies
            for r in range(0, base.shape[0], rows):
                o = out[r:r + rows].detach()
                o = (o.to(dtype) if dtype is not None else o).cpu().double()
                b = base[r:r + rows].cpu().double()
                d = torch.zeros_like(b)
                for dw in deltas:
                    d += dw[r:r + rows].cpu().double()
                equal += int((o == b).sum())
                err2 += float(((o - b) - d).pow(2).sum())
                norm2 += float(d.pow(2).sum())
            entries += base.numel()
    rel = (err2 / norm2) ** 0.5 if norm2 > 0 else (0.0 if err2 == 0 else float("inf"))
    return {"adapted_entries": entries, "equal_to_base": equal / max(1, entries), "update_rel_error": rel}


def base_plus_adapter(merged: ModelAdapter, adapter_dir: str | os.PathLike, dtype: torch.dtype,
                      device: str | torch.device | None = None) -> ModelAdapter:
    """A LoRA export as its training policy: base weights in ``dtype`` plus the float32 adapter.

    ``merged`` is the export loaded in float32 (``W' = W + ΔW``, :func:`save_model`). The adapter in
    ``adapter_dir`` is attached with ``peft.PeftModel.from_pretrained``; each adapted weight becomes
    ``W' − ΔW`` (float32) and every base parameter and persistent floating buffer (LLaDA2's router
    ``expert_bias``, which the family's checkpoints store in the model's dtype and its code casts with the
    model, as a direct load in ``dtype`` does) is cast to ``dtype`` -- the training base again
    (the float32 round trip is far inside half a bf16 step, so a bf16 base comes back bit for bit,
    except a weight below ~2^-15 of its own update, which float32's ``W + ΔW`` could not hold: it comes
    back within a float32 step of the update; docs/ecosystem.md) --
    while the LoRA matrices stay float32, as :func:`maskrl.models.apply_lora` keeps them. The forward
    is then the live policy's: bf16 base matmuls plus the float32 LoRA branch.

    Args:
        merged: the float32 load of the export folder (CPU).
        adapter_dir: its ``adapter/`` folder (peft's ``adapter_config.json`` + weights).
        dtype: the base dtype to rebuild (``torch.bfloat16`` for 7-8B models).
        device: where the result goes (``None``: CPU).

    Returns:
        A :class:`ModelAdapter` like ``merged`` whose ``model`` is a ``peft.PeftModel`` (eval mode;
        :meth:`ModelAdapter.reference` gives the base alone).

    Raises:
        FileNotFoundError: no ``adapter_config.json`` in ``adapter_dir``.
        NotImplementedError: an adapter with a LoRA variant (DoRA, ...) whose update is not ``ΔW``.
    """
    import dataclasses

    from peft import PeftConfig, PeftModel

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise FileNotFoundError(f"no adapter_config.json in {str(adapter_dir)!r}: the LoRA export's adapter is "
                                "missing, so its base cannot be rebuilt; load it with dtype=float32")
    config = PeftConfig.from_pretrained(adapter_dir)
    if getattr(config, "use_dora", False):
        raise NotImplementedError(f"{adapter_dir}: a DoRA adapter cannot be taken back out of merged weights")
    model = PeftModel.from_pretrained(merged.model, adapter_dir, is_trainable=False)
    lora_params: set[int] = set()
    with torch.no_grad():
        for _, layer in _lora_layers(model):
            base = layer.get_base_layer()
            for a in _active(layer):
                base.weight -= layer.get_delta_weight(a).to(base.weight.dtype)
            lora_params |= {id(p) for p in layer.parameters()} - {id(p) for p in base.parameters()}
        for p in model.parameters():
            p.data = p.data.to(torch.float32 if id(p) in lora_params else dtype)
        saved = model.state_dict().keys()  # persistent buffers (LLaDA2's expert_bias) follow dtype, as in a direct load
        for name, b in model.named_buffers():
            if b.is_floating_point() and name in saved:
                b.data = b.data.to(dtype)
    model.to(device or "cpu").eval()
    return dataclasses.replace(merged, model=model)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _facts(adapter: ModelAdapter) -> dict:
    return {"mask_token_id": int(adapter.mask_id), "maskrl_eos_id": int(adapter.eos_id),
            "maskrl_pad_id": int(adapter.pad_id), "maskrl_stop_ids": [int(s) for s in adapter.stop_ids],
            "maskrl_shift": bool(adapter.shift), "maskrl_attention": adapter.attention,
            "maskrl_loader": "maskrl.models.load"} | (
        {} if adapter.block_size is None else {"maskrl_block_size": int(adapter.block_size)})


def family_named(name: str):
    """The registered family called ``name`` (:data:`maskrl.models.families.FAMILIES`), or the base
    :class:`~maskrl.models.families.Family` (maskrl's own layout) for a name no family has."""
    from maskrl.models.families import FAMILIES, Family

    return FAMILIES.get(name)() if name in FAMILIES else Family()


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
        family: the adapter's family (``llada``, ``dream``, ``sdar``, ...; how to load it).

    Returns:
        The path of the card.
    """
    import yaml

    folder = Path(folder)
    how = family_named(family or "").how_to_load() or (
        "`maskrl.models.load(folder)` only: this is a bidirectional masked-diffusion "
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
