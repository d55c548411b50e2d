"""A plug-in task for the interrupt test (``tests/test_rundir.py``): Countdown whose reward sleeps
``$MASKRL_TEST_REWARD_SLEEP`` seconds per batch (default 0), so that a signal lands mid-run."""
from __future__ import annotations

import os
import time

from maskrl.tasks.base import TASKS
from maskrl.tasks.countdown import Countdown


@TASKS.register("slow_countdown")
class SlowCountdown(Countdown):
    """Countdown with a slow reward (see the module docstring)."""

    def score_examples(self, examples, completions):
        time.sleep(float(os.environ.get("MASKRL_TEST_REWARD_SLEEP", "0")))
        return super().score_examples(examples, completions)
