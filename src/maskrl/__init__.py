"""maskrl: reinforcement learning for masked diffusion language models.

The pieces (see docs/architecture.md): :mod:`maskrl.sampling` (the one sampler, returns a
:class:`~maskrl.types.Rollout`), :mod:`maskrl.likelihood`, :mod:`maskrl.objectives`,
:mod:`maskrl.tasks`, :mod:`maskrl.trainer`, :mod:`maskrl.models`.
"""
__version__ = "0.1.0"
