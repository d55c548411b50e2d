"""A plug-in task for the interrupt test (``tests/test_rundir.py``): Countdown whose reward, from its
``$MASKRL_TEST_REWARD_FREE``-th batch on (0-based; unset: never), waits until the file
``$MASKRL_TEST_REWARD_GATE`` exists, so that a signal lands mid-run whatever the machine's speed:
the test opens the gate after sending it. The wait is capped at ``$MASKRL_TEST_WAIT_CAP_S`` (a hang)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from maskrl.tasks.base import TASKS
from maskrl.tasks.countdown import Countdown


@TASKS.register("slow_countdown")
class SlowCountdown(Countdown):
    """Countdown with a gated reward (see the module docstring)."""

    batches = 0

    def score_examples(self, examples, completions):
        free = os.environ.get("MASKRL_TEST_REWARD_FREE")
        if free is not None and SlowCountdown.batches >= int(free):
            gate = Path(os.environ["MASKRL_TEST_REWARD_GATE"])
            cap = time.monotonic() + float(os.environ.get("MASKRL_TEST_WAIT_CAP_S", "3600"))
            while not gate.exists():
                if time.monotonic() > cap:
                    raise RuntimeError(f"slow_countdown: the gate {gate} never opened (a hang)")
                time.sleep(0.05)
        SlowCountdown.batches += 1
        return super().score_examples(examples, completions)
