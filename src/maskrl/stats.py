"""Confidence intervals for reported metrics (SPEC §5: "accuracy with a 95 % confidence interval")."""
from __future__ import annotations

import math
from typing import Sequence

Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    Args:
        successes: number of successes, ``0 <= successes <= n``.
        n: number of trials; ``n = 0`` gives ``(0.0, 1.0)``.
        z: normal quantile (1.96 for 95 %).

    Returns:
        ``(low, high)`` in ``[0, 1]``.

    Raises:
        ValueError: if ``successes`` is outside ``[0, n]``.
    """
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} must lie in [0, n={n}]")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """Mean and normal-approximation 95 % interval ``mean ± z·sd/sqrt(n)`` of bounded scores.

    Returns:
        ``(mean, low, high)``; for fewer than 2 values the interval is the mean itself.
    """
    n = len(values)
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = sum(values) / n
    if n < 2:
        return mean, mean, mean
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = z * math.sqrt(var / n)
    return mean, mean - half, mean + half


def accuracy_summary(rewards: Sequence[float], correct: Sequence[bool]) -> dict:
    """The metric block written to every summary JSON.

    Returns:
        ``{"n", "accuracy", "accuracy_ci95": [lo, hi], "mean_reward", "mean_reward_ci95": [lo, hi]}``.
    """
    n = len(rewards)
    k = int(sum(bool(c) for c in correct))
    lo, hi = wilson_interval(k, n)
    mean, mlo, mhi = mean_interval(list(rewards))
    return {
        "n": n,
        "accuracy": k / n if n else 0.0,
        "accuracy_ci95": [lo, hi],
        "mean_reward": mean,
        "mean_reward_ci95": [mlo, mhi],
    }
