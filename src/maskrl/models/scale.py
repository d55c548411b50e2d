"""Helpers for training 7-8B masked diffusion models: LoRA, bf16, gradient checkpointing, chat prompts.

Precision policy (what we chose and why)
----------------------------------------
* **LoRA (recommended for 7-8B):** load the base with ``load(..., dtype=torch.bfloat16)``; the
  frozen base stays bf16 and :func:`apply_lora` keeps the trainable LoRA matrices in **float32**
  (``adapter_dtype``), so the optimizer updates fp32 master weights. peft casts the bf16
  activations to the LoRA weights' dtype inside each LoRA layer and the result back, so the
  forward needs no autocast. The reference policy is the same weights with the adapters disabled
  (:meth:`ModelAdapter.reference`), so no second copy of the base is held.
* **Full fine-tuning:** keep parameters in float32 (``load(..., dtype=torch.float32)``) and get
  bf16 compute from ``accelerate`` (``mixed_precision="bf16"``, autocast). Never update bf16
  weights directly at the learning rates of docs/spec.md §3 (1e-6): bf16 keeps ~3 significant digits, so
  such updates round to zero.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import torch

from maskrl.models.adapter import ModelAdapter


def apply_lora(adapter: ModelAdapter, rank: int = 16, alpha: float = 32.0, dropout: float = 0.0,
               target_modules: str | Sequence[str] = "all-linear",
               adapter_dtype: torch.dtype | None = torch.float32, seed: int = 0,
               experts: bool = False) -> ModelAdapter:
    """Wrap the adapter's model with LoRA adapters through ``peft.get_peft_model``.

    Only the LoRA matrices are trainable afterwards; every base parameter is frozen. The returned
    adapter's :meth:`~ModelAdapter.reference` context disables the adapters, giving the base model
    as the reference policy (KL terms of docs/spec.md §1.5) without a second copy of the weights. LoRA's
    ``B`` matrix starts at zero, so policy and reference agree until the first update.

    Args:
        adapter: a loaded :class:`ModelAdapter` (not already wrapped by peft). Its model is modified
            in place (peft injects the LoRA layers); use the returned adapter.
        rank: LoRA rank ``r``.
        alpha: LoRA scaling numerator (the update is scaled by ``alpha / rank``).
        dropout: dropout on the LoRA branch's input.
        target_modules: module names to adapt, or ``"all-linear"`` (peft: every linear layer except
            the output head): for Llama/Qwen2 that is ``q/k/v/o_proj`` and ``gate/up/down_proj``. On a
            model with routed experts held as linear layers (LLaDA2's ``mlp.experts.{e}.*_proj``),
            ``"all-linear"`` leaves those out unless ``experts`` (:func:`lora_linear_targets`).
        adapter_dtype: dtype of the trainable LoRA parameters (float32 master weights by default,
            also when the base is bf16); ``None`` leaves peft's choice.
        experts: with ``"all-linear"``, also adapt the routed experts (default False: attention, dense and
            shared-expert MLPs only; the router weight and expert bias are never linear layers).
        seed: seeds peft's random initialisation of the LoRA ``A`` matrices (through
            ``torch.random.fork_rng``, so the global RNG state is left untouched): the same seed gives
            the same adapter in every process and every run.

    Returns:
        A new :class:`ModelAdapter` sharing every field with ``adapter`` except ``model``, now a
        ``peft.PeftModel``.

    Raises:
        ValueError: the model already carries peft adapters, or ``rank`` < 1.
    """
    from peft import LoraConfig, get_peft_model

    if hasattr(adapter.model, "disable_adapter") or hasattr(adapter.model, "peft_config"):
        raise ValueError("apply_lora: the model already has peft adapters")
    if rank < 1:
        raise ValueError(f"apply_lora: rank must be >= 1, got {rank}")
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    if targets == "all-linear" and not experts:
        targets = lora_linear_targets(adapter.model) or targets
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
    with torch.random.fork_rng(devices=[]):  # peft draws A from the global RNG: seed it, leave it as it was
        torch.manual_seed(seed)
        model = get_peft_model(adapter.model, config)
    if adapter_dtype is not None:
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(adapter_dtype)
    return dataclasses.replace(adapter, model=model)


#: a routed expert's module path (``...mlp.experts.{e}...``): LLaDA2's experts are linear layers each
ROUTED_EXPERT = re.compile(r"\.experts\.\d+\.")


def lora_linear_targets(model: torch.nn.Module) -> list[str] | None:
    """Full names of ``model``'s linear layers except the output layer and routed experts
    (:data:`ROUTED_EXPERT`), or ``None`` when it has no routed expert held as a linear layer (then
    ``"all-linear"`` means what peft says)."""
    out_layer = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not out_layer]
    if not any(ROUTED_EXPERT.search(n) for n in names):
        return None
    return [n for n in names if not ROUTED_EXPERT.search(n)]


def enable_gradient_checkpointing(adapter: ModelAdapter, use_reentrant: bool = False) -> ModelAdapter:
    """Turn on activation checkpointing of every transformer layer (transformers' public API).

    Uses ``PreTrainedModel.activation_checkpointing_enable`` (``gradient_checkpointing_enable`` on
    transformers versions without it) on the (peft-unwrapped) base model and sets
    ``config.use_cache = False``. The adapter's forward already passes ``use_cache=False`` and its 4-D
    all-attend mask is an ordinary tensor argument of each layer, so the recomputation sees the same
    mask and gives the same gradients. As in transformers, checkpointing acts only while the model is
    in ``train()`` mode; the mode is left as it is.

    Args:
        adapter: the adapter (peft-wrapped or not); modified in place and returned.
        use_reentrant: ``torch.utils.checkpoint`` variant. The default non-reentrant one works with a
            frozen base (LoRA); with ``True`` the input embeddings are made to require grad
            (``enable_input_require_grads``) so LoRA gradients still flow.

    Raises:
        ValueError: the model class does not support gradient checkpointing.
    """
    model = adapter.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(base).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": use_reentrant}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x name
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # the older name, deprecated since
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if use_reentrant:
        base.enable_input_require_grads()
    base.config.use_cache = False
    return adapter


def chat_prompt(tokenizer: Any, user_text: str) -> str:
    """One user turn formatted with the tokenizer's chat template, ready for the completion.

    Applies ``tokenizer.apply_chat_template([{"role": "user", "content": user_text}],
    add_generation_prompt=True, tokenize=False)`` when the tokenizer has a chat template (LLaDA- and
    Dream-Instruct do); otherwise (the tiny character tokenizer, base models) returns ``user_text``
    unchanged. Returns a string; tokenize it with the same tokenizer (no special tokens added again
    if the template already has them).
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return user_text
    return tokenizer.apply_chat_template([{"role": "user", "content": user_text}],
                                         add_generation_prompt=True, tokenize=False)


def rl_train_mode(model: torch.nn.Module, dropout: bool = False) -> torch.nn.Module:
    """Put ``model`` in the mode of the policy's RL forward (the one with gradients).

    With ``dropout=False`` (the default, config ``train.dropout: false``) every module is put in
    ``eval()`` mode -- dropout of every kind off (``nn.Dropout``, LoRA dropout, the attention
    probabilities' functional dropout) -- except the layers with gradient checkpointing switched
    on, which keep ``training = True`` (non-recursively) because transformers checkpoints a layer only
    in training mode. θ then computes the same function as θ_old and the rollout policy (which run in
    ``eval()``), so the importance ratio is exactly 1 while the weights have not moved
    (issue 13 item 4). ``dropout=True`` is plain ``model.train()``.

    Returns ``model`` (modified in place).
    """
    if dropout:
        return model.train()
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.eval()
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            module.training = True
    return model
