"""What observers see of a sampler step (docs/architecture.md, Rollout ``step_stats``): the
:class:`StepView`, the :class:`StepObserver` protocol with the logit scopes observers declare, the
:class:`StepRecorder` helper, and :func:`observer_view`, which builds the view (with one extra full
forward where a cached step did not compute what an observer needs, :mod:`maskrl.sampling.cache`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Protocol, Sequence

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling.cache import Hidden, StepForwards, head_at

LOGIT_SCOPES = ("block", "masked", "completion")


class StepView:
    """What one denoising step computed, handed to observers (read-only).

    Logits are held only where they were computed: flat, one row per covered position. The covered
    positions of a row are its current block plus whatever observers asked for at this step
    (:class:`StepObserver`); ``covered`` says which, in the row-major order of ``covered.nonzero()``.
    Where a cache is on and an observer asks for positions the step's cached forward did not compute
    (``dual``: outside the block; ``prefix``: left of the block), or where an observer that declares
    ``exact_logits`` asks for a row whose step ran against the cache (``observer_logits="exact"``),
    the sampler runs one extra full forward for those rows at the pre-step state and their view
    logits (all covered positions, the block included) come from it: observers then see theta's
    exact logits, while the commits still use the cached ones (observing never changes the
    trajectory). ``exact`` marks such rows, and rows whose step was a full forward anyway
    (``cache="none"``, or a block's first step).

    Attributes:
        step: global step index (0-based). In the threshold schedule every unfinished row takes part
            in every step, so it is also the row's own step index.
        rows: ``[n]`` long, indices (into the full batch of N) of the rows decoded at this step.
        logits: ``[M, V]`` position-aligned completion logits before temperature, model dtype, at the
            ``M = covered.sum()`` covered positions; the ``[M]`` token's logit is ``-inf``, and so are
            those of the ids without a tokenizer entry (never candidates,
            :func:`~maskrl.sampling.commit.candidate_logits`).
        covered: ``[n, L]`` bool, completion positions whose logits are in :attr:`logits`.
        exact: ``[n]`` bool, True where the row's logits come from a full (uncached) forward.
        masked: ``[n, L]`` bool, completion positions holding ``[M]`` *before* this step.
        committed: ``[n, L]`` bool, positions committed at this step.
        tokens: ``[n, L]`` long, completion after this step's commits.
        block_start: ``[n]`` long, first position of each row's current block.
        block_length: b.
    """

    _CHUNK = 64  # rows of [*, V] converted to float32 at a time by the reductions

    def __init__(self, step, rows, logits, covered, exact, masked, committed, tokens, block_start, block_length):
        self.step, self.rows, self.logits, self.covered, self.exact = step, rows, logits, covered, exact
        self.masked, self.committed, self.tokens = masked, committed, tokens
        self.block_start, self.block_length = block_start, block_length

    @cached_property
    def log_probs(self) -> torch.Tensor:
        """``[M, V]`` float32 log-softmax of :attr:`logits` (covered positions only; computed on first
        access). Prefer the ``[n, L]`` reductions below, which never hold a float32 ``[M, V]`` copy."""
        return torch.log_softmax(self.logits.float(), dim=-1)

    def dense(self, values: torch.Tensor, fill: float = float("nan")) -> torch.Tensor:
        """Scatter per-covered-position ``values [M]`` into ``[n, L]`` (``fill`` elsewhere)."""
        out = torch.full(self.covered.shape, fill, dtype=values.dtype, device=values.device)
        out[self.covered] = values
        return out

    def _reduce(self, fn) -> torch.Tensor:
        parts = [fn(self.logits[i:i + self._CHUNK].float()) for i in range(0, self.logits.shape[0], self._CHUNK)]
        return torch.cat(parts) if parts else torch.zeros(0, device=self.logits.device)

    @cached_property
    def _logsumexp(self) -> torch.Tensor:  # [M] float32
        return self._reduce(lambda z: torch.logsumexp(z, -1))

    @cached_property
    def max_log_prob(self) -> torch.Tensor:
        """``[n, L]`` float32 ``max_v log p(v)`` per covered position (NaN elsewhere); computed once."""
        lmax = self._reduce(lambda z: z.max(-1).values)
        return self.dense(lmax - self._logsumexp)

    @cached_property
    def entropy(self) -> torch.Tensor:
        """``[n, L]`` float32 entropy ``-sum_v p log p`` in nats per covered position (NaN elsewhere)."""
        def ent(z):
            lp = torch.log_softmax(z, -1)
            return -(lp.exp() * lp.nan_to_num(neginf=0.0)).sum(-1)
        return self.dense(self._reduce(ent))

    def token_log_prob(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[n, L]`` float32 ``log p(tokens)`` per covered position (NaN elsewhere).

        Args:
            tokens: ``[n, L]`` long (e.g. :attr:`tokens`); only covered entries are read.
        """
        if tokens.shape != self.covered.shape:
            raise ValueError(f"tokens {tuple(tokens.shape)} must be [n, L] = {tuple(self.covered.shape)}")
        tok = tokens[self.covered]  # [M]
        z = self.logits.gather(-1, tok[:, None]).squeeze(-1).float()
        return self.dense(z - self._logsumexp)


class StepObserver(Protocol):
    """Collects per-step statistics during sampling (docs/architecture.md, Rollout ``step_stats``).

    Which logits an observer needs is declared by an optional attribute or method (default
    ``"block"``, which costs nothing extra):

    - ``logit_scope``: ``"block"`` (the current block), ``"masked"`` (every completion position still
      holding ``[M]`` before the step: DPS scope "all", docs/spec.md §2.1) or ``"completion"`` (all L);
    - or ``logit_positions(step, rows, masked, block_start) -> str | Tensor[n, L] bool``, asked before
      each step (e.g. DiSPO, docs/spec.md §4: ``"masked"`` at its chosen step only, ``"block"`` otherwise).

    Whether those logits must be theta's exact ones is declared by ``exact_logits`` (bool, default
    False): True for statistics defined on theta's distribution at the rollout state (DPS's δ, docs/spec.md
    §2.1; DiSPO's fillings, §4; RLDF/DTCA's commit probabilities, §1.5/§3). Under a cache, the
    sampler then gives the view of every row the observer asks for (a non-empty scope) exact logits,
    or refuses (:attr:`SamplerConfig.observer_logits`). Observers that only watch the sampler's own
    arithmetic (the non-finite guard) leave it False.
    """

    def on_step(self, view: StepView) -> None: ...

    def result(self) -> dict[str, torch.Tensor]:
        """Statistics to store in ``Rollout.step_stats`` (tensors with a leading N dimension)."""
        ...


class StepRecorder:
    """Collects one value per (row, step) from :class:`StepView` s and scatters them into ``[N, T]``.

    Works under both schedules: in the threshold schedule rows take different numbers of steps, and
    a row's entries fill columns ``0 .. num_steps[row] - 1``; later columns hold ``fill``.

    Example (inside an observer): ``self.rec.add(view, view.max_log_prob.nanmean(-1))`` in ``on_step``
    and ``{"x": self.rec.tensor(n_rows)}`` in ``result``.
    """

    def __init__(self) -> None:
        self._items: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def add(self, view: StepView, values: torch.Tensor) -> None:
        """Record ``values [n, ...]`` (one entry per row of ``view``) at step ``view.step``."""
        if values.shape[:1] != view.rows.shape:
            raise ValueError(f"values {tuple(values.shape)} must have a leading dim n = {view.rows.numel()}")
        self._items.append((view.step, view.rows, values.detach()))

    def tensor(self, n_rows: int, num_steps: int | None = None, fill: float = float("nan")) -> torch.Tensor:
        """``[N, T, ...]`` with ``T = num_steps`` (default: last recorded step + 1); ``fill`` where a
        row took no step. Raises ``ValueError`` when nothing was recorded and ``num_steps`` is None."""
        if not self._items:
            if num_steps is None:
                raise ValueError("StepRecorder.tensor: nothing recorded; pass num_steps")
            return torch.full((n_rows, num_steps), fill)
        t = num_steps if num_steps is not None else max(s for s, _, _ in self._items) + 1
        v0 = self._items[0][2]
        out = torch.full((n_rows, t, *v0.shape[1:]), fill, dtype=v0.dtype if v0.is_floating_point() else torch.float32,
                         device=v0.device)
        for s, rows, vals in self._items:
            if s < t:
                out[rows, s] = vals.to(out.dtype)
        return out


def _scope_mask(scope, masked: torch.Tensor, in_block: torch.Tensor) -> torch.Tensor:
    if isinstance(scope, torch.Tensor):
        if scope.shape != masked.shape or scope.dtype != torch.bool:
            raise ValueError(f"logit_positions must return a bool [n, L] = {tuple(masked.shape)} tensor, got "
                             f"{scope.dtype} {tuple(scope.shape)}")
        return scope
    if scope == "block":
        return in_block
    if scope == "masked":
        return masked
    if scope == "completion":
        return torch.ones_like(masked)
    raise ValueError(f"observer logit scope {scope!r} is not one of {LOGIT_SCOPES} (or a bool [n, L] tensor)")


def requested_positions(observers, step, rows, masked, in_block, start) -> tuple[torch.Tensor | None, torch.Tensor]:
    """What the observers ask for at one step, before any forward (:class:`StepObserver`).

    Args:
        observers: the step's observers; step: the global step index; rows: ``[n]`` long batch rows.
        masked: ``[n, L]`` bool positions holding ``[M]``; in_block: ``[n, L]`` bool current block;
        start: ``[n]`` long block starts.

    Returns:
        ``(req, exact)``: ``req`` the ``[n, L]`` bool union of the positions observers ask for, None
        when none lies beyond the block; ``exact`` ``[n]`` bool, the rows an observer declaring
        ``exact_logits`` asks for (its scope is not empty there).

    Raises:
        ValueError: an observer's scope is not a known name or a bool ``[n, L]`` tensor.
    """
    req = None
    exact = torch.zeros(masked.shape[0], dtype=torch.bool, device=masked.device)
    for obs in observers:
        fn = getattr(obs, "logit_positions", None)
        scope = fn(step, rows, masked, start) if callable(fn) else getattr(obs, "logit_scope", "block")
        m = _scope_mask(scope, masked, in_block)
        req = m if req is None else req | m
        if getattr(obs, "exact_logits", False):
            exact |= m.any(-1)
    if req is None or not (req & ~in_block).any():
        return None, exact
    return req, exact


def exact_observers(observers: Sequence[StepObserver]) -> list[str]:
    """Class names of the observers that declare ``exact_logits`` (see :class:`StepObserver`)."""
    return [type(o).__name__ for o in observers if getattr(o, "exact_logits", False)]


@dataclass(frozen=True)
class StepRows:
    """The rows one sampler step decodes, at their pre-step state.

    Attributes:
        index: global step index (0-based).
        rows: ``[n]`` long, indices into the batch of N.
        xr, ar: ``[n, P + L]`` tokens (long) and key validity (bool) before the step.
        masked: ``[n, L]`` bool, completion positions holding ``[M]`` before the step.
        start: ``[n]`` long, first position of each row's current block.
        end: ``[n]`` long, the end (exclusive) of each row's current block (a first block that shares the
            prompt's partial last block is shorter than b).
        pos: ``[n, b]`` long, the current block's positions.
        in_block: ``[n, L]`` bool, the current block.
        requested: ``[n, L]`` bool positions observers ask for, ``None`` when none lies beyond the block.
        wants_exact: ``[n]`` bool rows an ``exact_logits`` observer reads; ``None`` without observers.
    """

    index: int
    rows: torch.Tensor
    xr: torch.Tensor
    ar: torch.Tensor
    masked: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    pos: torch.Tensor
    in_block: torch.Tensor
    requested: torch.Tensor | None
    wants_exact: torch.Tensor | None

    def cover(self, inside: torch.Tensor | None) -> torch.Tensor:
        """``[n, L]`` bool positions the step's output layer runs on: the block, plus the requests of
        the rows whose requests lie inside their forward's window (``inside [n]``)."""
        if self.requested is None:
            return self.in_block
        return self.in_block | (self.requested & inside[:, None])


def observer_view(adapter: ModelAdapter, st: StepRows, plan: StepForwards, logits: torch.Tensor, cover: torch.Tensor,
                  committed: torch.Tensor, tokens: torch.Tensor, p_len: int, pos_ids: torch.Tensor | None,
                  block_length: int, to_candidates: Callable[[torch.Tensor], torch.Tensor]) -> StepView:
    """The :class:`StepView` of one step (see its docstring for what ``exact`` means).

    Rows in ``plan.redo`` (asked beyond their forward's window, or read by an ``exact_logits``
    observer on a cached step) get one extra full forward at the pre-step state, on their block and
    requests, with one output-layer call; the other rows' view logits are the step's own.

    Args:
        adapter: the model.
        st: the step's rows.
        plan: the step's forwards (:func:`~maskrl.sampling.cache.plan_forwards`).
        logits: ``[cover.sum(), V]`` the step's candidate logits at ``cover [n, L]``.
        committed: ``[n, L]`` bool positions committed at this step; tokens: ``[n, L]`` long after it.
        p_len: prompt columns P; pos_ids: ``[N, P + L]`` RoPE positions (needed when a row is redone).
        block_length: b.
        to_candidates: removes the never-valid ids from a ``[M, V]`` logit tensor, as for the step's
            own logits (:func:`~maskrl.sampling.commit.candidate_logits`).
    """
    view_logits, view_exact = logits, plan.full
    redo = plan.redo
    if redo is not None and redo.any():
        n, L = cover.shape
        out = redo.nonzero().squeeze(-1)
        fidx = cover.flatten().long().cumsum(0).view(n, L) - 1
        cover = st.in_block | st.requested if st.requested is not None else st.in_block
        h, _ = adapter.decoder_forward(st.xr[out], st.ar[out], pos_ids[st.rows[out]])
        extra = head_at(adapter, [Hidden(torch.arange(len(out), device=h.device), h,
                                         torch.zeros(len(out), dtype=torch.long, device=h.device))], cover[out], p_len)
        extra = to_candidates(extra)
        view_logits = logits.new_empty((int(cover.sum()), logits.shape[-1]))
        vidx = cover.flatten().long().cumsum(0).view(n, L) - 1
        keep_rows = ~redo[:, None] & cover
        view_logits[vidx[keep_rows]] = logits[fidx[keep_rows]]
        out_cover = torch.zeros_like(cover)
        out_cover[out] = cover[out]
        view_logits[vidx[out_cover]] = extra
        view_exact = plan.full.clone()
        view_exact[out] = True
    return StepView(st.index, st.rows, view_logits, cover, view_exact, st.masked, committed, tokens, st.start,
                    block_length)
