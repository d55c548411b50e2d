"""How :meth:`~maskrl.models.adapter.ModelAdapter.decoder_forward` hands keys/values and the attention mask to a
transformers decoder: the in-place cache layer of the prefix / dual / block caches, and the unmasked
bidirectional call (docs/sampler.md, "Speed").

* :func:`in_place_layer_class`: a ``transformers`` cache layer over preallocated keys/values whose public
  ``update`` writes the window's fresh keys/values in place. When every row writes the same run of adjacent
  columns (the dual cache's window, laid out last), it writes that slice with one ``copy_`` instead of an
  index ``scatter_``: the same values land in the same places.
* :func:`unmasked_bidirectional`: whether a forward may pass no attention mask at all and transformers'
  public ``is_causal=False`` keyword (``TransformersKwargs``: "set to False to enable bi-directional
  attention") instead of an all-zero additive ``[N, 1, Q, K]`` mask. transformers then builds no mask
  (``create_bidirectional_mask`` skips an all-valid one) and SDPA runs without one. Only for decoder classes
  whose ``forward`` is known to honour the keyword (:data:`HONOURS_IS_CAUSAL`, each checked against the
  4-D-mask forward by ``tests/test_unmasked_attention.py``): anywhere else a missing mask could mean a
  causal one, so the 4-D mask stays.
"""
from __future__ import annotations

import functools

import torch

#: transformers decoder classes (``get_decoder()``) whose ``forward`` takes ``is_causal=False`` with no mask
#: as full bidirectional attention in transformers 5.x (``merge_with_config_defaults`` sets
#: ``config.is_causal`` for the mask builder and passes the keyword on to the attention function)
HONOURS_IS_CAUSAL = ("LlamaModel", "Qwen2Model")


def unmasked_bidirectional(decoder: torch.nn.Module, key_mask: torch.Tensor, block_model: bool) -> bool:
    """True when a bidirectional forward of ``decoder`` over keys ``key_mask [N, K]`` (bool) may run with no
    attention mask and ``is_causal=False``: every key valid, no block-causal structure (``block_model``
    False), and a decoder class in :data:`HONOURS_IS_CAUSAL` running transformers' SDPA attention. A key mask
    on the meta device (the planner's counts) keeps the 4-D mask: its values are unknown."""
    if block_model or type(decoder).__name__ not in HONOURS_IS_CAUSAL:
        return False
    if getattr(getattr(decoder, "config", None), "_attn_implementation", None) != "sdpa":
        return False
    return not key_mask.is_meta and bool(key_mask.all())  # meta (the planner's counts): values unknown


def _tail_start(cols: torch.Tensor, n_keys: int) -> int | None:
    """The first column when ``cols [N, Q]`` is ``n_keys - Q .. n_keys - 1`` in every row (a window laid out
    last), else ``None``."""
    if cols.is_meta:
        return None
    q = cols.shape[-1]
    tail = torch.arange(n_keys - q, n_keys, device=cols.device)
    return n_keys - q if bool((cols == tail).all()) else None


@functools.cache
def in_place_layer_class() -> type:
    """The cache layer class of :meth:`~maskrl.models.adapter.ModelAdapter.decoder_forward`'s ``write_at``
    (built on first use: transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class InPlaceLayer(DynamicLayer):
        """A cache layer over preallocated keys/values ``[N, H, K, D]`` whose ``update`` writes the new ones
        in place over columns ``cols [N, Q]`` and returns the whole buffers: no copy of the cache (Fast-dLLM's
        dual cache writes the block's fresh keys over its cached ones the same way). ``tail``: the first
        column when ``cols`` are the last ``Q`` columns of every row (:func:`_tail_start`, computed once per
        forward by the caller), written as one slice."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, cols: torch.Tensor,
                     tail: int | None = None) -> None:
            super().__init__()
            self.keys, self.values, self.cols, self.tail, self.is_initialized = keys, values, cols, tail, True
            self.device = keys.device

        def update(self, key_states, value_states, *args, **kwargs):
            if self.tail is not None:
                self.keys[:, :, self.tail:].copy_(key_states)
                self.values[:, :, self.tail:].copy_(value_states)
                return self.keys, self.values
            idx = self.cols[:, None, :, None].expand(-1, key_states.shape[1], -1, key_states.shape[-1])
            self.keys.scatter_(2, idx, key_states)
            self.values.scatter_(2, idx, value_states)
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.keys.shape[-2] - self.cols.shape[-1]

    return InPlaceLayer


def in_place_cache(past: list[tuple[torch.Tensor, torch.Tensor]], write_at: torch.Tensor):
    """A ``transformers.Cache`` of :func:`in_place_layer_class` layers over ``past`` (per layer ``[N, H, K, D]``
    keys/values) writing over columns ``write_at [N, Q]``."""
    from transformers import Cache

    tail = _tail_start(write_at, past[0][0].shape[-2])
    layer = in_place_layer_class()
    return Cache(layers=[layer(k, v, write_at, tail) for k, v in past])
