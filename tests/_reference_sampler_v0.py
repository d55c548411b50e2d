"""The one sampler for rollout and evaluation (docs/spec.md §1.2): LLaDA low-confidence remasking with a
fixed schedule, or Fast-dLLM's confidence threshold, block semi-autoregressive, batched.

It returns a :class:`~maskrl.types.Rollout` that records, for every completion position, the step
that committed it and the noise-free probability of the committed token. Credit modules that need
more per-step statistics (DPS's log-prob sums, DiSPO's branch fillings) pass *observers*: objects
called once per step with a :class:`StepView` of what the sampler computed anyway. Nothing extra is
computed when no observer asks for it, and the sampler's signature never changes.

Departures from the reference implementations, on purpose:
- the ``[M]`` token's own logit is excluded from candidates (it is never a valid output);
- Gumbel noise is drawn only for the current block's positions (float64), so memory is
  ``N·b·V`` per step rather than ``N·L·V``;
- in threshold mode each row advances through its blocks independently, so a row's trajectory is
  the same whether it is decoded alone or in a batch; ``steps`` is ignored there (a block ends when
  it has no masks, at most ``block_length`` steps).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Protocol, Sequence

import torch

from maskrl.models.adapter import ModelAdapter
from maskrl.types import Rollout

SCHEDULES = ("fixed", "threshold")
REMASKING = ("low_confidence", "random")


@dataclass(frozen=True)
class SamplerConfig:
    """Sampler settings (docs/spec.md §1.2).

    Attributes:
        gen_length: completion length L in tokens.
        block_length: block size b; ``gen_length`` must be a multiple of it.
        steps: total denoising steps T for the fixed schedule; must be a multiple of ``L/b``.
        temperature: τ of the Gumbel-max candidate draw; 0 = argmax (greedy).
        schedule: ``"fixed"`` (top-k_j per step) or ``"threshold"`` (Fast-dLLM).
        threshold: confidence threshold of the threshold schedule.
        remasking: ``"low_confidence"`` (commit the most confident) or ``"random"``.
        cfg_scale: classifier-free guidance scale (0 = off); the unconditional pass masks the prompt.
        suppress_eos: commit eos candidates after every other candidate of the block.
    """

    gen_length: int = 256
    block_length: int = 32
    steps: int = 128
    temperature: float = 0.0
    schedule: str = "fixed"
    threshold: float = 0.9
    remasking: str = "low_confidence"
    cfg_scale: float = 0.0
    suppress_eos: bool = False

    def __post_init__(self) -> None:
        if self.gen_length <= 0 or self.block_length <= 0:
            raise ValueError(f"gen_length (={self.gen_length}) and block_length (={self.block_length}) must be positive")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length (={self.gen_length}) must be a multiple of block_length (={self.block_length})")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} is not one of {SCHEDULES}")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking {self.remasking!r} is not one of {REMASKING}")
        if self.schedule == "fixed" and (self.steps <= 0 or self.steps % self.num_blocks):
            raise ValueError(f"steps (={self.steps}) must be a positive multiple of the number of blocks "
                             f"gen_length/block_length = {self.num_blocks}")
        if self.temperature < 0:
            raise ValueError(f"temperature (={self.temperature}) must be >= 0")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold (={self.threshold}) must lie in (0, 1]")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    def commits_per_step(self) -> list[int]:
        """Fixed schedule: tokens committed at each step of a block, ``k_j`` (docs/spec.md §1.2): the block's
        ``b`` masks split evenly over its ``steps/(L/b)`` steps, remainder to the earliest steps."""
        spb = self.steps // self.num_blocks
        base, rem = divmod(self.block_length, spb)
        return [base + (1 if j < rem else 0) for j in range(spb)]


class StepView:
    """What one denoising step computed, handed to observers (read-only).

    Attributes:
        step: global step index (0-based).
        rows: ``[n]`` long, indices (into the full batch of N) of the rows decoded at this step.
        logits: ``[n, L, V]`` position-aligned completion logits before temperature.
        masked: ``[n, L]`` bool, completion positions holding ``[M]`` *before* this step.
        committed: ``[n, L]`` bool, positions committed at this step.
        tokens: ``[n, L]`` long, completion after this step's commits.
        block_start: ``[n]`` long, first position of each row's current block.
        block_length: b.
    """

    def __init__(self, step, rows, logits, masked, committed, tokens, block_start, block_length):
        self.step, self.rows, self.logits = step, rows, logits
        self.masked, self.committed, self.tokens = masked, committed, tokens
        self.block_start, self.block_length = block_start, block_length

    @cached_property
    def log_probs(self) -> torch.Tensor:
        """``[n, L, V]`` float32 log-softmax of :attr:`logits` (computed on first access only)."""
        return torch.log_softmax(self.logits.float(), dim=-1)


class StepObserver(Protocol):
    """Collects per-step statistics during sampling (docs/architecture.md, Rollout ``step_stats``)."""

    def on_step(self, view: StepView) -> None: ...

    def result(self) -> dict[str, torch.Tensor]:
        """Statistics to store in ``Rollout.step_stats`` (tensors with a leading N dimension)."""
        ...


def _propose(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate tokens and their noise-free probabilities.

    Args:
        logits: ``[n, b, V]``.
    Returns:
        ``(tokens [n, b] long, prob [n, b] float32)`` with ``prob = softmax(logits)[token]``.
    """
    if temperature == 0:
        tokens = logits.argmax(-1)
    else:
        u = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=logits.device)
        gumbel = -torch.log(-torch.log(u))
        tokens = (logits.double() / temperature + gumbel).argmax(-1)
    prob = torch.softmax(logits.float(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    return tokens, prob


@torch.no_grad()
def generate(
    adapter: ModelAdapter,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    config: SamplerConfig,
    generator: torch.Generator | None = None,
    observers: Sequence[StepObserver] = (),
    group_ids: torch.Tensor | None = None,
    all_done: Callable[[bool], bool] | None = None,
) -> Rollout:
    """Denoise ``[prompt ; [M]×L]`` into completions (docs/spec.md §1.2).

    Args:
        adapter: the model.
        prompt_ids: ``[N, P]`` long, left-padded.
        prompt_mask: ``[N, P]`` bool, True on real prompt tokens.
        config: sampler settings.
        generator: ``torch.Generator`` on the model's device for the Gumbel draws and random
            remasking; required when ``temperature > 0`` or ``remasking == "random"``.
        observers: per-step statistic collectors; their ``result()`` fills ``Rollout.step_stats``.
        group_ids: ``[N]`` long; defaults to ``arange(N)``.
        all_done: rank synchronisation for sharded models (FSDP / ZeRO-3, where every forward is a
            collective). Called exactly once per loop iteration with "this rank has no row left"
            and must return True only when that holds on every rank (an all-reduce). A finished
            rank keeps running dummy forwards on its last state until then, so all ranks run the
            same number of forwards. ``None`` (default): stop as soon as this rank's rows finish.
            The returned Rollout is the same either way.

    Returns:
        A :class:`Rollout` (``commit_step``/``commit_prob`` ``[N, L]``, ``num_steps`` ``[N]``).

    Raises:
        ValueError: on mismatched shapes or a missing generator.
    """
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must be equal [N, P]")
    if generator is None and (config.temperature > 0 or config.remasking == "random"):
        raise ValueError("generator is required when temperature > 0 or remasking == 'random'")
    device = adapter.device
    n_rows, p_len = prompt_ids.shape
    L, b = config.gen_length, config.block_length
    x = torch.cat([prompt_ids.to(device), torch.full((n_rows, L), adapter.mask_id, dtype=torch.long, device=device)], 1)
    attn = torch.cat([prompt_mask.to(device).bool(), torch.ones((n_rows, L), dtype=torch.bool, device=device)], 1)
    commit_step = torch.full((n_rows, L), -1, dtype=torch.long, device=device)
    commit_prob = torch.zeros((n_rows, L), dtype=torch.float32, device=device)
    num_steps = torch.zeros(n_rows, dtype=torch.long, device=device)
    block = torch.zeros(n_rows, dtype=torch.long, device=device)       # [N] current block per row
    block_step = torch.zeros(n_rows, dtype=torch.long, device=device)  # [N] steps spent in it
    k_sched = torch.tensor(config.commits_per_step() if config.schedule == "fixed" else [0], device=device)
    offsets = torch.arange(b, device=device)
    positions = torch.arange(L, device=device)
    step = 0
    while True:
        rows = (block < config.num_blocks).nonzero().squeeze(-1)  # [n]
        finished = rows.numel() == 0
        if all_done is not None:
            # Threshold rows finish at different steps, so ranks would leave this loop at different
            # times and the per-forward collectives of FSDP / ZeRO-3 would go out of step.
            if all_done(finished):
                break
            if finished:  # others still decode: keep their collectives company, change nothing
                for _ in range(2 if config.cfg_scale > 0 else 1):
                    adapter.logits(x[:1], attn[:1])
                continue
        elif finished:
            break
        xr, ar = x[rows], attn[rows]
        logits = adapter.logits(xr, ar)
        if config.cfg_scale > 0:
            uncond = xr.clone()
            uncond[:, :p_len] = torch.where(ar[:, :p_len], adapter.mask_id, uncond[:, :p_len])
            un = adapter.logits(uncond, ar)
            logits = un + (config.cfg_scale + 1) * (logits - un)
        logits = logits[:, p_len:]  # [n, L, V]
        logits[..., adapter.mask_id] = float("-inf")
        comp = xr[:, p_len:]  # [n, L]
        masked = comp == adapter.mask_id
        start = block[rows] * b  # [n]
        pos = start[:, None] + offsets  # [n, b]
        blk_logits = logits.gather(1, pos[:, :, None].expand(-1, -1, logits.shape[-1]))  # [n, b, V]
        cand, prob = _propose(blk_logits, config.temperature, generator)  # [n, b]
        eligible = masked.gather(1, pos)  # [n, b]
        if config.remasking == "random":
            score = torch.rand(cand.shape, generator=generator, device=device)
        else:
            score = prob.clone()
        if config.suppress_eos:
            score = torch.where(adapter.is_stop(cand), score - 2.0, score)
        score = score.masked_fill(~eligible, float("-inf"))
        order = score.argsort(dim=-1, descending=True, stable=True)
        rank = torch.empty_like(order).scatter_(1, order, offsets.expand_as(order))  # [n, b]
        if config.schedule == "fixed":
            k = k_sched[block_step[rows].clamp(max=len(k_sched) - 1)]  # [n]
            take = (rank < k[:, None]) & eligible
        else:
            take = ((rank == 0) | (prob >= config.threshold)) & eligible
        # write the commits back into the full completion
        commit_full = torch.zeros_like(masked).scatter_(1, pos, take)  # [n, L]
        comp_new = comp.scatter(1, pos, torch.where(take, cand, comp.gather(1, pos)))
        x[rows, p_len:] = comp_new
        commit_step[rows] = torch.where(commit_full, step, commit_step[rows])
        commit_prob[rows] = commit_prob[rows].scatter(1, pos, torch.where(take, prob, commit_prob[rows].gather(1, pos)))
        # NOTE: a credit module that runs extra forwards at steps it chooses (DTCA / DiSPO-style) must
        # broadcast those choices from rank 0 under FSDP / ZeRO-3, or the collectives diverge.
        for obs in observers:
            obs.on_step(StepView(step, rows, logits, masked, commit_full, comp_new, start, b))
        # advance blocks
        block_step[rows] += 1
        in_block = (positions[None, :] >= start[:, None]) & (positions[None, :] < start[:, None] + b)
        block_done = ~((comp_new == adapter.mask_id) & in_block).any(-1)
        if config.schedule == "fixed":
            block_done = block_done | (block_step[rows] >= len(k_sched))
        finished_rows = rows[block_done]
        block[finished_rows] += 1
        block_step[finished_rows] = 0
        num_steps[rows] = step + 1
        step += 1
    completion = x[:, p_len:]
    if (commit_step < 0).any():  # pragma: no cover - guarded by the schedule arithmetic
        raise RuntimeError("sampler finished with uncommitted positions")
    stop = adapter.is_stop(completion)
    # valid = up to and including the first stop token
    completion_mask = (stop.long().cumsum(-1) - stop.long()) == 0
    stats: dict[str, torch.Tensor] = {}
    for obs in observers:
        stats.update(obs.result())
    return Rollout(
        prompt_ids=prompt_ids.to(device), prompt_mask=prompt_mask.to(device).bool(), completion_ids=completion,
        completion_mask=completion_mask, commit_step=commit_step, commit_prob=commit_prob, num_steps=num_steps,
        group_ids=(group_ids if group_ids is not None else torch.arange(n_rows)).to(device), sampler=config,
        step_stats=stats,
    )
