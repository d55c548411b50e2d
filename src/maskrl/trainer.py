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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import get_scheduler

from maskrl.advantages import group_advantages, informative_groups
from maskrl.config import RunConfig, to_dict
from maskrl.likelihood import LIKELIHOODS
from maskrl.models.adapter import ModelAdapter
from maskrl.objectives import OBJECTIVES
from maskrl.sampling import generate
from maskrl.tasks.base import Example, Task
from maskrl.text import decode_completions, encode_prompts
from maskrl.types import Rollout


TRAINER_STATE = "trainer_state.pt"


def mask_seed(base: int, step: int, iteration: int, micro_batch: int) -> int:
    """Seed of the likelihood masks of (step, inner iteration, global micro-batch index).

    The same seed is used for θ, θ_old and θ_ref, so their masks are identical within an inner
    iteration; a new iteration or step gives a new mask (SPEC §1.4).
    """
    return (base * 1_000_003 + step * 10_007 + iteration * 101 + micro_batch) % (2**63 - 1)


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


@dataclass(frozen=True)
class Batch:
    """One collected RL batch (rows of this process).

    Attributes:
        rollout: the sampler's record, ``N`` rows.
        rewards: ``[N]`` float32.
        advantages: ``[N, L]`` float32 per-token advantages (zero outside ``completion_mask``).
        completions: decoded texts, ``N``.
    """

    rollout: Rollout
    rewards: torch.Tensor
    advantages: torch.Tensor
    completions: list[str]


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
        self.cfg, self.tc = cfg, cfg.train
        self.task, self.examples, self.prompt_fn, self.eval_fn = task, list(train_examples), prompt_fn, eval_fn
        ocfg = cfg.objective
        obj_cls = OBJECTIVES.get(ocfg.name)
        extra = {"likelihood": ocfg.likelihood} if ocfg.likelihood else {}
        self.objective = obj_cls(clip_eps=ocfg.clip_eps, beta=ocfg.beta, aggregation=ocfg.aggregation,
                                 normalize=ocfg.normalize, **extra)
        self.likelihood = LIKELIHOODS.get(self.objective.likelihood)
        self.sampler = cfg.rollout
        self.acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.device = self.acc.device
        policy.model.to(self.device)
        self.uses_peft = hasattr(policy.model, "disable_adapter")
        if self.objective.needs_reference and reference is None and not self.uses_peft:
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
        self.out_dir = Path(cfg.output_dir)
        self._writer = None
        self._metrics_fh = None

    # ------------------------------------------------------------------ stages
    def sample_prompts(self) -> list[Example]:
        """B examples for this step (without replacement within the step), from ``data_gen``."""
        b = min(self.tc.prompts_per_step, len(self.examples))
        idx = torch.randperm(len(self.examples), generator=self.data_gen)[:b].tolist()
        return [self.examples[i] for i in idx]

    @torch.no_grad()
    def collect(self, examples: Sequence[Example] | None = None) -> Batch:
        """Rollout G completions per prompt, score them and compute per-token advantages."""
        examples = list(examples) if examples is not None else self.sample_prompts()
        g = self.tc.group_size
        rows = [ex for ex in examples for _ in range(g)]
        group_ids = torch.arange(len(examples)).repeat_interleave(g)
        ids, mask = encode_prompts(self.policy.tokenizer, [self.prompt_fn(ex.prompt) for ex in rows])
        self.policy_eval.model.eval()
        rollout = generate(self.policy_eval, ids, mask, self.sampler, generator=self.rollout_gen, group_ids=group_ids,
                           all_done=self.all_done)
        completions = decode_completions(self.policy.tokenizer, rollout.completion_ids, rollout.completion_mask)
        rewards = torch.tensor(self.task.score_examples(rows, completions), dtype=torch.float32, device=self.device)
        adv = group_advantages(rewards, rollout.group_ids, self.objective.normalize)  # [N]
        token_adv = adv[:, None] * rollout.completion_mask.float()  # [N, L]; credit modules reshape this
        return Batch(rollout=rollout, rewards=rewards, advantages=token_adv, completions=completions)

    def _micro_batches(self, n: int) -> list[slice]:
        mb = self.tc.micro_batch_size or n
        return [slice(s, min(s + mb, n)) for s in range(0, n, mb)]

    def _loglik(self, adapter: ModelAdapter, rollout: Rollout, seed: int) -> torch.Tensor:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        return self.likelihood(adapter, rollout, gen, p_mask_prompt=self.cfg.objective.p_mask_prompt)

    def optimize(self, batch: Batch) -> dict:
        """μ inner iterations of the objective on one batch; one optimizer step per iteration.

        Gradients are accumulated over micro-batches; the token-mean normaliser is the token count of
        the whole global batch (all processes), so the update equals a single-process one.
        """
        mu = self.tc.inner_iterations
        ro = batch.rollout
        mbs = self._micro_batches(ro.batch_size)
        first_mb = self.acc.process_index * len(mbs)  # global micro-batch index offset of this rank
        mask = ro.completion_mask
        n_tok = mask.sum().float()
        n_seq = torch.tensor(float(ro.batch_size), device=self.device)
        tot_tok, tot_seq = self.acc.reduce(torch.stack([n_tok, n_seq]), reduction="sum")
        world = self.acc.num_processes
        normalizer = (tot_tok if self.objective.aggregation == "token_mean" else tot_seq).item() / world
        seeds = [[mask_seed(self.tc.seed, self.step_count, k, first_mb + j) for j in range(len(mbs))] for k in range(mu)]
        old, ref = {}, {}
        with torch.no_grad():
            self.policy_eval.model.eval()
            for k in range(mu):
                for j, sl in enumerate(mbs):
                    sub = ro.select(sl)
                    if mu > 1:
                        old[k, j] = self._loglik(self.policy_eval, sub, seeds[k][j])
                    if self.objective.needs_reference:
                        ref[k, j] = self._ref_loglik(sub, seeds[k][j])
        self.policy.model.train()
        sums: dict[str, float] = {}
        for k in range(mu):
            self.optimizer.zero_grad(set_to_none=True)
            for j, sl in enumerate(mbs):
                sub = ro.select(sl)
                sync = j == len(mbs) - 1
                ctx = self.acc.no_sync(self.policy.model) if not sync else contextlib.nullcontext()
                with ctx:
                    logp = self._loglik(self.policy, sub, seeds[k][j])
                    logp_old = old.get((k, j), logp.detach())
                    out = self.objective(logp, logp_old, ref.get((k, j)), batch.advantages[sl], mask[sl], normalizer=normalizer)
                    self.acc.backward(out.loss)
                for name, v in out.metrics.items():
                    sums[name] = sums.get(name, 0.0) + v / (mu * len(mbs))
            if self.tc.max_grad_norm > 0:
                gn = self.acc.clip_grad_norm_(self.policy.model.parameters(), self.tc.max_grad_norm)
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(gn) / mu
            self.optimizer.step()
            self.scheduler.step()
        self.policy.model.eval()
        return sums

    def _ref_loglik(self, rollout: Rollout, seed: int) -> torch.Tensor:
        if self.reference is not None:
            return self._loglik(self.reference, rollout, seed)
        with self.policy_eval.reference() as ref:
            return self._loglik(ref, rollout, seed)

    def step(self) -> dict:
        """One RL step: collect a batch, optimise on it, return the step's metrics."""
        t0 = time.time()
        lr = self.scheduler.get_last_lr()[0]  # the rate of this step's first optimizer step
        batch = self.collect()
        t1 = time.time()
        mismatch = {}
        if self.sampler.mismatch_every and self.step_count % self.sampler.mismatch_every == 0 and self.all_done is None:
            from maskrl.sampling import rollout_mismatch  # issue 12: before the update, against the sampling theta
            mismatch["rollout/mismatch"] = rollout_mismatch(self.policy_eval, batch.rollout)["mismatch"]
        metrics = self.optimize(batch)
        metrics.update(mismatch)
        rewards = self.acc.gather(batch.rewards)
        self.step_count += 1
        metrics.update({
            "step": self.step_count,
            "reward": rewards.mean().item(),
            "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "solved": (rewards >= self.task.correct_threshold - 1e-9).float().mean().item(),
            # groups whose rewards are not all equal: the only ones with a non-zero advantage
            "informative_groups": informative_groups(batch.rewards, batch.rollout.group_ids),
            "completion_tokens": batch.rollout.completion_mask.sum(-1).float().mean().item(),
            "rollout_seconds": t1 - t0,
            "seconds": time.time() - t0,
            "lr": lr,
        })
        return metrics

    # ------------------------------------------------------------------ loop
    def train(self, steps: int | None = None, progress: bool = True) -> list[dict]:
        """Run ``steps`` RL steps (default ``train.steps`` minus steps already done); log, eval, save."""
        total = self.tc.steps if steps is None else self.step_count + steps
        history = []
        bar = tqdm(total=total, initial=self.step_count, desc="rl", dynamic_ncols=True,
                   disable=not (progress and self.acc.is_main_process))
        while self.step_count < total:
            m = self.step()
            if self.eval_fn is not None and self.tc.eval_every and self.step_count % self.tc.eval_every == 0:
                m.update({f"eval/{k}": v for k, v in self.eval_fn(self.step_count).items()})
            history.append(m)
            if self.step_count % max(1, self.tc.log_every) == 0:
                self.log(m)
            bar.update(1)
            bar.set_postfix(reward=f"{m['reward']:.3f}", kl=f"{m.get('kl', 0.0):.4f}", s_per_step=f"{m['seconds']:.2f}")
            if self.tc.save_every and self.step_count % self.tc.save_every == 0:
                self.save_checkpoint(self.out_dir / "checkpoints" / f"step_{self.step_count}")
        bar.close()
        return history

    def log(self, metrics: dict) -> None:
        """Append to ``metrics.jsonl`` and TensorBoard (main process only)."""
        if not self.acc.is_main_process:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self._metrics_fh is None:
            self._metrics_fh = open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8")
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.out_dir / "tb"))
        self._metrics_fh.write(json.dumps(metrics) + "\n")
        self._metrics_fh.flush()
        for k, v in metrics.items():
            if k != "step" and isinstance(v, (int, float)):
                self._writer.add_scalar(k, v, metrics["step"])
        self._writer.flush()

    def close(self) -> None:
        if self._metrics_fh is not None:
            self._metrics_fh.close()
            self._writer.close()
            self._metrics_fh = self._writer = None

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
        if not (path / TRAINER_STATE).is_file():
            raise FileNotFoundError(f"{path} is not a maskrl checkpoint (no {TRAINER_STATE})")
        self.acc.load_state(str(path))
        state = torch.load(path / TRAINER_STATE, weights_only=False)
        self.step_count = int(state["step"])
        self.data_gen.set_state(state["data_gen"])
        self.rollout_gen.set_state(state["rollout_gen"])


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The ``checkpoints/step_K`` folder with the largest K under ``run_dir``, or ``None``."""
    ckpts = sorted((Path(run_dir) / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return ckpts[-1] if ckpts else None
