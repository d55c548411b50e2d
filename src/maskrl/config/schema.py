"""The run configuration's schema: one dataclass per YAML section, with its defaults and field docs
(``maskrl config --explain``), and the keys that moved or were removed."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from maskrl.sampling.config import SamplerConfig


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
        block_size: ``null`` (default): full bidirectional attention (LLaDA-style). A positive int: the
            tiny block-diffusion model (SDAR-style: bidirectional inside blocks of this many tokens,
            causal across blocks).
    """

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    seed: int = 0
    tokenizer: str = field(default="char", metadata={"path": "tokenizer"})
    block_size: int | None = None


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
        lora_experts: with ``all-linear``, also put LoRA on the routed experts of an MoE model whose experts
            are linear layers (LLaDA2); default off: attention, dense and shared-expert MLPs only.
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
    lora_experts: bool = False
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
    """The RL loop (``maskrl train``; docs/spec.md §1.5 for μ, G).

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
        seed: seed of prompt order, rollouts, likelihood masks, credit generators and the LoRA
            initialisation (``model.lora_rank`` > 0).
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


def component_registry(kind: str):
    """The registry of a component kind: ``objective``, ``likelihood`` or ``credit`` (imported when first
    asked, so that reading a config imports the built-ins only then)."""
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
        rollout: the RL sampler (docs/spec.md §1.2).
        eval: the evaluation sampler (same code, usually greedy).
        sft: the supervised warm start.
        objective: the base objective, ``{name: diffu_grpo, **its fields}`` (docs/spec.md §1.5).
        likelihood: the estimator of ℓ, ``{name: state, **its fields}`` (docs/spec.md §1.4); absent = the
            objective's own (diffu_grpo: mean_field).
        credit: credit modules applied in order, ``[{name: dps, lam: 0.5}, ...]`` (docs/spec.md §2–§4).
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
    return component_registry("likelihood").get(objective.default_likelihood)(**fields)


#: flat keys of earlier versions -> where they live now
MOVED = {
    "objective.likelihood": "likelihood.name (a section of its own: `likelihood: {name: state, p_mask_prompt: 0.15}`)",
    "objective.p_mask_prompt": "likelihood.p_mask_prompt (`likelihood: {name: mean_field, p_mask_prompt: 0.15}`)",
}


#: keys that existed and were removed: ``section.key`` (components: ``kind.name.key``) -> why, and
#: what to use instead; consulted by the unknown-key errors
REMOVED = {
    "credit.dispo.seed": "removed: DiSPO's branch generator is seeded by the trainer from (train.seed, module, "
                         "step, process), so branching differs across run seeds and survives a resume (a per-module "
                         "seed repeated the same branches across run seeds); set train.seed instead",
}


#: built-in tokenizers of the tiny model (``model.tiny.tokenizer``)
TINY_TOKENIZERS = ("char", "wordmath_bpe")


def field_types(cls: type) -> dict[str, Any]:
    """``field name -> declared type`` of the dataclass ``cls`` (annotations resolved)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}
