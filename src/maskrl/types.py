"""Frozen records passed between the stages of an RL step (docs/architecture.md, "Records between stages").

Shape letters follow docs/spec.md: N sequences (= B prompts x G completions), P prompt length,
L completion length, T denoising steps.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch


@dataclass(frozen=True)
class Rollout:
    """How a batch of completions was denoised (docs/spec.md §1.2).

    Attributes:
        prompt_ids: ``[N, P]`` long, left-padded prompts.
        prompt_mask: ``[N, P]`` bool, True on real prompt tokens.
        completion_ids: ``[N, L]`` long, the sampled completion (every position committed).
        completion_mask: ``[N, L]`` bool, True on valid completion tokens: up to and including the
            first eos; positions after it are padding for the loss.
        commit_step: ``[N, L]`` long, the step index (0-based, over the whole rollout) at which each
            position was committed -- ``birth(i)`` in docs/spec.md §2.1. With token editing
            (``sampler.edit_threshold`` set) the step of the position's last write (docs/spec.md §1.2).
        commit_prob: ``[N, L]`` float32, the noise-free probability ``softmax(logits)[x_i]`` of the
            committed token at its commit step (with editing: of the final token at its last write).
        num_steps: ``[N]`` long, how many denoising steps each row took (T; equal for the fixed schedule).
        step_stats: per-step statistics requested by credit modules through sampler observers,
            e.g. ``{"dps_s_prev": [N, T], ...}``. Empty unless asked for.
        group_ids: ``[N]`` long, which prompt each completion answers (rows of one group share it).
        sampler: the :class:`maskrl.sampling.SamplerConfig` that produced this rollout.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    commit_step: torch.Tensor
    commit_prob: torch.Tensor
    num_steps: torch.Tensor
    group_ids: torch.Tensor
    sampler: Any = None
    step_stats: Mapping[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def gen_length(self) -> int:
        return self.completion_ids.shape[1]

    def to(self, device: torch.device | str) -> "Rollout":
        """Copy every tensor field (and tensors inside ``step_stats``) to ``device``."""

        def move(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return v.to(device)
            if isinstance(v, Mapping):
                return {k: move(x) for k, x in v.items()}
            return v

        return dataclasses.replace(self, **{f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def select(self, index: torch.Tensor | slice) -> "Rollout":
        """Rows ``index`` of every per-sequence tensor (``step_stats`` tensors with a leading N too)."""
        n = self.batch_size

        def pick(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n:
                return v[index]
            if isinstance(v, Mapping):
                return {k: pick(x) for k, x in v.items()}
            return v

        return dataclasses.replace(self, **{f.name: pick(getattr(self, f.name)) for f in dataclasses.fields(self)})


@dataclass(frozen=True)
class LossOutput:
    """What every objective returns.

    Attributes:
        loss: scalar tensor to back-propagate.
        metrics: detached scalar floats for logging (e.g. ``{"kl": ..., "clip_frac": ...}``).
    """

    loss: torch.Tensor
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LossTerm:
    """One weighted term of the RL loss (docs/architecture.md, "Loss terms").

    The trainer's ``optimize()`` sums ``weight · objective(ℓ, ℓ_old, ℓ_ref, advantages, mask)`` over
    its terms; each term has its own rows, likelihood estimator, objective and global normaliser
    (the count of its ``mask`` tokens, or of its sequences, over all processes). The base objective
    is the term named ``"base"``; credit modules add others (DiSPO's step loss, wd1+SML's second
    term).

    Attributes:
        name: metric namespace (``"base"``, ``"step"``, ...); unique within a step.
        weight: scalar weight of the term in the summed loss.
        rollout: the term's rows (``M`` sequences; may be built from the batch's states).
        advantages: ``[M, L]`` float32 per-token advantages.
        mask: ``[M, L]`` bool, the tokens the term trains on; only these are scored.
        objective: a registered objective instance (:mod:`maskrl.objectives`).
        likelihood: a registered likelihood instance (:mod:`maskrl.likelihood`).
    """

    name: str
    weight: float
    rollout: Rollout
    advantages: torch.Tensor
    mask: torch.Tensor
    objective: Any
    likelihood: Any

    def __post_init__(self) -> None:
        shape = tuple(self.rollout.completion_ids.shape)
        for field_name in ("advantages", "mask"):
            t = getattr(self, field_name)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"loss term {self.name!r}: {field_name} must be a tensor of the rollout's shape "
                                 f"{shape}, got {got}")
            if t.device != self.rollout.completion_ids.device:
                raise ValueError(f"loss term {self.name!r}: {field_name} is on {t.device}, the rollout on "
                                 f"{self.rollout.completion_ids.device}")
        if not self.advantages.is_floating_point():
            raise ValueError(f"loss term {self.name!r}: advantages must be floating point, got {self.advantages.dtype}")
