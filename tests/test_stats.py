"""Issue 13 item 11: paired comparison of two evaluations on the same rows (exact McNemar, paired
bootstrap), and the demo's per-row files and summary wiring."""
from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import write_sudoku_csv
from maskrl.stats import mcnemar_exact, paired_bootstrap_ci, paired_comparison


@pytest.mark.parametrize("b,c,want", [
    (1, 9, 2 * (1 + 10) / 1024),          # 2·[C(10,0)+C(10,1)]/2^10
    (9, 1, 2 * (1 + 10) / 1024),          # symmetric
    (0, 6, 2 / 64),                       # 2·C(6,0)/2^6
    (3, 0, 2 / 8),
    (5, 5, 1.0),                          # 2·638/1024 > 1 -> 1
    (0, 0, 1.0),                          # no discordant pair
    (2, 8, 2 * (1 + 10 + 45) / 1024),     # 0.109375
    (20, 40, 2 * sum(math.comb(60, i) for i in range(21)) / 2**60),
])
def test_mcnemar_exact_hand_values(b, c, want):
    assert mcnemar_exact(b, c) == pytest.approx(want, rel=1e-12)


def test_mcnemar_exact_known_decimal():
    # b = 2, c = 8: 0.109375 exactly (the textbook example of the exact conditional test)
    assert mcnemar_exact(2, 8) == 0.109375
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 3)


def _reference_bootstrap(first, second, resamples, seed, level=0.95):
    """Slow obvious reference: same generator draws, Python means, hand percentile interpolation."""
    n = len(first)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(n, (resamples, n), generator=g).tolist()
    d = [s - f for f, s in zip(first, second)]
    means = sorted(sum(d[i] for i in row) / n for row in idx)

    def q(p):
        h = (resamples - 1) * p
        lo = math.floor(h)
        hi = min(lo + 1, resamples - 1)
        return means[lo] + (h - lo) * (means[hi] - means[lo])

    return q((1 - level) / 2), q((1 + level) / 2)


def test_paired_bootstrap_matches_slow_reference():
    first = [1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 1]
    second = [1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1]
    got = paired_bootstrap_ci(first, second, resamples=2000, seed=3)
    want = _reference_bootstrap(first, second, 2000, 3)
    assert got == pytest.approx(want, abs=1e-12)
    assert got == paired_bootstrap_ci(first, second, resamples=2000, seed=3)  # seeded: reproducible


def test_paired_bootstrap_agrees_with_normal_approximation_at_large_n():
    # 400 rows: 60 solved only by the second, 20 only by the first -> gain 0.1, sd(d) = sqrt(0.19)
    first = [0] * 60 + [1] * 20 + [1] * 100 + [0] * 220
    second = [1] * 60 + [0] * 20 + [1] * 100 + [0] * 220
    lo, hi = paired_bootstrap_ci(first, second, resamples=20_000, seed=0)
    half = 1.959964 * math.sqrt(0.19 / 400)
    assert lo == pytest.approx(0.1 - half, abs=0.006) and hi == pytest.approx(0.1 + half, abs=0.006)


def test_paired_bootstrap_degenerate_and_errors():
    assert paired_bootstrap_ci([0, 1, 1], [1, 2, 2], resamples=50) == pytest.approx((1.0, 1.0))
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap_ci([1], [1, 0])
    with pytest.raises(ValueError, match="no items"):
        paired_bootstrap_ci([], [])


def test_paired_comparison_counts():
    base = [True, True, False, False, False, True]
    final = [True, False, True, True, False, True]
    p = paired_comparison(base, final, resamples=500, seed=1)
    assert (p["n"], p["both"], p["neither"], p["first_only"], p["second_only"]) == (6, 2, 1, 1, 2)
    assert p["gain"] == pytest.approx(1 / 6)
    assert p["mcnemar_p"] == 1.0  # b = 1, c = 2: 2·(C(3,0)+C(3,1))/8 = 1
    lo, hi = p["gain_ci95"]
    assert lo <= p["gain"] <= hi


def test_demo_writes_per_row_results_and_paired_summary(tmp_path, capsys):
    from maskrl.config import load_config
    from maskrl.demo import run_demo

    data = write_sudoku_csv(tmp_path / "sudoku.csv", 5, seed=11)
    cfg = load_config(["configs/demo_sudoku.yaml"], [
        f"output_dir={tmp_path}/demo", f"task.data_path={data}", "task.train_size=16", "model.tiny.hidden_size=32",
        "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.intermediate_size=32", "sft.steps=2",
        "sft.batch_size=4", "train.steps=1", "train.prompts_per_step=2", "train.group_size=2",
        "train.micro_batch_size=0", "train.eval_every=0"])
    s = run_demo(cfg)
    out = tmp_path / "demo"
    base = [json.loads(x) for x in (out / "eval_base.jsonl").read_text().splitlines()]
    final = [json.loads(x) for x in (out / "eval_final.jsonl").read_text().splitlines()]
    assert len(base) == len(final) == 5 and [r["id"] for r in base] == [r["id"] for r in final]
    assert set(base[0]) == {"id", "completion", "reward", "correct"}
    b = sum(x["correct"] and not y["correct"] for x, y in zip(base, final))
    c = sum(y["correct"] and not x["correct"] for x, y in zip(base, final))
    saved = json.loads((out / "summary.json").read_text())
    p = saved["paired"]
    assert (p["first_only"], p["second_only"], p["n"]) == (b, c, 5)
    assert p["mcnemar_p"] == mcnemar_exact(b, c)
    assert p["gain"] == pytest.approx(s["final"]["accuracy"] - s["base"]["accuracy"])
    assert saved["per_item"] == {"base": "eval_base.jsonl", "final": "eval_final.jsonl"}
    assert "McNemar p" in capsys.readouterr().out
    card = json.loads((out / "model" / "maskrl_prompt.json").read_text())
    assert card["prompt_template"] == "{puzzle}=" and card["eval_sampler"]["steps"] == 16
    # docs/demo.md's eval command on the saved model reproduces the demo's final evaluation, row by row
    from maskrl.cli import main

    assert main(["eval", "--model", str(out / "model"), "--task", "sudoku4x4", "--data", str(data),
                 "--gen-length", "16", "--block-length", "16", "--steps", "16", "--out", str(tmp_path / "ev")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "ev" / "samples_L16.jsonl").read_text().splitlines()]
    assert [r["completion"] for r in rows] == [r["completion"] for r in final]
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["results"][0]["accuracy"] == s["final"]["accuracy"]


# -- statistics over seeds: exact t quantile, paired t-test, Holm, sign-flip / sign / Wilcoxon, d_z ----------
import itertools  # noqa: E402

from maskrl.stats import (holm, paired_t_test, seed_comparison, sign_flip_test, sign_test,  # noqa: E402
                          standardized_effect, t_interval, t_quantile, wilcoxon_test)


@pytest.mark.numerics
def test_t_quantile_closed_forms():
    # df 1 is the Cauchy: t_p = tan(pi (p - 1/2)); df 2: t_p = (2p - 1) / sqrt(2 p (1 - p))
    for p in (0.9, 0.975, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    assert t_quantile(0.975, 4) == pytest.approx(2.7764451051977987, rel=1e-12)  # the table's 2.776, exact
    assert t_quantile(0.975, 1e9) == pytest.approx(1.959963984540054, rel=1e-6)   # -> the normal quantile
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        t_quantile(0.5, 0)


@pytest.mark.numerics
def test_t_interval_by_hand():
    m, lo, hi = t_interval([1.0, 2.0, 3.0])  # sd 1, n 3, df 2: t = 0.95 / sqrt(2 .975 .025)
    t = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    assert m == 2.0 and hi == pytest.approx(2 + t / math.sqrt(3), rel=1e-12) and lo == pytest.approx(2 - t / math.sqrt(3))
    assert t_interval([0.5]) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="finite"):
        t_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="no values"):
        t_interval([])


@pytest.mark.numerics
def test_paired_t_test_closed_forms():
    # df 2: two-sided p = 1 - |t| / sqrt(2 + t^2); df 1: p = 1 - (2/pi) atan|t|
    d = [0.1, 0.3, 0.2]
    r = paired_t_test(d)
    t = 0.2 / (0.1 / math.sqrt(3))
    assert r["t"] == pytest.approx(t, rel=1e-12) and r["df"] == 2
    assert r["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-10)
    r1 = paired_t_test([1.0, 3.0])  # mean 2, sd sqrt 2, t = 2 / (sqrt2 / sqrt2) = 2
    assert r1["t"] == pytest.approx(2.0) and r1["p"] == pytest.approx(1 - 2 / math.pi * math.atan(2.0), rel=1e-10)
    assert paired_t_test([0.02, 0.02, 0.02])["p"] == 0.0 and paired_t_test([0.0, 0.0])["p"] == 1.0
    assert math.isnan(paired_t_test([0.3])["p"])
    # the sign of t follows the mean
    assert paired_t_test([-x for x in d])["t"] == pytest.approx(-t)


def _holm_reference(ps):
    """Holm by its definition: hypothesis i is rejected at level a iff every hypothesis with a smaller or
    equal p (in sorted order up to i) satisfies p_(j) <= a / (m - j + 1); the adjusted p is the smallest
    such a (searched over the candidate levels (m - j + 1) p_(j), capped at 1)."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    cands = sorted({min(1.0, (m - j) * ps[order[j]]) for j in range(m)} | {1.0})
    out = [None] * m
    for k, i in enumerate(order):
        for a in cands:
            if all(ps[order[j]] <= a / (m - j) + 1e-15 for j in range(k + 1)):
                out[i] = a
                break
    return out


def test_holm_by_hand_and_against_its_definition():
    # sorted 0.01, 0.03, 0.04, 0.5 with m 4: 0.04, max(0.04, 0.09), max(0.09, 0.08), max(0.09, 0.5)
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.3, 0.6]) == pytest.approx([0.6, 0.6]) and holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []
    out = holm([0.02, float("nan"), 0.01])
    assert math.isnan(out[1]) and out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.02)
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        ps = torch.rand(int(torch.randint(1, 8, (1,), generator=g)), generator=g, dtype=torch.float64).mul(0.2).tolist()
        assert holm(ps) == pytest.approx(_holm_reference(ps), abs=1e-12)
    with pytest.raises(ValueError):
        holm([1.5])


def _sign_flip_reference(d):
    """Every one of the 2^n sign assignments, in a Python loop."""
    obs = abs(sum(d) / len(d))
    hits = sum(abs(sum(s * x for s, x in zip(signs, d)) / len(d)) >= obs - 1e-12
               for signs in itertools.product((1, -1), repeat=len(d)))
    return hits / 2 ** len(d)


@pytest.mark.numerics
def test_sign_flip_against_the_loop_and_its_floor():
    assert sign_flip_test([0.1, 0.2, 0.3, 0.25, 0.15]) == pytest.approx(2 / 32)  # 5 seeds agree: the floor 0.0625
    assert sign_flip_test([0.01 * (i + 1) for i in range(10)]) == pytest.approx(2 / 1024)  # 10 seeds: < 0.01
    g = torch.Generator().manual_seed(0)
    for n in (3, 5, 8, 10):
        for _ in range(5):
            d = (torch.randn(n, generator=g, dtype=torch.float64) + 0.5).tolist()
            assert sign_flip_test(d) == pytest.approx(_sign_flip_reference(d), abs=1e-12), d
    assert sign_flip_test([0.1, -0.2, 0.3, 0.05, 0.0]) == pytest.approx(_sign_flip_reference([0.1, -0.2, 0.3, 0.05, 0.0]))
    assert sign_flip_test([0.0, 0.0]) == 1.0
    with pytest.raises(ValueError, match="> 24"):
        sign_flip_test([0.1] * 25)


def test_sign_test_by_hand():
    assert sign_test([0.1] * 5) == pytest.approx(2 / 32)
    assert sign_test([0.1, 0.2, -0.1, 0.0]) == 1.0  # the zero dropped; 2+ 1-: 2 (1 + 3) / 8 = 1, capped
    assert sign_test([0.1, 0.2, 0.3, -0.1, 0.2, 0.1]) == pytest.approx(2 * (1 + 6) / 64)
    assert sign_test([0.1] * 9 + [-0.1]) == pytest.approx(2 * (1 + 10) / 1024)
    assert sign_test([0.0, 0.0]) == 1.0


def _wilcoxon_reference(d):
    """Exact two-sided signed-rank p by enumerating which of the non-zero differences are positive: zeros
    dropped, tied magnitudes at their mid-rank (the slow, obvious reference)."""
    nz = [x for x in d if x != 0]
    mags = sorted(abs(x) for x in nz)
    rank = {v: sum(i + 1 for i, m in enumerate(mags) if m == v) / mags.count(v) for v in mags}
    ranks = [rank[abs(x)] for x in nz]
    w_plus = sum(r for r, x in zip(ranks, nz) if x > 0)
    dist = [sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product((0, 1), repeat=len(nz))]
    eps = 1e-9
    lo = sum(w <= w_plus + eps for w in dist) / len(dist)
    hi = sum(w >= w_plus - eps for w in dist) / len(dist)
    return min(1.0, 2 * min(lo, hi))


@pytest.mark.numerics
def test_wilcoxon_by_hand_and_against_enumeration():
    assert wilcoxon_test([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2 / 32)
    # W- = 3 (rank of -3): subsets of {1..5} with sum <= 3 are {}, {1}, {2}, {3}, {1,2}: p = 2 * 5/32
    assert wilcoxon_test([1.0, 2.0, -3.0, 4.0, 5.0]) == pytest.approx(10 / 32)
    # ties by hand: |d| = 1, 1, 2 -> mid-ranks 1.5, 1.5, 3; W+ = 1.5 + 3 = 4.5; the 8 sign assignments give
    # W+ in {0, 1.5, 1.5, 3, 3, 4.5, 4.5, 6}: P(W+ >= 4.5) = 3/8, so p = 2 * 3/8
    assert wilcoxon_test([1.0, -1.0, 2.0]) == pytest.approx(_wilcoxon_reference([1.0, -1.0, 2.0]))
    assert wilcoxon_test([1.0, -1.0, 2.0]) == pytest.approx(6 / 8)
    g = torch.Generator().manual_seed(1)
    for n in (5, 7, 10):
        d = (torch.randn(n, generator=g, dtype=torch.float64) + 0.3).tolist()
        assert wilcoxon_test(d) == pytest.approx(_wilcoxon_reference(d), abs=1e-12), d
    for n in (6, 9, 10):  # scores on 500 rows: differences are multiples of 1/500, with ties and zeros
        a = torch.randint(150, 180, (n,), generator=g).tolist()
        b = torch.randint(145, 175, (n,), generator=g).tolist()
        d = [x / 500 - y / 500 for x, y in zip(a, b)]
        exact = _wilcoxon_reference([x - y for x, y in zip(a, b)])  # integers: ties are exact
        assert wilcoxon_test(d) == pytest.approx(exact, abs=1e-12), d
    assert wilcoxon_test([0.0, 0.0, 0.0]) == 1.0


@pytest.mark.numerics
def test_standardized_effect_interval():
    from scipy import stats

    d = [0.1, 0.2, 0.3, 0.25, 0.15]
    e = standardized_effect(d)
    m = 0.2
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / 4)
    assert e["d_z"] == pytest.approx(m / sd, rel=1e-12)
    lo, hi = e["ci"]
    t = m / sd * math.sqrt(5)
    # the bounds are where the observed t sits at the 97.5 % / 2.5 % points of the noncentral t
    assert stats.nct.cdf(t, 4, lo * math.sqrt(5)) == pytest.approx(0.975, abs=1e-9)
    assert stats.nct.cdf(t, 4, hi * math.sqrt(5)) == pytest.approx(0.025, abs=1e-9)
    assert lo < e["d_z"] < hi
    neg = standardized_effect([-x for x in d])
    assert neg["ci"] == pytest.approx([-hi, -lo], rel=1e-7)  # symmetric in the sign
    assert math.isnan(standardized_effect([0.2, 0.2])["d_z"])


def test_seed_comparison_collects_every_test():
    d = [0.02, 0.05, -0.01, 0.04, 0.03]
    r = seed_comparison(d)
    assert r["n"] == 5 and r["positive"] == 4 and r["negative"] == 1
    assert r["ci95"] == pytest.approx(list(t_interval(d)[1:])) and r["p_t"] == pytest.approx(paired_t_test(d)["p"])
    assert r["p_signflip"] == pytest.approx(_sign_flip_reference(d)) and r["p_sign"] == pytest.approx(sign_test(d))
