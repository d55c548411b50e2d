"""Confidence intervals for reported metrics (docs/spec.md §5: "accuracy with a 95 % confidence interval")."""
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


# -- statistics over seeds (paired runs): the verdicts of benchmarks/table/controlled_table.py -----------------
# Every function takes the per-seed paired differences ``d`` (e.g. cell − base, one float per seed) or
# p-values, as plain Python sequences; scipy supplies the distributions (exact t quantiles, the exact
# permutation and signed-rank nulls, the noncentral t), never a hard-coded table.


def _floats(d: Sequence[float], what: str = "differences") -> list[float]:
    vals = [float(x) for x in d]
    if not vals:
        raise ValueError(f"no {what}")
    if any(not math.isfinite(x) for x in vals):
        raise ValueError(f"{what} must be finite, got {vals}")
    return vals


def t_quantile(prob: float, df: float) -> float:
    """The ``prob`` quantile of Student's t with ``df`` degrees of freedom (``scipy.stats.t.ppf``), e.g.
    ``t_quantile(0.975, 4) = 2.7764451...`` for a two-sided 95 % interval over 5 seeds.

    Raises:
        ValueError: ``prob`` outside (0, 1) or ``df <= 0``.
    """
    from scipy import stats

    if not 0.0 < prob < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < prob < 1 and df > 0, got prob={prob}, df={df}")
    return float(stats.t.ppf(prob, df))


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t interval ``mean ± t_{(1+level)/2, n−1}·sd/√n`` (sample sd, n − 1
    denominator; exact quantile, :func:`t_quantile`). One value: the interval is the value itself.

    Raises:
        ValueError: no values, a non-finite value, or ``level`` outside (0, 1).
    """
    vals = _floats(values, "values")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level (={level}) must lie in (0, 1)")
    n = len(vals)
    m = sum(vals) / n
    if n < 2:
        return m, m, m
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1))
    h = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return m, m - h, m + h


def paired_t_test(d: Sequence[float]) -> dict:
    """Two-sided one-sample t-test of mean(d) = 0 (the paired t-test of two arms run on the same seeds).

    Returns:
        ``{"n", "mean", "sd", "t", "df", "p"}`` with ``t = mean/(sd/√n)`` and ``p = 2·(1 − F_{t,n−1}(|t|))``
        (``scipy.stats.t.sf``). A zero sd gives ``t = ±inf, p = 0`` when the mean is not 0 and
        ``t = 0, p = 1`` when it is; n = 1 gives ``t`` and ``p`` NaN (no test).

    Raises:
        ValueError: no differences or a non-finite one.
    """
    from scipy import stats

    vals = _floats(d)
    n = len(vals)
    m = sum(vals) / n
    if n < 2:
        return {"n": n, "mean": m, "sd": float("nan"), "t": float("nan"), "df": 0, "p": float("nan")}
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1))
    scale = max(abs(v) for v in vals)
    if sd <= 1e-12 * max(scale, 1e-300):  # every difference equal (to float precision)
        t, p = (0.0, 1.0) if m == 0 else (math.copysign(math.inf, m), 0.0)
    else:
        t = m / (sd / math.sqrt(n))
        p = float(2 * stats.t.sf(abs(t), n - 1))
    return {"n": n, "mean": m, "sd": sd, "t": t, "df": n - 1, "p": p}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979) of one family of tests, in the input order.

    Sorted ascending ``p_(1) ≤ … ≤ p_(m)``, ``adj_(k) = min(1, max_{j ≤ k} (m − j + 1)·p_(j))``; a
    hypothesis is rejected at family-wise level α when its adjusted p is ≤ α. NaN p-values (no test)
    stay NaN and do not count towards m.

    Raises:
        ValueError: a p-value outside [0, 1].
    """
    ps = [float(p) for p in pvalues]
    if any(not (0.0 <= p <= 1.0) for p in ps if not math.isnan(p)):
        raise ValueError(f"p-values must lie in [0, 1], got {ps}")
    idx = sorted((i for i, p in enumerate(ps) if not math.isnan(p)), key=lambda i: ps[i])
    m = len(idx)
    out = [float("nan")] * len(ps)
    running = 0.0
    for k, i in enumerate(idx):
        running = max(running, min(1.0, (m - k) * ps[i]))
        out[i] = running
    return out


def sign_flip_test(d: Sequence[float]) -> float:
    """Exact two-sided sign-flip permutation test of mean(d) = 0 (Fisher's randomisation test for
    paired data): under the null each seed's difference is as likely to have either sign, so the p-value
    is the share of the ``2^n`` sign assignments whose mean is at least as far from 0 as the observed one
    (``scipy.stats.permutation_test``, ``permutation_type="samples"``, every assignment enumerated).
    The smallest p it can give is ``2 / 2^n`` (5 seeds: 0.0625; 10 seeds: 0.00195).

    Raises:
        ValueError: no differences, a non-finite one, or more than 24 (2^24 assignments).
    """
    import numpy as np
    from scipy import stats

    vals = _floats(d)
    if len(vals) > 24:
        raise ValueError(f"sign_flip_test enumerates 2^n assignments; n={len(vals)} > 24")
    if all(v == 0 for v in vals):
        return 1.0
    res = stats.permutation_test((np.asarray(vals, dtype=np.float64),), np.mean, permutation_type="samples",
                                 alternative="two-sided", n_resamples=np.inf, vectorized=True)
    return float(min(1.0, res.pvalue))


def sign_test(d: Sequence[float]) -> float:
    """Exact two-sided sign test: ``binomtest(#positive, #nonzero, 1/2)``; zero differences are dropped
    (1.0 when all are zero). Every seed agreeing gives ``2 / 2^n``.

    Raises:
        ValueError: no differences or a non-finite one.
    """
    from scipy import stats

    vals = _floats(d)
    pos, neg = sum(v > 0 for v in vals), sum(v < 0 for v in vals)
    if pos + neg == 0:
        return 1.0
    return float(stats.binomtest(pos, pos + neg, 0.5).pvalue)


def wilcoxon_test(d: Sequence[float], decimals: int = 12) -> float:
    """Two-sided Wilcoxon signed-rank test of a zero median difference with its exact null, ties included:
    zeros are dropped ("wilcox" rule), tied magnitudes get their mid-rank, and the p-value is the share of
    the ``2^n`` sign assignments of those ranks whose ``W+`` lies at least as far out as the observed one
    on either side (``scipy.stats.wilcoxon`` with ``method=PermutationMethod(n_resamples=inf)``: every
    assignment enumerated). Differences are rounded to ``decimals`` first, so that equal differences of
    scores on the same rows (``k/n − j/n``) count as ties whatever their last float bits. 1.0 when every
    difference is zero.

    Raises:
        ValueError: no differences, a non-finite one, or more than 24 non-zero ones (2^24 assignments).
    """
    import numpy as np
    from scipy import stats

    vals = [round(v, decimals) for v in _floats(d)]
    nonzero = sum(v != 0 for v in vals)
    if nonzero == 0:
        return 1.0
    if nonzero > 24:
        raise ValueError(f"wilcoxon_test enumerates 2^n sign assignments; n={nonzero} non-zero differences > 24")
    res = stats.wilcoxon(np.asarray(vals, dtype=np.float64), zero_method="wilcox", alternative="two-sided",
                         method=stats.PermutationMethod(n_resamples=np.inf))
    return float(min(1.0, res.pvalue))


def standardized_effect(d: Sequence[float], level: float = 0.95) -> dict:
    """Cohen's ``d_z = mean(d)/sd(d)`` of paired differences with its exact interval from the noncentral t
    (Steiger & Fouladi 1997): ``√n·d_z`` is noncentral-t with ``n − 1`` df and noncentrality ``√n·δ``, and
    the bounds are the δ at which the observed t sits at the ``(1±level)/2`` quantiles (``scipy.stats.nct``,
    ``scipy.optimize.brentq``).

    Returns:
        ``{"d_z", "ci": [lo, hi]}``; NaN for n < 2 or a zero sd.

    Raises:
        ValueError: no differences, a non-finite one, or ``level`` outside (0, 1).
    """
    from scipy import optimize, stats

    vals = _floats(d)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level (={level}) must lie in (0, 1)")
    n = len(vals)
    nan = {"d_z": float("nan"), "ci": [float("nan"), float("nan")]}
    if n < 2:
        return nan
    m = sum(vals) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1))
    if sd == 0:
        return nan
    dz, df, rn = m / sd, n - 1, math.sqrt(n)
    t = dz * rn

    def bound(target: float) -> float:  # the noncentrality nc with P(T <= t | nc) = target (decreasing in nc)
        f = lambda nc: float(stats.nct.cdf(t, df, nc)) - target  # noqa: E731
        lo, hi = t - 10.0, t + 10.0
        while f(lo) < 0:
            lo -= 10.0
        while f(hi) > 0:
            hi += 10.0
        return optimize.brentq(f, lo, hi, xtol=1e-12)

    return {"d_z": dz, "ci": [bound((1 + level) / 2) / rn, bound((1 - level) / 2) / rn]}


def seed_comparison(d: Sequence[float], level: float = 0.95) -> dict:
    """Everything a verdict reads about one paired comparison over seeds ``d`` (cell − base per seed):
    the mean with its exact t-interval (:func:`t_interval`), the signs, the paired t-test's p, the exact
    sign-flip (:func:`sign_flip_test`), sign and Wilcoxon p-values, and ``d_z`` with its interval.

    Returns:
        ``{"n", "mean", "ci95": [lo, hi], "positive", "negative", "t", "p_t", "p_signflip", "p_sign",
        "p_wilcoxon", "d_z", "d_z_ci95"}``.

    Raises:
        ValueError: as :func:`paired_t_test`.
    """
    vals = _floats(d)
    m, lo, hi = t_interval(vals, level)
    tt = paired_t_test(vals)
    eff = standardized_effect(vals, level)
    return {"n": len(vals), "mean": m, "ci95": [lo, hi], "positive": sum(v > 0 for v in vals),
            "negative": sum(v < 0 for v in vals), "t": tt["t"], "p_t": tt["p"], "p_signflip": sign_flip_test(vals),
            "p_sign": sign_test(vals), "p_wilcoxon": wilcoxon_test(vals), "d_z": eff["d_z"], "d_z_ci95": eff["ci"]}
