"""State likelihood along a recorded rollout (docs/spec.md §1.4 ``state``; RLDF, DTCA, DiSPO).

``mean_field`` scores every completion token from the all-masked state, a state the sampler visits
only at its first step. The ``state`` estimator scores each token at the state in which the sampler
actually committed it: for a token committed at step t, the input is the rollout's state x_t (every
completion position with ``commit_step >= t`` set to ``[M]``, earlier commits visible) and
``ℓ_i = log p_θ(o_i | q^m, x_t)``. With ``p_mask_prompt = 0`` the sum over a completion is the
log-probability of the rollout's token choices given its unmasking order (the order itself, which
low-confidence remasking picks from θ's confidences, is not scored).

Cost: one forward row per distinct (sequence, commit step) pair among the positions asked for,
i.e. ``N·T`` rows for the fixed schedule (T denoising steps) instead of ``N`` for ``mean_field``;
``train.max_forward_rows`` bounds the rows of one forward. The output layer runs only on the tokens
committed at each state (about ``L/T`` per row), so the scores cost as much memory as mean-field's.

**Block-diffusion models** (``adapter.block_size`` set; SDAR / TraDo). The forward is block-causal, so
a token of block b sees blocks <= b of x_t only. In a rollout that decoded its blocks in order (every
commit step of a block below every step of the next, :func:`maskrl.likelihood.blocks.block_rounds`),
the earlier blocks are clean at every step of block b, and x_t as the model saw it is "clean blocks
< b, block b with its positions committed at steps >= t masked". Such a row is scored as TraceRL does
(dLLM-RL ``train/rl_trado.py``): round r of the doubled x_t ⊕ x_0 forward masks, in every block at
once, the positions of the block's r-th and later distinct commit steps and scores those of its r-th,
with the clean completion as context (:mod:`maskrl.likelihood.blocks`) -- the same conditionals in
``max_b (steps of block b)`` rows instead of ``Σ_b``. A row that did not decode block by block (a
full-attention sampler's order, or a credit module's rewritten ``commit_step`` such as ``rldf_steps``'
``min(commit_step, s)``) is scored at its recorded states x_t through the plain block-causal forward,
which is also exactly what the model saw there. Either way each token is scored at its own state.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from maskrl.likelihood.base import LIKELIHOODS, needed, scatter_scores
from maskrl.likelihood.blocks import block_rounds, score_rows
from maskrl.likelihood.mean_field import mask_prompt
from maskrl.models.adapter import ModelAdapter
from maskrl.sampling.edit import refuse_edited
from maskrl.types import Rollout


def commit_states(commit_step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct (row, step) states needed to score every position at its commit step.

    Args:
        commit_step: ``[N, L]`` integer tensor, every entry ``>= 0``.

    Returns:
        ``rows [R]`` and ``steps [R]`` (long) naming the R distinct states, ordered by row then step,
        and ``index [N, L]`` (long): the state (0..R-1) in which each position was committed.

    Raises:
        ValueError: if ``commit_step`` is not a 2-D integer tensor, or has a negative entry (a
            position the rollout never committed; the message names the first such row).
    """
    if commit_step.dim() != 2 or commit_step.is_floating_point() or commit_step.dtype == torch.bool:
        raise ValueError(f"commit_step must be an [N, L] integer tensor, got shape {tuple(commit_step.shape)} "
                         f"and dtype {commit_step.dtype}")
    cs = commit_step.long()
    if cs.numel() == 0:
        empty = torch.zeros(0, dtype=torch.long, device=cs.device)
        return empty, empty, torch.zeros_like(cs)
    if (cs < 0).any():
        bad = int((cs < 0).any(-1).nonzero()[0].item())
        raise ValueError(f"commit_step row {bad} has a position that was never committed (< 0)")
    n_steps = int(cs.max().item()) + 1
    rows = torch.arange(cs.shape[0], device=cs.device)[:, None]
    key = rows * n_steps + cs  # [N, L], unique per (row, step)
    uniq, index = torch.unique(key, return_inverse=True)  # sorted: by row, then step
    return uniq // n_steps, uniq % n_steps, index


def _needed_states(rollout: Rollout, need: torch.Tensor | None, block_size: int | None = None):
    """Validated commit states restricted to the needed positions.

    Returns ``(rows [R], steps [R], state_of [M], n_idx [M], i_idx [M], key [N, L], ordered [N])``: the R
    states that hold at least one needed position, and for each needed position (n_idx, i_idx) its state
    (0..R-1); state (rows[r], steps[r]) hides the positions with ``key >= steps[r]``. ``key`` is
    ``commit_step``, except (``block_size`` given) in the rows decoded block by block (``ordered``),
    where it is the within-block round (:func:`maskrl.likelihood.blocks.block_rounds`).
    """
    cs = rollout.commit_step
    if cs.shape != rollout.completion_ids.shape:
        raise ValueError(f"rollout.commit_step has shape {tuple(cs.shape)}, completion_ids "
                         f"{tuple(rollout.completion_ids.shape)}; the state likelihood needs one step per position")
    try:
        rows, steps, index = commit_states(cs)  # all states
    except ValueError as e:
        raise ValueError(f"rollout.{e}") from None
    key, ordered = cs.long(), torch.zeros(cs.shape[0], dtype=torch.bool, device=cs.device)
    if block_size is not None and cs.numel():
        ordered, rank = block_rounds(cs, rollout.prompt_mask, block_size)
        key = torch.where(ordered[:, None], rank, key)
        rows, steps, index = commit_states(key)
    need = needed(rollout, need)
    n_idx, i_idx = need.nonzero(as_tuple=True)  # [M]
    used, state_of = torch.unique(index[n_idx, i_idx], return_inverse=True)  # [R'] states actually needed
    return rows[used], steps[used], state_of, n_idx, i_idx, key, ordered


def state(adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
          p_mask_prompt: float = 0.15, need: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token log-probs of ``rollout.completion_ids``, each at the state where it was committed.

    The prompt is masked as in ``mean_field`` (one draw per sequence from ``generator``, shared by
    all of that sequence's states), so θ, θ_old and θ_ref called with generators in the same state
    see identical inputs. Tokens committed at step 0 are scored from the all-masked state and equal
    ``mean_field``'s values. Only states holding a needed position are run, and the output layer is
    applied only to the needed positions committed at each state.

    Args:
        adapter: the policy (its grad mode is the caller's).
        rollout: needs ``prompt_ids [N, P]``, ``prompt_mask [N, P]``, ``completion_ids [N, L]`` and
            ``commit_step [N, L]`` as recorded by :func:`maskrl.sampling.generate`.
        generator: draws the prompt mask.
        p_mask_prompt: prompt masking probability **[choice]** (default 0.15, as ``mean_field``).
        need: ``[N, L]`` bool, positions to score (default all).

    Returns:
        ``[N, L]`` float32 log-probabilities, 0 where ``need`` is False.

    Raises:
        ValueError: as :func:`commit_states` for a bad ``commit_step`` (prefixed ``rollout.``), or if
            its shape differs from ``completion_ids``'.
    """
    refuse_edited(rollout, "likelihood 'state'")
    cs = rollout.commit_step
    block_size = getattr(adapter, "block_size", None)
    rows, steps, state_of, n_idx, i_idx, key, ordered = _needed_states(rollout, need, block_size)
    prompt = mask_prompt(rollout.prompt_ids, rollout.prompt_mask, adapter.mask_id, p_mask_prompt, generator)
    if rows.numel() == 0:  # no sequences or no positions
        return torch.zeros(cs.shape, dtype=torch.float32, device=cs.device)
    completion = rollout.completion_ids[rows]  # [R, L]
    hidden = key[rows] >= steps[:, None]  # [R, L]: still masked in state x_t (a block rollout: in round r)
    x_comp = torch.where(hidden, adapter.mask_id, completion)
    context = torch.where(ordered[rows][:, None], completion, x_comp)  # block rollouts: clean earlier blocks
    lp = score_rows(adapter, prompt[rows], rollout.prompt_mask[rows], x_comp, context, state_of, i_idx,
                    rollout.completion_ids[n_idx, i_idx])  # [M]
    return scatter_scores(lp, n_idx, i_idx, cs.shape)


@LIKELIHOODS.register("state")
@dataclass(frozen=True)
class State:
    """Registered as ``state`` (docs/spec.md §1.4; RLDF, DTCA, DiSPO): each token scored at its commit state.

    Attributes:
        p_mask_prompt: probability of masking each real prompt token **[choice]** (default 0.15).
    """

    p_mask_prompt: float = 0.15

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_mask_prompt <= 1.0:
            raise ValueError(f"p_mask_prompt (={self.p_mask_prompt}) must lie in [0, 1]")

    def rows(self, rollout: Rollout, need: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` long: distinct commit steps among each sequence's needed positions."""
        rows = _needed_states(rollout, need)[0]  # an upper bound for a block model (rounds <= states)
        return torch.bincount(rows, minlength=rollout.batch_size)

    def __call__(self, adapter: ModelAdapter, rollout: Rollout, generator: torch.Generator | None,
                 need: torch.Tensor | None = None) -> torch.Tensor:
        """See :func:`state`; returns ``[N, L]`` float32."""
        return state(adapter, rollout, generator, self.p_mask_prompt, need)
