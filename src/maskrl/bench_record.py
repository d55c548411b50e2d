"""A benchmark's JSON file, written as the benchmark goes: each cell's record as soon as it is measured.

A bench that is stopped (Ctrl-C, a killed job, a machine taken back) keeps every cell it finished:
the file always holds the header, the list ``cells`` of finished measurements and ``complete``
(false until :meth:`BenchRecord.finish` adds the summary). Each write replaces the file atomically
(a temporary file in the same folder, then ``os.replace``), so a reader never sees half a file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["BenchRecord"]


class BenchRecord:
    """The JSON of one bench run at ``out``, rewritten after every cell.

    Args:
        out: the JSON file (its folder is created).
        header: the run's description (``benchmark``, settings, machine, ...), written at once.

    Raises:
        OSError: when the file cannot be written (at the start, before anything is measured).
    """

    def __init__(self, out: str | Path, header: dict):
        self.path = Path(out)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.data: dict = {**header, "complete": False, "cells": []}
        self.write()

    def cell(self, record: dict) -> None:
        """Append one finished measurement (a JSON-able dict) and rewrite the file."""
        self.data["cells"].append(record)
        self.write()

    def update(self, **parts) -> None:
        """Add finished parts of the summary (e.g. one table of several) and rewrite the file."""
        self.data.update(parts)
        self.write()

    def finish(self, **summary) -> dict:
        """Add the summary, mark the run ``complete`` and rewrite the file; returns the data."""
        self.data.update(summary)
        self.data["complete"] = True
        self.write()
        return self.data

    def write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        os.replace(tmp, self.path)
