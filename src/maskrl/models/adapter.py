"""Model-family adapter: the one object the sampler, likelihood estimators and trainer talk to.

It owns the special token ids (mask / eos / pad), the logit shift of the family (docs/spec.md §1.1: none for
LLaDA-style models, one position for Dream-style ones) and the bidirectional forward. Every caller
sees position-aligned logits: ``logits[:, i]`` predicts the token at position ``i``.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from maskrl.models.attention import in_place_cache, unmasked_bidirectional


def bidirectional_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4-D attention mask letting every query attend to every valid key.

    Args:
        attention_mask: ``[N, T]`` bool/int, True (1) on real tokens, False on padding.
        dtype: float dtype of the model's activations.

    Returns:
        ``[N, 1, 1, T]`` tensor of ``dtype`` (broadcast over heads and queries): 0 where attending is
        allowed, ``finfo.min`` on padded keys. Given as-is to a transformers decoder (which then
        applies no causal mask). Memory is ``N·T``, not ``N·T²``: the same for every query.
    """
    keep = attention_mask.bool()[:, None, None, :]  # [N, 1, 1, T]
    out = torch.zeros(keep.shape, dtype=dtype, device=attention_mask.device)
    return out.masked_fill(~keep, torch.finfo(dtype).min)


def block_index(position_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[N, T]`` long block number of each position of a block-diffusion model (SDAR / TraDo, Fast-dLLM v2,
    LLaDA2.x): ``position // block_size``, so the prompt is split into blocks from its first real token
    (position 0) and a partial last prompt block is shared with the first generated tokens.

    Args:
        position_ids: ``[N, T]`` long RoPE positions (0 at each row's first real token, :meth:`ModelAdapter.position_ids`).
        block_size: tokens per block (>= 1).
    """
    return torch.div(position_ids, block_size, rounding_mode="floor")


def block_causal_mask(attention_mask: torch.Tensor, block_size: int, dtype: torch.dtype,
                      position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Additive 4-D attention mask of a block-diffusion model: bidirectional inside a block, causal across
    blocks (query ``i`` attends key ``j`` iff ``block(j) <= block(i)`` and ``j`` is a real token).

    Args:
        attention_mask: ``[N, T]`` bool/int, True (1) on real tokens (left padding allowed).
        block_size: tokens per block.
        dtype: float dtype of the model's activations.
        position_ids: ``[N, T]`` long positions (default: 0 at each row's first real token).

    Returns:
        ``[N, 1, T, T]`` tensor of ``dtype``: 0 where attending is allowed, ``finfo.min`` elsewhere.
    """
    keep = attention_mask.bool()
    if position_ids is None:
        position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)
    blocks = block_index(position_ids, block_size)  # [N, T]
    allowed = (blocks[:, None, :] <= blocks[:, :, None]) & keep[:, None, :]  # [N, T(query), T(key)]
    out = torch.zeros(allowed.shape, dtype=dtype, device=attention_mask.device)
    return out.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def _cache_keyword(forward: Any) -> str:
    """The name of a decoder ``forward``'s cache argument: ``cache`` (transformers >= 5.2x) or
    ``past_key_values`` (deprecated there). Looked up once per function (``inspect.signature`` on every
    forward call costs more than the small decoders' window forwards can afford)."""
    func = getattr(forward, "__func__", forward)
    try:
        return _cache_keyword_of(func)
    except TypeError:  # an unhashable callable: looked up each time
        return _cache_keyword_of.__wrapped__(func)


@functools.lru_cache(maxsize=64)
def _cache_keyword_of(func: Any) -> str:
    return "cache" if "cache" in inspect.signature(func).parameters else "past_key_values"


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[target]`` in float32, without materialising the log-softmax.

    Args:
        logits: ``[..., V]`` any float dtype.
        targets: ``[...]`` long.
    Returns:
        ``[...]`` float32.
    """
    logits = logits.float()
    return logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


@dataclass
class ModelAdapter:
    """A masked diffusion LM behind one interface (docs/spec.md §1.1).

    Attributes:
        model: a transformers model (optionally wrapped by peft / accelerate) returning ``.logits``.
        mask_id: id of the ``[M]`` token.
        eos_id: id that ends a completion.
        pad_id: id used for padding.
        shift: True for Dream-style models whose logits at ``i`` predict token ``i+1``.
        family: ``"llada"``, ``"dream"``, ``"masked_lm"`` or ``"tiny"`` (informational).
        attention: ``"4d"`` to pass an all-attend 4-D mask (decoder classes made bidirectional) or
            ``"2d"`` for models that are bidirectional by construction (``*ForMaskedLM``).
        tokenizer: optional tokenizer (decode, chat template). One without a pad token is given
            :attr:`pad_id` as its pad token (``tokenizer.pad_token_id = pad_id``), so that prompt
            batches pad with the model's own pad id.
        stop_ids: extra ids that also end a completion (e.g. LLaDA's end-of-turn 126348).
        block_size: tokens per block of a block-diffusion model (SDAR / TraDo, Fast-dLLM v2, LLaDA2.x):
            attention is bidirectional inside a block and causal across blocks (:func:`block_causal_mask`);
            ``None`` (default): full bidirectional attention (LLaDA, Dream).
        logits_width: output-layer width that code bounding the memory of chunked ``[.., V]`` logits
            assumes (:attr:`logits_vocab`); ``None`` (default): the model config's ``vocab_size``.
            ``maskrl plan``'s narrow stand-in sets the full model's, so that it splits its forwards as
            the full model does (:func:`maskrl.credit.rldf.state_chunk_rows`).

    Raises:
        ValueError: at construction, on a special-id collision (:meth:`check_special_ids`), or a
            tokenizer without a pad token whose vocabulary has no entry for :attr:`pad_id`.
    """

    model: Any
    mask_id: int
    eos_id: int
    pad_id: int
    shift: bool = False
    family: str = "tiny"
    attention: str = "4d"
    tokenizer: Any = None
    stop_ids: tuple[int, ...] = field(default_factory=tuple)
    logits_width: int | None = None
    block_size: int | None = None

    def __post_init__(self) -> None:
        if self.block_size is not None and (int(self.block_size) < 1 or self.attention != "4d"):
            raise ValueError(f"block_size {self.block_size!r} needs a positive size and attention='4d' "
                             f"(this adapter has attention={self.attention!r})")
        self.check_special_ids()
        tok = self.tokenizer
        if tok is not None and getattr(tok, "pad_token_id", 0) is None:  # a tokenizer without a pad token
            tok.pad_token_id = self.pad_id
            if getattr(tok, "pad_token_id", None) is None:
                raise ValueError(f"the tokenizer has no pad token and no entry for the model's pad id {self.pad_id} "
                                 "(pad_id): set tokenizer.pad_token, or pass a pad_id of the tokenizer")

    def check_special_ids(self) -> None:
        """Refuse special ids that collide (docs/spec.md §1.1): the ``[M]`` id must differ from ``eos_id``,
        ``pad_id``, every stop id and the tokenizer's pad id (with ``mask = eos`` a completion could
        never end; with ``mask = pad`` padding would read as masked positions), and ``eos_id`` must
        have a tokenizer entry (ids without one are never committed, :attr:`token_count`; a negative
        ``eos_id`` is no id, and then no completion ends early). ``eos_id == pad_id`` is allowed
        (LLaDA and Dream pad with eos).

        Raises:
            ValueError: naming the colliding fields and their id (or a ``None`` id).
        """
        for name in ("mask_id", "eos_id", "pad_id"):
            if getattr(self, name) is None:
                raise ValueError(f"ModelAdapter: {name} is None; pass the model's {name}")
        names = {"eos_id": self.eos_id, "pad_id": self.pad_id}
        names.update({f"stop_ids[{i}]": s for i, s in enumerate(self.stop_ids)})
        tok_pad = getattr(self.tokenizer, "pad_token_id", None) if self.tokenizer is not None else None
        if tok_pad is not None:
            names["the tokenizer's pad_token_id"] = tok_pad
        same = [name for name, value in names.items() if int(value) == int(self.mask_id)]
        if same:
            raise ValueError(f"mask_id {self.mask_id} collides with {', '.join(same)}: the [M] id must differ from "
                             "every eos, stop and pad id (pass mask_id / eos_id / pad_id to fix the ids)")
        count = self.token_count
        if count is not None and int(self.eos_id) >= count:
            raise ValueError(f"eos_id {self.eos_id} has no tokenizer entry (the tokenizer's ids are 0 .. {count - 1}): "
                             "a completion could never end; pass eos_id")

    @property
    def token_count(self) -> int | None:
        """Ids with a tokenizer entry: one past the largest id of the tokenizer's vocabulary
        (``get_vocab()``, added tokens included; else ``len(tokenizer)``), ``None`` without a
        tokenizer (or one that says neither). Output-layer rows at ids ``>= token_count`` -- the
        padded rows of Qwen2-based models such as Dream-7B, which has a few hundred more output rows
        than tokenizer ids -- are no token: never a sampler candidate (docs/spec.md §1.2)."""
        tok = self.tokenizer
        if tok is None:
            return None
        vocab = getattr(tok, "get_vocab", None)
        if callable(vocab):
            ids = vocab().values()
            return max(ids) + 1 if ids else 0
        return len(tok) if hasattr(tok, "__len__") else None

    @property
    def logits_vocab(self) -> int:
        """Width V of the output layer's logits for memory bounds: :attr:`logits_width`, else the model
        config's ``vocab_size``, else 1."""
        if self.logits_width is not None:
            return int(self.logits_width)
        return int(getattr(getattr(self.model, "config", None), "vocab_size", None) or 1)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _raw_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    layout: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The model's own output (``.logits``) of a full forward (all-attend, or block-causal when
        :attr:`block_size` is set), before any re-alignment; ``layout = (mask [N, 1, T, T], position_ids
        [N, T])`` replaces both (``attention_mask`` is then not read)."""
        if layout is not None:
            out = self.model(input_ids=input_ids, attention_mask=layout[0].to(self.dtype), position_ids=layout[1],
                             use_cache=False)
            return out.logits if hasattr(out, "logits") else out[0]
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        attention_mask = attention_mask.bool()
        if self.attention == "4d":
            positions = self.position_ids(attention_mask)
            mask = (bidirectional_mask(attention_mask, self.dtype) if self.block_size is None
                    else block_causal_mask(attention_mask, self.block_size, self.dtype, positions))
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False)
        else:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask.long())
        return out.logits if hasattr(out, "logits") else out[0]

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Position-aligned logits of a full-attention forward.

        Args:
            input_ids: ``[N, T]`` long; masked positions hold :attr:`mask_id`.
            attention_mask: ``[N, T]`` bool, True on real tokens (``None``: all real).

        Returns:
            ``[N, T, V]`` logits in the model's dtype; ``[:, i]`` predicts the token at ``i``.
        """
        logits = self._raw_logits(input_ids, attention_mask)
        if self.shift:
            # Dream: logits[i] predicts token i+1; re-align so that position i's row predicts i.
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits

    def output_layer(self) -> torch.nn.Module | None:
        """The model's output layer (``get_output_embeddings()`` of the unwrapped model), or ``None``."""
        get = getattr(self._unwrapped(), "get_output_embeddings", None)
        return get() if callable(get) else None

    def _unwrapped(self) -> torch.nn.Module:
        """``accelerate``'s ``extract_model_from_parallel(self.model)``, looked up again only when :attr:`model`
        is another object (the look-up asks the import system whether DeepSpeed is installed: ~2 ms a call,
        once per sampler step otherwise)."""
        from accelerate.utils import extract_model_from_parallel

        memo = self.__dict__.get("_unwrapped_memo")
        if memo is None or memo[0] is not self.model:
            memo = self.__dict__["_unwrapped_memo"] = (self.model, extract_model_from_parallel(self.model))
        return memo[1]

    def log_probs_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, rows: torch.Tensor,
                     cols: torch.Tensor, targets: torch.Tensor,
                     layout: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``log p_θ(targets[m] | input_ids[rows[m]], position cols[m])`` for M chosen positions only.

        The transformer runs on the whole ``[R, T]`` input, but the output layer is applied only to
        the hidden states of the M positions asked for (a forward pre-hook on
        :meth:`output_layer` selects them, so the call still goes through the model's -- and any
        DDP / FSDP wrapper's -- own ``forward``). No ``[R, T, V]`` logits or log-softmax are built:
        memory for the scores is ``M·V`` (docs/architecture.md, "score only scored positions").

        Args:
            input_ids: ``[R, T]`` long.
            attention_mask: ``[R, T]`` bool, True on real tokens (``None``: all real).
            rows: ``[M]`` long, row of each scored position.
            cols: ``[M]`` long, position (0..T-1, in the full sequence) of each scored token.
            targets: ``[M]`` long, the token ids to score.
            layout: ``(mask, position_ids)``: an additive 4-D attention mask ``[R, 1, T, T]`` and ``[R, T]``
                long RoPE positions used instead of the adapter's own (the doubled x_t ⊕ x_0 forward of a
                block-diffusion model, :mod:`maskrl.likelihood.blocks`); needs ``attention == "4d"`` and
                no logit shift.

        Returns:
            ``[M]`` float32 log-probabilities (the logit shift of the family is applied).

        Raises:
            ValueError: if ``rows``, ``cols`` and ``targets`` are not equal 1-D shapes, or a ``layout`` is
                given to a shifted or 2-D-attention model.
        """
        if layout is not None and (self.shift or self.attention != "4d"):
            raise ValueError(f"log_probs_at: a custom layout needs attention='4d' and no logit shift "
                             f"(this adapter: attention={self.attention!r}, shift={self.shift})")
        if not (rows.dim() == 1 and rows.shape == cols.shape == targets.shape):
            raise ValueError(f"rows {tuple(rows.shape)}, cols {tuple(cols.shape)} and targets "
                             f"{tuple(targets.shape)} must be equal [M] shapes")
        return token_log_probs(self._outputs_at(input_ids, attention_mask, rows, cols, layout), targets)

    def _logits_of(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   layout: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """:meth:`_raw_logits`, with ``layout`` passed only when given (the two-argument call otherwise)."""
        if layout is None:
            return self._raw_logits(input_ids, attention_mask)
        return self._raw_logits(input_ids, attention_mask, layout=layout)

    def _outputs_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, rows: torch.Tensor,
                    cols: torch.Tensor, layout: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``[M, V]`` position-aligned logits at ``(rows[m], cols[m])`` of a full forward, with the
        output layer applied to those M hidden states only (see :meth:`log_probs_at`)."""
        src = (cols - 1).clamp(min=0) if self.shift else cols  # Dream: the row left of i predicts i
        layer = self.output_layer()
        if layer is None:  # no separable output layer: full logits, then pick (correct, not lean)
            return self._logits_of(input_ids, attention_mask, layout)[rows, src]  # [M, V]
        flat = rows * input_ids.shape[1] + src  # [M] index into the [R*T] hidden states

        def select(_module, args):
            hidden = args[0]  # [R, T, H]
            return (hidden.reshape(-1, hidden.shape[-1])[flat],) + tuple(args[1:])

        handle = layer.register_forward_pre_hook(select)
        try:
            return self._logits_of(input_ids, attention_mask, layout)  # [M, V]
        finally:
            handle.remove()

    # ------------------------------------------------------------------ hidden states / cache
    @property
    def supports_cache(self) -> bool:
        """True when :meth:`decoder_forward` and the sampler's KV cache can be used: a transformers
        decoder class made bidirectional with the 4-D mask (public ``get_decoder`` and
        ``get_output_embeddings``). ``*ForMaskedLM`` models and bare wrapper modules are not."""
        return (self.attention == "4d" and callable(getattr(self.model, "get_decoder", None))
                and callable(getattr(self.model, "get_output_embeddings", None)))

    def position_ids(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[N, T]`` long RoPE positions of a left-padded row: 0 at its first real token."""
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)

    def decoder_forward(self, input_ids: torch.Tensor, key_mask: torch.Tensor, position_ids: torch.Tensor,
                        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                        return_kv: bool = False, write_at: torch.Tensor | None = None,
                        key_positions: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """Bidirectional forward of the decoder stack only (no output layer), optionally against cached
        keys/values (Fast-dLLM prefix / dual cache, docs/spec.md §1.2). The call enters through the model's own
        ``forward`` with the output layer handed zero positions (:meth:`_decoder_hidden`), so a wrapper's
        root hooks run (FSDP2).

        Every query attends to every valid key, cached or new. Cached keys carry the RoPE rotation of
        their own positions (applied when they were computed), so their order in the cache does not
        matter; ``key_mask`` must list the cached keys first, then the ``Q`` new ones.

        Args:
            input_ids: ``[N, Q]`` long, the query tokens.
            key_mask: ``[N, K + Q]`` bool, True on keys that may be attended (``K`` cached, then new).
            position_ids: ``[N, Q]`` long RoPE positions of the query tokens.
            past: per layer ``(keys, values)``, each ``[N, H, K, D]`` in the model's dtype; not modified
                (a fresh ``transformers.DynamicCache`` is built from them) unless ``write_at`` is given.
                ``None``: no cache (K = 0).
            return_kv: also return every layer's ``(keys, values)`` of the ``Q`` query tokens,
                ``[N, H, Q, D]`` (to fill a cache).
            write_at: ``[N, Q]`` long, or ``None``: the columns of ``past`` that the ``Q`` new keys/values are
                written over, **in place** (``past`` then holds every key attended, in its own order, and
                ``key_mask`` is ``[N, K]``): the window forwards of the prefix / dual cache, which recompute
                their columns at every step and so never read the cached ones there, and the block cache's
                (a block model then needs ``key_positions`` ``[N, K]``). No copy of ``past`` is made.
            key_positions: ``[N, K + Q]`` long positions of the keys (cached, then new). A block-diffusion
                model (:attr:`block_size`) lets query ``i`` attend key ``j`` only when ``j`` is valid and
                ``block(j) <= block(i)`` (:func:`block_causal_mask`); without a cache the keys are the
                queries (default: ``position_ids``); with one they must be given. Ignored by full-attention
                models.

        Returns:
            ``(hidden [N, Q, d] after the final norm, kv or None)``. ``hidden[:, i]`` is the input of
            the output layer at query ``i`` (apply :meth:`head`; mind :attr:`shift`).

        Raises:
            NotImplementedError: for ``attention == "2d"`` models.
            ValueError: a ``key_mask`` of the wrong shape; a block model given a cache without
                ``key_positions``.
        """
        from transformers import DynamicCache

        if not self.supports_cache:
            raise NotImplementedError(f"decoder_forward needs a 4-D-mask decoder model (attention='4d'), not {self.attention!r}")
        n, q = input_ids.shape
        k_len = 0 if past is None else past[0][0].shape[-2]
        keys = k_len if write_at is not None else k_len + q
        if key_mask.shape != (n, keys):
            raise ValueError(f"key_mask {tuple(key_mask.shape)} must be [N, {'K' if write_at is not None else 'K + Q'}]"
                             f" = [{n}, {keys}]")
        extra: dict[str, Any] = {}
        if unmasked_bidirectional(self.model.get_decoder(), key_mask, self.block_size is not None):
            mask, extra["is_causal"] = None, False  # every key valid: no mask built (models/attention.py)
        else:
            mask = torch.zeros((n, 1, q, keys), dtype=self.dtype, device=input_ids.device)
            mask = mask.masked_fill(~self._attends(key_mask, position_ids, past, write_at, key_positions)[:, None],
                                    torch.finfo(self.dtype).min)
        use_cache = past is not None or return_kv
        if write_at is not None:  # the preallocated buffers themselves, written in place
            cache = in_place_cache(list(past), write_at)
        elif use_cache:
            cache = DynamicCache(ddp_cache_data=[(k, v) for k, v in past]) if past is not None else DynamicCache()
        else:
            cache = None
        cache_kw = _cache_keyword(self.model.get_decoder().forward)
        hidden = self._decoder_hidden(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                                      use_cache=use_cache, **{cache_kw: cache}, **extra)
        kv = None
        if return_kv:
            kv = [(layer.keys[..., k_len:, :], layer.values[..., k_len:, :]) for layer in cache.layers]
        return hidden, kv

    def _attends(self, key_mask: torch.Tensor, position_ids: torch.Tensor, past: Any, write_at: Any,
                 key_positions: torch.Tensor | None) -> torch.Tensor:
        """``[N, 1 or Q, K]`` bool, which keys each query of :meth:`decoder_forward` attends: every valid key,
        or for a block model the valid keys of its own and earlier blocks."""
        keep = key_mask.bool()[:, None, :]
        if self.block_size is None:
            return keep
        if key_positions is None and past is not None:
            raise ValueError("a block-diffusion model's decoder_forward against a cache needs key_positions")
        kp = position_ids if key_positions is None else key_positions
        if kp.shape != key_mask.shape:
            raise ValueError(f"key_positions {tuple(kp.shape)} must be key_mask's shape {tuple(key_mask.shape)}")
        qb, kb = block_index(position_ids, self.block_size), block_index(kp, self.block_size)
        return keep & (kb[:, None, :] <= qb[:, :, None])

    def _decoder_hidden(self, **inputs: Any) -> torch.Tensor:
        """``[N, Q, d]``: the decoder stack's output (after the final norm) of a forward entered through the
        model's own ``forward``, not through ``get_decoder()`` alone.

        A forward pre-hook on :meth:`output_layer` takes the layer's input and hands it zero positions, so
        the call computes no logits (an ``[N, 0, V]`` output). Entering through the model runs the hooks a
        wrapper keeps on the root module only: FSDP2 initialises its root on the first forward through it
        (a first forward through a sub-module makes that sub-module's unit a root, and every later full
        forward then fails), and all-gathers the parameters the root unit holds itself in the root's
        pre-forward (under peft, accelerate's FSDP2 wrap leaves the final norm in the root unit). Every call
        therefore also runs the output layer once on zero positions, on every process alike.
        """
        layer = self.output_layer()
        if layer is None:  # no separable output layer: the decoder alone
            out = self.model.get_decoder()(**inputs)
            return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        taken: list[torch.Tensor] = []

        def take(_module, args):
            taken.append(args[0])  # [N, Q, d]
            return (args[0][..., :0, :],) + tuple(args[1:])

        handle = layer.register_forward_pre_hook(take)
        try:
            self.model(**inputs)
        finally:
            handle.remove()
        return taken[-1]

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer on chosen hidden states: ``[..., d] -> [..., V]`` logits (model dtype)."""
        return self.model.get_output_embeddings()(hidden)

    def logits_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """Position-aligned logits of a full bidirectional forward at chosen columns only: the output
        layer runs on ``N·K`` hidden states, never on all ``N·T`` (docs/spec.md §1.1; issue 12).

        Args:
            input_ids: ``[N, T]`` long; attention_mask: ``[N, T]`` bool.
            columns: ``[N, K]`` long, columns whose token is predicted (``>= 1`` for shifted models).

        Returns:
            ``[N, K, V]`` logits equal (within float tolerance) to ``logits(...)`` gathered at ``columns``.
        """
        n, k = columns.shape
        rows = torch.arange(n, device=columns.device)[:, None].expand(n, k).reshape(-1)
        return self._outputs_at(input_ids, attention_mask, rows, columns.reshape(-1)).view(n, k, -1)

    @property
    def max_positions(self) -> int | None:
        """Longest prompt + completion (tokens) the model is built for: its config's
        ``max_position_embeddings`` (LLaDA: ``max_sequence_length``, the tiny model: ``max_positions``);
        ``None`` when the config has none."""
        cfg = getattr(self.model, "config", None)
        value = getattr(cfg, "max_position_embeddings", None)
        return int(value) if isinstance(value, int) and value > 0 else None

    def is_stop(self, ids: torch.Tensor) -> torch.Tensor:
        """Bool tensor of ``ids``' shape: True where the id ends a completion (eos or a stop id)."""
        stop = ids == self.eos_id
        for s in self.stop_ids:
            stop = stop | (ids == s)
        return stop

    def completion_mask(self, ids: torch.Tensor) -> torch.Tensor:
        """``[N, L]`` bool: the valid part of each completion ``ids [N, L]`` -- up to and including its
        first stop token (the rest is padding for the loss and the reward)."""
        stop = self.is_stop(ids).long()
        return (stop.cumsum(-1) - stop) == 0

    @contextlib.contextmanager
    def reference(self) -> Iterator["ModelAdapter"]:
        """Context giving the reference policy when it shares weights with this one (peft: adapters
        disabled). Without peft there is nothing to disable and a separate frozen copy is needed;
        this then raises ``RuntimeError``."""
        disable = getattr(self.model, "disable_adapter", None)
        if disable is None:
            raise RuntimeError("reference(): the model has no peft adapters; keep a frozen copy instead")
        with disable():
            yield self
