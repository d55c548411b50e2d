"""What every objective shares: the protocol, token-loss aggregation and the KL estimator (docs/spec.md §1.5).

An objective is a frozen dataclass registered in :data:`maskrl.objectives.OBJECTIVES`; its fields
are its hyper-parameters with its own defaults (the YAML section ``objective: {name: ..., **fields}``).
It is called on tensors only::

    objective(logp, logp_old, logp_ref, advantages [N, L], mask [N, L], normalizer) -> LossOutput

where ``logp`` (and ``logp_old``, ``logp_ref``) is an ``[N, L]`` tensor, or, for an objective that
declares ``reads = ("elbo", "eubo")`` (say), a :class:`maskrl.likelihood.base.PerToken` of those
named ``[N, L]`` tensors (the likelihood must provide them; checked at config time and at the seam).

and, through :class:`Objective`, declares what the trainer must provide: its default likelihood
estimator, whether it reads θ_old (a ratio) or a reference (a KL term), and how sequence rewards
become advantages (docs/spec.md §1.3).

**Metrics are shares.** Every value in ``LossOutput.metrics`` is computed with the same
``normalizer`` as the loss, so the batch value is the *sum* over its micro-batches (and the mean over
processes, whose normalisers are the global count divided by the number of processes). That is the
one metric rule of the trainer (issue "plug-in seams", item 4).
"""
from __future__ import annotations

from typing import Any, ClassVar, Mapping

import torch

from maskrl.advantages import NORMALIZE, group_advantages
from maskrl.registry import Registry

#: the registered objectives (``objective: {name: ...}``); each built-in registers itself in its own file
OBJECTIVES: Registry = Registry("objective")

AGGREGATIONS = ("token_mean", "seq_mean")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean",
              normalizer: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss to a scalar -- the one place every objective aggregates.

    Args:
        per_token: ``[N, L]`` float.
        mask: ``[N, L]`` bool/float, 1 on tokens that count.
        mode: **[choice]** ``"token_mean"`` (sum over all valid tokens / their number, d1) or
            ``"seq_mean"`` (mean over each sequence's tokens, then over sequences).
        normalizer: for ``token_mean``, divide by this instead of ``mask.sum()`` (micro-batching:
            the token count of the whole batch); for ``seq_mean``, the number of sequences.

    Returns:
        Scalar tensor.
    """
    m = mask.to(per_token.dtype)
    if mode == "token_mean":
        denom = normalizer if normalizer is not None else m.sum().clamp(min=1.0)
        return (per_token * m).sum() / denom
    if mode == "seq_mean":
        per_seq = (per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        denom = normalizer if normalizer is not None else max(per_token.shape[0], 1)
        return per_seq.sum() / denom
    raise ValueError(f"aggregation {mode!r} is not one of {AGGREGATIONS}")


#: bound ``c`` on the log-ratio ``d = ℓ_ref − ℓ`` inside the k3 KL, applied before ``exp``: the
#: input clamp of NeMo-RL's ``calculate_kl`` (``input_clamp_value = 20.0``) and of verl's
#: ``low_var_kl`` (``clamp(kl, -20, 20)``). ``e^20 − 21 ≈ 4.9e8`` is finite in float32 and bfloat16, while
#: an unclamped ``d = 100`` overflows float32 to ``inf``.
KL_LOG_RATIO_BOUND = 20.0


def kl3(logp: torch.Tensor, logp_ref: torch.Tensor, bound: float = KL_LOG_RATIO_BOUND) -> torch.Tensor:
    """Per-token ``k3`` KL estimate ``exp(d) − d − 1`` (≥ 0) with ``d = clamp(ℓ_ref − ℓ, −c, c)``
    (Schulman's k3 estimator of KL(π_θ ‖ π_ref); docs/spec.md §1.5).

    Args:
        logp: ``[...]`` float, ℓ under θ.
        logp_ref: same shape, ℓ under the reference.
        bound: ``c`` (default :data:`KL_LOG_RATIO_BOUND`, 20). Inside ``[−c, c]`` the value is the
            unclamped k3; outside, the estimate is held at its value at ``±c`` and the token gets no
            KL gradient (as in NeMo-RL and verl). :func:`kl3_clamped` says where that happens.

    Returns:
        Tensor of ``logp``'s shape and dtype, finite wherever both inputs are finite (NaN stays NaN).
    """
    d = (logp_ref - logp).clamp(-bound, bound)
    return torch.exp(d) - d - 1.0


def kl3_clamped(logp: torch.Tensor, logp_ref: torch.Tensor, bound: float = KL_LOG_RATIO_BOUND) -> torch.Tensor:
    """Bool tensor of ``logp``'s shape: True where ``|ℓ_ref − ℓ| > bound``, i.e. where :func:`kl3`'s
    clamp binds (logged as ``<term>/kl_clamp_frac``)."""
    return (logp_ref - logp).detach().abs() > bound


#: bound ``c`` on the log-ratio ``d = ℓ_θ − ℓ_θold`` of an importance ratio ``ρ = exp(d)``, applied
#: before ``exp``: the same bound as the KL's (:data:`KL_LOG_RATIO_BOUND`), and the clamp verl's PPO
#: losses put on ``log_prob − old_log_prob`` (``clamp(negative_approx_kl, -20, 20)``). ``e^20 ≈
#: 4.9e8`` is finite in float32 and bfloat16 and stays finite times any advantage below ~7e29, while an
#: unclamped ``d = 100`` gives ``ρ = inf`` and NaN gradients (``0·inf`` in ``exp``'s backward) even
#: where the clip would have cut the token's gradient. One bound for both terms: a token whose ratio
#: is held is a token that moved as far from θ_old as a held KL token from the reference.
RATIO_LOG_BOUND = KL_LOG_RATIO_BOUND


def importance_ratio(log_ratio: torch.Tensor, bound: float = RATIO_LOG_BOUND) -> torch.Tensor:
    """``ρ = exp(clamp(d, −c, c))`` for a log-ratio ``d = ℓ_θ − ℓ_θold`` (docs/spec.md §1.5's ratio, made finite).

    Args:
        log_ratio: ``[...]`` float, ``d`` (per token, or per sequence for GDPO), with grad.
        bound: ``c`` (default :data:`RATIO_LOG_BOUND`, 20). Inside ``[−c, c]`` value and gradient are
            ``exp(d)``'s bit for bit; outside, ρ is held at ``e^{±c}`` and the token gets no gradient
            through ρ. Where the PPO clip binds (``d > c`` with ``A > 0``, ``d < −c`` with ``A < 0``
            for any ε < 1) that is the gradient anyway; for ``d > c`` with ``A < 0`` the unclamped
            gradient ``−A·e^d·∇ℓ`` is ≥ 4.9e8·|A|·∇ℓ or ``inf``, and the token is dropped from the step
            instead, as in verl; for ``d < −c`` with ``A > 0`` it is below 2.1e-9·A·∇ℓ.
            :func:`ratio_clamped` says where this happens.

    Returns:
        Tensor of ``log_ratio``'s shape and dtype in ``[e^{−c}, e^c]``, finite wherever ``d`` is not
        NaN (``±inf`` is held at the bound; NaN stays NaN).
    """
    return torch.exp(log_ratio.clamp(-bound, bound))


def ratio_clamped(log_ratio: torch.Tensor, bound: float = RATIO_LOG_BOUND) -> torch.Tensor:
    """Bool tensor of ``log_ratio``'s shape: True where ``|d| > bound``, i.e. where
    :func:`importance_ratio`'s clamp binds (logged as ``<term>/ratio_clamp_frac``)."""
    return log_ratio.detach().abs() > bound


def clip_binds(ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float,
               clip_eps_high: float | None = None) -> torch.Tensor:
    """Bool tensor: True where the PPO clip of ``min(ρA, clip(ρ, 1−ε, 1+ε_high)A)`` takes effect, i.e.
    the clipped term is the smaller one and the token's gradient is cut: ``ρ > 1 + ε_high`` with
    ``A > 0``, or ``ρ < 1 − ε`` with ``A < 0`` (TRL's GRPO ``clip_ratio/region_mean``). A token outside
    ``[1 − ε, 1 + ε_high]`` on the other side of its advantage keeps the unclipped term and is not counted.

    Args:
        ratio: ``[N, L]`` (or ``[N, 1]`` for a sequence ratio) float, ρ.
        advantages: ``[N, L]`` float, A (broadcast against ``ratio``).
        clip_eps: ε (the lower side, and the upper one when ``clip_eps_high`` is ``None``).
        clip_eps_high: ε_high of an asymmetric clip (EBPO's ``ϵ_high``); default ``clip_eps``.
    """
    ratio, advantages = ratio.detach(), advantages.detach()
    high = clip_eps if clip_eps_high is None else clip_eps_high
    return ((ratio > 1 + high) & (advantages > 0)) | ((ratio < 1 - clip_eps) & (advantages < 0))


class Objective:
    """Mixin giving a registered objective dataclass the trainer-facing declarations.

    Class attributes (override in a subclass):
        default_likelihood: registry name of the docs/spec.md §1.4 estimator used when the YAML has no
            ``likelihood`` section.
        default_likelihood_fields: that estimator's fields where the objective's own defaults differ
            from the estimator's (e.g. ``rldf``: ``{"p_mask_prompt": 0.0}``); also the defaults of a
            ``likelihood`` section that names the same estimator.
        uses_ratio: True when the loss reads ``logp_old`` (θ_old's log-probs are then computed for
            μ > 1; with μ = 1 ``logp_old`` is ``logp.detach()``).
        reads: the per-token tensors the loss reads from its likelihood (default ``("logp",)``: one
            ``[N, L]`` tensor; other names: a :class:`~maskrl.likelihood.base.PerToken` record).

    A subclass with a ``normalize`` field gets group-relative advantages with it; one with a
    ``beta`` field needs a reference when ``beta > 0``.
    """

    default_likelihood: ClassVar[str] = "mean_field"
    default_likelihood_fields: ClassVar[Mapping[str, Any]] = {}
    uses_ratio: ClassVar[bool] = True
    reads: ClassVar[tuple[str, ...]] = ("logp",)

    @property
    def needs_reference(self) -> bool:
        """True when the loss reads ``logp_ref`` (a KL term with weight > 0)."""
        return getattr(self, "beta", 0.0) > 0

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Sequence advantages ``[N]`` float32 from rewards ``[N]`` and group ids ``[N]`` (docs/spec.md §1.3),
        with this objective's ``normalize`` (default ``"mean"``)."""
        return group_advantages(rewards, group_ids, getattr(self, "normalize", "mean"))

    def check_fields(self) -> None:
        """Validate the fields objectives share, where the subclass has them: ``clip_eps >= 0``,
        ``beta >= 0``, ``normalize`` one of :data:`maskrl.advantages.NORMALIZE`.

        Raises:
            ValueError: naming the field.
        """
        if getattr(self, "clip_eps", 0.0) < 0:
            raise ValueError(f"clip_eps (={self.clip_eps}) must be >= 0")
        if getattr(self, "beta", 0.0) < 0:
            raise ValueError(f"beta (={self.beta}) must be >= 0")
        if getattr(self, "normalize", "mean") not in NORMALIZE:
            raise ValueError(f"normalize {self.normalize!r} is not one of {NORMALIZE}")

    def share(self, values: torch.Tensor, mask: torch.Tensor, normalizer: float | None) -> float:
        """A per-token metric aggregated like the loss (a share of the batch value; see module doc)."""
        return aggregate(values.detach().float(), mask, getattr(self, "aggregation", "token_mean"), normalizer).item()
