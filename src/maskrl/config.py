"""Run configuration: nested dataclasses filled from YAML files and ``--set key=value`` overrides.

Every field is typed; an unknown key or a value of the wrong type is an error that names the key
(dotted path) and lists the valid keys, so a typo never silently falls back to a default.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from maskrl.sampling import SamplerConfig


class ConfigError(ValueError):
    """A bad configuration key or value; the message names the dotted key."""


@dataclass
class TinyModelConfig:
    """Shape of the built-in tiny bidirectional Llama (used when ``model.path`` is empty)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    seed: int = 0


@dataclass
class ModelConfig:
    """Which model: ``path`` = a local folder (or hub id) to load; empty = build the tiny model."""

    path: str = ""
    dtype: str = "float32"
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    lora_rank: int = 0  # 0 = full fine-tuning; > 0 wraps the model with peft LoRA
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_target_modules: str = "all-linear"  # or a comma-separated list of module names
    gradient_checkpointing: bool = False
    chat_template: bool = True  # apply the tokenizer's chat template to prompts when it has one


@dataclass
class TaskConfig:
    """Task and data. ``data_path`` empty = ``$MASKRL_DATA_DIR`` or ``../shared/data``."""

    name: str = "sudoku4x4"
    prompt_template: str = ""  # empty = the task's default template
    data_path: str = ""
    train_size: int = 4000
    train_seed: int = 1234
    eval_limit: int = 0  # 0 = all rows
    # code tasks: train even when the sandbox lacks protections (docs/sandbox.md); default refuses
    allow_weak_sandbox: bool = False


@dataclass
class SFTConfig:
    """Masked-diffusion supervised warm start (``maskrl sft``)."""

    steps: int = 600
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    log_every: int = 50


@dataclass
class ObjectiveConfig:
    """Base objective and its hyper-parameters (SPEC §1.5)."""

    name: str = "diffu_grpo"
    clip_eps: float = 0.5
    beta: float = 0.04
    aggregation: str = "token_mean"
    normalize: str = "mean"
    likelihood: str = ""  # SPEC §1.4 estimator; empty = the objective's own (diffu_grpo: mean_field)
    p_mask_prompt: float = 0.15


#: learning-rate schedules of the RL loop, by their ``transformers.get_scheduler`` names
LR_SCHEDULERS = ("constant_with_warmup", "constant", "linear", "cosine")


@dataclass
class TrainConfig:
    """The RL loop (``maskrl train``)."""

    steps: int = 100
    prompts_per_step: int = 8
    group_size: int = 6
    inner_iterations: int = 12
    micro_batch_size: int = 0  # rows per forward/backward; 0 = whole batch (gradient accumulation otherwise)
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 0  # RL steps of linear warmup
    lr_scheduler: str = "constant_with_warmup"  # one of LR_SCHEDULERS (transformers.get_scheduler names)
    seed: int = 0
    log_every: int = 1
    eval_every: int = 0
    save_every: int = 0
    eval_limit: int = 0


@dataclass
class RunConfig:
    """Everything one command needs."""

    output_dir: str = "runs/default"
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: SamplerConfig = field(default_factory=lambda: SamplerConfig(gen_length=16, block_length=16, steps=16,
                                                                        temperature=0.9))
    eval: SamplerConfig = field(default_factory=lambda: SamplerConfig(gen_length=16, block_length=16, steps=16))
    sft: SFTConfig = field(default_factory=SFTConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, typ: Any, key: str, default: Any = None) -> Any:
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {sorted(_field_types(typ))}, got {value!r}")
        return _build(typ, value, key + ".", default)
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if typ is str:
        if value is None:
            return ""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _build(cls: type, data: Mapping[str, Any], prefix: str = "", defaults: Any = None) -> Any:
    """``cls`` from ``data``; keys missing from ``data`` keep their value in ``defaults`` (the
    parent's default for this section, so partial sections keep the run's defaults)."""
    types = _field_types(cls)
    unknown = [k for k in data if k not in types]
    if unknown:
        raise ConfigError(f"unknown key '{prefix}{unknown[0]}'; valid keys under "
                          f"{prefix.rstrip('.') or 'the top level'}: {', '.join(sorted(types))}")
    defaults = defaults if defaults is not None else cls()
    kwargs = {}
    for name, typ in types.items():
        if name in data:
            kwargs[name] = _coerce(data[name], typ, prefix + name, getattr(defaults, name))
        else:
            kwargs[name] = getattr(defaults, name)
    try:
        return cls(**kwargs)
    except ValueError as e:  # a section's own validation (e.g. SamplerConfig's divisibility checks)
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {e}") from None


def _merge(base: dict, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(item: str) -> dict:
    """``"a.b=3"`` -> ``{"a": {"b": 3}}``; the value is parsed as YAML (``true``, ``1e-5``, ``[1,2]``).

    Raises:
        ConfigError: when the item has no ``=``.
    """
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    key, raw = item.split("=", 1)
    value = yaml.safe_load(raw) if raw.strip() else ""
    out: dict = {}
    cur = out
    parts = key.strip().split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def load_config(paths: Sequence[str | Path] = (), overrides: Sequence[str] = ()) -> RunConfig:
    """Build a :class:`RunConfig` from YAML files (later ones win) and ``key=value`` overrides.

    Raises:
        ConfigError: on an unknown key (naming it and the valid ones) or a mistyped value.
        FileNotFoundError: when a YAML file does not exist.
    """
    data: dict = {}
    for p in paths:
        if not Path(p).is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            with open(p, encoding="utf-8") as fh:
                loaded = yaml.safe_load(fh) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML ({e})") from None
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"{p}: top level must be a mapping")
        data = _merge(data, loaded)
    for item in overrides:
        data = _merge(data, parse_override(item))
    cfg = _build(RunConfig, data)
    _check_ranges(cfg)
    return cfg


#: dotted keys that must be > 0 (``>= 0`` for those in ``_NON_NEGATIVE``)
_POSITIVE = ("model.tiny.hidden_size", "model.tiny.num_layers", "model.tiny.num_heads", "model.tiny.intermediate_size",
             "task.train_size", "sft.batch_size", "sft.lr", "train.prompts_per_step", "train.group_size",
             "train.inner_iterations", "train.lr")
_NON_NEGATIVE = ("model.lora_rank", "sft.steps", "sft.warmup_steps", "sft.weight_decay", "sft.max_grad_norm",
                 "train.steps", "train.micro_batch_size", "train.weight_decay", "train.max_grad_norm",
                 "train.warmup_steps", "train.eval_every", "train.save_every", "task.eval_limit",
                 "objective.clip_eps", "objective.beta")


def _check_ranges(cfg: "RunConfig") -> None:
    def get(key: str) -> Any:
        obj = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        return obj

    for key in _POSITIVE:
        if get(key) <= 0:
            raise ConfigError(f"{key}: must be > 0, got {get(key)!r}")
    for key in _NON_NEGATIVE:
        if get(key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {get(key)!r}")
    from maskrl.likelihood import LIKELIHOODS
    from maskrl.objectives import OBJECTIVES

    def choice(key: str, valid: list[str] | tuple[str, ...]) -> None:
        if get(key) not in valid:
            raise ConfigError(f"{key}: unknown {get(key)!r}; valid: {', '.join(valid)}")

    choice("objective.name", OBJECTIVES.names())
    if cfg.objective.likelihood:  # empty = the objective's own estimator
        choice("objective.likelihood", LIKELIHOODS.names())
    choice("train.lr_scheduler", LR_SCHEDULERS)
    if not 0.0 <= cfg.objective.p_mask_prompt <= 1.0:
        raise ConfigError(f"objective.p_mask_prompt: must lie in [0, 1], got {cfg.objective.p_mask_prompt!r}")
    t = cfg.model.tiny
    if t.hidden_size % t.num_heads:
        raise ConfigError(f"model.tiny.hidden_size ({t.hidden_size}) must be a multiple of "
                          f"model.tiny.num_heads ({t.num_heads})")


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)
