"""``maskrl config --explain SECTION``: each field of a section or component with its default and its
description (from the dataclass docstrings' ``Attributes:``)."""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

from maskrl.config.build import to_dict
from maskrl.config.schema import (REMOVED, ConfigError, FileTaskConfig, ModelConfig, RunConfig, SFTConfig, TaskConfig,
                                  TinyModelConfig, TrainConfig, component_registry, field_types, own_likelihood)
from maskrl.sampling import SamplerConfig


_SECTIONS = {"model": ModelConfig, "model.tiny": TinyModelConfig, "task": TaskConfig,
             "task.file": FileTaskConfig, "rollout": SamplerConfig,
             "eval": SamplerConfig, "sft": SFTConfig, "train": TrainConfig}


_ROLE_RE = re.compile(r":[a-z]+:`(~?)([^`<]*?)(?:\s*<([^`>]*)>)?`")
_LITERAL_RE = re.compile(r"``(.+?)``")
_INTERPRETED_RE = re.compile(r"(?<![\w`])`([^`]+)`(?![\w`])")
_STRONG_RE = re.compile(r"(?<![\w*])\*\*(\S(?:.*?\S)?)\*\*(?![\w*])|(?<![\w*\\])\*(\S(?:[^*]*?\S)?)\*(?![\w*])")


def plain_text(doc: str) -> str:
    """reST inline markup of a docstring rendered as plain text for the terminal: ````x```` -> ``x``,
    ``:class:`~a.b.C``` -> ``C``, ``:func:`a.f``` -> ``a.f``, ``:ref:`title <target>``` -> ``title``,
    ```x``` -> ``x``, ``**x**`` / ``*x*`` -> ``x``."""
    def role(m: re.Match) -> str:
        text, short = m.group(2).strip(), m.group(1) == "~"
        if m.group(3) is not None:
            return text
        return text.rsplit(".", 1)[-1] if short else text

    out = _ROLE_RE.sub(role, doc)
    out = _LITERAL_RE.sub(lambda m: m.group(1), out)
    out = _INTERPRETED_RE.sub(lambda m: m.group(1), out)
    return _STRONG_RE.sub(lambda m: m.group(1) or m.group(2), out)


def field_docs(cls: type) -> dict[str, str]:
    """Field descriptions from the ``Attributes:`` section of ``cls``'s docstring (Google style), as
    plain text (:func:`plain_text`)."""
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
    return {k: plain_text(v) for k, v in out.items()}


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


def explain(section: str, configured: RunConfig | Callable[[], RunConfig] | None = None) -> str:
    """Text listing each field of a config section with its default and description (``maskrl config
    --explain SECTION``). Sections: ``model``, ``model.tiny``, ``task``, ``rollout``, ``eval``, ``sft``,
    ``train``, and the components ``objective``, ``likelihood``, ``credit`` (every registered entry;
    ``objective.NAME`` for one, user plug-ins' included). One field: ``train.lr``,
    ``credit.dispo.z``, ``objective.diffu_grpo.clip_eps``; a component's field without its name
    (``objective.aggregation``, ``credit.lam``) is that field of the configured component(s), as
    ``objective.<its name>.aggregation`` explains it. An entry of the credit list as ``--set`` indexes it
    (``credit.0.lam``, ``credit[0].lam``) is the configured module at that place.

    Args:
        section: what to explain.
        configured: the run's config, or a function returning it (called only for a component field
            without a name); default: the defaults of :class:`RunConfig` (objective ``diffu_grpo``, its
            own likelihood, no credit module).

    Raises:
        ConfigError: on an unknown section, component or field, listing the valid ones.
    """
    import inspect
    import re

    section = re.sub(r"\[(\d+)\]", r".\1", section)  # credit[0].lam as --set writes it
    if section in _SECTIONS:
        return "\n".join(_explain_class(_SECTIONS[section], f"[{section}]"))
    head, _, field_name = section.rpartition(".")
    if head in _SECTIONS:
        return _explain_field(_SECTIONS[head], head, field_name)
    kind, _, rest = section.partition(".")
    if kind in ("objective", "likelihood", "credit"):
        reg = component_registry(kind)
        name, _, field_name = rest.partition(".")
        if kind == "credit" and name.isdigit():  # credit.0.lam: the configured list's entry 0
            name = _credit_entry(int(name), configured)
        if name and not field_name and name not in reg:  # `objective.aggregation`: the configured one's field
            return _explain_configured_field(kind, name, configured)
        names = [name] if name else reg.names()
        out = []
        for n in names:
            if n not in reg:
                raise ConfigError(f"{kind}.{n}: unknown {kind}; valid: {', '.join(reg.names())}")
            cls = reg.get(n)
            if field_name:
                return _explain_field(cls, f"{kind}.{n}", field_name)
            summary = plain_text((inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " "))
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


def _credit_entry(index: int, configured) -> str:
    """The registered name of entry ``index`` of the configured credit list.

    Raises:
        ConfigError: the list has no such entry (its length and names given).
    """
    cfg = configured() if callable(configured) else configured
    cfg = RunConfig() if cfg is None else cfg
    reg = component_registry("credit")
    names = [reg.name_of(c) for c in cfg.credit]
    if index >= len(names):
        raise ConfigError(f"credit.{index}: the configured credit list has {len(names)} entries "
                          f"({', '.join(names) or 'none'}); name the module instead, e.g. credit.dps.lam")
    return names[index]


def _explain_configured_field(kind: str, name: str, configured) -> str:
    """Field ``name`` of the configured ``kind`` component(s) (every credit module of the list that has
    it), as ``kind.<component>.name`` explains it.

    Raises:
        ConfigError: no configured component has the field: naming the configured ones, the valid
            component names, and the components that have such a field.
    """
    cfg = configured() if callable(configured) else configured
    cfg = RunConfig() if cfg is None else cfg
    reg = component_registry(kind)
    current = getattr(cfg, kind)
    names = list(dict.fromkeys(reg.name_of(c) for c in (current if kind == "credit" else [current])))
    has = [n for n in names if name in field_types(reg.get(n))]
    if has:
        return "\n\n".join(_explain_field(reg.get(n), f"{kind}.{n}", name) for n in has)
    owners = [n for n in reg.names() if name in field_types(reg.get(n))]
    hint = f"; {name} is a field of {', '.join(owners)} (e.g. {kind}.{owners[0]}.{name})" if owners else ""
    raise ConfigError(f"{kind}.{name}: neither a registered {reg.kind} nor a field of the configured {reg.kind} "
                      f"({', '.join(names) or 'none'}); valid {reg.kind}s: {', '.join(reg.names())}{hint}")


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
