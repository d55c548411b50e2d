"""The RL loop (ARCHITECTURE.md): the only stateful object. ``step()`` reads as the stages

    prompts -> sampler -> Rollout -> rewards -> advantages -> likelihoods (seeded masks) -> objective -> update

It runs on ``accelerate`` (CPU, one GPU, or many processes): gradient accumulation over micro-batches,
gradient clipping, AdamW with a learning-rate schedule (``transformers.get_scheduler``), checkpoints
(weights as safetensors, optimizer, scheduler, RNG states, step) with resume, metrics to JSONL and
TensorBoard, and a progress bar.

Departures from d1's trainer, on purpose: θ_old log-probs for all μ inner iterations are computed
before the first update (so every iteration's ratio is against the rollout policy, as in PPO);
with μ = 1 the ratio is exactly 1 and θ_old's forward is skipped.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import get_scheduler

from maskrl.advantages import informative_groups
from maskrl.config import RunConfig, to_dict
from maskrl.credit import CREDITS, CreditBatch, CreditContext, apply_credit
from maskrl.health import NonFiniteError, NonFiniteLogits, check_rewards, collapse_message, nonfinite_rows, \
    rollout_diagnostics
from maskrl.likelihood.base import PerToken, per_token_output, tensors_of
from maskrl.models.adapter import ModelAdapter
from maskrl.models.scale import rl_train_mode
from maskrl.sampling import generate
from maskrl.tasks.base import Example, Task
from maskrl.text import decode_completions, encode_prompts
from maskrl.types import LossTerm, Rollout


TRAINER_STATE = "trainer_state.pt"
log = logging.getLogger(__name__)


class TrainingInterrupted(KeyboardInterrupt):
    """:meth:`RLTrainer.train` stopped on SIGINT / SIGTERM at a step boundary, after saving a checkpoint.

    Attributes:
        step: the last completed RL step (the checkpoint's).
        checkpoint: the checkpoint folder written (``<output_dir>/checkpoints/step_<step>``).
        signum: the signal received (``signal.SIGINT`` or ``signal.SIGTERM``).
    """

    def __init__(self, step: int, checkpoint: Path, signum: int) -> None:
        self.step, self.checkpoint, self.signum = step, checkpoint, signum
        super().__init__(f"{signal.Signals(signum).name} after step {step}: checkpoint saved to {checkpoint}")


def mask_seed(base: int, step: int, iteration: int, micro_batch: int, term: int = 0) -> int:
    """Seed of the likelihood masks of (step, inner iteration, global micro-batch index, loss term).

    The same seed is used for θ, θ_old and θ_ref, so their masks are identical within an inner
    iteration; a new iteration or step gives a new mask (SPEC §1.4). Term 0 (the base objective)
    keeps the seeds of earlier versions.
    """
    return ((base + 7919 * term) * 1_000_003 + step * 10_007 + iteration * 101 + micro_batch) % (2**63 - 1)


def split_rows(rows: torch.Tensor, max_sequences: int = 0, max_rows: int = 0) -> list[slice]:
    """Consecutive micro-batches of sequences under a sequence and a forward-row budget.

    Args:
        rows: ``[M]`` long, forward rows each sequence costs (a likelihood's ``rows()``).
        max_sequences: at most this many sequences per micro-batch (0 = no limit).
        max_rows: at most this many rows per micro-batch (0 = no limit); a sequence's rows are never
            split, so a sequence over the budget forms a micro-batch of its own.

    Returns:
        Slices covering ``0..M-1`` in order (empty list for ``M = 0``).
    """
    out, start, used = [], 0, 0
    for i, r in enumerate(rows.tolist()):
        n = i - start
        if n and ((max_sequences and n >= max_sequences) or (max_rows and used + r > max_rows)):
            out.append(slice(start, i))
            start, used = i, 0
        used += r
    if rows.numel():
        out.append(slice(start, rows.numel()))
    return out


def pad_counts(work: torch.Tensor) -> torch.Tensor:
    """Dummy forwards each process adds so that all run as many forwards per loss term.

    Args:
        work: ``[P, K]`` integer, forward micro-batches of term k on process p (after dropping those
            with nothing to score).

    Returns:
        ``[P, K]`` long, ``max_p work[p, k] - work[p, k]``: every process then runs
        ``max_p work[p, k]`` forwards for term k (in each of the θ_old, reference and θ passes).

    Raises:
        ValueError: ``work`` is not a 2-D integer tensor.
    """
    if work.dim() != 2 or work.is_floating_point() or work.dtype == torch.bool:
        raise ValueError(f"work must be a [P, K] integer tensor, got shape {tuple(work.shape)} and dtype {work.dtype}")
    work = work.long()
    return work.max(0, keepdim=True).values - work


def padding_row(term: LossTerm, base: Rollout, max_rows: int) -> tuple[Rollout, torch.Tensor]:
    """The input of a dummy forward of ``term`` (see :meth:`RLTrainer.optimize`, multi-process).

    The row is the term's first row, or ``base``'s first row when the term has none on this process
    (a credit term that kept nothing here). Every completion position is asked for (``need`` all
    True; every built-in estimator runs its forward whatever its masks draw), unless that costs more
    than ``max_rows`` forward rows (the term's likelihood's ``rows()``; e.g. ``state`` at T commit
    steps); then only position 0 is, the cheapest call the likelihood has.

    Args:
        term: the loss term (its ``rollout`` has ``M >= 0`` rows; its ``likelihood`` is asked for
            ``rows()``).
        base: a rollout with at least one row (the batch's, ``N`` rows), same completion length L.
        max_rows: the forward-row budget of the dummy (the largest real micro-batch of the term).

    Returns:
        ``(rollout, need)``: a 1-row :class:`Rollout` and ``[1, L]`` bool.

    Raises:
        ValueError: ``term`` and ``base`` both have no row.
    """
    src = term.rollout if term.rollout.batch_size else base
    if not src.batch_size:
        raise ValueError(f"loss term {term.name!r}: no row for a padding forward (the term and the batch are empty)")
    ro = src.select(slice(0, 1))
    need = torch.ones_like(ro.completion_mask, dtype=torch.bool)  # [1, L]
    if int(term.likelihood.rows(ro, need).sum()) > max_rows:
        need = torch.zeros_like(need)
        need[0, 0] = True
    return ro, need


def all_ranks_done(acc: Accelerator) -> Callable[[bool], bool] | None:
    """The sampler's ``all_done`` hook over ``acc``'s processes; ``None`` on a single process.

    ``all_done(finished)`` all-reduces this rank's "no row left" flag (one scalar, on ``acc.device``)
    and returns True when every rank has finished (see :func:`maskrl.sampling.generate`). Every rank
    must call it the same number of times (it is a collective).
    """
    if acc.num_processes == 1:
        return None

    def all_done(finished: bool) -> bool:
        busy = torch.tensor([0.0 if finished else 1.0], device=acc.device)
        return acc.reduce(busy, reduction="sum").item() == 0.0

    return all_done


def ranks_max(acc: Accelerator) -> Callable[[list[int]], list[int]] | None:
    """The cached sampler's ``ranks_max`` hook over ``acc``'s processes; ``None`` on a single process.

    ``ranks_max(values)`` gathers every rank's list of ints (one all-gather, on ``acc.device``) and
    returns their element-wise maximum (see :func:`maskrl.sampling.generate`). Every rank must call it
    the same number of times (it is a collective).
    """
    if acc.num_processes == 1:
        return None

    def fn(values: list[int]) -> list[int]:
        t = torch.tensor([values], dtype=torch.long, device=acc.device)  # [1, k]
        return acc.gather(t).view(acc.num_processes, -1).max(0).values.tolist()

    return fn


@dataclass(frozen=True)
class Batch:
    """One collected RL batch (rows of this process).

    Attributes:
        rollout: the sampler's record, ``N`` rows.
        rewards: ``[N]`` float32 training rewards (``train.reward``).
        task_rewards: ``[N]`` float32, the task's own rewards (``None``: equal to ``rewards``).
        advantages: ``[N, L]`` float32 per-token advantages of the base term (zero outside
            ``completion_mask`` unless a credit module says otherwise).
        completions: decoded texts, ``N``.
        loss_mask: ``[N, L]`` bool, tokens the base term trains on (``completion_mask`` unless a credit
            module narrowed it); ``None`` = ``completion_mask``.
        base_weight: weight of the base term.
        terms: extra loss terms from credit modules.
        metrics: credit modules' metrics (``<module>/<key>``).
    """

    rollout: Rollout
    rewards: torch.Tensor
    advantages: torch.Tensor
    completions: list[str]
    loss_mask: torch.Tensor | None = None
    base_weight: float = 1.0
    terms: tuple[LossTerm, ...] = ()
    metrics: dict = dataclasses.field(default_factory=dict)
    task_rewards: torch.Tensor | None = None


class RLTrainer:
    """RL fine-tuning of a masked diffusion LM on a task (SPEC §1.3–§1.5).

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
        model, self.optimizer, self.scheduler = self.acc.prepare(policy.model, opt, sched)
        self.policy = dataclasses.replace(policy, model=model)  # wrapped (DDP) for training
        self.policy_eval = dataclasses.replace(policy, model=self.acc.unwrap_model(model))
        self.step_count = 0
        rank = self.acc.process_index
        self.data_gen = torch.Generator().manual_seed(self.tc.seed * 7919 + rank)
        self.rollout_gen = torch.Generator(device=self.device).manual_seed(self.tc.seed * 104729 + 17 + rank)
        self.all_done = all_ranks_done(self.acc)  # keeps ranks' sampler forwards in step (FSDP / ZeRO-3)
        self.ranks_max = ranks_max(self.acc)  # the same for the cached sampler
        self.out_dir = Path(cfg.output_dir)
        self._trackers_started = False
        self._metrics_fh = None
        self.nonfinite_skips = 0  # steps skipped under train.on_nonfinite: skip (maskrl.health)
        self._skip_reason: str | None = None
        self._collapse_warned = False
        self._resumed_step: int | None = None  # load_checkpoint: metrics.jsonl / TensorBoard continue from here
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
        credit modules (ARCHITECTURE.md data flow)."""
        examples = list(examples) if examples is not None else self.sample_prompts()
        g = self.tc.group_size
        rows = [ex for ex in examples for _ in range(g)]
        group_ids = torch.arange(len(examples)).repeat_interleave(g)
        ids, mask = encode_prompts(self.policy.tokenizer, [self.prompt_fn(ex.prompt) for ex in rows])
        self.policy_eval.model.eval()
        guard = NonFiniteLogits(self.policy.mask_id)
        observers = [guard] + [o for i, (_, c) in enumerate(self.credits) for o in c.observers(self.sampler, self._observer_generator(i))]
        rollout = generate(self.policy_eval, ids, mask, self.sampler, generator=self.rollout_gen, group_ids=group_ids,
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
        if self.acc.num_processes == 1 or self.tc.on_nonfinite != "skip":
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        return self.acc.reduce(t, reduction="sum").item() > 0

    def _observer_generator(self, index: int) -> torch.Generator:
        """CPU generator of credit module ``index``'s observers for this step's rollout: seeded from
        (``train.seed``, index, step, process), apart from the sampler's and the context's."""
        return torch.Generator().manual_seed(mask_seed(self.tc.seed + 1 + index, self.step_count, 1, self.acc.process_index))

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

        gen = torch.Generator().manual_seed(mask_seed(self.tc.seed + 1 + index, self.step_count, 0, self.acc.process_index))
        return CreditContext(rewards=rewards, group_ids=group_ids, sequence_advantages=adv, score=score, reduce=reduce,
                             generator=gen, policy=adapter, objective=self.objective, likelihood=self.likelihood,
                             step=self.step_count, num_processes=self.acc.num_processes)

    def loss_terms(self, batch: Batch) -> list[LossTerm]:
        """The weighted terms ``optimize`` sums: the base objective on the batch, then the credit
        modules' terms (ARCHITECTURE.md, "Loss terms")."""
        ro = batch.rollout
        mask = ro.completion_mask if batch.loss_mask is None else batch.loss_mask & ro.completion_mask
        base = LossTerm(name="base", weight=batch.base_weight, rollout=ro, advantages=batch.advantages, mask=mask,
                        objective=self.objective, likelihood=self.likelihood)
        return [base, *batch.terms]

    def _global_offset(self, count: int) -> int:
        """Sum of ``count`` over the processes before this one (global micro-batch numbering)."""
        if self.acc.num_processes == 1:
            return 0
        counts = self.acc.gather(torch.tensor([count], device=self.device)).tolist()
        return int(sum(counts[: self.acc.process_index]))

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
        """
        mu = self.tc.inner_iterations
        terms = self.loss_terms(batch)
        counts = []
        for t in terms:
            counts += [t.mask.sum().float(), torch.tensor(float(t.rollout.batch_size), device=self.device)]
        totals = self.acc.reduce(torch.stack(counts), reduction="sum").tolist()
        world = self.acc.num_processes
        plans = []  # (term index, term, normaliser, [(global micro-batch, slice, rows)])
        for ti, t in enumerate(terms):
            agg = getattr(t.objective, "aggregation", "token_mean")
            normalizer = (totals[2 * ti] if agg == "token_mean" else totals[2 * ti + 1]) / world
            rows = t.likelihood.rows(t.rollout, t.mask)  # [M]
            splits = split_rows(rows, self.tc.micro_batch_size, self.tc.max_forward_rows)
            first = self._global_offset(len(splits))
            work = [(first + j, sl, int(rows[sl].sum())) for j, sl in enumerate(splits)]
            plans.append((ti, t, normalizer, [w for w in work if w[2] > 0]))  # nothing to score: no forward
        pads = self._padding(terms, plans)  # {term index: (dummy forwards, 1-row rollout, need)}; {} on 1 process
        n_pad = 0

        def seed(ti: int, k: int, mb: int) -> int:
            return mask_seed(self.tc.seed, self.step_count, k, mb, ti)

        def pad_seed(ti: int, k: int, j: int) -> int:  # dummy forwards: seeds no real micro-batch uses
            return mask_seed(self.tc.seed, self.step_count, k, -1 - j, ti)

        old, ref = {}, {}
        with torch.no_grad():
            self.policy_eval.model.eval()
            for k in range(mu):
                for ti, t, _, work in plans:
                    for mb, sl, _ in work:
                        sub, need = t.rollout.select(sl), t.mask[sl]
                        where = f" (term {t.name}, micro-batch {mb})"
                        if mu > 1 and t.objective.uses_ratio:
                            old[ti, k, mb] = self._loglik(t, self.policy_eval, sub, seed(ti, k, mb), need)
                            self._check("log-probs (θ_old)", old[ti, k, mb], where)
                        if t.objective.needs_reference:
                            ref[ti, k, mb] = self._ref_loglik(t, sub, seed(ti, k, mb), need)
                            self._check("log-probs (reference)", ref[ti, k, mb], where)
                    count, pad_ro, pad_need = pads.get(ti, (0, None, None))
                    for j in range(count):  # multi-process padding: run, discard
                        if mu > 1 and t.objective.uses_ratio:
                            self._loglik(t, self.policy_eval, pad_ro, pad_seed(ti, k, j), pad_need)
                            n_pad += 1
                        if t.objective.needs_reference:
                            self._ref_loglik(t, pad_ro, pad_seed(ti, k, j), pad_need)
                            n_pad += 1
        rl_train_mode(self.policy.model, dropout=self.tc.dropout)
        sums: dict[str, float] = {}
        flat = []  # θ pass: (term index, term, normaliser, micro-batch, slice); slice None = dummy forward j = mb
        for ti, t, normalizer, work in plans:
            flat += [(ti, t, normalizer, mb, sl) for mb, sl, _ in work]
            flat += [(ti, t, normalizer, j, None) for j in range(pads.get(ti, (0,))[0])]
        for k in range(mu):
            if k == 0 and self._any_rank(self._skip_reason is not None):  # θ_old / reference (on_nonfinite: skip)
                self._skip_update(k, mu)
                break
            self.optimizer.zero_grad(set_to_none=True)
            for w, (ti, t, normalizer, mb, sl) in enumerate(flat):
                sub, need = t.rollout.select(sl), t.mask[sl]
                sync = w == len(flat) - 1
                ctx = self.acc.no_sync(self.policy.model) if not sync else contextlib.nullcontext()
                with ctx:
                    if sl is None:  # dummy forward: every parameter takes part, zero gradient, no metrics
                        logp = self._loglik(t, self.policy, pads[ti][1], pad_seed(ti, k, mb), pads[ti][2])
                        self.acc.backward(0.0 * sum(v.sum() for v in tensors_of(logp).values()))
                        n_pad += 1
                        continue
                    where = f" (term {t.name}, micro-batch {mb}, inner iteration {k})"
                    logp = self._loglik(t, self.policy, sub, seed(ti, k, mb), need)
                    self._check("log-probs (θ)", logp, where)
                    logp_old = old.get((ti, k, mb), logp.detach())
                    out = t.objective(logp, logp_old, ref.get((ti, k, mb)), t.advantages[sl], need,
                                      normalizer=normalizer)
                    if out.loss.dim() != 0:
                        raise ValueError(f"loss term {t.name!r}: objective {type(t.objective).__name__} returned a "
                                         f"loss of shape {tuple(out.loss.shape)}; expected a scalar")
                    self._check("loss", out.loss.detach(), where)
                    self.acc.backward(t.weight * out.loss)
                for name, v in out.metrics.items():
                    key = f"{t.name}/{name}"
                    sums[key] = sums.get(key, 0.0) + v / mu
            # max_norm inf: the norm without clipping, for the finiteness check
            gn = self.acc.clip_grad_norm_(self.policy.model.parameters(), self.tc.max_grad_norm or float("inf"))
            if self.tc.max_grad_norm > 0 and gn is not None:
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(gn) / mu
            if gn is not None:  # (accelerate's DeepSpeed path clips inside the engine and returns None)
                self._check("grad norm", torch.as_tensor(gn), f" (inner iteration {k})")
            if self._any_rank(self._skip_reason is not None):
                self._skip_update(k, mu)
                break
            self.optimizer.step()
            self.scheduler.step()
        self.policy.model.eval()
        if self.acc.num_processes > 1:
            sums["pad_forwards"] = float(n_pad)
        return self._mean_over_processes(sums)

    def _padding(self, terms: list[LossTerm], plans: list) -> dict[int, tuple[int, Rollout, torch.Tensor]]:
        """The dummy forwards of this process per term (see :meth:`optimize`): ``{term index: (count,
        1-row rollout, need [1, L])}`` for the terms that need some; ``{}`` on one process. One
        all-gather of each process's micro-batch count and largest micro-batch (forward rows) per term."""
        world = self.acc.num_processes
        if world == 1:
            return {}
        local = torch.tensor([[len(work), max((r for *_, r in work), default=0)] for *_, work in plans],
                             dtype=torch.long, device=self.device)  # [K, 2]
        every = self.acc.gather(local[None]).view(world, len(plans), 2).cpu()  # [P, K, 2]
        counts = pad_counts(every[..., 0])[self.acc.process_index].tolist()  # [K]
        budget = every[..., 1].max(0).values.tolist()  # [K] largest real micro-batch of the term, any process
        return {ti: (n, *padding_row(t, terms[0].rollout, b))
                for (ti, t, _, _), n, b in zip(plans, counts, budget) if n > 0}

    def _skip_update(self, k: int, mu: int) -> None:
        """Drop this step's update from inner iteration ``k`` on (``on_nonfinite: skip``); the schedule
        still advances by the remaining iterations, so it stays tied to the step count."""
        self.optimizer.zero_grad(set_to_none=True)
        for _ in range(k, mu):
            self.scheduler.step()

    def _mean_over_processes(self, metrics: dict[str, float]) -> dict[str, float]:
        """Average each metric over the processes (a key missing on a process counts as 0 there)."""
        if self.acc.num_processes == 1:
            return metrics
        from accelerate.utils import gather_object

        keys = sorted(set(k for ks in gather_object([sorted(metrics)]) for k in ks))
        vals = torch.tensor([metrics.get(k, 0.0) for k in keys], dtype=torch.float64, device=self.device)
        return dict(zip(keys, self.acc.reduce(vals, reduction="mean").tolist()))

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

    def step(self) -> dict:
        """One RL step: collect a batch, optimise on it, return the step's metrics."""
        t0 = time.time()
        lr = self.optimizer.param_groups[0]["lr"]  # the rate of this step's first optimizer step
        self._skip_reason = None
        batch = self.collect()
        t1 = time.time()
        mismatch = {}
        if self.sampler.mismatch_every and self.step_count % self.sampler.mismatch_every == 0 and self.all_done is None:
            from maskrl.sampling import rollout_mismatch  # issue 12: before the update, against the sampling theta
            mismatch["rollout/mismatch"] = rollout_mismatch(self.policy_eval, batch.rollout)["mismatch"]
        if self._any_rank(self._skip_reason is not None):  # train.on_nonfinite: skip, at the rollout
            self._skip_update(0, self.tc.inner_iterations)
            metrics = {}
        else:
            metrics = self.optimize(batch)
        if self._any_rank(self._skip_reason is not None):
            self.nonfinite_skips += 1
            log.warning("step skipped (train.on_nonfinite: skip): %s", self._skip_reason or "on another process")
        # credit modules report per-process values: averaged over processes like the loss metrics
        metrics.update(self._mean_over_processes({f"credit/{k}": v for k, v in batch.metrics.items()}))
        metrics.update(mismatch)
        rewards = self.acc.gather(batch.rewards)
        task_rewards = rewards if batch.task_rewards is None else self.acc.gather(batch.task_rewards)
        self.step_count += 1
        diag = rollout_diagnostics(batch.rollout.completion_ids, batch.rollout.completion_mask, batch.rollout.commit_prob)
        metrics.update(diag)
        metrics["nonfinite_skips"] = self.nonfinite_skips
        warning = collapse_message(diag, self.step_count)
        if warning and not self._collapse_warned:
            log.warning(warning)
        self._collapse_warned = warning is not None
        metrics.update({
            "step": self.step_count,
            "reward": rewards.mean().item(),
            "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "task_reward": task_rewards.mean().item(),
            "solved": self.task.is_correct(task_rewards).float().mean().item(),
            # groups whose rewards are not all equal: the only ones with a non-zero advantage
            "informative_groups": informative_groups(batch.rewards, batch.rollout.group_ids),
            "completion_tokens": batch.rollout.completion_mask.sum(-1).float().mean().item(),
            "rollout_seconds": t1 - t0,
            "seconds": time.time() - t0,
            "lr": lr,
        })
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
        with self._signals_stop_at_step_end(catch_signals):
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

    @contextlib.contextmanager
    def _signals_stop_at_step_end(self, enabled: bool):
        """While training: the first SIGINT / SIGTERM only sets ``_stop_signal`` (the loop then stops
        at the end of the step); the previous handlers are back for a second signal and afterwards."""
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = [signal.SIGINT] + ([signal.SIGTERM] if hasattr(signal, "SIGTERM") else [])
        previous = {s: signal.getsignal(s) for s in sigs}

        def handler(signum, _frame):
            self._stop_signal = signum
            for s, h in previous.items():  # a second signal: the usual behaviour
                signal.signal(s, h)
            print(f"\nmaskrl: {signal.Signals(signum).name}: finishing step {self.step_count + 1}, then saving a "
                  f"checkpoint (send it again to stop at once, without one)", file=sys.stderr, flush=True)

        for s in sigs:
            signal.signal(s, handler)
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _signal_on_any_rank(self) -> int:
        """The signal number received on any process since :meth:`train` began (0: none); a collective
        on several processes, so that every rank stops after the same step."""
        signum = self._stop_signal or 0
        return self.ranks_max([signum])[0] if self.ranks_max is not None else signum

    def log(self, metrics: dict) -> None:
        """Append to ``metrics.jsonl`` and send the numeric metrics to the ``train.report_to`` trackers
        through accelerate (``init_trackers`` with the resolved config as hyper-parameters at the first
        call, then ``Accelerator.log``); main process only. After :meth:`load_checkpoint` at step K, the
        first call drops the rows of ``metrics.jsonl`` after step K and opens TensorBoard with
        ``purge_step=K + 1``, so a resumed run's logs hold each step once."""
        if not self.acc.is_main_process:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        purge = None
        if self._metrics_fh is None:
            if self._resumed_step is not None:  # a resumed run: no row or event of a later step is kept
                from maskrl.rundir import truncate_metrics

                truncate_metrics(self.out_dir / "metrics.jsonl", self._resumed_step)
                purge, self._resumed_step = self._resumed_step + 1, None  # once: later rows are this run's
            self._metrics_fh = open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8")
        if not self._trackers_started and self.acc.log_with:
            kwargs = {"tensorboard": {"purge_step": purge}} if purge is not None else {}  # SummaryWriter's
            self.acc.init_trackers(self.tc.tracker_project, config=hyperparameters(self.cfg), init_kwargs=kwargs)
            self._trackers_started = True
        self._metrics_fh.write(json.dumps(metrics) + "\n")
        self._metrics_fh.flush()
        if self._trackers_started:
            scalars = {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float))}
            self.acc.log(scalars, step=int(metrics["step"]))

    def close(self) -> None:
        """Close ``metrics.jsonl`` and finish the trackers (each tracker's ``finish()``, what
        ``Accelerator.end_training`` does first; the process group is the launcher's and is left alone)."""
        if self._metrics_fh is not None:
            self._metrics_fh.close()
            self._metrics_fh = None
        if self._trackers_started:
            for tracker in self.acc.trackers:
                tracker.finish()
            self._trackers_started = False

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str | Path) -> Path:
        """Weights (safetensors), optimizer, scheduler, RNG states (accelerate) and the trainer's own
        state (step, data/rollout generators, config) into ``path``. Only the main process writes."""
        path = Path(path)
        self.acc.wait_for_everyone()
        self.acc.save_state(str(path), safe_serialization=True)
        if self.acc.is_main_process:
            torch.save({"step": self.step_count, "data_gen": self.data_gen.get_state(),
                        "rollout_gen": self.rollout_gen.get_state(), "config": to_dict(self.cfg)}, path / TRAINER_STATE)
        self.acc.wait_for_everyone()
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore everything :meth:`save_checkpoint` wrote (``--resume``).

        Raises:
            FileNotFoundError: when ``path`` holds no trainer state.
        """
        path = Path(path)
        state = read_checkpoint_state(path)
        self.acc.load_state(str(path))
        self.step_count = int(state["step"])
        self._resumed_step = self.step_count
        self.data_gen.set_state(state["data_gen"])
        self.rollout_gen.set_state(state["rollout_gen"])
        self._follow_schedule(state.get("config", {}).get("train", {}))

    def continue_logs_after(self, step: int) -> None:
        """Make the next :meth:`log` drop the ``metrics.jsonl`` rows after ``step`` and open TensorBoard
        with ``purge_step=step + 1``, as after :meth:`load_checkpoint` at that step (``maskrl train
        --resume`` of a run that saved no checkpoint starts it again with ``step=0``)."""
        self._resumed_step = int(step)

    def _follow_schedule(self, saved: dict) -> None:
        """After a resume, make the learning rate that of *this* run's schedule at the restored step.

        The optimizer state restores the last rate of the saved run (0.0 at the end of a ``linear``
        schedule) and the scheduler's counter, while the schedule function is this run's (its
        ``train.steps``, ``warmup_steps``, ``lr``, ``lr_scheduler``). Without this, the first resumed
        step would run at the saved run's last rate (issue 13 item 3). The schedule's base rate is set
        to this run's ``train.lr``; a change of these settings is logged.
        """
        inner = getattr(self.scheduler, "scheduler", self.scheduler)  # accelerate's wrapper holds it
        inner.base_lrs = [self.tc.lr for _ in inner.base_lrs]
        inner.last_epoch = self.step_count * self.tc.inner_iterations  # μ scheduler steps per RL step
        for group, base, fn in zip(self.optimizer.param_groups, inner.base_lrs, inner.lr_lambdas):
            group["initial_lr"] = base
            group["lr"] = base * fn(inner.last_epoch)
        changed = [f"train.{k} {saved[k]!r} -> {getattr(self.tc, k)!r}"
                   for k in ("steps", "lr", "lr_scheduler", "warmup_steps", "inner_iterations")
                   if k in saved and saved[k] != getattr(self.tc, k)]
        if changed and self.acc.is_main_process:
            log.warning("resumed at step %d with other schedule settings (%s): the learning rate follows this "
                        "run's schedule from step %d (lr %.3g)", self.step_count, "; ".join(changed),
                        self.step_count + 1, self.optimizer.param_groups[0]["lr"])


def tracker_kwargs(cfg: RunConfig) -> dict:
    """``Accelerator`` keyword arguments for the ``train.report_to`` trackers: ``log_with`` and a
    :class:`~accelerate.utils.ProjectConfiguration` whose logging dir is ``<output_dir>/tb``
    (TensorBoard writes ``<output_dir>/tb/<train.tracker_project>``; W&B, MLflow, ... their own places)."""
    from accelerate.utils import ProjectConfiguration

    out = Path(cfg.output_dir)
    return {"log_with": list(cfg.train.report_to) or None,
            "project_config": ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "tb"))}


def check_trackers(cfg: RunConfig, acc: Accelerator) -> None:
    """Every ``train.report_to`` tracker is active on ``acc`` (accelerate drops trackers whose package
    is missing with only a warning; here that is an error naming the tracker).

    Raises:
        ConfigError: a requested tracker is not installed, or an accelerator passed in lacks it.
    """
    from maskrl.config import ConfigError

    active = {str(getattr(t, "value", t)) for t in (acc.log_with or [])}
    missing = [n for n in cfg.train.report_to if n not in active]
    if missing:
        raise ConfigError(f"train.report_to: tracker(s) {', '.join(missing)} not available (package not installed, "
                          f"e.g. `pip install 'maskrl[track]'`, or an Accelerator passed without them in log_with); "
                          f"set train.report_to to the ones you have, or []")


def hyperparameters(cfg: RunConfig) -> dict:
    """The resolved config flattened to ``{"train.lr": 1e-05, ...}`` with ``bool``/``int``/``float``/``str``
    values (lists and ``None`` as text), the form every accelerate tracker accepts as hyper-parameters."""
    flat: dict = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (bool, int, float, str)):
            flat[prefix] = value
        else:
            flat[prefix] = json.dumps(value)

    walk("", to_dict(cfg))
    return flat


def read_checkpoint_state(path: str | Path) -> dict:
    """The trainer state of a checkpoint folder: ``{"step", "data_gen", "rollout_gen", "config"}``
    (``config`` in :func:`~maskrl.config.to_dict` form: the run's config at that step).

    Raises:
        FileNotFoundError: when ``path`` holds no trainer state.
    """
    path = Path(path)
    if not (path / TRAINER_STATE).is_file():
        raise FileNotFoundError(f"{path} is not a maskrl checkpoint (no {TRAINER_STATE})")
    return torch.load(path / TRAINER_STATE, weights_only=False)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete ``checkpoints/step_K`` folder (one with its trainer state, written last) with the
    largest K under ``run_dir``, or ``None``."""
    ckpts = sorted((p for p in (Path(run_dir) / "checkpoints").glob("step_*")
                    if p.name[5:].isdigit() and (p / TRAINER_STATE).is_file()), key=lambda p: int(p.name[5:]))
    return ckpts[-1] if ckpts else None
