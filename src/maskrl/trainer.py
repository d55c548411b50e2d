"""The RL loop (docs/architecture.md): the only stateful object. ``step()`` reads as the stages

    prompts -> sampler -> Rollout -> rewards -> advantages -> likelihoods (seeded masks) -> objective -> update

It runs on ``accelerate`` (CPU, one GPU, or many processes): gradient accumulation over micro-batches,
gradient clipping, AdamW with a learning-rate schedule (``transformers.get_scheduler``), checkpoints
(weights as safetensors, optimizer, scheduler, RNG states, step) with resume, metrics to JSONL and
TensorBoard, and a progress bar. Its parts apart from the step live in :mod:`maskrl.training` (seeds,
the micro-batch plan, multi-process lockstep, checkpoints and signals, the metrics log); their public
names are re-exported here.

Departures from d1's trainer, on purpose: θ_old log-probs for all μ inner iterations are computed
before the first update (so every iteration's ratio is against the rollout policy, as in PPO);
with μ = 1 the ratio is exactly 1 and θ_old's forward is skipped.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import get_scheduler

from maskrl.config import RunConfig
from maskrl.credit import CREDITS, CreditBatch, CreditContext, apply_credit
from maskrl.health import NonFiniteError, NonFiniteLogits, check_rewards, collapse_message, nonfinite_rows
from maskrl.likelihood.base import PerToken, per_token_output, tensors_of
from maskrl.likelihood.blocks import model_refusal
from maskrl.models.adapter import ModelAdapter
from maskrl.models.merged import sampling_policy
from maskrl.models.scale import rl_train_mode
from maskrl.sampling import generate
from maskrl.tasks.base import Example, Task
from maskrl.text import decode_completions, encode_prompts
from maskrl.training import checkpoint as _ckpt
from maskrl.training.batch_metrics import (batch_counts, batch_metrics, credit_metrics_over_processes,
                                          mismatch_metrics, reward_metrics, sum_over_processes)
from maskrl.training.checkpoint import (TRAINER_STATE, ProcessCountError, TrainingInterrupted, latest_checkpoint,
                                        read_checkpoint_state)
from maskrl.training.lockstep import (all_ranks_done, any_process, mean_over_processes, pad_counts, padding_row,
                                      ranks_max)
from maskrl.training.metrics_log import MetricsLog, check_trackers, hyperparameters, tracker_kwargs
from maskrl.training.micro_batches import (Forward, MicroBatch, Padding, TermPlan, plan_padding, plan_terms,
                                           split_rows, theta_forwards)
from maskrl.training.seeds import (credit_seed, data_seed, likelihood_seed, mask_seed, observer_seed, padding_seed,
                                   rollout_seed)
from maskrl.types import LossOutput, LossTerm, Rollout

__all__ = ["RLTrainer", "Batch", "TrainingInterrupted", "ProcessCountError", "TRAINER_STATE", "latest_checkpoint",
           "read_checkpoint_state", "all_ranks_done", "ranks_max", "pad_counts", "padding_row", "split_rows",
           "mask_seed", "tracker_kwargs", "check_trackers", "hyperparameters", "TermPlan", "MicroBatch", "Padding",
           "Forward"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch(CreditBatch):
    """One collected RL batch (rows of this process): the :class:`~maskrl.credit.base.CreditBatch` the
    credit modules returned (``rollout`` ``N`` rows, ``rewards`` ``[N]``, ``advantages`` ``[N, L]``
    float32, ``base_weight``, ``terms``, ``metrics`` as ``<module>/<key>``), plus what the trainer adds.

    Attributes:
        loss_mask: ``[N, L]`` bool, tokens the base term trains on (``completion_mask`` unless a credit
            module narrowed it); ``None`` = ``completion_mask``.
        completions: decoded texts, ``N`` (keyword only).
        task_rewards: ``[N]`` float32, the task's own rewards; ``rewards`` are the training rewards
            (``train.reward``); ``None``: equal to ``rewards`` (keyword only).
    """

    loss_mask: torch.Tensor | None = None
    completions: list[str] = dataclasses.field(kw_only=True)
    task_rewards: torch.Tensor | None = dataclasses.field(default=None, kw_only=True)


class RLTrainer:
    """RL fine-tuning of a masked diffusion LM on a task (docs/spec.md §1.3–§1.5).

    Args:
        cfg: the run configuration (``train``, ``objective``, ``rollout`` sections are used).
        policy: the model to train.
        task: reward source.
        train_examples: prompts to sample from.
        reference: frozen reference policy for the KL term; default: a frozen copy of ``policy``
            taken now (or, for peft models, the adapter-disabled base -- no copy).
        accelerator: defaults to ``Accelerator(cpu=not cuda)``.
        prompt_fn: turns an example's prompt text into model input (e.g. a chat template).
        eval_fn: ``step -> metrics`` called every ``train.eval_every`` steps (main process).
    """

    def __init__(self, cfg: RunConfig, policy: ModelAdapter, task: Task, train_examples: Sequence[Example],
                 reference: ModelAdapter | None = None, accelerator: Accelerator | None = None,
                 prompt_fn: Callable[[str], str] = lambda s: s,
                 eval_fn: Callable[[int], dict] | None = None) -> None:
        if not train_examples:
            raise ValueError("RLTrainer: no training examples")
        check_sandbox = getattr(task, "check_sandbox", None)  # code rewards: refuse a weak sandbox
        if check_sandbox is not None:
            check_sandbox(allow_weak=cfg.task.allow_weak_sandbox)
        self.cfg, self.tc = cfg, cfg.train
        self.task, self.examples, self.prompt_fn, self.eval_fn = task, list(train_examples), prompt_fn, eval_fn
        self.objective, self.likelihood = cfg.objective, cfg.likelihood  # registered instances (config-built)
        if why := model_refusal(self.likelihood, policy.block_size is not None):
            kind = f"block-diffusion model, block_size {policy.block_size}" if policy.block_size else "full-attention model"
            raise ValueError(f"likelihood ({kind}): {why}")
        names = [CREDITS.name_of(c) for c in cfg.credit]
        self.credits = [(n if names.count(n) == 1 else f"{n}.{i}", c) for i, (n, c) in enumerate(zip(names, cfg.credit))]
        needs_reference = self.objective.needs_reference or any(c.needs_reference for _, c in self.credits)
        self.sampler = cfg.rollout
        self.acc = accelerator or Accelerator(cpu=not torch.cuda.is_available(), **tracker_kwargs(cfg))
        check_trackers(cfg, self.acc)
        self.device = self.acc.device
        policy.model.to(self.device)
        self.uses_peft = hasattr(policy.model, "disable_adapter")
        if needs_reference and reference is None and not self.uses_peft:
            ref_model = copy.deepcopy(policy.model).eval()
            for p in ref_model.parameters():
                p.requires_grad_(False)
            reference = dataclasses.replace(policy, model=ref_model)
        self.reference = reference
        params = [p for p in policy.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.tc.lr, weight_decay=self.tc.weight_decay)
        # one scheduler step per optimizer step: μ per RL step
        sched = get_scheduler(self.tc.lr_scheduler, opt, num_warmup_steps=self.tc.warmup_steps * self.tc.inner_iterations,
                              num_training_steps=max(1, self.tc.steps * self.tc.inner_iterations))
        # The schedule is not handed to ``prepare``: accelerate's scheduler wrapper steps it once per
        # process at each call (its batches grow with the process count), while maskrl's schedule counts
        # optimizer steps, which every process takes together; unwrapped, N processes follow the
        # 1-process curve whatever accelerator is passed in. The checkpoint saves it itself.
        model, self.optimizer = self.acc.prepare(policy.model, opt)
        self.scheduler = sched
        self.policy = dataclasses.replace(policy, model=model)  # wrapped (DDP) for training
        self.policy_eval = dataclasses.replace(policy, model=self.acc.unwrap_model(model))
        self.step_count = 0
        rank = self.acc.process_index
        self.data_gen = torch.Generator().manual_seed(data_seed(self.tc.seed, rank))
        self.rollout_gen = torch.Generator(device=self.device).manual_seed(rollout_seed(self.tc.seed, rank))
        self.all_done = all_ranks_done(self.acc)  # keeps ranks' sampler forwards in step (FSDP / ZeRO-3)
        self.ranks_max = ranks_max(self.acc)  # the same for the cached sampler
        self.out_dir = Path(cfg.output_dir)
        self._metrics_log = MetricsLog(self.acc)  # metrics.jsonl and trackers (main process)
        self.nonfinite_skips = 0  # steps skipped under train.on_nonfinite: skip (maskrl.health)
        self._skip_reason: str | None = None
        self._collapse_warned = False
        self._mismatch_warned = False
        self._stop_signal: int | None = None  # SIGINT / SIGTERM received during train()

    # ------------------------------------------------------------------ stages
    def sample_prompts(self) -> list[Example]:
        """B examples for this step (without replacement within the step), from ``data_gen``."""
        b = min(self.tc.prompts_per_step, len(self.examples))
        idx = torch.randperm(len(self.examples), generator=self.data_gen)[:b].tolist()
        return [self.examples[i] for i in idx]

    @torch.no_grad()
    def collect(self, examples: Sequence[Example] | None = None) -> Batch:
        """Rollout G completions per prompt, score them, compute advantages and fold them through the
        credit modules (docs/architecture.md data flow). With LoRA and ``rollout.merge_lora`` the rollout
        samples from a merged copy (:func:`~maskrl.models.merged.sampling_policy`), freed before the
        rewards; the policy's own weights are not written."""
        examples = list(examples) if examples is not None else self.sample_prompts()
        g = self.tc.group_size
        rows = [ex for ex in examples for _ in range(g)]
        group_ids = torch.arange(len(examples)).repeat_interleave(g)
        ids, mask = encode_prompts(self.policy.tokenizer, [self.prompt_fn(ex.prompt) for ex in rows])
        self.policy_eval.model.eval()
        guard = NonFiniteLogits(self.policy.mask_id, self.policy.token_count)
        observers = [guard] + [o for i, (_, c) in enumerate(self.credits) for o in c.observers(self.sampler, self._observer_generator(i))]
        with sampling_policy(self.policy_eval, self.sampler.merge_lora) as sampler_policy:  # LoRA merged in a copy
            rollout = generate(sampler_policy, ids, mask, self.sampler, generator=self.rollout_gen, group_ids=group_ids,
                               all_done=self.all_done, ranks_max=self.ranks_max, observers=observers)
        if guard.step is not None:
            self._nonfinite("logits", guard.rows, f" (sampler step {guard.step})")
        self._check("commit_prob", rollout.commit_prob)
        completions = decode_completions(self.policy.tokenizer, rollout.completion_ids, rollout.completion_mask)
        scores = check_rewards(self.task.score_examples(rows, completions), self.task.name, [ex.id for ex in rows],
                               completions)
        task_rewards = torch.tensor(scores, dtype=torch.float32, device=self.device)
        rewards = self._training_reward(task_rewards)
        adv = self.objective.advantages(rewards, rollout.group_ids)  # [N]
        valid = rollout.completion_mask
        cb = CreditBatch(rollout=rollout, rewards=rewards, advantages=adv[:, None] * valid.float(),  # [N, L]
                         loss_mask=valid.clone())
        if self.credits:
            contexts = [self._credit_context(rows, rewards, rollout.group_ids, adv, i) for i in range(len(self.credits))]
            cb = apply_credit(self.credits, cb, contexts)
        self._check("advantages", cb.advantages)
        return Batch(rollout=rollout, rewards=rewards, advantages=cb.advantages, completions=completions,
                     loss_mask=cb.loss_mask, base_weight=cb.base_weight, terms=cb.terms, metrics=dict(cb.metrics),
                     task_rewards=task_rewards)

    # ------------------------------------------------------------------ health (maskrl.health)
    def _nonfinite(self, stage: str, rows: list[int], detail: str = "") -> None:
        """A non-finite ``stage`` in ``rows``: raise (``train.on_nonfinite: error``) or remember it so that
        this step makes no update (``skip``)."""
        err = NonFiniteError(stage, self.step_count + 1, rows, detail)
        if self.tc.on_nonfinite == "error":
            raise err
        if self._skip_reason is None:
            self._skip_reason = str(err)

    def _check(self, stage: str, x: torch.Tensor | PerToken, detail: str = "") -> bool:
        """True when ``x`` (a tensor, or each tensor of a :class:`PerToken`) is all finite; else
        :meth:`_nonfinite` and False."""
        if isinstance(x, PerToken):
            return all([self._check(f"{stage} {name}", t, detail) for name, t in x.items()])
        rows = nonfinite_rows(x)
        if rows:
            self._nonfinite(stage, rows if x.dim() else [], detail)
        return not rows

    def _any_rank(self, flag: bool) -> bool:
        """``flag`` or-ed over processes, so that every rank skips the same updates (a collective only
        under ``on_nonfinite: skip``; under ``error`` a bad value has raised already)."""
        if self.tc.on_nonfinite != "skip":
            return flag
        return any_process(self.acc, flag)

    def _observer_generator(self, index: int) -> torch.Generator:
        """CPU generator of credit module ``index``'s observers for this step's rollout
        (:func:`~maskrl.training.seeds.observer_seed`)."""
        return torch.Generator().manual_seed(observer_seed(self.tc.seed, index, self.step_count, self.acc.process_index))

    def _training_reward(self, task_rewards: torch.Tensor) -> torch.Tensor:
        """``[N]`` float32 rewards the advantages are computed from (``train.reward``): the task's own
        (``task``) or its correctness indicator (``correct``: 1.0 where ``task.is_correct``, else 0.0)."""
        if self.tc.reward == "correct":
            return self.task.is_correct(task_rewards).to(task_rewards.dtype)
        return task_rewards

    def _credit_context(self, rows: list[Example], rewards: torch.Tensor, group_ids: torch.Tensor, adv: torch.Tensor,
                        index: int) -> CreditContext:
        """The narrow context of credit module ``index`` for this step's batch (examples ``rows``)."""
        adapter = self.policy_eval

        def score(idx: torch.Tensor, completion_ids: torch.Tensor) -> torch.Tensor:
            texts = decode_completions(adapter.tokenizer, completion_ids, adapter.completion_mask(completion_ids))
            picked = [rows[i] for i in torch.as_tensor(idx).tolist()]
            return self._training_reward(torch.tensor(self.task.score_examples(picked, texts), dtype=torch.float32,
                                                      device=self.device))

        def reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
            if op not in ("sum", "mean"):
                raise ValueError(f"reduce op {op!r} is not 'sum' or 'mean'")
            return t if self.acc.num_processes == 1 else self.acc.reduce(t.clone(), reduction=op)

        gen = torch.Generator().manual_seed(credit_seed(self.tc.seed, index, self.step_count, self.acc.process_index))
        return CreditContext(rewards=rewards, group_ids=group_ids, sequence_advantages=adv, score=score, reduce=reduce,
                             generator=gen, policy=adapter, objective=self.objective, likelihood=self.likelihood,
                             step=self.step_count, num_processes=self.acc.num_processes)

    def loss_terms(self, batch: Batch) -> list[LossTerm]:
        """The weighted terms ``optimize`` sums: the base objective on the batch, then the credit
        modules' terms (docs/architecture.md, "Loss terms")."""
        ro = batch.rollout
        mask = ro.completion_mask if batch.loss_mask is None else batch.loss_mask & ro.completion_mask
        base = LossTerm(name="base", weight=batch.base_weight, rollout=ro, advantages=batch.advantages, mask=mask,
                        objective=self.objective, likelihood=self.likelihood)
        return [base, *batch.terms]

    # ------------------------------------------------------------------ optimize
    def optimize(self, batch: Batch) -> dict:
        """μ inner iterations over the loss terms of one batch; one optimizer step per iteration.

        Each term is split into micro-batches under ``train.micro_batch_size`` sequences and
        ``train.max_forward_rows`` forward rows (its likelihood's ``rows()``); gradients accumulate
        over all of them. Each term's normaliser is its token (or sequence) count over the whole
        global batch, so the update equals a single-process, single-micro-batch one. Metrics follow
        one rule: objectives report shares (:mod:`maskrl.objectives.base`), summed over micro-batches,
        averaged over iterations and processes, and namespaced ``<term>/<key>``.

        **Several processes: the same number of forwards everywhere.** A term's rows can differ
        between processes (DiSPO keeps a different number of branched states on each; a process that
        kept none has a 0-row term), and so can its count of micro-batches. Under FSDP / ZeRO-3 every
        forward is a collective, so for each term every process runs ``max`` over processes of that
        count (:func:`pad_counts`, one all-gather per step), in the θ_old, reference and θ passes
        alike; a process with fewer runs *dummy forwards* after the term's real micro-batches. A dummy
        forward calls the term's likelihood on one row (:func:`padding_row`: the term's first row,
        or the batch's first row when the term has none here) under a mask seed of its own, and its
        θ pass back-propagates ``0 · Σ ℓ``: every parameter takes part as in a real forward (and gets
        a zero gradient), while the gradients, the update and the metrics are those without padding
        (dummy forwards report no metrics; ``pad_forwards`` counts them, averaged over processes).
        The DDP gradient sync, on the last θ micro-batch, therefore falls on the same position on
        every process. The guarantee is on likelihood calls: each built-in estimator runs one model
        forward per call with a needed position, whatever its masks draw (a draw of ``elbo`` /
        ``spg_bounds`` that scores none of them still runs one, contributing 0;
        :mod:`maskrl.likelihood.base`, "Forwards"). On one process nothing changes.

        The stages: the micro-batch plan and (several processes) the padding plan
        (:mod:`maskrl.training.micro_batches`), the frozen θ_old / reference log-probs of every
        iteration, then per iteration the accumulated θ backwards and the update.
        """
        mu = self.tc.inner_iterations
        terms = self.loss_terms(batch)
        plans = plan_terms(self.acc, terms, self.tc.micro_batch_size, self.tc.max_forward_rows)
        plans = plan_padding(self.acc, plans, terms[0].rollout, pad_counts)  # this module's pad_counts
        old, ref, n_pad = self._frozen_log_probs(plans, mu)
        rl_train_mode(self.policy.model, dropout=self.tc.dropout)
        forwards = theta_forwards(plans)
        sums: dict[str, float] = {}
        for k in range(mu):
            if k == 0 and self._any_rank(self._skip_reason is not None):  # θ_old / reference (on_nonfinite: skip)
                self._skip_update(k, mu)
                break
            self.optimizer.zero_grad(set_to_none=True)
            n_pad += self._accumulate(forwards, k, old, ref, sums)
            if not self._update(k, mu, sums):
                break
        self.policy.model.eval()
        if self.acc.num_processes > 1:
            sums["pad_forwards"] = float(n_pad)
        return mean_over_processes(self.acc, sums)  # each metric averaged over the processes

    @torch.no_grad()
    def _frozen_log_probs(self, plans: list[TermPlan], mu: int) -> tuple[dict, dict, int]:
        """θ_old (``μ > 1`` and a ratio objective) and reference log-probs of every real micro-batch of
        every inner iteration, before the first update; a term's dummy forwards run and are discarded.

        Returns:
            ``(old, ref, dummies)``: log-probs keyed ``(term index, iteration, micro-batch index)``, and
            the dummy forwards run.
        """
        old, ref, n_pad = {}, {}, 0
        self.policy_eval.model.eval()
        for k in range(mu):
            for p in plans:
                t = p.term
                wants_old, wants_ref = mu > 1 and t.objective.uses_ratio, t.objective.needs_reference
                for mb in p.micro_batches:
                    sub, need, key = t.rollout.select(mb.rows), t.mask[mb.rows], (p.index, k, mb.index)
                    seed = likelihood_seed(self.tc.seed, self.step_count, k, mb.index, p.index)
                    where = f" (term {t.name}, micro-batch {mb.index})"
                    if wants_old:
                        old[key] = self._loglik(t, self.policy_eval, sub, seed, need)
                        self._check("log-probs (θ_old)", old[key], where)
                    if wants_ref:
                        ref[key] = self._ref_loglik(t, sub, seed, need)
                        self._check("log-probs (reference)", ref[key], where)
                for j in range(p.padding.count if p.padding else 0):  # several processes: run, discard
                    seed = padding_seed(self.tc.seed, self.step_count, k, j, p.index)
                    if wants_old:
                        self._loglik(t, self.policy_eval, p.padding.rollout, seed, p.padding.need)
                        n_pad += 1
                    if wants_ref:
                        self._ref_loglik(t, p.padding.rollout, seed, p.padding.need)
                        n_pad += 1
        return old, ref, n_pad

    def _accumulate(self, forwards: list[Forward], k: int, old: dict, ref: dict, sums: dict[str, float]) -> int:
        """Inner iteration ``k``'s θ forwards and backwards in order, gradients accumulating; the DDP
        gradient sync on the last one only (``no_sync`` before). Adds each objective metric ``/ μ`` to
        ``sums`` as ``<term>/<key>``. Returns the dummy forwards run."""
        mu, n_pad = self.tc.inner_iterations, 0
        for w, f in enumerate(forwards):
            sync = w == len(forwards) - 1
            with self.acc.no_sync(self.policy.model) if not sync else contextlib.nullcontext():
                if f.rows is None:  # dummy forward: every parameter takes part, zero gradient, no metrics
                    pad = f.plan.padding
                    seed = padding_seed(self.tc.seed, self.step_count, k, f.index, f.plan.index)
                    logp = self._loglik(f.plan.term, self.policy, pad.rollout, seed, pad.need)
                    self.acc.backward(0.0 * sum(v.sum() for v in tensors_of(logp).values()))
                    n_pad += 1
                    continue
                out = self._theta_backward(f, k, old, ref)
            for name, v in out.metrics.items():
                key = f"{f.plan.term.name}/{name}"
                sums[key] = sums.get(key, 0.0) + v / mu
        return n_pad

    def _theta_backward(self, f: Forward, k: int, old: dict, ref: dict) -> LossOutput:
        """θ's log-probs of real micro-batch ``f`` in inner iteration ``k``, its term's objective against
        the frozen θ_old / reference ones, and the backward of ``weight · loss``; returns the output."""
        t, key = f.plan.term, (f.plan.index, k, f.index)
        sub, need = t.rollout.select(f.rows), t.mask[f.rows]
        where = f" (term {t.name}, micro-batch {f.index}, inner iteration {k})"
        seed = likelihood_seed(self.tc.seed, self.step_count, k, f.index, f.plan.index)
        logp = self._loglik(t, self.policy, sub, seed, need)
        self._check("log-probs (θ)", logp, where)
        logp_old = old.get(key, logp.detach())
        out = t.objective(logp, logp_old, ref.get(key), t.advantages[f.rows], need, normalizer=f.plan.normalizer)
        if out.loss.dim() != 0:
            raise ValueError(f"loss term {t.name!r}: objective {type(t.objective).__name__} returned a "
                             f"loss of shape {tuple(out.loss.shape)}; expected a scalar")
        self._check("loss", out.loss.detach(), where)
        self.acc.backward(t.weight * out.loss)
        return out

    def _update(self, k: int, mu: int, sums: dict[str, float]) -> bool:
        """Clip the accumulated gradients and step the optimizer and the schedule; False (and the rest of
        the step's update dropped) when a non-finite value was met on any process."""
        # max_norm inf: the norm without clipping, for the finiteness check
        gn = self.acc.clip_grad_norm_(self.policy.model.parameters(), self.tc.max_grad_norm or float("inf"))
        if self.tc.max_grad_norm > 0 and gn is not None:
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(gn) / mu
        if gn is not None:  # (accelerate's DeepSpeed path clips inside the engine and returns None)
            self._check("grad norm", torch.as_tensor(gn), f" (inner iteration {k})")
        if self._any_rank(self._skip_reason is not None):
            self._skip_update(k, mu)
            return False
        self.optimizer.step()
        self.scheduler.step()
        return True

    def _skip_update(self, k: int, mu: int) -> None:
        """Drop this step's update from inner iteration ``k`` on (``on_nonfinite: skip``); the schedule
        still advances by the remaining iterations, so it stays tied to the step count."""
        self.optimizer.zero_grad(set_to_none=True)
        for _ in range(k, mu):
            self.scheduler.step()

    def _loglik(self, term: LossTerm, adapter: ModelAdapter, rollout: Rollout, seed: int,
                need: torch.Tensor) -> torch.Tensor | PerToken:
        """The term's likelihood on ``rollout`` under mask seed ``seed``, checked at the seam and cut to
        what the term's objective reads (:func:`maskrl.likelihood.base.per_token_output`)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        out = term.likelihood(adapter, rollout, gen, need)
        who = f"loss term {term.name!r}: likelihood {type(term.likelihood).__name__}"
        return per_token_output(out, need, term.objective, who)

    def _ref_loglik(self, term: LossTerm, rollout: Rollout, seed: int, need: torch.Tensor) -> torch.Tensor:
        if self.reference is not None:
            return self._loglik(term, self.reference, rollout, seed, need)
        with self.policy_eval.reference() as ref:
            return self._loglik(term, ref, rollout, seed, need)

    # ------------------------------------------------------------------ step
    def step(self) -> dict:
        """One RL step: collect a batch, optimise on it, return the step's metrics."""
        t0 = time.time()
        lr = self.optimizer.param_groups[0]["lr"]  # the rate of this step's first optimizer step
        self._skip_reason = None
        batch = self.collect()
        t1 = time.time()
        due = self.sampler.mismatch_every and self.step_count % self.sampler.mismatch_every == 0
        mismatch = self._rollout_mismatch(batch) if due else {}  # before the update, against the sampling θ
        if self._any_rank(self._skip_reason is not None):  # train.on_nonfinite: skip, at the rollout
            self._skip_update(0, self.tc.inner_iterations)
            metrics = {}
        else:
            metrics = self.optimize(batch)
        if self._any_rank(self._skip_reason is not None):
            self.nonfinite_skips += 1
            log.warning("step skipped (train.on_nonfinite: skip): %s", self._skip_reason or "on another process")
        # credit modules report this process's values: combined into the whole batch's (maskrl.credit.base)
        metrics.update(credit_metrics_over_processes(self.acc, {f"credit/{k}": v for k, v in batch.metrics.items()}))
        metrics.update(mismatch)
        return self._finish_step(batch, metrics, lr, t0, t1)

    def _rollout_mismatch(self, batch: Batch) -> dict[str, float]:
        """``{"rollout/mismatch": ...}`` of the whole batch (:func:`maskrl.training.batch_metrics.mismatch_metrics`)."""
        out = mismatch_metrics(self.acc, self.policy_eval, batch, warn=not self._mismatch_warned)
        self._mismatch_warned = self._mismatch_warned or not out
        return out

    def _finish_step(self, batch: Batch, metrics: dict, lr: float, t0: float, t1: float) -> dict:
        """Count the step and add its reward, health and timing metrics to ``metrics`` (in this order),
        each of the whole global batch (rewards gathered, the others' sums added over the processes,
        :mod:`maskrl.training.batch_metrics`); warn once when the rollouts collapse."""
        rewards = self.acc.gather(batch.rewards)
        task_rewards = rewards if batch.task_rewards is None else self.acc.gather(batch.task_rewards)
        self.step_count += 1
        diag, groups = batch_metrics(sum_over_processes(self.acc, batch_counts(batch.rewards, batch.rollout)))
        metrics.update(diag)
        metrics["nonfinite_skips"] = self.nonfinite_skips
        warning = collapse_message(diag, self.step_count)
        if warning and not self._collapse_warned and self.acc.is_main_process:  # the whole batch's: said once
            log.warning(warning)
        self._collapse_warned = warning is not None
        metrics["step"] = self.step_count  # the keys in the order metrics.jsonl has always had
        metrics.update(reward_metrics(rewards, task_rewards, self.task.is_correct(task_rewards)))
        metrics.update(groups, rollout_seconds=t1 - t0, seconds=time.time() - t0, lr=lr)
        return metrics

    # ------------------------------------------------------------------ loop
    def train(self, steps: int | None = None, progress: bool = True, catch_signals: bool = True) -> list[dict]:
        """Run ``steps`` RL steps (default ``train.steps`` minus steps already done); log, eval, save.

        With ``catch_signals`` (and in the main thread), a SIGINT (Ctrl-C) or SIGTERM lets the current
        step finish, saves a checkpoint at that step boundary (``<output_dir>/checkpoints/step_K``) and
        raises :class:`TrainingInterrupted`; resuming from it continues exactly like an uninterrupted
        run. A second signal during that step stops at once (the default behaviour, no checkpoint).

        Raises:
            TrainingInterrupted: after a signal, once the checkpoint is written.
            ConfigError: ``train.eval_every > 0`` but no ``eval_fn`` was given (the key could not take effect).
        """
        if self.tc.eval_every and self.eval_fn is None:
            from maskrl.config import ConfigError

            raise ConfigError(f"train.eval_every={self.tc.eval_every} but this trainer has no evaluation function "
                              "(eval_fn); pass one (maskrl train builds it from the validation split) or set "
                              "train.eval_every: 0")
        total = self.tc.steps if steps is None else self.step_count + steps
        history = []
        bar = tqdm(total=total, initial=self.step_count, desc="rl", dynamic_ncols=True,
                   disable=not (progress and self.acc.is_main_process))
        self._stop_signal = None
        with _ckpt.stop_at_step_end(catch_signals, self._on_signal):
            while self.step_count < total:
                m = self.step()
                if self.eval_fn is not None and self.tc.eval_every and self.step_count % self.tc.eval_every == 0:
                    m.update({f"eval/{k}": v for k, v in self.eval_fn(self.step_count).items()})
                history.append(m)
                if self.step_count % max(1, self.tc.log_every) == 0:
                    self.log(m)
                bar.update(1)
                bar.set_postfix(reward=f"{m['reward']:.3f}", kl=f"{m.get('base/kl', 0.0):.4f}", nll=f"{m['commit_nll']:.3f}",
                                distinct=f"{m['distinct_frac']:.2f}", s_per_step=f"{m['seconds']:.2f}")
                ckpt = self.out_dir / "checkpoints" / f"step_{self.step_count}"
                saved = bool(self.tc.save_every and self.step_count % self.tc.save_every == 0)
                if saved:
                    self.save_checkpoint(ckpt)
                signum = self._signal_on_any_rank()
                if signum:
                    if not saved:
                        self.save_checkpoint(ckpt)
                    bar.close()
                    raise TrainingInterrupted(self.step_count, ckpt, signum)
        bar.close()
        return history

    def _on_signal(self, signum: int) -> None:
        """The first SIGINT / SIGTERM during :meth:`train`: remember it; the loop stops after this step."""
        self._stop_signal = signum
        print(f"\nmaskrl: {signal.Signals(signum).name}: finishing step {self.step_count + 1}, then saving a "
              f"checkpoint (send it again to stop at once, without one)", file=sys.stderr, flush=True)

    def _signal_on_any_rank(self) -> int:
        """The signal number received on any process since :meth:`train` began (0: none); a collective
        on several processes, so that every rank stops after the same step."""
        signum = self._stop_signal or 0
        return self.ranks_max([signum])[0] if self.ranks_max is not None else signum

    def log(self, metrics: dict) -> None:
        """Append to ``<out_dir>/metrics.jsonl`` and send the numeric metrics to the ``train.report_to``
        trackers through accelerate (``init_trackers`` with the resolved config as hyper-parameters at
        the first call, then ``Accelerator.log``); main process only. After :meth:`load_checkpoint` at
        step K, the first call drops the rows of ``metrics.jsonl`` after step K and opens TensorBoard
        with ``purge_step=K + 1``, so a resumed run's logs hold each step once
        (:class:`~maskrl.training.metrics_log.MetricsLog`)."""
        self._metrics_log.write(metrics, self.out_dir, self.cfg, self.tc.tracker_project)

    def close(self) -> None:
        """Close ``metrics.jsonl`` and finish the trackers (each tracker's ``finish()``, what
        ``Accelerator.end_training`` does first; the process group is the launcher's and is left alone)."""
        self._metrics_log.close()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str | Path) -> Path:
        """Weights (safetensors), optimizer, scheduler, RNG states (accelerate) and the trainer's own
        state (step, every process's data/rollout generators, process count, config) into ``path``
        (:mod:`maskrl.training.checkpoint`). Only the main process writes the trainer state; every
        process must call it."""
        return _ckpt.save_checkpoint(self.acc, path, self.step_count, self.cfg, self.data_gen, self.rollout_gen,
                                     self.policy_eval.model, self.scheduler)

    def load_checkpoint(self, path: str | Path, force: bool = False) -> None:
        """Restore everything :meth:`save_checkpoint` wrote (``--resume``); each process resumes its own
        data and rollout streams, so the run goes on as if uninterrupted.

        Args:
            path: the checkpoint folder.
            force: resume although the checkpoint was written on another number of processes (the
                global batch, ``train.prompts_per_step`` × processes, changes; warned).

        Raises:
            FileNotFoundError: when ``path`` holds no trainer state.
            ProcessCountError: the checkpoint's process count is not this run's and ``force`` is false.
            FrozenWeightsError: the frozen weights (read from ``model.path``, not checkpointed) are not
                the ones the checkpoint was trained on and ``force`` is false.
        """
        path = Path(path)
        state = read_checkpoint_state(path)
        main, world = self.acc.is_main_process, self.acc.num_processes
        _ckpt.check_process_count(path, state, world, self.tc.prompts_per_step, force, main)
        if not _ckpt.whole_checkpoints(self.acc):  # FSDP / DeepSpeed checkpoints hold every weight
            _ckpt.check_frozen(path, state, self.policy_eval.model, self.cfg.model.path, force, main)
        _ckpt.load_checkpoint_state(self.acc, path, self.scheduler)
        self.step_count = int(state["step"])
        self._metrics_log.resumed_step = self.step_count  # metrics.jsonl / TensorBoard continue from here
        _ckpt.restore_streams(state, self.acc.process_index, self.tc.seed, self.data_gen, self.rollout_gen, main, world)
        _ckpt.follow_schedule(self.scheduler, self.optimizer, self.tc, self.step_count,
                              state.get("config", {}).get("train", {}), main)

    def continue_logs_after(self, step: int) -> None:
        """Make the next :meth:`log` drop the ``metrics.jsonl`` rows after ``step`` and open TensorBoard
        with ``purge_step=step + 1``, as after :meth:`load_checkpoint` at that step (``maskrl train
        --resume`` of a run that saved no checkpoint starts it again with ``step=0``)."""
        self._metrics_log.resumed_step = int(step)
