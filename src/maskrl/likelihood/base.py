"""What every likelihood estimator shares (docs/spec.md §1.4; docs/architecture.md "Budgets in forward rows").

An estimator is a frozen dataclass registered in :data:`maskrl.likelihood.LIKELIHOODS`. Its fields
are its hyper-parameters (the YAML section ``likelihood: {name: ..., **fields}``); it is called as
``estimator(adapter, rollout, generator, need) -> ℓ [N, L]`` and says what a call costs with
``estimator.rows(rollout, need) -> [N]`` (forward rows per sequence), so that the trainer can split
work to ``train.max_forward_rows`` without running it. ``need`` (``[N, L]`` bool, default: every
position) names the positions whose log-prob is wanted; the others come back as 0 and cost nothing
in the output layer.

**Named outputs.** An estimator that computes more than one per-token quantity from the same masks
returns a :class:`PerToken` record of named ``[N, L]`` tensors and declares their names in a class
attribute ``provides`` (``spg_bounds``: ``("elbo", "eubo")``); one that returns a plain tensor
provides ``("logp",)`` and need not say so. An objective names what it reads (``reads``, default
``("logp",)``); :func:`per_token_output` is the one check of the seam (shapes, devices, dtypes and
names), and :func:`check_pairing` refuses a mismatched pair at config time.

**Forwards.** A call whose ``need`` has a position runs the model at least once whatever its masks
draw (a draw that scores none of the needed positions still runs one forward, with a zero
contribution), so that every process of a sharded run (FSDP, ZeRO-3) runs the same forwards; a call
with ``rows() == 0`` runs none.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Protocol

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.registry import Registry
from maskrl.types import Rollout

#: the registered likelihood estimators (``likelihood: {name: ...}``); each built-in registers itself in
#: its own file
LIKELIHOODS: Registry = Registry("likelihood")


class Likelihood(Protocol):
    """Protocol of a registered likelihood estimator (see the module docstring)."""

    def rows(self, rollout: Rollout, need: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` long: forward rows a call on ``rollout`` costs per sequence."""
        ...

    def __call__(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                 need: torch.Tensor | None = None) -> "torch.Tensor | PerToken":
        """``[N, L]`` float32 per-token log-probs (0 where ``need`` is False), or a :class:`PerToken`
        of such tensors named as the class attribute ``provides`` says."""
        ...


def needed(rollout: Rollout, need: torch.Tensor | None) -> torch.Tensor:
    """``need`` checked against the rollout (``[N, L]`` bool), or all True when ``None``.

    Raises:
        ValueError: if ``need`` is not ``[N, L]``.
    """
    shape = rollout.completion_ids.shape
    if need is None:
        return torch.ones(shape, dtype=torch.bool, device=rollout.completion_ids.device)
    if need.shape != shape:
        raise ValueError(f"need has shape {tuple(need.shape)}, expected the completion's {tuple(shape)}")
    return need.bool()


def scored_or_one(scored: torch.Tensor, seq: torch.Tensor, need: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(r_idx [M], i_idx [M], dummy)``: the (row, position) pairs of ``scored [R, L]`` bool; where it holds
    none, the first row of the first sequence with a needed position and that position, with ``dummy`` True:
    a call with a needed position still runs one forward (the equal-forwards rule of
    :meth:`maskrl.trainer.RLTrainer.optimize`), whose value the caller multiplies by 0. ``seq [R]`` long: each
    row's sequence; ``need [N, L]`` bool holds at least one True."""
    r_idx, i_idx = scored.nonzero(as_tuple=True)
    if r_idx.numel():
        return r_idx, i_idx, False
    s0 = int(need.any(-1).nonzero()[0, 0])
    return (seq == s0).nonzero()[:1, 0], need[s0].nonzero()[:1, 0], True


def score_positions(adapter: ModelAdapter, prompt: torch.Tensor, prompt_mask: torch.Tensor,
                    completion: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                    targets: torch.Tensor) -> torch.Tensor:
    """The one scoring helper of every estimator: log-probs of ``targets`` at chosen completion
    positions of R input rows, with the output layer applied to those positions only
    (:meth:`maskrl.models.adapter.ModelAdapter.log_probs_at`).

    Args:
        adapter: the model.
        prompt: ``[R, P]`` long, the (possibly masked) prompts of the input rows.
        prompt_mask: ``[R, P]`` bool, True on real prompt tokens.
        completion: ``[R, L]`` long, the completion part of each input row (``[M]`` where hidden).
        rows: ``[M]`` long, input row of each scored position.
        cols: ``[M]`` long, completion position (0..L-1) of each scored token.
        targets: ``[M]`` long, the tokens to score.

    Returns:
        ``[M]`` float32 log-probabilities.
    """
    x = torch.cat([prompt, completion], 1)  # [R, P+L]
    attn = torch.cat([prompt_mask.bool(), torch.ones_like(completion, dtype=torch.bool)], 1)
    return adapter.log_probs_at(x, attn, rows, cols + prompt.shape[1], targets)


def scatter_scores(values: torch.Tensor, n_idx: torch.Tensor, i_idx: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``[N, L]`` float32 zeros with ``values [M]`` written at ``(n_idx, i_idx)`` (differentiable)."""
    out = torch.zeros(shape, dtype=torch.float32, device=values.device)
    return out.index_put((n_idx, i_idx), values)


#: the name of a likelihood's one tensor when it returns a plain ``[N, L]`` tensor
LOGP = "logp"


class PerToken:
    """Named per-token tensors: what a likelihood returns when one ``[N, L]`` tensor is not enough
    (``spg_bounds``: ``PerToken(elbo=..., eubo=...)``, the two bounds of docs/spec.md §1.5 from the same masks).

    A small frozen record: ``record["elbo"]`` or ``record.elbo`` reads a tensor, ``names`` lists them,
    ``detach()`` detaches each. A likelihood that returns one declares ``provides = (names...)``; an
    objective that reads one declares ``reads = (names...)`` and receives the record (see
    :func:`per_token_output`, the seam's one check).

    Args:
        **tensors: name -> ``[N, L]`` float tensor (at least one).

    Raises:
        ValueError: no tensor given.
    """

    __slots__ = ("_tensors",)

    def __init__(self, **tensors: torch.Tensor) -> None:
        if not tensors:
            raise ValueError("PerToken needs at least one named tensor")
        object.__setattr__(self, "_tensors", MappingProxyType(dict(tensors)))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("PerToken is frozen")

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"no per-token tensor {name!r}; this record has {', '.join(self._tensors)}") from None

    def __getattr__(self, name: str) -> torch.Tensor:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._tensors[name]
        except KeyError:
            raise AttributeError(f"no per-token tensor {name!r}; this record has {', '.join(self._tensors)}") from None

    @property
    def names(self) -> tuple[str, ...]:
        """The tensors' names, in the order given."""
        return tuple(self._tensors)

    def items(self):
        """``(name, tensor)`` pairs."""
        return self._tensors.items()

    def detach(self) -> "PerToken":
        """The same record with every tensor detached."""
        return PerToken(**{k: v.detach() for k, v in self._tensors.items()})

    def __repr__(self) -> str:
        return "PerToken(" + ", ".join(f"{k}=[{', '.join(map(str, v.shape))}]" for k, v in self._tensors.items()) + ")"


def provides(likelihood: object) -> tuple[str, ...]:
    """The per-token tensors ``likelihood`` returns: its ``provides`` class attribute, ``("logp",)``
    for a likelihood that returns one tensor (the default, so plug-ins need not say)."""
    return tuple(getattr(likelihood, "provides", (LOGP,)))


def reads(objective: object) -> tuple[str, ...]:
    """The per-token tensors ``objective`` reads: its ``reads`` class attribute (default ``("logp",)``)."""
    return tuple(getattr(objective, "reads", (LOGP,)))


def check_pairing(objective: object, likelihood: object) -> None:
    """Raise when ``likelihood`` does not provide every tensor ``objective`` reads.

    Raises:
        ValueError: naming the missing tensors, what the likelihood provides, and both classes.
    """
    missing = [n for n in reads(objective) if n not in provides(likelihood)]
    if missing:
        raise ValueError(f"likelihood {type(likelihood).__name__} provides {', '.join(provides(likelihood))} per "
                         f"token, but objective {type(objective).__name__} reads {', '.join(reads(objective))} "
                         f"(missing: {', '.join(missing)}); pick a likelihood that provides them")


def tensors_of(values: torch.Tensor | PerToken) -> dict[str, torch.Tensor]:
    """``{name: [N, L] tensor}`` of a likelihood output (a plain tensor is ``{"logp": it}``)."""
    return dict(values.items()) if isinstance(values, PerToken) else {LOGP: values}


def per_token_output(out: object, need: torch.Tensor, objective: object, who: str) -> torch.Tensor | PerToken:
    """The seam between a likelihood and an objective: check a likelihood's output and hand on what
    the objective reads (the trainer's one place that looks at it; it knows no estimator by name).

    Every named tensor must be a real floating-point ``[N, L]`` tensor on ``need``'s device.

    Args:
        out: what the likelihood returned (an ``[N, L]`` tensor or a :class:`PerToken`).
        need: ``[N, L]`` bool, the positions asked for (its shape and device are the contract).
        objective: the consumer; its ``reads`` names the tensors it gets.
        who: where, for error messages (e.g. ``"loss term 'base': likelihood ELBO"``).

    Returns:
        The plain tensor when the objective reads ``("logp",)`` only and the likelihood returned one
        tensor (or a record with a ``logp``); else a :class:`PerToken` of the tensors it reads.

    Raises:
        ValueError: a wrong type, shape, device or dtype (naming the tensor), or a tensor the
            objective reads that the output lacks.
    """
    if not isinstance(out, (torch.Tensor, PerToken)):
        raise ValueError(f"{who} returned {type(out).__name__}; expected an [N, L] tensor or a PerToken record")
    got = tensors_of(out)
    for name, t in got.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{who}: per-token {name!r} is {type(t).__name__}, not a tensor")
        if t.shape != need.shape or t.device != need.device:
            raise ValueError(f"{who}: per-token {name!r} has shape {tuple(t.shape)} on {t.device}; "
                             f"expected [N, L] = {tuple(need.shape)} on {need.device}")
        if not t.is_floating_point():
            raise ValueError(f"{who}: per-token {name!r} has dtype {t.dtype}; expected a real floating-point dtype")
    want = reads(objective)
    missing = [n for n in want if n not in got]
    if missing:
        raise ValueError(f"{who} provides {', '.join(got)} per token; objective {type(objective).__name__} reads "
                         f"{', '.join(want)} (missing: {', '.join(missing)})")
    if want == (LOGP,):
        return got[LOGP]
    return PerToken(**{n: got[n] for n in want})
