"""Denoising Progress Scores (DPS; docs/spec.md §2.1, DACA-GRPO): temporal credit from logits the sampler
computes anyway -- no extra forward pass.

With M_k the masked completion positions before step k and C_k those committed at step k
(M_{k+1} = M_k \\ C_k), ``S(k', k+1) = mean_{j∈M_{k+1}} log p_θ(y_j | x_{k'})`` for k' ∈ {k, k+1} and
``δ_k = S(k+1, k+1) − S(k, k+1)``: how much committing C_k sharpened the model's belief about what
is still masked. With ``dps_target: confidence`` ``y_j`` is the model's argmax at that step, so
``log p(y_j | x) = max_v logit − logsumexp(logit)``; with ``dps_target: final`` ``y_j`` is the token
finally committed at j, looked up in a per-step top-k cache (the k-th value as a floor outside it).

Under ``rollout.cache: prefix | dual`` the observer declares ``exact_logits``: every step's view is
θ's full forward at the pre-step state (or the sampler refuses, ``rollout.observer_logits:
refuse``), so δ is the same as without a cache on the same trajectory.

Online, O(T) memory: at step k the observer records, per decoded row, two numbers:
``S(k, k+1)`` (step k's logits averaged over M_{k+1}; key ``dps_s_next``) and ``S(k, k)`` (step k's
logits over M_k; key ``dps_s_self``). Then ``δ_k = dps_s_self[k+1] − dps_s_next[k]``. The last step
of a row has M_{k+1} = ∅ and δ = 0 (weight 1), as does any step whose M_{k+1} is empty in scope.

Normalisation over the **global** batch (``ctx.reduce``): ``per_step`` z-scores each step index over
the rows that took it (all rows share it under the fixed schedule), ``pooled`` z-scores all
(row, step) pairs at once (the threshold schedule); the std is the population std, and
``δ̄ = (δ − mean)/(std + 1e-6)`` is clipped to [−c, c]. Token advantages become
``A_i = A_i·(1 + λ·δ̄_{birth(i)})`` with ``birth(i) = rollout.commit_step``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from maskrl.credit.base import CREDITS, CreditBatch, CreditContext, CreditModule
from maskrl.credit.base import ShareMean, ShareStd
from maskrl.sampling.edit import refuse_edited

DPS_TARGETS = ("confidence", "final")
DPS_SCOPES = ("all", "block")
DPS_NORMALIZE = ("auto", "per_step", "pooled")
EPS = 1e-6


def _scope_sets(view: Any, scope: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M_k, M_{k+1})`` in scope, both ``[n, L]`` bool, from a step view."""
    before = view.masked
    if scope == "block":
        pos = torch.arange(before.shape[1], device=before.device)
        start = view.block_start[:, None]
        before = before & (pos[None, :] >= start) & (pos[None, :] < start + view.block_length)
    return before, before & ~view.committed


def _set_means(values: torch.Tensor, before: torch.Tensor, after: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Means of ``values [n, L]`` over ``after`` and ``before`` (``[n]`` each; NaN on an empty set)."""

    def mean(where: torch.Tensor) -> torch.Tensor:
        cnt = where.sum(-1)
        s = (values * where).sum(-1)
        return torch.where(cnt > 0, s / cnt.clamp(min=1), torch.full_like(s, float("nan")))

    return mean(after), mean(before)


def step_record(view: Any, scope: str = "all", target: str = "confidence", top_k: int = 16) -> tuple:
    """What DPS keeps of one sampler step -- the only function that reads a :class:`StepView`.

    Args:
        view: :class:`maskrl.sampling.StepView` of step k: ``logits [n, L, V]`` (the ``[M]`` logit
            already −inf), ``masked [n, L]`` (M_k), ``committed [n, L]`` (C_k), ``tokens [n, L]``,
            ``block_start [n]``, ``block_length``, ``rows [n]``, ``step``.
        scope: ``"all"`` (the whole completion) or ``"block"`` (the row's current block).
        target: ``"confidence"``: returns ``(s_next [n], s_self [n])`` float32, the mean log max-prob of
            step k's logits over M_{k+1} and over M_k (NaN on an empty set). ``"final"``: returns
            ``(before [n, L] bool, after [n, L] bool, top_lp [m, k] float32, top_ids [m, k] long,
            committed [n, L] bool, tokens [n, L] long)`` with the top-k log-probs of the m positions
            of M_k.

    Log-probs are computed only at the positions of M_k (``max − logsumexp`` / ``topk − logsumexp``
    of those rows of logits; no ``[n, L, V]`` log-softmax).
    """
    before, after = _scope_sets(view, scope)
    if (before & ~view.covered).any():
        raise ValueError("DPS: the sampler did not compute logits at every position in scope; the observer's "
                         "logit_scope must cover them")
    if target == "final":
        sel = view.logits[before[view.covered]]  # [m, V]: the covered positions that are in M_k
        k = min(top_k, sel.shape[-1])
        top = sel.topk(k, dim=-1)
        lse = torch.logsumexp(sel.float(), -1, keepdim=True) if sel.numel() else sel.new_zeros((0, 1)).float()
        return before, after, top.values.float() - lse, top.indices, view.committed.clone(), view.tokens.clone()
    lmp = view.max_log_prob.nan_to_num(0.0)  # [n, L] float32, computed once by the view (chunked)
    return _set_means(lmp, before, after)


def progress_pair(view: Any, scope: str = "all") -> tuple[torch.Tensor, torch.Tensor]:
    """``(s_next [n], s_self [n])`` of one step for ``dps_target: confidence`` (see :func:`step_record`)."""
    return step_record(view, scope, "confidence")


class DPSObserver:
    """Sampler observer for DPS.

    ``target="confidence"``: records :func:`progress_pair` per decoded row and step -- two floats per
    (row, step), O(T) memory. ``target="final"``: keeps a per-step top-k cache of the log-probs at the
    masked positions (O(T·L·k)); at the end each position's final token is looked up in it, a token
    outside the top-k getting the k-th value as a floor (docs/spec.md §2.1).

    ``result()``: ``{"dps_s_next": [N, T], "dps_s_self": [N, T]}`` float32, NaN where a row did not
    take a step (threshold schedule) or the set was empty.

    ``exact_logits = True``: δ is defined on θ's distribution at the rollout's states (docs/spec.md §2.1), so
    under a key/value cache the sampler gives every step's view exact logits (one extra full forward
    per cached step, :attr:`maskrl.sampling.SamplerConfig.observer_logits`) or refuses; DPS never
    mixes cached and exact logits (issue 19: cached logits moved δ by up to 0.2 nats on the
    sharpened tiny model, ``benchmarks/fidelity/fidelity_sml_dps.py``).
    """

    exact_logits = True

    def __init__(self, scope: str = "all", target: str = "confidence", top_k: int = 16) -> None:
        self.scope, self.target, self.top_k = scope, target, top_k
        # which logits the sampler must compute at each step (maskrl.sampling.StepObserver)
        self.logit_scope = "masked" if scope == "all" else "block"
        self.records: list[tuple[int, torch.Tensor, tuple]] = []

    def on_step(self, view: Any) -> None:
        self.records.append((int(view.step), view.rows.clone(), step_record(view, self.scope, self.target, self.top_k)))

    def _final_pairs(self, n: int, L: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        final = torch.full((n, L), -1, dtype=torch.long, device=device)
        for _, rows, (_, _, _, _, committed, tokens) in self.records:
            sub = final[rows]
            final[rows] = torch.where(committed, tokens, sub)
        pairs = []
        for _, rows, (before, after, top_lp, top_ids, _, _) in self.records:
            vals = torch.zeros(before.shape, dtype=torch.float32, device=device)
            if top_lp.numel():
                y = final[rows][before]  # [m] final tokens at the positions of M_k
                hit = top_ids == y[:, None]  # [m, k]
                vals[before] = torch.where(hit.any(-1), (top_lp * hit).sum(-1), top_lp[:, -1])
            pairs.append(_set_means(vals, before, after))
        return pairs

    def result(self) -> dict[str, torch.Tensor]:
        if not self.records:
            return {}
        n = max(int(r.max().item()) + 1 for _, r, _ in self.records if r.numel())
        t = max(k for k, _, _ in self.records) + 1
        device = self.records[0][1].device
        if self.target == "final":
            L = self.records[0][2][0].shape[1]
            pairs = self._final_pairs(n, L, device)
        else:
            pairs = [rec for _, _, rec in self.records]
        out = {key: torch.full((n, t), float("nan"), dtype=torch.float32, device=device)
               for key in ("dps_s_next", "dps_s_self")}
        for (k, rows, _), (s_next, s_self) in zip(self.records, pairs):
            out["dps_s_next"][rows, k] = s_next
            out["dps_s_self"][rows, k] = s_self
        return out


def progress_deltas(s_next: torch.Tensor, s_self: torch.Tensor, num_steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``δ_k = s_self[k+1] − s_next[k]`` per row.

    Args:
        s_next, s_self: ``[N, T]`` from :class:`DPSObserver`.
        num_steps: ``[N]`` long, steps each row took.

    Returns:
        ``(delta [N, T] float32, valid [N, T] bool)``: ``valid`` is False (and δ = 0) at each row's
        last step, at steps it did not take, and where M_{k+1} was empty in scope.
    """
    n, t = s_next.shape
    nxt = torch.cat([s_self[:, 1:], torch.full((n, 1), float("nan"), dtype=s_self.dtype, device=s_self.device)], 1)
    delta = nxt - s_next
    k = torch.arange(t, device=s_next.device)
    valid = (k[None, :] + 1 < num_steps[:, None].to(s_next.device)) & torch.isfinite(delta)
    return torch.where(valid, delta, torch.zeros_like(delta)), valid


def normalise_deltas(delta: torch.Tensor, valid: torch.Tensor, mode: str, clip: float,
                     reduce: Callable[[torch.Tensor, str], torch.Tensor], width: int | None = None) -> torch.Tensor:
    """z-score and clip δ over the global batch.

    Args:
        delta, valid: ``[N, T]`` from :func:`progress_deltas`.
        mode: ``"per_step"`` (statistics per step index) or ``"pooled"`` (over all valid pairs).
        clip: c; δ̄ is clipped to [−c, c].
        reduce: ``reduce(tensor, "sum")`` over processes (identity on one).
        width: the step dimension every process pads to for ``per_step`` (the same on all processes;
            default T).

    Returns:
        ``[N, T]`` float32 δ̄, 0 where not ``valid``.
    """
    n, t = delta.shape
    d, v = delta.double(), valid.double()
    if mode == "per_step":
        w = max(width or t, t)
        pad = lambda x: torch.nn.functional.pad(x, (0, w - t))  # noqa: E731
        cnt = reduce(pad(v.sum(0)), "sum")
        mean = (reduce(pad((d * v).sum(0)), "sum") / cnt.clamp(min=1))[:t]
        var = (reduce(pad((((d - mean) ** 2) * v).sum(0)), "sum") / cnt.clamp(min=1))[:t]
        mean, std = mean[None, :], var.sqrt()[None, :]
    elif mode == "pooled":
        cnt = reduce(v.sum().reshape(1), "sum")
        mean = reduce((d * v).sum().reshape(1), "sum") / cnt.clamp(min=1)
        var = reduce((((d - mean) ** 2) * v).sum().reshape(1), "sum") / cnt.clamp(min=1)
        std = var.sqrt()
    else:
        raise ValueError(f"dps_normalize {mode!r} is not one of ('per_step', 'pooled')")
    z = ((d - mean) / (std + EPS)).clamp(-clip, clip)
    return torch.where(valid, z, torch.zeros_like(z)).float()


@CREDITS.register("dps")
@dataclass(frozen=True)
class DPS(CreditModule):
    """Registered as ``dps`` (docs/spec.md §2.1; DACA-GRPO): ``A_i ← A_i·(1 + λ·δ̄_{birth(i)})``.

    Attributes:
        lam: λ **[choice]** (default 0.5); 0 leaves the advantages bit for bit.
        dps_target: **[choice]** ``"confidence"`` (default; y_j = the step's argmax; two numbers per
            row and step) or ``"final"`` (y_j = the token finally committed at j, from a per-step
            top-k log-prob cache of size T·L·k; outside the top-k, the k-th value as a floor).
        dps_scope: **[choice]** ``"all"`` (masked positions of the whole completion) or ``"block"``.
        dps_normalize: **[choice]** ``"per_step"``, ``"pooled"`` or ``"auto"`` (default: per_step
            for the fixed schedule, pooled for the threshold schedule, as docs/spec.md §2.1).
        clip: c, δ̄ clipped to [−c, c] (default 2).
        top_k: k of the ``final`` target's cache (default 16).

    Metrics (``credit/dps/...``, of the whole batch on any number of processes,
    :mod:`maskrl.credit.base`): ``delta_mean``, ``delta_std`` (raw δ over
    valid pairs), ``weight_mean`` (mean ``1 + λ·δ̄`` over valid tokens), ``clipped_frac``.
    """

    lam: float = 0.5
    dps_target: str = "confidence"
    dps_scope: str = "all"
    dps_normalize: str = "auto"
    clip: float = 2.0
    top_k: int = 16

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k (={self.top_k}) must be >= 1")
        if self.dps_target not in DPS_TARGETS:
            raise ValueError(f"dps_target {self.dps_target!r} is not one of {DPS_TARGETS}")
        if self.dps_scope not in DPS_SCOPES:
            raise ValueError(f"dps_scope {self.dps_scope!r} is not one of {DPS_SCOPES}")
        if self.dps_normalize not in DPS_NORMALIZE:
            raise ValueError(f"dps_normalize {self.dps_normalize!r} is not one of {DPS_NORMALIZE}")
        if not self.clip > 0:
            raise ValueError(f"clip (={self.clip}) must be > 0")

    def observers(self, sampler: Any, generator: torch.Generator) -> list[DPSObserver]:
        """One fresh :class:`DPSObserver` per rollout (``generator`` unused: DPS draws nothing)."""
        return [DPSObserver(self.dps_scope, self.dps_target, self.top_k)]

    def mode(self, sampler: Any) -> str:
        """The normalisation actually used for ``sampler`` (resolves ``"auto"``)."""
        if self.dps_normalize != "auto":
            return self.dps_normalize
        return "pooled" if getattr(sampler, "schedule", "fixed") == "threshold" else "per_step"

    def scores(self, batch: CreditBatch, ctx: CreditContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(δ [N, T], valid [N, T], δ̄ [N, T])`` of the batch.

        Raises:
            ValueError: the rollout has no DPS statistics (the observer did not run).
        """
        ro = batch.rollout
        stats = ro.step_stats
        if "dps_s_next" not in stats or "dps_s_self" not in stats:
            raise ValueError("dps: rollout.step_stats has no 'dps_s_next'/'dps_s_self'; pass the module's observers "
                             "to generate()")
        delta, valid = progress_deltas(stats["dps_s_next"], stats["dps_s_self"], ro.num_steps)
        sampler = ro.sampler
        width = max(getattr(sampler, "steps", 0), getattr(sampler, "gen_length", 0)) if sampler is not None else None
        norm = normalise_deltas(delta, valid, self.mode(sampler), self.clip, ctx.reduce, width)
        return delta, valid, norm

    def __call__(self, batch: CreditBatch, ctx: CreditContext) -> CreditBatch:
        ro = batch.rollout
        refuse_edited(ro, "dps")
        delta, valid, norm = self.scores(batch, ctx)
        birth = ro.commit_step.long().clamp(max=norm.shape[1] - 1)
        weight = 1.0 + self.lam * norm.gather(1, birth)  # [N, L]
        adv = batch.advantages * weight
        tok = batch.loss_mask
        dv = delta[valid]
        n, n_tok = dv.numel(), int(tok.sum())
        mean = dv.mean().item() if n else 0.0
        # shares of this process's rows, combined over processes by the trainer (maskrl.credit.base)
        metrics = {"delta_mean": ShareMean(mean, n),
                   "delta_std": ShareStd(dv.std(unbiased=False).item() if n else 0.0, mean, n),
                   "weight_mean": ShareMean(weight[tok].mean().item() if n_tok else 1.0, n_tok),
                   "clipped_frac": ShareMean((norm[valid].abs() >= self.clip).float().mean().item() if n else 0.0, n)}
        return dataclasses.replace(batch, advantages=adv.float(), metrics=metrics)
