"""The plan of a recipe (memory, work, time, what to change) and its text report."""
from __future__ import annotations

import copy
import dataclasses
import json

import torch

from maskrl.plan.flops import FlopModel, _dtype, _lora, param_memory, work_table
from maskrl.plan.memory import ActivationModel, files_gib, memory_gib
from maskrl.plan.moe import active_params
from maskrl.plan.progress import QUIET, Progress
from maskrl.plan.shapes import GIB, Hardware, ModelShape, PlanError, model_shape
from maskrl.plan.work import record_work

#: models, fits and recorded work shared by the plans of one process (keyed by content)
_CACHE: dict = {}


def make_plan(cfg, hw: Hardware, prompt_length: int = 256, seed: int = 0, search: bool = True,
              micro_batch_size: int | None = None, max_forward_rows: int | None = None, shape: ModelShape | None = None,
              _cache: dict | None = None, progress: Progress = QUIET) -> dict:
    """The plan of one recipe on ``hw`` (per process): memory, work, time, and what to change.

    Args:
        cfg: the run configuration.
        hw: the hardware.
        prompt_length: P, prompt tokens per row (an estimate: the tokenizer and chat template decide).
        seed: the stand-in's seed.
        search: when the peak does not fit, try the changes listed under ``what_to_change``.
        micro_batch_size, max_forward_rows: override the recipe's.
        shape: the model's shape (default: :func:`model_shape` of ``cfg``).
        progress: where each phase's start and seconds are reported (:class:`~maskrl.plan.progress.Progress`;
            ``maskrl plan`` writes them to stderr; default: nothing).

    Returns:
        A JSON-able dict: ``model``, ``hardware``, ``memory_gib`` (static parts, per-phase peaks,
        ``peak``, ``fits``), ``files_gib`` (a checkpoint's size, the export's host memory and size:
        :func:`~maskrl.plan.memory.files_gib`), ``work`` (per phase and term: forwards, rows, scored positions, FLOPs),
        ``time`` (seconds per step: compute-bound at ``mfu``, and the weight-read bound; per run),
        ``what_to_change``.

    Raises:
        PlanError: ``prompt_length`` below 1.
    """
    if prompt_length < 1:
        raise PlanError(f"--prompt-length: must be >= 1 token, got {prompt_length}")
    cache = _cache if _cache is not None else _CACHE
    with progress.phase("the model's shape"):
        shape = shape or model_shape(cfg)
    dtype = _dtype(cfg.model.dtype)
    lora = _lora(cfg)
    ckpt = cfg.model.gradient_checkpointing
    needs_reference = cfg.objective.needs_reference or any(getattr(c, "needs_reference", False) for c in cfg.credit)
    with progress.phase("parameters and FLOP counter on the meta device"):
        fm, am, pm = _models(cache, shape, dtype, lora, ckpt, cfg.rollout)
    with progress.phase("one RL step of the recipe on the 1-layer stand-in (forwards, rows, scored positions)"):
        calls = _recorded_work(cache, cfg, prompt_length, seed, micro_batch_size, max_forward_rows, shape.vocab_size)
    with progress.phase(f"FLOPs of the step's {len(calls)} kinds of call (FlopCounterMode, meta device)"):
        merged = merges_lora(cfg, hw)
        work, total_flops, forwards = work_table(calls, fm, ckpt, merged_rollout=merged)
    with progress.phase("activation peaks (CPU profiler on narrow models of the architecture)"):
        memory = memory_gib(cfg, calls, shape, dtype, am, pm, hw, prompt_length, needs_reference, merged)
    plan = {
        "model": {**dataclasses.asdict(shape), "dtype": str(dtype).removeprefix("torch."),
                  **{k: pm[k] for k in ("params", "trainable", "base_params", "base_dtypes", "adapter_params",
                                        "adapter_dtypes")},
                  "lora": lora, "gradient_checkpointing": ckpt, "moe": active_params(shape)},
        "hardware": dataclasses.asdict(hw) | {"gpu_memory": hw.gpu_memory / GIB},
        "recipe": _recipe(cfg, prompt_length, micro_batch_size, max_forward_rows),
        "memory_gib": memory,
        "files_gib": files_gib(cfg, pm, shape),
        "work": {"by_phase_term": work, "forwards": sum(v["forwards"] for v in work.values()),
                 "flops": total_flops, "flops_per_process": total_flops,
                 "tokens_per_step": cfg.train.prompts_per_step * cfg.train.group_size * cfg.rollout.gen_length * hw.gpus},
        "time": _time(work, total_flops, forwards, pm, hw, cfg.train.steps),
        "what_to_change": [],
        "notes": list(NOTES),
    }
    if search and not memory["fits"]:
        progress.note(f"peak {memory['peak']:.2f} GiB does not fit {hw.gpu_memory / GIB:.3g} GiB: planning changes")
        plan["what_to_change"] = _search(cfg, hw, prompt_length, seed, cache, plan, shape, progress)
    return plan


def merges_lora(cfg, hw: Hardware) -> bool:
    """True when the recipe's rollout samples from a merged LoRA copy (:mod:`maskrl.models.merged`):
    LoRA, ``rollout.merge_lora``, and weights not sharded over processes (FSDP / ZeRO-3 sample through
    the peft model)."""
    return cfg.model.lora_rank > 0 and cfg.rollout.merge_lora and hw.strategy not in ("fsdp", "zero3")


#: what every plan's numbers assume (the plan's ``notes``)
NOTES = ("prompt_length is an estimate (pass --prompt-length); completions run to L tokens (no early stop, "
         "a block model's per-row early stop included: it only shortens rows)",
         "DiSPO's step term is its worst case: every branched state kept (B*G*Z rows; a run keeps only "
         "states whose Z rewards differ)",
         "DTCA's step selection is its worst case: max_steps states per sequence (a run keeps the fewest "
         "steps that cover 70 % of the step importance, at least min_steps)",
         "other data-dependent work (RLDF/DTCA's filters, the threshold schedule's steps, DiSPO's extra "
         "exact-logit forwards under a key/value cache) is that of the stand-in with random rewards")


def _models(cache: dict, shape: ModelShape, dtype: torch.dtype, lora: dict | None, ckpt: bool, sampler):
    """``(FlopModel, ActivationModel, param_memory dict)`` of one model shape, built once per process."""
    mkey = (shape, str(dtype), json.dumps(lora, sort_keys=True), ckpt)
    if ("flop", mkey) not in cache:
        cache["flop", mkey] = FlopModel(shape, dtype, lora, ckpt)
        cache["act", mkey] = ActivationModel(shape, dtype, lora, ckpt, sampler)
        cache["param", mkey] = param_memory(shape, dtype, lora)
    return cache["flop", mkey], cache["act", mkey], cache["param", mkey]


def _recorded_work(cache: dict, cfg, prompt_length: int, seed: int, micro_batch_size: int | None,
                   max_forward_rows: int | None, vocab_size: int | None = None) -> list:
    """:func:`~maskrl.plan.work.record_work` of ``cfg``, recorded once per process (keyed by the config's content)."""
    from maskrl.config import to_dict

    wkey = ("work", json.dumps(to_dict(cfg), sort_keys=True, default=str), micro_batch_size, max_forward_rows,
            prompt_length, seed, vocab_size)
    if wkey not in cache:
        cache[wkey] = record_work(cfg, prompt_length, seed, micro_batch_size, max_forward_rows, vocab_size)
    return cache[wkey]


def _recipe(cfg, prompt_length: int, micro_batch_size: int | None, max_forward_rows: int | None) -> dict:
    """The recipe's settings the plan depends on (the plan's ``recipe``)."""
    return {"prompts_per_step": cfg.train.prompts_per_step, "group_size": cfg.train.group_size,
            "inner_iterations": cfg.train.inner_iterations, "steps": cfg.train.steps,
            "gen_length": cfg.rollout.gen_length, "block_length": cfg.rollout.block_length,
            "rollout_steps": cfg.rollout.steps, "schedule": cfg.rollout.schedule, "cache": cfg.rollout.cache,
            "prompt_length": prompt_length,
            "micro_batch_size": cfg.train.micro_batch_size if micro_batch_size is None else micro_batch_size,
            "max_forward_rows": cfg.train.max_forward_rows if max_forward_rows is None else max_forward_rows}


def _time(work: dict, total_flops: int, forwards: int, pm: dict, hw: Hardware, steps: int) -> dict:
    """Seconds per step (the plan's ``time``): compute-bound at ``hw.mfu`` and weight-read bound, the slower."""
    rate = hw.tflops * 1e12 * hw.mfu
    compute_s = total_flops / rate
    weight_read_s = forwards * (pm["total_bytes"] / (hw.gpus if hw.strategy in ("fsdp", "zero3") else 1)) / hw.bandwidth
    step_s = max(compute_s, weight_read_s)
    return {"compute_seconds_per_step": compute_s, "weight_read_seconds_per_step": weight_read_s,
            "seconds_per_step": step_s, "seconds_by_phase_term": {k: v["flops"] / rate for k, v in work.items()},
            "hours_per_run": step_s * steps / 3600,
            "basis": f"{hw.tflops:g} TFLOP/s x MFU {hw.mfu:g} per GPU; every forward reads the weights once at "
                     f"{hw.bandwidth / 1e12:g} TB/s; the slower of the two"}


def _brief(p: dict, change: str) -> dict:
    return {"change": change, "peak_gib": round(p["memory_gib"]["peak"], 2), "fits": p["memory_gib"]["fits"],
            "seconds_per_step": round(p["time"]["seconds_per_step"], 2),
            "hours_per_run": round(p["time"]["hours_per_run"], 2)}


def _search(cfg, hw: Hardware, prompt_length: int, seed: int, cache: dict, base: dict,
            shape: ModelShape | None = None, progress: Progress = QUIET) -> list[dict]:
    """Changes that make the recipe fit, each with its new numbers (smallest row budget / micro-batch
    first, then checkpointing, LoRA, more processes)."""
    out = []

    def plan_of(c, h, what: str, **k):  # one changed plan, its phases reported under the change tried
        return make_plan(c, h, prompt_length, seed, False, shape=shape, _cache=cache, progress=progress.within(what), **k)

    n_seq = cfg.train.prompts_per_step * cfg.train.group_size
    theta_rows = max((v["rows"] // max(1, v["forwards"]) for k, v in base["work"]["by_phase_term"].items()
                      if k.startswith("theta/")), default=1)
    for mb in sorted({max(1, n_seq // d) for d in (2, 3, 4, 6, 8, 12, 16, 24, 48)} | {1}, reverse=True):
        if cfg.train.micro_batch_size and mb >= cfg.train.micro_batch_size:
            continue
        p = plan_of(cfg, hw, f"micro_batch_size={mb}", micro_batch_size=mb)
        if p["memory_gib"]["fits"]:
            out.append(_brief(p, f"--set train.micro_batch_size={mb}"))
            break
    budget = theta_rows
    while budget > 1:
        budget = max(1, budget // 2)
        p = plan_of(cfg, hw, f"max_forward_rows={budget}", max_forward_rows=budget)
        if p["memory_gib"]["fits"]:
            out.append(_brief(p, f"--set train.max_forward_rows={budget}"))
            break
    variants = []
    if not cfg.model.gradient_checkpointing:
        variants.append(("--set model.gradient_checkpointing=true",
                         lambda c: setattr(c, "model", dataclasses.replace(c.model, gradient_checkpointing=True))))
    if merges_lora(cfg, hw):
        variants.append(("--set rollout.merge_lora=false",
                         lambda c: setattr(c, "rollout", dataclasses.replace(c.rollout, merge_lora=False))))
    if cfg.model.lora_rank == 0:
        variants.append(("--set model.lora_rank=128 --set model.dtype=bfloat16",
                         lambda c: setattr(c, "model", dataclasses.replace(c.model, lora_rank=128, lora_alpha=64.0,
                                                                           dtype="bfloat16"))))
    for text, edit in variants:
        c = copy.deepcopy(cfg)
        edit(c)
        p = plan_of(c, hw, text)
        out.append(_brief(p, text))
    for n in (2, 4, 8):
        if n > hw.gpus:
            h2 = dataclasses.replace(hw, gpus=n, strategy="fsdp")
            p = plan_of(cfg, h2, f"{n} GPUs, fsdp")
            out.append(_brief(p, f"{n} GPUs with FSDP (configs/accelerate/fsdp.yaml)"))
            if p["memory_gib"]["fits"]:
                break
    return out


def _count(n: int) -> str:
    """``8.03 B`` / ``318.77 M`` / ``12.3 k``."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def format_plan(p: dict) -> str:
    """A short text report of :func:`make_plan`'s dict."""
    m, t, w = p["memory_gib"], p["time"], p["work"]
    hw = p["hardware"]
    mo = p["model"]
    adapter = (f" + LoRA rank {mo['lora']['rank']} adapter {_count(mo['adapter_params'])} params "
               f"({', '.join(mo['adapter_dtypes'])})" if mo["lora"] else "")
    lines = [f"model: {mo['family']} {_count(mo['base_params'])} base params ({', '.join(mo['base_dtypes'])})"
             f"{adapter}, trainable {_count(mo['trainable'])}, "
             f"checkpointing {'on' if mo['gradient_checkpointing'] else 'off'}",
             *([f"mixture of experts: {_count(mo['moe']['total'])} resident, {_count(mo['moe']['active_per_token'])} "
                f"active per token ({_count(mo['moe']['routed_experts'])} in routed experts)"] if mo.get("moe") else []),
             f"hardware: {hw['gpus']} x {hw['gpu_memory']:.3g} GiB, {hw['strategy']}, {hw['tflops']:g} TFLOP/s x MFU {hw['mfu']:g}",
             "memory per process (GiB):"]
    lines += [f"  {k:16s} {v:8.2f}" for k, v in m["static"].items()]
    if m["kv_cache"]:
        lines.append(f"  {'kv_cache':16s} {m['kv_cache']:8.2f}")
    if m.get("rollout_merged_copy"):
        lines.append(f"  {'rollout_merged_copy':16s} {m['rollout_merged_copy']:5.2f}  (rollout phase only; "
                     "--set rollout.merge_lora=false drops it)")
        lines.append(f"  {'rollout_merge_peak':16s} {m['rollout_merge_peak']:5.2f}  (while peft merges it: the copy, "
                     "float32 ΔW of the largest matrix, the cloned adapters)")
    lines += [f"  peak {k:11s} {v:8.2f}  (activations {m['activations'][k]:.2f})" for k, v in m["peak_by_phase"].items()]
    lines.append(f"  PEAK {m['peak']:.2f} GiB of {m['gpu_memory']:.3g}: {'fits' if m['fits'] else 'DOES NOT FIT'}")
    f = p["files_gib"]
    lines.append(f"outside the step: checkpoint {f['checkpoint']:.2f} GiB each (read back on resume); final export "
                 f"{f['export_disk']:.2f} GiB on disk, {f['export_host']:.2f} GiB host memory on the main process")
    lines.append("work per RL step and process:")
    for k, v in w["by_phase_term"].items():
        lines.append(f"  {k:22s} forwards {v['forwards']:6d}  rows {v['rows']:8d}  scored {v['scored_positions']:9d}  "
                     f"{v['flops'] / 1e12:11.4g} TFLOP  {t['seconds_by_phase_term'][k]:9.3g} s")
    lines.append(f"  total {w['flops'] / 1e12:.4g} TFLOP; {t['seconds_per_step']:.3g} s per step "
                 f"(compute {t['compute_seconds_per_step']:.3g} s, weight reads {t['weight_read_seconds_per_step']:.3g} s); "
                 f"{t['hours_per_run']:.3g} h for {p['recipe']['steps']} steps")
    if p["what_to_change"]:
        lines.append("what to change:")
        lines += [f"  {c['change']}: peak {c['peak_gib']} GiB ({'fits' if c['fits'] else 'does not fit'}), "
                  f"{c['seconds_per_step']} s/step, {c['hours_per_run']} h" for c in p["what_to_change"]]
    return "\n".join(lines)
