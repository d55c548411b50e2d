"""Run configuration: nested dataclasses filled from YAML files and ``--set key=value`` overrides.

Every field is typed; an unknown key or a value of the wrong type is an error that names the key
(dotted path) and lists the valid keys, so a typo never silently falls back to a default.
"""
from __future__ import annotations

import copy
import dataclasses
import re
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
    """Shape of the built-in tiny bidirectional Llama (used when ``model.path`` is empty).

    Attributes:
        hidden_size: width of the residual stream.
        num_layers: number of transformer blocks.
        num_heads: attention heads (must divide ``hidden_size``).
        intermediate_size: width of the MLP.
        seed: initialisation seed (the global RNG is not touched).
        tokenizer: ``char`` (one token per character; puzzles), ``wordmath_bpe`` (the byte-level BPE
            that :func:`maskrl.tasks.wordmath.build_wordmath_tokenizer` trains on generated word
            problems; natural-language text, issue 10) or a folder with tokenizer files
            (``tokenizer.json``; relative: see ``RunConfig``'s paths). It is saved beside the model, so a loaded checkpoint keeps it.
    """

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    seed: int = 0
    tokenizer: str = field(default="char", metadata={"path": "tokenizer"})


@dataclass
class ModelConfig:
    """Which model, its precision and its adapters.

    Attributes:
        path: a local folder (or hub id) for :func:`maskrl.models.load`; empty = build the tiny model.
            In a YAML file a relative folder is read from the file's folder (a value that is no
            folder there and looks like ``owner/name`` stays a Hub id); on the command line from the
            working directory.
        dtype: parameter dtype of a loaded model (``float32``, ``bfloat16``, ``float16``).
        tiny: shape of the built-in tiny model.
        lora_rank: 0 = full fine-tuning; > 0 wraps the model with peft LoRA of this rank.
        lora_alpha: LoRA scaling numerator.
        lora_dropout: dropout on the LoRA input.
        lora_target_modules: ``all-linear`` or a comma-separated list of module names.
        gradient_checkpointing: recompute activations in the backward pass (less memory, more time).
        chat_template: apply the tokenizer's chat template to prompts when it has one.
    """

    path: str = field(default="", metadata={"path": "model"})
    dtype: str = "float32"
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    lora_rank: int = 0
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_target_modules: str = "all-linear"
    gradient_checkpointing: bool = False
    chat_template: bool = True


@dataclass
class FileTaskConfig:
    """The ``file`` task: your own JSONL / CSV file or ``datasets`` folder and reward
    (:class:`maskrl.tasks.file_task.FileTask`; only with ``task.name: file``). The evaluation rows are
    ``task.data_path``; the prompt is ``task.prompt_template`` over the columns.

    Attributes:
        train: training rows (a ``.jsonl`` / ``.json`` / ``.csv`` file or a ``datasets`` folder).
        answer: the answer column (the SFT target by default; passed to the reward with every column).
        reward: ``module:function`` or ``path/to/file.py:function``, called as
            ``reward(prompts, completions, **columns) -> list[float]`` (TRL's shape); empty = exact
            match of the stripped completion with the answer column.
        target: ``str.format`` template of the SFT target over the columns; empty = the answer column.
    """

    train: str = field(default="", metadata={"path": "file"})
    answer: str = "answer"
    reward: str = field(default="", metadata={"path": "reward"})
    target: str = ""


@dataclass
class TaskConfig:
    """Task and data.

    Attributes:
        name: registered task (``sudoku4x4``, ``countdown``, ``gsm8k``, ``math500``, ``mbpp``, ``humaneval``,
            ``jsonschema``).
        prompt_template: Python format string for prompts; empty = the task's default template.
        data_path: data file or folder; empty = ``$MASKRL_DATA_DIR`` or ``../shared/data``. Relative:
            see ``RunConfig``'s paths.
        train_size: training rows (generated tasks: how many to generate).
        train_seed: seed of generated training rows.
        eval_limit: evaluate on the first rows only; 0 = all rows.
        require_final_answer: score 0 for a completion cut off before any final answer (reasoning
            never closed, no answer span); off by default, where the whole text is searched.
        allow_weak_sandbox: code tasks: train even when the sandbox lacks protections
            (docs/sandbox.md); by default training refuses.
        file: the ``file`` task's data and reward (section ``task.file``; only with ``name: file``).
    """

    name: str = "sudoku4x4"
    prompt_template: str = ""
    data_path: str = field(default="", metadata={"path": "file"})
    train_size: int = 4000
    train_seed: int = 1234
    eval_limit: int = 0
    require_final_answer: bool = False
    allow_weak_sandbox: bool = False
    file: FileTaskConfig = field(default_factory=FileTaskConfig)


@dataclass
class SFTConfig:
    """Masked-diffusion supervised warm start (``maskrl sft``).

    Attributes:
        steps: optimizer steps.
        batch_size: examples per step.
        lr: peak learning rate (AdamW).
        warmup_steps: linear warm-up steps.
        weight_decay: AdamW weight decay.
        max_grad_norm: gradient clipping norm (0 = off).
        seed: seed of batches and masks.
        log_every: log the loss every this many steps.
    """

    steps: int = 600
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    log_every: int = 50


#: learning-rate schedules of the RL loop, by their ``transformers.get_scheduler`` names
LR_SCHEDULERS = ("constant_with_warmup", "constant", "linear", "cosine")


#: values of ``train.reward``
TRAIN_REWARDS = ("task", "correct")


@dataclass
class TrainConfig:
    """The RL loop (``maskrl train``; SPEC §1.5 for μ, G).

    Attributes:
        steps: RL steps (each: one rollout batch, μ optimizer steps).
        prompts_per_step: B, prompts per step (per process).
        group_size: G, completions per prompt.
        inner_iterations: μ, optimizer steps per rollout batch (a fresh likelihood mask seed each).
        micro_batch_size: at most this many sequences per forward/backward (gradient accumulation);
            0 = no limit.
        max_forward_rows: at most this many forward rows per forward/backward, counted with each
            likelihood's ``rows()`` (mean_field 1 per sequence, state one per commit step); a
            sequence's rows stay together (a sequence larger than the budget runs alone); 0 = no limit.
        lr: peak learning rate (AdamW).
        weight_decay: AdamW weight decay.
        max_grad_norm: gradient clipping norm (0 = off).
        warmup_steps: RL steps of linear warm-up.
        lr_scheduler: one of ``constant_with_warmup``, ``constant``, ``linear``, ``cosine``
            (``transformers.get_scheduler`` names), over steps × μ optimizer steps.
        seed: seed of prompt order, rollouts, likelihood masks and credit generators.
        log_every: write metrics every this many steps.
        eval_every: evaluate a validation split every this many steps with the ``eval`` sampler and log
            ``eval/...`` metrics (0 = never during training). The split: ``train.eval_data`` when set,
            else the task's own validation split (``wordmath``), else rows the task generates
            (disjoint from the test rows; training rows equal to a validation row are dropped);
            never the test file by default. A task with none of these and no ``train.eval_data`` is
            an error when ``eval_every > 0``.
        save_every: checkpoint every this many steps (0 = never).
        eval_limit: validation rows used during training (0 = all rows of ``train.eval_data`` /
            the validation split; 200 generated rows).
        eval_data: validation file (or data folder) for ``train.eval_every``, read by the task's
            loader; empty = the task's validation split or generated rows (see ``eval_every``).
        report_to: trackers that receive every logged metric, through accelerate's tracker API
            (``Accelerator(log_with=...)``): any of ``tensorboard`` (written to ``<output_dir>/tb``),
            ``wandb``, ``mlflow``, ``comet_ml``, ``aim``, ``clearml``, ``dvclive``, ``swanlab``,
            ``trackio``; ``[]`` = none. ``metrics.jsonl`` is always written. The run's resolved
            config is logged as hyper-parameters.
        tracker_project: project / experiment name given to the trackers (``init_trackers``).
        on_nonfinite: ``error`` | ``skip``: a NaN/inf at any stage (logits, rewards, advantages,
            log-probs, loss, gradient norm; :mod:`maskrl.health`) raises naming the stage, step and
            rows, or skips the step's update and counts it (``nonfinite_skips``).
        dropout: keep dropout on in the policy's RL forward (default off: θ then computes what θ_old
            computed, so the importance ratio is exactly 1 before an update).
        reward: what the advantages are computed from **[choice]**: ``task`` (default: the task's
            graded reward, e.g. Sudoku's fraction of blanks right, Countdown's 0.1 format credit) or
            ``correct`` (1.0 when the completion counts as correct by the task's accuracy threshold,
            else 0.0: the metric the validation curve reports). Credit modules' re-scored
            completions (DiSPO's branches) get the same reward. Evaluation always reports the task's
            own metrics; the logged ``reward`` is the training reward and ``task_reward`` the task's.
    """

    steps: int = 100
    prompts_per_step: int = 8
    group_size: int = 6
    inner_iterations: int = 12
    micro_batch_size: int = 0
    max_forward_rows: int = 0
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    lr_scheduler: str = "constant_with_warmup"
    seed: int = 0
    log_every: int = 1
    eval_every: int = 0
    save_every: int = 0
    eval_limit: int = 0
    eval_data: str = field(default="", metadata={"path": "file"})
    report_to: list = field(default_factory=lambda: ["tensorboard"])
    tracker_project: str = "maskrl"
    on_nonfinite: str = "error"
    dropout: bool = False
    reward: str = "task"


def _registry(kind: str):
    if kind == "objective":
        from maskrl.objectives import OBJECTIVES
        return OBJECTIVES
    if kind == "likelihood":
        from maskrl.likelihood import LIKELIHOODS
        return LIKELIHOODS
    from maskrl.credit import CREDITS
    return CREDITS


def _default_objective():
    from maskrl.objectives import DiffuGRPO
    return DiffuGRPO()


@dataclass
class RunConfig:
    """Everything one command needs.

    Paths: every field that names an input file or folder (``plugins`` entries that are ``.py``
    paths, ``model.path``, ``model.tiny.tokenizer``, ``task.data_path``, a credit module's
    ``pos_weights``; fields marked ``metadata={"path": ...}``, plug-ins' too) is read, when relative
    and written in a YAML file, from that file's folder, as a reader of the file would take it, and
    stored as an absolute path. Values given with ``--set`` / ``--plugin`` are relative to the
    working directory. ``output_dir`` is where the command writes, relative to the working directory.

    Attributes:
        output_dir: where runs write checkpoints, metrics and models (relative to the working
            directory, also in a YAML file).
        plugins: modules (dotted names or ``.py`` paths) imported before the config is built, so that
            their registered objectives, likelihoods, credit modules and tasks can be named here.
        model: which model (see ``model``).
        task: task and data (see ``task``).
        rollout: the RL sampler (SPEC §1.2).
        eval: the evaluation sampler (same code, usually greedy).
        sft: the supervised warm start.
        objective: the base objective, ``{name: diffu_grpo, **its fields}`` (SPEC §1.5).
        likelihood: the estimator of ℓ, ``{name: state, **its fields}`` (SPEC §1.4); absent = the
            objective's own (diffu_grpo: mean_field).
        credit: credit modules applied in order, ``[{name: dps, lam: 0.5}, ...]`` (SPEC §2–§4).
        train: the RL loop.
    """

    output_dir: str = "runs/default"
    plugins: list = field(default_factory=list, metadata={"path": "module"})
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: SamplerConfig = field(default_factory=lambda: SamplerConfig(gen_length=16, block_length=16, steps=16,
                                                                        temperature=0.9))
    eval: SamplerConfig = field(default_factory=lambda: SamplerConfig(gen_length=16, block_length=16, steps=16))
    sft: SFTConfig = field(default_factory=SFTConfig)
    objective: Any = field(default_factory=_default_objective, metadata={"component": "objective"})
    likelihood: Any = field(default=None, metadata={"component": "likelihood"})
    credit: list = field(default_factory=list, metadata={"component": "credit", "many": True})
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.likelihood is None:  # the objective's own estimator, with its defaults
            self.likelihood = own_likelihood(self.objective)
        from maskrl.likelihood.base import check_pairing

        check_pairing(self.objective, self.likelihood)  # the per-token tensors the objective reads exist


def own_likelihood(objective: Any) -> Any:
    """The objective's own estimator: its ``default_likelihood`` built with its
    ``default_likelihood_fields`` (e.g. ``rldf``: ``state`` with a clean prompt). Used when the YAML
    has no ``likelihood`` section, and as the defaults of one that names the same estimator."""
    fields = dict(getattr(objective, "default_likelihood_fields", {}) or {})
    return _registry("likelihood").get(objective.default_likelihood)(**fields)


#: flat keys of earlier versions -> where they live now
MOVED = {
    "objective.likelihood": "likelihood.name (a section of its own: `likelihood: {name: state, p_mask_prompt: 0.15}`)",
    "objective.p_mask_prompt": "likelihood.p_mask_prompt (`likelihood: {name: mean_field, p_mask_prompt: 0.15}`)",
}


class _FromFile(str):
    """A string read from a YAML file; ``base`` is that file's folder (for path fields)."""

    base: Path

    def __reduce__(self):  # copy.deepcopy keeps the folder
        return (_from_file, (str(self), self.base))


def _from_file(text: str, base: Path) -> "_FromFile":
    s = _FromFile(text)
    s.base = base
    return s


def _mark(obj: Any, base: Path) -> Any:
    """``obj`` (loaded YAML) with every string value remembering the YAML file's folder ``base``."""
    if isinstance(obj, str):
        return _from_file(obj, base)
    if isinstance(obj, Mapping):
        return {k: _mark(v, base) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_mark(v, base) for v in obj]
    return obj


def _resolve_path(value: Any, kind: str) -> Any:
    """A path field's value (``kind`` from its ``metadata["path"]``) with a relative path written in
    a YAML file made absolute against that file's folder; other values are returned unchanged
    (plain strings: command-line values are relative to the working directory).

    Kinds: ``file`` (any file or folder), ``model`` (a Hub id ``owner/name`` that is no folder next to
    the YAML stays as written), ``tokenizer`` (the built-in names stay), ``module`` (a list: dotted
    module names stay, ``.py`` paths are resolved), ``reward`` (``file.py:function`` has its file
    resolved; ``module:function`` stays).
    """
    import os

    if kind == "module" and isinstance(value, list):
        return [_resolve_path(v, "module") for v in value]
    if not isinstance(value, _FromFile):
        return value
    text = str(value)
    if not text or Path(text).expanduser().is_absolute() or text.startswith("~"):
        return os.path.expanduser(text) if text.startswith("~") else text
    if kind == "tokenizer" and text in TINY_TOKENIZERS:
        return text
    if kind == "module" and not (text.endswith(".py") or "/" in text or "\\" in text):
        return text
    if kind == "reward":  # `path/to/file.py:function` is a path; a dotted `module:function` stays as written
        path, sep, fn = text.rpartition(":")
        if not sep or not (path.endswith(".py") or "/" in path or "\\" in path):
            return text
        return f"{os.path.abspath(value.base / path)}:{fn}"
    resolved = os.path.abspath(value.base / text)
    if kind == "model" and not Path(resolved).exists():
        from maskrl.models.loading import is_hub_id

        if is_hub_id(text):
            return text
    return resolved


#: keys that existed and were removed: ``section.key`` (components: ``kind.name.key``) -> why, and
#: what to use instead; consulted by the unknown-key errors
REMOVED = {
    "credit.dispo.seed": "removed: DiSPO's branch generator is seeded by the trainer from (train.seed, module, "
                         "step, process), so branching differs across run seeds and survives a resume (a per-module "
                         "seed repeated the same branches across run seeds); set train.seed instead",
}


def _unknown_key_error(key: str, removed_as: str, valid: Sequence[str], where: str) -> ConfigError:
    """The error for an unknown key ``key``: the :data:`REMOVED` reason when ``removed_as`` is listed
    there, else the valid keys under ``where``."""
    if removed_as in REMOVED:
        return ConfigError(f"{key}: {REMOVED[removed_as]}")
    return ConfigError(f"unknown key '{key}'; valid keys under {where}: {', '.join(sorted(valid))}")


def _component(value: Any, kind: str, key: str, default: Any, default_name: str | None) -> Any:
    """Build one registered component (objective, likelihood or credit entry) from its YAML section.

    ``value`` is a mapping ``{name: ..., **fields}`` or a bare name. A missing ``name`` keeps
    ``default``'s (or ``default_name``); fields left out keep ``default``'s values when the name is
    unchanged, else the component's own defaults.
    """
    reg = _registry(kind)
    if isinstance(value, str):
        value = {"name": value}
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a mapping {{name: ..., ...}} or a {kind} name, got {value!r}")
    params = dict(value)
    for k in params:
        if f"{key}.{k}" in MOVED:
            raise ConfigError(f"{key}.{k} has moved to {MOVED[key + '.' + k]}")
    name = params.pop("name", None)
    default_named = reg.name_of(default) if default is not None else default_name
    if name is None or name == "":
        name = default_named
    if name is None:
        raise ConfigError(f"{key}.name: missing; valid {kind}s: {', '.join(reg.names())}")
    if name not in reg:
        valid = ", ".join(reg.names()) or "none registered (a plugin registers its own: `plugins: [my_module]`)"
        raise ConfigError(f"{key}.name: unknown {kind} {name!r}; valid: {valid}")
    cls = reg.get(name)
    fields = _field_types(cls)
    unknown = [k for k in params if k not in fields]
    if unknown:
        k = unknown[0]
        err = _unknown_key_error(f"{key}.{k}", f"{key.split('[')[0]}.{name}.{k}", fields, key)
        if f"{key.split('[')[0]}.{name}.{k}" not in REMOVED:
            owners = [n for n in reg.names() if n != name and k in _field_types(reg.get(n))]
            if owners:
                err = ConfigError(f"{err}. {k} is a field of {', '.join(owners)}, not of {name}: to switch {key} to "
                                  f"{name}, replace the whole section, e.g. --set {key.split('[')[0]}='"
                                  f"{{name: {name}}}'" + (" (a list of entries)" if "[" in key else "")
                                  + " or a YAML section holding only its fields")
        raise err
    base = default if (default is not None and name == default_named) else None
    return _build(cls, params, key + ".", base)


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
    if typ is list:
        if isinstance(value, str):
            return [value] if value else []
        if value is None:
            return []
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
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
        raise _unknown_key_error(prefix + unknown[0], prefix + unknown[0], types, prefix.rstrip(".") or "the top level")
    defaults = defaults if defaults is not None else cls()
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, typ in types.items():
        kind = meta[name].get("component")
        if kind is None:
            raw = _resolve_path(data[name], meta[name]["path"]) if name in data and "path" in meta[name] else \
                data.get(name)
            kwargs[name] = (_coerce(raw, typ, prefix + name, getattr(defaults, name)) if name in data
                            else getattr(defaults, name))
            if isinstance(kwargs[name], list):
                kwargs[name] = [str(v) if isinstance(v, str) else v for v in kwargs[name]]
            elif isinstance(kwargs[name], _FromFile):
                kwargs[name] = str(kwargs[name])
        elif meta[name].get("many"):
            items = data.get(name, getattr(defaults, name)) or []
            if not isinstance(items, (list, tuple)):
                raise ConfigError(f"{prefix}{name}: expected a list of {{name: ..., ...}} entries, got {items!r}")
            kwargs[name] = [v if not isinstance(v, (Mapping, str)) else
                            _component(v, kind, f"{prefix}{name}[{i}]", None, None) for i, v in enumerate(items)]
        elif name == "likelihood" and "objective" in kwargs:
            # the objective's own estimator unless named; fields kept when the name is unchanged
            own = kwargs["objective"].default_likelihood
            current = getattr(defaults, name)
            keep = current if current is not None and _registry(kind).name_of(current) == own \
                else own_likelihood(kwargs["objective"])
            kwargs[name] = _component(data.get(name), kind, prefix + name, keep, own) if name in data else keep
        else:
            kwargs[name] = (_component(data[name], kind, prefix + name, getattr(defaults, name), None)
                            if name in data else getattr(defaults, name))
    try:
        return cls(**kwargs)
    except ValueError as e:  # a section's own validation (e.g. SamplerConfig's divisibility checks)
        field_name = next((f for f in sorted(types, key=len, reverse=True) if str(e).startswith(f)), None)
        where = prefix + field_name if field_name else (prefix.rstrip(".") or "config")
        raise ConfigError(f"{where}: {e}") from None


def _merge(base: dict, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _key_type(parts: Sequence[str], root: type) -> Any:
    """Declared type of the dotted key ``parts`` under the dataclass ``root``; ``None`` when unknown."""
    typ: Any = root
    for p in parts:
        if not dataclasses.is_dataclass(typ):
            return None
        typ = _field_types(typ).get(p)
    return typ


def _override_parts(key: str) -> list[str]:
    """``"credit[0].lam"`` / ``"credit.0.lam"`` -> ``["credit", "0", "lam"]``."""
    return [p for p in re.sub(r"\[(\d+)\]", r".\1", key.strip()).split(".") if p != ""]


def _parse_override(item: str, root: type | None = None) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    key, raw = item.split("=", 1)
    parts = _override_parts(key)
    if not parts:
        raise ConfigError(f"override {item!r} has no key before '='")
    is_str = _key_type(parts, root or RunConfig) is str
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        if not is_str:
            first = str(e).strip().splitlines()[0]
            raise ConfigError(f"{key.strip()}: the value {raw!r} is not valid YAML ({first}); quote it, "
                              f"e.g. --set '{key.strip()}=\"...\"'") from None
        value = raw
    if is_str and not isinstance(value, str):
        value = raw  # "{puzzle}" would be a YAML mapping, "true" a bool: keep the text
    return parts, value


def parse_override(item: str, root: type | None = None) -> dict:
    """``"a.b=3"`` -> ``{"a": {"b": 3}}``; the value is parsed as YAML (``true``, ``1e-5``, ``[1,2]``,
    a flow mapping ``{name: wd1}``).

    For a key whose declared type under ``root`` (default :class:`RunConfig`) is ``str``, the text after
    ``=`` is the value as typed (``task.prompt_template={puzzle}=`` is the string ``{puzzle}=``, not
    YAML); only a YAML-quoted string (``'"a b"'``) is unquoted. ``credit[0].lam`` is ``credit.0.lam``.

    Raises:
        ConfigError: when the item has no ``=``, or a non-string value is not valid YAML (naming the key).
    """
    parts, value = _parse_override(item, root)
    out: dict = {}
    cur = out
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def apply_override(data: dict, item: str) -> dict:
    """``data`` (a merged YAML mapping) with the override ``key.sub=value`` applied: the value
    *replaces* what is at ``key.sub`` (a mapping value such as ``objective={name: wd1}`` replaces the
    whole section, whose other keys then take their defaults), while the rest of ``data`` is kept.
    A number in the key indexes a list (``credit.0.lam=0.3``, ``credit[0].lam=0.3``); a component
    given by its bare name (``objective: wd1``) is read as ``{name: wd1}`` when a key below it is set.

    Raises:
        ConfigError: as :func:`parse_override`, or for an index into a list that has no such entry.
    """
    parts, value = _parse_override(item)
    out = copy.deepcopy(data)
    cur: Any = out
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[:i + 1])
        if isinstance(cur, list):
            if not p.isdigit() or int(p) >= len(cur):
                raise ConfigError(f"{where}: {'.'.join(parts[:i]) or 'the list'} has {len(cur)} entries "
                                  f"(indices 0-{len(cur) - 1}); set the whole list, e.g. --set "
                                  f"{'.'.join(parts[:i])}='[{{name: ...}}]'")
            p = int(p)
        elif not isinstance(cur, dict):
            raise ConfigError(f"{where}: {'.'.join(parts[:i])} is {cur!r}, not a section")
        if last:
            cur[p] = value
            break
        nxt = cur[p] if isinstance(cur, list) else cur.get(p)
        if nxt is None:
            nxt = {}
        elif isinstance(nxt, str):
            nxt = {"name": nxt}
        cur[p] = nxt
        cur = nxt
    return out


def load_config(paths: Sequence[str | Path] = (), overrides: Sequence[str] = (),
                plugins: Sequence[str] = ()) -> RunConfig:
    """Build a :class:`RunConfig` from YAML files (later ones win) and ``key=value`` overrides.

    The ``plugins`` list of the result (modules imported before the config is built, see
    :func:`load_plugins`) is the YAML's followed by ``plugins`` (the command line's ``--plugin``).

    Relative input paths in a YAML file are read from that file's folder, those of overrides from the
    working directory (see :class:`RunConfig`).

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
        data = _merge(data, _mark(loaded, Path(p).parent))
    for item in overrides:
        data = apply_override(data, item)
    data["plugins"] = [str(v) for v in _resolve_path(_coerce(data.get("plugins", []), list, "plugins"), "module")]
    data["plugins"] += list(plugins)
    load_plugins(data["plugins"])
    cfg = _build(RunConfig, data)
    _check_ranges(cfg)
    return cfg


def load_plugins(specs: Sequence[str]) -> list:
    """Import user modules so that their registrations (objectives, likelihoods, credit modules,
    tasks) exist before the config is built. A spec is a dotted module name (importable from
    ``sys.path``) or a path to a ``.py`` file. Importing is idempotent.

    Returns:
        The imported modules.

    Raises:
        ConfigError: naming the plugin (``plugins[i]``) when it cannot be imported.
    """
    import hashlib
    import importlib
    import importlib.util
    import sys

    modules = []
    for i, spec in enumerate(specs):
        try:
            if spec.endswith(".py") or "/" in spec or "\\" in spec:
                path = Path(spec).expanduser().resolve()
                if not path.is_file():
                    raise FileNotFoundError(f"no such file {path}")
                name = "maskrl_plugin_" + path.stem + "_" + hashlib.sha1(str(path).encode()).hexdigest()[:8]
                if name not in sys.modules:
                    mod_spec = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(mod_spec)
                    sys.modules[name] = module
                    try:
                        mod_spec.loader.exec_module(module)
                    except BaseException:
                        del sys.modules[name]
                        raise
                modules.append(sys.modules[name])
            else:
                modules.append(importlib.import_module(spec))
        except Exception as e:  # noqa: BLE001 - any import failure is the plugin's, named here
            raise ConfigError(f"plugins[{i}]: cannot import {spec!r} ({type(e).__name__}: {e})") from None
    return modules


#: built-in tokenizers of the tiny model (``model.tiny.tokenizer``)
TINY_TOKENIZERS = ("char", "wordmath_bpe")

#: dotted keys that must be > 0 (``>= 0`` for those in ``_NON_NEGATIVE``)
_POSITIVE = ("model.tiny.hidden_size", "model.tiny.num_layers", "model.tiny.num_heads", "model.tiny.intermediate_size",
             "task.train_size", "sft.batch_size", "sft.lr", "train.prompts_per_step", "train.group_size",
             "train.inner_iterations", "train.lr")
_NON_NEGATIVE = ("model.lora_rank", "sft.steps", "sft.warmup_steps", "sft.weight_decay", "sft.max_grad_norm",
                 "train.steps", "train.micro_batch_size", "train.weight_decay", "train.max_grad_norm",
                 "train.warmup_steps", "train.eval_every", "train.save_every", "task.eval_limit", "train.max_forward_rows",
                 "train.eval_limit")


#: settings that leave every gradient zero or undefined: dotted key -> (smallest valid value, why)
_MEANINGLESS = {
    "train.group_size": (2, "the advantages are relative to each prompt's group (SPEC §1.3): with one completion "
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
                          "a prompt identical, so every group-relative advantage (SPEC §1.3) and every gradient is 0; "
                          "sample the rollouts (e.g. rollout.temperature: 0.9) or use rollout.remasking: random")
    for key in _POSITIVE:
        if get(key) <= 0:
            raise ConfigError(f"{key}: must be > 0, got {get(key)!r}")
    for key in _NON_NEGATIVE:
        if get(key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {get(key)!r}")
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
    if cfg.task.name != "file" and cfg.task.file != FileTaskConfig():
        raise ConfigError(f"task.file: only read by task.name: file (this run's task is {cfg.task.name!r}); remove it")
    _check_observer_logits(cfg)
    t = cfg.model.tiny
    from pathlib import Path

    if t.tokenizer not in TINY_TOKENIZERS and not (Path(t.tokenizer) / "tokenizer.json").is_file():
        raise ConfigError(f"model.tiny.tokenizer: {t.tokenizer!r} is neither one of {', '.join(TINY_TOKENIZERS)} nor a "
                          f"folder with a tokenizer.json")
    if t.hidden_size % t.num_heads:
        raise ConfigError(f"model.tiny.hidden_size ({t.hidden_size}) must be a multiple of "
                          f"model.tiny.num_heads ({t.num_heads})")


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
    if r.cache == "none" or r.observer_logits != "refuse":
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


def to_dict(cfg: Any) -> dict:
    """Plain data of a config (YAML/JSON-able); components as ``{name: ..., **fields}``, so that
    ``load_config`` of the result rebuilds the same config."""
    if not dataclasses.is_dataclass(cfg):
        return cfg
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        kind = f.metadata.get("component")
        if kind is not None:
            reg = _registry(kind)
            one = lambda c: {"name": reg.name_of(c), **dataclasses.asdict(c)}  # noqa: E731
            out[f.name] = [one(c) for c in v] if f.metadata.get("many") else one(v)
        elif dataclasses.is_dataclass(v):
            out[f.name] = to_dict(v)
        else:
            out[f.name] = list(v) if isinstance(v, list) else v
    return out


_SECTIONS = {"model": ModelConfig, "model.tiny": TinyModelConfig, "task": TaskConfig,
             "task.file": FileTaskConfig, "rollout": SamplerConfig,
             "eval": SamplerConfig, "sft": SFTConfig, "train": TrainConfig}


def field_docs(cls: type) -> dict[str, str]:
    """Field descriptions from the ``Attributes:`` section of ``cls``'s docstring (Google style)."""
    import inspect

    doc = inspect.getdoc(cls) or ""
    out: dict[str, str] = {}
    in_attrs, current = False, None
    for line in doc.splitlines():
        if line.strip() == "Attributes:":
            in_attrs = True
            continue
        if not in_attrs:
            continue
        if line and not line.startswith(" "):  # next section
            break
        stripped = line.strip()
        head, sep, rest = stripped.partition(":")
        if line.startswith("    ") and not line.startswith("     ") and sep and head.isidentifier():
            current = head
            out[current] = rest.strip()
        elif current and stripped:
            out[current] += " " + stripped
    return out


def _explain_class(cls: type, title: str) -> list[str]:
    docs = field_docs(cls)
    lines = [title]
    default = cls()
    for f in dataclasses.fields(cls):
        value = getattr(default, f.name)
        shown = to_dict(value) if dataclasses.is_dataclass(value) and f.name not in ("tiny", "file") else value
        if f.name in ("tiny", "file"):
            shown = f"(section {'model' if f.name == 'tiny' else 'task'}.{f.name})"
        lines.append(f"  {f.name} = {shown!r}")
        lines.append(f"      {docs.get(f.name, '(undocumented)')}")
    return lines


def explain(section: str) -> str:
    """Text listing each field of a config section with its default and description (``maskrl config
    --explain SECTION``). Sections: ``model``, ``model.tiny``, ``task``, ``rollout``, ``eval``, ``sft``,
    ``train``, and the components ``objective``, ``likelihood``, ``credit`` (every registered entry;
    ``objective.NAME`` for one, user plug-ins' included). One field: ``train.lr``,
    ``credit.dispo.z``, ``objective.diffu_grpo.clip_eps``.

    Raises:
        ConfigError: on an unknown section, component or field, listing the valid ones.
    """
    import inspect

    if section in _SECTIONS:
        return "\n".join(_explain_class(_SECTIONS[section], f"[{section}]"))
    head, _, field_name = section.rpartition(".")
    if head in _SECTIONS:
        return _explain_field(_SECTIONS[head], head, field_name)
    kind, _, rest = section.partition(".")
    if kind in ("objective", "likelihood", "credit"):
        reg = _registry(kind)
        name, _, field_name = rest.partition(".")
        names = [name] if name else reg.names()
        out = []
        for n in names:
            if n not in reg:
                raise ConfigError(f"{kind}.{n}: unknown {kind}; valid: {', '.join(reg.names())}")
            cls = reg.get(n)
            if field_name:
                return _explain_field(cls, f"{kind}.{n}", field_name)
            summary = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
            out += _explain_class(cls, f"[{kind}] name: {n}\n  {summary}")
            if kind == "objective":  # what an absent `likelihood:` section (or one naming it) starts from
                lik = own_likelihood(cls())
                fields = "".join(f", {k}: {v!r}" for k, v in dataclasses.asdict(lik).items())
                out.append(f"  (default likelihood: {{name: {cls.default_likelihood}{fields}}})")
            out.append("")
        return "\n".join(out).rstrip() or f"(no {kind} registered)"
    valid = sorted(_SECTIONS) + ["objective", "likelihood", "credit"]
    raise ConfigError(f"unknown section {section!r}; valid: {', '.join(valid)} (or SECTION.FIELD, "
                      "e.g. train.lr, credit.dispo.z)")


def _explain_field(cls: type, where: str, name: str) -> str:
    """One field of ``cls`` (named ``where.name``): its default and description; a removed field says why."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        if f"{where}.{name}" in REMOVED:
            raise ConfigError(f"{where}.{name}: {REMOVED[where + '.' + name]}")
        raise ConfigError(f"{where}.{name}: unknown field; valid: {', '.join(sorted(fields))}")
    lines = _explain_class(cls, f"[{where}]")
    i = lines.index(next(line for line in lines if line.startswith(f"  {name} = ")))
    return "\n".join([f"[{where}]"] + lines[i:i + 2])
