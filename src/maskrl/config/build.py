"""YAML -> the run's dataclasses: typed values, path fields resolved against the YAML file's folder,
and components (objective, likelihood, credit entries) built from their registries by name."""
from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

from maskrl.config.schema import (MOVED, REMOVED, TINY_TOKENIZERS, ConfigError, component_registry, field_types,
                                  own_likelihood)


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
    reg = component_registry(kind)
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
    fields = field_types(cls)
    unknown = [k for k in params if k not in fields]
    if unknown:
        k = unknown[0]
        err = _unknown_key_error(f"{key}.{k}", f"{key.split('[')[0]}.{name}.{k}", fields, key)
        if f"{key.split('[')[0]}.{name}.{k}" not in REMOVED:
            owners = [n for n in reg.names() if n != name and k in field_types(reg.get(n))]
            if owners:
                err = ConfigError(f"{err}. {k} is a field of {', '.join(owners)}, not of {name}: to switch {key} to "
                                  f"{name}, replace the whole section, e.g. --set {key.split('[')[0]}='"
                                  f"{{name: {name}}}'" + (" (a list of entries)" if "[" in key else "")
                                  + " or a YAML section holding only its fields")
        raise err
    base = default if (default is not None and name == default_named) else None
    return _build(cls, params, key + ".", base)


def _is_component(value: Any, kind: str) -> bool:
    """Whether ``value`` is a built component of ``kind`` (a default's entry), not YAML to build one from
    (a mapping, a name, or anything else, which :func:`_component` refuses naming its key)."""
    try:
        component_registry(kind).name_of(value)
    except KeyError:
        return False
    return not isinstance(value, (Mapping, str))


def _coerce(value: Any, typ: Any, key: str, default: Any = None) -> Any:
    args = typing.get_args(typ)
    if len(args) == 2 and type(None) in args:  # ``X | None``: null, or a value of X
        inner = args[0] if args[1] is type(None) else args[1]
        return None if value is None else _coerce(value, inner, key, default)
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {sorted(field_types(typ))}, got {value!r}")
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
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(number):  # NaN passes every `x < 0` range check
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return number
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


class _Defaults:
    """The default of each field of dataclass ``cls``, made when first read (a component's default
    imports its module, and torch with it, only when the component is built)."""

    def __init__(self, cls: type) -> None:
        self._fields = {f.name: f for f in dataclasses.fields(cls)}

    def __getattr__(self, name: str) -> Any:
        f = self._fields[name]
        return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _build(cls: type, data: Mapping[str, Any], prefix: str = "", defaults: Any = None) -> Any:
    """``cls`` from ``data``; keys missing from ``data`` keep their value in ``defaults`` (the
    parent's default for this section, so partial sections keep the run's defaults)."""
    types = field_types(cls)
    unknown = [k for k in data if k not in types]
    if unknown:
        raise _unknown_key_error(prefix + unknown[0], prefix + unknown[0], types, prefix.rstrip(".") or "the top level")
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}
    defaults = defaults if defaults is not None else _Defaults(cls)
    kwargs = {}
    # plain fields and sections first: their errors answer before a component's module (torch) is imported
    for name, typ in sorted(types.items(), key=lambda item: meta[item[0]].get("component") is not None):
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
            kwargs[name] = [v if _is_component(v, kind) else _component(v, kind, f"{prefix}{name}[{i}]", None, None)
                            for i, v in enumerate(items)]
        elif name == "likelihood" and "objective" in kwargs:
            # the objective's own estimator unless named; fields kept when the name is unchanged
            own = kwargs["objective"].default_likelihood
            current = getattr(defaults, name)
            keep = current if current is not None and component_registry(kind).name_of(current) == own \
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
            reg = component_registry(kind)
            one = lambda c: {"name": reg.name_of(c), **dataclasses.asdict(c)}  # noqa: E731
            out[f.name] = [one(c) for c in v] if f.metadata.get("many") else one(v)
        elif dataclasses.is_dataclass(v):
            out[f.name] = to_dict(v)
        else:
            out[f.name] = list(v) if isinstance(v, list) else v
    return out
