"""Likelihood estimators (SPEC §1.4), registered by name; see :mod:`maskrl.likelihood.base` for the
protocol ``estimator(adapter, rollout, generator, need) -> ℓ [N, L]`` and ``estimator.rows(...)``."""
from maskrl.likelihood.base import Likelihood, needed, scatter_scores, score_positions
from maskrl.likelihood.mean_field import MeanField, mask_prompt, mean_field, token_log_probs
from maskrl.likelihood.state import State, commit_states, state
from maskrl.registry import Registry

LIKELIHOODS: Registry = Registry("likelihood")
LIKELIHOODS.register("mean_field")(MeanField)
LIKELIHOODS.register("state")(State)

__all__ = ["LIKELIHOODS", "Likelihood", "MeanField", "State", "commit_states", "mask_prompt", "mean_field", "needed",
           "scatter_scores", "score_positions", "state", "token_log_probs"]
