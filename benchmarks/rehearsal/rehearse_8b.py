"""The 8B path rehearsed on CPU: every shipped LLaDA-8B / Dream-7B / SDAR-8B / TraDo-8B recipe at the real width
and vocabulary, and the LLaDA2.0-mini recipes at the real width with fewer experts and a smaller vocabulary.

    python benchmarks/rehearsal/rehearse_8b.py                                   # all 12 LLaDA / Dream recipes, 2 blocks
    python benchmarks/rehearsal/rehearse_8b.py --recipes block --layers 1        # the 3 block-diffusion (SDAR / TraDo) recipes
    python benchmarks/rehearsal/rehearse_8b.py --recipes llada8b_gsm8k_diffu_grpo --layers 1,2
    python benchmarks/rehearsal/rehearse_8b.py --recipes llada2_mini_gsm8k_diffu_grpo --layers 2  # dense + 1 MoE block
    python benchmarks/rehearsal/rehearse_8b.py --depth-series 1,2,4 --recipes llada8b_gsm8k_diffu_grpo
    python benchmarks/rehearsal/rehearse_8b.py --smoke                           # one recipe, one step, narrow (test suite)
    python benchmarks/rehearsal/rehearse_8b.py --rescore                         # plan_vs_measured again, from the records
    python benchmarks/rehearsal/rehearse_8b.py --recipes R --layers 1 --recount WHY  # plan and count phases again, this code
    python benchmarks/rehearsal/rehearse_8b.py --recipes R --layers 2 --recount WHY --rerun-a  # and run_a's memory windows
    python benchmarks/rehearsal/rehearse_fsdp.py                                 # one recipe under FSDP2 against 1 process

Each recipe writes one JSON record, ``results/rehearse_8b/<recipe>_L<layers>.json`` (``--out-dir``).

The model is a stand-in (:mod:`maskrl.models.standins`): LLaDA-8B-Instruct's, Dream-v0-Instruct-7B's or
SDAR-8B-Chat's (TraDo-8B's shape) published config at its real width, heads, MLP, vocabulary, RoPE and ids, in
the family's own checkpoint layout, with ``--layers`` blocks instead of 32 / 28 / 36, random bf16 weights from a
seed. LLaDA2.0-mini's (``--recipes llada2``) has ``--layers`` of its 20 blocks (the first dense, the rest MoE), the
real width, heads, dense and expert MLPs and shared expert, but 8 routed experts (2 active, in 4 groups of 2) for
256 (8 active) and a 4,608-row vocabulary for 157,184, with eos / pad and mask at 4,500 / 4,503
(:data:`maskrl.models.standins.LLADA2_STANDIN`; the record's ``reduced`` lists both); its export's logits are
checked against ``maskrl.models.load`` only (the layout reader has no MoE forward). Only lengths and rows per step are reduced (:func:`rehearse_launch.rehearsal_overrides`: prompt as the task
gives it, completion 32 tokens -- in one block at the recipe's tokens per step, or on a block-diffusion model in
the recipe's blocks of 4 at its steps per block, 8 blocks × 4 steps -- 1 prompt × ``--group-size`` rollouts per
process, μ capped at 2, 32 training rows); LoRA targets and rank, dtype, gradient checkpointing, likelihood,
objective, credit modules, cache, remasking, threshold and early stop are the recipe's. Rewards: ``benchmarks/rehearsal/rehearse_plugin.py`` (the task's
data, template and grader, plus a hashed reward so that advantages are not all 0).

Phases (public entry points only; each a fresh process):

``data``
    the shipped recipe's own task and data (``maskrl.pipeline.task_and_data``): does ``maskrl train``
    find its training rows?
``run_a``
    ``accelerate launch --multi_gpu --num_processes 2 -m maskrl.cli train`` (torchrun, 2 gloo processes
    on CPU): 3 RL steps uninterrupted, then the CLI's own final checkpoint and ``model/`` export.
``resume_b``
    the same command with ``--resume <run_a>/checkpoints/step_2`` into another folder, to step 3 (run_a
    saves a checkpoint at step 2). ``resume_exact``: every LoRA and AdamW tensor of the two step-3
    checkpoints and the step-3 metrics compared bit for bit.
``eval``
    ``maskrl eval --model <run_a>/model --task <task> --limit N --dtype bfloat16`` (the prompt card sets
    the sampler).
``checks`` (``--child checks``)
    the *live policy* -- ``maskrl.pipeline.load_policy`` of the run's config (bf16 base, fp32 LoRA)
    with the LoRA tensors of run_a's last checkpoint -- against the export: per adapted matrix, the
    exported update ``W_export - W_base`` against the adapter's own ``scale · B A`` (relative error,
    share of entries left equal to the base); logits of the export read by ``maskrl.models.load`` and by
    the family's own layout reader (:func:`maskrl.models.standins.reference_logits`; SDAR's block-causal
    attention) against the live
    policy's, relative to the update's own effect on the logits; greedy completions of the live policy
    (``maskrl.evaluate.run_harness`` on the adapter), of ``maskrl eval`` on the export and of the
    lm-eval model (``maskrl.lm_eval_model``, ``generate_until``) on the same rows; the reloaded bf16
    export's weights against the live policy's, bit for bit (:func:`rehearse_children.weight_digests`), its completions in
    the same process, and both models' completions in float32; the export's layout against the base
    checkpoint's (:func:`rehearse_children.export_layout`: ``model_type``, ``architectures``, ``auto_map``,
    ``block_size``, mask id, every tensor name and shape). A random stand-in's bf16 logits tie
    exactly and often, so completions of another process are judged with these (:func:`rehearse_plan.completion_faults`).
``plan``
    ``maskrl plan --gpus 2 --strategy ddp --json`` of the same shape (the stand-in's config.json).
``count`` (``--child count``)
    one process, the stand-in at the recipe's settings on synthetic prompts of exactly the plan's P
    tokens: FLOPs of the first step counted with ``FlopCounterMode`` (SDPA math backend), and the peak
    resident memory of the second step (``VmHWM`` reset through ``/proc/self/clear_refs``) minus the
    process's memory before the model was built -- what ``benchmarks/rehearsal/plan_check.py`` measures.

Memory of the 2-process phases: a monitor thread reads each worker's ``VmHWM`` and ``VmRSS`` from
``/proc`` every 50 ms, and at each step boundary (a new line in ``metrics.jsonl``) reads the window's
peak and resets it (``/proc/<pid>/clear_refs``), so each window -- load + step 1, step k, the last step
to exit (checkpoint, export on rank 0) -- has its own peak per process. glibc is told to ``mmap`` every
block ≥ 64 KiB (``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the resident set, and oneDNN's and ideep's
per-shape kernel caches are off in every process (:data:`rehearse_memory.KERNEL_CACHES_OFF`: same kernels, no
cached primitives, which an MoE step's data-dependent expert shapes grew by 0.2-0.4 GiB on the LLaDA2 stand-in).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from maskrl.records import write_record

# the rehearsal's parts, by purpose (this folder is the script's own: they import by name)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rehearse_children import child_checks, child_count  # noqa: E402
from rehearse_launch import (ROOT, DEFAULT_OUT, GIB, RECIPES, BLOCK_RECIPES, LLADA2_RECIPES, BLOCK_FAMILIES, PUBLISHED_LAYERS, standin_family, GEN_LENGTH, SMOKE_PROMPT_LENGTH, EVAL_ROWS,  # noqa: E402
                             recipe_path, rehearsal_overrides, load_recipe, _env, _bin, run_cli_train, _tail,
                             compare_checkpoints, compare_metrics, _run_child, run_plan, ensure_standin,
                             _code_commit)
from rehearse_memory import proc_status  # noqa: E402
from rehearse_plan import (completion_faults, _plan_summary, written_files, plan_faults, rescore, recount,  # noqa: E402
                           plan_vs_measured, depth_series)


def rehearse(recipe: str, layers: int, args) -> dict:
    """Every phase of one recipe (module docstring); returns the JSON record."""
    import platform

    import torch

    from maskrl.config import to_dict
    from maskrl.pipeline import task_and_data

    shipped = load_recipe(recipe)
    family = standin_family(shipped)
    work = Path(args.work) / f"{recipe}_L{layers}_w{args.width_divisor}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "log.txt"
    standin = ensure_standin(Path(args.work), family, layers, args.width_divisor, corpus_rows=100 if args.smoke else 2000)
    steps = 1 if args.smoke else 3
    rec: dict = {"benchmark": "rehearse_8b", "recipe": recipe, "family": family, "layers": layers,
                 "width_divisor": args.width_divisor, "standin": str(standin),
                 "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "torch": torch.__version__},
                 "date": time.strftime("%Y-%m-%d %H:%M:%S"), "code": _code_commit(), "phases": {}, "faults": []}
    ph = rec["phases"]

    def save():
        out = Path(args.out_dir) / f"{recipe}_L{layers}{'' if args.width_divisor == 1 else f'_w{args.width_divisor}'}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        write_record(out, rec, work=args.work)  # maskrl.records: paths under --work named <work>
        rec["record"] = str(out)

    # ---- the shipped recipe's own data
    try:
        _, held, src, train = task_and_data(shipped)
        ph["data"] = {"ok": True, "train_rows": len(train), "eval_rows": len(held), "eval_source": src}
    except FileNotFoundError as e:  # the recipe's data file is not on this machine: not a fault of the code
        ph["data"] = {"ok": False, "missing_file": str(e)}
    except Exception as e:  # noqa: BLE001 - recorded as the recipe's fault
        ph["data"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        rec["faults"].append(f"data: the shipped recipe cannot start `maskrl train`: {type(e).__name__}: {e}")

    ov_a = rehearsal_overrides(shipped, standin, work / "a", steps, args.group_size, save_every=0 if args.smoke else 2,
                               block_model=family in BLOCK_FAMILIES)
    cfg = load_recipe(recipe, ov_a)
    rec["rehearsal_config"] = {k: to_dict(cfg)[k] for k in ("model", "rollout", "eval", "train", "objective",
                                                             "likelihood", "credit")}
    rec["overrides"] = ov_a
    rec["reduced"] = {"rollout.gen_length": f"{shipped.rollout.gen_length} -> {GEN_LENGTH}",
                      "train.prompts_per_step": f"{shipped.train.prompts_per_step} -> 1",
                      "train.group_size": f"{shipped.train.group_size} -> {args.group_size}",
                      "train.inner_iterations": f"{shipped.train.inner_iterations} -> {cfg.train.inner_iterations}",
                      "layers": f"{PUBLISHED_LAYERS[family]} -> {layers}"}
    if family in BLOCK_FAMILIES:
        rec["reduced"]["rollout.block_length"] = f"{shipped.rollout.block_length} (kept)"
    if family == "llada2":
        from maskrl.models.standins import LLADA2_MINI_CONFIG, LLADA2_STANDIN
        published = LLADA2_MINI_CONFIG | {"eos_token_id": 156892, "mask_token_id": 156895}  # ids of the published tokenizer
        for k, v in LLADA2_STANDIN.items():
            rec["reduced"][f"config.{k}"] = f"{published[k]} -> {v}"

    # ---- the plan of the same shape, first (its prompt length feeds the count)
    plan: dict = {}
    if not args.smoke:  # the smoke test leaves the plan to tests/test_plan.py (minutes at a 126k vocabulary)
        print("  plan", flush=True)
        plan = run_plan(recipe, ov_a, log, 2, "ddp", None, work / "plan_ddp2.json")
        ph["plan"] = _plan_summary(plan)
        if "error" in plan:
            rec["faults"].append(f"plan: {plan['error']}")
    P = plan.get("recipe", {}).get("prompt_length") or (SMOKE_PROMPT_LENGTH if args.smoke else None)

    print(f"  run_a ({steps} steps, 2 processes)", flush=True)
    ph["run_a"] = run_cli_train(recipe, ov_a, work / "a", log)
    if ph["run_a"]["returncode"] != 0:
        rec["faults"].append(f"run_a: maskrl train exited {ph['run_a']['returncode']}")
        ph["run_a"]["log_tail"] = _tail(log)
        save()
        return rec
    save()
    if not args.smoke:
        print("  resume_b (from run_a's step-2 checkpoint to step 3, 2 processes)", flush=True)
        ov_b = [o if not o.startswith("output_dir=") else f"output_dir={work / 'b'}" for o in ov_a]
        ph["resume_b"] = run_cli_train(recipe, ov_b, work / "b", log, resume=work / "a" / "checkpoints" / "step_2")
        if ph["resume_b"]["returncode"]:
            rec["faults"].append(f"resume_b: maskrl train --resume exited {ph['resume_b']['returncode']}")
            ph["resume_b"]["log_tail"] = _tail(log)
        else:
            ck = compare_checkpoints(work / "a" / "checkpoints" / "step_3", work / "b" / "checkpoints" / "step_3")
            mt = compare_metrics(work / "a" / "metrics.jsonl", work / "b" / "metrics.jsonl", 3)
            ph["resume_exact"] = {"checkpoints": ck, "metrics_step_3": mt, "equal": ck["equal"] and mt["equal"]}
            if not ph["resume_exact"]["equal"]:
                rec["faults"].append("resume: 2 processes resumed from the uninterrupted run's own step-2 checkpoint "
                                     f"differ from it at step 3 ({ck['lora_tensors_different']}/{ck['lora_tensors']} "
                                     f"LoRA tensors, {ck['optimizer_tensors_different']} optimizer tensors; metrics "
                                     f"that differ: {', '.join(sorted(mt['different'])[:8])})")
        save()

    print("  eval (maskrl eval on the export)", flush=True)
    t0 = time.time()
    task_name = shipped.task.name
    cmd = [_bin("maskrl"), "eval", "--model", str(work / "a" / "model"), "--task", task_name, "--limit", str(EVAL_ROWS),
           "--dtype", str(cfg.model.dtype), "--batch-size", str(EVAL_ROWS), "--out", str(work / "eval"), "--device", "cpu"]
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(2), cwd=ROOT)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, proc_status(proc.pid).get("VmHWM", 0))
            time.sleep(0.05)
    ph["eval"] = {"command": " ".join(cmd), "returncode": proc.returncode, "seconds": time.time() - t0,
                  "peak_gib": round(peak / GIB, 3)}
    if proc.returncode:
        rec["faults"].append(f"eval: maskrl eval exited {proc.returncode}")
        ph["eval"]["log_tail"] = _tail(log)

    print("  checks (live policy vs export, lm-eval)", flush=True)
    ph["checks"] = _run_child("checks", ["--recipe", recipe, "--overrides-json", json.dumps(ov_a),
                                          "--run-dir", str(work / "a"), "--eval-dir", str(work / "eval")], log)
    c = ph["checks"]
    if "error" in c:
        rec["faults"].append(f"checks: {c['error']}")
    else:
        if not c["export_weights"]["carries_update"]:
            ew = c["export_weights"]
            rec["faults"].append(f"export: the merged model/ does not carry the LoRA update: relative error of the "
                                 f"exported update {ew['median_rel_error']:.3g} (median over {ew['matrices']} matrices), "
                                 f"{100 * ew['mean_equal_to_base_frac']:.1f} % of adapted entries equal to the base "
                                 f"(export dtype {ew['export_dtypes']})")
        lay = c.get("export_layout", {})
        if lay and not (lay["config_equal"] and lay["names_equal"]):
            bad = {k: v for k, v in lay["config_keys"].items() if v["base"] != v["export"]}
            rec["faults"].append(f"export: model/ is not in the base checkpoint's layout: config.json keys {bad}, "
                                 f"tensors only in the base {lay['only_in_base']}, only in the export "
                                 f"{lay['only_in_export']}, other shapes {lay['shape_differ']}")
        if not c.get("lora_init", {}).get("reproducible", True):
            rec["faults"].append("lora init: a second construction of the same config (maskrl.pipeline.load_policy, "
                                 f"same train.seed) draws other LoRA A matrices (max |diff| "
                                 f"{c['lora_init']['max_abs_diff_fresh_vs_run']:.3g}): two launches of one recipe and "
                                 "seed train different models")
        rec["faults"] += completion_faults(c)
    save()

    if P:
        print(f"  count (1 process, P={P})", flush=True)
        ph["count"] = _run_child("count", ["--recipe", recipe, "--overrides-json", json.dumps(ov_a),
                                            "--prompt-length", str(P)], log)
        if "error" in ph["count"]:
            rec["faults"].append(f"count: {ph['count']['error']} (the 1-process FLOP and memory count; log: {log})")
    ph["files"] = written_files(work / "a")
    rec["plan_vs_measured"] = plan_vs_measured(rec, ph.get("plan", {}).get("files_gib"))
    rec["faults"] += plan_faults(rec)
    save()
    if not args.keep:
        shutil.rmtree(work / "a" / "checkpoints", ignore_errors=True)
        for d in ("a", "b"):
            shutil.rmtree(work / d / "model", ignore_errors=True)
            shutil.rmtree(work / d / "checkpoints", ignore_errors=True)
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", default="all", help="comma-separated recipe names, `all` (the 12 "
                   "LLaDA / Dream recipes, default), `block` (the 3 SDAR / TraDo recipes) or `llada2` (the 3 LLaDA2.0-mini recipes)")
    p.add_argument("--layers", default="2", help="comma-separated block counts (default 2)")
    p.add_argument("--width-divisor", type=int, default=1, help="1: real width; k > 1 divides the width (tests)")
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--out-dir", default=str(DEFAULT_OUT))
    p.add_argument("--work", default="/tmp/maskrl_rehearse")
    p.add_argument("--smoke", action="store_true", help="one recipe, one step, no plan or resume; the count at P 32 (the test suite's mode)")
    p.add_argument("--depth-series", help="comma-separated depths: the 1-process count and plan at each (no runs)")
    p.add_argument("--keep", action="store_true", help="keep checkpoints and exports in --work")
    p.add_argument("--rescore", action="store_true", help="recompute plan_vs_measured and its faults of the records "
                                                           "in --out-dir from their own phases (no runs)")
    p.add_argument("--recount", metavar="WHY", help="run the plan and count phases of the records of --recipes and "
                   "--layers in --out-dir again with this code (the 2-process phases kept); WHY goes into the record")
    p.add_argument("--rerun-a", action="store_true", help="with --recount: run_a (the 2-process run) again too, for "
                   "its memory windows (resume, eval and checks kept from the record's run)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--recipe", help=argparse.SUPPRESS)
    p.add_argument("--overrides-json", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--eval-dir", help=argparse.SUPPRESS)
    p.add_argument("--prompt-length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--phase-peaks", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        ov = json.loads(args.overrides_json)
        if args.child == "checks":
            res = child_checks(args.recipe, ov, Path(args.run_dir), Path(args.eval_dir))
        else:
            res = child_count(args.recipe, ov, args.prompt_length, phases=args.phase_peaks)
        print(json.dumps(res, default=str))
        return 0
    if args.rescore:
        for f in rescore(Path(args.out_dir)):
            print(f"rescored {f}")
        return 0
    names = ({"all": RECIPES, "block": BLOCK_RECIPES, "llada2": LLADA2_RECIPES}.get(args.recipes)
             or [r.strip() for r in args.recipes.split(",") if r.strip()])
    unknown = [r for r in names if not recipe_path(r).is_file()]
    if unknown:
        p.error(f"--recipes: no configs/{unknown[0]}.yaml")
    if args.smoke:
        names = names[:1]
    if args.recount:
        for layers in [int(x) for x in args.layers.split(",")]:
            for r in names:
                f = Path(args.out_dir) / f"{r}_L{layers}.json"
                if not f.is_file():
                    p.error(f"--recount: no record {f}")
                print(f"{r}: {layers} block(s), recount", flush=True)
                rec = recount(f, args, args.recount)
                print(f"{r}: faults: {'; '.join(rec['faults']) or 'none'}; {f}", flush=True)
        return 0
    if args.depth_series:
        for r in names[:1]:
            res = depth_series(r, [int(x) for x in args.depth_series.split(",")], args)
            out = Path(args.out_dir) / f"{r}_depth_series.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(res, indent=2, default=str) + "\n")
            print(f"wrote {out}")
        return 0
    for layers in [int(x) for x in args.layers.split(",")]:
        for r in names:
            print(f"{r}: {layers} block(s)", flush=True)
            t0 = time.time()
            rec = rehearse(r, layers, args)
            print(f"{r}: {time.time() - t0:.0f} s, faults: {rec['faults'] or 'none'}; {rec.get('record')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
