"""Likelihood estimators (SPEC §1.4): ``(adapter, rollout, generator, **hp) -> ℓ [N, L]``."""
from maskrl.likelihood.mean_field import mask_prompt, mean_field, token_log_probs
from maskrl.registry import Registry

LIKELIHOODS: Registry = Registry("likelihood estimator")
LIKELIHOODS.register("mean_field")(mean_field)

__all__ = ["LIKELIHOODS", "mask_prompt", "mean_field", "token_log_probs"]
