"""``maskrl bench sampler``: structure of the JSON (the numbers themselves live in benchmarks' output)."""
import json

import pytest

from maskrl.bench import bench_sampler_speed, sampler_settings
from maskrl.cli import main


#: a model and batch that bench in milliseconds
SMALL = dict(batch=2, prompt_length=4, block_length=4, hidden_size=16, num_layers=1)


def test_settings_cover_cache_by_schedule():
    s = sampler_settings(64, 32, temperature=0.9)
    assert set(s) == {f"{c}/{k}" for c in ("none", "prefix", "dual") for k in ("fixed", "threshold")}
    assert s["dual/threshold"].cache == "dual" and s["dual/threshold"].schedule == "threshold"
    assert s["none/fixed"].steps == 32


def test_speed_bench_reports_every_setting_with_ratios():
    r = bench_sampler_speed(gen_lengths=(8,), reps=2, batch=2, prompt_length=4, block_length=4, hidden_size=16,
                            num_layers=1, log=lambda *_: None)
    res = r["results"]["8"]["2"]
    assert len(res) == 6
    assert res["none/fixed"]["speedup_vs_none_fixed"]["values"] == [1.0, 1.0]
    for v in res.values():
        assert len(v["tokens_per_s"]["values"]) == 2 and v["tokens_per_s"]["median"] > 0
    # fixed schedule L/2 = 4 steps: half a forward row per token; caching does not change the count
    assert res["none/fixed"]["row_forwards_per_token"] == pytest.approx(0.5)
    assert res["dual/fixed"]["row_forwards_per_token"] == pytest.approx(0.5)
    # dual: the block's later steps run only the block's b = 4 query tokens (first step: full 12)
    assert res["dual/fixed"]["query_tokens_per_token"] < res["prefix/fixed"]["query_tokens_per_token"] \
        < res["none/fixed"]["query_tokens_per_token"]


def test_cli_bench_sampler_writes_json(tmp_path):
    out = tmp_path / "b.json"
    assert main(["bench", "sampler", "--quick", "--parts", "sudoku,countdown", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["benchmark"] == "sampler" and rep["sudoku"].startswith("skipped")
    assert main(["bench", "sampler", "--parts", "nope", "--out", str(out)]) == 2


def test_a_stopped_bench_keeps_every_cell_it_measured(tmp_path):
    """Each measurement is written as it finishes: a bench stopped after its third one (Ctrl-C here)
    leaves a valid JSON file with those three cells, marked incomplete."""
    from maskrl.bench import run_sampler_bench

    out = tmp_path / "b.json"
    lines = []

    def log(msg):
        lines.append(msg)
        if len(lines) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sampler_bench(out, gen_lengths=(8,), reps=1, parts=("speed",), log=log, speed_shape=SMALL)
    rep = json.loads(out.read_text())
    assert rep["complete"] is False and "speed" not in rep
    assert [c["setting"] for c in rep["cells"]] == ["none/fixed", "none/threshold", "prefix/fixed"]
    assert all(c["gen_length"] == 8 and c["batch"] == 2 and c["tokens_per_s"] > 0 for c in rep["cells"])
    assert [f"{c['tokens_per_s']:.0f} tok/s" in line for c, line in zip(rep["cells"], lines)] == [True] * 3


def test_quick_bench_measures_one_length_twice(tmp_path):
    from maskrl.bench import QUICK_BATCHES, QUICK_LENGTHS, QUICK_REPS, run_sampler_bench

    rep = run_sampler_bench(tmp_path / "q.json", quick=True, gen_lengths=(8,), parts=("speed",), log=lambda *_: None,
                            speed_shape=SMALL, batches=(1, 2))
    assert (QUICK_LENGTHS, QUICK_BATCHES, QUICK_REPS) == ((64,), (1, 8), 2)
    assert rep["speed"]["reps"] == 2 and rep["complete"] is True
    assert len(rep["cells"]) == 2 * 2 * 6 and json.loads((tmp_path / "q.json").read_text()) == rep


@pytest.mark.parametrize("block_size", [None, 4])
def test_grid_is_batch_by_cache_by_schedule(tmp_path, block_size):
    """One record per batch x cache x schedule x repetition, written as each finishes; the summary holds each
    batch's settings; batched rows take one forward call per step (calls per token = row-forwards / batch)."""
    from maskrl.bench import run_sampler_bench

    rep = run_sampler_bench(tmp_path / "g.json", gen_lengths=(8,), reps=1, parts=("speed",), log=lambda *_: None,
                            speed_shape=SMALL, batches=(1, 3), block_size=block_size)
    caches = ("none", "block") if block_size else ("none", "prefix", "dual")
    settings = [f"{c}/{k}" for c in caches for k in ("fixed", "threshold")]
    assert [(c["batch"], c["setting"]) for c in rep["cells"]] == [(n, s) for n in (1, 3) for s in settings]
    grid = rep["speed"]["results"]["8"]
    assert set(grid) == {"1", "3"} and all(list(grid[n]) == settings for n in grid)
    assert rep["speed"]["model"]["block_size"] == block_size and rep["speed"]["batches"] == [1, 3]
    for n in (1, 3):
        fixed = grid[str(n)]["none/fixed"]
        assert fixed["row_forwards_per_token"] == pytest.approx(0.5)  # L/2 steps, one forward row per step
        assert fixed["forward_calls_per_token"] == pytest.approx(0.5 / n)
        assert grid[str(n)]["none/fixed"]["speedup_vs_none_fixed"]["values"] == [1.0]


def test_bad_batch_sizes_are_refused_before_anything_runs(tmp_path):
    from maskrl.bench import run_sampler_bench

    with pytest.raises(ValueError, match="batch sizes must be >= 1"):
        run_sampler_bench(tmp_path / "x.json", batches=(0, 8), parts=("speed",))
    assert not (tmp_path / "x.json").exists()
    assert main(["bench", "sampler", "--quick", "--batch", "1,2", "--parts", "sudoku", "--out", str(tmp_path / "c.json")]) == 0


@pytest.mark.parametrize("flags, message", [
    (["--gen-length", "x"], r"--gen-length: expected comma-separated integers >= 1 such as '64,128', got 'x'"),
    (["--gen-length", "0"], r"--gen-length: expected comma-separated integers >= 1 such as '64,128', got '0'"),
    (["--batch", "1,,8"], r"--batch: expected comma-separated integers >= 1 such as '1,8', got '1,,8'"),
    (["--reps", "0"], r"--reps: must be >= 1, got 0"),
    (["--block-size", "0"], r"--block-size: must be >= 1, got 0"),
    (["--countdown-block", "-4"], r"--countdown-block: must be >= 1, got -4"),
])
def test_bench_flags_are_checked_naming_the_flag_before_anything_runs(tmp_path, capsys, flags, message):
    """--gen-length x was 'invalid literal for int() with base 10', --block-size 0 the adapter's message,
    and --reps 0 ran the default 2 or 3 repetitions, silently."""
    out = tmp_path / "b.json"
    assert main(["bench", "sampler", "--quick", "--parts", "speed", "--out", str(out), *flags]) == 2
    assert f"maskrl bench: error: {message}".replace("\\", "") in capsys.readouterr().err
    assert not out.exists()
