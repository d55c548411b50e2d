"""The controlled table: every base × credit module, their compositions and cached rollouts under one
protocol, on one SFT checkpoint per task; the tuning grid and confirmation runs behind its verdicts.

Protocol
- Per task one base recipe (``configs/table/<task>.yaml``: model, task, SFT, samplers, the RL
  budget). A *cell* replaces whole component sections of it (``objective``, ``likelihood``,
  ``credit``) and may set ``rollout`` / ``train`` fields (:data:`CELLS`; ``--list`` prints them).
- Every cell of a task starts from the same SFT checkpoint (cached by its settings' hash) and runs
  the same number of RL steps with the same prompts per step, group size and μ = 1: the same
  completions and the same optimizer steps (``diffu_grpo_mf_mu4`` is the one exception, d1's
  inner iterations, with 4× the optimizer steps; it is labelled).
- Cells are paired by seed: ``train.seed = s`` fixes the prompt order and the rollout generator's
  seed, so seed s of every cell sees the same prompts (rollouts then differ as the models do).
- Two validation splits, generated disjoint from the training rows, the test file and each other:
  the *selection* split (300 rows, seed 4242; every choice is made on it) is scored greedily every
  ``--eval-every`` RL steps and at the end (the curve starts at the SFT model, step 0); the
  *confirmation* split (500 rows, seed 5353) scores only the final models of ``--confirm``, once each.
  The test file only with ``--test``, once per run at its end. Each record says which splits it scored
  (``scored_on``), how often it read the test file (``test_reads``, 0 written out) and the confirmation
  split, and carries its provenance: the SFT weights' sha256, the test file's path and sha256 (or
  ``generated`` and its seed), the splits' seeds and sizes, the code commit, the torch version and CPU
  kernel set (:meth:`ablation_runs.TaskSetup.provenance`). Without a local data file the table stops
  unless ``--generated-data`` asks for generated rows (they change every split and every number).
- ``--grid FAMILY``: each base and its credit arms (:data:`GRID_FAMILIES`) over the same learning-rate
  grid (:data:`GRID_LRS`, and β where the base has one) on the selection split, seeds 0 and 1
  (``results/grid/<task>_<family>.json``), extended one rung of :data:`LR_LADDER` at a time while an
  arm's best point lies at the grid's lowest or highest rate (``--no-extend``: not); ``--confirm
  FAMILY``: each arm at its own best grid point (:func:`best_points`) on 10 fresh paired seeds, scored
  once on the confirmation split (``results/confirm/<task>_<family>.json``, with the SFT model's
  confirmation score); ``--test-final FAMILY``, once every recipe is fixed: the test file read once per
  arm, by its first confirmation seed retrained (``results/test/<task>_<family>.json``). The
  cached-rollout pair (family ``cache``) has no grid: both samplers run at the state base's best point.
- ``--verdicts`` regenerates the top of ``docs/results.md``: for each headline claim (:data:`CLAIMS`)
  the difference over seeds with its exact t-interval and its family-wise (Bonferroni) interval, the
  paired-t and exact sign-flip p-values Holm-corrected over the family, and a verdict in words that say
  what was shown (:func:`verdict`), from the confirmation records where they exist and are complete, else
  the selection records (marked); what the intervals cover (the same final models on the selection
  split), the claims chosen again after their confirmation was read (superseded runs) and the rows paired
  across two SFT checkpoints (:mod:`table_audit`); two figures (the verdicts as a picture, the curves of
  the runs behind them); generated readings; and every inline verdict reference elsewhere on the page.
- One JSON record per run, written as soon as it finishes (``--out``, default the committed
  ``results/controlled_table.json``): an interrupted table resumes, and the table can be finished
  over several sessions. ``--summary`` regenerates ``docs/results.md`` (markdown) and the curve
  plot from the records alone.

Statistics per cell: mean and 95 % t-interval (exact quantile, ``maskrl.stats``) over seeds of the solved rate and the task's reward
metric (Sudoku: cell accuracy), the paired difference to the cell's base row (same seeds) with its
interval and sign count, the area under the validation curve (trapezoid over steps, divided by the
steps: the mean accuracy along the run) and the first evaluated step at which the seed-mean curve
reaches the base's final accuracy, and the RL wall time.

    python benchmarks/table/controlled_table.py --tasks sudoku --seeds 0,1,2,3,4            # the CPU table
    python benchmarks/table/controlled_table.py --summary                                    # docs/results.md
    python benchmarks/table/controlled_table.py --smoke --out /tmp/table_smoke.json          # every cell, 1 step
    python benchmarks/table/controlled_table.py --tasks sudoku --grid spg --confirm spg      # fair bases: grid, confirmation
    python benchmarks/table/controlled_table.py --verdicts                                   # the headline page
    python benchmarks/table/controlled_table.py --recipes 8b --tasks gsm8k,math500,countdown,sudoku --seeds 0,1,2
        # the GPU cells: the same cells at the papers' shapes (LLaDA-8B-Instruct, L 256, block 32)
    python benchmarks/table/controlled_table.py --base gsm8k=configs/llada8b_gsm8k_diffu_grpo.yaml --tasks gsm8k ...
        # the same cells over any other base recipe: --base TASK=YAML

Modules (one seam each; this one is the command line: the grid and confirmation loops and ``main``):
``table_protocol`` the cells, base recipes, grid and record paths (pure data); ``table_runs`` one run and
its record; ``table_pages`` the ``--summary`` tables and curve figures; ``table_verdicts`` the headline
page (``--verdicts``); ``table_audit`` what that page says about its own protocol (choices after a look,
SFT checkpoints, interval coverage, census, test-file table); ``table_provenance`` ``--backfill-provenance``. Names in this docstring
(:data:`CELLS`, :data:`GRID_FAMILIES`, :func:`best_points`, :data:`CLAIMS`, ...) live there.

GPU cells (``--recipes 8b``): each task's base becomes its shipped LLaDA-8B-Instruct recipe
(:data:`RECIPES_8B`: model, LoRA, dtype, checkpointing, task, sampler and evaluation at L 256 / block 32,
batch and learning rate) with the protocol pinned (:func:`gpu_base`: μ = 1, the fixed schedule at L/2
steps, no KV cache, no credit module -- each cell brings its own); the model is the recipe's checkpoint
(no SFT); GSM8K and MATH500, which have no generator, hold their validation rows out of the training
split. Records go to ``results/controlled_table_8b.json`` unless ``--out`` says otherwise. Every
resolved GPU cell is checked by config validation, and every cell by a dry run on the plan's stand-in
model, in ``tests/test_controlled_table.py``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ablation_runs import ROOT, code_version, load_results, update_results
from table_pages import markdown, markers, plot, plot_path, summarize, write_doc
from table_protocol import (CELLS, CONFIRM_SEEDS, CONFIRM_SIZE, DEFAULT_FIRST, DOC, GEN_KW, GRID_EVERY,
                            GRID_FAMILIES, GRID_LRS, GRID_RECIPE, GRID_SEEDS, OUT, OUT_8B, R3, SECOND_TASK, SMOKE,
                            best_points, cell_recipe, edge_extension, family_lrs, grid_path, grid_points,
                            resolve_bases, run_key)
from table_provenance import backfill_provenance
from table_runs import Setup, pos_table_for, run, run_settings
from table_verdicts import README, write_verdicts


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x != ""]


def parser() -> argparse.ArgumentParser:
    """The command line of :func:`main` (also what the documented commands are checked against)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="sudoku")
    ap.add_argument("--cells", default="", help="comma-separated cells (default: DEFAULT_FIRST on the first task, "
                                                "SECOND_TASK on the others)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--val-size", type=int, default=300, help="rows of the selection split")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="score the selection split every N RL steps (default: the cadence the task's records in "
                         f"--out were made with, else 5; {GRID_EVERY} with --grid / --confirm)")
    ap.add_argument("--test", action="store_true", help="score the test file once per run at its end")
    ap.add_argument("--generated-data", action="store_true",
                    help="allow generated evaluation rows when no local data file exists (changes every split)")
    ap.add_argument("--grid", default="", help=f"comma-separated families ({', '.join(GRID_FAMILIES)}): every arm at "
                                               "every grid point on the selection split (GRID_FAMILIES, GRID_LRS)")
    ap.add_argument("--confirm", default="", help="comma-separated families: each arm at its own best grid point, "
                                                  "scored once on the confirmation split")
    ap.add_argument("--test-final", default="", help="comma-separated families, once every recipe is fixed: each "
                                                     "arm's first confirmation seed retrained at its selected point "
                                                     "and scored once on the test file (results/test/)")
    ap.add_argument("--grid-lrs", default=",".join(f"{x:g}" for x in GRID_LRS))
    ap.add_argument("--supersede", action="store_true",
                    help="with --confirm: move confirmation runs recorded at a point no longer selected to the "
                         "file's 'superseded' list and run those arms again (without it such runs are an error)")
    ap.add_argument("--no-extend", action="store_true",
                    help="do not extend a family's grid along LR_LADDER when an arm's best point is at its edge")
    ap.add_argument("--grid-seeds", default=",".join(map(str, GRID_SEEDS)))
    ap.add_argument("--confirm-seeds", default=",".join(map(str, CONFIRM_SEEDS)))
    ap.add_argument("--confirm-size", type=int, default=CONFIRM_SIZE, help="rows of the confirmation split")
    ap.add_argument("--base", action="append", default=[], help="TASK=YAML: another base recipe for a task")
    ap.add_argument("--recipes", choices=("cpu", "8b"), default="cpu",
                    help="8b: the GPU cells, each task's base its shipped LLaDA-8B recipe (RECIPES_8B, gpu_base)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pos-samples", type=int, default=128)
    ap.add_argument("--smoke", action="store_true", help="every cell, 1 step, tiny shapes (proves each cell runs)")
    ap.add_argument("--out", default=None, help=f"records (default {OUT.relative_to(ROOT)}; with --recipes 8b "
                                                    f"{OUT_8B.relative_to(ROOT)}; with --grid / --confirm "
                                                    "results/{grid,confirm}/<task>_<family>.json)")
    ap.add_argument("--summary", action="store_true", help="only regenerate docs/results.md and the plot")
    ap.add_argument("--verdicts", action="store_true", help="only regenerate the verdict table, its two figures "
                                                           "and the generated readings of docs/results.md")
    ap.add_argument("--backfill-provenance", action="store_true",
                    help="give the records made before provenance was written an explicit test_reads and a "
                         "'backfilled' provenance block (verifying the SFT checkpoints present)")
    ap.add_argument("--doc", default=str(DOC))
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "table"), help="run folders and resolved cell recipes")
    ap.add_argument("--list", action="store_true", help="print the cells and exit")
    return ap


def eval_cadence(out: Path, task: str, given: int | None) -> int:
    """The validation cadence of ``task``'s runs: ``given`` when set, else the one the task's records in
    ``out`` were made with (so a documented resume command needs no flag), else 5.

    Raises:
        SystemExit: no ``given`` and the task's records hold several cadences.
    """
    if given is not None:
        return given
    seen = {r.get("eval_every") for r in load_results(out)["runs"].values() if r.get("task") == task}
    if len(seen) > 1:
        raise SystemExit(f"error: {out} holds {task} runs at several --eval-every values {sorted(seen)}; pass one")
    return seen.pop() if seen else 5


def planned_runs(args: argparse.Namespace) -> list[dict]:
    """Every run a plain (table) invocation would make or skip: ``{"out", "task", "cell", "seed", "key",
    "settings"}``, without building any data, model or recipe (what the documented-commands test reads)."""
    out = Path(args.out or (OUT_8B if args.recipes == "8b" else OUT))
    overrides = list(args.overrides) + (["train.steps=1"] if args.smoke else [])
    if args.smoke:
        overrides = SMOKE + overrides
    plan = []
    for i, task in enumerate(t for t in args.tasks.split(",") if t):
        every = 0 if args.smoke else eval_cadence(out, task, args.eval_every)
        names = [c for c in args.cells.split(",") if c] or (
            (list(CELLS) if args.smoke else DEFAULT_FIRST) if i == 0 else SECOND_TASK)
        for name in names:
            for seed in _ints(args.seeds):
                plan.append({"out": out, "task": task, "cell": name, "seed": seed, "key": run_key(task, name, seed),
                             "settings": run_settings(overrides, min(args.val_size, 8) if args.smoke else args.val_size,
                                                      every)})
    return plan


def check_families(args: argparse.Namespace) -> None:
    """Every family named by ``--grid`` / ``--confirm`` / ``--test-final`` is known, and none of ``--grid``
    is a ``tuned_by`` family (checked before any data is built).

    Raises:
        SystemExit: an unknown family (names the known ones), or ``--grid`` of a ``tuned_by`` family.
    """
    for family in [f for f in ",".join((args.grid, args.confirm, args.test_final)).split(",") if f]:
        grid_points(family)  # an unknown family: SystemExit naming the known ones
        tuned_by = GRID_FAMILIES[family].get("tuned_by")
        if tuned_by and family in args.grid.split(","):
            raise SystemExit(f"error: --grid {family}: the family has no grid of its own; its arms run at the best "
                             f"point of {tuned_by[0]}'s {tuned_by[1]} (--grid {tuned_by[0]}, then --confirm {family})")


def run_grid(setup: Setup, task: str, family: str, recipes: dict, common: list[str], every: int,
             args: argparse.Namespace, gpath: Path, runs_dir: Path, lrs: list[float]) -> None:
    """``--grid``: every arm of ``family`` at every grid point on the grid seeds (selection split, records in
    ``gpath``), then one more rung of :data:`LR_LADDER` at a time while an arm's best point lies at the
    grid's edge (:func:`edge_extension`; not with ``--no-extend``). An extension begun before is resumed."""
    arms = GRID_FAMILIES[family]["arms"]
    grid = family_lrs(load_results(gpath), task, family, lrs)  # with any extension begun before
    while grid:
        for seed in _ints(args.grid_seeds):
            for label, over in grid_points(family, grid):
                for arm in arms:
                    run(setup, gpath, task, arm, recipes[arm], common + over, seed, every, False,
                        runs_dir / "grid", point=label)
        data = load_results(gpath)
        done = family_lrs(data, task, family, lrs)
        best = best_points(data, task, family, _ints(args.grid_seeds), done)
        add = [] if args.no_extend else edge_extension(best, done)
        if add:
            at = ", ".join(f"{a} at {b['point']}" for a, b in best.items())
            print(f"[table] {task}/{family}: a best point at the grid's edge ({at}); adding lr "
                  f"{', '.join(f'{x:g}' for x in add)} (LR_LADDER)", flush=True)
        grid = add


def selected_points(task: str, family: str, args: argparse.Namespace, root: Path, lrs: list[float]) -> dict[str, dict]:
    """Each arm's point for ``--confirm``: its own best grid point (:func:`best_points` over the grid with
    its extensions), or for a ``tuned_by`` family the best point of that family's arm, for every arm.

    Raises:
        SystemExit: no grid file, or an arm with no complete grid point.
    """
    arms = GRID_FAMILIES[family]["arms"]
    tuned_by = GRID_FAMILIES[family].get("tuned_by")
    if tuned_by:
        src, src_arm = tuned_by
        src_data = load_results(grid_path("grid", task, src, root), must_exist=True)
        chosen = best_points(src_data, task, src, _ints(args.grid_seeds),
                             family_lrs(src_data, task, src, lrs), arms=[src_arm])[src_arm]
        return {arm: {**chosen, "tuned_by": f"{src}/{src_arm}"} for arm in arms}
    data = load_results(grid_path("grid", task, family, root), must_exist=True)
    return best_points(data, task, family, _ints(args.grid_seeds), family_lrs(data, task, family, lrs))


def run_confirm(setup: Setup, task: str, family: str, recipes: dict, common: list[str], every: int,
                args: argparse.Namespace, root: Path, runs_dir: Path, lrs: list[float]) -> Path:
    """``--confirm``: each arm at its selected point (:func:`selected_points`) on the confirmation seeds,
    each final model scored once on the confirmation split, and the SFT model scored once; confirmation
    runs recorded at a point no longer selected are handled by :func:`supersede_stale`. Returns the
    record file (``results/confirm/<task>_<family>.json``)."""
    arms = GRID_FAMILIES[family]["arms"]
    best = selected_points(task, family, args, root, lrs)
    cpath = grid_path("confirm", task, family, root)
    supersede_stale(cpath, task, {arm: common + best[arm]["overrides"] for arm in arms},
                    {arm: best[arm]["point"] for arm in arms}, args.supersede)
    for seed in _ints(args.confirm_seeds):
        for arm in arms:
            run(setup, cpath, task, arm, recipes[arm], common + best[arm]["overrides"], seed, every, False,
                runs_dir / "confirm", confirm=True)
    if task not in load_results(cpath).get("sft_confirmation", {}):  # the SFT model, scored once
        policy = setup.policy()
        sft = setup.evaluate(policy, setup.cfg, setup.confirm)
        update_results(cpath, lambda d: d.setdefault("sft_confirmation", {}).__setitem__(task, sft))
    update_results(cpath, lambda d: d.__setitem__("selected", best))
    return cpath


def run_families(args: argparse.Namespace, bases: dict[str, Path]) -> list[Path]:
    """``--grid``, then ``--confirm``, then ``--test-final``, for each task and family
    (:func:`run_grid`, :func:`run_confirm`, :func:`test_final`). Returns the record files written.

    Raises:
        SystemExit: an unknown family or task, ``--grid`` of a ``tuned_by`` family, or a confirmation
        whose grid has no complete point (each before any run of that family).
    """
    check_families(args)
    written = []
    lrs = [float(x) for x in args.grid_lrs.split(",") if x]
    runs_dir = Path(args.runs_dir)
    for task in [t for t in args.tasks.split(",") if t]:
        if task not in GRID_RECIPE and not args.smoke:
            raise SystemExit(f"error: no grid recipe for task {task!r}; known: {', '.join(GRID_RECIPE)}")
        common = GRID_RECIPE.get(task, []) + (SMOKE if args.smoke else []) + list(args.overrides) \
            + (["train.steps=1"] if args.smoke else [])
        every = 0 if args.smoke else (args.eval_every if args.eval_every is not None else GRID_EVERY)
        val_size = min(args.val_size, 8) if args.smoke else args.val_size
        confirm_size = ((min(args.confirm_size, 8) if args.smoke else args.confirm_size)
                        if args.confirm or args.test_final else 0)
        setup = Setup(task, bases[task], common, "table", val_size, gen_kw=GEN_KW.get(task), confirm_size=confirm_size,
                      require_file=not args.generated_data)
        root = Path(args.out).parent if args.out else OUT.parent
        pos_dir = (root if args.smoke else OUT.parent) / "pos_weights"
        for mode, families in (("grid", args.grid), ("confirm", args.confirm), ("test", args.test_final)):
            for family in [f for f in families.split(",") if f]:
                arms = GRID_FAMILIES[family]["arms"]
                table = pos_table_for(setup, task, arms, pos_dir, args.smoke, args.pos_samples)
                recipes = {a: cell_recipe(bases[task], a, table, runs_dir / "recipes") for a in arms}
                if mode == "grid":
                    gpath = grid_path("grid", task, family, root)
                    run_grid(setup, task, family, recipes, common, every, args, gpath, runs_dir, lrs)
                    written.append(gpath)
                elif mode == "confirm":
                    written.append(run_confirm(setup, task, family, recipes, common, every, args, root, runs_dir, lrs))
                else:
                    written.append(test_final(setup, task, family, arms, recipes, common, every, args, root, runs_dir))
    return written


def supersede_stale(cpath: Path, task: str, want: dict[str, list[str]], points: dict[str, str], move: bool) -> None:
    """Confirmation runs in ``cpath`` of ``task``'s arms (the keys of ``want``) recorded with other overrides
    than ``want[arm]``, the point selected now (the grid grew since they ran): an error naming them, or with
    ``move`` (``--supersede``) moved to the file's ``superseded`` list, kept with their reads, never paired
    again, so those arms run again at their new point.

    Raises:
        SystemExit: stale runs and not ``move`` (names the arms, their recorded and their selected points).
    """
    data = load_results(cpath)
    stale = sorted(k for k, r in data["runs"].items()
                   if r.get("task") == task and r.get("cell") in want and r.get("overrides") != want[r["cell"]])
    if not stale:
        return
    arms = sorted({data["runs"][k]["cell"] for k in stale})
    was = data.get("selected", {})
    moves = ", ".join(f"{a} {was.get(a, {}).get('point', '?')} -> {points[a]}" for a in arms)
    if not move:
        raise SystemExit(f"error: {cpath}: {len(stale)} confirmation runs were recorded at another grid point than the "
                         f"one selected now ({moves}); --supersede moves them to the file's 'superseded' list (kept, "
                         "never paired again) and runs those arms at their new point")

    def change(d):
        for k in stale:
            if k in d["runs"]:
                d.setdefault("superseded", []).append({"key": k, **d["runs"].pop(k)})
    update_results(cpath, change)
    print(f"[table] {cpath}: {len(stale)} confirmation runs superseded ({moves})", flush=True)


def test_final(setup: Setup, task: str, family: str, arms, recipes: dict, common: list[str], every: int,
               args: argparse.Namespace, root: Path, runs_dir: Path) -> Path:
    """``--test-final``: the test file read once per headline cell, after every recipe is fixed. Each arm's
    first confirmation seed is retrained at the point its confirmation file selected (the weights of the
    confirmation runs are not kept) and its final model scored on the confirmation split and, once, on the
    test file (``results/test/<task>_<family>.json``); ``reproduces_confirmation`` says whether the
    retrained model's confirmation score equals the recorded one (it does on the same machine, software
    and CPU kernel set). A family whose base carries the claim over the SFT model (``sft_claim``) also
    scores the SFT model once on the test file (``sft_test``). Returns the record file.

    Raises:
        SystemExit: no confirmation file, no selected point, or no recorded confirmation run of that seed.
    """
    cpath = grid_path("confirm", task, family, root)
    cdata = load_results(cpath, must_exist=True)
    seed = _ints(args.confirm_seeds)[0]
    tpath = grid_path("test", task, family, root)
    for arm in arms:
        key = run_key(task, arm, seed)
        conf = cdata["runs"].get(key)
        if conf is None or arm not in cdata.get("selected", {}):
            raise SystemExit(f"error: --test-final {family}: {cpath} has no confirmation run {key} "
                             f"with its selected point; run --confirm {family} first")
        run(setup, tpath, task, arm, recipes[arm], common + cdata["selected"][arm]["overrides"], seed, every, True,
            runs_dir / "test", confirm=True)
        same = load_results(tpath)["runs"][key]["confirmation"] == conf["confirmation"]
        update_results(tpath, lambda d: d["runs"][key].__setitem__("reproduces_confirmation", same))
        if not same:
            print(f"[table] {key}: the retrained model's confirmation score differs from {cpath}'s (another "
                  "processor, CPU kernel set or software?)", flush=True)
    if GRID_FAMILIES[family].get("sft_claim") and task not in load_results(tpath).get("sft_test", {}):
        sft = {**setup.evaluate(setup.policy(), setup.cfg, setup.test), "rows": len(setup.test), "test_reads": 1}
        update_results(tpath, lambda d: d.setdefault("sft_test", {}).__setitem__(task, sft))
    return tpath


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    code_version()  # the commit this process runs, read now: later commits in the checkout do not change its code
    if args.list:
        for name, spec in CELLS.items():
            print(f"{name:32s} {spec['kind']:12s} base={spec['base']}  {spec['note']}")
        return
    torch.set_num_threads(args.threads)
    if args.verdicts:
        write_verdicts(Path(args.doc), README if Path(args.doc).resolve() == DOC.resolve() else None)
        return
    if args.backfill_provenance:
        paths = [OUT, R3] + sorted((OUT.parent / "testbed_search").glob("*.json"))
        print(f"[table] provenance: {backfill_provenance([p for p in paths if p.is_file()])}", flush=True)
        return
    bases = resolve_bases(args.recipes, Path(args.runs_dir) / "recipes")
    for item in args.base:
        task, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"error: --base {item!r}: expected TASK=YAML")
        bases[task] = Path(path).resolve()
    if args.grid or args.confirm or args.test_final:
        for path in run_families(args, bases):
            print(f"[table] records in {path}", flush=True)
        return
    out = Path(args.out or (OUT_8B if args.recipes == "8b" else OUT))
    load_results(out)  # a file that is not a results file: an error before any run
    if args.smoke:
        args.pos_samples = 2
    plan = planned_runs(args) if not args.summary else []
    by_task: dict[str, list[dict]] = {}
    for p in plan:
        by_task.setdefault(p["task"], []).append(p)
    for task, items in by_task.items():
        if task not in bases:
            raise SystemExit(f"error: no base recipe for task {task!r}; known: {', '.join(bases)} (or --base TASK=YAML)")
        overrides, val_size = items[0]["settings"]["overrides"], items[0]["settings"]["val_size"]
        setup = Setup(task, bases[task], overrides, "table", val_size, gen_kw=GEN_KW.get(task),
                      require_file=not args.generated_data)
        names = list(dict.fromkeys(p["cell"] for p in items))
        table = pos_table_for(setup, task, names, out.parent / "pos_weights", args.smoke, args.pos_samples)
        recipes = Path(args.runs_dir) / "recipes"  # resolved cells (absolute paths inside)
        paths = {n: cell_recipe(bases[task], n, table, recipes) for n in names}
        for p in items:
            run(setup, out, task, p["cell"], paths[p["cell"]], overrides, p["seed"], p["settings"]["eval_every"],
                args.test, Path(args.runs_dir))
    if not load_results(out)["runs"]:
        raise SystemExit(f"error: no runs in {out}; nothing to summarise")
    data = update_results(out, lambda d: d.__setitem__("summary", summarize(d)))
    if not args.smoke:
        doc = Path(args.doc)
        write_doc(doc, markdown(data["summary"], out, data["runs"], plot_path(doc, out).name), markers(out))
        plot(data, plot_path(doc, out))
        print(f"[table] wrote {args.doc}", flush=True)


if __name__ == "__main__":
    main()
