"""Likelihood estimators (docs/spec.md §1.4), registered by name; see :mod:`maskrl.likelihood.base` for the
protocol ``estimator(adapter, rollout, generator, need) -> ℓ [N, L]`` (or a :class:`PerToken` of
named ``[N, L]`` tensors) and ``estimator.rows(...)``. Each built-in registers itself in
:data:`LIKELIHOODS` in its own file; importing this package imports them."""
from maskrl.likelihood.elbo import ELBO, SPGBounds, bounds, elbo, gauss_legendre_unit, spg_bounds
from maskrl.likelihood.base import (LIKELIHOODS, Likelihood, PerToken, check_pairing, needed, per_token_output,
                                   provides, reads, scatter_scores, score_positions)
from maskrl.likelihood.block_elbo import BlockELBO, block_elbo_masks
from maskrl.likelihood.blocks import block_rounds, doubled_block_mask, score_blocks, score_rows
from maskrl.likelihood.mean_field import MeanField, mask_prompt, mean_field, token_log_probs
from maskrl.likelihood.state import State, commit_states, state
from maskrl.likelihood.stratified import Stratified, strata, stratified

__all__ = ["ELBO", "BlockELBO", "block_elbo_masks", "SPGBounds", "LIKELIHOODS", "Likelihood", "MeanField", "PerToken", "State", "Stratified", "bounds",
           "block_rounds", "doubled_block_mask", "score_blocks", "score_rows", "check_pairing", "commit_states", "elbo",
           "gauss_legendre_unit", "mask_prompt", "mean_field", "needed",
           "per_token_output", "provides", "reads", "scatter_scores", "score_positions", "spg_bounds", "state",
           "strata", "stratified", "token_log_probs"]
