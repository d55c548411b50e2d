"""Every seed the RL trainer draws from, one named function each (docs/spec.md §1.4: explicit generators,
never the global RNG).

The integers are part of a run's definition: a checkpoint resumes exactly because each stream is
seeded the same way, and the golden digests (``tests/golden``) pin the values these functions
return. Change one and every recorded run changes. The streams:

- :func:`data_seed`: a process's prompt draws (``RLTrainer.data_gen``), from ``train.seed`` and the
  process index;
- :func:`rollout_seed`: a process's sampler draws (``RLTrainer.rollout_gen``), likewise;
- :func:`likelihood_seed`: the likelihood masks θ, θ_old and θ_ref share, from the seed, step, inner
  iteration, global micro-batch and loss term (:func:`mask_seed`);
- :func:`padding_seed`: the masks of a dummy forward (several processes), a negative micro-batch;
- :func:`credit_seed` and :func:`observer_seed`: a credit module's context and sampler observers,
  from the seed, the module's position, the step and the process;
- :func:`resumed_data_seed` and :func:`resumed_rollout_seed`: the streams of a process that resumes
  from a checkpoint holding none of its own.
"""
from __future__ import annotations

#: every seed is reduced modulo this (the largest positive int64, what ``manual_seed`` accepts)
SEED_MODULUS = 2**63 - 1


def mask_seed(base: int, step: int, iteration: int, micro_batch: int, term: int = 0) -> int:
    """Seed of the likelihood masks of (step, inner iteration, global micro-batch index, loss term).

    The same seed is used for θ, θ_old and θ_ref, so their masks are identical within an inner
    iteration; a new iteration or step gives a new mask (docs/spec.md §1.4). Term 0 (the base objective)
    keeps the seeds of earlier versions.
    """
    return ((base + 7919 * term) * 1_000_003 + step * 10_007 + iteration * 101 + micro_batch) % SEED_MODULUS


def data_seed(seed: int, rank: int) -> int:
    """Seed of process ``rank``'s prompt stream (``torch.randperm`` over the training examples, CPU)."""
    return seed * 7919 + rank


def rollout_seed(seed: int, rank: int) -> int:
    """Seed of process ``rank``'s sampler stream (the Gumbel-max draws; on the training device)."""
    return seed * 104729 + 17 + rank


def likelihood_seed(seed: int, step: int, iteration: int, micro_batch: int, term: int) -> int:
    """Mask seed of global micro-batch ``micro_batch`` of loss term ``term`` in inner iteration
    ``iteration`` of RL step ``step`` (0-based): shared by θ, θ_old and θ_ref (:func:`mask_seed`)."""
    return mask_seed(seed, step, iteration, micro_batch, term)


def padding_seed(seed: int, step: int, iteration: int, forward: int, term: int) -> int:
    """Mask seed of dummy forward ``forward`` (0-based) of loss term ``term`` on a process with fewer
    micro-batches than another (:func:`maskrl.training.lockstep.pad_counts`): micro-batch index
    ``-1 - forward``, one no real micro-batch uses."""
    return mask_seed(seed, step, iteration, -1 - forward, term)


def credit_seed(seed: int, module: int, step: int, rank: int) -> int:
    """Seed of the :class:`~maskrl.credit.base.CreditContext` generator of credit module ``module``
    (its position in ``credit``) at RL step ``step`` on process ``rank``."""
    return mask_seed(seed + 1 + module, step, 0, rank)


def observer_seed(seed: int, module: int, step: int, rank: int) -> int:
    """Seed of the sampler observers' generator of credit module ``module`` at RL step ``step`` on
    process ``rank`` (apart from the sampler's and the context's streams)."""
    return mask_seed(seed + 1 + module, step, 1, rank)


def resumed_data_seed(seed: int, rank: int, step: int) -> int:
    """Prompt stream of process ``rank`` resuming after step ``step`` from a checkpoint that holds no
    stream of its own (one written on fewer processes, resumed with ``force``, or by a maskrl
    version that saved only process 0's): a stream apart from every process's first one."""
    return (data_seed(seed, rank) * 1_000_003 + 1 + step) % SEED_MODULUS


def resumed_rollout_seed(seed: int, rank: int, step: int) -> int:
    """Sampler stream of process ``rank`` resuming after step ``step`` without a saved stream (see
    :func:`resumed_data_seed`)."""
    return (rollout_seed(seed, rank) * 1_000_003 + 1 + step) % SEED_MODULUS
