"""CI's stages as the docs describe them (docs/testing.md): ``make test`` is the README's command and
skips the tests marked ``slow``; ``make test-slow`` runs those; ``.ci/run`` runs both, in that order."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _recipe(target: str) -> list[str]:
    """The command lines of a Makefile target."""
    text = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert m, f"Makefile has no target {target}"
    return [line.strip() for line in m.group(1).splitlines()]


def test_make_test_skips_slow_and_make_test_slow_runs_it():
    test = [c for c in _recipe("test") if "pytest" in c]
    assert len(test) == 2 and '-m "not slow"' in test[0] and '-m "numerics and not slow"' in test[1]
    assert "ATEN_CPU_CAPABILITY=default" in test[1]
    slow = [c for c in _recipe("test-slow") if "pytest" in c]
    assert slow == ["$(BIN)/python -m pytest -q -m slow tests"]


def test_ci_runs_the_readme_command_then_the_slow_stage():
    run = (ROOT / ".ci" / "run").read_text()
    stages = re.findall(r"^stage (\S+)", run, re.M)
    assert stages == ["test", "test-slow"]
    assert "make test" in (ROOT / "README.md").read_text()


def test_markers_are_registered():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    names = {m.split(":")[0] for m in markers}
    assert {"slow", "numerics"} <= names
