"""Score every MBPP reference program and HumanEval canonical solution; report pass counts and
wall-clock seconds as JSON (reward integrity, issue 14: all must score 1.0).

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/references/code_reference.py --out runs/code_reference.json

Wall-clock seconds depend on machine load (other jobs sharing the CPUs); ``cpu_seconds`` (this
process plus every sandbox, user + system) depends on it much less. Compare runs made side by side.
"""
from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path


def _cpu() -> float:
    """User + system CPU seconds of this process and of its waited-for children (the sandboxes)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="parallel sandboxes")
    ap.add_argument("--timeout", type=float, default=None,
                    help="wall-clock seconds per program (default: Limits().timeout_s, the training default)")
    ap.add_argument("--out", default="", help="write the JSON report here too")
    args = ap.parse_args()
    from maskrl.sandbox import Limits
    from maskrl.tasks.code import HumanEval, MBPP

    limits = Limits() if args.timeout is None else Limits(timeout_s=args.timeout)

    report = {"timeout_s": limits.timeout_s, "workers": args.workers}
    for task, completion in ((MBPP(limits=limits, workers=args.workers), lambda e: MBPP.target(e)),
                             (HumanEval(limits=limits, workers=args.workers), lambda e: e.fields["canonical_solution"])):
        ex = task.load()
        cpu0, start = _cpu(), time.monotonic()
        rewards = task.score_examples(ex, [completion(e) for e in ex])
        seconds, cpu = time.monotonic() - start, _cpu() - cpu0
        failed = [e.fields["task_id"] for e, r in zip(ex, rewards) if r != 1.0]
        report[task.name] = {"rows": len(ex), "all_tests_pass": len(ex) - len(failed), "failed": failed,
                             "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2)}
    report["total_seconds"] = round(sum(v["seconds"] for v in report.values() if isinstance(v, dict)), 2)
    report["total_cpu_seconds"] = round(sum(v["cpu_seconds"] for v in report.values() if isinstance(v, dict)), 2)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
