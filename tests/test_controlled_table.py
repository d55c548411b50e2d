"""The controlled table (benchmarks/table/controlled_table.py, issue 22): every cell builds and runs one
step (smoke; no accuracy asserted), cells replace exactly their sections, and the summary's
statistics against hand values."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "table"))

import controlled_table as ct  # noqa: E402
import ablation_runs  # noqa: E402
import table_pages as tpg  # noqa: E402
import table_protocol as tp  # noqa: E402
import table_provenance as tprov  # noqa: E402
import table_runs as tr  # noqa: E402
import table_verdicts as tv  # noqa: E402
import table_audit as ta  # noqa: E402
import table_reproduce as trp  # noqa: E402


def test_curve_area_and_mean_curve_by_hand():
    curve = [[0, {"accuracy": 0.2}], [5, {"accuracy": 0.4}], [10, {"accuracy": 0.4}]]
    # trapezoids: 5·0.3 + 5·0.4 = 3.5 over 10 steps
    assert tp.curve_area(curve) == pytest.approx(0.35)
    other = {"val_curve": [[0, {"accuracy": 0.4}], [5, {"accuracy": 0.6}], [10, {"accuracy": 0.8}]]}
    assert tpg.mean_curve([{"val_curve": curve}, other]) == [(0, pytest.approx(0.3)), (5, pytest.approx(0.5)),
                                                           (10, pytest.approx(0.6))]


def test_paired_difference_is_per_seed():
    rows = {s: {"val": {"accuracy": a}} for s, a in enumerate([0.5, 0.6, 0.7])}
    base = {s: {"val": {"accuracy": a}} for s, a in enumerate([0.4, 0.6, 0.5])}
    p = tpg.paired(rows, base, "val", "accuracy")
    d = [0.1, 0.0, 0.2]
    sd = math.sqrt(sum((x - 0.1) ** 2 for x in d) / 2)
    assert p["mean"] == pytest.approx(0.1) and p["positive"] == 2 and p["negative"] == 0 and p["seeds"] == [0, 1, 2]
    assert p["ci95"][1] == pytest.approx(0.1 + 0.95 / math.sqrt(2 * 0.975 * 0.025) * sd / math.sqrt(3))
    assert tpg.paired(rows, {7: base[0]}, "val", "accuracy") is None  # no shared seed: no pairing


def test_summary_reach_and_rollout_mismatch_by_hand():
    def run(cell, seed, accs, mism=None):
        r = {"task": "sudoku", "cell": cell, "seed": seed, "rl_seconds": 1.0, "rl_cpu_seconds": 1.0,
             "optimizer_steps": 10, "completions": 60, "val": {"accuracy": accs[-1]},
             "val_curve": [[5 * i, {"accuracy": a}] for i, a in enumerate(accs)]}
        return r | ({"rollout_mismatch": mism} if mism else {})
    base, dual = "diffu_grpo_state@4blocks", "diffu_grpo_state@4blocks+dual"
    runs = [run(base, 0, [0.3, 0.4, 0.5]), run(base, 1, [0.3, 0.4, 0.5]),
            run(dual, 0, [0.3, 0.35, 0.45], [0.02, 0.04]), run(dual, 1, [0.3, 0.45, 0.45], [0.06, 0.08])]
    summary = tpg.summarize({"runs": {f"{r['cell']}/{r['seed']}": r for r in runs}})
    e = {x["cell"]: x for x in summary}
    assert e[dual]["steps_to_base_final"] is None  # the seed-mean curve (0.3, 0.4, 0.45) never reaches 0.5
    assert e[dual]["rollout_mismatch"]["mean"] == pytest.approx(0.05)  # per-run means 0.03 and 0.07
    assert "rollout_mismatch" not in e[base]
    text = tpg.markdown(summary)
    row = next(line for line in text.splitlines() if line.startswith(f"| {dual} |"))
    assert "| not reached |" in row and "None" not in text
    assert f"{dual}: rollout mismatch" in text and "0.050 [" in text


def test_cell_recipe_replaces_sections_only(tmp_path):
    base = tp.BASES["sudoku"]
    src = yaml.safe_load(base.read_text())
    path = tp.cell_recipe(base, "dtca@rldf", tmp_path / "pos.json", tmp_path)
    got = yaml.safe_load(path.read_text())
    assert got["objective"] == {"name": "rldf"} and got["credit"][0]["name"] == "dtca"
    assert got["credit"][0]["pos_weights"] == str((tmp_path / "pos.json").resolve())
    assert got["rollout"]["schedule"] == "threshold" and got["rollout"]["gen_length"] == src["rollout"]["gen_length"]
    for section in ("model", "task", "sft", "eval"):
        assert got[section] == src[section]
    just = yaml.safe_load(tp.cell_recipe(base, "justgrpo", None, tmp_path).read_text())
    assert just["rollout"]["block_length"] == 1 and just["rollout"]["steps"] == just["rollout"]["gen_length"]
    with pytest.raises(SystemExit, match="unknown cell"):
        tp.cell_recipe(base, "nope", None, tmp_path)
    with pytest.raises(SystemExit, match="POS table"):
        tp.cell_recipe(base, "dtca@rldf", None, tmp_path)


def test_every_cell_pairs_with_a_known_base():
    for name, spec in tp.CELLS.items():
        assert spec["base"] is None or spec["base"] in tp.CELLS, name
        assert (spec["base"] is None) == (spec["kind"] == "base" and name != "diffu_grpo_mf_mu4"), name
    assert set(tp.SECOND_TASK) <= set(tp.CELLS)


@pytest.mark.slow
def test_smoke_every_cell_builds_and_runs(tmp_path, monkeypatch):
    out = tmp_path / "table.json"
    monkeypatch.setattr(sys, "argv", ["controlled_table.py", "--smoke", "--tasks", "sudoku", "--seeds", "0",
                                      "--out", str(out), "--runs-dir", str(tmp_path / "runs")])
    ct.main()
    data = json.loads(out.read_text())
    assert {r["cell"] for r in data["runs"].values()} == set(tp.CELLS)
    for key, r in data["runs"].items():
        assert r["steps"] == 1 and math.isfinite(r["val"]["accuracy"]) and r["val_curve"][0][0] == 0, key
        assert all(math.isfinite(x) for x in r["rewards"]), key
    assert "rollout_mismatch" in data["runs"]["sudoku/diffu_grpo_state@4blocks+dual/seed0"]
    # step 0 is scored once per task (Setup.sft_val) and must equal a fresh score of the SFT checkpoint
    setup = tr.Setup("sudoku", tp.BASES["sudoku"], tp.SMOKE + ["train.steps=1"], "table", 8,
                     gen_kw=tp.GEN_KW.get("sudoku"))
    fresh = setup.evaluate(setup.policy(), setup.cfg, setup.val)
    assert all(r["val_curve"][0][1] == fresh for r in data["runs"].values())
    entries = {e["cell"]: e for e in data["summary"]}
    assert entries["dps@diffu_grpo_state"]["paired_val"]["seeds"] == [0]


def test_write_doc_replaces_only_the_marked_block(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text(f"# R\n\nhand text\n\n{tpg.BEGIN}\nold\n{tpg.END}\n\nmore hand text\n")
    tpg.write_doc(doc, "new table\n")
    assert doc.read_text() == f"# R\n\nhand text\n\n{tpg.BEGIN}\nnew table\n{tpg.END}\n\nmore hand text\n"
    fresh = tmp_path / "fresh.md"
    tpg.write_doc(fresh, "t\n")
    tpg.write_doc(fresh, "u\n")
    assert fresh.read_text().count(tpg.BEGIN) == 1 and "u\n" in fresh.read_text() and "t\n" not in fresh.read_text()


def test_each_record_file_has_its_own_block(tmp_path):
    """Summarising another record file (the 8B table, a table on another recipe) writes its own block
    and leaves the default table's block as it was."""
    assert tpg.markers(tp.OUT) == (tpg.BEGIN, tpg.END)
    other = tpg.markers(tp.OUT_8B)
    assert other == ("<!-- controlled-table:controlled_table_8b:begin -->", "<!-- controlled-table:controlled_table_8b:end -->")
    doc = tmp_path / "results.md"
    tpg.write_doc(doc, "cpu table\n")
    tpg.write_doc(doc, "gpu table\n", other)
    tpg.write_doc(doc, "gpu table, again\n", other)
    text = doc.read_text()
    assert f"{tpg.BEGIN}\ncpu table\n{tpg.END}" in text and "gpu table, again" in text and "gpu table\n" not in text
    runs = {"a": {"task": "sudoku", "overrides": ["train.lr=2e-4", "train.steps=65"]}}
    head = tpg.markdown([], ablation_runs.ROOT / "results" / "other.json", runs)
    assert "--summary --out results/other.json" in head
    assert "Overrides over the sudoku base recipe: `train.lr=2e-4` `train.steps=65`." in head
    assert "--out" not in tpg.markdown([], tp.OUT).split("\n\n")[1]


GPU_TASKS = ("gsm8k", "math500", "countdown", "sudoku")
POS_TABLE = Path(__file__).resolve().parents[1] / "configs" / "pos_weights" / "countdown_tiny.json"


def _gpu_cells(tmp_path: Path) -> list[tuple[str, str, Path]]:
    """Every cell of every GPU task resolved as ``--recipes 8b`` resolves it (DTCA cells given a shipped
    POS table: a GPU run estimates its own from the 8B model)."""
    bases = tp.resolve_bases("8b", tmp_path / "recipes")
    assert set(bases) == set(GPU_TASKS) == set(tp.RECIPES_8B)
    return [(task, name, tp.cell_recipe(bases[task], name, POS_TABLE, tmp_path / "recipes"))
            for task in GPU_TASKS for name in tp.CELLS]


def test_gpu_recipes_flag_resolves_every_cell_at_paper_shapes(tmp_path):
    """``--recipes 8b``: each task's base is its shipped LLaDA-8B recipe with the protocol pinned, and
    every cell over it passes config validation at the papers' shapes (L 256, block 32, LLaDA-8B)."""
    from maskrl.config import load_config
    from maskrl.credit import CREDITS
    from maskrl.objectives import OBJECTIVES

    for task, name, path in _gpu_cells(tmp_path):
        cfg = load_config([path])  # raises on any invalid field or combination
        shipped = load_config([tp.RECIPES_8B[task]])
        spec = tp.CELLS[name]
        assert cfg.model == shipped.model and cfg.model.path == "GSAI-ML/LLaDA-8B-Instruct", (task, name)
        assert cfg.task == shipped.task and cfg.eval == shipped.eval, (task, name)
        assert cfg.rollout.gen_length == 256 and type(cfg.objective) is OBJECTIVES.get(spec["objective"]["name"])
        # the cell's credit modules only (the base recipe's, e.g. Sudoku's DiSPO, is dropped)
        assert [type(c) for c in cfg.credit] == [CREDITS.get(c["name"]) for c in spec["credit"]], (task, name)
        assert cfg.train.inner_iterations == spec["train"].get("inner_iterations", 1), (task, name)
        assert (cfg.train.lr, cfg.train.group_size) == (shipped.train.lr, shipped.train.group_size), (task, name)
        block = {"justgrpo": 1}.get(name, 64 if "4blocks" in name else 32)
        assert cfg.rollout.block_length == block, (task, name)
        assert cfg.rollout.schedule == spec["rollout"].get("schedule", "fixed"), (task, name)
        assert cfg.rollout.cache == spec["rollout"].get("cache", "none"), (task, name)
    with pytest.raises(SystemExit, match="no 8B recipe"):
        tp.gpu_base("wordmath", tmp_path)
    # the CPU table's cells are unchanged by the "blocks" spelling: 4 blocks of its 16 tokens
    cpu = yaml.safe_load(tp.cell_recipe(tp.BASES["sudoku"], "diffu_grpo_state@4blocks", None, tmp_path).read_text())
    assert cpu["rollout"]["block_length"] == 4 and "blocks" not in cpu["rollout"]


@pytest.mark.slow
def test_gpu_cells_dry_run_on_the_plan_stand_in(tmp_path):
    """Every GPU cell (one task: the cells' sections are the same on every task, the stand-in's prompts
    and rewards are synthetic) runs one full step on the plan's narrow stand-in model
    (:func:`maskrl.plan.dry_run`, the pattern of tests/test_plan.py), without an 8B model."""
    from maskrl.config import load_config
    from maskrl.plan import dry_run

    for task, name, path in _gpu_cells(tmp_path):
        if task == "countdown":
            assert dry_run(load_config([path]), prompt_length=16)["step"] == 1, name


def test_grid_points_and_best_point_rule():
    assert [p for p, _ in tp.grid_points("spg", (1e-4, 2e-4))] == ["lr=0.0001", "lr=0.0002"]
    assert tp.grid_points("rldf", (1e-4,)) == [("lr=0.0001,beta=0.01", ["train.lr=0.0001", "objective.beta=0.01"]),
                                               ("lr=0.0001,beta=0.04", ["train.lr=0.0001", "objective.beta=0.04"])]
    with pytest.raises(SystemExit, match="unknown grid family"):
        tp.grid_points("nope")
    for fam in tp.GRID_FAMILIES.values():  # every arm is a cell, and each arm's base is the family's base
        first = fam["tuned_by"][1] if "tuned_by" in fam else None  # (or the arm whose point a tuned_by family runs at)
        assert all(a in tp.CELLS for a in fam["arms"]) and all(
            tp.CELLS[a]["base"] in (first, fam["arms"][0]) for a in fam["arms"])
        if "tuned_by" in fam:
            src, arm = fam["tuned_by"]
            assert arm in tp.GRID_FAMILIES[src]["arms"] and "tuned_by" not in tp.GRID_FAMILIES[src]

    def rec(arm, point, seed, final, mid):
        return {"val": {"accuracy": final}, "val_curve": [[0, {"accuracy": 0.3}], [5, {"accuracy": mid}],
                                                          [10, {"accuracy": final}]]}
    lrs = (1e-4, 2e-4)
    runs = {}
    for arm, vals in (("spg", {"lr=0.0001": (0.30, 0.32), "lr=0.0002": (0.36, 0.30)}),  # 0.0002 higher mean
                      ("dispo@spg", {"lr=0.0001": (0.35, 0.35), "lr=0.0002": (0.30, 0.40)}),  # tie: AUC decides
                      ("dispo-kl@spg", {"lr=0.0001": (0.2, 0.2)})):  # one point incomplete (no 0.0002)
        for point, (a, b) in vals.items():
            runs[tp.run_key("sudoku", arm, 0, point)] = rec(arm, point, 0, a, 0.3)
            runs[tp.run_key("sudoku", arm, 1, point)] = rec(arm, point, 1, b, 0.5 if point == "lr=0.0002" else 0.3)
    best = tp.best_points({"runs": runs}, "sudoku", "spg", [0, 1], lrs)
    assert best["spg"]["point"] == "lr=0.0002" and best["spg"]["val_mean"] == pytest.approx(0.33)
    assert best["dispo@spg"]["point"] == "lr=0.0002"  # both 0.35; lr=0.0002's seed 1 curve has the larger AUC
    assert best["dispo@spg"]["overrides"] == ["train.lr=0.0002"]
    assert best["dispo-kl@spg"]["point"] == "lr=0.0001" and list(best["dispo-kl@spg"]["points"]) == ["lr=0.0001"]
    del runs[tp.run_key("sudoku", "dispo-kl@spg", 1, "lr=0.0001")]
    with pytest.raises(SystemExit, match="no complete grid point for sudoku/dispo-kl@spg"):
        tp.best_points({"runs": runs}, "sudoku", "spg", [0, 1], lrs)


def test_grid_and_confirm_modes_smoke(tmp_path, monkeypatch):
    """--grid then --confirm at tiny shape: every arm at every point on the selection split, then each
    at its own best point on the confirmation split, scored once; records carry their provenance."""
    out = tmp_path / "t.json"
    ct.main(["--smoke", "--grid", "spg", "--confirm", "spg", "--grid-lrs", "1e-4,2e-4", "--grid-seeds", "0",
             "--confirm-seeds", "3,4", "--out", str(out), "--runs-dir", str(tmp_path / "runs"), "--no-extend"])
    grid = json.loads(tp.grid_path("grid", "sudoku", "spg", tmp_path).read_text())
    assert sorted(grid["runs"]) == sorted(tp.run_key("sudoku", a, 0, p) for a in tp.GRID_FAMILIES["spg"]["arms"]
                                          for p in ("lr=0.0001", "lr=0.0002"))
    conf = json.loads(tp.grid_path("confirm", "sudoku", "spg", tmp_path).read_text())
    assert sorted(conf["runs"]) == sorted(tp.run_key("sudoku", a, s) for a in tp.GRID_FAMILIES["spg"]["arms"] for s in (3, 4))
    for key, r in list(grid["runs"].items()) + list(conf["runs"].items()):
        confirm = key in conf["runs"]
        assert r["test_reads"] == 0 and "test" not in r, key
        assert r["scored_on"] == (["selection", "confirmation"] if confirm else ["selection"]), key
        assert ("confirmation" in r) == confirm and r.get("confirmation_reads", 0) == int(confirm), key
        pv = r["provenance"]
        assert len(pv["sft"]["sha256"]) == 64 and pv["data"]["source"] == "file" and len(pv["data"]["sha256"]) == 64
        assert pv["splits"]["selection"] == {"source": "generated", "seed": 4242, "size": 8}
        if confirm:  # (a grid run of the same invocation describes the split too, but never scores it)
            assert pv["splits"]["confirmation"] == {"source": "generated", "seed": 5353, "size": 8}
        assert pv["torch"] and pv["cpu_capability"] and len(pv["code"]["commit"] or "x" * 40) == 40
    assert set(conf["sft_confirmation"]["sudoku"]) >= {"accuracy", "cell_accuracy"}  # the SFT model, scored once
    chosen = conf["selected"]
    for arm, sel in chosen.items():
        assert conf["runs"][tp.run_key("sudoku", arm, 3)]["overrides"][-len(sel["overrides"]):] == sel["overrides"]
    # the test file, once every recipe is fixed: one retrained model per arm (the first confirmation seed),
    # which reproduces its recorded confirmation score bit for bit, scored once on the test file; with the
    # family's base claimed over the SFT model, the SFT model read once beside them
    monkeypatch.setitem(tp.GRID_FAMILIES["spg"], "sft_claim", True)
    ct.main(["--smoke", "--test-final", "spg", "--confirm-seeds", "3,4", "--out", str(out), "--runs-dir",
             str(tmp_path / "runs")])
    test = json.loads(tp.grid_path("test", "sudoku", "spg", tmp_path).read_text())
    assert sorted(test["runs"]) == sorted(tp.run_key("sudoku", a, 3) for a in tp.GRID_FAMILIES["spg"]["arms"])
    for key, r in test["runs"].items():
        assert r["test_reads"] == 1 and r["scored_on"] == ["selection", "confirmation", "test"], key
        assert r["reproduces_confirmation"] is True and r["confirmation"] == conf["runs"][key]["confirmation"], key
        assert r["overrides"] == conf["runs"][key]["overrides"] and "accuracy" in r["test"], key
    n_test = next(iter(test["runs"].values()))["provenance"]["splits"]["test"]["size"]
    assert test["sft_test"]["sudoku"]["test_reads"] == 1 and test["sft_test"]["sudoku"]["rows"] == n_test
    md = ta.test_markdown(tmp_path)
    assert md.startswith("### The test file") and md.count("\n| sudoku | spg | ") == 4 and "| yes |" in md
    sft_row = f"| sudoku | spg | SFT model | – | {100 * test['sft_test']['sudoku']['accuracy']:.1f} ["
    assert sft_row in md and f"({n_test} rows) | {100 * conf['sft_confirmation']['sudoku']['accuracy']:.1f} | – |" in md
    census = ta.record_census([tp.grid_path(k, "sudoku", "spg", tmp_path) for k in ("grid", "confirm", "test")])
    # 3 arms + the SFT model on the test file; the SFT model read each split once (confirmation, test)
    assert (census["test_reads"], census["sft_confirmation"], census["sft_test"]) == (4, 1, 1)
    assert ta.test_markdown(tmp_path / "none") == ""
    with pytest.raises(SystemExit, match="has no confirmation run sudoku/spg/seed7"):
        ct.main(["--smoke", "--test-final", "spg", "--confirm-seeds", "7", "--out", str(out), "--runs-dir",
                 str(tmp_path / "runs")])
    # resuming the same command runs nothing new
    before = out.parent.joinpath("confirm", "sudoku_spg.json").read_text()
    ct.main(["--smoke", "--confirm", "spg", "--grid-lrs", "1e-4,2e-4", "--grid-seeds", "0", "--confirm-seeds", "3,4",
             "--out", str(out), "--runs-dir", str(tmp_path / "runs")])
    assert json.loads(before)["runs"] == json.loads(out.parent.joinpath("confirm", "sudoku_spg.json").read_text())["runs"]


def test_edge_extension_by_hand():
    best = lambda *points: {f"a{i}": {"point": p} for i, p in enumerate(points)}  # noqa: E731
    lrs = [2e-5, 5e-5, 1e-4, 2e-4]
    assert tp.edge_extension(best("lr=5e-05", "lr=0.0001"), lrs) == []  # inside the grid
    assert tp.edge_extension(best("lr=2e-05,beta=0.1", "lr=0.0001"), lrs) == [1e-5]  # one arm at the low edge
    assert tp.edge_extension(best("lr=2e-05", "lr=0.0002,beta=0.04"), lrs) == [1e-5, 5e-4]  # both edges
    assert tp.edge_extension(best("lr=1e-05"), [1e-5, 2e-5]) == []  # the ladder's end: nothing lower to try
    assert tp.edge_extension(best("lr=0.001"), [1e-3]) == [5e-4]  # a one-rate grid is at both edges
    assert tp.point_lr("lr=0.0001,beta=0.04") == 1e-4
    runs = {"k": {"task": "sudoku", "cell": "spg", "grid_point": "lr=1e-05"},
            "o": {"task": "countdown", "cell": "spg", "grid_point": "lr=0.001"}}  # another task's rung: not this one's
    assert tp.family_lrs({"runs": runs}, "sudoku", "spg") == [1e-5, 2e-5, 5e-5, 1e-4, 2e-4]


def test_grid_extends_along_the_ladder_until_every_best_is_inside(tmp_path, monkeypatch):
    """With the final accuracy peaking at lr 2e-4 for one arm and at the lowest rate for another, a grid
    started at 2e-5, 5e-5 grows one rung per pass (5e-5 -> 1e-4 -> 2e-4 -> 5e-4 up, 1e-5 down) and stops;
    recorded points are never run twice, and --no-extend runs the given grid only."""
    made = []

    def fake_run(setup, out, task, name, recipe, overrides, seed, every, test, runs_dir, point="", confirm=False):
        key = tp.run_key(task, name, seed, point)
        if key in ablation_runs.load_results(out)["runs"]:
            return None
        made.append(key)
        lr = tp.point_lr(point)
        acc = 0.5 - abs(math.log10(lr / 2e-4)) / 10 if name == "spg" else 0.5 - math.log10(lr / 1e-5) / 10
        rec = {"task": task, "cell": name, "seed": seed, "grid_point": point, "val": {"accuracy": acc},
               "val_curve": [[0, {"accuracy": 0.1}], [1, {"accuracy": acc}]]}
        ablation_runs.update_results(out, lambda d: d["runs"].__setitem__(key, rec))
        return rec

    monkeypatch.setattr(ct, "run", fake_run)
    argv = ["--smoke", "--grid", "spg", "--grid-lrs", "2e-5,5e-5", "--grid-seeds", "0", "--out",
            str(tmp_path / "t.json"), "--runs-dir", str(tmp_path / "runs")]
    ct.main(argv + ["--no-extend"])
    assert len(made) == 2 * 3
    ct.main(argv)
    data = ablation_runs.load_results(tp.grid_path("grid", "sudoku", "spg", tmp_path))
    assert tp.family_lrs(data, "sudoku", "spg", ()) == [1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4]
    assert len(made) == len(set(made)) == 6 * 3
    best = tp.best_points(data, "sudoku", "spg", [0])
    assert best["spg"]["point"] == "lr=0.0002" and best["dispo@spg"]["point"] == "lr=1e-05"


def test_tuned_by_family_confirms_at_the_source_arms_point(tmp_path):
    """``cache`` has no grid: --grid cache stops before building anything; --confirm cache runs both samplers
    at the state base's best grid point (read from the state grid), and says where the point came from."""
    out = tmp_path / "t.json"
    common = ["--smoke", "--grid-lrs", "1e-4,2e-4", "--grid-seeds", "0", "--out", str(out), "--runs-dir",
              str(tmp_path / "runs")]
    with pytest.raises(SystemExit, match="--grid cache: the family has no grid of its own.*--grid state"):
        ct.main(common + ["--grid", "cache"])
    assert not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit, match="unknown grid family 'nope'"):
        ct.main(common + ["--confirm", "nope"])
    runs = {}  # a hand-made state grid: diffu_grpo_state is best at lr=0.0002,beta=0.1, its arms elsewhere
    for label, _ in tp.grid_points("state", (1e-4, 2e-4)):
        for arm in tp.GRID_FAMILIES["state"]["arms"]:
            acc = 0.5 if (arm == "diffu_grpo_state") == (label == "lr=0.0002,beta=0.1") else 0.2
            runs[tp.run_key("sudoku", arm, 0, label)] = {"val": {"accuracy": acc}, "val_curve": [[0, {"accuracy": 0.1}]]}
    tp.grid_path("grid", "sudoku", "state", tmp_path).parent.mkdir(parents=True)
    tp.grid_path("grid", "sudoku", "state", tmp_path).write_text(json.dumps({"runs": runs}))
    ct.main(common + ["--confirm", "cache", "--confirm-seeds", "3"])
    conf = json.loads(tp.grid_path("confirm", "sudoku", "cache", tmp_path).read_text())
    assert sorted(conf["runs"]) == sorted(tp.run_key("sudoku", a, 3) for a in tp.GRID_FAMILIES["cache"]["arms"])
    for arm in tp.GRID_FAMILIES["cache"]["arms"]:
        sel = conf["selected"][arm]
        assert sel["point"] == "lr=0.0002,beta=0.1" and sel["tuned_by"] == "state/diffu_grpo_state"
        r = conf["runs"][tp.run_key("sudoku", arm, 3)]
        assert r["overrides"][-2:] == ["train.lr=0.0002", "objective.beta=0.1"] and "confirmation" in r
    # the grid grows and the base's best point moves: the recorded confirmation runs are stale; an error
    # naming both arms and their points, then --supersede keeps them aside and runs both at the new point
    runs[tp.run_key("sudoku", "diffu_grpo_state", 0, "lr=0.0001,beta=0.04")]["val"]["accuracy"] = 0.9
    tp.grid_path("grid", "sudoku", "state", tmp_path).write_text(json.dumps({"runs": runs}))
    with pytest.raises(SystemExit, match=r"2 confirmation runs .*diffu_grpo_state@4blocks lr=0.0002,beta=0.1 -> "
                                         r"lr=0.0001,beta=0.04.*--supersede"):
        ct.main(common + ["--confirm", "cache", "--confirm-seeds", "3"])
    ct.main(common + ["--confirm", "cache", "--confirm-seeds", "3", "--supersede"])
    new = json.loads(tp.grid_path("confirm", "sudoku", "cache", tmp_path).read_text())
    assert sorted(s["key"] for s in new["superseded"]) == sorted(conf["runs"])
    assert all(s["overrides"] == conf["runs"][s["key"]]["overrides"] for s in new["superseded"])  # kept as they were
    for arm in tp.GRID_FAMILIES["cache"]["arms"]:
        assert new["selected"][arm]["point"] == "lr=0.0001,beta=0.04"
        assert new["runs"][tp.run_key("sudoku", arm, 3)]["overrides"][-2:] == ["train.lr=0.0001", "objective.beta=0.04"]
    census = ta.record_census([tp.grid_path("confirm", "sudoku", "cache", tmp_path)])
    assert census["confirmation_reads"] == 5 and census["superseded"] == 2  # 4 runs and the SFT model


@pytest.mark.parametrize("task", ["sudoku", "countdown"])
def test_splits_are_disjoint_on_the_real_data(task):
    """Training rows, the selection split, the confirmation split and the test file share no instance, on
    the shipped data and generators (the confirmation split at its real size)."""
    from maskrl.tasks.base import default_data_dir

    if default_data_dir() is None:
        pytest.skip("no ../shared/data")
    setup = tr.Setup(task, tp.BASES[task], [], "table", 300, gen_kw=tp.GEN_KW.get(task),
                     confirm_size=tp.CONFIRM_SIZE, require_file=True)
    key = setup.task.instance_key
    sets = {name: [key(e) for e in rows] for name, rows in
            (("train", setup.train), ("selection", setup.val), ("confirmation", setup.confirm), ("test", setup.test))}
    assert len(sets["selection"]) == 300 and len(sets["confirmation"]) == tp.CONFIRM_SIZE
    for name in ("selection", "confirmation"):  # no duplicate within a held-out split (training rows may repeat)
        assert len(set(sets[name])) == len(sets[name]), name
    names = list(sets)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not set(sets[a]) & set(sets[b]), (a, b)
    assert setup.splits["confirmation"]["seed"] != setup.splits["selection"]["seed"]
    if task == "sudoku":
        # both validation splits have the test file's 8 blanks per puzzle (GEN_KW)
        assert {e.fields["puzzle"].count("0") for e in setup.val + setup.confirm} == {8}


def test_missing_data_folder_is_an_error_unless_asked(tmp_path, monkeypatch):
    """Without a local test file the table stops (the splits exclude the file's rows, so generated
    stand-ins change every number) unless --generated-data asks for them; then the records say so."""
    monkeypatch.setattr(ablation_runs, "task_and_data",
                        lambda cfg: (__import__("maskrl.tasks", fromlist=["get_task"]).get_task("sudoku4x4", "{puzzle}="),
                                     [], "generated:seed=99", []))
    with pytest.raises(SystemExit, match="--generated-data"):
        tr.Setup("sudoku", tp.BASES["sudoku"], [], "table", 4, require_file=True)
    setup = tr.Setup("sudoku", tp.BASES["sudoku"], [], "table", 4, require_file=False)
    assert setup.data_provenance() == {"source": "generated", "seed": 99}
    with pytest.raises(SystemExit, match="--generated-data"):
        ct.main(["--smoke", "--tasks", "sudoku", "--cells", "spg", "--seeds", "0", "--out", str(tmp_path / "x.json"),
                 "--runs-dir", str(tmp_path / "runs")])


def documented_commands(text: str) -> list[list[str]]:
    """Every ``python benchmarks/<script>.py ...`` command in the page's code (fenced blocks and
    4-space-indented blocks), continuation lines joined and trailing comments dropped, as argv lists."""
    import shlex

    lines, out, fenced = text.splitlines(), [], False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            fenced = not fenced
            i += 1
            continue
        code = fenced or line.startswith("    ")
        if code and line.strip().startswith("python benchmarks/"):
            cmd = line.strip()
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            out.append(shlex.split(cmd, comments=True)[1:])
        i += 1
    return out


def _check_resume(argv: list[str], where: str) -> int:
    """A documented table command: it parses, and every run it would make that is recorded in its
    --out file is recorded with the same settings (so resuming skips it instead of stopping). Returns
    how many of its runs are recorded."""
    args = ct.parser().parse_args(argv)
    if args.summary:
        assert ablation_runs.load_results(Path(args.out or tp.OUT), must_exist=True)["runs"], where
        return 0
    if args.verdicts:
        return 0
    for fam in [f for f in ",".join((args.grid, args.confirm, args.test_final)).split(",") if f]:
        tp.grid_points(fam)  # a documented family exists
    if args.grid or args.confirm or args.test_final:
        return 0
    recorded = 0
    for p in ct.planned_runs(args):
        rec = ablation_runs.load_results(p["out"])["runs"].get(p["key"])
        if rec is not None:
            recorded += 1
            got = {k: rec.get(k) for k in p["settings"]}
            assert got == p["settings"], f"{where}: {p['key']} recorded with {got}, the command asks {p['settings']}"
    return recorded


def test_every_documented_command_parses_and_resumes_against_the_records(monkeypatch):
    """Each command of docs/results.md names a script that exists, or a retired one (``RETIRED``) in a
    block that says at which commit its code was last present; each table command runs through the
    table's argument parser, and one whose runs are recorded would skip them (same overrides, split size
    and --eval-every), not stop."""
    monkeypatch.chdir(ablation_runs.ROOT)
    text = tp.DOC.read_text()
    cmds = documented_commands(text)
    assert len(cmds) >= 8
    assert "benchmarks/table/controlled_table.py" in {c[0] for c in cmds}
    total = 0
    for argv in cmds:
        where = " ".join(argv)
        if argv[0] in trp.RETIRED:
            assert f"run at commit {trp.RETIRED_AT}" in text, where
            continue
        assert (ablation_runs.ROOT / argv[0]).is_file(), where
        if argv[0] == "benchmarks/table/controlled_table.py":
            total += _check_resume(argv[1:], where)
    assert total >= 280  # table 1 (220 runs) and the third-round table (60) resume from their records
    # the retired pilots' commands stay on the page as comments, under the commit that had their code
    assert trp.RETIRED["benchmarks/testbed_search.py"] in text and "# python benchmarks/testbed_search.py --run" in text


def test_documented_commands_extraction():
    text = ("text\n\n    python benchmarks/table/controlled_table.py --tasks a \\\n      --seeds 0  # note\n\n"
            "```bash\npython benchmarks/speed/gpu_check.py --scale tiny\n# python benchmarks/old.py\n```\n"
            "python benchmarks/not_code.py\n")
    assert documented_commands(text) == [["benchmarks/table/controlled_table.py", "--tasks", "a", "--seeds", "0"],
                                         ["benchmarks/speed/gpu_check.py", "--scale", "tiny"]]


def test_eval_cadence_follows_the_records(tmp_path):
    out = tmp_path / "r.json"
    ablation_runs.save_results(out, {"runs": {"a": {"task": "countdown", "eval_every": 10}, "b": {"task": "sudoku", "eval_every": 5}}})
    assert ct.eval_cadence(out, "countdown", None) == 10 and ct.eval_cadence(out, "sudoku", None) == 5
    assert ct.eval_cadence(out, "wordmath", None) == 5 and ct.eval_cadence(out, "countdown", 13) == 13
    ablation_runs.save_results(out, {"runs": {"a": {"task": "countdown", "eval_every": 10}, "b": {"task": "countdown", "eval_every": 5}}})
    with pytest.raises(SystemExit, match="several --eval-every"):
        ct.eval_cadence(out, "countdown", None)


def test_verdict_rule_by_hand():
    """Each verdict word from hand-made statistics: the margin tests read the family-wise interval ``ci_fw``,
    the gain test the Holm-corrected p-values."""
    st = lambda m, lo, hi: {"mean": m, "ci_fw": [lo, hi]}  # noqa: E731
    assert tv.verdict(st(0.05, 0.02, 0.08), "superior", 0.01, 0.02) == tv.GAIN == "gain shown"
    assert tv.verdict(st(0.05, 0.02, 0.08), "superior", 0.01, 0.0625) == tv.UNDECIDED  # 5 seeds: the sign-flip floor
    assert tv.verdict(st(0.05, 0.02, 0.08), "superior", 0.06, 0.002) == "undecided"
    assert tv.verdict(st(-0.01, -0.02, 0.009), "superior", 0.5, 0.5) == tv.NO_GAIN == "no gain of 1 point or more"
    assert tv.verdict(st(-0.05, -0.08, -0.02), "superior", 0.001, 0.002) == "no gain of 1 point or more"
    assert tv.verdict(st(0.0, -0.005, 0.011), "superior", 1.0, 1.0) == "undecided"  # the upper end reaches +1
    # inside (0, +1 point): a gain, and below the margin -- whatever the p-values say
    assert tv.verdict(st(0.004, 0.001, 0.008), "superior", 0.5, 0.5) == tv.SMALL_GAIN == "a gain below the 1-point margin"
    assert tv.verdict(st(0.004, 0.001, 0.008), "superior", 0.001, 0.002) == "a gain below the 1-point margin"
    assert tv.verdict(st(0.004, 0.0, 0.008), "superior", 0.5, 0.5) == "no gain of 1 point or more"  # 0 is not above 0
    assert tv.verdict(st(0.0, -0.009, 0.011), "noninferior", 1.0, 1.0) == tv.WITHIN == "within 1 point"
    assert tv.verdict(st(-0.05, -0.08, -0.02), "noninferior", 0.001, 0.002) == tv.WORSE == "worse"
    assert tv.verdict(st(-0.01, -0.03, 0.01), "noninferior", 0.3, 0.3) == "undecided"
    assert set(tv.VERDICT_COLOURS) == {w for words in tv.VERDICTS.values() for w in words}


@pytest.mark.numerics
def test_familywise_interval_against_the_t_quantile():
    """Bonferroni over m comparisons: mean ± t_{1 − 0.05/(2m), n−1} · sd/√n, with scipy's quantile by hand."""
    from scipy import stats

    d = [0.01, 0.03, -0.02, 0.04, 0.02]
    n, m = len(d), 15
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    h = stats.t.ppf(1 - 0.05 / (2 * m), n - 1) * sd / math.sqrt(n)
    eps = 16 * sys.float_info.epsilon
    assert tv.familywise_interval(d, m) == pytest.approx([mean - h, mean + h], rel=eps, abs=eps)
    h1 = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)  # a family of one: the 95 % interval
    assert tv.familywise_interval(d, 1) == pytest.approx([mean - h1, mean + h1], rel=eps, abs=eps)
    with pytest.raises(ValueError, match="m >= 1"):
        tv.familywise_interval(d, 0)


def _rec(task, cell, seed, final, sft, confirm=None):
    r = {"task": task, "cell": cell, "seed": seed, "val": {"accuracy": final},
         "val_curve": [[0, {"accuracy": sft}], [10, {"accuracy": final}]]}
    return r | ({"confirmation": {"accuracy": confirm}} if confirm is not None else {})


def test_claim_differences_prefer_the_confirmation_file(tmp_path):
    conf, sel = tmp_path / "confirm" / "sudoku_spg.json", tmp_path / "sel.json"
    ablation_runs.save_results(sel, {"runs": {f"s{s}{c}": _rec("sudoku", c, s, a, 0.3) for s in range(3)
                                   for c, a in (("spg", 0.2), ("dispo@spg", 0.25 + 0.01 * s))}})
    claim = tv._claim("x", "p", "sudoku", "dispo@spg", "spg", [conf, sel])
    d = tv.claim_differences(claim)  # no confirmation file yet: the selection records
    assert d["split"] == "selection" and d["seeds"] == [0, 1, 2] and d["d"] == pytest.approx([0.05, 0.06, 0.07])
    assert d["pending"] is None
    runs = {f"c{s}{c}": _rec("sudoku", c, s, 0.9, 0.3, a) for s in (10, 11, 12)
            for c, a in (("spg", 0.4), ("dispo@spg", 0.38))}
    runs["grid"] = _rec("sudoku", "dispo@spg", 13, 0.9, 0.3, 0.9) | {"grid_point": "lr=1"}  # never a headline row
    ablation_runs.save_results(conf, {"runs": runs, "sft_confirmation": {"sudoku": {"accuracy": 0.35}}})
    # 3 of 10 confirmation seeds: the confirmation is under way, the claim still reads the selection records
    d = tv.claim_differences(claim)
    assert d["split"] == "selection" and d["seeds"] == [0, 1, 2]
    assert d["pending"] == {"seeds": 3, "need": 10, "source": str(conf)}
    assert tv.claim_differences(tv._claim("x", "p", "sudoku", "dispo@spg", "spg", [conf])) is None
    d = tv.claim_differences(claim, need=3)  # complete at 3 seeds: the confirmation file is read
    assert d["split"] == "confirmation" and d["seeds"] == [10, 11, 12] and d["d"] == pytest.approx([-0.02] * 3)
    runs |= {f"c{s}{c}": _rec("sudoku", c, s, 0.9, 0.3, a) for s in range(13, 20)
             for c, a in (("spg", 0.4), ("dispo@spg", 0.38))}
    ablation_runs.save_results(conf, {"runs": runs, "sft_confirmation": {"sudoku": {"accuracy": 0.35}}})
    d = tv.claim_differences(claim)  # all 10 default confirmation seeds
    assert d["split"] == "confirmation" and d["seeds"] == list(range(10, 20)) and d["pending"] is None
    no_sft = tv._claim("x", "p", "sudoku", "spg", "sft", [conf, sel])
    ablation_runs.save_results(conf, {"runs": runs})  # 10 seeds, the SFT model not scored yet (it is last)
    d = tv.claim_differences(no_sft)
    assert d["split"] == "selection" and d["pending"] == {"seeds": 10, "need": 10, "source": str(conf)}
    ablation_runs.save_results(conf, {"runs": runs, "sft_confirmation": {"sudoku": {"accuracy": 0.35}}})
    vs_sft = tv.claim_differences(tv._claim("x", "p", "sudoku", "spg", "sft", [conf]))
    assert vs_sft["d"] == pytest.approx([0.05] * 10)  # 0.40 on the confirmation split against the SFT model's 0.35
    assert tv.claim_differences(tv._claim("x", "p", "countdown", "spg", "sft", [conf, sel])) is None


def test_verdict_rows_correct_over_the_family(tmp_path):
    from maskrl.stats import holm, paired_t_test, sign_flip_test

    sel = tmp_path / "sel.json"
    gains = {"a": [0.05, 0.06, 0.07, 0.05, 0.06], "b": [0.01, -0.02, 0.0, 0.01, 0.02]}
    ablation_runs.save_results(sel, {"runs": {f"{c}{s}": _rec("sudoku", c, s, 0.3 + g[s], 0.3) for c, g in gains.items()
                                   for s in range(5)}})
    claims = [tv._claim(c, "p", "sudoku", c, "sft", [sel]) for c in gains]
    claims.append(tv._claim("none", "p", "sudoku", "zzz", "sft", [sel]))
    rows = tv.verdict_rows(claims)
    p_t = holm([paired_t_test(g)["p"] for g in gains.values()])
    p_f = holm([sign_flip_test(g) for g in gains.values()])
    for r, pt, pf in zip(rows, p_t, p_f):
        assert r["p_t_holm"] == pytest.approx(pt) and r["p_signflip_holm"] == pytest.approx(pf)
    assert rows[0]["verdict"] == "undecided"  # p_t tiny, but 5 seeds cannot give a sign-flip p under 0.0625 x 2
    assert rows[1]["verdict"] == "undecided" and rows[2]["stat"] is None and "verdict" not in rows[2]
    for r, g in zip(rows, gains.values()):  # the family: the 2 claims with records
        # the differences are read back from records (0.3 + g − 0.3): equal to g within a few ulps of 1
        want = tv.familywise_interval(g, 2)
        assert r["stat"]["ci_fw"] == pytest.approx(want, abs=64 * sys.float_info.epsilon) and r["after_look"] is None
    text = tv.verdict_markdown(rows, {"runs": 10, "with_provenance": 0, "test_reads": 0, "confirmation_reads": 0}, "f.png")
    assert "| a | sudoku | p | +5.8 [" in text and "| none | sudoku | p | not run yet |" in text and "(f.png)" in text
    assert "confirmation" not in text.split("Readings")[1]  # nothing under way: no reading mentions it
    rows[1]["diff"]["pending"] = {"seeds": 4, "need": 10, "source": "results/confirm/x.json"}
    text = tv.verdict_markdown(rows, {"runs": 10, "with_provenance": 0, "test_reads": 0, "confirmation_reads": 0}, "f.png")
    assert "| **undecided** | selection, 5; confirmation 4 of 10 recorded | ? |" in text  # no SFT hash recorded
    assert "Its confirmation is under way (4 of 10 seeds in `results/confirm/x.json`) and is read once complete." in text


def test_headline_page_is_generated_from_the_records():
    """The verdict table in docs/results.md is what --verdicts computes from the committed records now."""
    rows = tv.verdict_rows()
    text = tp.DOC.read_text()
    block = text[text.index(tv.VERDICT_MARKS[0]):text.index(tv.VERDICT_MARKS[1])]
    gen = tv.verdict_markdown(rows, {"runs": 0, "with_provenance": 0, "test_reads": 0, "confirmation_reads": 0}, "x")
    tables = [part.splitlines() for part in gen.split("\n\n") if part.startswith("| ")]
    assert tables[0][0].startswith("| claim | task | paper") and len(tables[0]) == len(tv.CLAIMS) + 2
    assert all(line in block for table in tables for line in table)  # the verdicts and what they cover
    assert text.index(tv.VERDICT_MARKS[0]) < 200  # the page opens with it
    for fig in ("headline", "verdicts"):  # the curves behind the verdicts, and the verdicts as a picture
        assert f"]({tp.DOC.stem}_{fig}.png)" in block and (tp.DOC.parent / f"{tp.DOC.stem}_{fig}.png").is_file()


def test_headline_panels_one_family_a_panel(tmp_path):
    """One panel per confirmation file, Sudoku first and then GRID_FAMILIES' order, the family's arms in
    its order (those with runs), the seed counts in the title; no confirmation file: no figure."""
    assert tpg.headline_panels(tmp_path) == [] and not tpg.headline_figure(tmp_path / "h.png", tmp_path)
    assert not (tmp_path / "h.png").exists()
    curve = [[0, {"accuracy": 0.3}], [13, {"accuracy": 0.4}]]
    for name, arms, seeds in (("countdown_state", ("diffu_grpo_state",), (10, 11)),
                              ("sudoku_state", ("dps@diffu_grpo_state", "diffu_grpo_state"), (10, 11, 12)),
                              ("sudoku_spg", ("dispo@spg", "spg"), (10,))):
        ablation_runs.save_results(tp.grid_path("confirm", *name.split("_"), tmp_path),
                                   {"runs": {f"{a}/{s}": {"task": name.split("_")[0], "cell": a, "seed": s,
                                                          "val_curve": curve} for a in arms for s in seeds}})
    panels = tpg.headline_panels(tmp_path)
    assert [(t, arms) for t, arms, _ in panels] == [
        ("sudoku, spg family (1 seeds)", ["spg", "dispo@spg"]),
        ("sudoku, state family (3 seeds)", ["diffu_grpo_state", "dps@diffu_grpo_state"]),
        ("countdown, state family (2 seeds)", ["diffu_grpo_state"])]
    assert len(panels[1][2]["diffu_grpo_state"]) == 3
    assert tpg.headline_figure(tmp_path / "h.png", tmp_path) and (tmp_path / "h.png").stat().st_size > 0


def test_verdict_figure_draws_only_claims_with_records(tmp_path):
    rows = [{"claim": "a", "task": "sudoku", "stat": None}]
    assert not tv.verdict_figure(rows, tmp_path / "v.png") and not (tmp_path / "v.png").exists()
    rows.append({"claim": "b", "task": "sudoku", "verdict": "undecided",
                 "stat": {"mean": 0.01, "ci95": [-0.01, 0.03], "ci_fw": [-0.02, 0.04], "n": 3},
                 "diff": {"d": [0.0, 0.01, 0.02], "split": "confirmation", "pending": None}})
    assert tv.verdict_figure(rows, tmp_path / "v.png") and (tmp_path / "v.png").stat().st_size > 0


def test_readme_results_block_is_generated_from_the_records():
    """The README's results block is what --verdicts computes from the committed records now (its rows and
    its verdict counts), and it is that table's top rows: each README row is a row of the page's table."""
    rows = tv.verdict_rows()
    text = tv.README.read_text()
    begin, end = tv.README_MARKS
    block = text[text.index(begin) + len(begin) + 1:text.index(end)]
    assert block == tv.readme_markdown(rows)
    assert text.index(begin) < text.index("## Library in five lines")
    page = tp.DOC.read_text()
    by = {(r["task"], r["cell"]): r for r in rows}
    for task, cell in tv.README_ROWS:
        assert f"| {by[task, cell]['claim']} | {task} |" in page


def test_test_markdown_by_hand(tmp_path):
    """4 of 8 test rows solved: 50.0 % with the Wilson interval [21.5, 78.5] (z 1.96, by hand)."""
    r = {"cell": "spg", "seed": 10, "test": {"accuracy": 0.5}, "confirmation": {"accuracy": 0.25},
         "reproduces_confirmation": False, "provenance": {"splits": {"test": {"size": 8}}}}
    ablation_runs.save_results(tmp_path / "test" / "sudoku_spg.json", {"runs": {"sudoku/spg/seed10": r}})
    assert "| sudoku | spg | spg | 10 | 50.0 [21.5, 78.5] (8 rows) | 25.0 | no |" in ta.test_markdown(tmp_path)


def test_readme_markdown_by_hand():
    """Two hand-made rows: one reproduced on the confirmation split, one not yet run; the counts and the
    confirmation reading follow them, and a README without its markers is an error, not a silent append."""
    stat = {"mean": 0.05, "ci95": (0.02, 0.08), "positive": 10, "negative": 0, "n": 10}
    rows = [{"task": t, "cell": c, "claim": f"claim {c}", "base": "sft" if c == "diffu_grpo_state" else "x",
             "kind": "superior", "stat": None} for t, c in tv.README_ROWS]
    by = {(r["task"], r["cell"]): r for r in rows}
    by["sudoku", "dispo@spg"].update(stat=stat, verdict="gain shown", p_t_holm=0.001, p_signflip_holm=0.02,
                                     diff={"split": "confirmation"})
    md = tv.readme_markdown(rows)
    assert "| claim dispo@spg | Sudoku | +5.0 [+2.0, +8.0] | gain shown | confirmation, 10 |" in md
    assert "| claim dtca@rldf | Sudoku | not run yet | – | – |" in md
    assert ("Of the 1 credit-module comparisons with records, gain shown: 1; a gain below the 1-point margin: 0; "
            "no gain of 1 point or more: 0; undecided: 0.") in md
    assert "claim dispo@spg (sudoku) +5.0 (10 of 10 seeds above; Holm p 0.001 paired t, 0.020 sign-flip; gain shown)" in md
    assert "chosen after a look" not in md
    by["sudoku", "dispo@spg"]["after_look"] = {"touched": True}
    assert "| claim dispo@spg | Sudoku | +5.0 [+2.0, +8.0] | gain shown (chosen after a look) |" in tv.readme_markdown(rows)
    assert "1 of them were chosen after a look" in tv.readme_markdown(rows)
    del by["sudoku", "dispo@spg"]["after_look"]
    assert "Holm over 1 comparisons" in md and "selection split" not in md
    by["sudoku", "dtca@rldf"].update(stat=stat | {"n": 5}, verdict="undecided", p_t_holm=0.2, p_signflip_holm=0.5,
                                     diff={"split": "selection", "pending": {"seeds": 2, "need": 10, "source": "c.json"}})
    md = tv.readme_markdown(rows)  # a confirmation under way: the row says so and reads the selection records
    assert "| claim dtca@rldf | Sudoku | +5.0 [+2.0, +8.0] | undecided | selection, 5; confirmation 2 of 10 recorded |" in md
    assert "1 rows still read the selection split (their confirmation runs are not complete; 1 of them under way)" in md
    with pytest.raises(SystemExit, match="has no <!-- results:begin -->"):
        tv._replace_block("# no markers\n", tv.README_MARKS, md, "README.md")


def test_figure_panels_hold_a_base_with_its_arms_and_few_curves():
    cells = ["diffu_grpo_state", "dps@diffu_grpo_state", "dispo@diffu_grpo_state", "dps+dispo@diffu_grpo_state",
             "spg", "dispo@spg", "rldf", "dtca@rldf"]
    panels = tpg.curve_panels(cells, 5)
    assert panels == [cells[:4], cells[4:]]
    assert all(len(p) <= 5 for p in tpg.curve_panels(list(tp.CELLS), 5))
    assert sorted(c for p in tpg.curve_panels(list(tp.CELLS), 7) for c in p) == sorted(tp.CELLS)
    assert tpg.root_base("dps+dispo@diffu_grpo_state") == "diffu_grpo_state" and tpg.root_base("sml+dispo@diffu_grpo") == "diffu_grpo_mf"


def test_backfill_provenance_verifies_the_checkpoint_it_has(tmp_path):
    """Older records get an explicit test_reads and a 'backfilled' provenance block; the SFT weights' hash
    only where the checkpoint present scores exactly the record's step 0."""
    over = tp.SMOKE + ["train.steps=1"]
    setup = tr.Setup("sudoku", tp.BASES["sudoku"], over, "table", 8, gen_kw=tp.GEN_KW.get("sudoku"))
    step0 = setup.sft_val(setup.policy(), setup.cfg)
    other = {k: v + 0.5 for k, v in step0.items()}
    base = {"task": "sudoku", "cell": "spg", "overrides": over, "val_size": 8, "cpu_capability": "AVX2", "threads": 1}
    runs = {"a": base | {"seed": 0, "val_curve": [[0, step0]]}, "b": base | {"seed": 1, "val_curve": [[0, other]]},
            "c": base | {"seed": 2, "val_curve": [[0, step0]], "test": {"accuracy": 0.1}},
            "d": base | {"seed": 3, "val_curve": [[0, step0]], "provenance": {"sft": "kept"}}}
    path = tmp_path / "old.json"
    ablation_runs.save_results(path, {"runs": runs})
    counts = tprov.backfill_provenance([path])
    assert counts == {"records": 4, "backfilled": 3, "verified": 2}
    got = ablation_runs.load_results(path)["runs"]
    assert got["d"] == runs["d"]  # a record with provenance is left alone
    assert [got[k]["test_reads"] for k in "abc"] == [0, 0, 1]
    a, b = got["a"]["provenance"], got["b"]["provenance"]
    assert a["backfilled"] and a["sft"]["verified"] and a["sft"]["sha256"] == ablation_runs.checkpoint_sha256(setup.sft_dir)
    assert not b["sft"]["verified"] and b["sft"]["sha256"] is None and b["sft"]["settings_key"] == setup.sft_dir.name
    assert a["splits"]["selection"] == {"source": "generated", "seed": 4242, "size": 8} and a["torch"] is None
    assert a["data"]["source"] == "file" and len(a["data"]["sha256"]) == 64 and a["code"]["recorded_in"] is None
    assert tprov.backfill_provenance([path]) == {"records": 4, "backfilled": 0, "verified": 0}  # idempotent


def test_grid_markdown_by_hand(tmp_path):
    runs = {tp.run_key("sudoku", "spg", s, "lr=2e-05"): _rec("sudoku", "spg", s, a, 0.32) | {"grid_point": "lr=2e-05"}
            for s, a in ((0, 0.30), (1, 0.34))}
    runs[tp.run_key("sudoku", "spg", 0, "lr=5e-05")] = _rec("sudoku", "spg", 0, 0.40, 0.32) | {"grid_point": "lr=5e-05"}
    ablation_runs.save_results(tmp_path / "grid" / "sudoku_spg.json", {"runs": runs})
    text = trp.grid_markdown(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| spg |"))
    # 2e-05 over seeds 0, 1: 32.0; 5e-05 on seed 0 only; the best over the seeds both share (0): 5e-05
    assert row == "| spg | 32.0 (2) | 40.0 (1) | – | – | lr=5e-05 (40.0, seeds 0) |"
    assert "| dispo@spg | – | – | – | – | – |" in text and "the SFT model: 32.0 %" in text
    assert "The sudoku bases by their best grid point: spg 40.0 (lr=5e-05, 1 seeds)." in text
    # the best point at the lowest learning rate of the grid is marked: the optimum may lie below it
    runs[tp.run_key("sudoku", "spg", 0, "lr=2e-05")]["val"]["accuracy"] = 0.5
    ablation_runs.save_results(tmp_path / "grid" / "sudoku_spg.json", {"runs": runs})
    row = next(line for line in trp.grid_markdown(tmp_path).splitlines() if line.startswith("| spg |"))
    assert row == "| spg | 42.0 (2) | 40.0 (1) | – | – | lr=2e-05 (50.0, seeds 0, *grid edge*) |"
    assert trp.grid_markdown(tmp_path / "none") == ""


def test_test_table_says_when_a_retrained_run_differs_and_on_which_processor(tmp_path):
    """A --test-final run whose confirmation score differs from its record: the row gives the recorded score and
    whether the two records name the same processor (records made before the processor was recorded name none)."""
    def rec(acc, processor=None):
        pv = {"splits": {"test": {"size": 4}}, **({"processor": processor} if processor else {})}
        return {"cell": "spg", "seed": 10, "confirmation": {"accuracy": acc}, "provenance": pv}

    key = tp.run_key("sudoku", "spg", 10)
    for kind in ("confirm", "test"):
        tp.grid_path(kind, "sudoku", "spg", tmp_path).parent.mkdir(parents=True)
    cases = [(rec(0.25), "no: 25.0 recorded (its record names no processor)"),
             (rec(0.25, "AMD family 25"), "no: 25.0 recorded on another processor"),
             (rec(0.25, "Intel family 6"), "no: 25.0 recorded on the same processor"),
             (rec(0.25) | {"sft_hash": "a" * 64}, f"no: 25.0 recorded (its SFT weights differ: `{'a' * 8}…` recorded, "
                                                  f"`{'b' * 8}…` retrained; its record names no processor)")]
    for recorded, want in cases:
        if "sft_hash" in recorded:  # the SFT checkpoint changed between the two runs
            recorded["provenance"]["sft"] = {"sha256": recorded.pop("sft_hash")}
        tp.grid_path("confirm", "sudoku", "spg", tmp_path).write_text(json.dumps({"runs": {key: recorded}}))
        retrained = {**rec(0.5, "Intel family 6"), "test": {"accuracy": 0.75}, "reproduces_confirmation": False}
        retrained["provenance"]["sft"] = {"sha256": "b" * 64}
        tp.grid_path("test", "sudoku", "spg", tmp_path).write_text(json.dumps({"runs": {key: retrained}}))
        row = ta.test_markdown(tmp_path).splitlines()[-1]
        assert row == f"| sudoku | spg | spg | 10 | 75.0 [30.1, 95.4] (4 rows) | 50.0 | {want} |"
