"""Peak resident memory of each phase of a rehearsal record's 1-process step, beside the plan's phases, with the CPU
kernel libraries' per-shape caches off (as every rehearsal process runs) or on (``--caches on``).

    python benchmarks/rehearsal/phase_peaks.py results/rehearse_8b/llada2_mini_gsm8k_diffu_grpo_L2.json
    python benchmarks/rehearsal/phase_peaks.py results/rehearse_8b/llada2_mini_gsm8k_diffu_grpo_L2.json --caches on

Runs the record's ``count`` phase again (``rehearse_8b.py --child count``, the record's recipe, overrides and prompt
length, the stand-in rebuilt in ``--work`` if it is gone) with ``--phase-peaks``: the second step's ``VmHWM`` reset
at the start of the rollout, the frozen θ_old / reference pass, each inner iteration's θ forwards and backwards
and each optimizer step (:func:`rehearse_memory.phase_peaks`), minus the process's memory before the model was
built. Prints JSON: those peaks, the plan's ``peak_by_phase_gib`` from the record, and the resident memory left
after the step. Writes nothing into the record. How the LLaDA2 records' 26-46 % plan gap was found
(docs/scaling.md, "LLaDA2.0-mini (MoE) recipes").
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from maskrl.records import expand  # noqa: E402

from rehearse_launch import KERNEL_CACHES_OFF, _env, _run_child, ensure_standin  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("record", help="a results/rehearse_8b/<recipe>_L<n>.json record")
    p.add_argument("--caches", choices=("off", "on"), default="off", help="oneDNN's and ideep's per-shape caches")
    p.add_argument("--work", default="/tmp/maskrl_rehearse")
    args = p.parse_args(argv)
    rec = json.loads(Path(args.record).read_text())
    standin = ensure_standin(Path(args.work), rec["family"], rec["layers"], rec.get("width_divisor", 1))
    ov = [f"model.path={standin}" if o.startswith("model.path=") else o for o in expand(rec["overrides"], args.work)]
    env = _env(2)
    if args.caches == "on":
        env = {k: v for k, v in env.items() if k not in KERNEL_CACHES_OFF}
    log = Path(args.work) / "phase_peaks_log.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    res = _run_child("count", ["--recipe", rec["recipe"], "--overrides-json", json.dumps(ov), "--prompt-length",
                               str(rec["phases"]["plan"]["prompt_length"]), "--phase-peaks"], log, env=env)
    out = {"record": args.record, "caches": args.caches, "measured": res.get("phase_peaks", res),
           "rss_after_step_gib": res.get("rss_after_step_gib"),
           "plan_peak_by_phase_gib": rec["phases"]["plan"]["peak_by_phase_gib"],
           "plan_static_gib": rec["phases"]["plan"]["static_gib"]}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
