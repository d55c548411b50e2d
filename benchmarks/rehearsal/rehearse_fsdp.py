"""FSDP2 at real width, rehearsed on CPU: one 8B recipe sharded over 2 gloo processes against 1 process.

    python benchmarks/rehearsal/rehearse_fsdp.py                                  # LLaDA diffu-GRPO, 1 block, real width
    python benchmarks/rehearsal/rehearse_fsdp.py --width-divisor 16               # the same at width / 16 (minutes)
    python benchmarks/rehearsal/rehearse_fsdp.py --recipes dream7b_gsm8k_diffu_grpo

Writes ``results/rehearse_8b/<recipe>_fsdp_L<layers>[_w<k>].json`` (``--out-dir``).

The model is the stand-in of :mod:`maskrl.models.standins` (``benchmarks/rehearsal/rehearse_8b.py`` writes it:
published width, heads, MLP, vocabulary and ids, ``--layers`` blocks, random bf16 weights from a seed),
loaded by the recipe's own construction (``maskrl.pipeline.load_policy``: bf16 base, fp32 LoRA on every
linear layer of the block, gradient checkpointing as the recipe says). The rehearsal's reductions are
``rehearse_launch.rehearsal_overrides`` (completion 32 tokens in one block, 1 prompt x G = 2 rollouts per
process) plus three that make the two runs comparable: μ = 1 (one optimizer step),
``train.micro_batch_size`` = G (the 1-process run's micro-batches are the ranks' shares, so global
micro-batch k draws the same likelihood masks, ``maskrl.training.seeds.likelihood_seed``, in both), and
the two shortest training prompts of the task (prompt lengths near 64 tokens).

Phases (each a fresh process, one thread each, so every GEMM reduces in the same order):

``single`` (1 process)
    ``RLTrainer`` on a plain accelerator; ``collect`` of the 2 prompts x G rollouts (the recipe's
    sampler and hashed reward, ``benchmarks/rehearsal/rehearse_plugin.py``; should a group's rewards tie, that
    rank's share would train nothing and its part of the update go unchecked, so a fixed advantage
    pattern replaces the batch's, and the record says so), saved; then ``optimize`` on the whole batch:
    the 1-process update of the trainable (LoRA) tensors.
``fsdp`` (2 gloo processes)
    the same construction under accelerate's FSDP2 (``FullyShardedDataParallelPlugin(fsdp_version=2,
    transformer_based_wrap)``, what ``configs/accelerate/fsdp.yaml`` selects; the accelerator state's
    type is set to FSDP after the group starts, as ``tests/dist_worker.py`` explains). Recorded: every
    FSDP unit and the class it wraps, the parameters left in the root unit; whether each of the family's
    decoder blocks (the model's own
    ``_no_split_modules`` class, which accelerate's policy reads) is a unit; each rank's local shard of
    every LoRA tensor against its full size. Then ``optimize`` on the rank's contiguous half of the
    saved batch, the updated trainable tensors gathered (``DTensor.full_tensor``), and the KV-cached
    sampler (``rollout.cache`` prefix, then dual; the recipe's sampler otherwise) on the *sharded*
    model, on the rank's prompts with generator seed ``SAMPLE_SEED + rank``, with the trainer's
    ``all_done`` / ``ranks_max`` hooks; decoder forwards counted.
``reference`` (1 process)
    the unsharded model of the same construction with the FSDP run's gathered tensors loaded: the same
    prompts, seeds and caches without hooks -- the completions the sharded model must give. Then the
    same with the 1-process update loaded, unless the two updates are bitwise equal (does their
    difference change a completion).

Each phase records its seconds and the process's peak resident set (``VmHWM``, reset at the phase's
start); a monitor thread samples the summed ``VmRSS`` of the running phase's processes every 0.2 s.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from maskrl.records import write_record  # noqa: E402
from rehearse_fsdp_children import (CACHES, WORLD, child_fsdp, child_reference, child_single,  # noqa: E402
                                    fsdp_overrides)
from rehearse_launch import DEFAULT_OUT, GIB, ROOT, _env, _free_port, ensure_standin, load_recipe  # noqa: E402
from rehearse_memory import proc_status  # noqa: E402


# ----------------------------------------------------------------------------------------------
# the orchestrator
# ----------------------------------------------------------------------------------------------
class RssMonitor(threading.Thread):
    """The largest summed ``VmRSS`` of ``pids`` (sampled every ``interval`` s) and each one's largest."""

    def __init__(self, pids: list[int], interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pids, self.interval = pids, interval
        self.stop = threading.Event()
        self.max_total = 0
        self.max_each = {p: 0 for p in pids}

    def run(self) -> None:
        while not self.stop.is_set():
            now = {p: proc_status(p).get("VmRSS", 0) for p in self.pids}
            self.max_total = max(self.max_total, sum(now.values()))
            for p, v in now.items():
                self.max_each[p] = max(self.max_each[p], v)
            time.sleep(self.interval)


def run_children(kind: str, args, overrides: list[str], world: int, log: Path, timeout: float) -> dict:
    """``kind`` on ``world`` processes (ranks of a gloo group when ``world`` > 1); their JSON results."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--recipe", args.recipe_name,
           "--overrides-json", json.dumps(overrides), "--work", str(args.run_work)]
    port = str(_free_port())
    procs, t0 = [], time.time()
    with open(log, "a") as fh:
        fh.write(f"$ [{world} process(es)] " + " ".join(cmd) + "\n")
        fh.flush()
        for r in range(world):
            env = _env(1) | {"CUDA_VISIBLE_DEVICES": "", "GLOO_SOCKET_IFNAME": "lo"}
            if world > 1:
                env |= {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=fh, stdin=subprocess.DEVNULL, text=True,
                                          env=env, cwd=ROOT))
        mon = RssMonitor([p.pid for p in procs])
        mon.start()
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(1.0, timeout - (time.time() - t0)))[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                outs.append(p.communicate()[0])
        mon.stop.set()
        mon.join()
    res: dict = {"seconds": round(time.time() - t0, 1), "returncodes": [p.returncode for p in procs],
                 "max_total_rss_gib": round(mon.max_total / GIB, 3),
                 "max_rss_gib": [round(mon.max_each[p.pid] / GIB, 3) for p in procs]}
    if any(p.returncode for p in procs):
        res["error"] = f"{kind}: exit codes {res['returncodes']}"
        res["log_tail"] = log.read_text()[-3000:]
        return res
    res["ranks"] = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    return res


def compare_updates(work: Path) -> dict:
    """Per trainable tensor: max |Δ| of the FSDP update against the 1-process one, the update's size, and
    the same for the gradients before clipping."""
    import torch

    single = torch.load(work / "single.pt", weights_only=False)
    fsdp = torch.load(work / "fsdp_weights.pt", weights_only=False)
    fgrads = torch.load(work / "fsdp_grads.pt", weights_only=False)
    init, ref, grads = single["init"], single["weights"], single["grads"]
    rows = {}
    for k in sorted(ref):
        delta = (ref[k].double() - fsdp[k].double()).abs()
        d = float(delta.max())
        moved = float((ref[k].double() - init[k].double()).abs().max())
        ulp = (torch.nextafter(ref[k].abs(), torch.tensor(float("inf"), dtype=ref[k].dtype)) - ref[k].abs()).double()
        rows[k] = {"max_abs_diff": d, "update_max_abs": moved, "equal": bool(torch.equal(ref[k], fsdp[k])),
                   "beyond_one_rounding": float((delta - ulp).clamp(min=0).max()),
                   "dtype": str(ref[k].dtype), "grad_equal": bool(torch.equal(grads[k], fgrads[k])),
                   "grad_max_abs": float(grads[k].abs().max()),
                   "grad_max_abs_diff": float((grads[k].double() - fgrads[k].double()).abs().max())}
    diff = max(r["max_abs_diff"] for r in rows.values())
    moved = max(r["update_max_abs"] for r in rows.values())
    return {"tensors": len(rows), "keys_equal": sorted(ref) == sorted(fsdp), "max_abs_diff": diff,
            "beyond_one_rounding": max(r["beyond_one_rounding"] for r in rows.values()),
            "grad_entries": sum(g.numel() for g in grads.values()),
            "update_max_abs": moved, "bitwise_equal_tensors": sum(r["equal"] for r in rows.values()),
            "tensors_moved": sum(r["update_max_abs"] > 0 for r in rows.values()),
            "grads_bitwise_equal_tensors": sum(r["grad_equal"] for r in rows.values()),
            "grad_max_abs_diff": max(r["grad_max_abs_diff"] for r in rows.values()),
            "grad_norm_float64": float(sum(g.double().pow(2).sum() for g in grads.values()).sqrt()),
            "dtypes": sorted({r["dtype"] for r in rows.values()}), "per_tensor": rows}


def faults_of(rec: dict) -> list[str]:
    """What the record's checks found wrong (module docstring)."""
    ph, out = rec["phases"], []
    ranks = ph.get("fsdp", {}).get("ranks", [])
    for r in ranks:
        w = r["wrap"]
        if not w["every_block_a_unit"]:
            out.append(f"wrap: rank {r['rank']}: not every {w['block_class']} is an FSDP unit ({w['blocks']} vs "
                       f"{sorted(w['units'])})")
        if w["lora_tensors"] and (not w["lora_all_dtensors"] or w["lora_numel_local"] >= w["lora_numel_full"]):
            out.append(f"shard: rank {r['rank']}: LoRA tensors not sharded ({w['lora_numel_local']} of "
                       f"{w['lora_numel_full']} local)")
        out += moe_faults(r)
    up = rec.get("update", {})
    # an entry may differ by one rounding step of the updated weight (a clip coefficient a few float32 steps
    # apart flips it); what is left must stay within 1e-3 of the update
    beyond = up.get("beyond_one_rounding", up.get("max_abs_diff"))  # older records: the whole difference
    if up and not (up["keys_equal"] and beyond <= 1e-3 * up["update_max_abs"] and up["update_max_abs"] > 0):
        out.append(f"update: FSDP vs 1 process max |Δ| {up['max_abs_diff']:.3g}, {beyond:.3g} beyond one rounding "
                   f"of the weight (update max {up['update_max_abs']:.3g})")
    if up and up["grads_bitwise_equal_tensors"] != up["tensors"]:
        out.append(f"gradients before clipping: {up['tensors'] - up['grads_bitwise_equal_tensors']} of {up['tensors']} "
                   f"tensors differ (max |Δ| {up['grad_max_abs_diff']:.3g})")
    # float32 norms of n entries, each reduced in its own order: both within eps·sqrt(n) of the float64 norm
    # (1e-4 at least; 3.9e-4 for LLaDA-8B's 10.5 M LoRA entries, 1.2e-3 for the LLaDA2 stand-in's 99.6 M)
    single = ph.get("single", {}).get("ranks", [{}])[0].get("metrics", {})
    exact = up.get("grad_norm_float64")
    rel = max(1e-4, 2.0 ** -23 * up.get("grad_entries", 0) ** 0.5)
    for who, g in [("1 process", single.get("grad_norm"))] + [(f"rank {r['rank']}", r["metrics"].get("grad_norm"))
                                                             for r in ranks]:
        if exact is not None and (g is None or abs(g - exact) > rel * exact):
            out.append(f"grad_norm: {who} {g} vs {exact} (float64 norm of the same gradients)")
    ref = ph.get("reference", {}).get("ranks", [{}])[0].get("fsdp_update", {})
    for key, v in ref.items():
        if not v["equal"]:
            out.append(f"sampler: {key}: the sharded model's rollout differs from the unsharded model's "
                       f"({[f for f, e in v['fields_equal'].items() if not e]})")
    for cache in (ranks[0]["decoder_forwards"] if ranks else ()):
        n = [r["decoder_forwards"][cache] for r in ranks]
        if len(set(n)) > 1:
            out.append(f"sampler: {cache}: decoder forwards differ between ranks {n}")
    for r in ph.get("single", {}).get("ranks", []):
        if r.get("expert_bias_unchanged") is False:
            out.append("expert bias: the 1-process update changed it")
    for name in ("single", "fsdp", "reference"):
        if "error" in ph.get(name, {}):
            out.append(ph[name]["error"])
    return out


def moe_faults(r: dict) -> list[str]:
    """A rank's MoE checks: routed experts sharded, the expert bias neither trainable nor changed by the update."""
    w, out = r["wrap"], []
    if w["expert_tensors"] and (not w["experts_all_dtensors"] or w["experts_numel_local"] >= w["experts_numel_full"]):
        out.append(f"shard: rank {r['rank']}: experts not sharded ({w['experts_numel_local']} of {w['experts_numel_full']})")
    if w["trainable_expert_bias"] or r.get("expert_bias_unchanged") is False:
        out.append(f"expert bias: rank {r['rank']}: trainable {w['trainable_expert_bias']}, "
                   f"unchanged by the update: {r.get('expert_bias_unchanged')}")
    return out


#: ``--family llada2``: the recipe's objective and likelihood replaced by EBPO on the block ELBO (the family's
#: RL objective), and per ``--variant`` LoRA as the recipe has it (bf16 base, fp32 LoRA; experts frozen) or full
#: fine-tuning in float32 (``model.lora_rank=0``)
LLADA2_OVERRIDES = ["objective={name: ebpo}", "likelihood={name: elbo}"]
VARIANTS = {"lora": [], "full": ["model.lora_rank=0", "model.dtype=float32"]}


def record_name(recipe: str, args) -> str:
    """``<recipe>_fsdp_L<layers>[_w<k>]``; for LLaDA2 ``llada2_mini_<variant>_fsdp_L<layers>[_w<k>]``."""
    head = f"llada2_mini_{args.variant}" if args.family == "llada2" else recipe
    return f"{head}_fsdp_L{args.layers}" + ("" if args.width_divisor == 1 else f"_w{args.width_divisor}")


def rehearse(recipe: str, args) -> dict:
    """Every phase of one recipe; returns the record (written to ``--out-dir``)."""
    import platform

    import torch

    shipped = load_recipe(recipe)
    family = args.family or ("dream" if shipped.model.path.startswith("Dream") else "llada")
    name = record_name(recipe, args)
    work = Path(args.work) / f"fsdp_{name}"
    work.mkdir(parents=True, exist_ok=True)
    for f in work.glob("*.pt"):
        f.unlink()
    log = work / "log.txt"
    standin = ensure_standin(Path(args.work), family, args.layers, args.width_divisor)
    ov = fsdp_overrides(shipped, standin, work / "run")
    if family == "llada2":
        ov += LLADA2_OVERRIDES + VARIANTS[args.variant]
    args.recipe_name, args.run_work = recipe, work
    rec: dict = {"benchmark": "rehearse_fsdp", "recipe": recipe, "family": family, "layers": args.layers,
                 "variant": args.variant if family == "llada2" else None,
                 "width_divisor": args.width_divisor, "standin": str(standin), "overrides": ov,
                 "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "torch": torch.__version__,
                          "threads_per_process": 1},
                 "date": time.strftime("%Y-%m-%d %H:%M:%S"), "phases": {}, "faults": []}
    path = Path(args.out_dir) / f"{name}.json"

    def save():
        rec["faults"] = faults_of(rec)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_record(path, rec, work=args.work)

    for kind, world in (("single", 1), ("fsdp", WORLD), ("reference", 1)):
        print(f"  {kind} ({world} process{'es' if world > 1 else ''})", flush=True)
        rec["phases"][kind] = run_children(kind, args, ov, world, log, args.timeout)
        if "error" in rec["phases"][kind]:
            break
        if kind == "fsdp":
            rec["update"] = compare_updates(work)
        save()
    rec["max_total_rss_gib"] = max(p.get("max_total_rss_gib", 0) for p in rec["phases"].values())
    save()
    rec["record"] = str(path)
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", default="llada8b_gsm8k_diffu_grpo", help="comma-separated recipe names")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--family", choices=("llada", "dream", "llada2"), help="the stand-in's family (default: the "
                   "recipe's model); llada2: LLaDA2.0-mini at real width, 8 experts (LLADA2_OVERRIDES)")
    p.add_argument("--variant", choices=tuple(VARIANTS), default="lora", help="--family llada2: LoRA or full FT")
    p.add_argument("--width-divisor", type=int, default=1, help="1: real width; k > 1 divides the width")
    p.add_argument("--out-dir", default=str(DEFAULT_OUT))
    p.add_argument("--work", default="/tmp/maskrl_rehearse")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per phase")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--recipe", help=argparse.SUPPRESS)
    p.add_argument("--overrides-json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        res = {"single": child_single, "fsdp": child_fsdp, "reference": child_reference}[args.child](args)
        print(json.dumps(res, default=str), flush=True)
        # leave without freeing the trainer: its FSDP state holds the last reference to the destroyed gloo
        # group, whose destructor can deadlock with gloo's run loop (tests/dist_worker.py: end_group)
        sys.stderr.flush()
        os._exit(0)
    for recipe in [r.strip() for r in args.recipes.split(",") if r.strip()]:
        if not (ROOT / "configs" / f"{recipe}.yaml").is_file():
            p.error(f"--recipes: no configs/{recipe}.yaml")
        print(f"{recipe}: FSDP2 on {WORLD} processes, {args.layers} block(s), width / {args.width_divisor}", flush=True)
        t0 = time.time()
        rec = rehearse(recipe, args)
        print(f"{recipe}: {time.time() - t0:.0f} s, faults: {rec['faults'] or 'none'}; {rec['record']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
