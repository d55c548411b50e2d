"""Sequence ELBO on fixed Gauss–Legendre nodes (docs/spec.md §1.4 ``elbo``; GDPO, SPG).

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
for masked diffusion language models"; docs/spec.md §1.5): the completion is split into blocks of
``block_length``; per (sequence, draw) one block k is drawn uniformly, blocks left of it are clean,
blocks right of it fully masked, and the positions of block k are masked as above (node t). Only the
masked positions of block k are scored. The drawn block's sums are scaled by ``n_blocks`` *outside*
each bound's log, one draw at a time:

    ELBO_i = (n_blocks/D) Σ_{d: i in k_d} Σ_j (w_j/t_j) 1[i masked in x_{j,d}] log p_θ(o_i | x_{j,d}),
    EUBO_i = (n_blocks/D) Σ_{d: i in k_d} (1/β) log Σ_j (w_j/t_j) 1[i masked in x_{j,d}] p_θ(o_i | x_{j,d})^β,

so that, k being uniform, ``E Σ_i`` of each is the sum over *all* blocks of the one-draw per-block
estimate, whatever the number of blocks (for the EUBO: of its one-draw log estimate, which Jensen
biases below the bound). ``masking: random`` keeps the D draws of a token inside one log
(``EUBO_i = (1/β) log Σ_{j,d} (w_j/(D t_j)) 1[masked] p^β``), the form of docs/spec.md §1.5 without blocks.

``masking: spg_public`` is the scheme of SPG's released code (github.com/facebookresearch/SPG,
``spg/spg_trainer.py``: ``forward_process`` with ``forward_type: block_random``, the ELBO/EUBO of
``_get_per_seq_logps``; its run scripts use ``num_t 2, min_t 0, max_t 1``, block 32,
``p_mask_prompt 0.15``), re-implemented from its description (:func:`spg_public_layout`):

- per sequence ``draws`` *distinct* blocks (a permutation's first D entries, taken modulo the number
  of blocks holding a valid token, up to the first stop token); in the drawn block k a count
  ``m ~ U{1..n_k}`` of its n_k valid tokens is hidden (no quadrature node), every later position
  and every position after the stop token is hidden;
- ``p_mask_prompt`` hides each prompt token *and each clean completion token left of block k*
  (per row);
- every hidden valid completion token is scored (the drawn block's, the later blocks', the perturbed
  earlier ones), with the empirical rate ``t̂_d = S_d/|o|`` (S_d scored tokens of draw d, |o| valid
  tokens): ``ELBO_i = Σ_d (|o|/(D S_d)) 1[i scored in d] log p``, and
  ``EUBO_i = (|o|/|U|) (1/β) log Σ_d (|o|/(D S_d)) 1[i scored in d] p^β`` for i in U, the tokens
  scored in some draw (SPG averages that log over U and multiplies by |o|).

On a block-diffusion model (``adapter.block_size`` set) every row is scored through the doubled
x_t ⊕ x_0 forward (:mod:`maskrl.likelihood.blocks`): a masked token of block b sees the clean earlier
blocks and its own block as the row's mask leaves it, so ``Σ_i ℓ_i`` estimates ``Σ_b ELBO_b``, the
bound of ``log p(o) = Σ_b log p(o_b | o_{<b})`` that SDAR trains (one t per node shared by the blocks of
a row: unbiased, as each block's term is). ``masking: block`` already leaves the earlier blocks clean;
``spg_public`` is refused (its perturbed context is not a block model's state).

SPG's loss then weights sequences by their length (``Σ_n −A_n·bound_n / Σ_n |o_n|``): the ``spg``
objective's ``aggregation: token_mean``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np
import torch

from maskrl.likelihood.base import LIKELIHOODS, PerToken, needed, scored_or_one
from maskrl.likelihood.blocks import SPG_PUBLIC_BLOCKS, score_rows
from maskrl.likelihood.mean_field import mask_prompt
from maskrl.models.adapter import ModelAdapter
from maskrl.types import Rollout

MASKINGS = ("random", "block", "spg_public")


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
    ``ValueError`` for another ``masking`` (``spg_public``'s masks depend on the completion mask:
    :func:`spg_public_layout`).
    """
    if masking not in ("random", "block"):
        raise ValueError(f"elbo_masks draws the 'random' and 'block' maskings, not {masking!r}")
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


def spg_public_layout(valid: torch.Tensor, prompt_mask: torch.Tensor, draws: int, block_length: int,
                      p_perturb: float, generator: torch.Generator | None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The masks of ``masking: spg_public`` (SPG's released code, see the module docstring):
    ``(hide [D, N, L] bool, prompt_hide [D, N, P] bool, block [D, N] long)``, True = replaced by
    ``[M]``; ``block`` is the drawn block of each (draw, sequence).

    Per sequence, ``draws`` distinct block indices (a random permutation of the L/b blocks, its first
    D entries) taken modulo the number of blocks that hold a valid token; per (draw, sequence) with
    drawn block k: ``m`` uniform in {1, ..., n_k} of the n_k valid positions of block k hidden (chosen
    at random), every position right of block k and every invalid position hidden, and each prompt
    token and each valid token left of block k hidden with probability ``p_perturb``. Draws, in this
    order, from ``generator``: the N permutations, ``[D, N]`` uniforms (m), ``[D, N, L]`` uniforms
    (which positions), then (``p_perturb > 0``) ``[D, N, L]`` and ``[D, N, P]`` uniforms.

    Args:
        valid: ``[N, L]`` bool, the completion mask (up to and including the first stop token).
        prompt_mask: ``[N, P]`` bool, real prompt tokens (padding is never hidden).
        draws: D, at most the number of blocks L/b.
        block_length: b, dividing L.
        p_perturb: probability of hiding a prompt or clean completion token, in [0, 1].
        generator: the source of every draw.

    Raises:
        ValueError: ``block_length`` not dividing L, or ``draws`` above the number of blocks.
    """
    n, L = valid.shape
    device = valid.device
    if block_length < 1 or L % block_length:
        raise ValueError(f"block_length (={block_length}) must be >= 1 and divide the completion length L={L}")
    nb = L // block_length
    if draws > nb:
        raise ValueError(f"draws (={draws}) must be <= the number of blocks ({nb}) with masking: spg_public "
                         "(SPG draws distinct blocks)")
    valid = valid.bool()
    length = valid.sum(-1)  # [N]
    held = (length - 1).clamp(min=0) // block_length + 1  # [N] blocks holding a valid token (>= 1)
    k = torch.stack([torch.randperm(nb, generator=generator, device=device)[:draws] for _ in range(n)], 1)  # [D, N]
    k = k % held[None]
    blk = (torch.arange(L, device=device) // block_length)[None, None, :]  # [1, 1, L]
    in_k = (blk == k[..., None]) & valid[None]  # [D, N, L] valid positions of the drawn block
    n_k = in_k.sum(-1)  # [D, N]
    m = (1 + (torch.rand((draws, n), generator=generator, device=device) * n_k).long()).clamp(max=n_k)  # U{1..n_k}
    key = torch.where(in_k, torch.rand((draws, n, L), generator=generator, device=device), 2.0)
    rank = key.argsort(-1).argsort(-1)  # random order of the drawn block's valid positions first
    hide = (in_k & (rank < m[..., None])) | (blk > k[..., None]) | ~valid[None]
    prompt_hide = torch.zeros((draws,) + tuple(prompt_mask.shape), dtype=torch.bool, device=device)
    if p_perturb > 0:
        clean = (blk < k[..., None]) & valid[None]
        hide = hide | (clean & (torch.rand((draws, n, L), generator=generator, device=device) < p_perturb))
        u = torch.rand(prompt_hide.shape, generator=generator, device=device)
        prompt_hide = (u < p_perturb) & prompt_mask.bool()[None]
    return hide, prompt_hide, k


@dataclass(frozen=True)
class _Rows:
    """The forward rows of one call, row r = (sequence, node, draw) in that order (R rows)."""

    prompt: torch.Tensor  # [R, P] long, the (masked) prompt of each row
    hide: torch.Tensor  # [R, L] bool, completion positions replaced by [M]
    score: torch.Tensor  # [R, L] bool, positions scored in the row (before `need`)
    seq: torch.Tensor  # [R] long, the row's sequence
    elbo_coef: torch.Tensor  # [R] float32, ELBO coefficient of the row's scored tokens
    eubo_coef: torch.Tensor  # [R] float32, coefficient inside the EUBO's log
    group: torch.Tensor  # [R] long, EUBO group: one log per (sequence, group, position)
    outer: torch.Tensor  # [N, G] float32, weight of each group's log (outside it)


def _layout(adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None, nodes: int, draws: int,
            p_mask_prompt: float, coupled: bool, masking: str, block_length: int) -> _Rows:
    """Masks and coefficients of every forward row (see the module docstring)."""
    n, L = rollout.completion_ids.shape
    device = rollout.completion_ids.device
    if masking not in MASKINGS:
        raise ValueError(f"masking {masking!r} is not one of {MASKINGS}")
    if masking != "random" and block_length == 0:
        block_length = getattr(rollout.sampler, "block_length", 0) or L
    if masking == "spg_public":
        valid = rollout.completion_mask.bool()
        hide, p_hide, _ = spg_public_layout(valid, rollout.prompt_mask, draws, block_length, p_mask_prompt, generator)
        hide, p_hide = hide.transpose(0, 1).reshape(n * draws, L), p_hide.transpose(0, 1).reshape(n * draws, -1)
        seq = torch.arange(n, device=device).repeat_interleave(draws)
        prompt = torch.where(p_hide, adapter.mask_id, rollout.prompt_ids[seq])
        score = hide & valid[seq]
        length = valid.sum(-1).float()  # [N] |o|
        coef = length[seq] / (draws * score.sum(-1).clamp(min=1).float())  # |o| / (D·S_d): 1/t̂ over D draws
        union = score.view(n, draws, L).any(1).sum(-1).clamp(min=1).float()  # [N] |U|
        zero = torch.zeros_like(seq)
        return _Rows(prompt, hide, score, seq, coef, coef, zero, (length / union)[:, None])
    prompt = mask_prompt(rollout.prompt_ids, rollout.prompt_mask, adapter.mask_id, p_mask_prompt, generator)
    t, w = gauss_legendre_unit(nodes)

    def per_node(scale: float) -> torch.Tensor:  # [J] float32 scale·w_j/t_j (computed in float64)
        return torch.tensor([scale * wj / tj for tj, wj in zip(t, w)], dtype=torch.float32, device=device)

    seq = torch.arange(n, device=device).repeat_interleave(nodes * draws)  # [R]
    node = torch.arange(nodes, device=device).repeat_interleave(draws).repeat(n)
    draw = torch.arange(draws, device=device).repeat(n * nodes)
    if masking == "block":
        scored_blk, after = block_layout((n, L), draws, block_length, generator, device)  # [D, N, L]
        inner = elbo_masks((n, L), nodes, draws, coupled, generator, device, "random")  # [J, D, N, L]
        score = inner & scored_blk[None]
        hide = score | after[None]
        nb = L // block_length
        # the drawn block's sums are scaled by n_blocks / D outside the EUBO's log (one log per draw)
        elbo_coef, eubo_coef, group = per_node(nb / draws)[node], per_node(1.0)[node], draw
        outer = torch.full((n, draws), nb / draws, dtype=torch.float32, device=device)
    else:
        score = hide = elbo_masks((n, L), nodes, draws, coupled, generator, device, "random")
        elbo_coef = eubo_coef = per_node(1.0 / draws)[node]
        group, outer = torch.zeros_like(seq), torch.ones((n, 1), dtype=torch.float32, device=device)
    flat = lambda x: x.permute(2, 0, 1, 3).reshape(n * nodes * draws, L)  # noqa: E731  [J, D, N, L] -> [R, L]
    return _Rows(prompt[seq], flat(hide), flat(score), seq, elbo_coef, eubo_coef, group, outer)


def bounds(adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None, nodes: int = 2,
           draws: int = 1, p_mask_prompt: float = 0.0, coupled: bool = True, need: torch.Tensor | None = None,
           masking: str = "random", block_length: int = 0,
           eubo_beta: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token ELBO contributions and (with ``eubo_beta``) EUBOs of ``rollout.completion_ids`` from
    the same masks (see the module docstring); :func:`elbo` and :func:`spg_bounds` are its two faces.

    One batched forward of the rows with a scored needed position; the output layer runs only at
    positions that are both needed and scored. When the masks score none of the needed positions,
    one row still runs (a zero contribution), so that a call with a needed position always runs one
    forward (the equal-forwards rule of :meth:`maskrl.trainer.RLTrainer.optimize`; issue 21 §4).

    Args:
        adapter: the policy (grad mode is the caller's).
        rollout: ``prompt_ids [N, P]``, ``prompt_mask [N, P]``, ``completion_ids [N, L]``,
            ``completion_mask [N, L]`` (read by ``spg_public``).
        generator: draws the prompt mask (one per sequence, shared by its rows; ``spg_public``: one
            per row), then the masks.
        nodes, draws: quadrature nodes and masks per node (``spg_public``: ``nodes`` 1, ``draws``
            distinct blocks).
        p_mask_prompt: prompt masking probability (default 0: the ELBO of o given q; ``spg_public``
            also hides the clean completion tokens left of the drawn block with it).
        coupled: complementary masks across symmetric nodes (see module docstring).
        need: ``[N, L]`` bool, positions to score (default all).
        masking: **[choice]** ``"random"``, ``"block"`` or ``"spg_public"`` (module docstring).
        block_length: block size of the block maskings (0: the rollout's sampler block length).
        eubo_beta: when given (β > 0), also the per-token EUBO of docs/spec.md §1.5 (module docstring), in
            log-sum-exp form with log-probs floored at ``LOGP_FLOOR`` so that it stays finite.

    Returns:
        ``(elbo [N, L] float32, eubo [N, L] float32 or None)``; 0 where ``need`` is False or the
        position was not scored.

    Raises:
        ValueError: an unknown ``masking``, a block length not dividing L, ``spg_public`` with more
            draws than blocks, or (with ``eubo_beta``) NaN log-probabilities from the model.
    """
    need = needed(rollout, need)
    if masking == "spg_public" and getattr(adapter, "block_size", None) is not None:
        raise ValueError(SPG_PUBLIC_BLOCKS)
    n, L = rollout.completion_ids.shape
    zeros = torch.zeros((n, L), dtype=torch.float32, device=rollout.completion_ids.device)
    rows = _layout(adapter, rollout, generator, nodes, draws, p_mask_prompt, coupled, masking, block_length)
    if not bool(need.any()):
        return zeros, (zeros if eubo_beta is not None else None)
    r_idx, i_idx, dummy = scored_or_one(rows.score & need[rows.seq], rows.seq, need)  # [M]
    run, row_of = torch.unique(r_idx, return_inverse=True)
    x_comp = torch.where(rows.hide[run], adapter.mask_id, rollout.completion_ids[rows.seq[run]])
    s = rows.seq[r_idx]
    lp = score_rows(adapter, rows.prompt[run], rollout.prompt_mask[rows.seq[run]], x_comp,
                    rollout.completion_ids[rows.seq[run]], row_of, i_idx, rollout.completion_ids[s, i_idx])  # [M]
    if dummy:  # keeps the graph (every parameter gets a zero gradient), changes no value
        zero = lp.clamp(min=LOGP_FLOOR).sum() * 0.0
        return zeros + zero, (zeros + zero if eubo_beta is not None else None)
    if eubo_beta is not None:  # SPG: guard a -inf log-prob (p underflow) so that neither bound is -inf/NaN
        if torch.isnan(lp).any():
            raise ValueError("spg_bounds: NaN log-probabilities from the model")
        lp = lp.clamp(min=LOGP_FLOOR)
    out = zeros.index_put((s, i_idx), lp * rows.elbo_coef[r_idx], accumulate=True)
    if eubo_beta is None:
        return out, None
    g = rows.outer.shape[1]
    slot = (s * g + rows.group[r_idx]) * L + i_idx
    logs = eubo_tokens(lp, rows.eubo_coef[r_idx], slot, n * g * L, eubo_beta).view(n, g, L)
    return out, (logs * rows.outer[:, :, None]).sum(1)


def elbo(adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None, nodes: int = 2, draws: int = 1,
         p_mask_prompt: float = 0.0, coupled: bool = True, need: torch.Tensor | None = None,
         masking: str = "random", block_length: int = 0) -> torch.Tensor:
    """Per-token ELBO contributions ``ℓ_i = Σ_r c_r [i scored in r] log p_θ(o_i | x_r)``: ``[N, L]``
    float32, 0 where ``need`` is False or never scored (:func:`bounds` without the EUBO; same args)."""
    return bounds(adapter, rollout, generator, nodes, draws, p_mask_prompt, coupled, need, masking, block_length)[0]


def spg_bounds(adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None, nodes: int = 2,
               draws: int = 1, p_mask_prompt: float = 0.0, coupled: bool = True, need: torch.Tensor | None = None,
               masking: str = "block", block_length: int = 0, eubo_beta: float = 1.5) -> PerToken:
    """``PerToken(elbo=[N, L], eubo=[N, L])`` float32 from the same masks (:func:`bounds`; docs/spec.md §1.5)."""
    el, eu = bounds(adapter, rollout, generator, nodes, draws, p_mask_prompt, coupled, need, masking, block_length,
                    eubo_beta)
    return PerToken(elbo=el, eubo=eu)


LOGP_FLOOR = -1e4  # log-probs below this are treated as this (a -inf log-prob would make the EUBO NaN)


def eubo_tokens(lp: torch.Tensor, coef: torch.Tensor, slot: torch.Tensor, size: int, beta: float) -> torch.Tensor:
    """Per-slot EUBO ``(1/β) log Σ_{m in slot} coef_m exp(β·lp_m)`` in log-sum-exp form (docs/spec.md §1.5).

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


@LIKELIHOODS.register("elbo")
@dataclass(frozen=True)
class ELBO:
    """Registered as ``elbo`` (docs/spec.md §1.4; GDPO's estimator): per-token contributions to the sequence
    ELBO on fixed Gauss–Legendre nodes with seeded masks; ``Σ_i ℓ_i`` is the ELBO estimate.

    Attributes:
        nodes: Gauss–Legendre nodes on [0, 1] **[choice]** (GDPO: 2; ``spg_public``: must be 1).
        draws: masks per node **[choice]** (GDPO: 1; ``spg_public``: SPG's ``num_t``, distinct blocks).
        coupled: complementary masks across symmetric nodes (every token scored; unbiased).
        p_mask_prompt: prompt masking probability (default 0; ``spg_public``: also clean completion
            tokens left of the drawn block, per row; SPG's runs: 0.15).
        masking: **[choice]** ``"random"``, ``"block"`` (SPG's block-wise masking as docs/spec.md §1.5 states
            it) or ``"spg_public"`` (the scheme of SPG's released code; module docstring).
        block_length: block size of the block maskings (0: the rollout sampler's).
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
        if self.masking == "spg_public" and self.nodes != 1:
            raise ValueError(f"nodes (={self.nodes}) must be 1 with masking: spg_public (SPG's code draws the "
                             "masking rate uniformly, not on quadrature nodes; draws = its num_t)")

    def refusal(self, block_model: bool) -> str | None:
        """:func:`~maskrl.likelihood.blocks.model_refusal`: ``spg_public`` on a block model, else ``None``."""
        return SPG_PUBLIC_BLOCKS if block_model and self.masking == "spg_public" else None

    def rows(self, rollout: Rollout, need: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` long: ``nodes·draws`` per sequence with a needed position, else 0."""
        return needed(rollout, need).any(-1).long() * (self.nodes * self.draws)

    def _bounds(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                need: torch.Tensor | None, eubo_beta: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return bounds(adapter, rollout, generator, self.nodes, self.draws, self.p_mask_prompt, self.coupled, need,
                      self.masking, self.block_length, eubo_beta)

    def __call__(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                 need: torch.Tensor | None = None) -> torch.Tensor:
        """See :func:`elbo`; ``[N, L]`` float32."""
        return self._bounds(adapter, rollout, generator, need, None)[0]


@LIKELIHOODS.register("spg_bounds")
@dataclass(frozen=True)
class SPGBounds(ELBO):
    """Registered as ``spg_bounds`` (docs/spec.md §1.4/§1.5; SPG's estimator, the ``spg`` objective's default):
    block-wise masking, and per token both the ELBO contribution and the EUBO from the same masks
    (:func:`bounds` with ``eubo_beta``). Returns ``PerToken(elbo=[N, L], eubo=[N, L])`` float32
    (``provides = ("elbo", "eubo")``); ``Σ_i`` of each estimates its bound of the whole completion.

    Positions outside every drawn block get 0 in a call (a stochastic estimator: one block per
    (sequence, draw); the trainer draws fresh masks each inner iteration).

    Attributes:
        nodes: Gauss–Legendre nodes on [0, 1] for the drawn block's masking ratio **[choice]** (2;
            ``spg_public``: must be 1).
        draws: block-and-mask draws per node **[choice]** (1; ``spg_public``: SPG's ``num_t``, 2 in its runs).
        coupled: complementary masks across symmetric nodes inside the drawn block.
        p_mask_prompt: prompt masking probability (default 0; ``spg_public``: also each clean
            completion token left of the drawn block, per row; SPG's runs: 0.15).
        masking: ``"block"`` (docs/spec.md §1.5, default), ``"spg_public"`` (SPG's released code) or ``"random"``.
        block_length: block size (0: the rollout sampler's block length).
        eubo_beta: β of the EUBO **[choice]** (default 1.5).
    """

    provides: ClassVar[tuple[str, ...]] = ("elbo", "eubo")
    masking: str = "block"
    eubo_beta: float = 1.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.eubo_beta > 0:
            raise ValueError(f"eubo_beta (={self.eubo_beta}) must be > 0")

    def __call__(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                 need: torch.Tensor | None = None) -> PerToken:
        """``PerToken(elbo=[N, L], eubo=[N, L])`` float32 (see :func:`spg_bounds`)."""
        el, eu = self._bounds(adapter, rollout, generator, need, self.eubo_beta)
        return PerToken(elbo=el, eubo=eu)
