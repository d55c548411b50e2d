"""EBPO: ELBO-based Block-level Policy Optimization (LLaDA2.1 technical report, inclusionAI 2026, §3.2,
Eqs. 4–5; the objective LLaDA2.1-mini / -flash were RL-trained with; issue 52 item 4).

The report states it as a PPO surrogate on one ratio per sequence, with an asymmetric clip:

    J(θ) = E_{x, y ∼ π_θold} [ min(ρ(y|x) Â, clip(ρ(y|x), 1 − ε_low, 1 + ε_high) Â) ],

    log ρ(y|x) ≈ Σ_{n=1}^{N} w_n Σ_{b=1}^{B} [ log p_θ(y_b | z_n, x; M) − log p_θold(y_b | z_n, x; M) ],

with ``{t_n}`` discretised noise levels and weights ``{w_n}``, ``z_n = y_{t_n} ⊕ y_0`` the doubled
input (noisy copy ⊕ clean copy) and ``M`` the block-causal mask of that doubled row, so that block b's
term conditions on the clean earlier blocks and one forward per node gives every block's term.

Here: ``log p(y_b | z_n)`` summed over blocks and weighted by ``w_n`` is the ``elbo`` likelihood on a
block-diffusion model (:mod:`maskrl.likelihood.elbo` on the doubled x_t ⊕ x_0 forward of
:mod:`maskrl.likelihood.blocks`: Gauss–Legendre nodes t_n, weights ``w_n/t_n``, the masked positions of
each block scored), whose per-token contributions ``ℓ_i`` sum to it: ``log ρ_n = Σ_i (ℓ_i − ℓ_i^old)``,
the sum of Eq. 5 without a length normalisation (GDPO's ``ratio_norm: length`` is a choice here). θ and
θ_old see the same masks (the likelihood's masks depend on the generator only), as Eq. 5 needs.

What the report leaves open and is a **[choice]** here (docs/credit_methods.md, "EBPO"): the values of
ε_low / ε_high (0.2 / 0.2, the usual PPO value: the report gives none; ``clip_eps_high`` sets a higher clip),
the advantage estimator (group z-score, ``normalize: mean_std``), no KL term (``beta: 0``), the loss
averaged over sequences (a credit module's per-token advantages averaged over each sequence inside the
min, as GDPO). DARE's open EBPO implementation (inclusionAI/DARE) was not reachable from this machine
and is not followed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from maskrl.objectives.base import OBJECTIVES
from maskrl.objectives.gdpo import GDPO

RATIO_NORMS = ("none", "length")


@OBJECTIVES.register("ebpo")
@dataclass(frozen=True)
class EBPO(GDPO):
    """Registered as ``ebpo``: ``ρ_n = exp(Σ_i (ℓ_{n,i} − ℓ_{n,i}^old))`` on the block ELBO's per-token
    contributions (module docstring; the log-ratio clamped to ±20 before ``exp``), and

    ``L = −(1/N) Σ_n (1/|o_n|) Σ_i min(ρ_n A_{n,i}, clip(ρ_n, 1−ε_low, 1+ε_high) A_{n,i}) + β·(1/N) Σ_n KL3_n``

    (GDPO's loss, :class:`~maskrl.objectives.gdpo.GDPO`, with EBPO's un-normalised block log-ratio and
    asymmetric clip). Without a credit module ``A_{n,i} = A_n`` and the policy term is Eq. 4's.

    Attributes:
        clip_eps: ε_low (default 0.2).
        clip_eps_high: ε_high (default ``None``: equal to ε_low).
        ratio_norm: **[choice]** ``"none"`` (default, Eq. 5: the sum over blocks and nodes) or
            ``"length"`` (divided by |o_n|, GDPO's ratio).
        beta: KL weight (default 0: no reference, as the report's Eq. 4).
        normalize: group advantage normalisation **[choice]** (default ``"mean_std"``).

    Default likelihood: ``elbo`` (on a block model its doubled x_t ⊕ x_0 forward).

    Raises:
        ValueError: at construction, negative ε_low / ε_high / β, ε_low ≥ 1, an unknown ``ratio_norm``
            or ``normalize``.
    """

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    ratio_norm: str = "none"
    beta: float = 0.0
    normalize: str = "mean_std"

    def __post_init__(self) -> None:
        self.check_fields()
        if self.clip_eps >= 1:
            raise ValueError(f"clip_eps (ε_low, ={self.clip_eps}) must be < 1")
        if self.clip_eps_high is not None and self.clip_eps_high < 0:
            raise ValueError(f"clip_eps_high (={self.clip_eps_high}) must be >= 0")
        if self.ratio_norm not in RATIO_NORMS:
            raise ValueError(f"ratio_norm {self.ratio_norm!r} is not one of {RATIO_NORMS}")

    def clip_range(self) -> tuple[float, float]:
        """``(ε_low, ε_high)``."""
        return self.clip_eps, self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    def sequence_log_ratio(self, e: torch.Tensor, e_old: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """``[N]``: ``E − E^old`` (``ratio_norm: none``) or ``(E − E^old)/|o|`` (``length``)."""
        return e - e_old if self.ratio_norm == "none" else (e - e_old) / length
