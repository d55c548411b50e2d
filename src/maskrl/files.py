"""Small file helpers shared by the commands and the harness."""
from __future__ import annotations

import json
from pathlib import Path


def write_json(path: str | Path, obj) -> None:
    """Write ``obj`` to ``path`` as indented JSON with a final newline, creating the folder."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")
