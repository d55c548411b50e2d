"""The commit rule as pure functions (docs/spec.md §1.2): which ids may be candidates, the candidate draw
(Gumbel-max in float64), the confidence ranking, and the fixed / threshold selection.

One step of the sampler is, on the ``[n, b]`` positions of each row's current block::

    logits = candidate_logits(head_output, mask_id, token_count)  # ids that can never be committed: -inf
    cand, prob = propose(logits[eligible], temperature, generator)  # [m]: x̂_i, c_i = softmax(logits)[x̂_i],
    cand, prob = scatter_drawn(eligible, cand, -1), scatter_drawn(eligible, prob, 0.0)  # drawn at the masks only
    score = commit_scores(prob, eligible, remasking, generator, stop)
    rank = rank_positions(score)
    take = select_fixed(rank, k, eligible)  or  select_threshold(rank, prob, threshold, eligible)
    take = hold_stops(take, stop, eligible)                       # suppress_eos only

DiSPO's branch fillings (docs/spec.md §4) draw with the same :func:`gumbel_max`.
"""
from __future__ import annotations

import torch


def candidate_logits(logits: torch.Tensor, mask_id: int, token_count: int | None = None) -> torch.Tensor:
    """Remove the ids that are never valid outputs from ``logits [..., V]`` (in place, returned): the
    ``[M]`` token's logit, and those of the ids ``>= token_count`` that have no tokenizer entry (the
    padded output rows of Qwen2-based models such as Dream; ``None``: every id has one,
    :attr:`~maskrl.models.adapter.ModelAdapter.token_count`), become ``-inf``, so neither the draw nor
    the confidence ever sees them."""
    logits[..., mask_id] = float("-inf")
    if token_count is not None and token_count < logits.shape[-1]:
        logits[..., token_count:] = float("-inf")
    return logits


def first_max(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` (``[...]`` long from ``x [..., V]``): the index of each row's first maximum, a NaN
    counting as the maximum, computed as ``x.max(-1).indices``, which returns the same index (ties, NaN and
    infinities included: ``tests/test_sampling_first_max.py``) and is 1.6-2.3x faster on CPU at V = 8k-126k
    (torch 2.13, one thread; its reduction carries the index with the value, ``argmax``'s does not vectorise)."""
    return x.max(-1).indices


def gumbel_max(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """One sample per row of ``softmax(logits / τ)`` by the Gumbel-max trick in float64 (docs/spec.md §1.2).

    The uniforms ``u [*logits.shape]`` float64 are drawn from ``generator`` on the generator's own
    device (then moved to the logits'), and ``argmax(logits / τ - log(-log u))`` is taken. ``τ = 0``
    draws nothing and returns the argmax. The float64 arithmetic runs in place on two buffers (the
    uniforms and a float64 copy of the logits) instead of building a new tensor per operation: the
    same operations on the same values, so the same bits (``a - g`` is computed as ``(-g) + a``, which
    IEEE-754 rounds identically, and ``a / 1`` is ``a``).

    Args:
        logits: ``[..., V]`` any float dtype (ids that must not be drawn already ``-inf``).
        temperature: τ >= 0.
        generator: the source of the noise (``None``: torch's global generator).

    Returns:
        ``[...]`` long token ids.
    """
    if temperature == 0:
        return first_max(logits)
    device = generator.device if generator is not None else logits.device
    g = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=device).to(logits.device)
    g.log_().neg_().log_().neg_()  # -log(-log u), in place
    z = logits.to(torch.float64, copy=True)  # a copy even when the logits are float64 already
    if temperature != 1:
        z.div_(temperature)
    return first_max(g.add_(z))  # (-log(-log u)) + logits / τ


def propose(logits: torch.Tensor, temperature: float,
            generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate tokens and their noise-free probabilities (docs/spec.md §1.2).

    Args:
        logits: ``[n, b, V]`` (or any ``[..., V]``) candidate logits (:func:`candidate_logits`).
        temperature: τ of the draw (:func:`gumbel_max`); 0 = argmax.
        generator: source of the Gumbel noise.

    Returns:
        ``(tokens [n, b] long, prob [n, b] float32)`` with ``prob = softmax(logits)[token]`` (no
        temperature).
    """
    tokens = gumbel_max(logits, temperature, generator)
    prob = torch.softmax(logits.float(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    return tokens, prob


def scatter_drawn(drawn: torch.Tensor, values: torch.Tensor | None, fill: float) -> torch.Tensor | None:
    """``[n, b]``: the values ``[m]`` computed at the ``m = drawn.sum()`` positions ``drawn [n, b]`` bool
    (row-major), ``fill`` elsewhere (a position with no candidate: the sampler never reads it there);
    ``None`` stays ``None``."""
    if values is None:
        return None
    out = torch.full(drawn.shape, fill, dtype=values.dtype, device=values.device)
    out[drawn] = values
    return out


def commit_scores(prob: torch.Tensor, eligible: torch.Tensor, remasking: str, generator: torch.Generator | None,
                  stop: torch.Tensor | None = None) -> torch.Tensor:
    """The score positions are ranked by (docs/spec.md §1.2).

    Args:
        prob: ``[n, b]`` float32 confidences of the candidates.
        eligible: ``[n, b]`` bool, positions still holding ``[M]`` (the others can never be committed).
        remasking: ``"low_confidence"`` (score = confidence) or ``"random"`` (score ~ U(0, 1), drawn
            from ``generator`` with ``prob``'s shape).
        generator: source of the random scores.
        stop: ``[n, b]`` bool, candidates that end a completion, ranked after every other candidate
            (``suppress_eos``); ``None``: no such demotion.

    Returns:
        ``[n, b]`` float32 scores; ``-inf`` where not eligible.
    """
    if remasking == "random":
        score = torch.rand(prob.shape, generator=generator, device=prob.device)
    else:
        score = prob.clone()
    if stop is not None:
        score = torch.where(stop, score - 2.0, score)  # scores lie in [0, 1]: every stop ranks last
    return score.masked_fill(~eligible, float("-inf"))


def rank_positions(score: torch.Tensor) -> torch.Tensor:
    """``[n, b]`` long rank of each position by descending ``score [n, b]`` (0 = best; ties keep the
    left-to-right order)."""
    order = score.argsort(dim=-1, descending=True, stable=True)
    offsets = torch.arange(score.shape[-1], device=score.device)
    return torch.empty_like(order).scatter_(1, order, offsets.expand_as(order))


def select_fixed(rank: torch.Tensor, k: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Fixed schedule: commit the ``k [n]`` best-ranked eligible positions of each row; ``[n, b]`` bool."""
    return (rank < k[:, None]) & eligible


def select_threshold(rank: torch.Tensor, prob: torch.Tensor, threshold: float, eligible: torch.Tensor,
                     strict: bool = False) -> torch.Tensor:
    """Threshold schedule (Fast-dLLM): commit the best-ranked position plus every eligible one with
    confidence ``prob >= threshold`` (Fast-dLLM's LLaDA code drops a candidate only below it), or
    ``prob > threshold`` when ``strict`` (Fast-dLLM v2's ``x1_p > threshold``: at ``threshold`` 1 only the
    best-ranked position, even where float32 confidences round to 1); ``[n, b]`` bool."""
    above = prob > threshold if strict else prob >= threshold
    return ((rank == 0) | above) & eligible


def hold_stops(take: torch.Tensor, stop: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """``suppress_eos`` (docs/spec.md §1.2): a stop candidate is committed only when no other candidate is left
    in the block -- at a step where every eligible non-stop candidate of its row's block is committed
    too. Whatever the schedule: the fixed schedule's top-k already ranks stops last (a no-op there);
    under the threshold schedule a confident stop waits for the rest of the block.

    Args:
        take: ``[n, b]`` bool, the schedule's selection; stop: ``[n, b]`` bool, stop candidates;
        eligible: ``[n, b]`` bool, positions still holding ``[M]``.

    Returns:
        ``[n, b]`` bool, ``take`` without the stop commits of rows that leave a non-stop candidate
        uncommitted.
    """
    left = (eligible & ~stop & ~take).any(-1, keepdim=True)  # [n, 1]
    return take & ~(stop & left)


# ---------------------------------------------------------------- block-diffusion strategies (SDAR)
def block_candidates(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float,
                     generator: torch.Generator | None, entropy: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Candidates and confidences of the block-diffusion families' strategies (SDAR's
    ``sample_with_temperature_topk_topp``: logits divided by τ, then top-k, then top-p filtered; the
    candidate drawn from that distribution, its confidence = the candidate's probability under it).

    Args:
        logits: ``[n, b, V]`` candidate logits (:func:`candidate_logits`: ``[M]`` and id-less rows ``-inf``).
        temperature: τ; 0 = the argmax, confidence from the filtered softmax at τ = 1 (SDAR's greedy limit).
        top_k: keep the ``top_k`` largest logits (``None``: off); top_p: nucleus mass (1.0: off).
        generator: the Gumbel-max draw's noise (:func:`gumbel_max`; τ > 0 only).
        entropy: also return the entropy (nats) of that distribution (``entropy_bounded``).

    Returns:
        ``(cand [n, b] long, confidence [n, b] float32, prob [n, b] float32, entropy [n, b] float32 or None)``;
        ``prob`` is the noise-free ``softmax(logits)[cand]`` (the recorded ``commit_prob``).
    """
    from maskrl.sampling.dream import filter_top_k, filter_top_p

    z = logits.float() / (temperature if temperature > 0 else 1.0)
    z = filter_top_p(filter_top_k(z, top_k), top_p)
    cand = gumbel_max(z, temperature, generator)
    logp = torch.log_softmax(z, dim=-1)
    conf = logp.gather(-1, cand[..., None]).squeeze(-1).exp()
    prob = torch.softmax(logits.float(), dim=-1).gather(-1, cand[..., None]).squeeze(-1)
    ent = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1) if entropy else None
    return cand, conf, prob, ent


def select_sequential(eligible: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """SDAR's ``sequential``: the first ``k [n]`` masks of the block, left to right; ``[n, b]`` bool."""
    return eligible & (eligible.long().cumsum(-1) <= k[:, None])


def select_dynamic(conf: torch.Tensor, eligible: torch.Tensor, k: torch.Tensor, threshold: float) -> torch.Tensor:
    """SDAR's ``low_confidence_dynamic``: every mask whose confidence exceeds ``threshold`` (strictly)
    when they are at least ``k [n]``, else the ``k`` most confident (:func:`select_fixed`); ``[n, b]`` bool.
    ``k`` is capped at the masks left (SDAR's top-k would otherwise also pick filled positions)."""
    high = eligible & (conf > threshold)
    k = torch.minimum(k, eligible.sum(-1))
    top = select_fixed(rank_positions(commit_scores(conf, eligible, "low_confidence", None)), k, eligible)
    return torch.where((high.sum(-1) >= k)[:, None], high, top)


def select_entropy_bounded(entropy: torch.Tensor, eligible: torch.Tensor, gamma: float) -> torch.Tensor:
    """The entropy-bounded sampler (Ben-Hamu et al. 2025, "EB-sampler"): sort the masks by entropy
    ascending and accept the largest prefix of k >= 1 with ``Σ H − max H <= γ`` (sorted ascending, the
    sum of the first k − 1 entropies); ``entropy [n, b]`` float, ``[n, b]`` bool (ties: left first)."""
    h = entropy.masked_fill(~eligible, float("inf"))
    order = h.argsort(dim=-1, stable=True)
    hs = h.gather(-1, order)
    before = torch.cat([torch.zeros_like(hs[:, :1]), hs[:, :-1].cumsum(-1)], dim=-1)  # Σ of those ranked before
    keep = torch.isfinite(hs) & (before <= gamma)
    return torch.zeros_like(eligible).scatter_(1, order, keep)


def select_block(remasking: str, eligible: torch.Tensor, k: torch.Tensor, conf: torch.Tensor,
                 entropy: torch.Tensor | None, threshold: float, gamma: float) -> torch.Tensor:
    """The block-diffusion strategy ``remasking`` (:data:`~maskrl.sampling.config.BLOCK_REMASKING`) on one
    step: ``eligible [n, b]`` masks of the current block, ``k [n]`` the step's transfer count (capped at
    the masks left), ``conf [n, b]`` confidences, ``entropy [n, b]`` (``entropy_bounded`` only);
    ``[n, b]`` bool positions to commit. Raises ``ValueError`` on an unknown name."""
    k = torch.minimum(k, eligible.sum(-1))
    if remasking == "sequential":
        return select_sequential(eligible, k)
    if remasking == "low_confidence_static":
        return select_fixed(rank_positions(commit_scores(conf, eligible, "low_confidence", None)), k, eligible)
    if remasking == "low_confidence_dynamic":
        return select_dynamic(conf, eligible, k, threshold)
    if remasking == "entropy_bounded":
        return select_entropy_bounded(entropy, eligible, gamma)
    raise ValueError(f"remasking {remasking!r} is not a block-diffusion strategy")


def open_sub_block(position: torch.Tensor, eligible: torch.Tensor, block_length: int, sub_block_length: int
                   ) -> torch.Tensor:
    """Fast-dLLM v2's sub-blocks: ``[n, b]`` bool, the positions of the first sub-block (``sub_block_length``
    positions, counted from the block's start) that still holds an ``eligible [n, b]`` mask; a step commits
    only there. ``position [n, b]`` long: the positions counted from each row's first real token (so that
    ``position % block_length`` is the offset in the block)."""
    sub = torch.div(position % block_length, sub_block_length, rounding_mode="floor")  # [n, b]
    first = sub.masked_fill(~eligible, block_length).min(-1, keepdim=True).values
    return sub == first
