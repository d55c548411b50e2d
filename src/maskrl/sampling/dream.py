"""Dream's own decoding rule (Dream 7B, Ye et al. 2025, ``diffusion_generate``; docs/spec.md §1.2) and
Fast-dLLM's Dream block variant (Wu et al. 2025, ``generation_utils_block.py``) as pure functions the
one sampler calls when :attr:`SamplerConfig.dream_rule` holds.

Each piece does what Dream's code does, in its order, with the same torch operations on tensors of
the same layout, so that with a generator seeded like torch's global one (Dream draws from the global
generator) the numbers drawn are the same, and the tokens are Dream's token for token
(``benchmarks/references/dream_reference.py`` checks it against Dream's and Fast-dLLM's code):

- **schedule** (``schedule="dream"``): with ``T_b = steps / (L/b)`` steps per block and
  ``t_0..t_{T_b} = linspace(1, eps=1e-3, T_b + 1)``, step ``j`` of a block commits
  ``int(m · (1 - t_{j+1}/t_j))`` tokens, ``m`` the masks still in the block; the block's last step
  commits all that is left. ``block_length == gen_length`` is Dream's unblocked schedule. Dream's
  ``m`` is the mask count averaged over the batch; every row commits the same number each step, so
  all rows hold the same count and the row's own count is that average.
- **candidates** (:func:`dream_probs`, :func:`dream_draw`, Dream's ``sample_tokens``): Dream's
  softmax of the raw logits (every output row, ``[M]`` included) divided by the temperature (when
  > 0), then top-p, then top-k filtered; greedy: the most probable id (``probs.max``); sampled:
  torch's ``Categorical(probs)`` draw, which is ``argmax(p / q)`` with ``q ~ Exp(1)`` drawn like
  ``p`` (torch's ``multinomial`` for one sample), and, as in Dream, the greedy id instead whenever
  ``Categorical`` rejects the probabilities (they fail torch's simplex check: a share of bf16 steps).
- **confidence** (:func:`dream_confidence`): ``maskgit_plus`` the candidate's probability,
  ``topk_margin`` top-1 minus top-2, ``entropy`` ``Σ p log(p + 1e-10)``.
- **positions** (:func:`layout_ranks`, :func:`layout_alg_temp`): ``torch.topk`` of the confidences
  laid out as Dream lays them out (one row of the whole sequence with ``-inf`` off the masks: Dream;
  from the block start to the end, or the block alone under the dual cache: Fast-dLLM), so ties break
  as Dream's do; with ``alg_temp > 0``, ``multinomial(softmax(confidence / alg_temp), k)`` on that
  row, which is ``topk(p / q, k)`` with ``q ~ Exp(1)``.
- ``origin`` (:func:`select_origin`): one float32 uniform per still-masked position, row-major over the
  batch, revealing it below ``1 - t_{j+1}/t_j`` (1 at the last step); then the candidates of the
  revealed positions only.
- **threshold** (``schedule="threshold"``, ``remasking="maskgit_plus"``): Fast-dLLM's Dream
  ``confidence_threshold``: the first of ``topk`` and every candidate whose confidence reaches the
  threshold (compared in the confidence's dtype, as Dream compares).
- **the block's first position** (``block_first="forced"``, :func:`forced_candidates`): Fast-dLLM's
  variant commits it at the block's first step from a full forward, unranked, drawing its candidate
  from a ``Categorical`` over every position of the sequence (the draws of the other positions are
  made and discarded, chunk by chunk, so the generator ends where Dream's does).

Departures, on purpose: the candidate is never ``[M]`` or an id without a tokenizer entry (their
probability is zeroed before the draw, so the draw is Dream's whenever Dream's is a real token; Dream
can draw ``[M]``, which leaves the position masked); ``dream_dtype="float32"`` (the default) runs the
softmaxes on float32 logits, as Dream's code does on a float32 model (``"model"``: the logits' dtype,
as Dream's code runs on a bf16 model). ``Rollout.commit_prob`` stays the noise-free
``softmax(candidate logits)[x̂]`` (no temperature, no filter), the quantity the state likelihood and
credit modules read.
"""
from __future__ import annotations

import torch

DREAM_REMASKING = ("maskgit_plus", "topk_margin", "entropy", "origin")
DREAM_CONFIDENCES = ("maskgit_plus", "topk_margin", "entropy")
DREAM_EPS = 1e-3
EXP_CHUNK = 1 << 24  # elements drawn (Exp(1)) or computed (logits) at a time for a block's first position


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


def dream_probs(raw: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
                dtype: torch.dtype) -> torch.Tensor:
    """Dream's ``probs`` ``[m, V]`` in ``dtype``: ``softmax`` of :func:`dream_logits` of the raw logits
    ``raw [m, V]`` (every output row kept, ``[M]`` included)."""
    return torch.softmax(dream_logits(raw.to(dtype), temperature, top_k, top_p), dim=-1)


def exp_like(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``q ~ Exp(1)`` shaped and typed like ``probs``, drawn from ``generator`` on its own device: the
    numbers torch's ``multinomial(probs, ...)`` draws for one sample, or for samples without replacement."""
    device = generator.device if generator is not None else probs.device
    q = torch.empty(probs.shape, dtype=probs.dtype, device=device).exponential_(generator=generator)
    return q.to(probs.device)


def categorical_probs(probs: torch.Tensor) -> torch.Tensor | None:
    """The normalised probabilities of torch's ``Categorical(probs=probs)`` (Dream's draw), or ``None``
    where it raises (the rows fail torch's simplex check; Dream then takes the greedy candidate)."""
    try:
        return torch.distributions.Categorical(probs=probs).probs
    except ValueError:
        return None


def dream_draw(probs: torch.Tensor, never: torch.Tensor, temperature: float, generator: torch.Generator | None,
               q: torch.Tensor | None = None, accepted: bool = True) -> torch.Tensor:
    """Dream's candidate of each row of ``probs [m, V]`` (:func:`dream_probs`), ``[m]`` long.

    Greedy (``temperature == 0``, or ``Categorical`` rejecting the rows, or ``accepted`` False): the
    most probable id (``probs.max``); sampled: ``argmax(p / q)`` with ``p`` Categorical's normalised
    probabilities and ``q`` :func:`exp_like` (or the given ``q [m, V]``). Ids in ``never [V]`` bool (``[M]``,
    ids without a tokenizer entry) get probability 0 first, so they are never the candidate.
    """
    if temperature > 0 and accepted:
        norm = categorical_probs(probs)
        if norm is not None:
            q = exp_like(norm, generator) if q is None else q
            return (norm.masked_fill(never, 0) / q).argmax(-1)
    return probs.masked_fill(never, 0).max(-1).indices


def dream_confidence(probs: torch.Tensor, cand: torch.Tensor, remasking: str) -> torch.Tensor:
    """Dream's confidence of each position.

    Args:
        probs: ``[..., V]`` Dream's softmax (:func:`dream_probs`).
        cand: ``[...]`` long, the candidate tokens.
        remasking: ``"maskgit_plus"`` (``probs[cand]``), ``"topk_margin"`` (top-1 minus top-2) or
            ``"entropy"`` (``Σ p log(p + 1e-10)``).

    Returns:
        ``[...]`` in ``probs``' dtype.

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
