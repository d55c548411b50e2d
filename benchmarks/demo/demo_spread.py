"""How far the demo's numbers move across CPU kernel sets and RL seeds (issue 20 item 5).

One record per run in ``results/demo_spread/<name>.json`` (committed): kernel set (what
``torch.backends.cpu.get_cpu_capability()`` reports under ``ATEN_CPU_CAPABILITY``), torch version,
thread count, CPU model, RL seed (``train.seed``), base and final accuracy with 95 % intervals, the
paired gain with its interval and the exact McNemar p, wall time, the SHA-256 of the SFT weights
(the SFT runs under each kernel set too) and the per-step rollout reward (to see where two runs part).

    # run the demo for a missing record (skipped when the record exists), e.g. AVX2 kernels, seed 0:
    python benchmarks/demo/demo_spread.py --name avx2_s0 --capability avx2 --seed 0
    # a record from a demo folder run by other means (its env.json: capability, threads, torch):
    python benchmarks/demo/demo_spread.py --name native_s0 --from-run runs/demo_spread/native_s0
    # the table of all records (printed and written to results/demo_spread/summary.md):
    python benchmarks/demo/demo_spread.py --summary

A run still in progress gives a record with ``"status": "partial"`` (SFT hash, base accuracy from the
log, the steps done so far); a later ``--from-run`` replaces it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from maskrl import records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "results" / "demo_spread"
RUNS = ROOT / "runs" / "demo_spread"
CAPABILITIES = ("native", "avx2", "avx512", "default")
PROBE = ("import json, torch; print(json.dumps({'capability': torch.backends.cpu.get_cpu_capability(), "
         "'threads': torch.get_num_threads(), 'torch': torch.__version__}))")


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def child_env(capability: str, threads: int | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability != "native":
        env["ATEN_CPU_CAPABILITY"] = capability
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_demo(name: str, capability: str, seed: int, threads: int | None, config: str) -> Path:
    """Run ``maskrl demo`` into ``runs/demo_spread/<name>/out`` under the kernel set; returns the run folder."""
    run = RUNS / name
    run.mkdir(parents=True, exist_ok=True)
    env = child_env(capability, threads)
    probe = json.loads(subprocess.run([sys.executable, "-c", PROBE], env=env, check=True, capture_output=True,
                                      text=True).stdout)
    want = None if capability == "native" else capability.upper()
    if want and probe["capability"] != want:
        raise SystemExit(f"ATEN_CPU_CAPABILITY={capability} did not take effect: torch reports {probe['capability']}")
    (run / "env.json").write_text(json.dumps(probe))
    cmd = [sys.executable, "-m", "maskrl.cli", "demo", "--config", config, "--set", f"output_dir={run / 'out'}",
           "--set", f"train.seed={seed}"]
    (run / "start").write_text(f"{int(time.time())}\n")
    with open(run / "log.txt", "w", encoding="utf-8") as log:
        rc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    (run / "rc").write_text(f"{rc}\n")
    (run / "end").write_text(f"{int(time.time())}\n")
    if rc != 0:
        raise SystemExit(f"demo failed (rc {rc}); see {run / 'log.txt'}")
    return run


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def record_from_run(name: str, run: Path) -> dict:
    """The record of demo folder ``run`` (``env.json``, ``log.txt``, ``out/``); partial while it runs."""
    env = json.loads((run / "env.json").read_text())
    out = run / "out"
    sft = sorted((out / "sft-cache").glob("*/model.safetensors"))
    rec = {"name": name, "capability": env["capability"], "torch": env["torch"], "threads": env["threads"],
           "cpu": cpu_model(), "python": platform.python_version(),
           "sft_sha256": _sha256(sft[0]) if sft else None}
    metrics = out / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    rec["reward_by_step"] = [round(r["reward"], 6) for r in rows]
    rec["eval_accuracy_by_step"] = {str(r["step"]): r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    summary = out / "summary.json"
    if not summary.is_file():
        log = (run / "log.txt").read_text(errors="replace") if (run / "log.txt").is_file() else ""
        m = re.search(r"base accuracy ([0-9.]+)", log)
        seed = re.search(r"train\.seed=(\d+)", (run / "cmd").read_text()) if (run / "cmd").is_file() else None
        rec.update({"status": "partial", "base_accuracy": float(m.group(1)) if m else None,
                    "steps_done": len(rows), "seed": int(seed.group(1)) if seed else None})
        return rec
    s = json.loads(summary.read_text())
    p = s["paired"]
    rec.update({
        "status": "done", "seed": s["config"]["train"]["seed"],
        "base": {"accuracy": s["base"]["accuracy"], "ci95": s["base"]["accuracy_ci95"]},
        "final": {"accuracy": s["final"]["accuracy"], "ci95": s["final"]["accuracy_ci95"]},
        "paired": {"gain": p["gain"], "ci95": p["gain_ci95"], "mcnemar_p": p["mcnemar_p"],
                   "base_only": p["first_only"], "final_only": p["second_only"]},
        "cell_accuracy": {"base": s["base"].get("cell_accuracy"), "final": s["final"].get("cell_accuracy")},
        "wall_seconds": s["wall_seconds"], "sft_seconds": s["sft_seconds"], "rl_seconds": s["rl_seconds"],
    })
    return rec


def write_record(rec: dict) -> Path:
    RECORDS.mkdir(parents=True, exist_ok=True)
    path = RECORDS / f"{rec['name']}.json"
    records.write_record(path, rec, indent=1)  # machine-independent paths
    return path


def summary() -> str:
    recs = [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))]
    if not recs:
        raise SystemExit(f"no records in {RECORDS}")
    lines = ["| run | kernels | threads | seed | SFT weights | base acc [95 % CI] | final acc [95 % CI] | paired gain [95 % CI] | McNemar p | wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in recs:
        sft = (r.get("sft_sha256") or "-")[:10]
        if r.get("status") != "done":
            lines.append(f"| {r['name']} | {r['capability']} | {r['threads']} | {r.get('seed', '-')} | {sft} | "
                         f"{r.get('base_accuracy', '-')} (partial) | running: {r.get('steps_done', 0)} of 60 steps; test accuracy "
                         f"by step {r.get('eval_accuracy_by_step') or '-'} | - | - | - |")
            continue
        b, f, p = r["base"], r["final"], r["paired"]
        lines.append(f"| {r['name']} | {r['capability']} | {r['threads']} | {r['seed']} | {sft} | "
                     f"{b['accuracy']:.3f} [{b['ci95'][0]:.3f}, {b['ci95'][1]:.3f}] | "
                     f"{f['accuracy']:.3f} [{f['ci95'][0]:.3f}, {f['ci95'][1]:.3f}] | "
                     f"{p['gain']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}] | {p['mcnemar_p']:.2g} | "
                     f"{r['wall_seconds']:.0f} |")
    done = [r for r in recs if r.get("status") == "done"]
    if done:
        fa = [r["final"]["accuracy"] for r in done]
        ga = [r["paired"]["gain"] for r in done]
        lines.append("")
        lines.append(f"final accuracy over {len(done)} finished runs: {min(fa):.3f} .. {max(fa):.3f}; "
                     f"paired gain {min(ga):+.3f} .. {max(ga):+.3f}")
    # where two runs of one seed under different kernels part: the first RL step with another reward
    by_seed: dict = {}
    for r in recs:
        by_seed.setdefault(r.get("seed"), []).append(r)
    for seed, group in sorted(by_seed.items(), key=lambda kv: str(kv[0])):
        ref = group[0]
        for other in group[1:]:
            a, b = ref["reward_by_step"], other["reward_by_step"]
            n = min(len(a), len(b))
            if n == 0:
                continue
            first = next((i + 1 for i in range(n) if a[i] != b[i]), None)
            where = f"first differs at RL step {first}" if first else f"equal over the {n} common steps"
            lines.append(f"seed {seed}: {ref['name']} vs {other['name']}: rollout reward {where}; SFT weights "
                         f"{'identical' if ref.get('sft_sha256') == other.get('sft_sha256') else 'differ'}")
    text = "\n".join(lines) + "\n"
    (RECORDS / "summary.md").write_text(text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", help="record name, e.g. native_s0")
    ap.add_argument("--capability", choices=CAPABILITIES, default="native",
                    help="ATEN_CPU_CAPABILITY of the run (native = unset)")
    ap.add_argument("--seed", type=int, default=0, help="train.seed of the RL run")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS (default: torch's choice)")
    ap.add_argument("--config", default="configs/demo_sudoku.yaml")
    ap.add_argument("--from-run", type=Path, help="make the record from this demo folder instead of running")
    ap.add_argument("--force", action="store_true", help="re-run although the record exists")
    ap.add_argument("--summary", action="store_true", help="print and write the table of all records")
    args = ap.parse_args(argv)
    if args.summary:
        print(summary(), end="")
        return 0
    if not args.name:
        ap.error("--name is required (or --summary)")
    if args.from_run is not None:
        if not (args.from_run / "env.json").is_file():
            raise SystemExit(f"{args.from_run}: no env.json (capability, threads, torch of the run)")
        print(write_record(record_from_run(args.name, args.from_run)))
        return 0
    path = RECORDS / f"{args.name}.json"
    if path.is_file() and json.loads(path.read_text()).get("status") == "done" and not args.force:
        print(f"{path} exists; --force to re-run")
        return 0
    run = RUNS / args.name
    run.mkdir(parents=True, exist_ok=True)
    (run / "cmd").write_text(f"--capability {args.capability} --set train.seed={args.seed}\n")
    run_demo(args.name, args.capability, args.seed, args.threads, args.config)
    print(write_record(record_from_run(args.name, run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
