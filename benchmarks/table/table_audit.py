"""What the headline page says about its own protocol, read from the records (``--verdicts``): the claims
whose arms were chosen again after their confirmation was read (a grid that grew), whether each verdict
row's pairs ran from one SFT checkpoint, what the intervals cover (the same final models on the selection
split), the record census and the test-file table. Pure functions over the records and the verdict rows
of :func:`table_verdicts.verdict_rows`."""
from __future__ import annotations

import json
from pathlib import Path

from ablation_runs import CONFIRM_SEED, ROOT, SELECTION_SEED, load_results
from table_protocol import CONFIRM_SEEDS, OUT

#: the commit from which records carry the processor (``provenance.processor``,
#: :func:`ablation_runs.TaskSetup.provenance`); the census says how many committed records do
PROCESSOR_SINCE = "e6f315a"


def sft_hash(run: dict | None) -> str | None:
    """The SFT checkpoint's weights sha256 a record's provenance names (None: not recorded)."""
    return ((run or {}).get("provenance", {}).get("sft") or {}).get("sha256")


def _point(run: dict) -> str:
    """The grid point a confirmation run ran at, from its overrides (``lr=2e-05``, ``lr=0.0001,beta=0.04``)."""
    parts = [o.split("=", 1) for o in run.get("overrides", []) if o.startswith(("train.lr=", "objective.beta="))]
    return ",".join(f"{k.rsplit('.', 1)[1]}={v}" for k, v in parts)


def after_look(row: dict) -> dict | None:
    """For a confirmation row whose file holds superseded runs (its grid grew after the confirmation was
    read, and the arms whose best point moved ran again): ``{"family", "rerun": {cell: (old point, new
    point, runs)}, "touched", "before"}`` -- ``touched`` when the row's arm or base is among the re-run
    cells (its numbers were chosen after a look), ``before`` the row's per-seed differences with the
    superseded runs in place (None when not touched). None for any other row."""
    d = row.get("diff")
    if not d or d["split"] != "confirmation" or not d.get("superseded"):
        return None
    current = {r["cell"]: _point(r) for r in load_results(ROOT / d["source"])["runs"].values()
               if r.get("task") == row["task"]}
    rerun: dict[str, tuple] = {}
    for r in d["superseded"]:
        old, n = _point(r), rerun.get(r["cell"], (None, None, 0))[2]
        rerun[r["cell"]] = (old, current.get(r["cell"], "?"), n + 1)
    touched = row["cell"] in rerun or row["base"] in rerun
    before = None
    if touched:
        old = {(r["cell"], r["seed"]): r for r in d["superseded"]}
        before = []
        for s, (arm, base) in sorted(d["runs"].items()):
            a, b = old.get((arm["cell"], s), arm), old.get((base["cell"], s), base) if base else None
            if b is not None:
                before.append(a["confirmation"]["accuracy"] - b["confirmation"]["accuracy"])
    return {"family": Path(d["source"]).stem, "rerun": rerun, "touched": touched, "before": before}


def fresh_seeds(n: int = len(CONFIRM_SEEDS)) -> str:
    """The seeds a fresh confirmation would use: the ``n`` after the last confirmation seed (``20–29``)."""
    first = max(CONFIRM_SEEDS) + 1
    return f"{first}–{first + n - 1}"


def checkpoints(row: dict) -> dict | None:
    """The SFT checkpoints a row's pairs ran from: ``{"arm": [hashes], "base": [hashes], "shared"}``
    (``base`` empty for a row over the SFT model; ``shared`` None when a record names no hash)."""
    d = row.get("diff")
    if not d:
        return None
    arm = {sft_hash(a) for a, _ in d["runs"].values()}
    base = {sft_hash(b) for _, b in d["runs"].values() if b}
    both = arm | base
    return {"arm": sorted(map(str, arm)), "base": sorted(map(str, base)),
            "shared": None if None in both else len(both) == 1}


def checkpoint_note(rows: list[dict]) -> str:
    """The paragraph under the verdict table on rows whose pairs ran from two SFT checkpoints: per row which
    arm carries which weights hash, the settings key both checkpoints share, and the step-0 scores of every
    run of those rows per hash (identical or not, with the numbers); '' when every row shares one."""
    split = [(r, checkpoints(r)) for r in rows if r.get("diff")]
    split = [(r, c) for r, c in split if c["shared"] is False]
    if not split:
        return ""
    runs = [x for r, _ in split for pair in r["diff"]["runs"].values() for x in pair if x]
    by_hash: dict[str, set] = {}
    for x in runs:
        by_hash.setdefault(sft_hash(x), set()).add(json.dumps(x["val_curve"][0][1], sort_keys=True))
    keys = sorted({(x.get("provenance", {}).get("sft") or {}).get("settings_key") for x in runs}, key=str)
    count = {h: sum(sft_hash(x) == h for x in runs) for h in by_hash}
    parts = []
    for r, c in split:
        look = after_look(r)
        moved = [cell for cell in (r["cell"], r["base"]) if look and cell in look["rerun"]]
        parts.append(f"{r['claim']} ({r['task']}): {r['cell']} from `{'`, `'.join(h[:8] + '…' for h in c['arm'])}`, "
                     f"{r['base']} from `{'`, `'.join(h[:8] + '…' for h in c['base'])}`"
                     + (f" ({', '.join(moved)} re-run after its grid grew)" if moved else ""))
    same = len({s for v in by_hash.values() for s in v}) == 1
    step0 = json.loads(next(iter(next(iter(by_hash.values())))))
    scores = (f"{100 * step0['accuracy']:.1f} % solved" + "".join(
        f", {k.replace('_', ' ')} {v:.5f}" for k, v in step0.items() if k not in ("accuracy", "mean_reward")))
    return ("**Rows whose pairs ran from two SFT checkpoints** (*SFT* column: *two*). " + "; ".join(parts) + ". "
            + (f"Both are checkpoints of the same SFT settings (key `{keys[0]}`), rebuilt between the runs. "
               if len(keys) == 1 else f"Their SFT settings keys: {', '.join(map(str, keys))}. ")
            + ("Their step-0 scores on the selection split are identical: " + scores + " in every run, "
               + ", ".join(f"{n} under `{h[:8]}…`" for h, n in sorted(count.items())) + ". "
               if same else "Their step-0 scores on the selection split differ: "
               + "; ".join(f"`{h[:8]}…`: {', '.join(sorted(v))}" for h, v in sorted(by_hash.items())) + ". ")
            + "These rows pair their runs by seed (the same prompts and rollout seed), not by SFT weights: equal "
              "step-0 scores do not make the two weight files equal, so a part of these rows' differences may come "
              "from the checkpoints rather than the credit module.\n")


def selection_differences(row: dict) -> list[float] | None:
    """A confirmation row's per-seed differences of the same final models on the selection split (the
    300 rows every choice was made on; the SFT model there is each run's step 0); None for other rows."""
    d = row.get("diff")
    if not d or d["split"] != "confirmation":
        return None
    out = []
    for arm, base in (d["runs"][s] for s in d["seeds"]):
        out.append(arm["val"]["accuracy"] - (base["val"]["accuracy"] if base else arm["val_curve"][0][1]["accuracy"]))
    return out


def coverage_markdown(rows: list[dict], pts) -> str:
    """What the intervals cover: a statement that they cover seeds only, and per confirmation row the same
    final models' difference on the selection split beside the confirmation one, with whether the two 95 %
    intervals overlap ('' when no row has confirmation records). ``pts`` formats a solved-rate difference."""
    from maskrl.stats import t_interval

    lines, apart, size = [], 0, None
    for r in rows:
        sel = selection_differences(r)
        if sel is None:
            continue
        size = size or r["diff"]["runs"][r["diff"]["seeds"][0]][0].get("confirm_size")
        m, lo, hi = t_interval(sel)
        clo, chi = r["stat"]["ci95"]
        overlap = lo <= chi and clo <= hi
        apart += not overlap
        lines.append(f"| {r['claim']} | {r['task']} | {pts(r['stat']['mean'])} [{pts(clo)}, {pts(chi)}] | "
                     f"{pts(m)} [{pts(lo)}, {pts(hi)}] | {'yes' if overlap else '**no**'} |")
    if not lines:
        return ""
    return ("**What the intervals cover.** Each interval covers the seeds only: the rows are fixed (the "
            f"{size}-row confirmation split, "
            f"seed {CONFIRM_SEED}), so it says how far another set of RL seeds could move the difference on "
            "these rows, not on other rows of the task. The same final models scored on the selection split "
            f"(300 rows, seed {SELECTION_SEED}; the rows every choice was made on) give the differences below; "
            f"in {apart} of {len(lines)} rows the two 95 % intervals do not overlap, so which rows were drawn "
            "moves a difference by more than the seeds do.\n\n"
            "| claim | task | confirmation split, points [95 %] | selection split, same final models | "
            "intervals overlap |\n| --- | --- | --- | --- | --- |\n" + "\n".join(lines) + "\n")


def record_census(paths: list[Path]) -> dict:
    """Over the record files ``paths``: distinct runs (a run copied into two files counts once, a run retrained
    for the test file twice), runs with a provenance block, with a processor, test-file reads, confirmation
    reads (both counting the SFT model's: ``sft_confirmation`` once per file that scores it on the
    confirmation split, ``sft_test`` its test-file reads)."""
    seen, runs, superseded, sft_confirmation, sft_test = set(), [], 0, 0, 0
    for p in paths:
        data = load_results(p) if p.is_file() else {"runs": {}}
        superseded += len(data.get("superseded", []))
        sft_confirmation += len(data.get("sft_confirmation", {}))  # the SFT model scored beside a family's runs
        sft_test += sum(v.get("test_reads", 1) for v in data.get("sft_test", {}).values())
        for r in list(data["runs"].values()) + data.get("superseded", []):  # superseded runs read splits too
            # a run copied into two files (the third-round base rows) counts once; a run retrained to read
            # the test file (--test-final) has the same rewards as its confirmation twin but is another run
            ident = json.dumps([r.get(k) for k in ("task", "cell", "seed", "overrides", "grid_point", "rewards",
                                                   "scored_on")])
            if ident not in seen:
                seen.add(ident)
                runs.append(r)
    return {"runs": len(runs), "with_provenance": sum("provenance" in r for r in runs),
            "with_processor": sum("processor" in r.get("provenance", {}) for r in runs),
            "backfilled": sum(bool(r.get("provenance", {}).get("backfilled")) for r in runs),
            "sft_verified": sum(bool(sft_hash(r)) for r in runs),
            "test_reads": sum(r.get("test_reads", 1 if "test" in r else 0) for r in runs) + sft_test,
            "confirmation_reads": sum(r.get("confirmation_reads", 0) for r in runs) + sft_confirmation,
            "sft_confirmation": sft_confirmation, "sft_test": sft_test, "superseded": superseded}


def census_markdown(census: dict) -> str:
    """The census paragraph under the verdict table (``census`` from :func:`record_census`)."""
    proc = census.get("with_processor", 0)
    return (f"Records: {census['runs']} distinct runs, {census['with_provenance']} with a provenance block (SFT "
            f"weights' sha256, data file and sha256, splits, code commit, torch, CPU kernel set). "
            + (f"{proc} of them name the processor (records made from commit {PROCESSOR_SINCE} on carry it). "
               if proc else f"None names the processor: records carry `processor` from commit {PROCESSOR_SINCE} "
                            "on, and every committed one was made from earlier code. ")
            + f"{census.get('backfilled', 0)} of the blocks were filled in afterwards for runs made before records "
            f"carried one (`--backfill-provenance`: torch version and code commit unknown, the commit that first "
            f"recorded the run instead); {census.get('sft_verified', 0)} runs carry their SFT checkpoint's weights "
            f"hash, checked for the older ones by re-scoring the retrained checkpoint's step 0 exactly. "
            f"Test-file reads over all of them: **{census['test_reads']}**"
            + (f" (the SFT model's {census['sft_test']} among them, one per family whose base is claimed over it)"
               if census.get("sft_test") else "")
            + f". Confirmation-split reads: {census['confirmation_reads']} (one per final run"
            + (f"; {census['superseded']} of them by runs superseded when a grid grew" if census.get("superseded") else "")
            + (f"; the SFT model's {census['sft_confirmation']} among them, one per confirmation file"
               if census.get("sft_confirmation") else "") + ").")


def _pct(metrics: dict | None) -> str:
    """A record's solved rate in percent, one decimal; '–' when there is none."""
    return "–" if not metrics else f"{100 * metrics['accuracy']:.1f}"


def _machines(recorded: dict, retrained: dict) -> str:
    """Why two runs of one recipe and seed may differ in their last bits: their SFT checkpoints' weights
    when the hashes differ, and the processors their records name (' on another processor', ' on the same
    processor'), or that the older record names none."""
    was, now = (r.get("provenance", {}).get("processor") for r in (recorded, retrained))
    h0, h1 = sft_hash(recorded), sft_hash(retrained)
    weights = f"its SFT weights differ: `{h0[:8]}…` recorded, `{h1[:8]}…` retrained" if h0 and h1 and h0 != h1 else ""
    if not was:
        return f" ({weights + '; ' if weights else ''}its record names no processor)"
    return (" on another processor" if was != now else " on the same processor") + (f" ({weights})" if weights else "")


def test_markdown(root: Path = OUT.parent) -> str:
    """The test-file reads recorded under ``root/test`` (``--test-final``): per task, family and arm, the
    retrained seed's solved rate on the test file with its 95 % Wilson interval over the file's rows, its
    confirmation score and whether that reproduces the confirmation record; the SFT model's read (``sft_test``)
    first, beside its confirmation score."""
    from maskrl.stats import wilson_interval

    def row(task: str, family: str, arm: str, seed, test: dict, n: int, conf: dict | None, same: str) -> str:
        lo, hi = wilson_interval(round(test["accuracy"] * n), n)
        return (f"| {task} | {family} | {arm} | {seed} | {_pct(test)} [{100 * lo:.1f}, {100 * hi:.1f}] ({n} rows) | "
                f"{_pct(conf)} | {same} |")

    lines = []
    for path in sorted((root / "test").glob("*.json")):
        task, _, family = path.stem.partition("_")
        data, cpath = load_results(path), root / "confirm" / path.name
        cdata = load_results(cpath) if cpath.is_file() else {"runs": {}}
        recorded = cdata["runs"]
        for sft in data.get("sft_test", {}).values():  # the SFT model, read beside the family's arms
            lines.append(row(task, family, "SFT model", "–", sft, sft["rows"],
                             (cdata.get("sft_confirmation") or {}).get(task), "–"))
        for key, r in sorted(data["runs"].items()):
            same = "yes" if r.get("reproduces_confirmation") else "no" if key not in recorded else (
                f"no: {_pct(recorded[key].get('confirmation'))} recorded{_machines(recorded[key], r)}")
            lines.append(row(task, family, r["cell"], r["seed"], r["test"], r["provenance"]["splits"]["test"]["size"],
                             r["confirmation"], same))
    if not lines:
        return ""
    return ("### The test file (read once per headline cell)\n\nAfter every recipe was fixed, each arm's first "
            "confirmation seed retrained at its selected point and scored once on the test file "
            "(`--test-final`), and the SFT model once beside the family whose base is claimed over it; the "
            "verdicts above do not read it.\n\n| task | family | arm | seed | test solved, % "
            "[95 % Wilson] | confirmation solved, % | retrained model reproduces its confirmation record (bit for "
            "bit only on the same SFT weights, processor, software and thread count) |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(lines) + "\n")
