"""TraceRL's trajectory objective (Wang et al. 2025, "Revolutionizing Reinforcement Learning Framework for
Diffusion Large Language Models", arXiv 2509.06949; TraDo-4B/8B were trained with it; issue 48 item 4).

TraceRL trains on the model's own decoding trace: every completion token is scored at the state in
which the sampler committed it (for a block model: the clean earlier blocks and its block with the
tokens of that and later steps masked), and the per-token PPO surrogate is taken at those states.
As the released code states it (Gen-Verse/dLLM-RL ``train/rl_trado.py``, commit 10b4fd1, value-free
path; read, not copied), with ``ρ_i = π_θ(o_i | s_i) / π_θold(o_i | s_i)``, ``s_i`` the trace state of
token i, A the sequence's group z-scored reward and L_max the padded completion length:

    J = (1/N) Σ_n (1/L_max) Σ_{i ∈ o_n} min(ρ_i A_n, clip(ρ_i, 1−ε, 1+ε) A_n)
        − β (1/N) Σ_n (1/L_max) Σ_{i ∈ o_n} k3_i,     k3_i = π_θold/π_θ − 1 − log(π_θold/π_θ),

the KL estimate taken against **θ_old** (``use_kl_estimator_k3``), not a frozen reference; recipe
``configs/rl_trado.yaml``: ε = 0.2, β = 0.01, lr 1e-6, block 4, 4 steps per block, ``shrink: 1``.

Here the trace states are the ``state`` likelihood's (:mod:`maskrl.likelihood.state`; on a block model
its within-block rounds are exactly dLLM-RL's ``one_round_vectorized`` rows), the ratio and the k3
estimate are the library's (log-ratios clamped to ±20 before ``exp``, where dLLM-RL clamps at ±10),
and the objective is minimised as ``L = −J``.

Differences and what is left (docs/credit_methods.md, "TraceRL"):

- **value model**: dLLM-RL's optional diffusion value model turns A_n into per-token advantages along
  the trace (``rl_trado_with_value.yaml``); it is not built here. Per-token advantages from a credit
  module enter the same loss (``advantages [N, L]``).
- **shrink**: dLLM-RL can merge s consecutive steps of a block into one state (``collapse_k_unique``,
  s = 1 in the TraDo recipe); not built (s = 1).
- **batching**: dLLM-RL averages over its (sequence, round) rows per optimizer step, a constant factor
  per batch of about the rounds per sequence; ``aggregation: length`` averages over sequences. It takes
  several optimizer steps per rollout batch (gradient accumulation over 32 rows of a 64 × 16 batch), so
  θ leaves θ_old within the batch; here that is ``train.inner_iterations`` (μ): at μ = 1 ρ ≡ 1 and the
  θ_old-KL is 0 with zero gradient (the loss is REINFORCE on the trace states).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from maskrl.objectives.base import AGGREGATIONS, OBJECTIVES, aggregate
from maskrl.objectives.diffu_grpo import DiffuGRPO

TRACERL_AGGREGATIONS = ("length",) + AGGREGATIONS
KL_TARGETS = ("old", "reference")


def reduce_tokens(per_token: torch.Tensor, mask: torch.Tensor, mode: str, normalizer: float | None) -> torch.Tensor:
    """TraceRL's token reduction: ``length`` is ``Σ_n (Σ_i m_ni x_ni) / L`` divided by ``normalizer``
    (the batch's sequence count; default the rows here), L = ``per_token.shape[1]`` the padded
    completion length (dLLM-RL's ``/ L1``); other modes are :func:`~maskrl.objectives.base.aggregate`'s.

    Args:
        per_token: ``[N, L]`` float; mask: ``[N, L]`` bool; mode: one of :data:`TRACERL_AGGREGATIONS`.
    """
    if mode != "length":
        return aggregate(per_token, mask, mode, normalizer)
    per_seq = (per_token * mask.to(per_token.dtype)).sum(-1) / max(per_token.shape[1], 1)
    return per_seq.sum() / (normalizer if normalizer is not None else max(per_token.shape[0], 1))


@OBJECTIVES.register("tracerl")
@dataclass(frozen=True)
class TraceRL(DiffuGRPO):
    """Registered as ``tracerl`` (module docstring): ``L = −agg[min(ρ_i A_i, clip(ρ_i, 1−ε, 1+ε) A_i)]
    + β·agg[k3_i]``, ρ and k3 at each token's trace state; diffu-GRPO's ``__call__`` (same tensors and
    metrics) with TraceRL's reduction and KL target.

    Attributes:
        clip_eps: ε (default 0.2, dLLM-RL ``rl_trado.yaml``).
        beta: β, weight of the k3 KL term (default 0.01); 0 drops it.
        kl_to: **[choice]** ``"old"`` (default, dLLM-RL's code: k3 of θ_old against θ, no reference
            model; zero with its gradient when θ = θ_old, i.e. at μ = 1) or ``"reference"`` (k3 to the
            frozen reference, as diffu-GRPO).
        aggregation: **[choice]** ``"length"`` (default: each sequence's sum over its tokens divided
            by the padded completion length, then the mean over sequences, as dLLM-RL), ``"token_mean"``
            or ``"seq_mean"``.
        normalize: group advantage normalisation (default ``"mean_std"``: dLLM-RL z-scores each group's
            rewards, population std).

    Default likelihood: ``state`` with a clean prompt (``p_mask_prompt: 0``), the trace states.

    Raises:
        ValueError: at construction, a negative ε or β, an unknown ``kl_to``, ``aggregation`` or
            ``normalize``.
    """

    default_likelihood = "state"
    default_likelihood_fields = {"p_mask_prompt": 0.0}

    clip_eps: float = 0.2
    beta: float = 0.01
    kl_to: str = "old"
    aggregation: str = "length"
    normalize: str = "mean_std"

    def __post_init__(self) -> None:
        self.check_fields()
        if self.kl_to not in KL_TARGETS:
            raise ValueError(f"kl_to {self.kl_to!r} is not one of {KL_TARGETS}")
        if self.aggregation not in TRACERL_AGGREGATIONS:
            raise ValueError(f"aggregation {self.aggregation!r} is not one of {TRACERL_AGGREGATIONS}")

    @property
    def needs_reference(self) -> bool:
        """True when the KL term reads the reference (``beta > 0`` and ``kl_to: reference``)."""
        return self.beta > 0 and self.kl_to == "reference"

    def reduce(self, per_token: torch.Tensor, mask: torch.Tensor, normalizer: float | None) -> torch.Tensor:
        """:func:`reduce_tokens` with :attr:`aggregation`."""
        return reduce_tokens(per_token, mask, self.aggregation, normalizer)

    def kl_target(self, logp_old: torch.Tensor, logp_ref: torch.Tensor | None) -> torch.Tensor:
        """θ_old's log-probs (``kl_to: old``) or the reference's (``ValueError`` when ``None``)."""
        if self.kl_to == "old":
            return logp_old
        if logp_ref is None:
            raise ValueError("tracerl: kl_to 'reference' with beta > 0 needs logp_ref")
        return logp_ref

    def share(self, values: torch.Tensor, mask: torch.Tensor, normalizer: float | None) -> float:
        """A per-token metric reduced like the loss (:func:`reduce_tokens`)."""
        return reduce_tokens(values.detach().float(), mask, self.aggregation, normalizer).item()
