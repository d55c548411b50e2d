"""The one sampler for rollout and evaluation (SPEC §1.2): LLaDA low-confidence remasking with a
fixed schedule, or Fast-dLLM's confidence threshold, block semi-autoregressive, batched.

It returns a :class:`~maskrl.types.Rollout` that records, for every completion position, the step
that committed it and the noise-free probability of the committed token. Credit modules that need
more per-step statistics (DPS's log-prob sums, DiSPO's branch fillings) pass *observers*: objects
called once per step with a :class:`StepView` of what the sampler computed anyway. Nothing extra is
computed when no observer asks for it, and the sampler's signature never changes.

Departures from the reference implementations, on purpose:
- the ``[M]`` token's own logit is excluded from candidates (it is never a valid output);
- Gumbel noise is drawn only for the current block's positions (float64), so memory is
  ``N·b·V`` per step rather than ``N·L·V``;
- in threshold mode each row advances through its blocks independently, so a row's trajectory is
  the same whether it is decoded alone or in a batch; ``steps`` is ignored there (a block ends when
  it has no masks, at most ``block_length`` steps).

Speed (issue 12):
- the output layer runs only on the positions a step can commit (the current block) plus the
  positions observers ask for (:attr:`StepObserver.logit_scope`); no ``[N, L, V]`` tensor is built;
- ``SamplerConfig.cache`` = ``"prefix"`` / ``"dual"``: Fast-dLLM's key/value caches (Wu et al. 2025,
  "Fast-dLLM", §3.1-3.2). At each block start (per row: threshold rows reach their next block at
  different steps, and each row is refreshed at its own block start) one full forward of that row
  fills its cache and gives that step's logits (so the first step of every block is exact). The
  block's later steps run, against that cache, the block and everything right of it (``prefix``) or
  the block alone (``dual``). For Dream-style shifted models the query also holds the position left
  of the block, whose hidden state predicts the block's first token. Within a step every row's
  computation depends on that row only, so batch and single decoding agree. Not supported with
  ``cfg_scale > 0`` (``ValueError``). On several ranks the cache takes the ``ranks_max`` hook (the
  forwards per step vary with the rows' block starts; every rank pads to the maximum).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Protocol, Sequence

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.types import Rollout

SCHEDULES = ("fixed", "threshold")
REMASKING = ("low_confidence", "random")
CACHES = ("none", "prefix", "dual")
OBSERVER_LOGITS = ("exact", "refuse")
LOGIT_SCOPES = ("block", "masked", "completion")


@dataclass(frozen=True)
class SamplerConfig:
    """Sampler settings (SPEC §1.2).

    Attributes:
        gen_length: completion length L in tokens.
        block_length: block size b; ``gen_length`` must be a multiple of it.
        steps: total denoising steps T for the fixed schedule; must be a multiple of ``L/b``.
        temperature: τ of the Gumbel-max candidate draw; 0 = argmax (greedy).
        schedule: ``"fixed"`` (top-k_j per step) or ``"threshold"`` (Fast-dLLM).
        threshold: confidence threshold of the threshold schedule.
        remasking: ``"low_confidence"`` (commit the most confident) or ``"random"``.
        cfg_scale: classifier-free guidance scale (0 = off); the unconditional pass masks the prompt.
        suppress_eos: commit eos candidates after every other candidate of the block.
        cache: ``"none"`` (every step is a full forward; the exact behaviour of maskrl <= 0.x, bit for
            bit), ``"prefix"`` or ``"dual"`` (Fast-dLLM key/value caches, refreshed at every block
            start; see the module docstring). Needs ``cfg_scale == 0`` and a 4-D-mask model.
        mismatch_every: trainer only: every this many RL steps log ``rollout/mismatch``, the mean
            ``|log commit_prob - log p_theta|`` over committed tokens with p_theta from a full forward
            at each commit state (:func:`rollout_mismatch`); 0 = never. Costs one forward per
            distinct commit step of the batch.
        observer_logits: **[choice]** what a cache does to observers that declare ``exact_logits``
            (DPS, DiSPO, RLDF/DTCA's commit probabilities; issue 19): ``"exact"`` (default) -- at every
            step where such an observer reads a row whose step ran against the cache, the sampler
            runs one extra full forward of that row at the pre-step state and the observer's view
            comes from it (the commits still use the cached logits, so the trajectory is the cached
            one); ``"refuse"`` -- :func:`generate` (and the trainer's config check) raises instead.
            Ignored with ``cache="none"``, where every step is a full forward. Cost of ``"exact"``:
            an observer that reads every step (DPS, RLDF/DTCA under a cache) adds a full forward to
            every cached step, so rollouts cost more than with ``cache="none"``; DiSPO adds one per
            branched row (plus the last block's steps under the threshold schedule).
    """

    gen_length: int = 256
    block_length: int = 32
    steps: int = 128
    temperature: float = 0.0
    schedule: str = "fixed"
    threshold: float = 0.9
    remasking: str = "low_confidence"
    cfg_scale: float = 0.0
    suppress_eos: bool = False
    cache: str = "none"
    mismatch_every: int = 0
    observer_logits: str = "exact"

    def __post_init__(self) -> None:
        if self.gen_length <= 0 or self.block_length <= 0:
            raise ValueError(f"gen_length (={self.gen_length}) and block_length (={self.block_length}) must be positive")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length (={self.gen_length}) must be a multiple of block_length (={self.block_length})")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} is not one of {SCHEDULES}")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking {self.remasking!r} is not one of {REMASKING}")
        if self.schedule == "fixed" and (self.steps <= 0 or self.steps % self.num_blocks):
            raise ValueError(f"steps (={self.steps}) must be a positive multiple of the number of blocks "
                             f"gen_length/block_length = {self.num_blocks}")
        if self.schedule == "fixed" and self.steps > self.gen_length:
            raise ValueError(f"steps (={self.steps}) must be <= gen_length (={self.gen_length}): each step commits "
                             "at least one token, so more steps than tokens cannot run")
        if self.temperature < 0:
            raise ValueError(f"temperature (={self.temperature}) must be >= 0")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold (={self.threshold}) must lie in (0, 1]")
        if self.cache not in CACHES:
            raise ValueError(f"cache {self.cache!r} is not one of {CACHES}")
        if self.cache != "none" and self.cfg_scale > 0:
            raise ValueError(f"cache={self.cache!r} needs cfg_scale == 0 (got {self.cfg_scale}): the unconditional "
                             "pass would need its own cache; use cache='none' with classifier-free guidance")
        if self.mismatch_every < 0:
            raise ValueError(f"mismatch_every (={self.mismatch_every}) must be >= 0")
        if self.observer_logits not in OBSERVER_LOGITS:
            raise ValueError(f"observer_logits {self.observer_logits!r} is not one of {OBSERVER_LOGITS}")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    def commits_per_step(self) -> list[int]:
        """Fixed schedule: tokens committed at each step of a block, ``k_j`` (SPEC §1.2): the block's
        ``b`` masks split evenly over its ``steps/(L/b)`` steps, remainder to the earliest steps."""
        spb = self.steps // self.num_blocks
        base, rem = divmod(self.block_length, spb)
        return [base + (1 if j < rem else 0) for j in range(spb)]


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
            ``M = covered.sum()`` covered positions; the ``[M]`` token's logit is ``-inf``.
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
    """Collects per-step statistics during sampling (ARCHITECTURE.md, Rollout ``step_stats``).

    Which logits an observer needs is declared by an optional attribute or method (default
    ``"block"``, which costs nothing extra):

    - ``logit_scope``: ``"block"`` (the current block), ``"masked"`` (every completion position still
      holding ``[M]`` before the step: DPS scope "all", SPEC §2.1) or ``"completion"`` (all L);
    - or ``logit_positions(step, rows, masked, block_start) -> str | Tensor[n, L] bool``, asked before
      each step (e.g. DiSPO, SPEC §4: ``"masked"`` at its chosen step only, ``"block"`` otherwise).

    Whether those logits must be theta's exact ones is declared by ``exact_logits`` (bool, default
    False): True for statistics defined on theta's distribution at the rollout state (DPS's δ, SPEC
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


def _requested(observers, step, rows, masked, in_block, start) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(req, exact)``: ``req`` the ``[n, L]`` bool union of the positions observers ask for, None
    when none lies beyond the block; ``exact`` ``[n]`` bool, the rows an observer declaring
    ``exact_logits`` asks for (its scope is not empty there)."""
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


def _propose(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate tokens and their noise-free probabilities.

    Args:
        logits: ``[n, b, V]``.
    Returns:
        ``(tokens [n, b] long, prob [n, b] float32)`` with ``prob = softmax(logits)[token]``.
    """
    if temperature == 0:
        tokens = logits.argmax(-1)
    else:
        u = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=logits.device)
        gumbel = -torch.log(-torch.log(u))
        tokens = (logits.double() / temperature + gumbel).argmax(-1)
    prob = torch.softmax(logits.float(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    return tokens, prob


def _full_logits(adapter: ModelAdapter, xr: torch.Tensor, ar: torch.Tensor, p_len: int, config: SamplerConfig) -> torch.Tensor:
    """``[n, L, V]`` completion logits of full forwards (with classifier-free guidance when asked);
    used for models without :meth:`ModelAdapter.decoder_forward` (2-D attention)."""
    logits = adapter.logits(xr, ar)
    if config.cfg_scale > 0:
        uncond = xr.clone()
        uncond[:, :p_len] = torch.where(ar[:, :p_len], adapter.mask_id, uncond[:, :p_len])
        un = adapter.logits(uncond, ar)
        logits = un + (config.cfg_scale + 1) * (logits - un)
    return logits[:, p_len:]


def window_hidden(adapter: ModelAdapter, kv_store: Sequence[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor,
                  attn: torch.Tensor, pos_ids: torch.Tensor, store_rows: torch.Tensor, w0: torch.Tensor,
                  width: int) -> torch.Tensor:
    """Hidden states of a window of columns recomputed against the cached keys/values of all others
    (Fast-dLLM prefix cache: window = block and everything right of it; dual cache: window = block).

    Args:
        adapter: a model with :attr:`ModelAdapter.supports_cache`.
        kv_store: per layer ``(keys, values)``, each ``[N_all, H, S, D]``, filled by a full forward.
        x, attn, pos_ids: ``[g, S]`` current tokens, key validity (bool) and RoPE positions of the rows.
        store_rows: ``[g]`` long, the rows' indices into ``kv_store``.
        w0: ``[g]`` long, first column of each row's window; width: window length ``W``.

    Returns:
        ``[g, W, d]`` hidden states of columns ``w0 .. w0 + W - 1`` (input of the output layer).
    """
    g, n_cols = x.shape
    cols = torch.arange(n_cols, device=x.device)
    wcols = w0[:, None] + torch.arange(width, device=x.device)  # [g, W]
    if bool((w0 < 0).any()) or bool((w0 + width > n_cols).any()):
        raise ValueError(f"window [w0, w0 + {width}) leaves the {n_cols} columns")
    in_win = (cols[None, :] >= w0[:, None]) & (cols[None, :] < w0[:, None] + width)
    keep = cols.expand(g, -1)[~in_win].view(g, n_cols - width)  # [g, S - W], ascending
    kidx = keep[:, None, :, None]
    past = []
    for k_all, v_all in kv_store:
        idx = kidx.expand(-1, k_all.shape[1], -1, k_all.shape[-1])
        past.append((k_all[store_rows].gather(2, idx), v_all[store_rows].gather(2, idx)))
    key_mask = torch.cat([attn.gather(1, keep), attn.gather(1, wcols)], 1).bool()
    h, _ = adapter.decoder_forward(x.gather(1, wcols), key_mask, pos_ids.gather(1, wcols), past=past)
    return h


def _head_at(adapter: ModelAdapter, groups, cover: torch.Tensor, p_len: int, shift: int) -> torch.Tensor:
    """Logits at the covered completion positions, flat ``[cover.sum(), V]`` in row-major order.

    Each group is ``(local rows [g], hidden [g, W, d] over columns [w0, w0 + W), w0 [g], None)`` or
    ``(local rows [g], None, None, logits [g, L, V])`` (models without a decoder forward). The output
    layer runs once, on the gathered hidden states only.
    """
    n, L = cover.shape
    fidx = cover.flatten().long().cumsum(0).view(n, L) - 1
    m = int(cover.sum())
    hs, his, ls, lis = [], [], [], []
    for loc, h, w0, full in groups:
        rr, pp = cover[loc].nonzero(as_tuple=True)
        if h is not None:
            col = p_len + pp - shift - w0[rr]
            hs.append(h[rr, col])
            his.append(fidx[loc[rr], pp])
        else:
            ls.append(full[rr, pp])
            lis.append(fidx[loc[rr], pp])
    if ls and not hs:
        out = torch.cat(ls)
        return out[torch.cat(lis).argsort()]
    hidden = torch.cat(hs)
    order = torch.cat(his)
    if bool((order[1:] > order[:-1]).all()) or len(order) <= 1:
        return adapter.head(hidden)
    flat_h = hidden.new_empty((m, hidden.shape[-1]))
    flat_h[order] = hidden
    return adapter.head(flat_h)


def cached_forward_counts(config: SamplerConfig, refresh: torch.Tensor, start: torch.Tensor,
                          requested: torch.Tensor | None, L: int,
                          wants_exact: torch.Tensor | None = None) -> tuple[int, int]:
    """Forwards one cached sampler step runs (what :func:`generate` sends to ``ranks_max``).

    Args:
        config: the sampler (``cache`` ``prefix`` or ``dual``).
        refresh: ``[n]`` bool, rows at their block's first step (a full forward fills the cache).
        start: ``[n]`` long, each row's block start in the completion.
        requested: ``[n, L]`` bool positions observers asked for, or ``None``.
        L: completion length.
        wants_exact: ``[n]`` bool rows an ``exact_logits`` observer reads, or ``None``.

    Returns:
        ``(decoder forwards before the output layer, 1 if the observers' extra full forward runs, else
        0)``: one full forward when a row refreshes; then one window forward for the other rows (dual)
        or one per distinct block start (prefix). The extra forward runs when a row's requests leave
        its window, or an exact-logits observer reads a cached (non-refresh) row.
    """
    rest = ~refresh
    d = int(bool(refresh.any()))
    if rest.any():
        d += 1 if config.cache == "dual" else int(start[rest].unique().numel())
    redo = (wants_exact & rest) if wants_exact is not None else torch.zeros_like(refresh)
    if requested is not None:
        pos = torch.arange(L, device=start.device)
        lo = torch.where(refresh, 0, start)
        hi = torch.where(refresh, L, start + config.block_length if config.cache == "dual" else L)
        window = (pos[None, :] >= lo[:, None]) & (pos[None, :] < hi[:, None])
        redo = redo | (requested & ~window).any(-1)
    return d, int(bool(redo.any()))


def _dummy_forwards(adapter: ModelAdapter, x: torch.Tensor, attn: torch.Tensor, decoder: int, heads: int) -> None:
    """``decoder`` decoder forwards of one row, then ``heads`` × (decoder forward + output layer on one
    position); results discarded (multi-rank padding of the cached sampler)."""
    pos = adapter.position_ids(attn)
    for _ in range(decoder):
        adapter.decoder_forward(x, attn, pos)
    for _ in range(heads):
        h, _ = adapter.decoder_forward(x, attn, pos)
        adapter.head(h[:, :1])


@torch.no_grad()
def generate(
    adapter: ModelAdapter,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    config: SamplerConfig,
    generator: torch.Generator | None = None,
    observers: Sequence[StepObserver] = (),
    group_ids: torch.Tensor | None = None,
    all_done: Callable[[bool], bool] | None = None,
    ranks_max: Callable[[list[int]], list[int]] | None = None,
) -> Rollout:
    """Denoise ``[prompt ; [M]×L]`` into completions (SPEC §1.2).

    Args:
        adapter: the model.
        prompt_ids: ``[N, P]`` long, left-padded.
        prompt_mask: ``[N, P]`` bool, True on real prompt tokens.
        config: sampler settings.
        generator: ``torch.Generator`` on the model's device for the Gumbel draws and random
            remasking; required when ``temperature > 0`` or ``remasking == "random"``.
        observers: per-step statistic collectors; their ``result()`` fills ``Rollout.step_stats``.
            Each may declare the logits it needs (:class:`StepObserver`); the output layer runs only
            on the current block plus those positions.
        group_ids: ``[N]`` long; defaults to ``arange(N)``.
        all_done: rank synchronisation for sharded models (FSDP / ZeRO-3, where every forward is a
            collective). Called exactly once per loop iteration with "this rank has no row left"
            and must return True only when that holds on every rank (an all-reduce). A finished
            rank keeps running dummy forwards on its last state until then, so all ranks run the
            same number of forwards. ``None`` (default): stop as soon as this rank's rows finish.
            The returned Rollout is the same either way.
        ranks_max: the same synchronisation for the cached sampler (``cache != "none"``), whose
            forwards per step vary with the rows' block starts: ``ranks_max(values)`` returns the
            element-wise maximum of a list of ints over ranks (one collective, called once per loop
            iteration before any forward). Each rank sends (has rows, decoder forwards before the
            output layer, observers' extra full forward) and pads with dummy forwards of one row to
            the maxima, so every rank runs the same forwards in the same order; a finished rank
            runs dummies until no rank has rows. ``all_done`` is then not called. The Rollout is
            unchanged.

    Returns:
        A :class:`Rollout` (``commit_step``/``commit_prob`` ``[N, L]``, ``num_steps`` ``[N]``).

    Raises:
        ValueError: on mismatched shapes or a missing generator; with ``config.cache != "none"``: a
            model without a decoder forward (``attention="2d"``), ``all_done`` given without
            ``ranks_max``, or a shifted model with no prompt column.
    """
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must be equal [N, P]")
    if generator is None and (config.temperature > 0 or config.remasking == "random"):
        raise ValueError("generator is required when temperature > 0 or remasking == 'random'")
    cached = config.cache != "none"
    if cached and not adapter.supports_cache:
        raise ValueError(f"cache={config.cache!r} needs a decoder model with the 4-D mask (attention='4d'); "
                         f"this adapter has attention={adapter.attention!r}: use cache='none'")
    if cached and all_done is not None and ranks_max is None:
        raise ValueError(f"cache={config.cache!r} with all_done (several processes) needs ranks_max: the number of "
                         "forwards per step varies with the rows' block starts (maskrl.trainer.ranks_max)")
    sync = ranks_max if cached else None  # several ranks, cached: equal forwards per step
    needs_exact = exact_observers(observers) if cached and config.observer_logits == "refuse" else []
    if needs_exact:
        raise ValueError(f"cache={config.cache!r} with observer_logits='refuse': the observers "
                         f"{needs_exact} need theta's exact logits, which a cached step does not "
                         "compute; use cache='none', or observer_logits='exact' (one extra full forward per cached "
                         "step they read)")
    device = adapter.device
    n_rows, p_len = prompt_ids.shape
    L, b = config.gen_length, config.block_length
    shift = 1 if adapter.shift else 0
    if cached and shift and p_len == 0:
        raise ValueError("a shifted (Dream-style) model with a cache needs at least one prompt column")
    x = torch.cat([prompt_ids.to(device), torch.full((n_rows, L), adapter.mask_id, dtype=torch.long, device=device)], 1)
    attn = torch.cat([prompt_mask.to(device).bool(), torch.ones((n_rows, L), dtype=torch.bool, device=device)], 1)
    n_cols = p_len + L
    pos_ids = adapter.position_ids(attn) if adapter.supports_cache else None  # [N, S]
    kv_store: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer [N, H, S, D]
    commit_step = torch.full((n_rows, L), -1, dtype=torch.long, device=device)
    commit_prob = torch.zeros((n_rows, L), dtype=torch.float32, device=device)
    num_steps = torch.zeros(n_rows, dtype=torch.long, device=device)
    block = torch.zeros(n_rows, dtype=torch.long, device=device)       # [N] current block per row
    block_step = torch.zeros(n_rows, dtype=torch.long, device=device)  # [N] steps spent in it
    k_sched = torch.tensor(config.commits_per_step() if config.schedule == "fixed" else [0], device=device)
    offsets = torch.arange(b, device=device)
    positions = torch.arange(L, device=device)

    def full_hidden(xs, ats):  # [g, S, d] hidden states of a full forward (+ per-layer kv when caching)
        return adapter.decoder_forward(xs, ats, adapter.position_ids(ats), return_kv=cached)

    step = 0
    while True:
        rows = (block < config.num_blocks).nonzero().squeeze(-1)  # [n]
        finished = rows.numel() == 0
        if sync is not None and finished:
            busy, d_max, e_max = sync([0, 0, 0])
            if not busy:
                break
            _dummy_forwards(adapter, x[:1], attn[:1], max(d_max - 1, 0), 1 + e_max)  # the others' forwards, in order
            continue
        if all_done is not None and sync is None:
            # Threshold rows finish at different steps, so ranks would leave this loop at different
            # times and the per-forward collectives of FSDP / ZeRO-3 would go out of step.
            if all_done(finished):
                break
            if finished:  # others still decode: keep their collectives company, change nothing
                for _ in range(2 if config.cfg_scale > 0 else 1):
                    adapter.logits(x[:1], attn[:1])
                continue
        elif finished:
            break
        n = rows.numel()
        xr, ar = x[rows], attn[rows]
        comp = xr[:, p_len:]  # [n, L]
        masked = comp == adapter.mask_id
        start = block[rows] * b  # [n]
        pos = start[:, None] + offsets  # [n, b]
        in_block = (positions[None, :] >= start[:, None]) & (positions[None, :] < start[:, None] + b)  # [n, L]
        requested, wants_exact = _requested(observers, step, rows, masked, in_block, start) if observers else (None, None)
        if sync is not None:
            d_loc, e_loc = cached_forward_counts(config, block_step[rows] == 0, start, requested, L, wants_exact)
            _, d_max, e_max = sync([1, d_loc, e_loc])

        # ---- forwards: hidden states of each row over a window of columns [w0, w0 + W)
        # groups: (local row indices [g], hidden [g, W, d] or None, w0 [g], full logits [g, S, V] or None)
        groups = []
        win_lo = torch.zeros(n, dtype=torch.long, device=device)  # completion positions the row's
        win_hi = torch.full((n,), L, dtype=torch.long, device=device)  # primary forward computed
        exact = torch.ones(n, dtype=torch.bool, device=device)
        if not cached:
            h = None
            if adapter.supports_cache and config.cfg_scale == 0:
                h, _ = full_hidden(xr, ar)
            if h is None:  # 2-D-attention model or guidance: logits of the whole sequence, as before
                groups.append((torch.arange(n, device=device), None, None, _full_logits(adapter, xr, ar, p_len, config)))
            else:
                groups.append((torch.arange(n, device=device), h, torch.zeros(n, dtype=torch.long, device=device), None))
        else:
            refresh = block_step[rows] == 0
            if refresh.any():
                loc = refresh.nonzero().squeeze(-1)
                h, kv = full_hidden(xr[loc], ar[loc])
                if kv_store is None:
                    kv_store = [(torch.zeros((n_rows, *k.shape[1:]), dtype=k.dtype, device=device),
                                 torch.zeros((n_rows, *v.shape[1:]), dtype=v.dtype, device=device)) for k, v in kv]
                for (k_all, v_all), (k, v) in zip(kv_store, kv):
                    k_all[rows[loc]] = k
                    v_all[rows[loc]] = v
                groups.append((loc, h, torch.zeros(len(loc), dtype=torch.long, device=device), None))
            rest = (~refresh).nonzero().squeeze(-1)
            if rest.numel():
                exact[rest] = False
                w0 = p_len + start[rest] - shift  # [r]
                win_lo[rest] = start[rest]
                if config.cache == "dual":
                    win_hi[rest] = start[rest] + b
                    groups.append((rest, window_hidden(adapter, kv_store, x[rows[rest]], attn[rows[rest]], pos_ids[rows[rest]],
                                                       rows[rest], w0, b + shift), w0, None))
                else:  # prefix: one forward per distinct block start (equal window widths)
                    for w in w0.unique():
                        loc = rest[w0 == w]
                        groups.append((loc, window_hidden(adapter, kv_store, x[rows[loc]], attn[rows[loc]], pos_ids[rows[loc]],
                                                         rows[loc], w0[w0 == w], n_cols - int(w)), w0[w0 == w], None))

        # ---- output layer only where needed
        if requested is not None:
            window = (positions[None, :] >= win_lo[:, None]) & (positions[None, :] < win_hi[:, None])  # [n, L]
            inside = ~(requested & ~window).any(-1)  # [n] rows whose requests lie in their window
            prim_cover = in_block | (requested & inside[:, None])
        else:
            inside = None
            prim_cover = in_block
        if sync is not None:  # pad this rank's decoder forwards to the ranks' maximum, before the output layer
            _dummy_forwards(adapter, xr[:1], ar[:1], d_max - d_loc, 0)
        logits_flat = _head_at(adapter, groups, prim_cover, p_len, shift)  # [M1, V]
        logits_flat[:, adapter.mask_id] = float("-inf")
        fidx = prim_cover.flatten().long().cumsum(0).view(n, L) - 1  # [n, L] row in logits_flat
        blk_logits = logits_flat[fidx.gather(1, pos)]  # [n, b, V]
        cand, prob = _propose(blk_logits, config.temperature, generator)  # [n, b]
        eligible = masked.gather(1, pos)  # [n, b]
        if config.remasking == "random":
            score = torch.rand(cand.shape, generator=generator, device=device)
        else:
            score = prob.clone()
        if config.suppress_eos:
            score = torch.where(adapter.is_stop(cand), score - 2.0, score)
        score = score.masked_fill(~eligible, float("-inf"))
        order = score.argsort(dim=-1, descending=True, stable=True)
        rank = torch.empty_like(order).scatter_(1, order, offsets.expand_as(order))  # [n, b]
        if config.schedule == "fixed":
            k = k_sched[block_step[rows].clamp(max=len(k_sched) - 1)]  # [n]
            take = (rank < k[:, None]) & eligible
        else:
            take = ((rank == 0) | (prob >= config.threshold)) & eligible
        # write the commits back into the full completion
        commit_full = torch.zeros_like(masked).scatter_(1, pos, take)  # [n, L]
        comp_new = comp.scatter(1, pos, torch.where(take, cand, comp.gather(1, pos)))
        x[rows, p_len:] = comp_new
        commit_step[rows] = torch.where(commit_full, step, commit_step[rows])
        commit_prob[rows] = commit_prob[rows].scatter(1, pos, torch.where(take, prob, commit_prob[rows].gather(1, pos)))
        # NOTE: a credit module that runs extra forwards at steps it chooses (DTCA / DiSPO-style) must
        # broadcast those choices from rank 0 under FSDP / ZeRO-3, or the collectives diverge.
        if observers:
            cover, view_logits, view_exact = prim_cover, logits_flat, exact
            redo = wants_exact & ~exact  # [n] an exact-needing observer reads a cached step
            if inside is not None:
                redo = redo | ~inside  # asked beyond what the cached forward computed
            if redo.any():
                # one full forward of those rows at the pre-step state supplies their view
                out = redo.nonzero().squeeze(-1)
                cover = in_block | requested if requested is not None else in_block
                h, _ = adapter.decoder_forward(xr[out], ar[out], pos_ids[rows[out]])
                extra = _head_at(adapter, [(torch.arange(len(out), device=device), h,
                                            torch.zeros(len(out), dtype=torch.long, device=device), None)],
                                 cover[out], p_len, shift)
                extra[:, adapter.mask_id] = float("-inf")
                view_logits = logits_flat.new_empty((int(cover.sum()), logits_flat.shape[-1]))
                vidx = cover.flatten().long().cumsum(0).view(n, L) - 1
                keep_rows = ~redo[:, None] & cover
                view_logits[vidx[keep_rows]] = logits_flat[fidx[keep_rows]]
                out_cover = torch.zeros_like(cover)
                out_cover[out] = cover[out]
                view_logits[vidx[out_cover]] = extra
                view_exact = exact.clone()
                view_exact[out] = True
            view = StepView(step, rows, view_logits, cover, view_exact, masked, commit_full, comp_new, start, b)
            for obs in observers:
                obs.on_step(view)
        if sync is not None and e_max > e_loc:  # another rank ran the observers' extra full forward
            _dummy_forwards(adapter, xr[:1], ar[:1], 0, 1)
        # advance blocks
        block_step[rows] += 1
        block_done = ~((comp_new == adapter.mask_id) & in_block).any(-1)
        if config.schedule == "fixed":
            block_done = block_done | (block_step[rows] >= len(k_sched))
        finished_rows = rows[block_done]
        block[finished_rows] += 1
        block_step[finished_rows] = 0
        num_steps[rows] = step + 1
        step += 1
    completion = x[:, p_len:]
    if (commit_step < 0).any():  # pragma: no cover - guarded by the schedule arithmetic
        raise RuntimeError("sampler finished with uncommitted positions")
    completion_mask = adapter.completion_mask(completion)  # up to and including the first stop token
    stats: dict[str, torch.Tensor] = {}
    for obs in observers:
        stats.update(obs.result())
    return Rollout(
        prompt_ids=prompt_ids.to(device), prompt_mask=prompt_mask.to(device).bool(), completion_ids=completion,
        completion_mask=completion_mask, commit_step=commit_step, commit_prob=commit_prob, num_steps=num_steps,
        group_ids=(group_ids if group_ids is not None else torch.arange(n_rows)).to(device), sampler=config,
        step_stats=stats,
    )


@torch.no_grad()
def rollout_mismatch(adapter: ModelAdapter, rollout: Rollout) -> dict[str, float]:
    """How far the sampler's commit probabilities are from theta's full-forward ones (issue 12).

    For every committed completion token ``(i, j)`` with commit step ``t``, recompute
    ``log p_theta(y_ij | x_t)`` by a full bidirectional forward at the commit state ``x_t`` (the
    completion with every position committed at step ``>= t`` masked, SPEC §1.4) and compare it with
    the sampler's ``log commit_prob``. With ``cache="none"`` the two agree up to float rounding; with a
    cache the gap is what the cache costs in off-policyness. The output layer runs only at the
    committed positions of each state. Costs one forward of the rows committing at each distinct step.

    Args:
        adapter: the policy that sampled ``rollout`` (same weights).
        rollout: a :class:`~maskrl.types.Rollout` from :func:`generate` (``cfg_scale`` must be 0:
            with guidance the sampler's distribution is not theta's by construction).

    Returns:
        ``{"mismatch": mean |log commit_prob - log p_theta| (nats), "mismatch_max": max of the same,
        "tokens": number of tokens compared}``.

    Raises:
        ValueError: when the rollout used classifier-free guidance.
    """
    if rollout.sampler is not None and rollout.sampler.cfg_scale > 0:
        raise ValueError("rollout_mismatch: the rollout used cfg_scale > 0, whose distribution is not theta's")
    device = adapter.device
    p_len = rollout.prompt_ids.shape[1]
    comp = rollout.completion_ids.to(device)
    cstep = rollout.commit_step.to(device)
    attn = torch.cat([rollout.prompt_mask.to(device).bool(), torch.ones_like(comp, dtype=torch.bool)], 1)
    shift = 1 if adapter.shift else 0
    diffs = []
    for t in cstep.unique().tolist():
        if t < 0:
            continue
        at = cstep == t  # [N, L]
        rows = at.any(-1).nonzero().squeeze(-1)
        state = torch.where(cstep[rows] >= t, adapter.mask_id, comp[rows])
        xs = torch.cat([rollout.prompt_ids[rows].to(device), state], 1)
        rr, pp = at[rows].nonzero(as_tuple=True)
        if adapter.supports_cache:
            h, _ = adapter.decoder_forward(xs, attn[rows], adapter.position_ids(attn[rows]))
            logits = adapter.head(h[rr, p_len + pp - shift])  # [m, V]
        else:
            logits = adapter.logits(xs, attn[rows])[rr, p_len + pp]
        logits = logits.float()
        logits[:, adapter.mask_id] = float("-inf")
        lp = torch.log_softmax(logits, -1).gather(-1, comp[rows][rr, pp][:, None]).squeeze(-1)
        diffs.append((rollout.commit_prob[rows][rr, pp].to(device).clamp_min(1e-30).log() - lp).abs())
    d = torch.cat(diffs) if diffs else torch.zeros(0, device=device)
    return {"mismatch": d.mean().item() if d.numel() else 0.0, "mismatch_max": d.max().item() if d.numel() else 0.0,
            "tokens": int(d.numel())}
