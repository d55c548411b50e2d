"""The headline page (``--verdicts``): for each headline claim the difference over seeds on the confirmation
split (else the selection records, marked) with its exact t-interval and family-wise interval, paired-t and
sign-flip p-values Holm-corrected over the family, and a verdict in words that say what was shown; the
figure, the readings, the README's results block and the page's inline verdict references; with the
protocol notes of :mod:`table_audit` and the appendix of :mod:`table_reproduce` -- all generated from the
committed records."""
from __future__ import annotations

import math
import re
from pathlib import Path

from ablation_runs import ROOT, load_results
from table_audit import (after_look, census_markdown, checkpoint_note, checkpoints, coverage_markdown, fresh_seeds,
                         record_census, test_markdown)
from table_pages import headline_figure
from table_reproduce import grid_markdown, reproduce_commands
from table_protocol import CONFIRM_SEEDS, OUT, R3, grid_path


#: the smallest gain worth the name (solved rate): the margin of the verdicts' interval tests
DELTA_MIN = 0.01
ALPHA = 0.05

#: the verdict words, each saying what the records showed (:func:`verdict`); the same words in the table,
#: the readings, the README block, its tallies and the figure's colours
GAIN = "gain shown"
SMALL_GAIN = "a gain below the 1-point margin"
NO_GAIN = "no gain of 1 point or more"
UNDECIDED = "undecided"
WITHIN = "within 1 point"
WORSE = "worse"
VERDICTS = {"superior": (GAIN, SMALL_GAIN, NO_GAIN, UNDECIDED), "noninferior": (WITHIN, WORSE, UNDECIDED)}
#: the mark beside a verdict whose arms were chosen again after their confirmation was read
AFTER_LOOK = "chosen after a look"


def _claim(claim: str, paper: str, task: str, cell: str, base: str, sources: list[Path], kind: str = "superior") -> dict:
    return {"claim": claim, "paper": paper, "task": task, "cell": cell, "base": base, "sources": sources, "kind": kind}


#: the headline comparisons, one family for Holm's correction; ``base`` "sft" pairs each run with its own
#: step 0; ``sources``: record files in order of preference (a confirmation file first, else the selection
#: records). The papers' numbers are at LLaDA-8B-Instruct (docs/spec.md §3-§4; Sudoku's are cell accuracy).
CLAIMS = [
    _claim("diffu-GRPO (state), the recipe that learns, improves its SFT model", "(the testbed: no paper claim)",
           "sudoku", "diffu_grpo_state", "sft", [grid_path("confirm", "sudoku", "state"), R3]),
    _claim("diffu-GRPO (state) improves its SFT model", "(the testbed: no paper claim)",
           "countdown", "diffu_grpo_state", "sft", [grid_path("confirm", "countdown", "state"), R3]),
    _claim("DiSPO improves diffu-GRPO", "Sudoku 14.1 → 31.4 (+17.3)", "sudoku", "dispo@diffu_grpo_state",
           "diffu_grpo_state", [grid_path("confirm", "sudoku", "state"), R3]),
    _claim("DiSPO improves diffu-GRPO", "Countdown 33.9 → 53.9 (+20.0)", "countdown", "dispo@diffu_grpo_state",
           "diffu_grpo_state", [grid_path("confirm", "countdown", "state"), R3]),
    _claim("DiSPO improves SPG", "improves (no number in docs/spec.md §4)", "sudoku", "dispo@spg", "spg",
           [grid_path("confirm", "sudoku", "spg"), R3]),
    _claim("DiSPO's branch credit alone (no step-term KL, no prompt masking) improves SPG", "(control of the row above)",
           "sudoku", "dispo-kl@spg", "spg", [grid_path("confirm", "sudoku", "spg")]),
    _claim("DTCA improves RLDF", "MATH500 +3.6 / +2.0 / +1.4 at 128 / 256 / 512", "sudoku", "dtca@rldf", "rldf",
           [grid_path("confirm", "sudoku", "rldf"), R3]),
    _claim("DPS improves diffu-GRPO (state)", "improves (no number in docs/spec.md §2.1)", "sudoku", "dps@diffu_grpo_state",
           "diffu_grpo_state", [grid_path("confirm", "sudoku", "state"), R3]),
    _claim("DPS improves diffu-GRPO (state)", "improves (no number in docs/spec.md §2.1)", "countdown", "dps@diffu_grpo_state",
           "diffu_grpo_state", [grid_path("confirm", "countdown", "state"), R3]),
    _claim("SML improves wd1", "improves (no number in docs/spec.md §2.2)", "sudoku", "sml@wd1", "wd1",
           [grid_path("confirm", "sudoku", "wd1"), OUT]),
    _claim("SML improves wd1", "improves (no number in docs/spec.md §2.2)", "countdown", "sml@wd1", "wd1",
           [grid_path("confirm", "countdown", "wd1"), OUT]),
    _claim("DPS improves wd1", "improves (no number in docs/spec.md §2.1)", "sudoku", "dps@wd1", "wd1",
           [grid_path("confirm", "sudoku", "wd1"), OUT]),
    _claim("DPS improves wd1", "improves (no number in docs/spec.md §2.1)", "countdown", "dps@wd1", "wd1",
           [grid_path("confirm", "countdown", "wd1")]),
    _claim("SML improves diffu-GRPO (mean-field)", "improves (no number in docs/spec.md §2.2)", "sudoku", "sml@diffu_grpo",
           "diffu_grpo_mf", [grid_path("confirm", "sudoku", "mf"), OUT]),
    _claim("RL on dual-KV-cached rollouts learns as on exact ones (4 blocks)", "(reported unstable at 8B)", "sudoku",
           "diffu_grpo_state@4blocks+dual", "diffu_grpo_state@4blocks", [grid_path("confirm", "sudoku", "cache"), OUT],
           kind="noninferior"),
]


def claim_differences(claim: dict, need: int = len(CONFIRM_SEEDS)) -> dict | None:
    """The per-seed paired differences (solved rate) of ``claim`` from its first record file holding both
    arms on shared seeds: ``{"d", "seeds", "split", "source", "pending", "runs", "superseded"}``
    (``runs``: seed -> (the arm's record, the base's or None for the SFT model); ``superseded``: the
    confirmation file's runs replaced when its grid grew); ``split`` is ``confirmation``
    (final models scored once on it) or ``selection`` (the split the recipes were chosen on). A confirmation
    file is read only once it holds ``need`` paired seeds (the confirmation is complete): before that the
    claim reads the next file and ``pending`` says how many confirmation seeds are recorded (``{"seeds",
    "need", "source"}``, else None), so a half-run confirmation never stands in for the finished one.
    None when no file has them."""
    pending = None
    for path in claim["sources"]:
        if not path.is_file():
            continue
        data = load_results(path)
        confirm = path.parent.name == "confirm"
        split = "confirmation" if confirm else "selection"
        rows: dict[str, dict[int, dict]] = {}
        for r in data["runs"].values():
            if r.get("task") == claim["task"] and "grid_point" not in r:
                rows.setdefault(r["cell"], {})[r["seed"]] = r
        arm = rows.get(claim["cell"], {})
        base = rows.get(claim["base"], {})
        if claim["base"] == "sft":
            sft = (data.get("sft_confirmation") or {}).get(claim["task"], {}).get("accuracy") if confirm else None
            pairs = {s: (r["confirmation"]["accuracy"], sft) if confirm else (r["val"]["accuracy"], r["val_curve"][0][1]["accuracy"])
                     for s, r in arm.items() if not confirm or ("confirmation" in r and sft is not None)}
        else:
            key = "confirmation" if confirm else "val"
            pairs = {s: (arm[s][key]["accuracy"], base[s][key]["accuracy"]) for s in arm
                     if s in base and key in arm[s] and key in base[s]}
        rel = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        if confirm and len(pairs) < need:
            # the SFT model's confirmation score is written when the confirmation ends: count the arm's runs
            done = len(pairs) if claim["base"] != "sft" else sum("confirmation" in r for r in arm.values())
            pending = pending or ({"seeds": done, "need": need, "source": str(rel)} if done else None)
            continue
        if len(pairs) >= 2:
            seeds = sorted(pairs)
            return {"d": [pairs[s][0] - pairs[s][1] for s in seeds], "seeds": seeds, "split": split, "source": str(rel),
                    "pending": pending, "runs": {s: (arm[s], base.get(s)) for s in seeds},
                    "superseded": data.get("superseded", []) if confirm else []}
    return None


def familywise_interval(d: list[float], m: int, alpha: float = ALPHA) -> list[float]:
    """The Bonferroni family-wise interval of the mean of ``d`` over a family of ``m`` comparisons:
    ``mean ± t_{1 − alpha/(2m), n−1}·sd/√n`` (:func:`maskrl.stats.t_interval` at level ``1 − alpha/m``), so
    that all ``m`` intervals hold together with probability at least ``1 − alpha``.

    Raises:
        ValueError: as :func:`maskrl.stats.t_interval`, or ``m < 1``.
    """
    from maskrl.stats import t_interval

    if m < 1:
        raise ValueError(f"familywise_interval needs a family of m >= 1 comparisons, got {m}")
    _, lo, hi = t_interval(d, 1 - alpha / m)
    return [lo, hi]


def verdict(stat: dict, kind: str, p_t_holm: float, p_flip_holm: float) -> str:
    """The verdict of one comparison (the rule the page states), in words that say what was shown.

    ``stat`` carries ``mean`` and ``ci_fw``, the family-wise interval (:func:`familywise_interval`).
    ``superior``: :data:`SMALL_GAIN` when the family-wise interval lies inside (0, +:data:`DELTA_MIN`);
    else :data:`GAIN` when the mean is positive and both Holm-corrected p-values (paired t, exact
    sign-flip) are below :data:`ALPHA`; else :data:`NO_GAIN` when the family-wise interval's upper end is
    below +:data:`DELTA_MIN`; else :data:`UNDECIDED`. ``noninferior``: :data:`WITHIN` when the family-wise
    interval's lower end is above −:data:`DELTA_MIN`; :data:`WORSE` when the mean is negative and both
    corrected p-values are below :data:`ALPHA`; else :data:`UNDECIDED`.
    """
    lo, hi = stat["ci_fw"]
    significant = p_t_holm < ALPHA and p_flip_holm < ALPHA
    if kind == "superior":
        if 0 < lo and hi < DELTA_MIN:
            return SMALL_GAIN
        if stat["mean"] > 0 and significant:
            return GAIN
        return NO_GAIN if hi < DELTA_MIN else UNDECIDED
    if lo > -DELTA_MIN:
        return WITHIN
    return WORSE if stat["mean"] < 0 and significant else UNDECIDED


def verdict_rows(claims: list[dict] = CLAIMS) -> list[dict]:
    """Every claim with its statistics (:func:`maskrl.stats.seed_comparison` and the family-wise interval
    ``ci_fw`` over the claims that have records), Holm-corrected p-values over that family, its verdict,
    and ``after_look`` (:func:`table_audit.after_look`: a grid that grew after the confirmation was read)."""
    from maskrl.stats import holm, seed_comparison

    rows = []
    for c in claims:
        diff = claim_differences(c)
        rows.append({**c, "sources": [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in c["sources"]],
                     "diff": diff,
                     "stat": seed_comparison(diff["d"]) if diff else None})
    have = [r for r in rows if r["stat"]]
    for key in ("p_t", "p_signflip"):
        for r, adj in zip(have, holm([r["stat"][key] for r in have])):
            r[f"{key}_holm"] = adj
    for r in have:
        r["stat"]["ci_fw"] = familywise_interval(r["diff"]["d"], len(have))
        r["verdict"] = verdict(r["stat"], r["kind"], r["p_t_holm"], r["p_signflip_holm"])
        r["after_look"] = after_look(r)
    return rows


def _verdict_text(r: dict) -> str:
    """A row's verdict with the mark of a choice made after its confirmation was read."""
    look = r.get("after_look")
    return r["verdict"] + (f" ({AFTER_LOOK})" if look and look["touched"] else "")


def _where(r: dict) -> str:
    """A verdict row's "split, seeds" cell: ``confirmation, 10``, or ``selection, 5`` with the confirmation
    seeds recorded so far when that run is under way (``selection, 5; confirmation 2 of 10 recorded``)."""
    d = r["diff"]
    pend = d.get("pending")
    return f"{d['split']}, {r['stat']['n']}" + (f"; confirmation {pend['seeds']} of {pend['need']} recorded" if pend else "")


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _p(x: float) -> str:
    return "–" if x is None or math.isnan(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


VERDICT_COLOURS = {GAIN: "tab:green", SMALL_GAIN: "tab:blue", NO_GAIN: "tab:red", UNDECIDED: "tab:orange",
                   WITHIN: "tab:green", WORSE: "tab:red"}


def verdict_figure(rows: list[dict], path: Path) -> bool:
    """The verdict table as one picture (``rows`` from :func:`verdict_rows`): a line per claim with records,
    its per-seed paired differences (solved rate, points; grey dots), their mean and exact 95 % t-interval
    (thick) inside the family-wise interval the verdict reads (thin), coloured by the verdict (a legend of
    the verdict words), zero and the ±:data:`DELTA_MIN` lines, and the split and seeds it read. Returns
    False (no file written) when no claim has records."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    have = [r for r in rows if r["stat"]]
    if not have:
        return False
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(have) + 1.6))
    for y, r in enumerate(reversed(have)):
        st, d = r["stat"], r["diff"]
        ax.scatter([100 * x for x in d["d"]], [y] * len(d["d"]), s=12, color="0.55", alpha=0.7, zorder=2)
        colour = VERDICT_COLOURS[r["verdict"]]
        ax.plot([100 * st["ci_fw"][0], 100 * st["ci_fw"][1]], [y, y], color=colour, linewidth=1, zorder=3)
        ax.plot([100 * st["ci95"][0], 100 * st["ci95"][1]], [y, y], color=colour, linewidth=3, zorder=3)
        ax.scatter([100 * st["mean"]], [y], s=55, marker="D", color=colour, zorder=4)
        ax.annotate(f"{_verdict_text(r)}; {_where(r)}", (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=8)
    ax.set_yticks(range(len(have)))
    ax.set_yticklabels([textwrap.fill(f"{r['claim']} ({r['task']})", 58) for r in reversed(have)], fontsize=8)
    ax.axvline(0, color="black", linewidth=1)
    ax.axvline(100 * DELTA_MIN, color="grey", linestyle="--", linewidth=1, label=f"±{100 * DELTA_MIN:.0f} point")
    ax.axvline(-100 * DELTA_MIN, color="grey", linestyle="--", linewidth=1)
    for word in dict.fromkeys(r["verdict"] for r in have):
        ax.plot([], [], color=VERDICT_COLOURS[word], linewidth=3, label=word)
    ax.set_xlabel("difference in solved rate, points (dots: seeds; diamond: mean; thick bar: exact 95 % t-interval; "
                  "thin bar: family-wise interval)")
    ax.set_title("Verdicts: each claim's difference over seeds, coloured by its verdict", fontsize=10)
    ax.grid(axis="x", alpha=0.25)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def _sft_cell(r: dict) -> str:
    """A row's *SFT* cell: ``one`` when every pair ran from one SFT checkpoint, ``two`` when not, ``?`` when
    a record names no hash (:func:`table_audit.checkpoints`)."""
    c = checkpoints(r)
    return "?" if c["shared"] is None else ("one" if c["shared"] else "**two**")


def _interval(st: dict, key: str) -> str:
    return f"[{_pts(st[key][0])}, {_pts(st[key][1])}]"


def look_note(r: dict) -> str:
    """A row's account of a grid that grew after its confirmation was read ('' when none did): which arms
    re-ran at which point, the row's numbers before (when it was touched), and what would confirm it."""
    from maskrl.stats import t_interval

    look = r.get("after_look")
    if not look:
        return ""
    moved = "; ".join(f"{cell} re-ran at {new} (was {old}, {n} superseded runs)" for cell, (old, new, n) in look["rerun"].items())
    text = f" The `{look['family']}` grid grew after this confirmation was read: {moved}."
    if not look["touched"]:
        return text + " This row's arms kept their points: its numbers are the ones read before the look."
    m, lo, hi = t_interval(look["before"])
    return (text + f" Before, this row read {_pts(m)} [{_pts(lo)}, {_pts(hi)}] on the same seeds. Its verdict "
            f"is *{AFTER_LOOK}*: no fresh confirmation has been run; seeds {fresh_seeds()} (no choice saw them), "
            "better on a new confirmation split (rows no choice saw), would confirm it.")


def verdict_markdown(rows: list[dict], census: dict, figure: str, forest: str = "") -> str:
    """The headline block: the verdict table, the rule, what the intervals cover, the rows chosen after a
    look and those paired across two SFT checkpoints, the figures' links (``forest``: the verdicts as a
    picture, :func:`verdict_figure`; ``figure``: the curves of the runs behind them,
    :func:`table_pages.headline_figure`; '' for none), the census and the generated readings."""
    have = [r for r in rows if r["stat"]]
    looked = [r for r in have if r.get("after_look") and r["after_look"]["touched"]]
    families = sorted({r["after_look"]["family"] for r in have if r.get("after_look")})
    lines = ["## Verdicts", "",
             "Generated by `python benchmarks/table/controlled_table.py --verdicts` from the committed records; do not edit "
             "between the markers. Tiny model (4 layers, 128 wide), CPU, the recipe that learns (lr warm-up 10, no "
             "prompt masking in the base likelihood, 8 prompts × 6, 65 steps) unless the source is the first table "
             "(`results/controlled_table.json`: lr 1e-4, 16 prompts × 6, 30 steps). *Ours*: the difference in "
             "solved rate, points, per seed: the arm's run minus its base's run of the same seed (paired: same "
             "prompts, same rollout seed), or, in the two rows over the SFT model, each seed's final model minus "
             "the SFT model's one score on the same split (the SFT model has no seed); mean, exact 95 % t-interval "
             f"and the family-wise interval (Bonferroni over the {len(have)} comparisons: t quantile at "
             f"1 − {ALPHA}/(2·{len(have)})) over seeds, seeds above / below zero. *p*: two-sided paired t-test and "
             f"exact sign-flip permutation test over seeds, each Holm-corrected over the {len(have)} comparisons. "
             f"*Verdict*: **{SMALL_GAIN}** when the family-wise interval lies inside (0, +{100 * DELTA_MIN:.0f}); "
             f"else **{GAIN}** when the mean is positive and both corrected p are below {ALPHA}; else "
             f"**{NO_GAIN}** when the family-wise interval's upper end is below +{100 * DELTA_MIN:.0f}; else "
             f"**{UNDECIDED}**. The cache row asks the other way: **{WITHIN}** when the family-wise interval's lower "
             f"end is above −{100 * DELTA_MIN:.0f}, **{WORSE}** when the mean is negative and both corrected p are "
             f"below {ALPHA}, else **{UNDECIDED}**. *{AFTER_LOOK}*: the row's arms were chosen again after its "
             "confirmation was read (below). The papers' numbers are LLaDA-8B-Instruct's (Sudoku: cell accuracy), "
             "so only the direction is compared. *Split*: `confirmation` = final models scored once on the "
             "confirmation split, rows no choice saw"
             + (f" (except in the {', '.join(f'`{f}`' for f in families)} families, whose grids grew after their "
                "confirmation was read)" if families else "")
             + "; `selection` = the 300 rows every recipe was chosen on, so its p-values are optimistic. *SFT*: "
             "whether every pair of the row ran from one SFT checkpoint (its weights' sha256 in the records).", "",
             "| claim | task | paper (LLaDA-8B) | ours: Δ solved, points, 95 % {family-wise} | p (t / sign-flip), Holm "
             "| verdict | split, seeds | SFT |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if not r["stat"]:
            lines.append(f"| {r['claim']} | {r['task']} | {r['paper']} | not run yet | – | – | – | – |")
            continue
        st = r["stat"]
        lines.append(f"| {r['claim']} | {r['task']} | {r['paper']} | {_pts(st['mean'])} {_interval(st, 'ci95')} "
                     f"{{{_interval(st, 'ci_fw')}}} ({st['positive']}+/{st['negative']}−) | {_p(r['p_t_holm'])} / "
                     f"{_p(r['p_signflip_holm'])} | **{_verdict_text(r)}** | {_where(r)} | {_sft_cell(r)} |")
    lines.append("")
    cover = coverage_markdown(rows, _pts)
    if cover:
        lines += [cover]
    if looked:
        lines += [f"**Chosen after a look.** {len(looked)} rows' arms were chosen again after their confirmation "
                  "was read: " + "; ".join(f"{r['claim']} ({r['task']})" for r in looked) + ". Each reading below "
                  "says what changed and what would confirm it.", ""]
    note = checkpoint_note(rows)
    if note:
        lines += [note]
    if forest:
        lines += [f"![The verdicts: per-seed differences, mean, 95 % and family-wise intervals, by verdict]({forest})", ""]
    if figure:
        lines += [f"![The runs behind the verdicts: selection-split curves of each arm at its selected point, seed "
                  f"mean with the seed range]({figure})", ""]
    lines += [census_markdown(census), "", "Readings (generated):", ""]
    for r in rows:
        if not r["stat"]:
            lines.append(f"- {r['claim']} ({r['task']}): no records yet (`{r['sources'][0]}`).")
            continue
        st, d = r["stat"], r["diff"]
        floor = 2 / 2 ** st["n"]
        c = checkpoints(r)
        sft = "" if c["shared"] is not False else (
            f" Its pairs ran from two SFT checkpoints ({r['cell']}: {', '.join(h[:8] + '…' for h in c['arm'])}; "
            f"{r['base']}: {', '.join(h[:8] + '…' for h in c['base'])}).")
        lines.append(
            f"- {r['claim']} ({r['task']}, `{d['source']}`, {d['split']} split, seeds {d['seeds'][0]}–{d['seeds'][-1]}): "
            f"{100 * st['mean']:+.2f} points [{100 * st['ci95'][0]:+.2f}, {100 * st['ci95'][1]:+.2f}] (family-wise "
            f"[{100 * st['ci_fw'][0]:+.2f}, {100 * st['ci_fw'][1]:+.2f}]), {st['positive']} of {st['n']} "
            f"seeds above, {st['negative']} below; d_z {st['d_z']:.2f} [{st['d_z_ci95'][0]:.2f}, {st['d_z_ci95'][1]:.2f}]. "
            f"Paired t p {_p(st['p_t'])} (Holm {_p(r['p_t_holm'])}); sign-flip p {_p(st['p_signflip'])} (Holm "
            f"{_p(r['p_signflip_holm'])}; its floor at {st['n']} seeds is {floor:.4f}); Wilcoxon p {_p(st['p_wilcoxon'])}. "
            f"**{_verdict_text(r)[0].upper() + _verdict_text(r)[1:]}.**" + look_note(r) + sft + (
                f" Its confirmation is under way ({d['pending']['seeds']} of {d['pending']['need']} seeds in "
                f"`{d['pending']['source']}`) and is read once complete." if d.get("pending") else ""))
    return "\n".join(lines) + "\n"


VERDICT_MARKS = ("<!-- verdicts:begin -->", "<!-- verdicts:end -->")
README = ROOT / "README.md"
README_MARKS = ("<!-- results:begin -->", "<!-- results:end -->")


#: the verdict table's rows the README shows, as (task, cell): the testbed and one row per seed method
README_ROWS = [("sudoku", "diffu_grpo_state"), ("countdown", "diffu_grpo_state"), ("sudoku", "dispo@diffu_grpo_state"),
               ("sudoku", "dispo@spg"), ("sudoku", "dtca@rldf"), ("countdown", "dps@diffu_grpo_state"),
               ("sudoku", "sml@wd1")]


def readme_markdown(rows: list[dict]) -> str:
    """The README's results block: :data:`README_ROWS` of the verdict table (``rows`` from
    :func:`verdict_rows`) and a generated count of the verdicts over every credit-module claim (the rows
    whose base is not the SFT model, less the cached-rollout row), with the confirmation-split rows' numbers.

    Raises:
        KeyError: a :data:`README_ROWS` entry that names no claim.
    """
    by = {(r["task"], r["cell"]): r for r in rows}
    lines = [f"Top rows of the verdict table in [docs/results.md](docs/results.md) (generated by `python "
             f"benchmarks/table/controlled_table.py --verdicts`; tiny model, Δ solved rate in points (paired by seed; the "
             f"SFT rows: each seed's final model minus the SFT model's one score), exact 95 % "
             f"t-intervals, Holm over {sum(1 for r in rows if r['stat'])} comparisons):", "",
             "| claim | task | ours | verdict | split, seeds |", "| --- | --- | --- | --- | --- |"]
    for key in README_ROWS:
        r, st = by[key], by[key]["stat"]
        ours = f"{_pts(st['mean'])} [{_pts(st['ci95'][0])}, {_pts(st['ci95'][1])}]".replace("-", "−") if st else "not run yet"
        where = _where(r) if st else "–"
        lines.append(f"| {r['claim']} | {r['task'].capitalize()} | {ours} | {_verdict_text(r) if st else '–'} | {where} |")
    credit = [r for r in rows if r["stat"] and r["base"] != "sft" and r["kind"] == "superior"]
    count = {v: [r for r in credit if r["verdict"] == v] for v in VERDICTS["superior"]}
    looked = [r for r in credit if r.get("after_look") and r["after_look"]["touched"]]
    text = (f"Of the {len(credit)} credit-module comparisons with records, "
            + "; ".join(f"{v}: {len(count[v])}" for v in VERDICTS["superior"]) + "."
            + (f" {len(looked)} of them were {AFTER_LOOK} (their grid grew after the confirmation was read)."
               if looked else ""))
    conf = [r for r in credit if r["diff"]["split"] == "confirmation"]
    if conf:
        text += " On the confirmation split: " + "; ".join(
            f"{r['claim']} ({r['task']}) {_pts(r['stat']['mean'])} ({r['stat']['positive']} of {r['stat']['n']} seeds "
            f"above; Holm p {_p(r['p_t_holm'])} paired t, {_p(r['p_signflip_holm'])} sign-flip; {_verdict_text(r)})"
            for r in conf) + "."
    pending = [r for r in rows if r["stat"] and r["diff"]["split"] == "selection"]
    if pending:
        part = sum(1 for r in pending if r["diff"].get("pending"))
        text += (f" {len(pending)} rows still read the selection split (their confirmation runs are not complete"
                 + (f"; {part} of them under way" if part else "") + "), so their p-values are optimistic.")
    return "\n".join(lines + ["", text]) + "\n"


REF = re.compile(r"<!-- verdict:(?P<task>[a-z0-9_]+)/(?P<cell>[^ ]+) -->.*?<!-- /verdict -->", re.S)


def fill_references(text: str, rows: list[dict]) -> str:
    """Rewrite every inline verdict reference of ``text``, ``<!-- verdict:TASK/CELL -->…<!-- /verdict -->``,
    with that verdict row's current words and numbers, so prose elsewhere on the page cites the table as it is.

    Raises:
        SystemExit: a reference naming no claim with records.
    """
    by = {(r["task"], r["cell"]): r for r in rows if r["stat"]}

    def one(m: re.Match) -> str:
        r = by.get((m["task"], m["cell"]))
        if r is None:
            raise SystemExit(f"error: verdict reference {m['task']}/{m['cell']} names no claim with records")
        st = r["stat"]
        return (f"<!-- verdict:{m['task']}/{m['cell']} -->**{_verdict_text(r)}**, {_pts(st['mean'])} "
                f"{_interval(st, 'ci95')} ({r['diff']['split']} split, {st['n']} seeds)<!-- /verdict -->")

    return REF.sub(one, text)


def _replace_block(text: str, marks: tuple[str, str], block: str, where: str) -> str:
    begin, end = marks
    if begin not in text or end not in text:
        raise SystemExit(f"error: {where} has no {begin} ... {end} block to regenerate")
    return text[:text.index(begin)] + f"{begin}\n{block}{end}" + text[text.index(end) + len(end):]


def write_verdicts(doc: Path, readme: Path | None = README) -> list[dict]:
    """``--verdicts``: regenerate the verdict block at the top of ``doc`` and its figure
    (``<doc stem>_headline.png``) from the committed records, and the results block of ``readme`` (None:
    leave it); returns the rows.

    Raises:
        SystemExit: ``readme`` without its :data:`README_MARKS` block.
    """
    rows = verdict_rows()
    figure, forest = doc.with_name(f"{doc.stem}_headline.png"), doc.with_name(f"{doc.stem}_verdicts.png")
    drawn = {p.name for p, ok in ((figure, headline_figure(figure, OUT.parent)), (forest, verdict_figure(rows, forest)))
             if ok}
    paths = sorted({Path(p) for c in CLAIMS for p in c["sources"]} | {OUT, R3}
                   | set((OUT.parent / "testbed_search").glob("*.json")) | set((OUT.parent / "grid").glob("*.json"))
                   | set((OUT.parent / "test").glob("*.json")))
    grid, test = grid_markdown(), test_markdown()
    block = verdict_markdown(rows, record_census(paths), figure.name if figure.name in drawn else "",
                             forest.name if forest.name in drawn else "") + ("\n" + test if test else "") + (
        "\n" + grid if grid else "") + (
        "\n### Reproduce\n\nGenerated from the records (each command resumes: recorded runs are skipped, a run "
        "recorded with other settings stops it). Runs are bit-reproducible on the same machine, software, thread "
        "count and CPU kernel set.\n\n" + reproduce_commands())
    begin, end = VERDICT_MARKS
    text = doc.read_text() if doc.is_file() else "# Results\n"
    if begin not in text:  # the block opens the page, under its title
        head, _, rest = text.partition("\n")
        text = f"{head}\n\n{begin}\n{end}\n{rest}"
    doc.write_text(fill_references(_replace_block(text, VERDICT_MARKS, block, str(doc)), rows))
    print(f"[table] wrote the verdicts of {doc} and {', '.join(sorted(drawn))}", flush=True)
    if readme is not None:
        readme.write_text(_replace_block(readme.read_text(), README_MARKS, readme_markdown(rows), str(readme)))
        print(f"[table] wrote the results block of {readme}", flush=True)
    return rows
