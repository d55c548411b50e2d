"""EBPO: ELBO-based Block-level Policy Optimization (LLaDA2.1 technical report, inclusionAI 2026, §3.2,
Eqs. 4–5; the objective LLaDA2.1-mini / -flash were RL-trained with), as DARE's open implementation for
LLaDA2.x and SDAR builds it (yjyddq/DARE 83ae8a3: ``compute_policy_loss_ebpo``, ``compute_ebpo_kl`` in
``verl/trainer/ppo/dllm_core_algos.py``, the update of ``verl/workers/actor/ebpo_actor_mixin.py``;
docs/spec.md §1.5 ``ebpo``).

The report states it as a PPO surrogate on one ratio per sequence, with an asymmetric clip:

    J(θ) = E_{x, y ∼ π_θold} [ min(ρ(y|x) Â, clip(ρ(y|x), 1 − ε_low, 1 + ε_high) Â) ],

    log ρ(y|x) ≈ Σ_{n=1}^{N} w_n Σ_{b=1}^{B} [ log p_θ(y_b | z_n, x; M) − log p_θold(y_b | z_n, x; M) ],

with ``z_n = y_{t_n} ⊕ y_0`` the doubled input (noisy copy ⊕ clean copy) under the block-causal mask M.
DARE's reading, followed here: ``Σ_n w_n Σ_b log p(y_b | z_n)`` is the block ELBO of the ``block_elbo``
likelihood (:mod:`maskrl.likelihood.block_elbo`: D = 16 draws, uniform ``w_n = 1/D``, stratified noise
levels per (draw, block), exact counts weighted ``n_b/k``), whose per-token contributions ``ℓ_i`` sum to it;
``log ρ_n = Σ_i (ℓ_i − ℓ_i^old)``, not length-normalised, θ and θ_old under the same masks. A credit
module's per-token advantages are averaged over each sequence *before* the one clipped term (DARE's
``_masked_sequence_mean``; ``advantage_mean: inside`` keeps the per-token min of GDPO instead), the loss
is averaged over sequences, the optional KL is the k3 of the un-normalised ELBOs ``E_n − E_n^ref``
(``compute_ebpo_kl``, ``low_var_kl``) and the advantages are verl's GRPO z-score (Bessel std + 1e-6).

Kept from the project, documented departures: the log-ratio and the KL's log-ratio are clamped to ±20
before ``exp`` (DARE clips in the log domain and never clamps; the two agree wherever |log ρ| ≤ 20, and
differ only for A < 0 with log ρ > 20, where DARE's loss grows as e^{log ρ}); with μ > 1 each inner
iteration draws fresh masks (DARE reuses one draw over its PPO epochs; its recipes use one epoch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from maskrl.objectives.base import OBJECTIVES
from maskrl.objectives.gdpo import GDPO

RATIO_NORMS = ("none", "length")
ADVANTAGE_MEANS = ("outside", "inside")


@OBJECTIVES.register("ebpo")
@dataclass(frozen=True)
class EBPO(GDPO):
    """Registered as ``ebpo`` (docs/spec.md §1.5): ``ρ_n = exp(Σ_i (ℓ_{n,i} − ℓ_{n,i}^old))`` on the block
    ELBO's per-token contributions (module docstring; the log-ratio clamped to ±20 before ``exp``),
    ``Ā_n = (1/|o_n|) Σ_i A_{n,i}`` and

    ``L = −(1/N) Σ_n min(ρ_n Ā_n, clip(ρ_n, 1−ε_low, 1+ε_high) Ā_n) + β·(1/N) Σ_n KL3(E_n, E_n^ref)``

    with ``E_n = Σ_i ℓ_{n,i}``. Without a credit module ``A_{n,i} = A_n`` and the policy term is Eq. 4's.

    Attributes:
        clip_eps: ε_low (default 0.2, verl's ``clip_ratio_low`` as DARE's recipes leave it).
        clip_eps_high: ε_high (default ``None``: equal to ε_low; verl's ``clip_ratio_high`` 0.2).
        ratio_norm: ``"none"`` (default, Eq. 5 and DARE: the sum over blocks and tokens) or
            ``"length"`` (divided by |o_n|, GDPO's ratio; the KL then compares length-normalised ELBOs).
        advantage_mean: ``"outside"`` (default, DARE: the sequence mean Ā_n enters the min) or
            ``"inside"`` (GDPO: ``(1/|o_n|) Σ_i min(ρ_n A_{n,i}, clip(ρ_n) A_{n,i})``); equal without a
            credit module, and whenever the clip does not bind.
        beta: KL weight (default 0: DARE's recipes set ``use_kl_loss: False``).
        normalize: group advantage normalisation (default ``"mean_std_unbiased"``: verl's GRPO estimator).

    Default likelihood: ``block_elbo`` (DARE's; a full-attention model needs ``likelihood: {name: elbo}``).

    Raises:
        ValueError: at construction, negative ε_low / ε_high / β, ε_low ≥ 1, an unknown ``ratio_norm``,
            ``advantage_mean`` or ``normalize``.
    """

    default_likelihood: ClassVar[str] = "block_elbo"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    ratio_norm: str = "none"
    advantage_mean: str = "outside"
    beta: float = 0.0
    normalize: str = "mean_std_unbiased"

    def __post_init__(self) -> None:
        self.check_fields()
        if self.clip_eps >= 1:
            raise ValueError(f"clip_eps (ε_low, ={self.clip_eps}) must be < 1")
        if self.clip_eps_high is not None and self.clip_eps_high < 0:
            raise ValueError(f"clip_eps_high (={self.clip_eps_high}) must be >= 0")
        if self.ratio_norm not in RATIO_NORMS:
            raise ValueError(f"ratio_norm {self.ratio_norm!r} is not one of {RATIO_NORMS}")
        if self.advantage_mean not in ADVANTAGE_MEANS:
            raise ValueError(f"advantage_mean {self.advantage_mean!r} is not one of {ADVANTAGE_MEANS}")

    def clip_range(self) -> tuple[float, float]:
        """``(ε_low, ε_high)``."""
        return self.clip_eps, self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    def sequence_log_ratio(self, e: torch.Tensor, e_old: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """``[N]``: ``E − E^old`` (``ratio_norm: none``) or ``(E − E^old)/|o|`` (``length``)."""
        return e - e_old if self.ratio_norm == "none" else (e - e_old) / length

    def kl_arguments(self, e: torch.Tensor, e_ref: torch.Tensor,
                     length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(E, E^ref)`` (``ratio_norm: none``, DARE's ``compute_ebpo_kl``) or both over |o| (``length``)."""
        return (e, e_ref) if self.ratio_norm == "none" else super().kl_arguments(e, e_ref, length)

    def sequence_advantages(self, advantages: torch.Tensor, m: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """``[N, L]``: ``Ā_n`` at every position (``outside``) or the per-token advantages (``inside``)."""
        if self.advantage_mean == "inside":
            return super().sequence_advantages(advantages, m, length)
        return ((advantages * m).sum(-1) / length)[:, None].expand_as(advantages)
