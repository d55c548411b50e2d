"""The model of a run: the built-in tiny model or a loaded checkpoint, with LoRA and gradient
checkpointing as configured, and its final export (weights, prompt card, model card)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from maskrl.models import ModelAdapter, build_tiny
from maskrl.prompt_card import save_prompt_card

if TYPE_CHECKING:
    from maskrl.config import RunConfig
    from maskrl.tasks.base import Task


def tiny_tokenizer(name: str):
    """The tiny model's tokenizer named by ``model.tiny.tokenizer``: ``char`` (None: the model's
    default character tokenizer), ``wordmath_bpe`` or a folder with ``tokenizer.json``.

    Raises:
        ValueError: an unknown name that is not such a folder.
    """
    if name == "char":
        return None
    if name == "wordmath_bpe":
        from maskrl.tasks.wordmath import build_wordmath_tokenizer

        return build_wordmath_tokenizer()
    if (Path(name) / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(name)
    from maskrl.config import TINY_TOKENIZERS

    raise ValueError(f"model.tiny.tokenizer: {name!r} is neither one of {', '.join(TINY_TOKENIZERS)} nor a folder "
                     f"with a tokenizer.json")


def load_policy(cfg: RunConfig, path: str | None = None) -> ModelAdapter:
    """The model of a run: ``path`` (or ``cfg.model.path``) loaded with :func:`maskrl.models.load` (a
    training run folder stands for its exported ``model/``, :func:`maskrl.rundir.run_model_folder`),
    else a freshly initialised tiny model (cast to ``model.dtype``); then LoRA and gradient checkpointing as configured.

    LoRA (``model.lora_rank`` > 0) is initialised from ``train.seed`` (:func:`maskrl.models.apply_lora`'s
    ``seed``): runs of equal seeds start from the same ``A`` matrices, runs of other seeds from others."""
    from maskrl.models import load
    from maskrl.rundir import run_model_folder

    mc = cfg.model
    path = run_model_folder(path or mc.path, "model.path")
    if path:
        adapter = load(path, dtype=mc.dtype)
    else:
        t = mc.tiny
        adapter = build_tiny(hidden_size=t.hidden_size, num_layers=t.num_layers, num_heads=t.num_heads,
                             intermediate_size=t.intermediate_size, seed=t.seed, tokenizer=tiny_tokenizer(t.tokenizer),
                             block_size=t.block_size)
        from maskrl.models.loading import parse_dtype

        dtype = parse_dtype(mc.dtype)  # model.dtype applies to the built-in model too: to its parameters,
        for p in adapter.model.parameters():  # as load() and from_pretrained do (RoPE frequencies stay float32)
            p.data = p.data.to(dtype)
    if adapter.tokenizer is None:
        raise ValueError(f"model {path!r} has no tokenizer files; maskrl needs one to encode prompts")
    if mc.gradient_checkpointing:
        from maskrl.models import enable_gradient_checkpointing

        enable_gradient_checkpointing(adapter)
    if mc.lora_rank > 0:
        from maskrl.models import apply_lora

        targets = mc.lora_target_modules
        modules = targets if targets == "all-linear" else [m.strip() for m in targets.split(",") if m.strip()]
        adapter = apply_lora(adapter, rank=mc.lora_rank, alpha=mc.lora_alpha, dropout=mc.lora_dropout,
                             target_modules=modules, seed=cfg.train.seed, experts=mc.lora_experts)
    return adapter


def export_model(folder: str | Path, adapter: ModelAdapter, cfg: RunConfig, task: Task, *, data: str, steps: str,
                 evaluation: list[tuple[str, dict]] | None = None) -> Path:
    """The final save of a run (``maskrl sft`` / ``train`` / ``demo``): the model in its family's layout
    (:func:`maskrl.models.save_model`; LoRA merged, adapter in ``adapter/``), the prompt card
    (:func:`save_prompt_card`) and the model card ``README.md``
    (:func:`maskrl.models.export.write_model_card`: base model, task, resolved recipe, data, steps,
    evaluation table)."""
    from maskrl.config import to_dict
    from maskrl.models import save_model
    from maskrl.models.export import write_model_card

    folder = save_model(adapter, folder)
    save_prompt_card(folder, task, cfg.model.chat_template, cfg.eval)
    write_model_card(folder, base_model=cfg.model.path or "maskrl's built-in tiny model (randomly initialised, "
                     f"model.tiny: {to_dict(cfg.model.tiny)})", task=task.name, recipe=to_dict(cfg), data=data,
                     steps=steps, evaluation=evaluation, family=adapter.family)
    return folder
