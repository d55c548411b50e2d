"""The controlled table's summary pages from its records alone (``--summary``): per-cell statistics
(t-intervals over seeds, paired differences to the cell's base, the area under the validation curve, the
step that reaches the base's final accuracy), the markdown table between its markers in docs/results.md,
and the curve figures (a base with its credit arms a panel, at most 8 curves, labelled axes, seed bands)."""
from __future__ import annotations

import math
from pathlib import Path

from ablation_runs import ROOT, differences, format_differences, load_results, t_interval
from table_protocol import CELLS, GRID_FAMILIES, OUT, curve_area


def mean_curve(rows: list[dict]) -> list[tuple[int, float]]:
    """Seed-mean accuracy at the evaluation steps every run shares."""
    steps = sorted(set.intersection(*[{s for s, _ in r["val_curve"]} for r in rows]))
    return [(s, sum(dict((a, m["accuracy"]) for a, m in r["val_curve"])[s] for r in rows) / len(rows)) for s in steps]


def paired(rows: dict[int, dict], base: dict[int, dict], split: str, metric: str) -> dict | None:
    """Paired (same seed) difference cell − base: mean, 95 % t-interval, signs, seeds."""
    seeds = sorted(s for s in rows if s in base and split in rows[s] and split in base[s] and metric in rows[s][split])
    if not seeds:
        return None
    return {**differences([rows[s][split][metric] - base[s][split][metric] for s in seeds]), "seeds": seeds}


def summarize(data: dict) -> list[dict]:
    """One entry per (task, cell) with every statistic of the module docstring."""
    by: dict[tuple[str, str], dict[int, dict]] = {}
    for r in data["runs"].values():
        by.setdefault((r["task"], r["cell"]), {})[r["seed"]] = r
    out = []
    for (task, name), rows in sorted(by.items(), key=lambda kv: (kv[0][0], list(CELLS).index(kv[0][1]) if kv[0][1] in CELLS else 99)):
        entry = {"task": task, "cell": name, "kind": CELLS.get(name, {}).get("kind"), "base": CELLS.get(name, {}).get("base"),
                 "seeds": sorted(rows), "rl_seconds": t_interval([r["rl_seconds"] for r in rows.values()])[0],
                 "rl_cpu_seconds": t_interval([r.get("rl_cpu_seconds", float("nan")) for r in rows.values()])[0],
                 "optimizer_steps": sorted({r["optimizer_steps"] for r in rows.values()}),
                 "completions": sorted({r["completions"] for r in rows.values()})}
        metrics = [k for k in ("accuracy", "cell_accuracy", "mean_reward") if all(k in r["val"] for r in rows.values())]
        for split in ("val", "test"):
            if all(split in r for r in rows.values()):
                entry[split] = {}
                for k in metrics:
                    m, lo, hi = t_interval([r[split][k] for r in rows.values()])
                    entry[split][k] = {"mean": m, "ci95": [lo, hi]}
        entry["sft_val_accuracy"] = t_interval([r["val_curve"][0][1]["accuracy"] for r in rows.values()])[0]
        entry["val_auc"] = t_interval([curve_area(r["val_curve"]) for r in rows.values()])[0]
        base = by.get((task, entry["base"])) if entry["base"] else None
        if base:
            for split in ("val", "test"):
                p = paired(rows, base, split, "accuracy")
                if p:
                    entry[f"paired_{split}"] = p
            target = mean_curve(list(base.values()))[-1][1]
            entry["steps_to_base_final"] = next((s for s, a in mean_curve(list(rows.values())) if a >= target - 1e-12), None)
        mism = [sum(r["rollout_mismatch"]) / len(r["rollout_mismatch"]) for r in rows.values() if r.get("rollout_mismatch")]
        if mism:  # cached rollouts: the mean |log commit_prob - log p_theta| (nats) of each run, over seeds
            m, lo, hi = t_interval(mism)
            entry["rollout_mismatch"] = {"mean": m, "ci95": [lo, hi], "seeds": len(mism)}
        gain = paired(rows, {s: {"val": {"accuracy": r["val_curve"][0][1]["accuracy"]}} for s, r in rows.items()}, "val", "accuracy")
        entry["gain_over_sft_val"] = gain
        out.append(entry)
    return out


def _ci(x: dict | None, digits: int = 3) -> str:
    if not x:
        return "–"
    lo, hi = x["ci95"]
    return f"{x['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _reach(e: dict) -> str:
    if "steps_to_base_final" not in e:
        return "–"  # a base row: nothing to reach
    s = e["steps_to_base_final"]
    return "not reached" if s is None else str(s)


BEGIN, END = "<!-- controlled-table:begin -->", "<!-- controlled-table:end -->"


def is_main_table(out: Path) -> bool:
    """Whether record file ``out`` is :data:`OUT`, the table whose block and plot keep their plain names."""
    return out.resolve() == OUT.resolve()


def plot_path(doc: Path, out: Path) -> Path:
    """Where record file ``out``'s curves go beside ``doc``: ``<doc>.png`` for :data:`OUT`, else
    ``<doc>_<out stem>.png``."""
    return doc.with_suffix(".png") if is_main_table(out) else doc.with_name(f"{doc.stem}_{out.stem}.png")


def markers(out: Path) -> tuple[str, str]:
    """The begin / end markers of record file ``out``'s block in the results page: :data:`BEGIN` /
    :data:`END` for :data:`OUT`, ``<!-- controlled-table:<stem>:begin -->`` / ``...:end -->`` for any
    other file (the 8B table, a table on another recipe), so summarising one file never replaces
    another's table."""
    if is_main_table(out):
        return BEGIN, END
    return f"<!-- controlled-table:{out.stem}:begin -->", f"<!-- controlled-table:{out.stem}:end -->"


def write_doc(path: Path, table: str, marks: tuple[str, str] = (BEGIN, END)) -> None:
    """Put ``table`` between the ``marks`` (begin, end) of ``path`` (the rest of the file is
    hand-written and kept); a file without them gets them appended."""
    begin, end = marks
    text = path.read_text() if path.is_file() else "# Results\n\n"
    block = f"{begin}\n{table}{end}"
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def markdown(summary: list[dict], out: Path = OUT, runs: dict | None = None, figure: str = "") -> str:
    """The table of :func:`summarize`, one section per task, headed by the command that regenerates
    it from record file ``out``; for a file other than :data:`OUT`, also the ``--set`` overrides its
    ``runs`` were recorded with (one line per task and distinct list); ``figure``: the curve plot's file
    name beside the page, linked under the header."""
    rel = out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out
    default = is_main_table(out)
    cmd = "python benchmarks/table/controlled_table.py --summary" + ("" if default else f" --out {rel}")
    lines = ["## The controlled table" if default else f"## The controlled table: `{rel}`", "",
             f"Generated by `{cmd}` from the committed records in "
             f"`{rel}`; do not edit between the markers. Protocol: the docstring of "
             "`benchmarks/table/controlled_table.py`. Intervals are 95 % Student-t over seeds; *paired* is the same-seed "
             "difference to the cell's base row (seeds above / below zero); *AUC* the mean validation accuracy along "
             "the run (step 0 = the SFT model); *reach* the first evaluated step where the seed-mean validation curve "
             "reaches the base's final accuracy (*not reached*: at no evaluated step).", ""]
    if figure:
        lines += [f"Curves: [{figure}]({figure}) (seed mean, band = range over seeds, a base and its credit arms a panel).", ""]
    if not default:
        for task, ov in sorted({(r.get("task", "?"), tuple(r.get("overrides", ()))) for r in (runs or {}).values()}):
            lines += [f"Overrides over the {task} base recipe: " + (" ".join(f"`{o}`" for o in ov) or "none") + ".", ""]
    for task in sorted({e["task"] for e in summary}):
        rows = [e for e in summary if e["task"] == task]
        extra = "cell_accuracy" if any("cell_accuracy" in e.get("val", {}) for e in rows) else "mean_reward"
        lines += [f"### {task}", "",
                  f"| cell | kind | seeds | val solved | val {extra} | Δ val vs SFT (paired) | paired Δ val vs base | "
                  f"test solved | paired Δ test vs base | AUC | reach | RL CPU s |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in rows:
            val, test = e.get("val", {}), e.get("test", {})
            lines.append(f"| {e['cell']} | {e['kind']} | {len(e['seeds'])} | {_ci(val.get('accuracy'))} | "
                         f"{_ci(val.get(extra))} | {format_differences(e.get('gain_over_sft_val'))} | "
                         f"{format_differences(e.get('paired_val'))} | {_ci(test.get('accuracy'))} | {format_differences(e.get('paired_test'))} | "
                         f"{e['val_auc']:.3f} | {_reach(e)} | {e['rl_cpu_seconds']:.0f} |")
        lines.append("")
        for e in rows:
            if e.get("rollout_mismatch"):
                lines += [f"{e['cell']}: rollout mismatch (mean |log commit_prob − log p_θ| at the commit state, nats, "
                          f"per run, then over {e['rollout_mismatch']['seeds']} seeds) {_ci(e['rollout_mismatch'])}", ""]
    return "\n".join(lines) + "\n"


def plot(data: dict, path: Path) -> None:
    """The curves of a record file: every cell's seed-mean validation curve with its seed range, a base and
    its credit arms together, at most 7 cells and the SFT level a panel (:func:`curve_figure`)."""
    curve_figure(data, path, "Validation curves: seed mean, band = range over seeds", cap=7)


def root_base(name: str) -> str:
    """The base a cell's chain of paired bases ends at (``dps+dispo@diffu_grpo_state`` -> ``diffu_grpo_state``)."""
    while CELLS.get(name, {}).get("base"):
        name = CELLS[name]["base"]
    return name


def curve_panels(cells: list[str], cap: int) -> list[list[str]]:
    """Cells grouped by :func:`root_base` (a base with its credit arms stays together), the groups packed in
    order into panels of at most ``cap`` curves (a group larger than ``cap`` is split)."""
    groups: dict[str, list[str]] = {}
    for c in sorted(cells, key=lambda c: list(CELLS).index(c) if c in CELLS else 99):
        groups.setdefault(root_base(c), []).append(c)
    panels: list[list[str]] = []
    for g in groups.values():
        for i in range(0, len(g), cap):
            part = g[i:i + cap]
            if panels and len(panels[-1]) + len(part) <= cap and not panels[-1][0] == part[0]:
                panels[-1] += part
            else:
                panels.append(list(part))
    return panels


def draw_panel(ax, title: str, cells: list[str], by: dict[str, list[dict]]) -> None:
    """One panel titled ``title``: each cell's seed-mean selection-split solved rate (%) against the RL step
    (``by[cell]``: its runs), the seed range shaded, the SFT model's level dotted, labelled axes, the legend
    under the panel (off the data)."""
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10").colors
    for i, name in enumerate(cells):
        rows = by[name]
        steps = sorted(set.intersection(*[{s for s, _ in r["val_curve"]} for r in rows]))
        per = [[dict((s, m["accuracy"]) for s, m in r["val_curve"])[s] for r in rows] for s in steps]
        ax.plot(steps, [100 * sum(v) / len(v) for v in per], color=colours[i % 10], marker="o", ms=3,
                linestyle="-" if CELLS.get(name, {}).get("kind") == "base" else "--", label=f"{name} ({len(rows)} seeds)")
        ax.fill_between(steps, [100 * min(v) for v in per], [100 * max(v) for v in per], color=colours[i % 10],
                        alpha=0.13, linewidth=0)
    sft = by[cells[0]][0]["val_curve"][0][1]["accuracy"]
    ax.axhline(100 * sft, color="grey", linestyle=":", linewidth=1.2, label=f"SFT model ({100 * sft:.1f} %)")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("RL step")
    ax.set_ylabel("solved rate on the selection split (%)")
    ax.grid(alpha=0.25)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=1, fontsize=8, frameon=False)


def panel_figure(panels: list[tuple[str, list[str], dict[str, list[dict]]]], path: Path, title: str,
                 per_row: int = 4) -> bool:
    """Draw ``panels`` (``(panel title, cells, {cell: runs})`` each, :func:`draw_panel`), ``per_row`` a row,
    under ``title``, to ``path``; False (nothing written) when there are none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not panels:
        return False
    ncol = min(per_row, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 5.4 * nrow), squeeze=False)
    for k, (name, cells, by) in enumerate(panels):
        draw_panel(axes[k // ncol][k % ncol], name, cells, by)
    for k in range(len(panels), nrow * ncol):
        axes[k // ncol][k % ncol].axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def curve_figure(data: dict, path: Path, title: str, cap: int, per_row: int = 4) -> None:
    """Every (task, cell) of ``data`` in panels of at most ``cap`` (≤ 8) curves (:func:`curve_panels`:
    a base with its credit arms), ``per_row`` panels a row, Sudoku first."""
    by: dict[str, dict[str, list[dict]]] = {}
    for r in data["runs"].values():
        by.setdefault(r["task"], {}).setdefault(r["cell"], []).append(r)
    panels = [(f"{task}: {' / '.join(dict.fromkeys(root_base(c) for c in cells))}", cells, by[task])
              for task in sorted(by, key=lambda t: (t != "sudoku", t)) for cells in curve_panels(list(by[task]), min(cap, 8))]
    panel_figure(panels, path, title, per_row)


def headline_panels(root: Path = OUT.parent) -> list[tuple[str, list[str], dict[str, list[dict]]]]:
    """The panels of :func:`headline_figure`: one per confirmation file (``root/confirm/<task>_<family>.json``;
    Sudoku first, then the order of :data:`GRID_FAMILIES`), its family's arms that have runs, with those
    runs: ``(title, arms, {arm: runs})``; a family has at most 3 arms, so a panel at most 3 curves."""
    def order(p: Path) -> tuple:
        task, _, family = p.stem.partition("_")
        return task != "sudoku", task, list(GRID_FAMILIES).index(family) if family in GRID_FAMILIES else 99

    panels = []
    for cpath in sorted((root / "confirm").glob("*.json"), key=order):
        task, _, family = cpath.stem.partition("_")
        by: dict[str, list[dict]] = {}
        for r in load_results(cpath)["runs"].values():
            by.setdefault(r["cell"], []).append(r)
        arms = [a for a in GRID_FAMILIES.get(family, {}).get("arms", sorted(by)) if a in by]
        if arms:
            seeds = sorted({len(by[a]) for a in arms})
            panels.append((f"{task}, {family} family ({'/'.join(map(str, seeds))} seeds)", arms, by))
    return panels


def headline_figure(path: Path, root: Path = OUT.parent, per_row: int = 4) -> bool:
    """The headline page's figure: the runs behind the verdicts (:func:`headline_panels`), each arm at its
    selected grid point, its seed-mean selection-split curve with the seed range. Returns False (no file
    written) when no confirmation run is recorded."""
    return panel_figure(headline_panels(root), path, "The runs behind the verdicts: each arm at its selected grid "
                                                     "point (confirmation seeds); seed mean, band = range over seeds",
                        per_row)
