"""Sequence ELBO on fixed Gauss–Legendre nodes (SPEC §1.4 ``elbo``; GDPO, SPG).

For a masked diffusion LM the completion's log-likelihood is bounded below by

    ELBO(o) = ∫_0^1 (1/t) E_{x_t} [ Σ_{i masked in x_t} log p_θ(o_i | q^m, x_t) ] dt,

where ``x_t`` masks each completion position independently with probability t. GDPO (Rojas et al.
2025) replaces the integral over t by a Gauss–Legendre rule with fixed nodes ``t_j`` and weights
``w_j`` on [0, 1] and draws ``draws`` masks per node:

    ELBO ≈ Σ_j w_j (1/D) Σ_d (1/t_j) Σ_{i masked in x_{t_j,d}} log p_θ(o_i | q^m, x_{t_j,d}).

The estimator returns the per-token contributions ``ℓ_i`` (the terms of that sum belonging to
position i), so ``Σ_i ℓ_i`` over a completion is the ELBO estimate. The integrand's expectation over
masks is a polynomial of degree L−1 in t, so n nodes make the rule exact in expectation for
L ≤ 2n (tested against an exact enumeration).

``coupled`` (default True) draws one uniform ``u [N, L]`` per draw and masks ``u < t`` at nodes
``t ≤ ½`` and ``u ≥ 1 − t`` at nodes ``t > ½``: each node keeps its marginal masking probability t
(so the estimate stays unbiased), and with the symmetric Gauss–Legendre nodes every position is
masked at exactly one node of each symmetric pair (complementary masks, as Coupled-GRPO), so every
token gets a contribution. ``coupled: false`` draws an independent mask per (node, draw).

Masks depend only on the generator (never on ``need``), so θ, θ_old and θ_ref called with generators
in the same state see identical inputs. ``masking`` is the hook for SPG's block-wise masking.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from maskrl.likelihood.base import needed, score_positions
from maskrl.likelihood.mean_field import mask_prompt
from maskrl.models.adapter import ModelAdapter
from maskrl.types import Rollout

MASKINGS = ("random",)


@lru_cache(maxsize=None)
def gauss_legendre_unit(n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Gauss–Legendre nodes and weights on [0, 1] (``n`` of each, weights sum to 1), ascending."""
    if n < 1:
        raise ValueError(f"nodes (={n}) must be >= 1")
    x, w = np.polynomial.legendre.leggauss(n)
    return tuple(float(v) for v in (x + 1) / 2), tuple(float(v) for v in w / 2)


def elbo_masks(shape: tuple[int, int], nodes: int, draws: int, coupled: bool, generator: torch.Generator | None,
               device: torch.device | str = "cpu", masking: str = "random") -> torch.Tensor:
    """The masks of every (node, draw): ``[nodes, draws, N, L]`` bool, True = hidden.

    Draws ``draws`` uniforms ``[N, L]`` (coupled) or ``nodes·draws`` of them (independent), in that
    order, from ``generator``. Raises ``ValueError`` for an unknown ``masking``.
    """
    if masking not in MASKINGS:
        raise ValueError(f"masking {masking!r} is not one of {MASKINGS}")
    t, _ = gauss_legendre_unit(nodes)
    out = torch.empty((nodes, draws) + tuple(shape), dtype=torch.bool, device=device)
    if coupled:
        for d in range(draws):
            u = torch.rand(shape, generator=generator, device=device)
            for j, tj in enumerate(t):
                out[j, d] = (u < tj) if tj <= 0.5 else (u >= 1.0 - tj)
    else:
        for j, tj in enumerate(t):
            for d in range(draws):
                out[j, d] = torch.rand(shape, generator=generator, device=device) < tj
    return out


def elbo(adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None, nodes: int = 2, draws: int = 1,
         p_mask_prompt: float = 0.0, coupled: bool = True, need: torch.Tensor | None = None,
         masking: str = "random") -> torch.Tensor:
    """Per-token ELBO contributions of ``rollout.completion_ids`` (see the module docstring).

    One batched forward of ``nodes·draws`` rows per sequence with a needed position; the output
    layer runs only at positions that are both needed and masked.

    Args:
        adapter: the policy (grad mode is the caller's).
        rollout: ``prompt_ids [N, P]``, ``prompt_mask [N, P]``, ``completion_ids [N, L]``.
        generator: draws the prompt mask (one per sequence, shared by its rows) and then the masks.
        nodes, draws: quadrature nodes and masks per node.
        p_mask_prompt: prompt masking probability (default 0: the ELBO of o given q).
        coupled: complementary masks across symmetric nodes (see module docstring).
        need: ``[N, L]`` bool, positions to score (default all).
        masking: **[choice]** ``"random"`` (i.i.d. per position); block-wise (SPG) to come.

    Returns:
        ``[N, L]`` float32, ``ℓ_i = Σ_{j,d} [i masked] w_j/(D t_j) log p_θ(o_i | x_{t_j,d})``; 0 where
        ``need`` is False or the position was never masked.
    """
    need = needed(rollout, need)
    n, L = rollout.completion_ids.shape
    device = rollout.completion_ids.device
    prompt = mask_prompt(rollout.prompt_ids, rollout.prompt_mask, adapter.mask_id, p_mask_prompt, generator)
    masks = elbo_masks((n, L), nodes, draws, coupled, generator, device, masking)  # [J, D, N, L]
    t, w = gauss_legendre_unit(nodes)
    coef = torch.tensor([wj / (draws * tj) for tj, wj in zip(t, w)], dtype=torch.float32, device=device)  # [J]
    m = masks.permute(2, 0, 1, 3).reshape(n * nodes * draws, L)  # row r = (seq, node, draw)
    seq_of = torch.arange(n, device=device).repeat_interleave(nodes * draws)  # [N·J·D]
    node_of = torch.arange(nodes, device=device).repeat_interleave(draws).repeat(n)
    scored = m & need[seq_of]  # [R, L]
    r_idx, i_idx = scored.nonzero(as_tuple=True)  # [M]
    if r_idx.numel() == 0:
        return torch.zeros((n, L), dtype=torch.float32, device=device)
    run, row_of = torch.unique(r_idx, return_inverse=True)
    x_comp = torch.where(m[run], adapter.mask_id, rollout.completion_ids[seq_of[run]])
    s = seq_of[r_idx]
    lp = score_positions(adapter, prompt[seq_of[run]], rollout.prompt_mask[seq_of[run]], x_comp, row_of, i_idx,
                         rollout.completion_ids[s, i_idx])  # [M]
    out = torch.zeros((n, L), dtype=torch.float32, device=device)
    return out.index_put((s, i_idx), lp * coef[node_of[r_idx]], accumulate=True)


@dataclass(frozen=True)
class ELBO:
    """Registered as ``elbo`` (SPEC §1.4; GDPO's estimator): per-token contributions to the sequence
    ELBO on fixed Gauss–Legendre nodes with seeded masks; ``Σ_i ℓ_i`` is the ELBO estimate.

    Attributes:
        nodes: Gauss–Legendre nodes on [0, 1] **[choice]** (GDPO: 2).
        draws: masks per node **[choice]** (GDPO: 1).
        coupled: complementary masks across symmetric nodes (every token scored; unbiased).
        p_mask_prompt: prompt masking probability (default 0).
        masking: **[choice]** ``"random"``; SPG's block-wise masking is a planned option.
    """

    nodes: int = 2
    draws: int = 1
    coupled: bool = True
    p_mask_prompt: float = 0.0
    masking: str = "random"

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes (={self.nodes}) must be >= 1")
        if self.draws < 1:
            raise ValueError(f"draws (={self.draws}) must be >= 1")
        if not 0.0 <= self.p_mask_prompt <= 1.0:
            raise ValueError(f"p_mask_prompt (={self.p_mask_prompt}) must lie in [0, 1]")
        if self.masking not in MASKINGS:
            raise ValueError(f"masking {self.masking!r} is not one of {MASKINGS}")

    def rows(self, rollout: Rollout, need: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` long: ``nodes·draws`` per sequence with a needed position, else 0."""
        return needed(rollout, need).any(-1).long() * (self.nodes * self.draws)

    def __call__(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                 need: torch.Tensor | None = None) -> torch.Tensor:
        """See :func:`elbo`; ``[N, L]`` float32."""
        return elbo(adapter, rollout, generator, self.nodes, self.draws, self.p_mask_prompt, self.coupled, need,
                    self.masking)
