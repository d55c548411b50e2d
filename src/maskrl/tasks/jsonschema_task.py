"""JSON-schema following (docs/spec.md §5): JSONSchemaBench subsets (schemas only, no reference outputs).

Reward (training reward = evaluation metric): 1.0 when the completion's JSON value parses and
validates against the row's schema with the ``jsonschema`` library, else 0.0.

* JSON extraction (:func:`extract_json`; rules shared by all tasks in :mod:`maskrl.tasks.extract`):
  the completion's final part (cut at the end-of-text token; the ``<answer>`` span or the text after
  ``</reasoning>`` when there is one) is tried whole as one JSON value first; else the first
  ```` ```json ```` fenced block (else the first plain ```` ``` ```` block), a fence closing only at
  a line holding nothing but three backticks, so backticks inside a JSON string do not end it;
  else the first (outermost) ``{...}``/``[...]`` value in the text. Minus-like characters outside
  strings read as ``-`` (``{"n": −5}``). ``NaN``/``Infinity`` are rejected (not JSON). An object
  that repeats a key, at any nesting level, is rejected and the completion holds no JSON (RFC 8259
  leaves duplicates' meaning open: Python keeps the last value, other parsers the first, so a
  schema-breaking first value could pass); no object nested inside it is tried instead.
* Validator class: from the schema's ``$schema`` (drafts 3, 4, 6, 7, 2019-09, 2020-12). Without
  ``$schema`` (all of Glaiveai2K, about a quarter of the GitHub subsets) we use **Draft 7**: 99.6 %
  of the schemas that declare a draft declare draft-04/06/07, and undeclared ones use draft-7-era
  keywords (``dependencies`` in 22, ``additionalItems`` in 6, ``definitions`` in 76 of them) that
  Draft 2020-12 silently ignores -- a 2020-12 default would accept instances their authors forbid.
  An unknown ``$schema`` URI also falls back to Draft 7.
* ``format`` is an annotation by default (``check_formats=False``), as in the library and in the
  2019-09+ drafts; the library's format checks depend on optional packages, so asserting them would
  make the reward depend on what is installed.
* A schema the validator cannot use (not JSON, not an object/boolean, rejected by the draft's
  metaschema, a ``$ref`` that does not resolve inside the schema) is reported by
  :func:`schema_problem` (and counted in :meth:`JsonSchemaTask.metrics` as ``n_schema_problems``);
  its rows score 0.0. Errors raised while validating (e.g. a ``$ref`` reached at run time that
  cannot be resolved) are logged once per schema and score 0.0; nothing raises to the caller.
"""
from __future__ import annotations

import json
import logging
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Sequence

from jsonschema import Draft7Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
import referencing
import referencing.exceptions
import referencing.jsonschema

from maskrl.tasks.base import TASKS, DataError, Example, Task, iter_jsonl, require
from maskrl.tasks.extract import fenced_blocks, final_part, normalize_minus_outside_strings

logger = logging.getLogger(__name__)

SUBSETS = {
    "Glaiveai2K": "jsonschemabench/Glaiveai2K.jsonl",
    "Github_trivial": "jsonschemabench/Github_trivial.jsonl",
    "Github_easy": "jsonschemabench/Github_easy.jsonl",
}
#: Glaiveai2K: short, self-contained schemas (function-call arguments, no ``$ref``), whose instances
#: fit the 128-512-token generation lengths of docs/spec.md §5.
DEFAULT_SUBSET = "Glaiveai2K"
DEFAULT_VALIDATOR = Draft7Validator
#: how many ``{``/``[`` positions :func:`extract_json` tries before giving up
MAX_JSON_STARTS = 64

PROMPT_TEMPLATE = (
    "Write a JSON value that is valid against the following JSON Schema.\n\n"
    "Schema:\n{schema}\n\n"
    "Reply with the JSON value only, inside a ```json fenced code block."
)

_NON_SCHEMA_KEYS = {"enum", "const", "default", "examples"}


class NoJSON(ValueError):
    """The completion holds no parseable JSON value."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class DuplicateKey(ValueError):
    """A JSON object repeats a key."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise DuplicateKey(f"duplicate key {k!r} in a JSON object")
        seen[k] = v
    return seen


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_unique_keys)


def extract_json(text: str, prompt: str | None = None, require_final_answer: bool = False) -> Any:
    """The JSON value a completion answers with (rules in the module docstring).

    Raises:
        NoJSON: when no JSON value can be read (a fenced block that does not parse counts as none),
            or, with ``require_final_answer``, when the completion was cut off before a final answer.
    """
    if not isinstance(text, str):
        raise NoJSON(f"completion is {type(text).__name__}, not str")
    part = final_part(text, prompt, minus=False)
    if part.is_cut_off and require_final_answer:
        raise NoJSON("cut off before a final answer")
    stripped = normalize_minus_outside_strings(part.text.strip())
    try:
        return _DECODER.decode(stripped)
    except DuplicateKey as e:
        raise NoJSON(str(e)) from None
    except (ValueError, RecursionError):
        pass
    fences = fenced_blocks(stripped)
    chosen = next((f.body for f in fences if f.lang == "json"), None)
    if chosen is None:
        chosen = next((f.body for f in fences if f.lang == ""), None)
    if chosen is not None:
        try:
            return _DECODER.decode(chosen.strip())
        except (ValueError, RecursionError) as e:
            raise NoJSON(f"fenced block is not JSON ({e})") from None
    for k, m in enumerate(re.finditer(r"[\[{]", stripped)):
        if k >= MAX_JSON_STARTS:
            break
        try:
            value, _ = _DECODER.raw_decode(stripped, m.start())
            return value
        except DuplicateKey as e:
            raise NoJSON(str(e)) from None
        except (ValueError, RecursionError):
            continue
    raise NoJSON("no JSON value found")


def _shorten(msg: str, head: int = 120, tail: int = 60) -> str:
    return msg if len(msg) <= head + tail + 5 else f"{msg[:head]} ... {msg[-tail:]}"


def _refs(node: Any, nested_id: bool = False, root: bool = True) -> Iterator[tuple[str, bool]]:
    """``($ref, under_a_nested_id)`` for every ``$ref`` in a schema (values of enum/const/... skipped)."""
    if isinstance(node, dict):
        has_id = not root and isinstance(node.get("$id", node.get("id")), str)
        nested_id = nested_id or has_id
        for key, val in node.items():
            if key == "$ref" and isinstance(val, str):
                yield val, nested_id
            elif key not in _NON_SCHEMA_KEYS:
                yield from _refs(val, nested_id, root=False)
    elif isinstance(node, list):
        for val in node:
            yield from _refs(val, nested_id, root=False)


def validator_class(schema: Any) -> type:
    """The jsonschema validator class for ``schema``: from its ``$schema``, else Draft 7."""
    if isinstance(schema, dict) and "$schema" in schema:
        return validator_for(schema, default=DEFAULT_VALIDATOR)
    return DEFAULT_VALIDATOR


def _compile(schema: Any, check_formats: bool):
    """``(validator, None)`` or ``(None, problem)``; see :func:`schema_problem`."""
    if not isinstance(schema, (dict, bool)):
        return None, f"schema is a JSON {type(schema).__name__}, not an object or boolean"
    cls = validator_class(schema)
    try:
        cls.check_schema(schema)
    except SchemaError as e:
        path = "/".join(str(p) for p in e.path) or "(root)"
        return None, f"{cls.__name__} metaschema rejects the schema at {path} ({e.validator}): {_shorten(e.message)}"
    except Exception as e:  # noqa: BLE001 - anything else the library raises on a bad schema
        return None, f"{cls.__name__}.check_schema raised {type(e).__name__}: {str(e)[:200]}"
    if isinstance(schema, dict):
        refs = [r for r, nested in _refs(schema) if not nested]
        if refs:
            try:
                spec = referencing.jsonschema.specification_with(cls.META_SCHEMA["$schema"])
                resolver = referencing.Registry().resolver_with_root(spec.create_resource(schema))
            except Exception as e:  # noqa: BLE001
                return None, f"cannot build a $ref resolver: {type(e).__name__}: {str(e)[:200]}"
            for ref in dict.fromkeys(refs):
                try:
                    resolver.lookup(ref)
                except referencing.exceptions.Unresolvable as e:
                    return None, f"$ref {ref!r} does not resolve within the schema ({type(e).__name__})"
    fmt = cls.FORMAT_CHECKER if check_formats else None
    return cls(schema, format_checker=fmt), None


@lru_cache(maxsize=4096)
def _compiled(schema_text: str, check_formats: bool):
    try:
        schema = json.loads(schema_text, parse_constant=_reject_constant)
    except ValueError as e:
        return None, f"schema is not valid JSON ({e})"
    return _compile(schema, check_formats)


def schema_problem(schema_text: str, check_formats: bool = False) -> str | None:
    """Why the validator cannot use this schema (a JSON string), or ``None`` when it can."""
    return _compiled(schema_text, check_formats)[1]


_WARNED: set[str] = set()


def schema_reward(schema_text: str, completion: str, check_formats: bool = False, prompt: str | None = None,
                  require_final_answer: bool = False) -> float:
    """1.0 when ``completion``'s JSON value validates against the schema ``schema_text``, else 0.0.

    Never raises: unusable schemas, missing JSON and errors inside validation all give 0.0.
    """
    validator, problem = _compiled(schema_text, check_formats)
    if validator is None:
        return 0.0
    try:
        instance = extract_json(completion, prompt, require_final_answer)
    except NoJSON:
        return 0.0
    try:
        return 1.0 if validator.is_valid(instance) else 0.0
    except Exception as e:  # noqa: BLE001 - e.g. Unresolvable $ref at run time, RecursionError
        key = schema_text[:200]
        if key not in _WARNED:
            _WARNED.add(key)
            logger.warning("jsonschema: validation raised %s: %s (schema %s...); scored 0",
                           type(e).__name__, str(e)[:200], key[:80])
        return 0.0


@TASKS.register("jsonschema")
class JsonSchemaTask(Task):
    """JSONSchemaBench (``{"unique_id", "json_schema": <JSON string>}`` per line).

    Args:
        subset: one of :data:`SUBSETS` (default :data:`DEFAULT_SUBSET`); ``load(path)`` with an
            explicit file reads any file of the same format.
        check_formats: assert ``format`` keywords with the validator's format checker.
        require_final_answer: see :class:`~maskrl.tasks.base.Task`.

    Raises:
        ValueError: for an unknown subset, listing the valid ones.
    """

    name = "jsonschema"
    data_file = SUBSETS[DEFAULT_SUBSET]
    hub_id = "epfl-dlab/JSONSchemaBench"
    prompt_template = PROMPT_TEMPLATE
    default_subset = DEFAULT_SUBSET

    template_fields = ("schema",)

    def __init__(self, subset: str | None = None, check_formats: bool = False,
                 prompt_template: str | None = None, require_final_answer: bool = False) -> None:
        super().__init__(prompt_template, require_final_answer=require_final_answer)
        subset = subset or self.default_subset
        if subset not in SUBSETS:
            raise ValueError(f"unknown JSONSchemaBench subset {subset!r}; valid: {', '.join(SUBSETS)}")
        self.subset = subset
        self.data_file = SUBSETS[subset]
        self.check_formats = check_formats

    def parse(self, path: Path) -> list[Example]:
        out = []
        problems = 0
        for lineno, obj in iter_jsonl(path):
            where = f"{path}:{lineno}"
            uid = require(obj, "unique_id", where, (str, int))
            text = require(obj, "json_schema", where)
            try:
                schema = json.loads(text)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: field 'json_schema' is not valid JSON ({e.msg})") from None
            problems += schema_problem(text, self.check_formats) is not None
            prompt = self.prompt_template.format(schema=json.dumps(schema, ensure_ascii=False))
            out.append(Example(id=len(out), prompt=prompt, fields={"unique_id": str(uid), "json_schema": text}))
        if problems:
            logger.warning("%s: %d of %d schemas cannot be used by the validator; their rows score 0 "
                           "(see maskrl.tasks.jsonschema_task.schema_problem)", path, problems, len(out))
        return out

    def reward(self, prompts: Sequence[str], completions: Sequence[str], *, json_schema: Sequence[str],
               **_: Any) -> list[float]:
        """1.0 per completion whose JSON validates against its row's ``json_schema``, else 0.0."""
        if len(completions) != len(json_schema):
            raise ValueError(f"{len(completions)} completions but {len(json_schema)} schemas")
        ps = list(prompts) if prompts is not None and len(prompts) == len(completions) else [None] * len(completions)
        return [schema_reward(s, c, self.check_formats, p, self.require_final_answer)
                for s, c, p in zip(json_schema, completions, ps)]

    def metrics(self, examples, completions, rewards) -> dict:
        out = super().metrics(examples, completions, rewards)
        out["n_schema_problems"] = sum(
            schema_problem(ex.fields["json_schema"], self.check_formats) is not None for ex in examples)
        return out


@TASKS.register("jsonschema_github_trivial")
class JsonSchemaGithubTrivial(JsonSchemaTask):
    """JSONSchemaBench ``Github_trivial`` (444 schemas)."""

    name = "jsonschema_github_trivial"
    data_file = SUBSETS["Github_trivial"]
    default_subset = "Github_trivial"


@TASKS.register("jsonschema_github_easy")
class JsonSchemaGithubEasy(JsonSchemaTask):
    """JSONSchemaBench ``Github_easy`` (1943 schemas)."""

    name = "jsonschema_github_easy"
    data_file = SUBSETS["Github_easy"]
    default_subset = "Github_easy"
