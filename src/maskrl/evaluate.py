"""Evaluation on the same sampler as training (SPEC §5: greedy, one sample per problem)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from tqdm.auto import tqdm

from maskrl.models.adapter import ModelAdapter
from maskrl.sampling import SamplerConfig, generate
from maskrl.tasks.base import Example, Task
from maskrl.text import decode_completions, encode_prompts


@dataclass(frozen=True)
class EvalResult:
    """Completions, rewards and the task's summary metrics for a list of examples."""

    completions: list[str]
    rewards: list[float]
    metrics: dict


def complete(adapter: ModelAdapter, prompts: Sequence[str], sampler: SamplerConfig, batch_size: int = 64,
             generator: torch.Generator | None = None, progress: bool = False, desc: str = "generate") -> list[str]:
    """Generate one completion per prompt text, in batches (prompts already chat-formatted)."""
    out: list[str] = []
    starts = range(0, len(prompts), batch_size)
    for s in tqdm(starts, desc=desc, disable=not progress, dynamic_ncols=True):
        ids, mask = encode_prompts(adapter.tokenizer, prompts[s:s + batch_size])
        r = generate(adapter, ids, mask, sampler, generator=generator)
        out.extend(decode_completions(adapter.tokenizer, r.completion_ids, r.completion_mask))
    return out


def evaluate_examples(adapter: ModelAdapter, task: Task, examples: Sequence[Example], sampler: SamplerConfig,
                      batch_size: int = 64, prompt_fn: Callable[[str], str] = lambda s: s,
                      generator: torch.Generator | None = None, progress: bool = False) -> EvalResult:
    """Sample (greedy unless ``sampler.temperature > 0``), score with the task reward, summarise."""
    was_training = adapter.model.training
    adapter.model.eval()
    try:
        completions = complete(adapter, [prompt_fn(ex.prompt) for ex in examples], sampler, batch_size,
                               generator, progress, desc=f"eval {task.name}")
    finally:
        adapter.model.train(was_training)
    rewards = task.score_examples(examples, completions)
    return EvalResult(completions, rewards, task.metrics(examples, completions, rewards))
