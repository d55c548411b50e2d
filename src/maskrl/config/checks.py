"""Checks across fields of a built config: ranges, settings that train nothing, names that must be
known (schedulers, trackers, dtypes) and combinations that cannot take effect, decided before any model
is loaded."""
from __future__ import annotations

from typing import Any

from maskrl.config.schema import LR_SCHEDULERS, TINY_TOKENIZERS, TRAIN_REWARDS, ConfigError, FileTaskConfig, RunConfig


#: dotted keys that must be > 0 (``>= 0`` for those in ``_NON_NEGATIVE``)
_POSITIVE = ("model.lora_alpha", "model.tiny.hidden_size", "model.tiny.num_layers", "model.tiny.num_heads", "model.tiny.intermediate_size",
             "task.train_size", "sft.batch_size", "sft.lr", "train.prompts_per_step", "train.group_size",
             "train.inner_iterations", "train.lr")
_NON_NEGATIVE = ("model.lora_rank", "sft.steps", "sft.warmup_steps", "sft.weight_decay", "sft.max_grad_norm",
                 "train.steps", "train.micro_batch_size", "train.weight_decay", "train.max_grad_norm",
                 "train.warmup_steps", "train.eval_every", "train.save_every", "task.eval_limit", "train.max_forward_rows",
                 "train.eval_limit")


#: settings that leave every gradient zero or undefined: dotted key -> (smallest valid value, why)
_MEANINGLESS = {
    "train.group_size": (2, "the advantages are relative to each prompt's group (docs/spec.md §1.3): with one completion "
                            "per prompt every advantage is 0 (leave_one_out: undefined) and so is every gradient"),
    "train.steps": (1, "0 RL steps train nothing (for SFT alone use `maskrl sft`)"),
}


def _check_ranges(cfg: "RunConfig") -> None:
    def get(key: str) -> Any:
        obj = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        return obj

    for key, (least, why) in _MEANINGLESS.items():
        if get(key) < least:
            raise ConfigError(f"{key}: must be >= {least}, got {get(key)!r}: {why}")
    r = cfg.rollout
    if (r.temperature == 0 and r.remasking in ("low_confidence", "maskgit_plus", "topk_margin", "entropy")
            and r.alg_temp == 0 and not cfg.credit):
        raise ConfigError(f"rollout.temperature: 0 with rollout.remasking: {r.remasking} makes the G completions of "
                          "a prompt identical, so every group-relative advantage (docs/spec.md §1.3) and every gradient is 0; "
                          "sample the rollouts (e.g. rollout.temperature: 0.9) or use rollout.remasking: random")
    for key in _POSITIVE:
        if get(key) <= 0:
            raise ConfigError(f"{key}: must be > 0, got {get(key)!r}")
    for key in _NON_NEGATIVE:
        if get(key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {get(key)!r}")
    if not 0 <= cfg.model.lora_dropout < 1:
        raise ConfigError(f"model.lora_dropout: must lie in [0, 1), got {cfg.model.lora_dropout!r}")
    if get("train.lr_scheduler") not in LR_SCHEDULERS:
        raise ConfigError(f"train.lr_scheduler: unknown {get('train.lr_scheduler')!r}; valid: {', '.join(LR_SCHEDULERS)}")
    from maskrl.health import ON_NONFINITE

    if cfg.train.on_nonfinite not in ON_NONFINITE:
        raise ConfigError(f"train.on_nonfinite: unknown {cfg.train.on_nonfinite!r}; valid: {', '.join(ON_NONFINITE)}")
    if cfg.train.reward not in TRAIN_REWARDS:
        raise ConfigError(f"train.reward: unknown {cfg.train.reward!r}; valid: {', '.join(TRAIN_REWARDS)}")
    _check_dtype(cfg)
    _check_trackers(cfg)
    tr = cfg.train
    if not tr.eval_every and (tr.eval_data or tr.eval_limit):  # keys that could not take effect
        key = "train.eval_data" if tr.eval_data else "train.eval_limit"
        raise ConfigError(f"{key}: only read when train.eval_every > 0 (it is 0); set train.eval_every or remove {key}")
    if cfg.eval.mismatch_every:
        raise ConfigError("eval.mismatch_every: the evaluation sampler never measures the rollout mismatch; "
                          "set rollout.mismatch_every instead")
    _check_task_name(cfg)
    if cfg.task.name != "file" and cfg.task.file != FileTaskConfig():
        raise ConfigError(f"task.file: only read by task.name: file (this run's task is {cfg.task.name!r}); remove it")
    _check_observer_logits(cfg)
    _check_edits(cfg)
    t = cfg.model.tiny
    from pathlib import Path

    if t.tokenizer not in TINY_TOKENIZERS and not (Path(t.tokenizer) / "tokenizer.json").is_file():
        raise ConfigError(f"model.tiny.tokenizer: {t.tokenizer!r} is neither one of {', '.join(TINY_TOKENIZERS)} nor a "
                          f"folder with a tokenizer.json")
    if t.block_size is not None and t.block_size < 1:
        raise ConfigError(f"model.tiny.block_size: must be a positive integer or null (full attention), got {t.block_size}")
    if t.hidden_size % t.num_heads:
        raise ConfigError(f"model.tiny.hidden_size ({t.hidden_size}) must be a multiple of "
                          f"model.tiny.num_heads ({t.num_heads})")
    if not cfg.model.path:
        from maskrl.likelihood.blocks import model_refusal

        why = model_refusal(cfg.likelihood, t.block_size is not None)
        if why:
            raise ConfigError(f"likelihood (with model.tiny.block_size {t.block_size}): {why}")


def _check_task_name(cfg: "RunConfig") -> None:
    """``task.name`` is a registered task (built-in or a plug-in's; plug-ins are imported before the
    config is built), with the message ``train`` / ``eval`` give for an unknown task."""
    from maskrl.tasks.base import TASKS
    import maskrl.tasks  # noqa: F401  (registers the built-in tasks; imports no torch)

    try:
        TASKS.get(cfg.task.name)
    except KeyError as e:
        raise ConfigError(f"task.name: {e.args[0]}") from None


#: ``train.report_to`` names (accelerate's ``LoggerType`` values)
def tracker_names() -> tuple[str, ...]:
    from accelerate.utils import LoggerType

    return tuple(t.value for t in LoggerType if t.value != "all")


def _check_trackers(cfg: "RunConfig") -> None:
    """``train.report_to`` is a list of tracker names accelerate knows (checked here, not at the first log)."""
    names = cfg.train.report_to
    if isinstance(names, str):
        names = cfg.train.report_to = [names]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"train.report_to: expected a list of tracker names, got {names!r}")
    valid = tracker_names()
    bad = [n for n in names if n not in valid]
    if bad:
        raise ConfigError(f"train.report_to: unknown tracker(s) {', '.join(map(repr, bad))}; valid: {', '.join(valid)}")
    if not str(cfg.train.tracker_project).strip():
        raise ConfigError("train.tracker_project: must not be empty")


def _check_observer_logits(cfg: "RunConfig") -> None:
    """``rollout.observer_logits: refuse`` with a cache: no credit module may read per-step logits that
    must be theta's exact ones (its observers declare ``exact_logits``; issue 19 item 3). Decided
    here, before any model is loaded, naming the fields."""
    r = cfg.rollout
    if r.exact_cache or r.observer_logits != "refuse":
        return
    import torch

    from maskrl.credit import CREDITS
    from maskrl.sampling import exact_observers

    for i, module in enumerate(cfg.credit):
        names = exact_observers(module.observers(r, torch.Generator()))
        if names:
            raise ConfigError(
                f"credit[{i}] ({CREDITS.name_of(module)}) with rollout.cache: {r.cache} and rollout.observer_logits: "
                f"refuse: its observers ({', '.join(names)}) read statistics defined on theta's exact logits at the "
                "rollout states, which a cached step does not compute (no silent inexact credit). Use rollout.cache: "
                "none, or rollout.observer_logits: exact (the sampler then runs one extra full forward per cached "
                "step they read; rollouts cost more than with cache none).")


def _check_edits(cfg: "RunConfig") -> None:
    """``rollout.edit_threshold`` (LLaDA2.1's token editing): refuse the likelihood, credit modules and
    ``mismatch_every`` that read the sampler's states or steps, which edited rollouts do not record
    (:func:`maskrl.sampling.edit.edit_refusal`). Decided here, before any model is loaded."""
    if cfg.rollout.edit_threshold is None:
        return
    from maskrl.config.schema import component_registry
    from maskrl.sampling.edit import edit_refusal

    likelihood = component_registry("likelihood").name_of(cfg.likelihood)
    credits = [component_registry("credit").name_of(m) for m in cfg.credit]
    why = edit_refusal(likelihood, credits, cfg.rollout.mismatch_every)
    if why:
        raise ConfigError(f"rollout.edit_threshold: edited rollouts record each position's last write only, but {why}; "
                          "use a likelihood of the final completion (elbo, mean_field, stratified) and no step-reading "
                          "credit module, or rollout.edit_threshold: null")


def _check_dtype(cfg: "RunConfig") -> None:
    """``model.dtype`` must name a floating dtype (for every model, the built-in tiny one too), and full
    fine-tuning (``model.lora_rank: 0``) must keep float32 weights: AdamW on bf16/fp16 weights rounds
    most small updates away (bf16 keeps ~3 significant digits; at lr 3e-6 one step changed 3.8 % of the
    weights against 98.6 % in float32, issue 13 item 5). Decided here, before any model is loaded."""
    import torch

    from maskrl.models.loading import parse_dtype

    try:
        dtype = parse_dtype(cfg.model.dtype)
    except ValueError as e:
        raise ConfigError(f"model.dtype: {e}") from None
    if cfg.model.lora_rank == 0 and dtype != torch.float32:
        raise ConfigError(f"model.dtype: {cfg.model.dtype!r} with full fine-tuning (model.lora_rank: 0) would update "
                          f"{cfg.model.dtype} weights directly, and most small updates round to zero. Use "
                          "model.dtype: float32 (bf16 compute comes from accelerate's mixed precision, e.g. "
                          "`accelerate launch --mixed_precision bf16`), or LoRA (model.lora_rank > 0: a "
                          f"{cfg.model.dtype} base with float32 adapter weights).")
