"""Pinned values of the sampler and the trainer (tests/golden/pin.py): every Rollout field over a
matrix of sampler settings, and the weights and metrics after two RL steps of six recipes, must
equal the digests recorded before the split-by-seam refactor. The bit-exact tests elsewhere compare
two code paths in one process; a change that moves both passes them, and fails here.

Recorded per machine key (torch version, ATen CPU kernel set, threads, processor: maskrl.machine):
MKL's and oneDNN's kernels differ across processors even at one kernel set, so on a key that was
never recorded the test skips and says so. Re-record only for a change
that is meant to move values: ``python tests/golden/pin.py``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "golden"))
import pin  # noqa: E402


def _recorded():
    data = json.loads(pin.DIGESTS.read_text())
    key = pin.machine_key()
    if key not in data:
        pytest.skip(f"no golden digests for {key} (recorded: {sorted(data)}); float kernels differ across CPUs")
    return data[key]


def _diff(want: dict, got: dict) -> list[str]:
    return [f"{case}: {sorted(k for k in set(want[case]) | set(got.get(case, {})) if want[case].get(k) != got.get(case, {}).get(k))}"
            for case in want if want[case] != got.get(case)]


def test_sampler_outputs_equal_the_pinned_digests():
    want = _recorded()["sampler"]
    got = pin.sampler_digests()
    assert set(got) == set(want)
    assert not _diff(want, got), _diff(want, got)


def test_trainer_weights_and_metrics_equal_the_pinned_digests():
    want = _recorded()["trainer"]
    got = pin.trainer_digests()
    assert set(got) == set(want)
    assert not _diff(want, got), _diff(want, got)
