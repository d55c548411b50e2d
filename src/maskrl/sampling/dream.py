"""Dream's own decoding rule (Dream 7B, Ye et al. 2025, ``diffusion_generate``; SPEC §1.2) as pure
functions the one sampler calls when ``SamplerConfig.schedule == "dream"`` or ``remasking`` names one
of Dream's algorithms.

What Dream's rule is, and how each piece maps onto maskrl's block loop:

- **schedule** (``schedule="dream"``): with ``T_b = steps / (L/b)`` steps per block and
  ``t_0..t_{T_b} = linspace(1, eps=1e-3, T_b + 1)``, step ``j`` of a block commits
  ``int(m · (1 - t_{j+1}/t_j))`` tokens, ``m`` the masks still in the block; the block's last step
  commits all that is left. With ``block_length == gen_length`` this is Dream's unblocked schedule; with
  blocks it runs inside each block, as Fast-dLLM's Dream variant does. Dream's ``m`` is the mask count
  averaged over the batch; under this schedule every row commits the same number of tokens each step,
  so all rows hold the same count and the row's own count is that average (and a row decodes the same
  alone or in a batch).
- **confidence** (:func:`dream_confidence`), from Dream's softmax: logits divided by the temperature
  (when > 0), then top-p, then top-k filtering (:func:`filter_top_p`, :func:`filter_top_k`), with the
  ``[M]`` logit kept in: ``maskgit_plus`` the probability of the candidate (top-1 when greedy),
  ``topk_margin`` top-1 minus top-2, ``entropy`` ``Σ p log(p + 1e-10)`` (the negative entropy).
- **positions**: the ``k`` most confident, or with ``alg_temp > 0`` ``k`` positions drawn without
  replacement from ``softmax(confidence / alg_temp)`` (:func:`select_alg_temp`; Gumbel-top-k, the same
  distribution as Dream's ``multinomial``);
- ``origin`` (:func:`select_origin`): each masked position of the block is revealed with probability
  ``1 - t_{j+1}/t_j`` (1 at the block's last step), one uniform per still-masked position per step, in
  row-major order over the batch.

Departures, on purpose: the candidate token is drawn from the filtered distribution with ``[M]`` (and any
id :func:`~maskrl.sampling.commit.candidate_logits` removes) excluded, so a commit never writes ``[M]``
(Dream can draw ``[M]``, which leaves the position masked); the draw uses the sampler's Gumbel-max
(:func:`~maskrl.sampling.commit.gumbel_max`), the same distribution as Dream's ``Categorical``.
``Rollout.commit_prob`` stays the noise-free ``softmax(candidate logits)[x̂]`` (no temperature, no
filter), the quantity the state likelihood and credit modules read.
"""
from __future__ import annotations

import torch

from maskrl.sampling.commit import gumbel_max

DREAM_REMASKING = ("maskgit_plus", "topk_margin", "entropy", "origin")
DREAM_CONFIDENCES = ("maskgit_plus", "topk_margin", "entropy")
DREAM_EPS = 1e-3


def filter_top_k(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """Keep the ``top_k`` largest logits of ``logits [..., V]`` (ties with the k-th kept); the others
    become ``finfo.min`` (Dream's value, so a softmax gives them exactly 0). ``None``: unchanged."""
    if top_k is None:
        return logits
    kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def filter_top_p(logits: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """Nucleus filter of ``logits [..., V]``: keep the most probable ids up to and including the first
    whose cumulative probability exceeds ``top_p`` (the top-1 always kept); the rest ``finfo.min``.
    ``None`` or ``>= 1``: unchanged."""
    if top_p is None or top_p >= 1:
        return logits
    srt, idx = torch.sort(logits, dim=-1, descending=True)
    cum = torch.softmax(srt, dim=-1).cumsum(-1)
    drop = torch.zeros_like(cum, dtype=torch.bool)
    drop[..., 1:] = cum[..., :-1] > top_p  # drop an id only once the ids before it already exceed top_p
    remove = torch.zeros_like(drop).scatter(-1, idx, drop)
    return logits.masked_fill(remove, torch.finfo(logits.dtype).min)


def dream_logits(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Dream's sampling logits: ``logits / τ`` (τ > 0), then top-p, then top-k. ``[..., V]``, dtype kept."""
    if temperature > 0:
        logits = logits / temperature
    return filter_top_k(filter_top_p(logits, top_p), top_k)


def dream_confidence(probs: torch.Tensor, cand: torch.Tensor, remasking: str) -> torch.Tensor:
    """Dream's confidence of each position.

    Args:
        probs: ``[n, b, V]`` float32, Dream's softmax (:func:`dream_logits`, ``[M]`` kept in).
        cand: ``[n, b]`` long, the candidate tokens.
        remasking: ``"maskgit_plus"`` (``probs[cand]``), ``"topk_margin"`` (top-1 minus top-2) or
            ``"entropy"`` (``Σ p log(p + 1e-10)``).

    Returns:
        ``[n, b]`` float32.

    Raises:
        ValueError: on another ``remasking``.
    """
    if remasking == "maskgit_plus":
        return probs.gather(-1, cand[..., None]).squeeze(-1)
    if remasking == "topk_margin":
        top2 = probs.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    if remasking == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(-1)
    raise ValueError(f"remasking {remasking!r} is not one of {DREAM_CONFIDENCES}")


def dream_timesteps(steps_per_block: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[T_b + 1]`` float32 ``linspace(1, 1e-3, T_b + 1)``, Dream's time grid of one block."""
    return torch.linspace(1, DREAM_EPS, steps_per_block + 1, device=device)


def dream_reveal_prob(timesteps: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """``[n]`` float32 ``1 - t_{j+1}/t_j`` at block steps ``j [n]`` long (1 at the last step)."""
    last = j >= timesteps.numel() - 2
    jj = j.clamp(max=timesteps.numel() - 2)
    p = 1 - timesteps[jj + 1] / timesteps[jj]
    return torch.where(last, torch.ones_like(p), p)


def dream_commit_counts(masks: torch.Tensor, timesteps: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """Dream's ``k`` per row: ``int(m · (1 - t_{j+1}/t_j))``, or ``m`` at the block's last step.

    Args:
        masks: ``[n]`` long, masks left in each row's block.
        timesteps: :func:`dream_timesteps`.
        j: ``[n]`` long, each row's step within its block.

    Returns:
        ``[n]`` long.
    """
    last = j >= timesteps.numel() - 2
    jj = j.clamp(max=timesteps.numel() - 2)
    k = (masks.float() * (1 - timesteps[jj + 1] / timesteps[jj])).long()  # float32 product, truncated like int()
    return torch.where(last, masks, k)


def demote_stops(score: torch.Tensor, stop: torch.Tensor | None) -> torch.Tensor:
    """Rank ``stop [n, b]`` candidates after every other one whatever the scores' range (entropy
    confidences are negative and unbounded): subtract the row's finite score span plus one."""
    if stop is None:
        return score
    finite = torch.isfinite(score)
    hi = score.masked_fill(~finite, float("-inf")).amax(-1, keepdim=True)
    lo = score.masked_fill(~finite, float("inf")).amin(-1, keepdim=True)
    span = torch.where(torch.isfinite(hi - lo), hi - lo, torch.zeros_like(hi))
    return torch.where(stop, score - span - 1.0, score)


def select_alg_temp(score: torch.Tensor, k: torch.Tensor, alg_temp: float,
                    generator: torch.Generator | None) -> torch.Tensor:
    """``k [n]`` positions per row drawn without replacement with weights ``softmax(score / alg_temp)``
    (Gumbel-top-k: one float64 uniform per position of ``score [n, b]``, ``-inf`` never drawn);
    ``[n, b]`` bool."""
    device = generator.device if generator is not None else score.device
    u = torch.rand(score.shape, generator=generator, dtype=torch.float64, device=device).to(score.device)
    keyed = score.double() / alg_temp - torch.log(-torch.log(u))
    order = keyed.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(score.shape[-1], device=score.device).expand_as(order))
    return (rank < k[:, None]) & torch.isfinite(score)


def select_origin(eligible: torch.Tensor, p_reveal: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Dream's ``origin``: reveal each ``eligible [n, b]`` position with probability ``p_reveal [n]``;
    one float32 uniform per eligible position, drawn in row-major order; ``[n, b]`` bool."""
    device = generator.device if generator is not None else eligible.device
    u = torch.rand(int(eligible.sum()), generator=generator, device=device).to(eligible.device)
    take = torch.zeros_like(eligible)
    take[eligible] = u < p_reveal[:, None].expand_as(eligible)[eligible]
    return take


def dream_step(logits: torch.Tensor, mask_logit: torch.Tensor | None, mask_id: int, eligible: torch.Tensor,
               stop_fn, *, remasking: str, temperature: float, top_k: int | None, top_p: float | None,
               alg_temp: float, k: torch.Tensor | None, p_reveal: torch.Tensor | None,
               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One commit step under Dream's rule on a block's ``[n, b]`` positions.

    Args:
        logits: ``[n, b, V]`` candidate logits (``[M]`` already ``-inf``).
        mask_logit: ``[n, b]`` the ``[M]`` column before it was removed (put back for Dream's
            confidence); ``None``: leave ``[M]`` out of the confidence too.
        mask_id: the ``[M]`` id.
        eligible: ``[n, b]`` bool, positions still masked.
        stop_fn: ``ids -> bool`` stop-token test (``suppress_eos``), or ``None``.
        remasking: one of :data:`DREAM_REMASKING`, or ``"low_confidence"`` / ``"random"`` (ranked by
            the noise-free probability / uniform scores with top-k / top-p draws).
        temperature, top_k, top_p, alg_temp: as in :class:`~maskrl.sampling.SamplerConfig`.
        k: ``[n]`` long commits per row (all but ``origin``); p_reveal: ``[n]`` (``origin``).
        generator: the noise source (candidate draw first, then the position draw).

    Returns:
        ``(take [n, b] bool, cand [n, b] long, prob [n, b] float32)``, ``prob`` the noise-free
        ``softmax(logits)[cand]``.
    """
    filtered = dream_logits(logits.float(), temperature, top_k, top_p)  # [n, b, V], [M] -inf
    if temperature > 0:  # Gumbel-max on the tempered, filtered logits: Dream's Categorical draw
        cand = gumbel_max(filtered.double(), 1.0, generator)
    else:
        cand = filtered.argmax(-1)
    prob = torch.softmax(logits.float(), dim=-1).gather(-1, cand[..., None]).squeeze(-1)
    if remasking == "origin":
        return select_origin(eligible, p_reveal, generator), cand, prob
    if remasking in DREAM_CONFIDENCES:
        with_mask = logits.float().clone()
        if mask_logit is not None:
            with_mask[..., mask_id] = mask_logit.float()
        probs = torch.softmax(dream_logits(with_mask, temperature, top_k, top_p), dim=-1)
        score = dream_confidence(probs, cand, remasking)
    elif remasking == "random":
        score = torch.rand(prob.shape, generator=generator, device=prob.device)
    else:
        score = prob.clone()
    score = demote_stops(score, stop_fn(cand) if stop_fn is not None else None)
    score = score.masked_fill(~eligible, float("-inf"))
    if alg_temp > 0:
        return select_alg_temp(score, k, alg_temp, generator) & eligible, cand, prob
    order = score.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(score.shape[-1], device=score.device).expand_as(order))
    return (rank < k[:, None]) & eligible, cand, prob
