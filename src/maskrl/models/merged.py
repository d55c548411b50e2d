"""Sampling with the LoRA update folded into the weights, without touching what training reads (issue 49).

A peft LoRA forward runs every adapted linear layer twice -- the base matmul and the low-rank branch
``(x A) B · α/r`` -- which costs a rollout (dozens of no-grad forwards per RL step) +28 % per forward of
LLaDA's body on CPU against +7 % with the update merged (issue 49's profile). The rollout therefore runs
on a **merged copy** (:func:`merged_copy`): the LoRA layers' base weights are cloned, peft's public
``merge_and_unload`` folds ``ΔW = scale · B A`` into the clones, and every other tensor (embeddings,
norms, the output layer, buffers) is shared with the policy, not copied. The policy's trainable and
frozen tensors are never written: an in-place bf16 merge followed by an unmerge would round the base
(``(W + ΔW) − ΔW ≠ W`` in bf16), so it is never done.

What the copy computes. Each adapted weight of the copy is ``W + ΔW`` rounded once to the base's dtype
(peft's merge adds the float32 ``ΔW`` of float32 adapters into the weight in place: one rounding of the
exact sum). In float32 the merged forward equals the peft forward up to float32 rounding of the
re-associated sum ``x (W + ΔW)`` against ``x W + (x A) B · s``, so rollouts are token for token the same
unless two candidates tie to that precision (``tests/test_merged_sampling.py`` checks both). In bf16 the
rounding is that of a bf16 weight: an update smaller than half a bf16 step of its weight (a LoRA update
early in a run at the 8B recipes' learning rates) is rounded away in the copy, while the peft forward
adds the float32 branch to bf16 activations. The rollout policy then differs from θ by that rounding;
``rollout.mismatch_every`` measures the gap (``rollout/mismatch``) and ``rollout.merge_lora: false``
samples through the peft model instead.

Memory: one copy of the adapted layers' base weights in the model's dtype (for LLaDA-8B with
``all-linear`` LoRA: every linear of the 32 blocks, 6.98 B entries = 13.0 GiB in bf16), held during the
rollout only; ``maskrl plan`` adds it to the rollout phase's peak (``rollout_merged_copy``), and the
merge's passing peak above it (:func:`merge_transient_bytes`: float32 ``ΔW`` of the largest adapted matrix,
the cloned adapters) as ``rollout_merge_peak``.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from typing import Iterator

import torch

from maskrl.models.adapter import ModelAdapter

log = logging.getLogger(__name__)


def lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every LoRA layer (``peft.tuners.lora.LoraLayer``) of ``model``; ``[]`` for a model without peft
    LoRA adapters (or when peft is not installed)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return []
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def merged_copy(peft_model: torch.nn.Module) -> torch.nn.Module:
    """The base model with the active LoRA update merged, as a copy that shares every unadapted tensor.

    ``copy.deepcopy`` is given a ``memo`` mapping every parameter and buffer outside the LoRA layers to
    itself (so those are shared, not copied); the LoRA layers -- base weights and adapters -- are cloned,
    and peft's public ``merge_and_unload`` merges the clones and drops the adapters. ``peft_model`` is
    not modified (no tensor of it is written).

    Args:
        peft_model: a ``peft.PeftModel`` with LoRA adapters (any dtype, any single device).

    Returns:
        The unwrapped base model class (e.g. ``LlamaForCausalLM``), in ``peft_model``'s train/eval mode,
        whose adapted weights are ``W + scale · B A`` rounded to ``W``'s dtype.

    Raises:
        ValueError: ``peft_model`` has no LoRA layers.
    """
    layers = lora_layers(peft_model)
    if not layers:
        raise ValueError("merged_copy: the model has no peft LoRA layers (nothing to merge)")
    cloned = {id(t) for layer in layers for t in (*layer.parameters(), *layer.buffers())}
    memo = {id(t): t for t in (*peft_model.parameters(), *peft_model.buffers()) if id(t) not in cloned}
    with torch.no_grad():
        return copy.deepcopy(peft_model, memo).merge_and_unload()


def merged_copy_bytes(model: torch.nn.Module) -> int:
    """Bytes :func:`merged_copy` allocates for ``model``: the base weights (and biases) of its LoRA layers
    in their own dtype (the adapters it also clones are dropped by the merge). Works on the meta device."""
    total = 0
    for layer in lora_layers(model):
        base = layer.get_base_layer()
        total += sum(p.numel() * p.element_size() for p in base.parameters(recurse=False))
    return total


#: float32 ``[out, in]`` matrices peft's ``merge_and_unload`` holds at once while it merges one LoRA layer
#: (``B @ A``, its product with the scale, and the in-place ``W += ΔW`` of a bf16 ``W`` with a float32
#: ``ΔW``); measured with torch's CPU profiler on peft 0.21 (``tests/test_merged_sampling.py`` checks it)
MERGE_DELTA_COPIES = 3


def merge_transient_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """``(adapters, delta)``: bytes :func:`merged_copy` holds *above* :func:`merged_copy_bytes` at its
    peak, while peft merges the largest adapted layer -- ``adapters``: the cloned LoRA parameters (every
    ``lora_`` tensor of the LoRA layers, in its own dtype; dropped by the merge), ``delta``:
    :data:`MERGE_DELTA_COPIES` ``ΔW`` matrices of the largest adapted weight in the adapters' dtype
    (float32 here). Freed before the rollout's first forward. Works on the meta device; ``(0, 0)``
    without LoRA layers. The rollout peak of an 8B model at 1 layer missed 0.6 GiB without it (issue 48)."""
    layers = lora_layers(model)
    if not layers:
        return 0, 0
    adapters = sum(p.numel() * p.element_size() for layer in layers for n, p in layer.named_parameters()
                   if "lora_" in n)
    delta = 0
    for layer in layers:
        for b in layer.lora_B.values():
            delta = max(delta, layer.get_base_layer().weight.numel() * b.weight.element_size())
    return int(adapters), int(MERGE_DELTA_COPIES * delta)


def holds_whole_weights(model: torch.nn.Module) -> bool:
    """False when ``model``'s weights are sharded over processes, so that no process could merge a whole
    copy: FSDP2 (``DTensor`` parameters), FSDP1 (a ``FullyShardedDataParallel`` module inside) or DeepSpeed
    ZeRO-3 (parameters carrying ``ds_id``)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return False
    return not any(isinstance(p, DTensor) or hasattr(p, "ds_id") for p in model.parameters())


_warned: set[str] = set()


@contextlib.contextmanager
def sampling_policy(adapter: ModelAdapter, merge: bool = True) -> Iterator[ModelAdapter]:
    """The policy to sample from: ``adapter`` with its LoRA update merged into a copy (:func:`merged_copy`),
    freed when the block ends; ``adapter`` itself when ``merge`` is False, its model has no LoRA layers,
    or its weights are sharded over processes (:func:`holds_whole_weights`; logged once per process).

    Args:
        adapter: the policy (its ``model`` a ``peft.PeftModel`` for the merge to apply); not modified.
        merge: ``rollout.merge_lora`` / ``eval.merge_lora``.

    Yields:
        A :class:`ModelAdapter` with every field of ``adapter`` but ``model``.
    """
    if not merge or not lora_layers(adapter.model):
        yield adapter
        return
    if not holds_whole_weights(adapter.model):
        if "sharded" not in _warned:
            log.warning("merge_lora: the weights are sharded over processes (FSDP / DeepSpeed ZeRO-3); the rollout "
                        "samples through the peft model (no merged copy)")
            _warned.add("sharded")
        yield adapter
        return
    merged = dataclasses.replace(adapter, model=merged_copy(adapter.model))
    try:
        yield merged
    finally:
        del merged
