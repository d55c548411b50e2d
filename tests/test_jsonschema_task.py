"""jsonschema task (docs/spec.md §5): JSON extraction, validator choice, unusable schemas, and a golden check
on sampled JSONSchemaBench schemas with instances built by an independent generator."""
from __future__ import annotations

import json
import math
import random

import pytest
from jsonschema import Draft4Validator, Draft7Validator, Draft202012Validator

from maskrl.tasks import TASKS, default_data_dir, get_task
from maskrl.tasks.jsonschema_task import (SUBSETS, JsonSchemaTask, NoJSON, extract_json, schema_problem,
                                          schema_reward, validator_class)


def _rewards(schema: dict, completions: list[str]) -> list[float]:
    text = json.dumps(schema)
    return [schema_reward(text, c) for c in completions]


# --- extraction ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ('```json\n{"a": 1}\n```', {"a": 1}),
    ('Sure:\n```JSON\n[1, 2]\n```\nand {"b": 2}', [1, 2]),
    ('```\n{"a": 1}\n```', {"a": 1}),
    ('```python\nx = 1\n```\n```json\n{"a": 2}\n```', {"a": 2}),
    ('```json\n{"a": 1}', {"a": 1}),  # unclosed fence (truncated generation)
    ('Here it is: {"a": {"b": [1, 2]}} -- and [3]', {"a": {"b": [1, 2]}}),
    ('  "just a string"  ', "just a string"),
    ("42", 42),
    ("null", None),
    ("{not json} then [1, {\"x\": true}]", [1, {"x": True}]),
])
def test_extract_json(text, expected):
    assert extract_json(text) == expected


@pytest.mark.parametrize("text", [
    "", "no json here", '```json\n{"a": 1,}\n```\n{"a": 1}', "NaN", '{"a": NaN}', '[Infinity]', None,
])
def test_extract_json_none(text):
    with pytest.raises(NoJSON):
        extract_json(text)


# --- validator choice and reward -----------------------------------------------------------------

def test_validator_class_choice():
    assert validator_class({"type": "object"}) is Draft7Validator
    assert validator_class({"$schema": "http://json-schema.org/draft-04/schema#"}) is Draft4Validator
    assert validator_class({"$schema": "http://json-schema.org/draft-04/schema"}) is Draft4Validator
    assert validator_class({"$schema": "https://json-schema.org/draft/2020-12/schema"}) is Draft202012Validator
    assert validator_class({"$schema": "http://example.com/custom"}) is Draft7Validator
    assert validator_class(True) is Draft7Validator


def test_reward_basic():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"],
              "additionalProperties": False}
    comps = ['```json\n{"n": 3}\n```', '{"n": 0}', '{"n": 3, "x": 1}', "{}", "", "garbage", '{"n": 3.5}',
             'The answer: {"n": 2}']
    assert _rewards(schema, comps) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]



def test_duplicate_keys_are_rejected_at_every_level():
    """Issue 20 item 4: Python's parser keeps a repeated key's last value, others the first; a
    first value that breaks the schema must not pass. No nested object is read instead."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1},
                                               "o": {"type": "object", "properties": {"m": {"type": "string"}}}},
              "required": ["n"]}
    comps = ['{"n": 0, "n": 3}',                                # top level, bare
             '```json\n{"n": "x", "n": 3}\n```',                # in a fence
             'Sure: {"n": 3, "o": {"m": 1, "m": "a"}} done',    # nested, in prose
             '[{"n": 1, "n": 2}]',                              # inside an array
             '{"n": 3, "o": {"m": "a"}}']                       # no duplicates: passes
    assert _rewards(schema, comps) == [0.0, 0.0, 0.0, 0.0, 1.0]
    with pytest.raises(NoJSON, match="duplicate key 'n'"):
        extract_json('text {"a": {"n": 1, "n": 2}} and later {"n": 5}')  # no later value read instead
    assert extract_json('{"a": {"n": 1}, "b": {"n": 1}}') == {"a": {"n": 1}, "b": {"n": 1}}  # same key, other objects


def test_default_draft7_enforces_dependencies():
    """Undeclared schemas use Draft 7, where `dependencies` is enforced (2020-12 would ignore it)."""
    schema = {"type": "object", "dependencies": {"a": ["b"]}}
    assert _rewards(schema, ['{"a": 1, "b": 2}', '{"a": 1}']) == [1.0, 0.0]


def test_draft4_semantics_when_declared():
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}
    # Draft 4: 1.0 is not an integer; Draft 6+: it is
    assert _rewards(schema, ["1", "1.0"]) == [1.0, 0.0]
    assert _rewards({"type": "integer"}, ["1.0"]) == [1.0]


def test_formats_are_annotations_by_default():
    text = json.dumps({"type": "string", "format": "date"})
    assert schema_reward(text, '"not a date"') == 1.0
    assert schema_reward(text, '"not a date"', check_formats=True) == 0.0
    assert schema_reward(text, '"2024-02-29"', check_formats=True) == 1.0


@pytest.mark.parametrize("schema_text, reason", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not an object or boolean"),
    (json.dumps({"type": "nonsense"}), "metaschema rejects"),
    (json.dumps({"$schema": "http://json-schema.org/draft-04/schema#", "enum": ["a", "a"]}), "uniqueItems"),
    (json.dumps({"properties": {"a": {"$ref": "#/definitions/missing"}}}), "does not resolve"),
    (json.dumps({"$ref": "http://example.com/remote.json"}), "does not resolve"),
])
def test_unusable_schemas_reported_and_score_zero(schema_text, reason):
    problem = schema_problem(schema_text)
    assert problem is not None and reason in problem
    assert schema_reward(schema_text, '{"a": 1}') == 0.0


def test_runtime_validation_error_scores_zero(caplog):
    # a $ref under a nested $id is not checked statically; in Draft 7 the $id beside $ref is ignored,
    # so the relative ref cannot resolve when validation reaches it
    schema = {"properties": {"a": {"$id": "http://example.com/a.json", "$ref": "other.json"}}}
    text = json.dumps(schema)
    assert schema_problem(text) is None
    assert schema_reward(text, '{"b": 1}') == 1.0  # the ref is never reached
    assert schema_reward(text, '{"a": 1}') == 0.0  # reached: Unresolvable, caught, scored 0


def test_task_registration_and_subsets():
    assert {"jsonschema", "jsonschema_github_trivial", "jsonschema_github_easy"} <= set(TASKS.names())
    assert JsonSchemaTask().subset == "Glaiveai2K"
    assert get_task("jsonschema_github_easy").subset == "Github_easy"
    assert JsonSchemaTask("Github_trivial").data_file == SUBSETS["Github_trivial"]
    with pytest.raises(ValueError, match="Glaiveai2K"):
        JsonSchemaTask("nope")


# --- an independent instance generator (test-only) -----------------------------------------------

class Unsupported(Exception):
    pass


_IGNORED = {"title", "description", "default", "examples", "$schema", "$id", "id", "$comment", "format",
            "definitions", "$defs", "readOnly", "writeOnly", "deprecated", "contentMediaType", "contentEncoding"}
# validation keywords this generator does not implement: a schema using one is skipped
_UNSUPPORTED = {"pattern", "patternProperties", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
                "dependencies", "dependentRequired", "dependentSchemas", "additionalItems", "prefixItems",
                "contains", "minContains", "maxContains", "propertyNames", "minProperties", "maxProperties",
                "unevaluatedProperties", "unevaluatedItems", "multipleOf", "divisibleBy", "disallow", "extends",
                "$recursiveRef", "$dynamicRef"}
_TYPES = ("string", "integer", "number", "boolean", "null", "array", "object")
_WRONG = [("string", "zz-wrong"), ("integer", 7), ("boolean", True), ("null", None), ("array", []), ("object", {})]


def _resolve(root: dict, ref: str):
    if not ref.startswith("#"):
        raise Unsupported("non-local $ref")
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise Unsupported("dangling $ref")
        node = node[part]
    return node


def _types(schema: dict) -> list[str]:
    t = schema.get("type")
    if t is None:
        if any(k in schema for k in ("properties", "required", "additionalProperties")):
            return ["object"]
        if any(k in schema for k in ("items", "minItems", "maxItems", "uniqueItems")):
            return ["array"]
        if any(k in schema for k in ("minLength", "maxLength")):
            return ["string"]
        if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
            return ["number"]
        return ["any"]
    types = [t] if isinstance(t, str) else t
    if not isinstance(types, list) or not types or any(x not in _TYPES for x in types):
        raise Unsupported(f"type {t!r}")
    return types


def _type_ok(value, types: list[str]) -> bool:
    kinds = {"string": str, "boolean": bool, "array": list, "object": dict}
    for t in types:
        if t == "null" and value is None:
            return True
        if t in kinds and isinstance(value, kinds[t]):
            return True
        if t in ("integer", "number") and isinstance(value, int) and not isinstance(value, bool):
            return True
        if t == "number" and isinstance(value, float):
            return True
    return False


def _bounds(schema: dict, integer: bool):
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(xlo, bool) or isinstance(xhi, bool):
        raise Unsupported("draft-4 boolean exclusive bounds")
    step = 1 if integer else 0.5
    if xlo is not None:
        lo = xlo + step if lo is None else max(lo, xlo + step)
    if xhi is not None:
        hi = xhi - step if hi is None else min(hi, xhi - step)
    if integer:
        lo = None if lo is None else math.ceil(lo)
        hi = None if hi is None else math.floor(hi)
    if lo is not None and hi is not None and lo > hi:
        raise Unsupported("empty numeric range")
    return lo, hi


def generate(schema, root, depth: int = 0):
    """A value valid against ``schema`` for the keywords above; raises Unsupported otherwise."""
    if depth > 12:
        raise Unsupported("too deep")
    if schema is True or schema == {}:
        return "anything"
    if not isinstance(schema, dict):
        raise Unsupported("boolean false / non-object schema")
    bad = _UNSUPPORTED & set(schema)
    if bad:
        raise Unsupported(f"keywords {sorted(bad)}")
    if "$ref" in schema:
        if set(schema) - _IGNORED - {"$ref"}:
            raise Unsupported("$ref with sibling keywords")
        return generate(_resolve(root, schema["$ref"]), root, depth + 1)
    types = _types(schema)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        for v in schema["enum"]:
            if types == ["any"] or _type_ok(v, types):
                return v
        raise Unsupported("no enum value of the right type")
    t = types[0]
    if t == "any":
        return "anything"
    if t == "null":
        return None
    if t == "boolean":
        return True
    if t in ("integer", "number"):
        lo, hi = _bounds(schema, t == "integer")
        if lo is not None and hi is not None:
            return lo if t == "integer" else (lo + hi) / 2
        if lo is not None:
            return lo + (1 if t == "integer" else 0.25)
        if hi is not None:
            return hi - (1 if t == "integer" else 0.25)
        return 3 if t == "integer" else 2.5
    if t == "string":
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        n = max(lo, min(3, hi if hi is not None else 3))
        if hi is not None and n > hi:
            raise Unsupported("empty length range")
        return "a" * n
    if t == "array":
        items = schema.get("items", {})
        if isinstance(items, list):
            raise Unsupported("tuple items")
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        n = max(lo, 1) if hi is None else min(max(lo, 1), hi)
        if n < lo:
            raise Unsupported("empty items range")
        try:
            values = [generate(items, root, depth + 1) for _ in range(n)]
        except Unsupported:
            if lo:
                raise
            return []
        if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in values}) < len(values):
            raise Unsupported("uniqueItems")
        return values
    # object
    props = schema.get("properties", {})
    required = schema.get("required", [])
    addl = schema.get("additionalProperties", True)
    if not isinstance(props, dict) or not isinstance(required, list):
        raise Unsupported("draft-3 style object keywords")
    out = {}
    for name, sub in props.items():
        try:
            out[name] = generate(sub, root, depth + 1)
        except Unsupported:
            if name in required:
                raise
    for name in required:
        if name not in out:
            if addl is False:
                raise Unsupported("required property forbidden by additionalProperties")
            out[name] = generate(addl if isinstance(addl, dict) else {}, root, depth + 1)
    return out


def violations(schema: dict, valid):
    """Instances that break ``schema`` on purpose: ``[(what, instance)]``."""
    out = []
    if "$ref" in schema:
        return out
    types = _types(schema) if "type" in schema else ["any"]  # an inferred type is no constraint
    if "any" not in types:
        for t, wrong in _WRONG:
            if not _type_ok(wrong, types):
                out.append((f"root type {t} not in {types}", wrong))
                break
    if not isinstance(valid, dict):
        return out
    required = schema.get("required", [])
    props = schema.get("properties", {})
    if required:
        out.append((f"missing required {required[0]!r}", {k: v for k, v in valid.items() if k != required[0]}))
    if schema.get("additionalProperties") is False:
        extra = "zz_extra_key"
        if extra not in props:
            out.append(("extra property with additionalProperties false", {**valid, extra: 1}))
    for name in required:
        sub = props.get(name)
        if not isinstance(sub, dict) or "$ref" in sub or "type" not in sub:
            continue
        ptypes = _types(sub)
        wrong = next((w for _, w in _WRONG if not _type_ok(w, ptypes)), "skip")
        if wrong != "skip":
            out.append((f"property {name!r} of the wrong type", {**valid, name: wrong}))
        if "enum" in sub and "zz-not-in-enum" not in sub["enum"]:
            out.append((f"property {name!r} not in enum", {**valid, name: "zz-not-in-enum"}))
        if ptypes == ["string"] and isinstance(sub.get("maxLength"), int):
            out.append((f"property {name!r} too long", {**valid, name: "a" * (sub["maxLength"] + 1)}))
        if ptypes in (["integer"], ["number"]) and isinstance(sub.get("minimum"), (int, float)) \
                and not isinstance(sub.get("exclusiveMinimum"), bool):
            out.append((f"property {name!r} below minimum", {**valid, name: math.floor(sub["minimum"]) - 1}))
        break  # one property's worth of violations is enough
    return out


def _as_completion(value, style: int) -> str:
    if style == 0:
        return "```json\n" + json.dumps(value, indent=2) + "\n```"
    if style == 1 and isinstance(value, (dict, list)):
        return "Here is the JSON:\n" + json.dumps(value) + "\nDone."
    return json.dumps(value)


def _sample(subset: str, k: int = 100, seed: int = 0):
    root = default_data_dir()
    if root is None or not (root / SUBSETS[subset]).is_file():
        pytest.skip(f"JSONSchemaBench {subset} not found (set MASKRL_DATA_DIR)")
    task = JsonSchemaTask(subset)
    ex = task.load()
    return random.Random(seed).sample(ex, k)


@pytest.mark.parametrize("subset", list(SUBSETS))
def test_golden_generated_instances(subset, record_property):
    """100 seeded schemas per subset: generated valid instances score 1, violating ones 0."""
    handled = valid_ok = n_viol = viol_ok = 0
    mismatches = []
    for i, ex in enumerate(_sample(subset)):
        text = ex.fields["json_schema"]
        schema = json.loads(text)
        if schema_problem(text) is not None:
            continue
        try:
            valid = generate(schema, schema)
        except Unsupported:
            continue
        handled += 1
        r = schema_reward(text, _as_completion(valid, i % 3))
        valid_ok += r == 1.0
        if r != 1.0:
            mismatches.append((ex.fields["unique_id"], "valid instance rejected", valid))
        for what, bad in violations(schema, valid):
            n_viol += 1
            r = schema_reward(text, _as_completion(bad, i % 3))
            viol_ok += r == 0.0
            if r != 0.0:
                mismatches.append((ex.fields["unique_id"], f"violation accepted: {what}", bad))
    record_property("handled", handled)
    record_property("violations", n_viol)
    print(f"{subset}: handled {handled}/100 schemas, valid accepted {valid_ok}/{handled}, "
          f"violations rejected {viol_ok}/{n_viol}")
    assert not mismatches, mismatches[:5]
    # the check must not pass vacuously
    assert handled >= 40 and n_viol >= handled


def test_unusable_schemas_in_the_benchmark():
    """Across all three subsets exactly one schema is unusable: Github_easy o66201 declares draft-04,
    whose metaschema requires unique `enum` values, and lists 'commit-msg' twice."""
    root = default_data_dir()
    if root is None or not all((root / p).is_file() for p in SUBSETS.values()):
        pytest.skip("JSONSchemaBench files not found (set MASKRL_DATA_DIR)")
    found = []
    for subset in SUBSETS:
        for ex in JsonSchemaTask(subset).load():
            problem = schema_problem(ex.fields["json_schema"])
            if problem:
                found.append((subset, ex.fields["unique_id"], problem))
    print(found)
    assert [(s, u) for s, u, _ in found] == [("Github_easy", "o66201")]
    assert "uniqueItems" in found[0][2] and "Draft4Validator" in found[0][2]
    task = JsonSchemaTask("Github_easy")
    ex = task.load()
    m = task.metrics(ex, [""] * len(ex), task.score_examples(ex, [""] * len(ex)))
    assert m["n_schema_problems"] == 1 and m["accuracy"] == 0.0
