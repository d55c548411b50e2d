"""Rows of a user's CSV / JSON lines file as written: every CSV cell is its text, every JSON number
keeps the text it was written with (the ``file`` task, issue 50 §2).

``datasets``' CSV loader (pandas) infers a type per column: ``007`` became ``7.0``, ``0.50`` became
``0.5``, ``None`` / ``NA`` / ``null`` / an empty cell became missing values. Here:

- **CSV** (``csv`` module): every cell is a ``str`` exactly as in the file (``"007"``, ``"0.50"``,
  ``"None"``, ``"NA"``, ``""``). A row with fewer cells than the header has no value (``None``) in
  the columns it lacks; a row with more cells is an error.
- **JSON lines / JSON**: strings, booleans, lists and objects are JSON's; ``null`` is no value
  (``None``); a **number is the text it was written with, as a ``str``** (``0.50`` -> ``"0.50"``,
  ``7`` -> ``"7"``, ``1e3`` -> ``"1e3"``) -- the same text a CSV cell would give, so an answer
  compares as written and a template prints it as written. A reward that wants a number converts it
  (``float(x)``).

Rows lacking a column another row has get ``None`` there (one set of columns, first-seen order).
"""
from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path
from typing import Any

from maskrl.tasks.base import DataError


def _text(path: Path) -> str:
    """The file's UTF-8 text (gunzipped for ``.gz``; a byte-order mark dropped).

    Raises:
        DataError: not UTF-8 or not gzip.
    """
    try:
        raw = gzip.open(path).read() if path.name.lower().endswith(".gz") else path.read_bytes()
        return raw.decode("utf-8-sig")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read as UTF-8 text ({e})") from None


def _same_columns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in columns} for r in rows]


def read_csv_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of a CSV file (header line first) as ``{column: cell text}``.

    Raises:
        DataError: naming the file and line: no header, an empty or repeated column name, a row with
            more cells than the header, a CSV syntax error, or no rows.
    """
    reader = csv.reader(io.StringIO(_text(path), newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: the file is empty (expected a header line of column names)")
        for name in header:
            if not name.strip():
                raise DataError(f"{path}: line 1: an empty column name in the header {header}")
            if header.count(name) > 1:
                raise DataError(f"{path}: line 1: column {name!r} appears {header.count(name)} times in the header")
        rows = []
        for cells in reader:
            if not cells:  # a blank line
                continue
            if len(cells) > len(header):
                raise DataError(f"{path}: line {reader.line_num}: {len(cells)} cells but the header has "
                                f"{len(header)} columns ({', '.join(header)})")
            rows.append({name: cells[i] if i < len(cells) else None for i, name in enumerate(header)})
    except csv.Error as e:
        raise DataError(f"{path}: line {reader.line_num}: not valid CSV ({e})") from None
    if not rows:
        raise DataError(f"{path}: no rows after the header line")
    return rows


def _json_loads(text: str) -> Any:
    """``json.loads`` keeping each number's text (``parse_int`` / ``parse_float`` / ``parse_constant``
    get it as written: ``0.50``, ``NaN``)."""
    return json.loads(text, parse_int=str, parse_float=str, parse_constant=str)


def read_json_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of a JSON lines file (one object a line; blank lines skipped) or of a JSON file
    holding one array of objects.

    Raises:
        DataError: naming the file and line: a line that is not valid JSON or not an object, an empty
            file.
    """
    text = _text(path)
    if not text.strip():
        raise DataError(f"{path}: the file is empty")
    if text.lstrip().startswith("["):
        try:
            rows = _json_loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
        for i, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                raise DataError(f"{path}: item {i} of the array: not a JSON object")
        return _same_columns(rows)
    rows = []
    for k, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = _json_loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {k}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}: line {k}: not a JSON object")
        rows.append(row)
    return _same_columns(rows)
