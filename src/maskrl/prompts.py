"""Model-input text from task prompts (chat template), and the checks before any work that prompt +
completion fit the model's positions and that the run's samplers can decode the model."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from maskrl.config import RunConfig
    from maskrl.models.adapter import ModelAdapter
    from maskrl.tasks.base import Example


def prompt_formatter(adapter: ModelAdapter, use_chat_template: bool = True) -> Callable[[str], str]:
    """Function turning a task prompt into model input text (chat template when the tokenizer has one
    and ``use_chat_template``): a :class:`maskrl.text.ModelInput`, in which the task prompt is data --
    special-token strings in it are encoded as text, only the template's are control ids."""
    from maskrl.text import model_input

    return lambda s: model_input(adapter.tokenizer, s, use_chat_template)


def check_lengths(adapter: ModelAdapter, prompts: Sequence[str], gen_length: int, what: str = "gen_length",
                  labels: Sequence[str] | None = None) -> None:
    """Stop before any work when a prompt plus its completion does not fit the model's positions.

    Args:
        adapter: the model (:attr:`ModelAdapter.max_positions`; no check when it is ``None``).
        prompts: the model-input texts (template and chat template applied), encoded as
            :func:`maskrl.text.encode_prompts` does.
        gen_length: completion length L in tokens.
        what: the setting that gave ``gen_length`` (``rollout.gen_length``, ``--gen-length``), for the message.
        labels: how to name each prompt (``"row 17 (file.jsonl)"``); default ``"prompt i"``.

    Raises:
        ValueError: ``gen_length`` alone reaches the limit, or a prompt of P tokens has
            P + ``gen_length`` > limit: the first such row is named, with how many rows do not fit
            and the longest prompt.
    """
    from maskrl.text import prompt_token_ids

    limit = adapter.max_positions
    if limit is None:
        return
    if gen_length >= limit:
        raise ValueError(f"{what} {gen_length} leaves no room for a prompt: the model has {limit} positions "
                         f"(max_position_embeddings); prompt + completion must fit in {limit} tokens")
    budget = limit - gen_length
    lengths = [len(prompt_token_ids(adapter.tokenizer, p)) for p in prompts]
    over = [i for i, n in enumerate(lengths) if n > budget]
    if over:
        i = over[0]
        name = labels[i] if labels is not None else f"prompt {i}"
        raise ValueError(f"{name}: the prompt is {lengths[i]} tokens; with {what} {gen_length} that is "
                         f"{lengths[i] + gen_length} > the model's {limit} positions (max_position_embeddings). "
                         f"{len(over)} of {len(lengths)} prompts do not fit (longest {max(lengths)} tokens): "
                         f"shorten the prompt template or {what}, or drop those rows")


def check_run_lengths(cfg: RunConfig, adapter: ModelAdapter, train: Sequence[Example] = (),
                      held_out: Sequence[Example] = (), source: str = "") -> None:
    """:func:`check_lengths` for a run: every training row with ``rollout.gen_length`` (which SFT
    uses too) and every evaluation row with ``eval.gen_length``, each named by its row id.

    Raises:
        ValueError: as :func:`check_lengths`.
    """
    fmt = prompt_formatter(adapter, cfg.model.chat_template)
    of = f" of {source}" if source else ""
    for rows, gen, what, kind in ((train, cfg.rollout.gen_length, "rollout.gen_length", "training row"),
                                  (held_out, cfg.eval.gen_length, "eval.gen_length", "evaluation row")):
        check_lengths(adapter, [fmt(ex.prompt) for ex in rows], gen, what,
                      [f"{kind} {ex.id}" + (of if rows is held_out else "") for ex in rows])


def check_run_samplers(cfg: RunConfig, adapter: ModelAdapter, sections: Sequence[str] = ("rollout", "eval")) -> None:
    """Stop before any work when a sampler section of the run cannot decode the loaded model (a
    block-diffusion model's block length and cache, or what only such a model takes:
    :meth:`maskrl.sampling.SamplerConfig.block_model_refusal`), naming the section.

    Args:
        sections: the run's sampler sections the command uses (``maskrl sft``: ``eval``, which its
            prompt card keeps; ``train`` and ``demo``: both).

    Raises:
        ValueError: ``"<section>: <why>"``.
    """
    for section in sections:
        why = getattr(cfg, section).block_model_refusal(adapter.block_size)
        if why:
            raise ValueError(f"{section}: {why}")
