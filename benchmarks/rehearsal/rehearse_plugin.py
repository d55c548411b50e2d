"""Plug-in tasks of the 8B rehearsal (``benchmarks/rehearsal/rehearse_8b.py``): each shipped 8B recipe's task with
the same data, prompt template and grader, registered as ``rehearse_<task>``, whose training reward is a
deterministic function of the completion text.

A randomly initialised stand-in never solves GSM8K, MATH-500, Countdown or Sudoku, so the task's own
reward is 0 for every rollout, every group advantage is 0 and an RL step changes nothing: the resume,
export and evaluation checks would then compare untouched weights. Here the reward is bit 0 of the
completion's SHA-256 (the task's own grader still runs first, so its code path is exercised, and its
score is returned when it is positive). The reward depends on the text alone, so an uninterrupted and a
resumed run see the same rewards for the same completions.

``rehearse_math500`` also gives training rows: the shipped recipes train on MATH's train split
(``math500/train.jsonl``, :meth:`maskrl.tasks.math.MATH500.train_split`), which ``../shared/data`` does
not hold (the rehearsal's ``data`` phase records the missing file), so this stand-in trains on the
first rows of the test file. A rehearsal only; never a result.

The task keeps its own ``name`` (``gsm8k``, ...), so the prompt card of an export names the real task and
``maskrl eval --task gsm8k`` picks it up.
"""
from __future__ import annotations

import hashlib

import maskrl.tasks  # noqa: F401  (registers the built-in tasks)
from maskrl.tasks.base import TASKS


def hashed_reward(text: str) -> float:
    """1.0 when bit 0 of ``sha256(text)`` is set, else 0.0."""
    return float(hashlib.sha256(text.encode("utf-8")).digest()[0] & 1)


def _rehearsal(name: str):
    base = TASKS.get(name)

    class Rehearsal(base):
        __doc__ = f"{base.__name__} with a hashed training reward (module docstring)."

        def score_examples(self, examples, completions):
            own = super().score_examples(examples, completions)
            return [max(float(r), hashed_reward(c)) for r, c in zip(own, completions)]

    Rehearsal.__name__ = Rehearsal.__qualname__ = f"Rehearsal{base.__name__}"
    return Rehearsal


class _RehearsalMATH500(_rehearsal("math500")):
    """MATH-500 with a hashed reward, training on the test file's rows (module docstring)."""

    def train_split(self, path=None):
        return self.load(path)


_TASKS = {f"rehearse_{n}": _rehearsal(n) for n in ("gsm8k", "countdown", "sudoku4x4")}
_TASKS["rehearse_math500"] = _RehearsalMATH500
for _key, _cls in _TASKS.items():
    if _key not in TASKS:  # imported a second time under another module name: registered already
        TASKS.register(_key)(_cls)
