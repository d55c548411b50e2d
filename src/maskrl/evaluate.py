"""Evaluation on the same sampler as training (docs/spec.md §5: greedy, one sample per problem), and the
benchmark harness behind ``maskrl eval`` (:func:`run_harness`; its output folder: :mod:`maskrl.eval_store`)."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from maskrl.eval_store import (SETTINGS_FILE, check_settings, default_eval_dir, read_samples, samples_path,
                               write_lines)
from maskrl.models.adapter import ModelAdapter
from maskrl.models.families import model_block_size, model_decode_rule
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
             generator: torch.Generator | None = None, progress: bool = False, desc: str = "generate",
             empty_id: int | None = None) -> list[str]:
    """Generate one completion per prompt text, in batches (prompts already chat-formatted).

    ``empty_id``: the token a prompt that tokenises to no tokens stands for (see
    :func:`~maskrl.text.encode_prompts`; default: such a prompt raises ``ValueError``)."""
    out: list[str] = []
    starts = range(0, len(prompts), batch_size)
    for s in tqdm(starts, desc=desc, disable=not progress, dynamic_ncols=True):
        ids, mask = encode_prompts(adapter.tokenizer, prompts[s:s + batch_size], empty_id=empty_id)
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
    from maskrl.health import check_rewards

    rewards = check_rewards(task.score_examples(examples, completions), task.name, [ex.id for ex in examples],
                            completions)
    return EvalResult(completions, rewards, task.metrics(examples, completions, rewards))


#: how a result names a task's generated rows and its real test file (others: "rows", the data file)
_TEST_FILE_WORDS = {"sudoku4x4": ("puzzles", "d1's test file"), "countdown": ("problems", "d1's test file")}


def eval_source_note(task: Task, source: str, n: int) -> str | None:
    """The sentence a result must carry when its evaluation rows are not the task's test file.

    Without a data folder, :func:`maskrl.data.eval_examples` evaluates a generating task on generated
    rows (``source`` ``"generated:..."``); numbers on them are not comparable to those on the test
    file (the README's and docs/demo.md's tables). Printed where the result is read (the demo's final
    table, ``summary.json``'s ``eval_note``, the model card).

    Args:
        task: the evaluated task; source: the ``eval_source`` string; n: the number of rows evaluated.

    Returns:
        ``"evaluated on N generated <rows>, not <the test file> (<path in the data folder>); get the
        file: see docs/data.md"``, or ``None`` when ``source`` is a file.
    """
    if not source.startswith("generated:"):
        return None
    rows, test_file = _TEST_FILE_WORDS.get(task.name, ("rows", "the task's test file"))
    where = f"{task.data_file} in the data folder" if task.name in _TEST_FILE_WORDS else task.data_file
    return f"evaluated on {n} generated {rows}, not {test_file} ({where}); get the file: see docs/data.md"


# ----------------------------------------------------------------------------------------------
# the benchmark harness: ``maskrl eval`` (docs/spec.md §5)
# ----------------------------------------------------------------------------------------------
#: docs/spec.md §5 evaluation lengths and block size
DEFAULT_GEN_LENGTHS = (128, 256, 512)
DEFAULT_BLOCK_LENGTH = 32


def parse_gen_lengths(gen_lengths: str | int | Sequence[int]) -> list[int]:
    """Completion lengths from ``"128,256,512"``, an int or a sequence of ints.

    Raises:
        ValueError: naming ``gen_lengths`` (``--gen-length``) for an empty list, a non-integer,
            a non-positive or a repeated length.
    """
    what = f"gen_lengths (--gen-length) {gen_lengths!r}"
    if isinstance(gen_lengths, str):
        parts = [p.strip() for p in gen_lengths.split(",")]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"{what}: expected comma-separated integers such as '128,256,512'") from None
    elif isinstance(gen_lengths, int) and not isinstance(gen_lengths, bool):
        values = [gen_lengths]
    else:
        values = list(gen_lengths)
        if any(not isinstance(v, int) or isinstance(v, bool) for v in values):
            raise ValueError(f"{what}: every length must be an integer")
    if not values:
        raise ValueError(f"{what}: no lengths given")
    if any(v <= 0 for v in values):
        raise ValueError(f"{what}: lengths must be positive")
    if len(set(values)) != len(values):
        raise ValueError(f"{what}: a length is repeated")
    return values


#: the ``maskrl eval`` flag of each setting of :func:`resolve_prompt_settings`
SETTING_FLAGS = {"gen_lengths": "--gen-length", "block_length": "--block-length", "steps": "--steps",
                 "prompt_template": "--prompt-template", "chat_template": "--chat-template"}


def setting_origin(used: dict[str, dict], name: str) -> str:
    """Where an evaluation setting came from, for messages (``used``: :func:`resolve_prompt_settings`):
    its flag (``"--gen-length"``), ``"prompt card"`` or ``"default"``."""
    return {"flag": SETTING_FLAGS.get(name, name), "model card": "prompt card"}.get(used[name]["from"], "default")


def _length_origin(used: dict[str, dict], largest: int) -> str:
    """A sentence saying where the evaluation's largest ``gen_length`` came from (for a length error)."""
    d, card = used["gen_lengths"], used["card"]["value"]
    if d["from"] == "flag":
        return f"gen_length {largest} was given with --gen-length"
    if d["from"] == "model card":
        return f"gen_length {largest} comes from the prompt card {card}; choose lengths with --gen-length"
    why = "the model has no prompt card" if card == "none" else f"prompt card: {card}"
    lengths = ",".join(str(L) for L in d["value"])
    return (f"gen_length {largest} is the largest of the default lengths {lengths} (no --gen-length was given; "
            f"{why}); choose lengths with --gen-length")


#: the sampler fields an evaluation takes from the prompt card besides the lengths: the decoding rule
#: (Dream's schedule, remasking, top-k, ...); greedy (τ 0) always
RULE_FIELDS = tuple(f.name for f in dataclasses.fields(SamplerConfig)
                    if f.name not in ("gen_length", "block_length", "steps", "temperature"))


def harness_samplers(gen_lengths: str | int | Sequence[int] = DEFAULT_GEN_LENGTHS,
                     block_length: int = DEFAULT_BLOCK_LENGTH, steps: int = 0,
                     used: dict[str, dict] | None = None) -> dict[int, SamplerConfig]:
    """The evaluation sampler of each completion length (docs/spec.md §5): greedy (τ = 0), block
    ``block_length``, ``steps`` denoising steps (0: ``L/2``), and the decoding rule of the prompt card
    (``used["rule"]``: the model's own, e.g. Dream's ``schedule: dream``, ``remasking: entropy``,
    ``top_k: 50``), else LLaDA's: fixed schedule, low-confidence remasking. A block model: steps 0 = ``L`` (SDAR's).

    Args:
        gen_lengths, block_length, steps: the settings.
        used: :func:`resolve_prompt_settings`'s record of where each came from, named in the error
            (default: each is taken to be its flag's), and the card's rule.

    Returns:
        ``{L: SamplerConfig}`` in the order given.

    Raises:
        ValueError: before any model is loaded, naming each value and where it came from (its
            ``maskrl eval`` flag, the prompt card or the default) when ``L`` is not a multiple of
            ``block_length`` or the steps are not a positive multiple of ``L/block_length`` (docs/spec.md §1.2).
    """
    def origin(name: str) -> str:
        return setting_origin(used, name) if used is not None else SETTING_FLAGS[name]

    out, block_model = {}, bool((used or {}).get("model_block_size", {}).get("value"))  # {L: sampler}
    for L in parse_gen_lengths(gen_lengths):
        s = steps if steps else (L if block_model else L // 2)
        try:
            rule = (used or {}).get("rule", {}).get("value") or {}  # none: SamplerConfig's (LLaDA's fixed / low_confidence)
            out[L] = SamplerConfig(gen_length=L, block_length=block_length, steps=s, temperature=0.0, **rule)
        except ValueError as e:
            hint = "" if steps else f" (steps defaults to gen_length{'' if block_model else '/2'} = {s}; set it with --steps)"
            card = f"; prompt card: {used['card']['value']}" if used is not None else ""
            raise ValueError(f"gen_length {L} ({origin('gen_lengths')}), block_length {block_length} "
                             f"({origin('block_length')}), steps {s} ({origin('steps')}{card}): {e}{hint}") from None
    return out



def harness_markdown(summary: dict, out_dir: str | os.PathLike | None = None) -> str:
    """``summary.md``: one table row per completion length (same metric cells as ``maskrl score``).

    ``out_dir``: the run's folder; the per-sample files are then named by their path in it
    (``OUT/samples_L{L}.jsonl``, as the user passed ``--out``), not by their bare file name."""
    from maskrl.scoring import METRIC_ALIGN, METRIC_HEADER, metric_cells, source_line

    lines = [f"# {summary['task']}: {summary['model']}", "",
             "| gen length | steps | n " + METRIC_HEADER + " seconds |",
             "| ---: | ---: | ---: " + METRIC_ALIGN + " ---: |"]
    for r in summary["results"]:
        lines.append(f"| {r['gen_length']} | {r['sampler']['steps']} | {r['n']} " + metric_cells(r)
                     + f" {r['seconds']:.1f} |")
    first = summary["results"][0]["sampler"]
    lines += ["", source_line("data", summary["data"]) + f", {summary['n']} of {summary['n_data_rows']} rows",
              f"- sampler: greedy (τ = 0), {first['schedule']} schedule, {first['remasking']} remasking, "
              f"block {first['block_length']}; chat template: {'applied' if summary['chat_template'] else 'none'}; "
              f"{summary['dtype']} on {summary['device']}",
              f"- prompt template {summary['prompt_template']!r}; settings: {describe_settings(summary['settings_used'])}",
              "- samples: " + ", ".join(f"`{Path(out_dir) / r['samples'] if out_dir is not None else r['samples']}`"
                                        for r in summary["results"]),
              "- seconds: generation time of this invocation (resumed rows excluded)", ""]
    return "\n".join(lines)


def resolve_prompt_settings(model, task_name: str, gen_lengths=None, block_length: int | None = None,
                            steps: int | None = None, prompt_template: str | None = None,
                            chat_template: bool | None = None) -> dict[str, dict]:
    """Each prompt / sampler setting of an evaluation and where it comes from: the argument (a flag)
    when it is not ``None``, else the model folder's prompt card (``maskrl_prompt.json``, written when
    the model was trained; used only when it is for ``task_name``), else the default (docs/spec.md §5 lengths
    128,256,512, block 32, steps ``L/2``, the task's own template, chat template on; a block model
    (:func:`model_block_size`): its block size, steps ``L``, its family's rule, :func:`model_decode_rule`).

    Returns:
        ``{name: {"value": v, "from": "flag" | "model card" | "default"}}`` for ``gen_lengths``, ``block_length``,
        ``steps``, ``prompt_template`` (``None`` = the task's default) and ``chat_template``; plus ``"card"``
        (``{"value": path or None, "from": why}``), ``"rule"`` and ``"model_block_size"``.

    Raises:
        ValueError: an unreadable prompt card.
    """
    from maskrl.prompt_card import PROMPT_CARD, read_prompt_card

    card = read_prompt_card(model)
    note = "none"
    if card is not None:
        note = str(Path(model) / PROMPT_CARD)
        if card["task"] != task_name:
            note += f" (for task {card['task']!r}: ignored)"
            card = None
    es = card["eval_sampler"] if card else {}
    out: dict[str, dict] = {"card": {"value": note, "from": "model folder"}}

    def pick(name, flag, from_card, default):
        if flag is not None:
            out[name] = {"value": flag, "from": "flag"}
        elif from_card is not None:
            out[name] = {"value": from_card, "from": "model card"}
        else:
            out[name] = {"value": default, "from": "default"}
        return out[name]["value"]

    lengths = pick("gen_lengths", gen_lengths, [es["gen_length"]] if "gen_length" in es else None,
                   list(DEFAULT_GEN_LENGTHS))
    lengths = out["gen_lengths"]["value"] = parse_gen_lengths(lengths)
    out["model_block_size"] = {"value": (model_block := model_block_size(model)), "from": "model config"}
    block = pick("block_length", block_length, es.get("block_length"), model_block or DEFAULT_BLOCK_LENGTH)
    same = card is not None and parse_gen_lengths(lengths) == [es.get("gen_length")] and block == es.get("block_length")
    pick("steps", steps, es.get("steps") if same else None, 0)
    pick("prompt_template", prompt_template, card["prompt_template"] if card else None, None)
    pick("chat_template", chat_template, card["chat_template"] if card else None, True)
    rule = {k: es[k] for k in RULE_FIELDS if k in es}
    out["rule"] = ({"value": rule, "from": "model card"} if rule else {"value": model_decode_rule(model),
                   "from": "default (block model)"} if model_block else {"value": {}, "from": "default"})
    return out


def describe_settings(used: dict[str, dict]) -> str:
    """One line saying which prompt and sampler settings an evaluation used and where each came from."""
    parts = []
    for name, d in used.items():
        if name in ("card", "model_block_size"):
            continue
        v = d["value"]
        if name == "prompt_template" and v is None:
            v = "the task's default"
        elif name == "steps" and v == 0:
            v = "gen_length" if used.get("model_block_size", {}).get("value") else "gen_length/2"
        elif name == "chat_template":
            v = "on" if v else "off"
        elif name == "prompt_template":
            v = repr(v)
        elif name == "rule":
            default = SamplerConfig(gen_length=32, block_length=32, steps=16)
            v = ", ".join(f"{k} {x}" for k, x in v.items() if getattr(default, k) != x) or "fixed, low_confidence"
            name = "decoding rule"
        parts.append(f"{name} {v} ({d['from']})")
    return "; ".join(parts) + f"; prompt card: {used['card']['value']}"


def run_harness(model: str | os.PathLike | ModelAdapter, task_name: str, gen_lengths: str | int | Sequence[int]
                | None = None, limit: int | None = 0, out_dir: str | os.PathLike | None = None,
                data_path: str | os.PathLike | None = None, block_length: int | None = None,
                steps: int | None = None, batch_size: int = 16, resume: bool = False, device: str = "auto",
                dtype: str = "float32", chat_template: bool | None = None, progress: bool = True,
                prompt_template: str | None = None, overwrite: bool = False, rule: dict | None = None) -> dict:
    """Benchmark a model on a task at several completion lengths: the body of ``maskrl eval`` (docs/spec.md §5).

    For each length ``L``: greedy decoding (τ = 0) with the training sampler
    (:func:`maskrl.sampling.generate` through :func:`complete`), ``steps`` (default ``L/2``) denoising
    steps, blocks of ``block_length``, one sample per data row, ``batch_size`` rows per forward batch;
    prompts go through the model's chat template when its tokenizer has one (and ``chat_template``).

    Writes ``samples_L{L}.jsonl`` (one line per row, flushed after every batch), ``settings.json``,
    ``summary.json`` and ``summary.md`` into ``out_dir`` (default :func:`default_eval_dir`), holding its
    lock (:func:`maskrl.rundir.run_lock`) meanwhile; :mod:`maskrl.eval_store` describes each file.

    Settings left ``None`` (``gen_lengths``, ``block_length``, ``steps``, ``prompt_template``,
    ``chat_template``) come from the model folder's prompt card when it has one for this task (how the
    model was trained: :func:`maskrl.pipeline.save_prompt_card`), else the defaults; see
    :func:`resolve_prompt_settings`. What was used, and from where, is in ``summary["settings_used"]``
    and in ``summary.md``.

    Args:
        model: model folder or Hub id (loaded with :func:`maskrl.models.load`), a training run folder
            (its exported ``model/``, :func:`maskrl.rundir.run_model_folder`), or a loaded adapter.
        task_name: registered task name (``maskrl.tasks.TASKS``).
        gen_lengths: completion lengths in tokens, ``"128,256,512"`` or a sequence of ints.
        limit: evaluate the first ``limit`` data rows only (``0``/``None``: all).
        out_dir: output folder.
        data_path: the task's data file or a data dir holding it (default: the shared data dir).
        block_length: block size ``b`` in tokens; every ``L`` must be a multiple of it.
        steps: denoising steps per completion (``0``: ``L/2``); a multiple of ``L/b``.
        rule: the decoding rule (:data:`RULE_FIELDS`, e.g. ``{"schedule": "dream", "top_k": 50}``); ``None``:
            the prompt card's, else LLaDA's fixed / low-confidence (an adapter has no card: pass it here).
        batch_size: rows per sampler batch.
        resume: keep the rows already in ``samples_L{L}.jsonl`` (matched by id) and generate only
            the others. Without it, finished samples of this evaluation in ``out_dir`` are refused
            (naming the files), never discarded silently. Either way, a folder holding an
            evaluation of other weights or settings is refused (see ``overwrite``).
        overwrite: remove an earlier evaluation from ``out_dir`` (of these or other weights and
            settings) and start afresh instead of refusing it.
        device: ``"auto"`` (cuda if available), ``"cpu"``, ``"cuda:0"``, ...; ignored for an adapter.
        dtype: parameter dtype name (``"float32"``, ``"bfloat16"``); ignored for an adapter.
        chat_template: apply the tokenizer's chat template when it has one.
        prompt_template: replaces the task's prompt template (e.g. ``"{puzzle}="`` for the tiny
            character model); must contain the task's placeholders.
        progress: show a tqdm bar of rows done per length.

    Returns:
        The summary written to ``summary.json`` plus ``"markdown"`` (the text of ``summary.md``).

    Raises:
        ValueError: bad ``gen_lengths`` / ``block_length`` / ``steps`` (checked before the model is
            loaded; each value named with where it came from), non-positive ``batch_size``, negative
            ``limit``, a model without a tokenizer, prompts that do not fit the model with the
            largest length, stored samples of other weights or settings (without ``overwrite``),
            finished samples of this evaluation (without ``resume`` or ``overwrite``), or (with
            ``resume``) stored samples that do not belong to this evaluation.
        maskrl.rundir.RunDirError: another process is writing ``out_dir``.
        KeyError: unknown task (listing the valid ones).
        FileNotFoundError: missing model or data file, or a run folder that exported no model yet.
    """
    from maskrl.files import write_json
    from maskrl.rundir import run_lock, run_model_folder

    t_start = time.time()
    model = run_model_folder(model, "--model")  # a run folder: its model/ (adapters pass through)
    h = _prepare_harness(model, task_name, gen_lengths, limit, data_path, block_length, steps, batch_size, device,
                         dtype, chat_template, prompt_template, rule)
    out = Path(out_dir) if out_dir is not None else default_eval_dir(h.task.name, h.settings)
    with run_lock(out, "maskrl eval"):
        check_settings(out, h.settings, resume, overwrite, list(h.samplers))
        write_json(out / SETTINGS_FILE, h.settings)
        results = _evaluate_lengths(h, out, resume, batch_size, progress)
        summary = _harness_summary(h, out, results, limit, batch_size, time.time() - t_start)
        write_json(out / "summary.json", summary)
        markdown = harness_markdown(summary, out)
        (out / "summary.md").write_text(markdown, encoding="utf-8")
    return {**summary, "markdown": markdown}


# ----------------------------------------------------------------------------------------------
# the stages of run_harness, in the order it runs them (each raises what run_harness documents)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Harness:
    """What :func:`run_harness` has checked and loaded before it takes the output folder's lock."""

    used: dict[str, dict]  # resolve_prompt_settings: each setting's value and origin
    samplers: dict[int, SamplerConfig]  # {L: sampler} in the order given
    task: Task
    data_file: Path
    n_data_rows: int  # rows in the data file (before limit)
    examples: list[Example]  # the rows evaluated
    adapter: ModelAdapter
    model_name: str
    templated: bool  # the chat template is applied
    prompts: dict[int, str]  # {row id: model input text}
    settings: dict  # settings.json
    data_src: dict  # maskrl.scoring.file_source of data_file


def _prepare_harness(model, task_name: str, gen_lengths, limit, data_path, block_length, steps, batch_size,
                     device: str, dtype: str, chat_template, prompt_template, rule=None) -> _Harness:
    """Resolve the settings (prompt card, defaults), check every argument, load the task's rows and the
    model and encode the prompts, in this order, so a bad setting is refused before the model loads.
    Raises what :func:`run_harness` documents (all but the output folder's errors)."""
    used = resolve_prompt_settings(model, task_name, gen_lengths, block_length, steps, prompt_template, chat_template)
    if rule is not None:
        unknown = sorted(set(rule) - set(RULE_FIELDS))
        if unknown:
            raise ValueError(f"rule: {', '.join(unknown)} are not decoding-rule fields ({', '.join(RULE_FIELDS)})")
        used["rule"] = {"value": dict(rule), "from": "argument"}
    samplers = harness_samplers(used["gen_lengths"]["value"], used["block_length"]["value"], used["steps"]["value"],
                                used)
    _check_harness_args(model, dtype, batch_size, limit)
    task, data_file, all_examples, examples = _harness_examples(model, task_name, used["prompt_template"]["value"],
                                                                data_path, limit)
    adapter, model_name = _harness_adapter(model, dtype, device)
    templated, prompts = _harness_prompts(adapter, model_name, examples, used["chat_template"]["value"], samplers,
                                          used, data_file)
    if used["chat_template"]["value"] and not templated:  # one truth: asked for, but there is no template
        used["chat_template"] = {"value": False, "from": f"{used['chat_template']['from']} on, but the tokenizer "
                                                          "has no chat template"}
    settings, data_src = _harness_settings(model, adapter, model_name, task, data_file, used, templated)
    return _Harness(used, samplers, task, data_file, len(all_examples), examples, adapter, model_name, templated,
                    prompts, settings, data_src)


def _check_harness_args(model, dtype: str, batch_size, limit) -> None:
    """Refuse a bad ``dtype`` (for a model still to load), ``batch_size`` or ``limit`` before anything is
    loaded; each error names its CLI flag.

    Raises:
        ValueError: unknown dtype name, non-positive ``batch_size``, negative or non-integer ``limit``.
    """
    from maskrl.models.loading import parse_dtype

    if not isinstance(model, ModelAdapter):
        try:
            parse_dtype(dtype)
        except ValueError as e:
            raise ValueError(f"--dtype: {e}") from None
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size (--batch-size) must be a positive integer, got {batch_size!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit (--limit) must be a non-negative integer (0: all rows), got {limit!r}")


def _harness_examples(model, task_name: str, prompt_template: str | None, data_path, limit: int | None
                      ) -> tuple[Task, Path, list[Example], list[Example]]:
    """The task (with the prompt card's task options when the card is for this task) and its data rows.

    Returns:
        ``(task, data file, all rows, the first limit rows (all for 0/None))``.

    Raises:
        KeyError: unknown task. FileNotFoundError: missing data file. ValueError: no rows to evaluate.
    """
    from maskrl.prompt_card import read_prompt_card
    from maskrl.tasks import get_task

    card = read_prompt_card(model) if not isinstance(model, ModelAdapter) else None
    options = card.get("task_options", {}) if card and card["task"] == task_name else {}  # e.g. the file task's
    task = get_task(task_name, prompt_template, **options)
    data_file = task.resolve_path(data_path)
    all_examples = task.load(data_file)
    examples = all_examples[:limit] if limit else all_examples
    if not examples:
        raise ValueError(f"{data_file}: no rows to evaluate")
    return task, data_file, all_examples, examples


def _harness_adapter(model, dtype: str, device: str) -> tuple[ModelAdapter, str]:
    """``(adapter, model name for the summary)``: ``model`` itself when it is an adapter (named by its
    config's ``_name_or_path``), else loaded with :func:`maskrl.models.load` (named by its resolved path,
    or the Hub id).

    Raises:
        FileNotFoundError: missing model.
    """
    from maskrl.devices import resolve_device
    from maskrl.models import load

    if isinstance(model, ModelAdapter):
        return model, str(getattr(model.model.config, "_name_or_path", "") or "in-memory model")
    model_name = str(Path(model).resolve()) if Path(model).exists() else str(model)
    return load(model, dtype=dtype, device=resolve_device(device)), model_name


def _harness_prompts(adapter: ModelAdapter, model_name: str, examples: Sequence[Example], chat_template: bool,
                     samplers: dict[int, SamplerConfig], used: dict[str, dict], data_file: Path
                     ) -> tuple[bool, dict[int, str]]:
    """``(whether the chat template is applied, {row id: model input text})``, checked to fit the model
    with the largest completion length.

    Raises:
        ValueError: a model without a tokenizer; a prompt too long for the largest length (naming the
            row and where that length came from).
    """
    from maskrl.prompts import check_lengths, prompt_formatter

    if adapter.tokenizer is None:
        raise ValueError(f"model {model_name!r} has no tokenizer files; the harness needs one to encode prompts")
    templated = bool(chat_template and getattr(adapter.tokenizer, "chat_template", None))
    fmt = prompt_formatter(adapter, chat_template)
    prompts = {ex.id: fmt(ex.prompt) for ex in examples}
    try:
        check_lengths(adapter, list(prompts.values()), max(samplers), "gen_length",
                      [f"row {i} of {data_file}" for i in prompts])
    except ValueError as e:  # say which gen_length that was and where it came from
        raise ValueError(f"{e}. {_length_origin(used, max(samplers))}") from None
    return templated, prompts


def _harness_settings(model, adapter: ModelAdapter, model_name: str, task: Task, data_file: Path,
                      used: dict[str, dict], templated: bool) -> tuple[dict, dict]:
    """``(settings, data source)``: ``settings`` is what ``settings.json`` holds (the keys
    :data:`maskrl.eval_store.RESUME_KEYS` that ``resume`` checks, plus the model's name); the weights'
    fingerprint is the model folder's when it has one, else the adapter's parameters'; the data source
    is :func:`maskrl.scoring.file_source` of ``data_file``."""
    from maskrl.rundir import weights_fingerprint
    from maskrl.scoring import file_source

    data_src = file_source(data_file)
    weights = (None if isinstance(model, ModelAdapter) else weights_fingerprint(model)) or weights_fingerprint(adapter)
    settings = {"weights_sha256": weights, "model": model_name, "task": task.name, "data_sha256": data_src["sha256"],
                "block_length": used["block_length"]["value"], "steps": used["steps"]["value"],
                "chat_template": templated, "dtype": str(adapter.dtype).removeprefix("torch.")}
    return settings, data_src


def _evaluate_lengths(h: _Harness, out: Path, resume: bool, batch_size: int, progress: bool) -> list[dict]:
    """One result per completion length (:func:`_evaluate_length`), the model in eval mode meanwhile
    (its training flag restored afterwards, also on an error)."""
    results = []
    was_training = h.adapter.model.training
    h.adapter.model.eval()
    try:
        for L, sampler in h.samplers.items():
            results.append(_evaluate_length(h.adapter, h.task, h.examples, h.prompts, L, sampler, out, resume,
                                            batch_size, progress))
    finally:
        h.adapter.model.train(was_training)
    return results


def _evaluate_length(adapter: ModelAdapter, task: Task, examples: Sequence[Example], prompts: dict[int, str],
                     L: int, sampler: SamplerConfig, out: Path, resume: bool, batch_size: int,
                     progress: bool) -> dict[str, Any]:
    """Sample and score every row at completion length ``L`` into ``samples_L{L}.jsonl`` (with
    ``resume``, only the rows not stored yet), then rewrite the file in data order.

    Returns:
        ``{"gen_length", <the task's metrics>, "sampler", "seconds", "generated", "resumed", "samples"}``.
    """
    from maskrl.health import check_rewards

    path = samples_path(out, L)
    done = read_samples(path, prompts, L) if resume else {}
    write_lines(path, [done[ex.id] for ex in examples if ex.id in done])  # drops a truncated tail
    pending = [ex for ex in examples if ex.id not in done]
    t0 = time.time()
    with open(path, "a", encoding="utf-8") as fh, \
            tqdm(total=len(examples), initial=len(examples) - len(pending), unit="row",
                 desc=f"eval {task.name} L={L}", disable=not progress, dynamic_ncols=True) as bar:
        for s in range(0, len(pending), batch_size):
            batch = pending[s:s + batch_size]
            completions = complete(adapter, [prompts[ex.id] for ex in batch], sampler, batch_size=len(batch))
            rewards = check_rewards(task.score_examples(batch, completions), task.name,
                                    [ex.id for ex in batch], completions)
            for ex, c, r in zip(batch, completions, rewards):
                row = {"id": ex.id, "gen_length": L, "prompt": prompts[ex.id], "completion": c,
                       "reward": r, "correct": bool(task.is_correct(r))}
                done[ex.id] = row
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            fh.flush()
            bar.update(len(batch))
    seconds = time.time() - t0
    rows = [done[ex.id] for ex in examples]
    write_lines(path, rows)  # data order, independent of interruptions
    res: dict[str, Any] = {"gen_length": L}
    res.update(task.metrics(examples, [r["completion"] for r in rows], [r["reward"] for r in rows]))
    res.update({"sampler": asdict(sampler), "seconds": seconds, "generated": len(pending),
                "resumed": len(examples) - len(pending), "samples": path.name})
    return res


def _harness_summary(h: _Harness, out: Path, results: list[dict], limit: int | None, batch_size: int,
                     seconds: float) -> dict[str, Any]:
    """What ``summary.json`` holds (see :mod:`maskrl.eval_store`): the run's model, data and settings,
    and ``results``, one entry per completion length; ``seconds`` since the harness started."""
    return {
        "model": h.model_name, "weights_sha256": h.settings["weights_sha256"], "out": str(out),
        "task": h.task.name, "data": h.data_src, "n": len(h.examples), "n_data_rows": h.n_data_rows,
        "limit": limit or None, "chat_template": h.templated, "device": str(h.adapter.device),
        "dtype": h.settings["dtype"], "batch_size": batch_size, "results": results,
        "seconds": seconds, "prompt_template": h.task.prompt_template, "settings_used": h.used,
    }
