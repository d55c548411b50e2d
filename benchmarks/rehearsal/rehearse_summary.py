"""One table of every 8B rehearsal record, generated from ``results/rehearse_8b/*_L<k>.json`` alone.

    python benchmarks/rehearsal/rehearse_summary.py            # rewrite the block in docs/scaling.md
    python benchmarks/rehearsal/rehearse_summary.py --print    # print it instead

The block sits between ``<!-- rehearsal:begin -->`` and ``<!-- rehearsal:end -->`` in docs/scaling.md;
``tests/test_standins.py`` checks that the committed page equals what this script makes of the committed
records. Columns (each record's own numbers, :mod:`rehearse_8b`):

* *recipe*: the shipped recipe, with its stand-in's blocks where they are not 1;
* *code*: the commit the record ran (``code.commit``; ``?`` for records made before it was stored), and the
  commit of its last recount (``recounted``: plan and count, and run_a where it says so), after a ``+``;
* *P*: the plan's prompt length; *2 proc.*: the plan's peak per process on 2 DDP processes against the
  larger rank's measured peak of steps 2-3 (worker ``VmHWM`` minus the interpreter), with the error; *1 proc.*: the
  same for the 1-process ``count``; *FLOPs*: the plan's against the counted ones of one step;
* *resume*: the 2-process resume from step 2 equal to the uninterrupted run at step 3, bit for bit;
* *export*: the merged ``model/``'s update against the adapter's ``scale · B A`` (median relative error)
  and its logits against the live policy's (max |Δ|); ``maskrl eval`` and lm-eval completions equal the
  live policy's; where the record has them, the reloaded bf16 weights bit for bit equal to the live
  policy's (*bits*) and the float32 completions of the export and the live policy equal (*float32*), which
  tell a wrong export from a flipped bf16 tie (``rehearse_plan.completion_faults``); where the record has it,
  the export in the base checkpoint's layout (*layout*: ``config.json``'s ``model_type``, ``architectures``,
  ``auto_map``, ``block_size``, mask id, and every tensor name and shape, ``rehearse_children.export_layout``);
* *checkpoint*: a checkpoint folder's weights + optimizer files, plan / written;
* *faults*: how many the record lists (0: none).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "results" / "rehearse_8b"
DOC = ROOT / "docs" / "scaling.md"
BEGIN, END = "<!-- rehearsal:begin -->", "<!-- rehearsal:end -->"


def records(folder: Path = RECORDS) -> list[dict]:
    """Every finished per-recipe record (``<recipe>_L<k>.json``; not the FSDP, depth-series or narrow ones,
    nor one still being written: the rehearsal adds ``plan_vs_measured`` last), by name."""
    out = []
    for f in sorted(folder.glob("*_L*.json")):
        if not re.fullmatch(r"[a-z0-9_]+_L\d+\.json", f.name) or "_fsdp_" in f.name:
            continue
        rec = json.loads(f.read_text())
        if rec.get("benchmark") == "rehearse_8b" and "plan_vs_measured" in rec:
            out.append(rec | {"_file": f.name})
    return out


def _pct(e) -> str:
    return "—" if e is None else f"{100 * e:+.1f} %"


def _cmp(d: dict | None) -> str:
    if not d:
        return "—"
    return f"{d['plan_gib']:.3f} / {d['measured_gib']:.3f} ({_pct(d.get('error'))})"


def row(rec: dict) -> str:
    """One table row of a record (module docstring)."""
    ph, pvm = rec["phases"], rec.get("plan_vs_measured", {})
    code = (rec.get("code") or {}).get("commit")
    code = code[:7] if code else "?"
    if rec.get("recounted"):
        again = rec["recounted"][-1]
        code += f" + {(again.get('by') or {}).get('commit', '?')[:7]}" + (" (run_a too)" if "run_a" in again.get("phases", []) else "")
    one = pvm.get("one_process_step")
    flops = "—" if not one else ("equal" if one.get("flops_equal") else f"{one['flops_plan']:.4g} / {one['flops_counted']:.4g}")
    resume = ph.get("resume_exact", {}).get("equal")
    c = ph.get("checks", {})
    ew, lg, cm = c.get("export_weights", {}), c.get("logits", {}), c.get("completions", {})
    export = "—" if not ew else (f"{ew['median_rel_error']:.2g}, logits Δ {lg.get('export_vs_live_max_abs', float('nan')):.2g}, "
                                 f"eval {'=' if cm.get('maskrl_eval_equal_live') else '≠'} / lm-eval "
                                 f"{'=' if cm.get('lm_eval_equal_live') else '≠'}"
                                 + ("" if "reloaded_weights" not in c else
                                    f", bits {'=' if c['reloaded_weights']['bit_equal'] else '≠'}, float32 "
                                    f"{'=' if cm.get('float32_equal') else '≠'}")
                                 + ("" if "export_layout" not in c else
                                    f", layout {'=' if c['export_layout']['config_equal'] and c['export_layout']['names_equal'] else '≠'}"))
    two = pvm.get("two_process_steps_2_3") or pvm.get("two_process_rank0_steps_2_3")  # the larger rank (older: rank 0)
    name = rec["recipe"] + ("" if rec.get("layers", 1) == 1 else f" ({rec['layers']} blocks)")
    return (f"| {name} | {code} | {ph.get('plan', {}).get('prompt_length', '—')} | "
            f"{_cmp(two)} | {_cmp(one)} | {flops} | {'—' if resume is None else ('yes' if resume else 'NO')} | "
            f"{export} | {_cmp(pvm.get('checkpoint_size'))} | {len(rec.get('faults', []))} |")


def table(recs: list[dict]) -> str:
    """The generated block (markers included)."""
    head = ("| recipe | code | P | 2 proc.: plan / measured GiB | 1 proc.: plan / measured GiB | FLOPs plan = counted | "
            "resume exact | export: update error, logits vs live, completions | checkpoint: plan / written GiB | faults |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    body = "\n".join(row(r) for r in recs)
    n_ok = sum(1 for r in recs if not r.get("faults"))
    note = (f"Generated by `python benchmarks/rehearsal/rehearse_summary.py` from the {len(recs)} records in "
            f"`results/rehearse_8b/`; {n_ok} of them list no fault. Do not edit between the markers.")
    return f"{BEGIN}\n{note}\n\n{head}\n{body}\n{END}"


def write_doc(doc: Path = DOC, recs: list[dict] | None = None) -> str:
    """Replace the block in ``doc`` (it must have the markers); returns the new text."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: no {BEGIN} ... {END} block to replace")
    new = text[:text.index(BEGIN)] + table(records() if recs is None else recs) + text[text.index(END) + len(END):]
    doc.write_text(new)
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--print", action="store_true", help="print the block instead of writing docs/scaling.md")
    args = ap.parse_args(argv)
    if args.print:
        print(table(records()))
    else:
        write_doc()
        print(f"wrote the rehearsal table into {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
