"""Building blocks shared by the commands: model, data and prompt formatting from a :class:`RunConfig`."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable, Sequence

import torch

from maskrl.config import RunConfig
from maskrl.models import ModelAdapter, build_tiny
from maskrl.tasks.base import Example, Task, default_data_dir

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; any other device string (``cpu``, ``cuda``,
    ``cuda:1``, ``mps``, ...) is checked to exist here.

    Raises:
        ValueError: naming the string when torch does not know it, or when that device is not
            available on this machine (no CUDA build or GPU, an index beyond the devices present).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"device {name!r} is not a device string (e.g. auto, cpu, cuda, cuda:1, mps): {e}") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            raise ValueError(f"device {name!r} is not available here ({count} CUDA device(s) visible"
                             f"{'' if torch.backends.cuda.is_built() else '; this torch build has no CUDA'}); "
                             "use --device auto or cpu")
        return device
    try:
        torch.empty(1, device=device)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError / AssertionError by backend
        first = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:160]
        raise ValueError(f"device {name!r} is not available here ({type(e).__name__}: {first}); "
                         "use --device auto or cpu") from None
    return device


def tiny_tokenizer(name: str):
    """The tiny model's tokenizer named by ``model.tiny.tokenizer``: ``char`` (None: the model's
    default character tokenizer), ``wordmath_bpe`` or a folder with ``tokenizer.json``.

    Raises:
        ValueError: an unknown name that is not such a folder.
    """
    from pathlib import Path

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
    """The model of a run: ``path`` (or ``cfg.model.path``) loaded with :func:`maskrl.models.load`,
    else a freshly initialised tiny model (cast to ``model.dtype``); then LoRA and gradient checkpointing as configured."""
    from maskrl.models import load

    mc = cfg.model
    path = path or mc.path
    if path:
        adapter = load(path, dtype=mc.dtype)
    else:
        t = mc.tiny
        adapter = build_tiny(hidden_size=t.hidden_size, num_layers=t.num_layers, num_heads=t.num_heads,
                             intermediate_size=t.intermediate_size, seed=t.seed, tokenizer=tiny_tokenizer(t.tokenizer))
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
                             target_modules=modules)
    return adapter


def prompt_formatter(adapter: ModelAdapter, use_chat_template: bool = True) -> Callable[[str], str]:
    """Function turning a task prompt into model input text (chat template when the tokenizer has one)."""
    from maskrl.models import chat_prompt

    if not use_chat_template:
        return lambda s: s
    return lambda s: chat_prompt(adapter.tokenizer, s)


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


def eval_examples(cfg: RunConfig, task: Task) -> tuple[list[Example], str]:
    """The evaluation rows and where they came from (``eval_source``).

    Order: ``task.data_path`` / ``$MASKRL_DATA_DIR`` / ``../shared/data`` (local files); else, for
    tasks that can generate data, a generated held-out set (seed disjoint from training).
    """
    limit = cfg.task.eval_limit or None
    path = cfg.task.data_path or None
    if path is not None or default_data_dir() is not None:
        p = task.resolve_path(path)
        return task.load(p, limit=limit), f"file:{p}"
    if hasattr(task, "generate"):
        n = limit or 500
        log.warning("no local data for %s; evaluating on %d generated held-out rows", task.name, n)
        return task.generate(n, seed=cfg.task.train_seed + 99991), f"generated:seed={cfg.task.train_seed + 99991}"
    raise FileNotFoundError(f"no data for task {task.name!r}: set task.data_path or $MASKRL_DATA_DIR")


def train_examples(cfg: RunConfig, task: Task, held_out: list[Example]) -> list[Example]:
    """Training rows: generated by the task (never a held-out row) when it can, else its train split."""
    if hasattr(task, "generate"):
        return task.generate(cfg.task.train_size, seed=cfg.task.train_seed,
                             exclude=[task.instance_key(ex) for ex in held_out])
    if hasattr(task, "train_split"):
        return task.train_split(cfg.task.data_path or None)[: cfg.task.train_size]
    raise ValueError(f"task {task.name!r} has no training data source (generate() or train_split())")


def write_json(path: str | Path, obj) -> None:
    import json

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")


def task_and_data(cfg: RunConfig) -> tuple[Task, list[Example], str, list[Example]]:
    """The run's task, its evaluation rows, where they came from, and the training rows (never an
    evaluation row) -- what every command starts from."""
    from maskrl.tasks import get_task

    options = dataclasses.asdict(cfg.task.file) if cfg.task.name == "file" else {}  # maskrl.tasks.file_task
    task = get_task(cfg.task.name, cfg.task.prompt_template or None,
                    require_final_answer=cfg.task.require_final_answer, **options)
    held_out, source = eval_examples(cfg, task)
    return task, held_out, source, train_examples(cfg, task, held_out)


def sft_from_config(cfg: RunConfig, adapter: ModelAdapter, task: Task, train: list[Example],
                    progress: bool = True) -> list[dict]:
    """:func:`maskrl.sft.run_sft` with the run's ``sft`` section, completion length and prompt format."""
    from maskrl.sft import run_sft

    sc = cfg.sft
    return run_sft(adapter, train, task.target, gen_length=cfg.rollout.gen_length, steps=sc.steps,
                   batch_size=sc.batch_size, lr=sc.lr, warmup_steps=sc.warmup_steps, weight_decay=sc.weight_decay,
                   max_grad_norm=sc.max_grad_norm, seed=sc.seed, log_every=sc.log_every,
                   prompt_fn=prompt_formatter(adapter, cfg.model.chat_template), progress=progress)


#: the file in a saved model folder that records how the model was trained to be prompted and evaluated
PROMPT_CARD = "maskrl_prompt.json"


def save_prompt_card(folder: str | Path, task: Task, chat_template: bool, eval_sampler) -> Path:
    """Write ``folder/maskrl_prompt.json``: the task, its prompt template as used in training, whether the
    chat template was applied, and the evaluation sampler (a :class:`~maskrl.sampling.SamplerConfig`).

    ``maskrl eval`` and ``maskrl generate`` read it (:func:`read_prompt_card`) and use it unless a flag
    says otherwise, so a saved model is evaluated the way it was trained (issue 13 item 8).
    """
    import dataclasses

    path = Path(folder) / PROMPT_CARD
    card = {"task": task.name, "prompt_template": task.prompt_template, "chat_template": bool(chat_template),
            "eval_sampler": dataclasses.asdict(eval_sampler)}
    options = getattr(task, "card_options", None)  # a task built from user options (the file task)
    if options is not None:
        card["task_options"] = options()
    write_json(path, card)
    return path


def read_prompt_card(model) -> dict | None:
    """The :data:`PROMPT_CARD` of a model folder, or ``None`` (no such file, a Hub id, an in-memory model).

    Raises:
        ValueError: the file exists but is not a JSON object with the keys :func:`save_prompt_card` writes.
    """
    import json

    if not isinstance(model, (str, Path)):
        return None
    path = Path(model) / PROMPT_CARD
    if not path.is_file():
        return None
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e})") from None
    need = ("task", "prompt_template", "chat_template", "eval_sampler")
    if not isinstance(card, dict) or any(k not in card for k in need) or not isinstance(card["eval_sampler"], dict):
        raise ValueError(f"{path}: expected an object with keys {', '.join(need)}")
    return card


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


#: rows generated for ``train.eval_every`` when ``train.eval_limit`` is 0, and their seed offset
VALIDATION_ROWS, VALIDATION_SEED_OFFSET = 200, 55541


def validation_examples(cfg: RunConfig, task: Task, held_out: list[Example]) -> tuple[list[Example], str]:
    """The validation rows of ``train.eval_every`` and where they came from; never the test file by default.

    Order: ``train.eval_data`` (a file or data folder, read by the task's loader), else the task's
    ``validation_split()``, else ``task.generate`` with seed ``task.train_seed + 55541`` excluding
    every held-out (test) row. ``train.eval_limit`` caps the rows (generated: 200 when 0).

    Raises:
        ConfigError: the task has neither a validation split nor a generator and ``train.eval_data``
            is empty (``train.eval_every`` could not take effect).
    """
    from maskrl.config import ConfigError

    limit = cfg.train.eval_limit or None
    if cfg.train.eval_data:
        p = task.resolve_path(cfg.train.eval_data)
        if p.resolve() == _test_file(cfg, task):
            log.warning("train.eval_data %s is the evaluation (test) file: model selection on it is not a "
                        "held-out result", p)
        return task.load(p, limit=limit), f"file:{p}"
    if hasattr(task, "validation_split"):
        return task.validation_split()[:limit], "validation_split"
    if hasattr(task, "generate"):
        seed = cfg.task.train_seed + VALIDATION_SEED_OFFSET
        rows = task.generate(limit or VALIDATION_ROWS, seed=seed, exclude=[task.instance_key(ex) for ex in held_out])
        return rows, f"generated:seed={seed}"
    raise ConfigError(f"train.eval_every={cfg.train.eval_every}: task {task.name!r} has no validation split and "
                      "generates no rows; set train.eval_data to a validation file (not the test file), or "
                      "train.eval_every: 0")


def _test_file(cfg: RunConfig, task: Task) -> Path | None:
    """The resolved evaluation (test) file of the run, or ``None`` when there is none."""
    try:
        return task.resolve_path(cfg.task.data_path or None).resolve()
    except FileNotFoundError:
        return None


def drop_rows(rows: list[Example], task: Task, banned: list[Example]) -> list[Example]:
    """``rows`` without those equal to a ``banned`` row (``task.instance_key`` when the task has one,
    else the prompt text): training rows never include a validation row."""
    key = getattr(task, "instance_key", None) or (lambda ex: ex.prompt)
    out = set(map(key, banned))
    return [ex for ex in rows if key(ex) not in out]


def training_eval_fn(cfg: RunConfig, task: Task, rows: list[Example], prompt_fn: Callable[[str], str],
                     policy: Callable[[], ModelAdapter]) -> Callable[[int], dict]:
    """``step -> metrics`` for :class:`~maskrl.trainer.RLTrainer`'s ``eval_fn``: the ``eval`` sampler
    (SPEC §1.2, greedy by default) on ``rows`` with ``policy()`` (the unwrapped policy), scored by the
    task; numeric metrics only (the trainer logs them as ``eval/<name>``)."""
    from maskrl.evaluate import evaluate_examples

    def evaluate(step: int) -> dict:
        gen = torch.Generator(device=policy().device).manual_seed(cfg.train.seed + step)
        m = evaluate_examples(policy(), task, rows, cfg.eval, batch_size=64, prompt_fn=prompt_fn, generator=gen).metrics
        return {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    return evaluate
