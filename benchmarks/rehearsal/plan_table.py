"""``maskrl plan`` of every shipped 8B recipe on 1x80 GB and 8x80 GB, plus the public reference shapes
(issue 21 §2-3), as JSON and a Markdown table for docs/scaling.md.

    python benchmarks/rehearsal/plan_table.py --out benchmarks/results/plan_table.json

Hardware: H100 SXM (989 dense bf16 TFLOP/s, MFU 0.4, 3.35 TB/s); prompt length 256 tokens (an
estimate; GSM8K prompts with LLaDA's chat template are ~100-250 tokens). 8 GPUs: DDP (the recipes'
launch config, configs/accelerate/ddp.yaml), B prompts per process.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "plan_table.json"
#: public reference shapes: (name, recipe, overrides, hardware keywords, the published figure)
REFERENCES = [
    ("NeMo-RL GDPO, 1xH100 (NVIDIA-NeMo/RL PR #3550)", "llada8b_gsm8k_gdpo.yaml",
     ["likelihood.nodes=3", "train.lr=3e-7"], dict(gpus=1, strategy="single"),
     "~95 s/step: ~30 s denoising, ~65 s for the 12 updates (LoRA r128, 2 prompts x 6, mu 12)"),
    ("d1 diffu-GRPO, 8 GPUs (d1 Sec. B.1; dllm-reasoning/d1 issue #11)", "llada8b_gsm8k_diffu_grpo.yaml", [],
     dict(gpus=8, strategy="ddp"), "~2 days to converge on 8xA100-80GB (maintainer, issue #11)"),
]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--prompt-length", type=int, default=256)
    args = p.parse_args(argv)
    from maskrl.config import load_config
    from maskrl.plan import GIB, Hardware, make_plan

    recipes = sorted(CONFIGS.glob("llada8b_*.yaml")) + sorted(CONFIGS.glob("dream7b_*.yaml"))
    rows, refs = [], []
    for path in recipes:
        cfg = load_config([path])
        for gpus, strategy in ((1, "single"), (8, "ddp")):
            t0 = time.time()
            plan = make_plan(cfg, Hardware(gpus=gpus, gpu_memory=80 * GIB, strategy=strategy), args.prompt_length)
            rows.append({"recipe": path.name, "gpus": gpus, "plan": plan, "plan_seconds": time.time() - t0})
            print(f"{path.name} x{gpus}: peak {plan['memory_gib']['peak']:.1f} GiB, {plan['time']['seconds_per_step']:.1f} s/step",
                  flush=True)
    for name, recipe, overrides, hw, figure in REFERENCES:
        cfg = load_config([CONFIGS / recipe], overrides)
        plan = make_plan(cfg, Hardware(gpu_memory=80 * GIB, **hw), args.prompt_length)
        refs.append({"reference": name, "recipe": recipe, "overrides": overrides, "published": figure, "plan": plan})
    result = {"benchmark": "plan_table", "command": " ".join(["python", "benchmarks/rehearsal/plan_table.py"] + (argv or sys.argv[1:])),
              "prompt_length": args.prompt_length, "rows": rows, "references": refs, "markdown": markdown(rows, refs)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(result["markdown"])
    return result


def markdown(rows, refs) -> str:
    head = ("| recipe | GPUs | weights + states GiB | peak GiB (phase) | fits 80 GB | forwards / step | PFLOP / step | "
            "s / step | h / run |\n|---|---|---|---|---|---|---|---|---|")
    out = [head]
    for r in rows:
        p = r["plan"]
        m, t, w = p["memory_gib"], p["time"], p["work"]
        phase = max(m["peak_by_phase"], key=m["peak_by_phase"].get)
        fix = "" if m["fits"] else (" — " + p["what_to_change"][0]["change"] if p["what_to_change"] else "")
        out.append(f"| {r['recipe'].removesuffix('.yaml')} | {r['gpus']} | {m['static_total']:.1f} | {m['peak']:.1f} ({phase}) | "
                   f"{'yes' if m['fits'] else 'no' + fix} | {w['forwards']} | {w['flops'] / 1e15:.1f} | "
                   f"{t['seconds_per_step']:.0f} | {t['hours_per_run']:.1f} |")
    out += ["", "| reference | published | plan: rollout s | plan: optimize s | plan: s / step | plan: peak GiB |",
            "|---|---|---|---|---|---|"]
    for r in refs:
        p = r["plan"]
        s = p["time"]["seconds_by_phase_term"]
        ro = s.get("rollout", 0.0)
        out.append(f"| {r['reference']} | {r['published']} | {ro:.0f} | {sum(s.values()) - ro:.0f} | "
                   f"{p['time']['seconds_per_step']:.0f} | {p['memory_gib']['peak']:.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
