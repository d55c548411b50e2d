"""A user's plug-in, outside ``src/``: one toy likelihood, objective and credit module, registered by
name. ``tests/test_plugins.py`` loads it with ``plugins: [this file]`` and runs a trainer step."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from maskrl.credit import CREDITS, CreditModule
from maskrl.likelihood import LIKELIHOODS, MeanField
from maskrl.objectives import OBJECTIVES, DiffuGRPO
from maskrl.types import LossOutput, LossTerm

CALLS: dict[str, int] = {"likelihood": 0, "objective": 0, "credit": 0, "observer": 0}
SEEN: dict[str, torch.Tensor] = {}


@LIKELIHOODS.register("toy_lik")
@dataclass(frozen=True)
class ToyLikelihood(MeanField):
    """Mean-field, counted.

    Attributes:
        p_mask_prompt: as mean_field.
    """

    def __call__(self, adapter, rollout, generator, need=None):
        CALLS["likelihood"] += 1
        return super().__call__(adapter, rollout, generator, need)


@OBJECTIVES.register("toy_obj")
@dataclass(frozen=True)
class ToyObjective(DiffuGRPO):
    """diffu-GRPO with its own defaults (ε 0.3, β 0), counted; its default likelihood is ``toy_lik``.

    Attributes:
        clip_eps: ε.
        beta: β.
        aggregation: token-loss reduction.
        normalize: advantage normalisation.
    """

    default_likelihood = "toy_lik"
    clip_eps: float = 0.3
    beta: float = 0.0

    def __call__(self, logp, logp_old, logp_ref, advantages, mask, normalizer=None) -> LossOutput:
        CALLS["objective"] += 1
        SEEN.setdefault("advantages", advantages.detach().clone())
        return super().__call__(logp, logp_old, logp_ref, advantages, mask, normalizer)


class CountSteps:
    """Observer: number of denoising steps each row took (``[N]``)."""

    def __init__(self):
        self.steps = {}

    def on_step(self, view):
        CALLS["observer"] += 1
        for r in view.rows.tolist():
            self.steps[r] = self.steps.get(r, 0) + 1

    def result(self):
        n = max(self.steps) + 1
        return {"toy_steps": torch.tensor([self.steps[i] for i in range(n)])}


@CREDITS.register("toy_credit")
@dataclass(frozen=True)
class ToyCredit(CreditModule):
    """Scales token i's advantage by ``1 + scale·i/L`` and adds a second loss term on the same rows.

    Attributes:
        scale: slope of the position weight.
        extra_weight: weight of the added term (0 = no term).
    """

    scale: float = 1.0
    extra_weight: float = 0.0

    def observers(self, sampler, generator):
        return [CountSteps()]

    def __call__(self, batch, ctx):
        CALLS["credit"] += 1
        ro = batch.rollout
        assert torch.equal(ro.step_stats["toy_steps"], ro.num_steps.cpu())
        L = ro.gen_length
        w = 1 + self.scale * torch.arange(L, device=ro.completion_ids.device) / L  # [L]
        SEEN["before"] = batch.advantages.clone()
        SEEN["rescored"] = ctx.score(torch.arange(ro.batch_size), ro.completion_ids)
        adv = batch.advantages * w
        terms = batch.terms
        if self.extra_weight:
            terms += (LossTerm(name="extra", weight=self.extra_weight, rollout=ro, advantages=adv,
                               mask=ro.completion_mask, objective=DiffuGRPO(beta=0.0), likelihood=MeanField()),)
        return dataclasses.replace(batch, advantages=adv, terms=terms, metrics={"weight_mean": w.mean().item()})
