"""Reading YAML written by people: a key repeated in one mapping is an error, not a silent overwrite.

PyYAML's ``safe_load`` keeps the last of two equal keys (``train:`` twice: the first section is lost;
``lr:`` twice in one section: the later value wins). :class:`StrictLoader` is a ``yaml.SafeLoader``
subclass whose mapping constructor (registered with PyYAML's public ``add_constructor``) refuses a
repeated key, at any depth, naming it and both lines. Keys brought in by a merge key (``<<: *base``)
may be overridden, as YAML's merge rule says.
"""
from __future__ import annotations

from typing import IO, Any

import yaml


class DuplicateKeyError(yaml.YAMLError):
    """A mapping holds the same key twice; ``str()`` names the key and both (1-based) lines."""

    def __init__(self, key: Any, first_line: int, second_line: int, where: str = "") -> None:
        self.key, self.first_line, self.second_line = key, first_line, second_line
        at = f" in {where!r}" if where else ""
        super().__init__(f"key {key!r}{at} is repeated: line {first_line} and line {second_line} "
                         "(YAML would keep only the later one; remove or merge one of them)")


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that raises :class:`DuplicateKeyError` on a repeated mapping key."""


def _strict_mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + 1
        try:
            if key in seen:
                raise DuplicateKeyError(key, seen[key], line, getattr(node, "_maskrl_path", ""))
            seen[key] = line
        except TypeError:  # an unhashable key: SafeConstructor reports it below
            continue
    return loader.construct_mapping(node, deep=True)


def _annotate(node: yaml.Node, path: str = "") -> None:
    """Record on every mapping node the dotted key path leading to it (for the error message)."""
    if isinstance(node, yaml.MappingNode):
        node._maskrl_path = path  # type: ignore[attr-defined]
        for k, v in node.value:
            name = str(getattr(k, "value", "?"))
            _annotate(v, f"{path}.{name}" if path else name)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _annotate(v, f"{path}[{i}]")


StrictLoader.add_constructor("tag:yaml.org,2002:map", _strict_mapping)


def load_yaml(stream: str | IO[str]) -> Any:
    """``yaml.safe_load(stream)`` that refuses a repeated key.

    Raises:
        DuplicateKeyError: a key repeated in one mapping (key, dotted path of the mapping, both lines).
        yaml.YAMLError: any other YAML error.
    """
    loader = StrictLoader(stream)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _annotate(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
