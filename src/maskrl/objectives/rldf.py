"""RLDF's base objective (docs/spec.md §1.5 ``rldf``; the base of DTCA, docs/spec.md §3).

Per token ``L = −agg[min(ρ_i A_i, clip(ρ_i, 1−ε, 1+ε) A_i)] + β·agg[KL3_i]``, ``ρ_i = exp(ℓ_i − ℓ_i^old)``
(log-ratio clamped to ±20 before ``exp``, as diffu-GRPO's), with RLDF's own defaults: ε = 0.2,
β = 0.01, ``mean_std`` group advantages and the ``state`` likelihood. With μ = 1 inner iteration the trainer passes ``ℓ^old = ℓ.detach()``, so ρ ≡ 1 and the
gradient is exactly REINFORCE's ``−A_i ∇ℓ_i`` (the "μ = 1" case of docs/spec.md §1.5); for μ > 1 it is the
clipped PPO surrogate. RLDF trains on a few sampled denoising states per sequence; that step choice
is the ``rldf_steps`` credit module (:mod:`maskrl.credit.rldf`), which builds one loss term from the
chosen states and averages over them: this objective's default aggregation is therefore
``seq_mean`` (each state row's mean over its kept tokens, then the mean over state rows).
"""
from __future__ import annotations

from dataclasses import dataclass

from maskrl.objectives.base import OBJECTIVES
from maskrl.objectives.diffu_grpo import DiffuGRPO


@OBJECTIVES.register("rldf")
@dataclass(frozen=True)
class RLDF(DiffuGRPO):
    """Registered as ``rldf`` (docs/spec.md §1.5): the clipped surrogate / REINFORCE with RLDF's defaults.

    Attributes:
        clip_eps: ε (default 0.2).
        beta: β, weight of the KL3 term to the reference (default 0.01).
        aggregation: **[choice]** ``"seq_mean"`` (default: mean over each row's tokens, then over rows;
            with the ``rldf_steps`` module a row is one chosen state, so the loss is averaged over
            steps) or ``"token_mean"``.
        normalize: group advantage normalisation (default ``"mean_std"``, docs/spec.md §1.3).

    Its default likelihood is ``state`` (docs/spec.md §1.4) with a **clean prompt** (``p_mask_prompt: 0``,
    issue 19): the states ``rldf_steps`` / ``dtca`` train on are scored under the same input that
    their p ≥ 0.6 filter and DTCA's entropy-flow calibration read (θ at x_s, prompt unmasked), so
    the kept tokens, ΔH and the trained ℓ are about one distribution. A ``likelihood: {name: state}``
    section starts from the same default; ``p_mask_prompt > 0`` is still accepted (the filter then
    reads another input than the loss). ``__call__`` is diffu-GRPO's (same tensors, same metrics
    ``policy_loss``, ``kl``, ``clip_frac``, ``ratio_mean``, ``ratio_clamp_frac``).
    """

    default_likelihood = "state"
    default_likelihood_fields = {"p_mask_prompt": 0.0}

    clip_eps: float = 0.2
    beta: float = 0.01
    aggregation: str = "seq_mean"
    normalize: str = "mean_std"
