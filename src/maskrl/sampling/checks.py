"""What :func:`~maskrl.sampling.generate` refuses before it starts: shapes, a missing generator, caches the
model cannot take, and what block-diffusion models (``ModelAdapter.block_size``) need and only they take."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling.config import SamplerConfig
from maskrl.sampling.view import StepObserver, exact_observers


def check_call(adapter: ModelAdapter, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, config: SamplerConfig,
                generator: torch.Generator | None, observers: Sequence[StepObserver],
                all_done: Callable | None, ranks_max: Callable | None) -> None:
    """The errors :func:`~maskrl.sampling.generate` raises before it starts (see its docstring)."""
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must be equal [N, P]")
    if generator is None and (config.temperature > 0 or config.remasking in ("random", "origin") or config.alg_temp > 0):
        raise ValueError("generator is required when temperature > 0, alg_temp > 0 or remasking is 'random' or 'origin'")
    cached = config.cache != "none"
    if cached and not adapter.supports_cache:
        raise ValueError(f"cache={config.cache!r} needs a decoder model with the 4-D mask (attention='4d'); "
                         f"this adapter has attention={adapter.attention!r}: use cache='none'")
    if cached and all_done is not None and ranks_max is None:
        raise ValueError(f"cache={config.cache!r} with all_done (several processes) needs ranks_max: the number of "
                         "forwards per step varies with the rows' block starts (maskrl.trainer.ranks_max)")
    check_blocks(adapter, config)
    needs_exact = exact_observers(observers) if not config.exact_cache and config.observer_logits == "refuse" else []
    if needs_exact:
        raise ValueError(f"cache={config.cache!r} with observer_logits='refuse': the observers "
                         f"{needs_exact} need theta's exact logits, which a cached step does not "
                         "compute; use cache='none', or observer_logits='exact' (one extra full forward per cached "
                         "step they read)")
    if cached and adapter.shift and prompt_ids.shape[1] == 0:
        raise ValueError("a shifted (Dream-style) model with a cache needs at least one prompt column")


def check_blocks(adapter: ModelAdapter, config: SamplerConfig) -> None:
    """What a block-diffusion model (``adapter.block_size``) needs of the sampler, and what only it takes
    (:meth:`SamplerConfig.block_model_refusal`)."""
    why = config.block_model_refusal(adapter.block_size)
    if why:
        raise ValueError(why)
