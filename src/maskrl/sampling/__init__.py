"""The one sampler for rollout and evaluation (SPEC §1.2): LLaDA low-confidence remasking with a
fixed schedule, or Fast-dLLM's confidence threshold, block semi-autoregressive, batched.

:func:`generate` returns a :class:`~maskrl.types.Rollout` that records, for every completion
position, the step that committed it and the noise-free probability of the committed token; credit
modules that need more per-step statistics pass *observers* (:class:`StepObserver`), called once per
step with a :class:`StepView` of what the sampler computed anyway.

Modules, one job each:

- :mod:`~maskrl.sampling.config`: :class:`SamplerConfig`;
- :mod:`~maskrl.sampling.commit`: the commit rule as pure functions (candidate ids, the Gumbel-max
  draw :func:`gumbel_max` / :func:`propose`, ranking, fixed / threshold selection, ``suppress_eos``'s
  :func:`hold_stops`; the block-diffusion families' strategies :func:`select_block`);
- :mod:`~maskrl.sampling.cache`: which positions each step forwards (no cache, Fast-dLLM's prefix /
  dual caches: the one explanation of the caches is there), the forward-count rule, the output layer;
- :mod:`~maskrl.sampling.blockcache`: the exact key/value cache of block-diffusion models
  (``cache: block``; SDAR's), whose blocks are also aligned to the prompt (:class:`Denoising`);
- :mod:`~maskrl.sampling.view`: :class:`StepView`, observers, :class:`StepRecorder`;
- :mod:`~maskrl.sampling.dream`: Dream's own decoding rule (``schedule: dream``; ``remasking``
  ``maskgit_plus`` / ``topk_margin`` / ``entropy`` / ``origin``, ``top_k``, ``top_p``, ``alg_temp``,
  ``dream_dtype``), token for token Dream's code: its softmax, confidences and draws;
- :mod:`~maskrl.sampling.dream_step`: one step of it (positions on Dream's layout, ``origin``,
  Fast-dLLM's Dream block variant's first position, ``block_first: forced``);
- :mod:`~maskrl.sampling.lockstep`: the rank lockstep (:class:`RankLockstep`);
- :mod:`~maskrl.sampling.checks`: what :func:`generate` refuses before it starts;
- :mod:`~maskrl.sampling.sampler`: :func:`generate`, a loop of named stages;
- :mod:`~maskrl.sampling.mismatch`: :func:`rollout_mismatch`.
"""
from maskrl.sampling.blockcache import BlockKVCache
from maskrl.sampling.cache import (Forward, Hidden, KVCache, StepForwards, cached_forward_counts, full_logits, head_at,
                                   plan_forwards, window_hidden)
from maskrl.sampling.commit import (block_candidates, candidate_logits, commit_scores, gumbel_max, hold_stops,
                                    propose, rank_positions, select_block, select_dynamic, select_entropy_bounded,
                                    select_fixed, select_sequential, select_threshold)
from maskrl.sampling.config import (BLOCK_FIRSTS, BLOCK_REMASKING, CACHES, DREAM_DTYPES, OBSERVER_LOGITS, REMASKING,
                                    SCHEDULES, SamplerConfig)
from maskrl.sampling.lockstep import RankLockstep, dummy_forwards
from maskrl.sampling.mismatch import rollout_mismatch
from maskrl.sampling.sampler import Denoising, generate
from maskrl.sampling.view import (LOGIT_SCOPES, StepObserver, StepRecorder, StepRows, StepView, exact_observers,
                                  observer_view, requested_positions)

_propose = propose  # the name this function had before the package (kept for callers not yet moved)

__all__ = [
    "BLOCK_FIRSTS", "BLOCK_REMASKING", "BlockKVCache", "CACHES", "DREAM_DTYPES", "LOGIT_SCOPES", "OBSERVER_LOGITS", "REMASKING", "SCHEDULES",
    "SamplerConfig", "StepObserver", "StepRecorder", "StepRows", "StepView", "Denoising", "RankLockstep",
    "Forward", "Hidden", "KVCache", "StepForwards",
    "generate", "rollout_mismatch", "window_hidden", "cached_forward_counts", "exact_observers", "plan_forwards",
    "head_at", "full_logits", "dummy_forwards", "observer_view", "requested_positions",
    "candidate_logits", "gumbel_max", "propose", "commit_scores", "rank_positions", "select_fixed", "select_threshold",
    "hold_stops", "block_candidates", "select_block", "select_sequential", "select_dynamic", "select_entropy_bounded",
]
