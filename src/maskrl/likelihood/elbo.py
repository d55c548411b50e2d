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
in the same state see identical inputs.

``masking: block`` is SPG's block-wise masking (Wang et al. 2025, "SPG: sandwiched policy gradient
for masked diffusion language models"; SPEC §1.5): the completion is split into blocks of
``block_length``; per (sequence, draw) one block k is drawn uniformly, blocks left of it are clean,
blocks right of it fully masked, and the positions of block k are masked as above (node t). Only the
masked positions of block k are scored, with coefficient ``n_blocks·w_j/(D t_j)``: the estimate is
unbiased for ``Σ_k ELBO(block k | blocks < k)``, the bound of the semi-autoregressive factorisation
the block sampler follows.
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

MASKINGS = ("random", "block")


@lru_cache(maxsize=None)
def gauss_legendre_unit(n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Gauss–Legendre nodes and weights on [0, 1] (``n`` of each, weights sum to 1), ascending."""
    if n < 1:
        raise ValueError(f"nodes (={n}) must be >= 1")
    x, w = np.polynomial.legendre.leggauss(n)
    return tuple(float(v) for v in (x + 1) / 2), tuple(float(v) for v in w / 2)


def block_layout(shape: tuple[int, int], draws: int, block_length: int, generator: torch.Generator | None,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """SPG's block-wise layout per draw: ``(scored [D, N, L] bool, after [D, N, L] bool)`` -- the
    positions of the drawn block k, and those right of it (always masked). One uniform block index
    per (draw, sequence) from ``generator``.

    Raises:
        ValueError: ``block_length`` < 1 or not dividing L (names the field).
    """
    n, L = shape
    if block_length < 1 or L % block_length:
        raise ValueError(f"block_length (={block_length}) must be >= 1 and divide the completion length L={L}")
    nb = L // block_length
    k = torch.randint(nb, (draws, n), generator=generator, device=device)  # [D, N]
    blk = (torch.arange(L, device=device) // block_length)[None, None, :]  # [1, 1, L]
    return blk == k[..., None], blk > k[..., None]


def elbo_masks(shape: tuple[int, int], nodes: int, draws: int, coupled: bool, generator: torch.Generator | None,
               device: torch.device | str = "cpu", masking: str = "random", block_length: int = 0) -> torch.Tensor:
    """The masks of every (node, draw): ``[nodes, draws, N, L]`` bool, True = hidden.

    Draws ``draws`` uniforms ``[N, L]`` (coupled) or ``nodes·draws`` of them (independent), in that
    order, from ``generator`` (``block``: first the block indices, :func:`block_layout`; the node
    masks then apply inside the drawn block and everything right of it is hidden). Raises
    ``ValueError`` for an unknown ``masking``.
    """
    if masking not in MASKINGS:
        raise ValueError(f"masking {masking!r} is not one of {MASKINGS}")
    if masking == "block":
        scored, after = block_layout(shape, draws, block_length, generator, device)
        inner = elbo_masks(shape, nodes, draws, coupled, generator, device, "random")
        return (inner & scored[None]) | after[None]
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
         masking: str = "random", block_length: int = 0, eubo_beta: float | None = None) -> torch.Tensor:
    """Per-token ELBO contributions of ``rollout.completion_ids`` (see the module docstring).

    One batched forward of ``nodes·draws`` rows per sequence with a needed position; the output
    layer runs only at positions that are both needed and scored.

    Args:
        adapter: the policy (grad mode is the caller's).
        rollout: ``prompt_ids [N, P]``, ``prompt_mask [N, P]``, ``completion_ids [N, L]``.
        generator: draws the prompt mask (one per sequence, shared by its rows) and then the masks.
        nodes, draws: quadrature nodes and masks per node.
        p_mask_prompt: prompt masking probability (default 0: the ELBO of o given q).
        coupled: complementary masks across symmetric nodes (see module docstring).
        need: ``[N, L]`` bool, positions to score (default all).
        masking: **[choice]** ``"random"`` (i.i.d. per position) or ``"block"`` (SPG, module docstring).
        block_length: block size of ``masking: block`` (0: the rollout's sampler block length).
        eubo_beta: when given (β > 0), also the per-token EUBO of SPEC §1.5,
            ``EUBO_i = (1/β) log Σ_r c_r 1[i scored in r] p_θ(o_i | x_r)^β`` over the forward rows r
            (``c_r`` the row's quadrature coefficient), in log-sum-exp form with log-probs floored at
            ``LOGP_FLOOR`` so that it stays finite.

    Returns:
        ``[N, L]`` float32, ``ℓ_i = Σ_r c_r [i scored in r] log p_θ(o_i | x_r)``; 0 where ``need`` is
        False or the position was never scored. With ``eubo_beta``: ``[N, L]`` complex64 with the ELBO
        contributions as the real part and ``EUBO_i`` as the imaginary part (0 where never scored) --
        one tensor because the likelihood seam returns one (see :class:`SPGBounds`).
    """
    need = needed(rollout, need)
    n, L = rollout.completion_ids.shape
    device = rollout.completion_ids.device
    prompt = mask_prompt(rollout.prompt_ids, rollout.prompt_mask, adapter.mask_id, p_mask_prompt, generator)
    if masking == "block":
        if block_length == 0:
            block_length = getattr(rollout.sampler, "block_length", 0) or L
        scored_blk, after = block_layout((n, L), draws, block_length, generator, device)  # [D, N, L]
        inner = elbo_masks((n, L), nodes, draws, coupled, generator, device, "random")  # [J, D, N, L]
        score_mask = inner & scored_blk[None]
        masks = score_mask | after[None]
        scale = L // block_length  # uniform block choice: unbiased for the sum over blocks
    else:
        masks = elbo_masks((n, L), nodes, draws, coupled, generator, device, masking)  # [J, D, N, L]
        score_mask, scale = masks, 1
    t, w = gauss_legendre_unit(nodes)
    coef = torch.tensor([scale * wj / (draws * tj) for tj, wj in zip(t, w)], dtype=torch.float32, device=device)  # [J]
    m = masks.permute(2, 0, 1, 3).reshape(n * nodes * draws, L)  # row r = (seq, node, draw)
    sm = score_mask.permute(2, 0, 1, 3).reshape(n * nodes * draws, L)
    seq_of = torch.arange(n, device=device).repeat_interleave(nodes * draws)  # [N·J·D]
    node_of = torch.arange(nodes, device=device).repeat_interleave(draws).repeat(n)
    scored = sm & need[seq_of]  # [R, L]
    r_idx, i_idx = scored.nonzero(as_tuple=True)  # [M]
    if r_idx.numel() == 0:
        out = torch.zeros((n, L), dtype=torch.float32, device=device)
        return torch.complex(out, out) if eubo_beta is not None else out
    run, row_of = torch.unique(r_idx, return_inverse=True)
    x_comp = torch.where(m[run], adapter.mask_id, rollout.completion_ids[seq_of[run]])
    s = seq_of[r_idx]
    lp = score_positions(adapter, prompt[seq_of[run]], rollout.prompt_mask[seq_of[run]], x_comp, row_of, i_idx,
                         rollout.completion_ids[s, i_idx])  # [M]
    c = coef[node_of[r_idx]]
    if eubo_beta is not None:  # SPG: guard a -inf log-prob (p underflow) so that neither bound is -inf/NaN
        if torch.isnan(lp).any():
            raise ValueError("spg_bounds: NaN log-probabilities from the model")
        lp = lp.clamp(min=LOGP_FLOOR)
    out = torch.zeros((n, L), dtype=torch.float32, device=device).index_put((s, i_idx), lp * c, accumulate=True)
    if eubo_beta is None:
        return out
    return torch.complex(out, eubo_tokens(lp, c, s * L + i_idx, n * L, eubo_beta).view(n, L))


LOGP_FLOOR = -1e4  # log-probs below this are treated as this (a -inf log-prob would make the EUBO NaN)


def eubo_tokens(lp: torch.Tensor, coef: torch.Tensor, slot: torch.Tensor, size: int, beta: float) -> torch.Tensor:
    """Per-slot EUBO ``(1/β) log Σ_{m in slot} coef_m exp(β·lp_m)`` in log-sum-exp form (SPEC §1.5).

    Args:
        lp: ``[M]`` float log-probs (differentiable); floored at :data:`LOGP_FLOOR`, NaN raises.
        coef: ``[M]`` positive float coefficients.
        slot: ``[M]`` long in ``[0, size)``, the (sequence, position) each entry belongs to.
        size: number of slots.
        beta: β > 0.

    Returns:
        ``[size]`` float32, 0 in slots without an entry. Finite whenever ``lp`` has no NaN.

    Raises:
        ValueError: β ≤ 0, or a NaN log-prob.
    """
    if not beta > 0:
        raise ValueError(f"eubo_beta (={beta}) must be > 0")
    if torch.isnan(lp).any():
        raise ValueError("EUBO: NaN log-probabilities from the model")
    z = beta * lp.float().clamp(min=LOGP_FLOOR) + torch.log(coef.float())  # [M], finite
    zmax = torch.full((size,), float("-inf"), dtype=z.dtype, device=z.device).scatter_reduce(
        0, slot, z.detach(), reduce="amax", include_self=True)
    has = torch.isfinite(zmax)
    zmax = torch.where(has, zmax, torch.zeros_like(zmax))
    sums = torch.zeros(size, dtype=z.dtype, device=z.device).index_add(0, slot, torch.exp(z - zmax[slot]))
    lse = torch.where(has, torch.log(sums.clamp(min=1e-30)) + zmax, torch.zeros_like(zmax))
    return lse / beta


@dataclass(frozen=True)
class ELBO:
    """Registered as ``elbo`` (SPEC §1.4; GDPO's estimator): per-token contributions to the sequence
    ELBO on fixed Gauss–Legendre nodes with seeded masks; ``Σ_i ℓ_i`` is the ELBO estimate.

    Attributes:
        nodes: Gauss–Legendre nodes on [0, 1] **[choice]** (GDPO: 2).
        draws: masks per node **[choice]** (GDPO: 1).
        coupled: complementary masks across symmetric nodes (every token scored; unbiased).
        p_mask_prompt: prompt masking probability (default 0).
        masking: **[choice]** ``"random"`` or ``"block"`` (SPG's block-wise masking).
        block_length: block size for ``masking: block`` (0: the rollout sampler's).
    """

    nodes: int = 2
    draws: int = 1
    coupled: bool = True
    p_mask_prompt: float = 0.0
    masking: str = "random"
    block_length: int = 0

    def __post_init__(self) -> None:
        if self.block_length < 0:
            raise ValueError(f"block_length (={self.block_length}) must be >= 0")
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
                    self.masking, self.block_length)


@dataclass(frozen=True)
class SPGBounds(ELBO):
    """Registered as ``spg_bounds`` (SPEC §1.4/§1.5; SPG's estimator, the ``spg`` objective's default):
    block-wise masking, and per token both the ELBO contribution and the EUBO of :func:`elbo` with
    ``eubo_beta``. Returns ``[N, L]`` complex64 (real: ELBO, imaginary: EUBO): the likelihood seam
    returns one tensor, and SPG's loss needs both bounds of the same masks.

    Positions outside every drawn block get 0 in a call (a stochastic estimator: one block per
    (sequence, draw); the trainer draws fresh masks each inner iteration).

    Attributes:
        nodes: Gauss–Legendre nodes on [0, 1] for the drawn block's masking ratio **[choice]** (2).
        draws: block-and-mask draws per node **[choice]** (1).
        coupled: complementary masks across symmetric nodes inside the drawn block.
        p_mask_prompt: prompt masking probability (default 0).
        masking: ``"block"`` (SPG, default) or ``"random"``.
        block_length: block size (0: the rollout sampler's block length).
        eubo_beta: β of the EUBO **[choice]** (default 1.5).
    """

    masking: str = "block"
    eubo_beta: float = 1.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.eubo_beta > 0:
            raise ValueError(f"eubo_beta (={self.eubo_beta}) must be > 0")

    def __call__(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                 need: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, L]`` complex64: ELBO contributions + i·EUBO per token (see :func:`elbo`)."""
        return elbo(adapter, rollout, generator, self.nodes, self.draws, self.p_mask_prompt, self.coupled, need,
                    self.masking, self.block_length, self.eubo_beta)
