"""Two worker processes for a side-by-side timing of this checkout's code against git revision ``REV``'s
(the ``--before REV`` mode of ``dual_cache_profile.py`` and ``block_rollout_speed.py``): ``REV``'s ``src``
is unpacked with ``git archive``; each worker runs the calling script with ``--worker`` and the caller's
arguments, one thread, with its code version first on ``PYTHONPATH``, and answers one JSON line per request
line. Not a script of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start(script: str, rev: str, argv: list[str]) -> dict[str, subprocess.Popen]:
    """``{"after": this checkout's worker, "before": REV's}``, each ready (its first line read)."""
    before = tempfile.mkdtemp(prefix="maskrl-before-")
    subprocess.run(f"git -C {ROOT} archive {rev} src | tar -x -C {before}", shell=True, check=True)
    procs = {}
    for name, src in (("after", ROOT / "src"), ("before", Path(before) / "src")):
        env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
        procs[name] = subprocess.Popen([sys.executable, script, "--worker", *argv], env=env, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        json.loads(procs[name].stdout.readline())
    return procs


def ask(proc: subprocess.Popen, request: str) -> dict:
    """The worker's JSON answer to one request line."""
    proc.stdin.write(request + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def stop(procs: dict[str, subprocess.Popen]) -> None:
    for p in procs.values():
        p.stdin.close()
        p.wait()
