"""``--set key.sub=value`` overrides: parsed as YAML (string fields as typed) and applied to the
merged YAML mapping before the config is built."""
from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any, Sequence

import yaml

from maskrl.config.schema import ConfigError, RunConfig, component_registry, field_types
from maskrl.yamlfile import DuplicateKeyError, load_yaml


def _key_type(parts: Sequence[str], root: type) -> Any:
    """Declared type of the dotted key ``parts`` under the dataclass ``root``; ``None`` when unknown."""
    typ: Any = root
    for p in parts:
        if not dataclasses.is_dataclass(typ):
            return None
        typ = field_types(typ).get(p)
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
        value = load_yaml(raw) if raw.strip() else ""
    except DuplicateKeyError as e:
        raise ConfigError(f"{key.strip()}: in the value {raw!r}, {e}") from None
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
                raise _list_index_error(parts, i, cur, item.split("=", 1)[1].strip())
            p = int(p)
        elif not isinstance(cur, dict):
            raise ConfigError(f"{where}: {'.'.join(parts[:i])} is {cur!r}, not a section")
        if last:
            cur[p] = value
            break
        nxt = cur[p] if isinstance(cur, list) else cur.get(p)
        if nxt is None:
            nxt = _default_list(parts[:i + 1])  # a list field: any key below it is an index (checked above)
            nxt = {} if nxt is None else nxt
        elif isinstance(nxt, str):
            nxt = {"name": nxt}
        cur[p] = nxt
        cur = nxt
    return out


def _default_list(parts: Sequence[str]) -> list | None:
    """The default value (plain data, as :func:`~maskrl.config.build.to_dict` writes it) of the list
    field at the dotted key ``parts`` of :class:`RunConfig`, so that an index into a list the YAML does
    not set reads the list in effect; ``None`` when the key is no list field."""
    if _key_type(parts, RunConfig) is not list:
        return None
    from maskrl.config.build import to_dict

    value: Any = to_dict(RunConfig())
    for p in parts:
        value = value[p]
    return copy.deepcopy(value)


def _list_index_error(parts: Sequence[str], i: int, items: list, raw: str) -> ConfigError:
    """The error for ``parts[i]``, an index the list ``items`` (at ``parts[:i]``) has no entry for; an
    empty list says so and shows the override that adds the entry (``raw``: the value as typed)."""
    where, name = ".".join(parts[:i + 1]), ".".join(parts[:i]) or "the list"
    if items:
        return ConfigError(f"{where}: {name} has {len(items)} entries (indices 0-{len(items) - 1}); set the whole "
                           f"list, e.g. --set {name}='[{{name: ...}}]'")
    return ConfigError(f"{'.'.join(parts)}: {name} is an empty list (0 entries), so it has no entry {parts[i]} to "
                       f"set; add the entry by setting the whole list, e.g. --set {name}='[{_entry_example(parts, i, raw)}]'")


def _entry_example(parts: Sequence[str], i: int, raw: str) -> str:
    """One list entry holding the override's value (YAML flow style): for a component list the
    ``{name: ..., key: value}`` mapping, named after the registered component that has that key when
    exactly one has it."""
    rest = list(parts[i + 1:])
    if not rest:
        return raw
    if rest == ["name"]:  # the entry's component itself
        return f"{{name: {raw}}}"
    inner = raw
    for key in reversed(rest[1:]):
        inner = f"{{{key}: {inner}}}"
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    kind = fields[parts[0]].metadata.get("component") if i == 1 and parts[0] in fields else None
    if kind is None:
        return f"{{{rest[0]}: {inner}}}"
    reg = component_registry(kind)
    owners = [n for n in reg.names() if rest[0] in field_types(reg.get(n))]
    return f"{{name: {owners[0] if len(owners) == 1 else 'NAME'}, {rest[0]}: {inner}}}"
