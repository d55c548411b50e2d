"""RLDF's step choice (docs/spec.md §1.5 ``rldf``), as a credit module that replaces the base term.

RLDF does not score every token at its own commit state. Per sequence it samples k = 4 denoising
steps without replacement from ``softmax(w_s / T)``, ``w_s = −mean_{i∈C_s} log p_i`` (C_s the valid
positions committed at step s, ``p_i = rollout.commit_prob``; T = 1), and at each chosen step s
scores, from the recorded state x_s, **all** positions still masked there (``commit_step >= s``),
dropping masked positions whose current probability of the final token is below 0.6 unless they
were committed at s. The loss is averaged over the chosen steps.

Through the seam (docs/spec.md §1.5; docs/architecture.md "Loss terms") this is: the base term gets
``loss_mask`` all False and weight 0 (no forward is run for it), and one :class:`LossTerm` named
``rldf`` holds one row per chosen (sequence, step) -- a copy of the sequence whose ``commit_step``
is ``min(commit_step, s)``, so that the ``state`` likelihood, which scores each needed position at
the state "positions with ``commit_step >= its step`` masked", scores every needed position at
exactly x_s in one forward row -- with ``need`` = the kept positions and the sequence's per-token
advantages. The filter's probabilities come from a no-grad forward of ``ctx.policy`` (the rollout
policy) at each chosen state, with the prompt unmasked.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from maskrl.credit.base import CREDITS, CreditBatch, CreditContext, CreditModule
from maskrl.credit.base import ShareMean
from maskrl.likelihood.state import State
from maskrl.sampling.edit import refuse_edited
from maskrl.types import LossTerm, Rollout


class CommitProbObserver:
    """Sampler observer: θ's exact probability of every committed token at its commit step (docs/spec.md
    §1.2 ``commit_prob``), for rollouts made with a key/value cache, whose own ``commit_prob`` comes
    from the cached logits the commits used. RLDF's step scores and DTCA's step importance read
    ``p_i`` (docs/spec.md §1.5, §3.2); :func:`commit_probs` hands them this one when it is there.

    ``exact_logits = True`` (the current block only): under a cache the sampler runs one full forward
    per cached step for the view (:attr:`maskrl.sampling.SamplerConfig.observer_logits`), or refuses.
    ``result()``: ``{"theta_commit_prob": [N, L] float32}``.
    """

    exact_logits = True
    logit_scope = "block"

    def __init__(self) -> None:
        self.parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def on_step(self, view: Any) -> None:
        lp = view.token_log_prob(view.tokens)  # [n, L]; committed positions lie in the block
        r, i = view.committed.nonzero(as_tuple=True)
        self.parts.append((view.rows[r], i, lp[r, i].exp()))

    def result(self) -> dict[str, torch.Tensor]:
        if not self.parts:
            return {}
        rows = torch.cat([p[0] for p in self.parts])
        cols = torch.cat([p[1] for p in self.parts])
        n, L = int(rows.max()) + 1, int(cols.max()) + 1
        out = torch.zeros((n, L), dtype=torch.float32, device=rows.device)
        out[rows, cols] = torch.cat([p[2] for p in self.parts]).float()
        return {"theta_commit_prob": out}


def commit_observers(sampler: Any) -> list[CommitProbObserver]:
    """The observers a reader of ``p_i`` needs for ``sampler``: none without a cache (``commit_prob``
    is θ's exact value then), else one :class:`CommitProbObserver`."""
    return [] if getattr(sampler, "cache", "none") == "none" else [CommitProbObserver()]


def commit_probs(rollout: Rollout, who: str) -> torch.Tensor:
    """``[N, L]`` θ's probability of each committed token at its commit step: ``rollout.commit_prob``,
    or with a cache the :class:`CommitProbObserver`'s.

    Raises:
        ValueError: a cached rollout without the observer's statistics (naming ``who``).
    """
    if "theta_commit_prob" in rollout.step_stats:
        return rollout.step_stats["theta_commit_prob"].to(rollout.commit_prob.device)
    if getattr(rollout.sampler, "cache", "none") not in ("none", "block"):  # the block cache's logits are exact
        raise ValueError(f"{who}: the rollout used cache={rollout.sampler.cache!r}, so its commit_prob comes from cached "
                         "logits; pass the module's observers to generate() (they record theta's exact p_i)")
    return rollout.commit_prob


def _steps_width(commit_step: torch.Tensor) -> int:
    return int(commit_step.max().item()) + 1 if commit_step.numel() else 0


def step_surprise(commit_step: torch.Tensor, commit_prob: torch.Tensor, valid: torch.Tensor,
                  num_steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RLDF's step scores ``w_s = −mean_{i∈C_s} log p_i`` (docs/spec.md §1.5).

    Args:
        commit_step: ``[N, L]`` long, the step that committed each position.
        commit_prob: ``[N, L]`` float, ``p_i`` at commit time (clamped to ``>= 1e-12`` before the log).
        valid: ``[N, L]`` bool, positions that count (``completion_mask``).
        num_steps: width T of the output (default ``max(commit_step) + 1``).

    Returns:
        ``(w [N, T] float32, present [N, T] bool)``: ``present`` is True where the step committed at
        least one valid position; ``w`` is 0 elsewhere.
    """
    n, _ = commit_step.shape
    t = num_steps if num_steps is not None else _steps_width(commit_step)
    cs = commit_step.long().clamp(min=0)
    nll = -commit_prob.double().clamp(min=1e-12).log() * valid
    total = torch.zeros(n, t, dtype=torch.float64, device=cs.device).scatter_add_(1, cs, nll)
    count = torch.zeros(n, t, dtype=torch.float64, device=cs.device).scatter_add_(1, cs, valid.double())
    present = count > 0
    return torch.where(present, total / count.clamp(min=1), torch.zeros_like(total)).float(), present


def sample_steps(scores: torch.Tensor, present: torch.Tensor, k: int, temperature: float,
                 generator: torch.Generator | None) -> torch.Tensor:
    """Per row, k steps drawn without replacement from ``softmax(scores / temperature)`` over the
    present steps (Gumbel-top-k, which is exactly sequential sampling without replacement).

    Args:
        scores: ``[N, T]`` float step scores; present: ``[N, T]`` bool, the steps that may be drawn.
        k: steps per row; a row with fewer than k present steps gets all of them.
        temperature: T > 0.
        generator: CPU ``torch.Generator`` for the Gumbel noise.

    Returns:
        ``[N, k]`` long step indices in draw order, padded with ``-1`` after a row's present steps.

    Raises:
        ValueError: ``k < 1`` or ``temperature <= 0``.
    """
    if k < 1:
        raise ValueError(f"k (={k}) must be >= 1")
    if not temperature > 0:
        raise ValueError(f"temperature (={temperature}) must be > 0")
    n, t = scores.shape
    u = torch.rand((n, t), generator=generator, dtype=torch.float64).to(scores.device).clamp(1e-300, 1.0 - 1e-16)
    keys = scores.double() / temperature - torch.log(-torch.log(u))
    keys = torch.where(present, keys, torch.full_like(keys, -float("inf")))
    width = min(k, t)
    top = keys.topk(width, dim=1)
    steps = torch.where(torch.isfinite(top.values), top.indices, torch.full_like(top.indices, -1))
    if width < k:
        steps = torch.cat([steps, steps.new_full((n, k - width), -1)], 1)
    return steps


def chosen_pairs(steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows [M], steps [M])`` long of the non-padding entries of ``steps [N, S]`` (row-major)."""
    r, j = (steps >= 0).nonzero(as_tuple=True)
    return r, steps[r, j]


def state_rollout(rollout: Rollout, rows: torch.Tensor, steps: torch.Tensor) -> Rollout:
    """One row per chosen (sequence, step): sequence ``rows[m]`` with ``commit_step`` replaced by
    ``min(commit_step, steps[m])``. The ``state`` likelihood then scores every position with
    ``commit_step >= s`` from the state in which exactly those positions are masked (x_s).

    Args:
        rollout: N rows; rows, steps: ``[M]`` long.

    Returns:
        A :class:`Rollout` of M rows (other fields selected from ``rollout``).
    """
    sub = rollout.select(rows)
    cs = torch.minimum(sub.commit_step.long(), steps[:, None].to(sub.commit_step.device))
    return dataclasses.replace(sub, commit_step=cs)


def masked_at(commit_step: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """``[M, L]`` bool: the completion positions masked in state x_s (``commit_step >= s``), for
    ``commit_step [M, L]`` and ``steps [M]``."""
    return commit_step.long() >= steps[:, None].long()


#: largest ``[r, k, V]`` float32 logits tensor of one :func:`state_token_stats` forward (2^25 = 128 MiB)
STATE_MAX_ELEMENTS = 2 ** 25


def state_chunk_rows(k_max: int, vocab: int, chunk: int = 16, max_elements: int = STATE_MAX_ELEMENTS) -> int:
    """Rows per :func:`state_token_stats` forward: at most ``chunk``, fewer when ``rows · k_max · vocab``
    would exceed ``max_elements`` (``k_max``: most needed positions of a row), at least one."""
    return max(1, min(chunk, max_elements // max(1, k_max * vocab)))


def token_stats(logits: torch.Tensor, targets: torch.Tensor, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(p, H)``: probability of ``targets`` and the entropy (nats) of the full distribution, from
    ``[..., V]`` logits of any float dtype (computed in float32); ``H`` is None unless ``entropy``.
    Shapes: ``targets`` and both outputs ``[...]``. :func:`state_token_stats`' statistics, and what
    ``maskrl plan`` profiles for its memory (:class:`maskrl.plan.memory.ActivationModel`)."""
    logp = torch.log_softmax(logits.float(), -1)
    p = logp.gather(-1, targets[..., None]).squeeze(-1).exp()
    return p, (-(logp.exp() * logp).sum(-1) if entropy else None)


@torch.no_grad()
def state_token_stats(policy: Any, rollout: Rollout, need: torch.Tensor, entropy: bool = False,
                      chunk: int = 16, max_elements: int = STATE_MAX_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Current probability of the completion's token (and the entropy of the full distribution) at
    the ``need`` positions, each in the state x_s of its row (positions with ``commit_step >=
    commit_step[i]`` masked; with :func:`state_rollout` rows every needed position of a row shares
    one state). The prompt is not masked. No gradient.

    Args:
        policy: a :class:`maskrl.models.adapter.ModelAdapter`.
        rollout: M rows; need: ``[M, L]`` bool (every needed position of a row must share one
            commit step).
        entropy: also return ``H [M, L]`` (nats).
        chunk: at most this many rows per forward.
        max_elements: fewer rows per forward when ``rows · (needed positions per row) · V`` would
            exceed this (the ``[r, k, V]`` float32 logits of a forward; 2^25 = 128 MiB), down to one
            (:func:`state_chunk_rows`; V is the policy's ``logits_vocab``).

    Returns:
        ``(p [M, L] float32, H [M, L] float32 or None)``, 0 where ``need`` is False.

    Raises:
        ValueError: if a row's needed positions span more than one state.
    """
    cs = rollout.commit_step.long()
    m, L = cs.shape
    p = torch.zeros(m, L, dtype=torch.float32, device=cs.device)
    h = torch.zeros(m, L, dtype=torch.float32, device=cs.device) if entropy else None
    big = torch.iinfo(torch.long).max
    vocab = getattr(policy, "logits_vocab", None) or 1
    k_max = int(need.sum(-1).max().item()) if need.numel() else 0
    chunk = state_chunk_rows(k_max, vocab, chunk, max_elements)
    for a in range(0, m, chunk):
        b = min(m, a + chunk)
        nd, c = need[a:b], cs[a:b]
        if not nd.any():
            continue
        s_lo = torch.where(nd, c, torch.full_like(c, big)).min(-1).values
        s_hi = torch.where(nd, c, torch.full_like(c, -1)).max(-1).values
        has = nd.any(-1)
        if (has & (s_lo != s_hi)).any():
            bad = int((has & (s_lo != s_hi)).nonzero()[0].item()) + a
            raise ValueError(f"state_token_stats: row {bad} needs positions of more than one state")
        s = torch.where(has, s_lo, torch.zeros_like(s_lo))
        hidden = c >= s[:, None]
        comp = torch.where(hidden, policy.mask_id, rollout.completion_ids[a:b])
        x = torch.cat([rollout.prompt_ids[a:b], comp], 1)
        attn = torch.cat([rollout.prompt_mask[a:b].bool(), torch.ones_like(comp, dtype=torch.bool)], 1)
        # columns of each row's needed positions, padded with the row's first needed column to k_max: every
        # forward scores k_max positions a row, so its work does not depend on the rows' order
        order = torch.sort(nd.long(), dim=1, descending=True, stable=True).indices[:, :k_max]  # [r, k_max]
        valid = torch.gather(nd, 1, order)
        cols = torch.where(valid, order, order[:, :1])
        logits = policy.logits_at(x, attn, cols + rollout.prompt_ids.shape[1])  # [r, k_max, V]
        tgt = torch.gather(rollout.completion_ids[a:b], 1, cols)
        pv, hv = token_stats(logits, tgt, entropy)
        del logits
        rr = torch.arange(b - a, device=cs.device)[:, None].expand_as(cols)
        p[a + rr[valid], cols[valid]] = pv[valid]
        if entropy:
            h[a + rr[valid], cols[valid]] = hv[valid]
    return p, h


def keep_filter(masked: torch.Tensor, own: torch.Tensor, prob: torch.Tensor, valid: torch.Tensor,
                threshold: float) -> torch.Tensor:
    """RLDF's filter (docs/spec.md §1.5): of the positions masked at the state, keep those committed at the
    step (``own``) and the others whose current probability of the final token is ``>= threshold``.

    Args:
        masked, own, valid: ``[M, L]`` bool (``own`` ⊆ ``masked``); prob: ``[M, L]`` float.
        threshold: 0.6 in RLDF.

    Returns:
        ``[M, L]`` bool, the trained positions.
    """
    return masked & valid & (own | (prob >= threshold))


def check_state_likelihood(ctx: CreditContext, who: str) -> Any:
    """The context's likelihood, which must be the ``state`` estimator (the module's term scores
    recorded states)."""
    if not isinstance(ctx.likelihood, State):
        raise ValueError(f"credit module {who} needs the 'state' likelihood (likelihood: {{name: state}}), got "
                         f"{type(ctx.likelihood).__name__}")
    return ctx.likelihood


def steps_term(batch: CreditBatch, ctx: CreditContext, rows: torch.Tensor, steps: torch.Tensor, keep_threshold: float,
               entropy: bool = False) -> dict:
    """The shared part of ``rldf_steps`` and ``dtca``: the chosen states, their filter and
    probabilities.

    Returns:
        dict with ``rollout`` (M state rows), ``masked``, ``own``, ``keep`` (``[M, L]`` bool),
        ``prob``, ``entropy`` (``[M, L]`` float32; entropy None unless asked) and ``advantages``
        (``[M, L]`` float32, the batch's per-token advantages of each row, 0 outside ``keep``).
    """
    ro = batch.rollout
    sro = state_rollout(ro, rows, steps)
    cs = ro.commit_step[rows].long()
    masked = masked_at(cs, steps)
    own = cs == steps[:, None]
    valid = ro.completion_mask[rows]
    prob, ent = state_token_stats(ctx.policy, sro, masked & valid, entropy=entropy)
    keep = keep_filter(masked, own, prob, valid, keep_threshold)
    adv = torch.where(keep, batch.advantages[rows], torch.zeros_like(batch.advantages[rows]))
    return {"rollout": sro, "masked": masked & valid, "own": own & valid, "keep": keep, "prob": prob,
            "entropy": ent, "advantages": adv.float()}


def replace_base(batch: CreditBatch, ctx: CreditContext, parts: dict, name: str, weight: float,
                 advantages: torch.Tensor, metrics: dict) -> CreditBatch:
    """The batch with the base term off (weight 0, empty mask: no forward) and one term ``name`` on
    the chosen states."""
    term = LossTerm(name=name, weight=weight, rollout=parts["rollout"], advantages=advantages.float(),
                    mask=parts["keep"], objective=ctx.objective, likelihood=ctx.likelihood)
    return dataclasses.replace(batch, base_weight=0.0, loss_mask=torch.zeros_like(batch.loss_mask),
                               terms=(*batch.terms, term), metrics=metrics)


def check_step_sampling(k: int, temperature: float, keep_threshold: float) -> None:
    """Validate the step-sampling fields RLDF and DTCA share (docs/spec.md §1.5 rldf).

    Raises:
        ValueError: naming the field: ``k < 1``, ``temperature <= 0`` or ``keep_threshold`` outside [0, 1].
    """
    if k < 1:
        raise ValueError(f"k (={k}) must be >= 1")
    if not temperature > 0:
        raise ValueError(f"temperature (={temperature}) must be > 0")
    if not 0.0 <= keep_threshold <= 1.0:
        raise ValueError(f"keep_threshold (={keep_threshold}) must lie in [0, 1]")


@CREDITS.register("rldf_steps")
@dataclass(frozen=True)
class RLDFSteps(CreditModule):
    """Registered as ``rldf_steps`` (docs/spec.md §1.5 ``rldf``): train on k sampled denoising states per
    sequence instead of every token at its own commit state.

    Use with ``objective: {name: rldf}`` (ε 0.2, β 0.01, ``mean_std``; its ``seq_mean`` aggregation
    averages over the chosen states) and the ``state`` likelihood (required), rollouts with the
    threshold sampler (``rollout.schedule: threshold``), as in RLDF.

    Attributes:
        k: steps per sequence (default 4); a sequence with fewer steps trains on all of them.
        temperature: T of ``softmax(w_s / T)`` (default 1).
        keep_threshold: the filter's probability threshold (default 0.6).
        weight: weight of the ``rldf`` loss term (default 1).

    Metrics (``credit/rldf_steps/...``): ``states_per_seq``, ``kept_per_state`` (trained tokens per
    state), ``filter_keep_frac`` (kept share of the masked positions not committed at the step).
    """

    k: int = 4
    temperature: float = 1.0
    keep_threshold: float = 0.6
    weight: float = 1.0

    def __post_init__(self) -> None:
        check_step_sampling(self.k, self.temperature, self.keep_threshold)

    def observers(self, sampler: Any, generator: torch.Generator) -> list[CommitProbObserver]:
        """With a cache: θ's exact ``p_i`` (:func:`commit_observers`); none otherwise."""
        return commit_observers(sampler)

    def choose(self, batch: CreditBatch, ctx: CreditContext) -> torch.Tensor:
        """``[N, k]`` long chosen steps (``-1`` padding), see :func:`sample_steps`."""
        ro = batch.rollout
        w, present = step_surprise(ro.commit_step, commit_probs(ro, "rldf_steps"), ro.completion_mask)
        return sample_steps(w, present, self.k, self.temperature, ctx.generator)

    def __call__(self, batch: CreditBatch, ctx: CreditContext) -> CreditBatch:
        check_state_likelihood(ctx, "rldf_steps")
        refuse_edited(batch.rollout, "rldf_steps")
        rows, steps = chosen_pairs(self.choose(batch, ctx))
        parts = steps_term(batch, ctx, rows, steps, self.keep_threshold)
        return replace_base(batch, ctx, parts, "rldf", self.weight, parts["advantages"], filter_metrics(parts, batch))


def filter_metrics(parts: dict, batch: CreditBatch) -> dict:
    """``states_per_seq``, ``kept_per_state``, ``filter_keep_frac`` of a steps term (shares of this
    process's rows, :mod:`maskrl.credit.base`)."""
    m = parts["keep"].shape[0]
    others = parts["masked"] & ~parts["own"]
    n_other = int(others.sum())
    n = batch.rollout.batch_size
    return {"states_per_seq": ShareMean(m / max(1, n), n),
            "kept_per_state": ShareMean(parts["keep"].sum().item() / max(1, m), m),
            "filter_keep_frac": ShareMean((parts["keep"] & others).sum().item() / n_other if n_other else 1.0, n_other)}
