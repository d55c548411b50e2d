"""maskrl bench overhead: the JSON carries the method's named ratios, taken within one run."""
from __future__ import annotations

import json

import pytest

from maskrl.bench_overhead import OVERHEAD_METHODS, OverheadMethod, run_overhead_bench
from maskrl.cli import main


def test_overhead_bench_writes_ratios_of_one_run(tmp_path, monkeypatch):
    # two cheap variants: the ratio keys come from the same repetitions
    monkeypatch.setitem(OVERHEAD_METHODS, "toy", OverheadMethod(
        variants={"base": ["train.prompts_per_step=1", "train.group_size=2"],
                  "bigger": ["train.prompts_per_step=2", "train.group_size=2"]},
        ratios={"bigger_step_ratio": "bigger"}))
    res = run_overhead_bench("toy", tmp_path / "o.json", reps=2)
    on_disk = json.loads((tmp_path / "o.json").read_text())
    assert on_disk["bigger_step_ratio"] == pytest.approx(res["bigger_step_ratio"])
    assert on_disk["ratio_to_base"]["base"]["median"] == pytest.approx(1.0)
    assert on_disk["step_seconds"]["bigger"]["n"] == 2
    times = on_disk["step_seconds"]
    assert res["bigger_step_ratio"] > 0 and times["base"]["min"] > 0
    # every timing was written as it finished: 2 repetitions x 2 variants, in order
    assert on_disk["complete"] is True
    assert [(c["rep"], c["variant"]) for c in on_disk["cells"]] == [(0, "base"), (0, "bigger"), (1, "base"), (1, "bigger")]
    assert min(c["seconds"] for c in on_disk["cells"] if c["variant"] == "bigger") == times["bigger"]["min"]


def test_overhead_bench_names_valid_methods(tmp_path, capsys):
    assert main(["bench", "overhead", "--method", "nope", "--out", str(tmp_path / "x.json")]) == 2
    assert "valid: daca" in capsys.readouterr().err


@pytest.mark.parametrize("reps", ["0", "-2"])
def test_overhead_bench_refuses_fewer_than_one_repetition(tmp_path, capsys, reps):
    """--reps 0 ran the default 7 repetitions (``reps or 7``), silently; -2 ran none."""
    assert main(["bench", "overhead", "--method", "daca", "--reps", reps, "--out", str(tmp_path / "o.json")]) == 2
    assert f"maskrl bench: error: --reps: must be >= 1, got {reps}" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_dtca_overhead_variants_are_valid_configs():
    from maskrl.bench_overhead import BASE_SETS
    from maskrl.config import load_config
    from maskrl.credit import DTCA, RLDFSteps
    from maskrl.objectives import RLDF

    spec = OVERHEAD_METHODS["dtca"]
    assert next(iter(spec.variants)) == "rldf" and spec.ratios["dtca_step_ratio"] == "dtca"
    cfgs = {n: load_config([], [*BASE_SETS, *sets]) for n, sets in spec.variants.items()}
    assert all(isinstance(c.objective, RLDF) and c.rollout.schedule == "threshold" for c in cfgs.values())
    assert cfgs["rldf"].credit == [RLDFSteps()] and cfgs["dtca"].credit == [DTCA()]
