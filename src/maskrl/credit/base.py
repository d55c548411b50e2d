"""The credit-module seam (docs/architecture.md, "Seams for credit modules").

A credit module is a frozen dataclass registered in :data:`maskrl.credit.CREDITS`; its fields are its
hyper-parameters (one YAML entry ``credit: [{name: ..., **fields}, ...]``). It

1. names the sampler observers it needs for a sampler config (:meth:`CreditModule.observers`); the
   trainer passes every module's observers to :func:`maskrl.sampling.generate`, and their results
   land in ``rollout.step_stats``;
2. maps a collected :class:`CreditBatch` to a new one (``module(batch, ctx) -> CreditBatch``): it may
   reshape the per-token advantages ``[N, L]``, narrow the base term's loss mask (a step choice),
   scale the base term, add :class:`~maskrl.types.LossTerm` s, and report metrics (of its process's
   rows; a :class:`Share` where the whole batch's value is not the mean over processes, see the end
   of this file).

Modules are applied in the order of the YAML list (composable). They receive a narrow
:class:`CreditContext`, never the trainer. :func:`apply_credit` checks every module's output at the
seam, so a shape or device mistake fails there, naming the module.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch

from maskrl.registry import Registry
from maskrl.types import LossTerm, Rollout

#: the registered credit modules (``credit: [{name: ...}]``); each built-in registers itself in its own
#: file, a user's module in the user's package (``plugins:``)
CREDITS: Registry = Registry("credit module")


@dataclass(frozen=True)
class CreditBatch:
    """What credit modules transform: one collected batch (this process's rows).

    Attributes:
        rollout: the sampler's record, N rows (modules must not replace it).
        rewards: ``[N]`` float32 sequence rewards.
        advantages: ``[N, L]`` float32 per-token advantages of the base term; starts as the
            objective's sequence advantage ``A`` broadcast over ``completion_mask`` (docs/spec.md §1.5).
        loss_mask: ``[N, L]`` bool, the tokens the base term trains on; starts as ``completion_mask``.
        base_weight: weight of the base term in the summed loss (DiSPO's α_base); starts at 1.
        terms: extra loss terms added by modules.
        metrics: floats to log; the trainer prefixes them with ``credit/``. On several processes a plain
            float is logged as its mean over processes; a metric that is not a mean over rows (a mean
            over tokens or states, a count, a minimum, a standard deviation) is given as a
            :class:`~maskrl.credit.base.Share` so that the trainer logs the whole batch's value.
    """

    rollout: Rollout
    rewards: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    base_weight: float = 1.0
    terms: tuple[LossTerm, ...] = ()
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CreditContext:
    """The narrow view of the run a credit module gets.

    Attributes:
        rewards: ``[N]`` float32 sequence rewards (this process's rows).
        group_ids: ``[N]`` long, the prompt of each row.
        sequence_advantages: ``[N]`` float32, the base objective's advantages (docs/spec.md §1.3).
        score: ``score(rows [M] long, completion_ids [M, L] long) -> rewards [M] float32``: the task's
            reward of new completions for the prompts of batch rows ``rows`` (e.g. DiSPO's fillings),
            in one batched reward call. A completion ends at its first stop token.
        reduce: ``reduce(tensor, op) -> tensor`` with ``op`` in ``"sum" | "mean"``, over all
            processes (identity on one): batch statistics "over the batch" mean the global batch.
        generator: this module's own ``torch.Generator`` (CPU), seeded from ``train.seed``, its
            position in the list and the step; never the global RNG.
        policy: the rollout policy (eval mode); call it only under ``torch.no_grad()``.
        objective: the base objective instance.
        likelihood: the base likelihood instance.
        step: index of the RL step (0-based).
        num_processes: number of training processes.
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor
    sequence_advantages: torch.Tensor
    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    reduce: Callable[[torch.Tensor, str], torch.Tensor]
    generator: torch.Generator
    policy: Any
    objective: Any
    likelihood: Any
    step: int = 0
    num_processes: int = 1


class CreditModule:
    """Mixin for registered credit dataclasses: defaults for the optional parts of the protocol.

    Class attributes:
        needs_reference: True when a term the module adds reads a reference policy (the trainer
            then keeps one even if the base objective has β = 0).
    """

    needs_reference: ClassVar[bool] = False

    def observers(self, sampler: Any, generator: torch.Generator) -> Sequence[Any]:
        """Sampler observers (:class:`maskrl.sampling.StepObserver`) this module needs for the
        sampler config ``sampler``; their results are in ``rollout.step_stats``. Default: none.

        ``generator`` (CPU) is this module's for this rollout: the trainer seeds it from
        (``train.seed``, the module's index, the step, the process), so runs with different seeds
        draw differently and a resumed run draws as the uninterrupted one; observers must not use
        the sampler's generator (the main rollout stays bit-identical with them on or off)."""
        return ()

    def __call__(self, batch: CreditBatch, ctx: CreditContext) -> CreditBatch:  # pragma: no cover - protocol
        raise NotImplementedError

    def for_planning(self) -> "CreditModule":
        """This module as ``maskrl plan`` runs it on its stand-in (a tiny model with random rewards,
        :mod:`maskrl.plan.work`): the same forwards, with any work that depends on the rewards or
        the text at its worst case, and inputs the stand-in cannot feed that only reweight (a file,
        a tagger of the text) dropped. The planner records what this module runs; a module whose
        work the data decides overrides this so that the plan sizes memory and time for the bound.
        Default: the module itself."""
        return self

    def planned_rows(self, sequences: int) -> int | None:
        """Upper bound on the forward rows of the loss terms this module adds per RL step and process,
        for ``sequences`` = B·G rollouts (unit: sequences of P + L tokens in one θ pass, before
        micro-batching and μ) -- what :meth:`for_planning`'s worst case runs, stated for the plan's
        notes and tests. Default: ``None`` (no bound stated; the plan counts what the stand-in runs)."""
        return None


def check_credit_batch(out: Any, before: CreditBatch, who: str) -> CreditBatch:
    """Validate a module's output at the seam.

    Raises:
        TypeError: the module did not return a :class:`CreditBatch`.
        ValueError: a replaced rollout or rewards, a wrong shape / dtype / device, non-finite
            advantages, or a duplicate term name; the message names the module (``who``).
    """
    if not isinstance(out, CreditBatch):
        raise TypeError(f"credit module {who} returned {type(out).__name__}, expected a CreditBatch")
    if out.rollout is not before.rollout or out.rewards is not before.rewards:
        raise ValueError(f"credit module {who} replaced the rollout or the rewards; return a batch with the same "
                         "ones (dataclasses.replace(batch, advantages=...))")
    shape = tuple(before.rollout.completion_ids.shape)
    device = before.rollout.completion_ids.device
    for name in ("advantages", "loss_mask"):
        t = getattr(out, name)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"credit module {who}: {name} must be [N, L] = {shape}, got {got}")
        if t.device != device:
            raise ValueError(f"credit module {who}: {name} is on {t.device}, the rollout on {device}")
    if out.advantages.dtype != torch.float32:
        raise ValueError(f"credit module {who}: advantages must be float32, got {out.advantages.dtype}")
    if out.loss_mask.dtype != torch.bool:
        raise ValueError(f"credit module {who}: loss_mask must be bool, got {out.loss_mask.dtype}")
    if not torch.isfinite(out.advantages).all():
        bad = (~torch.isfinite(out.advantages)).any(-1).nonzero().squeeze(-1).tolist()
        raise ValueError(f"credit module {who}: non-finite advantages in rows {bad[:8]}")
    if not math.isfinite(float(out.base_weight)):
        raise ValueError(f"credit module {who}: base_weight {out.base_weight!r} is not finite")
    names = [t.name for t in out.terms]
    for t in out.terms:
        if not isinstance(t, LossTerm):
            raise TypeError(f"credit module {who}: terms must be LossTerm, got {type(t).__name__}")
    if "base" in names or len(set(names)) != len(names):
        raise ValueError(f"credit module {who}: loss term names must be unique and not 'base', got {names}")
    return out


def _base_trains(batch: CreditBatch) -> bool:
    return float(batch.base_weight) != 0.0 and bool(batch.loss_mask.any())


def apply_credit(modules: Sequence[tuple[str, Any]], batch: CreditBatch, contexts: Sequence[CreditContext]) -> CreditBatch:
    """Fold ``batch`` through ``modules`` (``(name, module)`` pairs, in order), each with its context,
    checking every output (:func:`check_credit_batch`); module metrics are namespaced
    ``<name>/<key>``.

    Raises:
        ValueError: besides :func:`check_credit_batch`'s errors, a module changes the base term's
            ``advantages`` after an earlier module turned the base term off (weight 0 or an empty loss
            mask, as ``rldf_steps`` / ``dtca`` do when they move training onto chosen states): the
            change would train nothing (e.g. ``[dtca, dps]``; ``[dps, dtca]`` carries DPS's token
            credit into DTCA's states). The message names both modules.
    """
    off_by = None  # the module that turned a training base term off
    for (name, module), ctx in zip(modules, contexts):
        out = check_credit_batch(module(dataclasses.replace(batch, metrics={}), ctx), batch, name)
        if off_by is not None and not torch.equal(out.advantages, batch.advantages):
            raise ValueError(f"credit module {name} changes the base term's advantages, but {off_by} (earlier in "
                             f"`credit:`) turned the base term off (weight 0 or an empty loss mask), so the change "
                             f"would train nothing: list {name} before {off_by}")
        if off_by is None and _base_trains(batch) and not _base_trains(out):
            off_by = name
        merged = dict(batch.metrics)
        merged.update({f"{name}/{k}": v if isinstance(v, Share) else float(v) for k, v in out.metrics.items()})
        batch = dataclasses.replace(out, metrics=merged)
    return batch


# ------------------------------------------------------------------ metrics that add up over processes
# Credit metrics that add up over processes: a module's metric of its process's share of the batch,
# with what the trainer needs to make it the whole batch's (issue 50 §1).
#
# On N processes each credit module sees only its process's rows. A plain float metric is logged as
# the mean over processes of the processes' values, which is the whole batch's value only for a mean
# over rows (every process has as many). A metric that is a mean over a varying number of items
# (tokens, branched states, kept states), a count, a minimum / maximum or a standard deviation is
# returned as one of the classes below: a ``float`` (the share's own value, so the module's output
# reads and compares as before) that also carries the share's count (and mean). The trainer gathers
# every process's values and logs :func:`combine` of them; on one process it logs the value itself.

class Share(float):
    """A metric of one process's share of the batch (a ``float`` of the share's value); subclasses say
    how shares combine (:meth:`combine`)."""

    def __getnewargs__(self) -> tuple:  # pickling (the trainer gathers shares across processes)
        return (float(self),)

    @classmethod
    def combine(cls, shares: Sequence["Share"]) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


class ShareMean(Share):
    """A mean over ``count`` items of the share (``count`` 0: the value is the module's default);
    combined: ``Σ count·value / Σ count``, the mean over every process's items (the mean of the
    values when no process has an item)."""

    def __new__(cls, value: float, count: float) -> "ShareMean":
        self = super().__new__(cls, value)
        self.count = float(count)
        return self

    def __getnewargs__(self) -> tuple:
        return float(self), self.count

    @classmethod
    def combine(cls, shares: Sequence["ShareMean"]) -> float:
        n = sum(s.count for s in shares)
        if n == 0:
            return sum(float(s) for s in shares) / len(shares)
        return sum(s.count * float(s) for s in shares) / n


class ShareCount(Share):
    """A count of the share's items (rows, states, ...); combined: the sum."""

    def __new__(cls, value: float) -> "ShareCount":
        return super().__new__(cls, value)

    @classmethod
    def combine(cls, shares: Sequence["ShareCount"]) -> float:
        return float(sum(float(s) for s in shares))


class ShareMin(ShareMean):
    """The minimum over ``count`` items (``count`` 0: a default); combined: the minimum over the shares
    that have items (the mean of the defaults when none has)."""

    @classmethod
    def combine(cls, shares: Sequence["ShareMin"]) -> float:
        have = [float(s) for s in shares if s.count > 0]
        return min(have) if have else sum(float(s) for s in shares) / len(shares)


class ShareMax(ShareMean):
    """The maximum over ``count`` items (``count`` 0: a default); combined as :class:`ShareMin`, by max."""

    @classmethod
    def combine(cls, shares: Sequence["ShareMax"]) -> float:
        have = [float(s) for s in shares if s.count > 0]
        return max(have) if have else sum(float(s) for s in shares) / len(shares)


class ShareStd(Share):
    """The population standard deviation of ``count`` items whose mean is ``mean``; combined: the pooled
    population standard deviation of every process's items,
    ``sqrt(Σ count·(std² + mean²) / Σ count − μ²)`` with ``μ = Σ count·mean / Σ count``."""

    def __new__(cls, value: float, mean: float, count: float) -> "ShareStd":
        self = super().__new__(cls, value)
        self.mean, self.count = float(mean), float(count)
        return self

    def __getnewargs__(self) -> tuple:
        return float(self), self.mean, self.count

    @classmethod
    def combine(cls, shares: Sequence["ShareStd"]) -> float:
        n = sum(s.count for s in shares)
        if n == 0:
            return sum(float(s) for s in shares) / len(shares)
        mu = sum(s.count * s.mean for s in shares) / n
        second = sum(s.count * (float(s) ** 2 + s.mean ** 2) for s in shares) / n
        return math.sqrt(max(second - mu * mu, 0.0))


def combine(values: Sequence[float]) -> float:
    """One metric's values on every process (rank order; a process without the metric left out) as
    the whole batch's value: :meth:`Share.combine` when they are shares of one kind, else their mean
    (plain floats: the mean over processes).

    Raises:
        ValueError: no value, or shares of different kinds for one metric.
    """
    if not values:
        raise ValueError("combine: no value")
    kinds = {type(v) for v in values}
    if len(kinds) == 1 and issubclass(next(iter(kinds)), Share):
        return next(iter(kinds)).combine(values)
    if any(isinstance(v, Share) for v in values):
        raise ValueError(f"combine: one metric reported as different kinds {sorted(k.__name__ for k in kinds)}")
    return sum(float(v) for v in values) / len(values)
