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
