"""The appendix of the headline page (``--verdicts``), from the committed records: the tuning grids on the
selection split (each arm's score per grid point and its best point) and the commands that regenerate the
page and resume every record file."""
from __future__ import annotations

from pathlib import Path

from ablation_runs import ROOT, load_results
from table_protocol import CELLS, GRID_FAMILIES, OUT, R3, best_points, family_lrs, grid_points, point_lr

#: the commit at which the retired probes' code was last present (their records and the page's account of
#: them stay; ``git show RETIRED_AT:<script>`` prints one)
RETIRED_AT = "a799d32"
#: each retired probe: where its code was and how to read it; the question its records answer is on the page
RETIRED = {f"benchmarks/{name}.py": f"benchmarks/{name}.py is retired: its code was last present at commit "
                                    f"{RETIRED_AT} (git show {RETIRED_AT}:benchmarks/{name}.py)"
           for name in ("testbed_search", "testbed_probe", "testbed_ceiling", "testbed_transfer", "daca_ablation",
                        "dispo_ablation", "dtca_ablation")}


def _wrap(words: list[str], width: int = 104) -> str:
    """One shell command from ``words``, continued with `` \\`` past ``width`` characters."""
    lines, cur = [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur + " \\")
            cur = "  " + w
        else:
            cur = f"{cur} {w}" if cur else w
    return "\n".join(lines + [cur])


def grid_markdown(root: Path = OUT.parent) -> str:
    """The tuning grids recorded under ``root/grid``: per task and family, each arm's seed-mean final
    selection-split solved rate (%) and seeds at each grid point, and the point it would run at now
    (:func:`best_points` over the seeds every point has; a point at the lowest or highest learning rate is
    marked *grid edge*: the optimum may lie outside the grid), then each task's bases ranked by their best
    point ('' when no grid is recorded)."""
    parts, bases = [], {}
    for path in sorted((root / "grid").glob("*.json")):
        task, _, family = path.stem.partition("_")
        if family not in GRID_FAMILIES:
            continue
        runs = load_results(path)["runs"]
        lrs = family_lrs({"runs": runs}, task, family)
        labels = [lab for lab, _ in grid_points(family, lrs)]
        sft = sorted({round(100 * r["val_curve"][0][1]["accuracy"], 1) for r in runs.values()})
        lines = [f"`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}` ({task}, {family}): seed-mean final "
                 f"solved rate on the selection split, % (seeds); the SFT model: {', '.join(map(str, sft))} %", "",
                 "| arm | " + " | ".join(labels) + " | best so far |", "| --- " * (len(labels) + 2) + "|"]
        for arm in GRID_FAMILIES[family]["arms"]:
            cells, complete = [], {}
            for lab in labels:
                rs = [r for r in runs.values() if r["cell"] == arm and r.get("grid_point") == lab and r["task"] == task]
                if rs:
                    cells.append(f"{100 * sum(r['val']['accuracy'] for r in rs) / len(rs):.1f} ({len(rs)})")
                    complete[lab] = {r["seed"] for r in rs}
                else:
                    cells.append("–")
            shared = set.intersection(*complete.values()) if complete else set()
            best = "–"
            if shared:
                b = best_points({"runs": runs}, task, family, sorted(shared), arms=[arm])[arm]
                edge = ", *grid edge*" if point_lr(b["point"]) in (min(lrs), max(lrs)) else ""
                best = f"{b['point']} ({100 * b['val_mean']:.1f}, seeds {','.join(map(str, b['seeds']))}{edge})"
                if arm == GRID_FAMILIES[family]["arms"][0]:
                    bases.setdefault(task, []).append((b["val_mean"], arm, b["point"], len(b["seeds"])))
            lines.append(f"| {arm} | " + " | ".join(cells) + f" | {best} |")
        parts.append("\n".join(lines) + "\n")
    if not parts:
        return ""
    for task, ranked in bases.items():
        parts.append(f"The {task} bases by their best grid point: " + ", ".join(
            f"{arm} {100 * m:.1f} ({point}, {n} seeds)" for m, arm, point, n in sorted(ranked, reverse=True)) + ".\n")
    return ("### Tuning grid (selection split)\n\nThe same learning-rate grid (and β where the base has one) for each "
            "base and its credit arms, seeds 0 and 1, extended by one rate of the ladder 1e-5 … 1e-3 (`LR_LADDER`) "
            "while an arm's best point lies at the grid's edge (*grid edge* below: an extension is pending, or "
            "the rate is a ladder end); each arm then runs at its own best point on 10 fresh seeds "
            "on the confirmation split (`--confirm`). The cached-rollout pair (`--confirm cache`) has no grid: both "
            "of its samplers run at the state base's best point.\n\n" + "\n".join(parts))


def reproduce_commands() -> str:
    """The commands that regenerate the page and resume every record file, read from the records
    themselves (cells, seeds, ``--eval-every`` and ``--set`` overrides per task), as a shell block."""
    import shlex

    py = ["python", "benchmarks/table/controlled_table.py"]
    out = ["# this block, the verdicts and the figures", "python benchmarks/table/controlled_table.py --verdicts",
           "# the first table (each task resumes at the cadence its records were made with)",
           "python benchmarks/table/controlled_table.py --tasks sudoku,countdown --seeds 0,1,2,3,4",
           "python benchmarks/table/controlled_table.py --summary"]
    if R3.is_file():
        out.append("# the third-round table, one command per task")
        runs = load_results(R3)["runs"].values()
        for task in sorted({r["task"] for r in runs}, key=lambda t: (t != "sudoku", t)):
            rs = [r for r in runs if r["task"] == task]
            cells = sorted({r["cell"] for r in rs}, key=lambda c: list(CELLS).index(c) if c in CELLS else 99)
            (every,) = {r["eval_every"] for r in rs}
            (over,) = {tuple(r["overrides"]) for r in rs}
            words = py + ["--tasks", task, "--cells", ",".join(cells), "--seeds", ",".join(map(str, sorted({r["seed"] for r in rs}))),
                          "--eval-every", str(every), "--out", str(R3.relative_to(ROOT)), "--runs-dir", "runs/table_r3"]
            for o in over:
                words += ["--set", o]
            out.append(_wrap(words))
        out.append(f"python benchmarks/table/controlled_table.py --summary --out {R3.relative_to(ROOT)}")
    out += ["# the tuning grid on the selection split, then each arm at its best point on the confirmation split",
            "python benchmarks/table/controlled_table.py --tasks sudoku --grid spg --confirm spg",
            "python benchmarks/table/controlled_table.py --tasks sudoku --grid state,rldf,wd1,mf --confirm state,rldf,wd1,mf",
            "# the cached-rollout pair at the best point of the state base (no grid of its own)",
            "python benchmarks/table/controlled_table.py --tasks sudoku --confirm cache",
            "python benchmarks/table/controlled_table.py --tasks countdown --grid state,wd1 --confirm state,wd1",
            "# the test file, once every recipe is fixed (one retrained model per arm)",
            "python benchmarks/table/controlled_table.py --tasks sudoku --test-final state,rldf,wd1,mf,spg,cache",
            "python benchmarks/table/controlled_table.py --tasks countdown --test-final state,wd1",
            "# the testbed pilots (records: results/testbed_search/), grouped by the seeds and cadence their records "
            "were made with;", f"# {RETIRED['benchmarks/testbed_search.py']}"]
    groups: dict[tuple, list[str]] = {}
    for path in sorted((OUT.parent / "testbed_search").glob("*.json")):
        rs = list(load_results(path)["runs"].values())
        if rs:
            every = {r["eval_every"] for r in rs}
            key = (",".join(map(str, sorted(r["seed"] for r in rs))), every.pop() if len(every) == 1 else None)
            groups.setdefault(key, []).append(path.stem)
    for (seeds, every), names in groups.items():
        if every is not None:
            out.append("# " + _wrap(["python", "benchmarks/testbed_search.py", "--run", ",".join(names), "--seeds", seeds,
                                     "--eval-every", str(every)]).replace("\n", "\n# "))
    out.append("# python benchmarks/testbed_search.py --summary")
    assert all(shlex.split(c.replace("\\\n", " ")) for c in out)
    return "```bash\n" + "\n".join(out) + "\n```\n"
