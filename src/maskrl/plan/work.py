"""The work of one RL step, recorded on a stand-in: the recipe's trainer on a 1-layer 32-wide model
runs a full step (rollout, credit modules, loss terms split into micro-batches) with hooks counting
every decoder and output-layer call (:mod:`maskrl.plan`'s docstring)."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

@dataclass(frozen=True)
class Call:
    """One model forward: ``rows`` × ``seq`` tokens (``past`` cached keys), ``scored`` output-layer
    positions, in ``phase`` of loss ``term``; ``count`` times per RL step. Phases: ``rollout`` (the
    sampler's steps, its observers' included), ``credit`` (the credit modules' own no-grad forwards
    after the rewards, e.g. RLDF / DTCA's state filter, docs/spec.md §1.5 / §3), ``theta_old``, ``reference``,
    ``theta``."""

    phase: str
    term: str
    rows: int
    seq: int
    scored: int
    past: int = 0
    count: int = 1


class _Recorder:
    """Hooks on a stand-in model recording (rows, query length, cached keys, scored positions) of each
    decoder and output-layer call."""

    def __init__(self, adapter) -> None:
        self.calls: list[list[int]] = []
        self.boundary: int | None = None
        model = adapter.model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._h = [base.get_decoder().register_forward_pre_hook(self._decoder, with_kwargs=True),
                   base.get_output_embeddings().register_forward_hook(self._head)]

    def _decoder(self, _m, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        q = ids.shape[1]
        past = (mask.shape[-1] - q) if mask is not None and mask.dim() == 4 else 0
        self.calls.append([ids.shape[0], q, past, 0])

    def _head(self, _m, _args, out):  # after the adapter's own pre-hook has picked the scored positions
        if self.calls:
            self.calls[-1][3] += out.reshape(-1, out.shape[-1]).shape[0]

    def take(self) -> list[list[int]]:
        out, self.calls = self.calls, []
        return out

    def mark(self) -> None:
        """Remember where the sampler's calls end (the first reward call of a step)."""
        if self.boundary is None:
            self.boundary = len(self.calls)

    def close(self) -> None:
        for h in self._h:
            h.remove()


def credit_rows_bound(cfg) -> int:
    """Forward rows the recipe's credit modules add per RL step and process in their worst case, as
    each states it (:meth:`~maskrl.credit.base.CreditModule.planned_rows` of B·G =
    ``train.prompts_per_step`` × ``train.group_size`` rollouts; modules that state none count 0).
    Unit: forward rows (sequences of P + L tokens) of one θ pass, before micro-batching and μ.

    DiSPO (docs/spec.md §4): every trajectory branches at exactly one state (the fixed schedule draws t from
    {0, …, T−1}; the threshold schedule falls back to a row's last step), so there are B·G states; a
    state is kept when its Z fillings' rewards differ, at most all of them, and each kept state is Z
    rows: B·G·Z with ``alpha_step > 0``. How many states are kept depends on the rewards, which no
    plan knows; the plan counts this bound, which is what memory and time must be sized for (the
    step term's forwards are padded to the processes' maximum anyway, ``RLTrainer.optimize``)."""
    n = cfg.train.prompts_per_step * cfg.train.group_size
    rows = (getattr(m, "planned_rows", lambda _n: None)(n) for m in cfg.credit)
    return sum(r for r in rows if r)


#: the name from when DiSPO's step term was the only credit term with a stated bound
dispo_step_rows = credit_rows_bound


def standin_config(cfg, block_size: int | None = None):
    """The recipe on the stand-in model: 1-layer 32-wide tiny Llama (char tokenizer), float32, no LoRA
    or checkpointing (neither changes which forwards run), each credit module as its
    :meth:`~maskrl.credit.base.CreditModule.for_planning` says (its data-dependent work at the worst
    case, e.g. DiSPO keeping every branched state, :func:`credit_rows_bound`; inputs that only
    reweight dropped, e.g. DTCA's POS table); every other section as in the recipe.

    A block-diffusion model (``block_size``, default: the planned model's,
    :func:`~maskrl.plan.shapes.model_shape`) makes the stand-in block-diffusion too
    (``model.tiny.block_size``), so the recorded work is that model's: the block sampler's calls (a
    block step attends the cached earlier blocks plus the current block) and the block likelihood's
    doubled x_t ⊕ x_0 rows (:mod:`maskrl.likelihood.blocks`), about P + 2L columns each."""
    if block_size is None:
        from maskrl.plan.shapes import model_shape

        block_size = model_shape(cfg).block_size
    c = copy.deepcopy(cfg)
    c.model = dataclasses.replace(c.model, path="", dtype="float32", lora_rank=0, gradient_checkpointing=False,
                                  tiny=dataclasses.replace(c.model.tiny, hidden_size=32, num_layers=1, num_heads=2,
                                                           intermediate_size=64, tokenizer="char",
                                                           block_size=block_size))
    c.credit = [m.for_planning() if hasattr(m, "for_planning") else m for m in c.credit]
    return c


def estimate_prompt_length(cfg, limit: int = 256, default: int = 256) -> tuple[int, str]:
    """``(P, how)``: the longest prompt in tokens among the first ``limit`` training rows, measured with
    the run's tokenizer and prompt format when it is at hand (the built-in tiny model's tokenizers; a
    local model folder), else ``default`` (a Hub id, or no data)."""
    from maskrl.data import task_and_data
    from maskrl.policy import tiny_tokenizer
    from maskrl.prompts import prompt_formatter
    from maskrl.text import encode_prompts

    try:
        if cfg.model.path:
            if not (Path(cfg.model.path) / "tokenizer.json").is_file():
                return default, f"default {default} (no local tokenizer)"
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(cfg.model.path, trust_remote_code=False)  # never asks to run remote code
        else:
            from maskrl.models.tokenizer import build_char_tokenizer

            tok = tiny_tokenizer(cfg.model.tiny.tokenizer) or build_char_tokenizer()
        c = copy.deepcopy(cfg)
        c.task = dataclasses.replace(c.task, train_size=min(c.task.train_size, limit))
        task, _, _, train = task_and_data(c)
        from types import SimpleNamespace

        fmt = prompt_formatter(SimpleNamespace(tokenizer=tok), cfg.model.chat_template)
        ids, _ = encode_prompts(tok, [fmt(task.format_prompt(ex) if hasattr(task, "format_prompt") else ex.prompt)
                                      for ex in train[:limit]])
        return int(ids.shape[1]), f"measured: longest of {min(limit, len(train))} training prompts"
    except Exception as e:  # noqa: BLE001 - no data or tokenizer here: the stated default
        return default, f"default {default} ({type(e).__name__}: {str(e)[:80]})"


def spread_rewards(n: int, group_size: int, generator: torch.Generator) -> list[float]:
    """``n`` synthetic rewards, 0 or 1 at random (``generator``), in which every run of ``group_size``
    consecutive rows -- one group of rollouts, as the trainer lays a step's completions out -- has both
    values: the step that trains every group. A group of equal rewards has advantage 0 and trains
    nothing (``skip_equal``), so with plain coin flips a step's work and memory would depend on luck
    (a group of 2 is equal half the time); the plan and its checks take the step at its largest.
    Rows past the last whole group keep their coin flip.

    Args:
        n: completions in the call.
        group_size: rollouts per prompt, G (1: plain coin flips).
        generator: the source of randomness.

    Returns:
        ``n`` floats in ``{0.0, 1.0}``.
    """
    r = torch.randint(0, 2, (n,), generator=generator)
    g = max(1, int(group_size))
    if g > 1 and n >= g:
        groups = r[:n - n % g].view(-1, g)
        same = (groups == groups[:, :1]).all(1)
        groups[same, -1] = 1 - groups[same, -1]
    return r.float().tolist()


def synthetic_trainer(cfg, prompt_length: int, seed: int = 0, on_reward=None, logits_width: int | None = None):
    """An :class:`~maskrl.trainer.RLTrainer` of ``cfg``'s model (``load_policy``) on synthetic work:
    ``train.prompts_per_step`` prompts of ``prompt_length`` random characters (the built-in character
    tokenizer: one token each, bos included), random 0/1 rewards with both values in every group
    (:func:`spread_rewards`, a generator seeded with ``seed``), and no early stop (the adapter's eos id
    is set to -1, so every completion is L tokens long). The plan's stand-in and the CPU check (``benchmarks/rehearsal/plan_check.py``) run their steps on it; nothing is
    written to disk. ``on_reward``: called with no arguments before each reward call (the plan's
    recorder marks there where the sampler's forwards end and the credit modules' begin).
    ``logits_width``: the policy's :attr:`~maskrl.models.adapter.ModelAdapter.logits_width` (the plan
    passes the full model's vocabulary, so that a narrow stand-in splits its logits as that model does)."""
    from maskrl.policy import load_policy
    from maskrl.tasks.base import Example, Task
    from maskrl.trainer import RLTrainer

    cfg = copy.deepcopy(cfg)
    cfg.output_dir = "/nonexistent-maskrl-plan"
    policy = load_policy(cfg)
    policy = dataclasses.replace(policy, eos_id=-1, stop_ids=(), logits_width=logits_width)
    gen = torch.Generator().manual_seed(seed)

    class _Synthetic(Task):
        name = "plan_synthetic"

        def reward(self, prompts, completions, **_):
            if on_reward is not None:
                on_reward()
            return spread_rewards(len(completions), cfg.train.group_size, gen)

    chars = "0123456789abcdefghijklmnopqrstuvwxyz"
    picks = torch.randint(0, len(chars), (cfg.train.prompts_per_step, max(1, prompt_length - 1)), generator=gen)
    examples = [Example(id=i, prompt="".join(chars[j] for j in row)) for i, row in enumerate(picks.tolist())]
    return RLTrainer(cfg, policy, _Synthetic(), examples)


def record_work(cfg, prompt_length: int, seed: int = 0, micro_batch_size: int | None = None,
                max_forward_rows: int | None = None, vocab_size: int | None = None) -> list[Call]:
    """The forwards of one RL step of ``cfg`` per process (see the module docstring).

    Args:
        cfg: a :class:`maskrl.config.RunConfig`.
        prompt_length: P, prompt tokens per row (the sequence is P + L).
        seed: seed of the stand-in's weights, prompts and rewards.
        micro_batch_size, max_forward_rows: override ``train.*`` (for the "what to change" search).
        vocab_size: the full model's output width; forwards whose split depends on it (RLDF / DTCA's
            state filter, :func:`maskrl.credit.rldf.state_chunk_rows`) are split as on that model
            (default: the stand-in's own vocabulary).

    Returns:
        The :class:`Call` list (rollout calls one by one; loss calls with ``count`` = μ).
    """
    from maskrl.trainer import split_rows

    sc = standin_config(cfg)
    if micro_batch_size is not None or max_forward_rows is not None:
        sc.train = dataclasses.replace(sc.train, micro_batch_size=sc.train.micro_batch_size if micro_batch_size is None
                                       else micro_batch_size,
                                       max_forward_rows=sc.train.max_forward_rows if max_forward_rows is None
                                       else max_forward_rows)
    rec = None
    trainer = synthetic_trainer(sc, prompt_length, seed, on_reward=lambda: rec.mark(), logits_width=vocab_size)
    rec = _Recorder(trainer.policy_eval)
    try:
        batch = trainer.collect()
        split = rec.boundary if rec.boundary is not None else len(rec.calls)
        calls = [Call("rollout" if i < split else "credit", "-", r, q, m, past)
                 for i, (r, q, past, m) in enumerate(rec.take())]
        mu = sc.train.inner_iterations
        with torch.no_grad():
            for ti, t in enumerate(trainer.loss_terms(batch)):
                rows = t.likelihood.rows(t.rollout, t.mask)
                for j, sl in enumerate(split_rows(rows, sc.train.micro_batch_size, sc.train.max_forward_rows)):
                    if int(rows[sl].sum()) == 0:
                        continue
                    g = torch.Generator().manual_seed(1000 * ti + j)
                    t.likelihood(trainer.policy_eval, t.rollout.select(sl), g, t.mask[sl])
                    for r, q, past, m in rec.take():
                        if mu > 1 and t.objective.uses_ratio:
                            calls.append(Call("theta_old", t.name, r, q, m, past, mu))
                        if t.objective.needs_reference:
                            calls.append(Call("reference", t.name, r, q, m, past, mu))
                        calls.append(Call("theta", t.name, r, q, m, past, mu))
    finally:
        rec.close()
    return calls


def dry_run(cfg, prompt_length: int = 256, seed: int = 0) -> dict:
    """One full RL step (rollout, credit modules, θ_old / reference / θ passes, update) of ``cfg`` on the
    plan's stand-in model (:func:`record_work`'s): the recipe's sampler, G, B, μ, micro-batching,
    objective, likelihood and credit modules on a 1-layer 32-wide model. Returns the step's metrics.
    A recipe whose settings cannot run together fails here, before any GPU is rented."""
    trainer = synthetic_trainer(standin_config(cfg), prompt_length, seed)
    return trainer.step()
