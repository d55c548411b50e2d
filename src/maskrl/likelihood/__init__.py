"""Likelihood estimators (SPEC §1.4): ``(adapter, rollout, generator, **hp) -> ℓ [N, L]``."""
from maskrl.likelihood.mean_field import mask_prompt, mean_field, token_log_probs
from maskrl.likelihood.state import commit_states, state
from maskrl.registry import Registry

LIKELIHOODS: Registry = Registry("likelihood estimator")
LIKELIHOODS.register("mean_field")(mean_field)
LIKELIHOODS.register("state")(state)

__all__ = ["LIKELIHOODS", "commit_states", "mask_prompt", "mean_field", "state", "token_log_probs"]
