"""Committed result records that mean the same on every machine: no machine's absolute paths.

A record (a JSON file under ``results/``) names its inputs (data files, recipes, stand-in models,
launcher commands). Written as they are, those are one machine's absolute paths
(``/home/me/datasets/sudoku4x4/...``). :func:`portable` rewrites every absolute path found in a record's
strings into a name that holds on any machine:

* under the data folder (:func:`maskrl.tasks.base.default_data_dir`): ``<data>/sudoku4x4/4x4_test_sudoku.csv``;
* under a benchmark's work folder (``work=``, e.g. the 8B rehearsal's scratch folder): ``<work>/a/model``;
* under the project (this checkout): relative to its root, ``configs/demo_sudoku.yaml``;
* a program in a virtual environment's or the system's ``bin`` folder: its name, ``accelerate``;
* anything else: ``<outside>/<file name>`` (the folder is a machine's, the name is kept).

:func:`expand` undoes ``<data>`` and ``<work>`` for code that re-runs what a record says (with this
machine's folders). :func:`write_record` is how benchmarks write their committed records.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

#: the project's root (the folder holding ``src/``)
PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: an absolute POSIX path inside a string: starts at a separator after the string start, white space,
#: ``=``, ``:``, a quote or a bracket, and runs to the next white space, quote, comma or bracket
_ABS = re.compile(r"(?:(?<=^)|(?<=[\s=:'\"(\[,]))(/[A-Za-z0-9_.~+-][^\s'\"(),\[\]]*)")


def _under(path: Path, root: Path | None) -> str | None:
    if root is None:
        return None
    try:
        rel = path.relative_to(root)
    except ValueError:
        return None
    return rel.as_posix()


def portable_path(path: str | os.PathLike, work: str | os.PathLike | None = None,
                  data_dir: str | os.PathLike | None = None, root: str | os.PathLike | None = None) -> str:
    """One absolute path as records name it (module docstring). Relative paths are returned unchanged.

    Args:
        path: the path (absolute or relative).
        work: a benchmark's scratch folder, named ``<work>`` (``None``: none).
        data_dir: the data folder, named ``<data>`` (default :func:`~maskrl.tasks.base.default_data_dir`).
        root: the project root (default: this checkout's, :data:`PROJECT_ROOT`).
    """
    text = os.fspath(path)
    if not text.startswith("/"):
        return text
    if data_dir is None:
        from maskrl.tasks.base import default_data_dir

        data_dir = default_data_dir()
    p = Path(os.path.normpath(text))
    for label, base in (("<work>", work), ("<data>", data_dir)):
        if base is not None:
            rel = _under(p, Path(os.path.normpath(os.fspath(base))))
            if rel is not None:
                return label if rel == "." else f"{label}/{rel}"
    if p.parent.name == "bin":
        return p.name
    rel = _under(p, Path(os.fspath(root)) if root is not None else PROJECT_ROOT)
    if rel is not None:
        return rel
    return f"<outside>/{p.name}"


def portable(obj: Any, work: str | os.PathLike | None = None, data_dir: str | os.PathLike | None = None,
             root: str | os.PathLike | None = None) -> Any:
    """``obj`` (JSON-like: dicts, lists, strings, numbers) with every absolute path inside its strings
    rewritten by :func:`portable_path` (also inside commands, ``key=/path`` overrides and ``file:/path``
    sources). Keys are kept; other values are returned as they are."""
    if isinstance(obj, dict):
        return {k: portable(v, work, data_dir, root) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [portable(v, work, data_dir, root) for v in obj]
    if isinstance(obj, str):
        return _ABS.sub(lambda m: portable_path(m.group(1), work, data_dir, root), obj)
    return obj


def absolute_paths(obj: Any) -> list[str]:
    """Every absolute path found in ``obj``'s strings (what :func:`portable` would rewrite), in order."""
    if isinstance(obj, dict):
        return [p for v in obj.values() for p in absolute_paths(v)]
    if isinstance(obj, (list, tuple)):
        return [p for v in obj for p in absolute_paths(v)]
    if isinstance(obj, str):
        return _ABS.findall(obj)
    return []


def expand(obj: Any, work: str | os.PathLike | None = None, data_dir: str | os.PathLike | None = None) -> Any:
    """Inverse of :func:`portable` for ``<work>`` and ``<data>``: those names become this machine's
    folders (``work`` / ``data_dir``; the data folder defaults to :func:`~maskrl.tasks.base.default_data_dir`).

    Raises:
        ValueError: a string names ``<work>`` (or ``<data>``) and no such folder is given / found.
    """
    if isinstance(obj, dict):
        return {k: expand(v, work, data_dir) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [expand(v, work, data_dir) for v in obj]
    if not isinstance(obj, str):
        return obj
    if "<data>" in obj and data_dir is None:
        from maskrl.tasks.base import default_data_dir

        data_dir = default_data_dir()
    for label, base in (("<work>", work), ("<data>", data_dir)):
        if label in obj:
            if base is None:
                raise ValueError(f"{obj!r} names {label}, and no {label[1:-1]} folder is given")
            obj = obj.replace(label, os.fspath(base))
    return obj


def write_record(path: str | os.PathLike, record: Any, work: str | os.PathLike | None = None, indent: int = 2) -> Path:
    """Write ``record`` as JSON to ``path`` with :func:`portable` paths (written to a temporary file,
    then renamed, so a stopped writer leaves the previous record). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(portable(record, work), indent=indent, default=str) + "\n")
    os.replace(tmp, path)
    return path
