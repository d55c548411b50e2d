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


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar test of two paired binary outcomes.

    Args:
        b: pairs where only the first model is correct (discordant one way).
        c: pairs where only the second model is correct (discordant the other way).

    Returns:
        ``p = min(1, 2 · P(X <= min(b, c)))`` with ``X ~ Binomial(b + c, 1/2)`` (the exact conditional
        test: under the null each discordant pair goes either way with probability 1/2); ``1.0`` when
        ``b + c = 0``. Computed with exact integer binomial sums (McNemar 1947; the exact form as in
        Fagerland, Lydersen & Laake 2013).

    Raises:
        ValueError: a negative count.
    """
    if b < 0 or c < 0:
        raise ValueError(f"counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_bootstrap_ci(first: Sequence[float], second: Sequence[float], resamples: int = 10_000, seed: int = 0,
                        level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(second − first)`` over paired items.

    Items (pairs) are resampled with replacement, ``resamples`` times, from a ``torch.Generator`` seeded
    with ``seed`` (the global RNG is not touched); the interval is the ``(1−level)/2`` and
    ``(1+level)/2`` quantiles (linear interpolation) of the resampled mean differences (Efron &
    Tibshirani 1993, percentile method). Resampling pairs keeps the correlation between the two
    evaluations of the same item, which two unpaired intervals ignore.

    Args:
        first, second: per-item scores of the two models on the same items, equal length ``n >= 1``
            (e.g. 0/1 correctness).
        resamples: number of bootstrap resamples.
        seed: generator seed.
        level: coverage of the interval.

    Returns:
        ``(low, high)``.

    Raises:
        ValueError: different lengths, no items, ``resamples < 1`` or ``level`` outside (0, 1).
    """
    import torch

    if len(first) != len(second):
        raise ValueError(f"paired scores need equal lengths, got {len(first)} and {len(second)}")
    if not first:
        raise ValueError("paired_bootstrap_ci: no items")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"resamples (={resamples}) must be >= 1 and level (={level}) in (0, 1)")
    diff = torch.tensor([float(s) - float(f) for f, s in zip(first, second)], dtype=torch.float64)  # [n]
    gen = torch.Generator().manual_seed(seed)
    n = diff.numel()
    means = torch.empty(resamples, dtype=torch.float64)
    chunk = max(1, 2_000_000 // n)  # bounded memory: chunk × n indices at a time
    for s in range(0, resamples, chunk):
        k = min(chunk, resamples - s)
        idx = torch.randint(n, (k, n), generator=gen)
        means[s:s + k] = diff[idx].mean(-1)
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(means, q).tolist()
    return lo, hi


def paired_comparison(first_correct: Sequence[bool], second_correct: Sequence[bool], resamples: int = 10_000,
                      seed: int = 0) -> dict:
    """Paired comparison of two models' correctness on the same items (e.g. the demo's base and final
    evaluations on the same puzzles).

    Returns:
        ``{"n", "both", "neither", "first_only", "second_only", "gain"`` (accuracy of second − first),
        ``"gain_ci95"`` (paired percentile bootstrap, :func:`paired_bootstrap_ci`), ``"mcnemar_p"``
        (exact, :func:`mcnemar_exact`), ``"bootstrap": {"resamples", "seed", "method"}}``.

    Raises:
        ValueError: different lengths or no items.
    """
    if len(first_correct) != len(second_correct):
        raise ValueError(f"paired results need equal lengths, got {len(first_correct)} and {len(second_correct)}")
    if not first_correct:
        raise ValueError("paired_comparison: no items")
    f = [bool(x) for x in first_correct]
    s = [bool(x) for x in second_correct]
    b = sum(x and not y for x, y in zip(f, s))
    c = sum(y and not x for x, y in zip(f, s))
    n = len(f)
    lo, hi = paired_bootstrap_ci([float(x) for x in f], [float(y) for y in s], resamples, seed)
    return {"n": n, "both": sum(x and y for x, y in zip(f, s)), "neither": sum(not x and not y for x, y in zip(f, s)),
            "first_only": b, "second_only": c, "gain": (c - b) / n, "gain_ci95": [lo, hi],
            "mcnemar_p": mcnemar_exact(b, c),
            "bootstrap": {"resamples": resamples, "seed": seed, "method": "percentile, pairs resampled"}}
