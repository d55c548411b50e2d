"""Building blocks shared by the commands: model, data and prompt formatting from a :class:`RunConfig`.

The pieces live in their own modules (:mod:`maskrl.policy`, :mod:`maskrl.data`, :mod:`maskrl.prompts`,
:mod:`maskrl.prompt_card`, :mod:`maskrl.devices`, :mod:`maskrl.files`) and are re-exported here; this
module adds what joins them to the SFT loop and the evaluation harness.
"""
from __future__ import annotations

import dataclasses

from typing import Callable

import torch

from maskrl.config import RunConfig
from maskrl.data import (VALIDATION_ROWS, VALIDATION_SEED_OFFSET, drop_rows, eval_examples, task_and_data,  # noqa: F401
                         train_examples, validation_examples)
from maskrl.devices import resolve_device  # noqa: F401
from maskrl.files import write_json  # noqa: F401
from maskrl.models import ModelAdapter
from maskrl.policy import export_model, load_policy, tiny_tokenizer  # noqa: F401
from maskrl.prompt_card import PROMPT_CARD, read_prompt_card, save_prompt_card  # noqa: F401
from maskrl.prompts import check_lengths, check_run_lengths, check_run_samplers, prompt_formatter  # noqa: F401
from maskrl.tasks.base import Example, Task


def sft_from_config(cfg: RunConfig, adapter: ModelAdapter, task: Task, train: list[Example],
                    progress: bool = True) -> list[dict]:
    """:func:`maskrl.sft.run_sft` with the run's ``sft`` section, completion length and prompt format."""
    from maskrl.sft import run_sft

    sc = cfg.sft
    return run_sft(adapter, train, task.target, gen_length=cfg.rollout.gen_length, steps=sc.steps,
                   batch_size=sc.batch_size, lr=sc.lr, warmup_steps=sc.warmup_steps, weight_decay=sc.weight_decay,
                   max_grad_norm=sc.max_grad_norm, seed=sc.seed, log_every=sc.log_every,
                   prompt_fn=prompt_formatter(adapter, cfg.model.chat_template), progress=progress,
                   gen_length_key="rollout.gen_length")


def training_eval_fn(cfg: RunConfig, task: Task, rows: list[Example], prompt_fn: Callable[[str], str],
                     policy: Callable[[], ModelAdapter]) -> Callable[[int], dict]:
    """``step -> metrics`` for :class:`~maskrl.trainer.RLTrainer`'s ``eval_fn``: the ``eval`` sampler
    (docs/spec.md §1.2, greedy by default) on ``rows`` with ``policy()`` (the unwrapped policy; LoRA merged in a
    copy under ``eval.merge_lora``, :func:`~maskrl.models.merged.sampling_policy`), scored by the
    task; numeric metrics only (the trainer logs them as ``eval/<name>``)."""
    from maskrl.evaluate import evaluate_examples
    from maskrl.models.merged import sampling_policy

    def evaluate(step: int) -> dict:
        gen = torch.Generator(device=policy().device).manual_seed(cfg.train.seed + step)
        with sampling_policy(policy(), cfg.eval.merge_lora) as sampler_policy:  # LoRA merged in a copy
            m = evaluate_examples(sampler_policy, task, rows, cfg.eval, batch_size=64, prompt_fn=prompt_fn,
                                  generator=gen).metrics
        return {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    return evaluate


#: the decoding-rule fields ``maskrl generate`` has a flag for
RULE_FLAGS = ("schedule", "threshold", "cache", "remasking", "early_stop")


def generate_settings(args, card: dict | None) -> tuple:
    """``maskrl generate``'s sampler, chat-template switch and dtype from its flags, else the model's prompt
    card (its ``eval_sampler``: how the run evaluated; its decoding rule as ``maskrl eval`` takes it, every
    field but the lengths, steps and temperature), else defaults; each value's source is listed.

    Args:
        args: the parsed ``generate`` flags (``gen_length``, ``block_length``, ``steps``, ``chat_template``,
            ``dtype``, ``temperature``, ``schedule``, ``threshold``, ``cache``, ``remasking``, ``early_stop``).
        card: :func:`~maskrl.prompt_card.read_prompt_card` of the model folder, or ``None``.

    Returns:
        ``(SamplerConfig, chat: bool, torch.dtype, used: list[str])``; ``used`` says where each value came from
        (``"steps 32 (model card)"``). ``steps`` comes from the card only when the card's lengths are used.

    Raises:
        ValueError: naming the flag(s) of a refused value.
    """
    from maskrl.evaluate import RULE_FIELDS
    from maskrl.models.loading import parse_dtype
    from maskrl.sampling import SamplerConfig

    es = card["eval_sampler"] if card else {}
    used: list[str] = []

    def pick(name, flag, from_card, default):
        value, where = (flag, "flag") if flag is not None else \
            (from_card, "model card") if from_card is not None else (default, "default")
        used.append(f"{name} {value} ({where})")
        return value

    gen_length = pick("gen_length", args.gen_length, es.get("gen_length"), 64)
    block_length = pick("block_length", args.block_length, es.get("block_length"), 32)
    same = card is not None and gen_length == es.get("gen_length") and block_length == es.get("block_length")
    steps = pick("steps", args.steps, es.get("steps") if same else None, max(1, gen_length // 2))
    # the decoding rule as maskrl eval takes it (the card's, greedy unless --temperature); the flags win
    defaults = {f.name: f.default for f in dataclasses.fields(SamplerConfig)}
    rule = {k: v for k, v in es.items() if k in RULE_FIELDS}
    used += [f"{k} {v} (model card)" for k, v in rule.items() if k not in RULE_FLAGS and v != defaults[k]]
    rule.update({k: pick(k, getattr(args, k), rule.get(k), defaults[k]) for k in RULE_FLAGS})
    chat = pick("chat_template", args.chat_template, card["chat_template"] if card else None, True)
    try:
        dtype = parse_dtype(args.dtype)
    except ValueError as e:
        raise ValueError(f"--dtype: {e}") from None
    try:
        sampler = SamplerConfig(gen_length=gen_length, block_length=block_length, steps=steps,
                                temperature=args.temperature, **rule)
    except ValueError as e:
        raise ValueError(f"{e} (settings: {'; '.join(used[:-1])}; temperature {args.temperature})") from None
    return sampler, chat, dtype, used
