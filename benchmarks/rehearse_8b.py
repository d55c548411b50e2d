"""The 8B path rehearsed on CPU: every shipped LLaDA-8B / Dream-7B recipe at the real width and vocabulary.

    python benchmarks/rehearse_8b.py                                   # all 12 recipes, 2 blocks
    python benchmarks/rehearse_8b.py --recipes llada8b_gsm8k_diffu_grpo --layers 1,2
    python benchmarks/rehearse_8b.py --depth-series 1,2,4 --recipes llada8b_gsm8k_diffu_grpo
    python benchmarks/rehearse_8b.py --smoke                           # one recipe, one step, narrow (test suite)
    python benchmarks/rehearse_8b.py --rescore                         # plan_vs_measured again, from the records
    python benchmarks/rehearse_8b.py --recipes R --layers 1 --recount WHY  # plan and count phases again, this code
    python benchmarks/rehearse_fsdp.py                                 # one recipe under FSDP2 against 1 process

Each recipe writes one JSON record, ``results/rehearse_8b/<recipe>_L<layers>.json`` (``--out-dir``).

The model is a stand-in (:mod:`maskrl.models.standins`): LLaDA-8B-Instruct's or Dream-v0-Instruct-7B's
published config at its real width, heads, MLP, vocabulary, RoPE and ids, in the family's own checkpoint
layout, with ``--layers`` blocks instead of 32 / 28, random bf16 weights from a seed. Only lengths and
rows per step are reduced (:func:`rehearsal_overrides`: prompt as the task gives it, completion 32 tokens
in one block at the recipe's tokens per step, 1 prompt × ``--group-size`` rollouts per process, μ capped
at 2, 32 training rows); LoRA targets and rank, dtype, gradient checkpointing, likelihood, objective,
credit modules and cache are the recipe's. Rewards: ``benchmarks/rehearse_plugin.py`` (the task's
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
    the family's own layout reader (:func:`maskrl.models.standins.reference_logits`) against the live
    policy's, relative to the update's own effect on the logits; greedy completions of the live policy
    (``maskrl.evaluate.run_harness`` on the adapter), of ``maskrl eval`` on the export and of the
    lm-eval model (``maskrl.lm_eval_model``, ``generate_until``) on the same rows; the reloaded bf16
    export's weights against the live policy's, bit for bit (:func:`weight_digests`), its completions in
    the same process, and both models' completions in float32. A random stand-in's bf16 logits tie
    exactly and often, so completions of another process are judged with these (:func:`completion_faults`).
``plan``
    ``maskrl plan --gpus 2 --strategy ddp --json`` of the same shape (the stand-in's config.json).
``count`` (``--child count``)
    one process, the stand-in at the recipe's settings on synthetic prompts of exactly the plan's P
    tokens: FLOPs of the first step counted with ``FlopCounterMode`` (SDPA math backend), and the peak
    resident memory of the second step (``VmHWM`` reset through ``/proc/self/clear_refs``) minus the
    process's memory before the model was built -- what ``benchmarks/plan_check.py`` measures.

Memory of the 2-process phases: a monitor thread reads each worker's ``VmHWM`` and ``VmRSS`` from
``/proc`` every 50 ms, and at each step boundary (a new line in ``metrics.jsonl``) reads the window's
peak and resets it (``/proc/<pid>/clear_refs``), so each window -- load + step 1, step k, the last step
to exit (checkpoint, export on rank 0) -- has its own peak per process. glibc is told to ``mmap`` every
block ≥ 64 KiB (``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the resident set.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from maskrl.records import expand, write_record

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "benchmarks" / "rehearse_plugin.py"
DEFAULT_OUT = ROOT / "results" / "rehearse_8b"
GIB = 2**30
#: every shipped 8B recipe; the first three are measured first (LLaDA diffu-GRPO, DiSPO, Dream)
RECIPES = ["llada8b_gsm8k_diffu_grpo", "llada8b_sudoku_dispo_diffu_grpo", "dream7b_gsm8k_diffu_grpo",
           "dream7b_countdown_dispo_diffu_grpo", "llada8b_gsm8k_wd1", "llada8b_gsm8k_gdpo", "llada8b_countdown_spg",
           "llada8b_countdown_dispo_spg", "llada8b_gsm8k_daca_diffu_grpo", "llada8b_countdown_daca_wd1",
           "llada8b_math500_rldf", "llada8b_math500_dtca"]
GEN_LENGTH = 32
#: the smoke mode has no plan to take P from; its count runs at this prompt length
SMOKE_PROMPT_LENGTH = 32
EVAL_ROWS = 2


# ----------------------------------------------------------------------------------------------
# memory of processes from /proc
# ----------------------------------------------------------------------------------------------
def proc_status(pid: int | str = "self") -> dict[str, int]:
    """``VmHWM`` and ``VmRSS`` of a process in bytes (``{}`` when it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    out[line.split(":")[0]] = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def reset_peak(pid: int | str = "self") -> bool:
    """Reset a process's peak resident set (``VmHWM``) to its current one (Linux >= 4.0)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class WorkerMonitor(threading.Thread):
    """Peak resident memory per worker process and per window between ``metrics.jsonl`` lines.

    Workers are the descendants of ``root`` whose environment has ``RANK`` (torchrun's); each window's
    peak is the worker's ``VmHWM`` at the window's end, after which it is reset. ``windows`` is a list of
    ``{"name", "seconds", "peak_bytes": {rank: bytes}}``.
    """

    def __init__(self, root: int, metrics: Path, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.metrics, self.interval = root, metrics, interval
        self.stop = threading.Event()
        self.windows: list[dict] = []
        self.max_rss: dict[int, int] = {}
        self.start_time = time.time()

    def _workers(self) -> dict[int, int]:
        import psutil

        found = {}
        try:
            for p in psutil.Process(self.root).children(recursive=True):
                try:
                    env = p.environ()
                except (psutil.Error, OSError):
                    continue
                if "RANK" in env and "maskrl.cli" in " ".join(p.cmdline()):
                    found[int(env["RANK"])] = p.pid
        except psutil.Error:
            pass
        return found

    def _lines(self) -> int:
        try:
            return sum(1 for line in self.metrics.read_text().splitlines() if line.strip())
        except FileNotFoundError:
            return 0

    def run(self) -> None:
        workers: dict[int, int] = {}
        last: dict[int, int] = {}
        seen = self._lines()  # a resumed run's file keeps the earlier steps' lines
        t0 = time.time()
        name = f"start_to_step_{seen + 1}"
        while not self.stop.is_set():
            if len(workers) < 2:
                workers.update(self._workers())
            for rank, pid in workers.items():
                st = proc_status(pid)
                if st:
                    last[rank] = st.get("VmHWM", 0)
                    self.max_rss[rank] = max(self.max_rss.get(rank, 0), st.get("VmRSS", 0))
            n = self._lines()
            if n > seen:
                now = time.time()
                peaks = {}
                for rank, pid in workers.items():
                    peaks[rank] = proc_status(pid).get("VmHWM", last.get(rank, 0))
                    reset_peak(pid)
                    last[rank] = 0
                self.windows.append({"name": name, "seconds": now - t0, "peak_bytes": peaks})
                seen, t0 = n, now
                name = f"step_{seen + 1}"
            time.sleep(self.interval)
        self.windows.append({"name": "last_step_to_exit", "seconds": time.time() - t0, "peak_bytes": dict(last)})


# ----------------------------------------------------------------------------------------------
# recipe -> rehearsal
# ----------------------------------------------------------------------------------------------
def recipe_path(name: str) -> Path:
    return ROOT / "configs" / f"{name}.yaml"


def rehearsal_overrides(cfg, standin: Path, out_dir: Path, steps: int, group_size: int, mu_cap: int = 2,
                        train_rows: int = 32, save_every: int = 0) -> list[str]:
    """``--set`` overrides that reduce a shipped recipe to the rehearsal: the stand-in model, the
    rehearsal task, completion 32 in one block at the recipe's tokens per step, 1 prompt × G per process,
    μ ≤ ``mu_cap``; everything else (LoRA, dtype, checkpointing, likelihood, objective, credit, cache,
    micro-batching) as the recipe says."""
    r, e, t = cfg.rollout, cfg.eval, cfg.train
    steps_roll = max(1, GEN_LENGTH * r.steps // r.gen_length)
    steps_eval = max(1, GEN_LENGTH * e.steps // e.gen_length)
    return [f"model.path={standin}", f"output_dir={out_dir}", f"task.name=rehearse_{cfg.task.name}",
            f"task.train_size={train_rows}", f"task.eval_limit={EVAL_ROWS}",
            f"rollout.gen_length={GEN_LENGTH}", f"rollout.block_length={GEN_LENGTH}", f"rollout.steps={steps_roll}",
            f"eval.gen_length={GEN_LENGTH}", f"eval.block_length={GEN_LENGTH}", f"eval.steps={steps_eval}",
            "train.prompts_per_step=1", f"train.group_size={group_size}",
            f"train.inner_iterations={min(t.inner_iterations, mu_cap)}", f"train.steps={steps}",
            f"train.save_every={save_every}", "train.log_every=1", "train.eval_every=0", "train.report_to=[]"]


def load_recipe(name: str, overrides: list[str] = ()):
    from maskrl.config import load_config

    return load_config([str(recipe_path(name))], list(overrides), plugins=[str(PLUGIN)])


def _env(threads: int = 1) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MALLOC_MMAP_THRESHOLD_="65536",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


def run_cli_train(name: str, overrides: list[str], out: Path, log: Path, resume: bool | Path = False,
                  nproc: int = 2, timeout: float = 3600) -> dict:
    """One ``accelerate launch ... -m maskrl.cli train`` of the recipe, monitored (module docstring)."""
    cmd = [_bin("accelerate"), "launch", "--multi_gpu", "--num_processes", str(nproc), "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           "-m", "maskrl.cli", "train", "--config", str(recipe_path(name)), "--plugin", str(PLUGIN)]
    for o in overrides:
        cmd += ["--set", o]
    if resume:
        cmd += ["--resume"] + ([] if resume is True else [str(resume)])
    else:
        cmd += ["--overwrite"]
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(), cwd=ROOT)
        mon = WorkerMonitor(proc.pid, out / "metrics.jsonl")
        mon.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
        mon.stop.set()
        mon.join()
    return {"command": " ".join(cmd), "returncode": rc, "seconds": time.time() - t0,
            "windows": [{"name": w["name"], "seconds": round(w["seconds"], 2),
                         "peak_gib": {str(k): round(v / GIB, 3) for k, v in sorted(w["peak_bytes"].items())}}
                        for w in mon.windows],
            "peak_gib_per_rank": {str(k): round(max(w["peak_bytes"].get(k, 0) for w in mon.windows) / GIB, 3)
                                  for k in sorted({k for w in mon.windows for k in w["peak_bytes"]})},
            "max_sampled_rss_gib": {str(k): round(v / GIB, 3) for k, v in sorted(mon.max_rss.items())}}


def _tail(log: Path, n: int = 2500) -> str:
    try:
        return log.read_text()[-n:]
    except FileNotFoundError:
        return ""


def compare_checkpoints(a: Path, b: Path) -> dict:
    """Bitwise comparison of two checkpoint folders: every tensor of ``model.safetensors`` and of the
    optimizer state (``optimizer.bin``)."""
    import torch
    from safetensors import safe_open

    diff, n = [], 0
    with safe_open(a / "model.safetensors", framework="pt") as fa, safe_open(b / "model.safetensors", framework="pt") as fb:
        ka, kb = set(fa.keys()), set(fb.keys())
        for k in sorted(ka & kb):
            if "lora_" not in k:  # frozen base weights: equal by construction, and 2.9 GB to compare
                continue
            n += 1
            ta, tb = fa.get_tensor(k), fb.get_tensor(k)
            if not torch.equal(ta, tb):
                diff.append({"tensor": k, "max_abs_diff": float((ta.float() - tb.float()).abs().max())})
    oa = torch.load(a / "optimizer.bin", map_location="cpu", weights_only=True)
    ob = torch.load(b / "optimizer.bin", map_location="cpu", weights_only=True)
    odiff = 0
    for pid, st in oa["state"].items():
        for key, v in st.items():
            w = ob["state"].get(pid, {}).get(key)
            if isinstance(v, torch.Tensor) and (w is None or not torch.equal(v, w)):
                odiff += 1
    return {"lora_tensors": n, "lora_tensors_different": len(diff), "first_differences": diff[:5],
            "keys_only_in_one": sorted(ka ^ kb)[:5], "optimizer_tensors_different": odiff,
            "equal": not diff and not (ka ^ kb) and odiff == 0}


def _metrics(path: Path) -> dict[int, dict]:
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            m = json.loads(line)
            rows[int(m["step"])] = m
    return rows


def compare_metrics(a: Path, b: Path, step: int) -> dict:
    ma, mb = _metrics(a).get(step, {}), _metrics(b).get(step, {})
    skip = ("seconds", "rollout_seconds")
    keys = sorted((set(ma) | set(mb)) - set(skip))
    diff = {k: [ma.get(k), mb.get(k)] for k in keys if ma.get(k) != mb.get(k)}
    return {"step": step, "equal": not diff and bool(ma), "different": diff}


# ----------------------------------------------------------------------------------------------
# children
# ----------------------------------------------------------------------------------------------
def _lora_state(ckpt: Path) -> dict:
    from safetensors import safe_open

    with safe_open(ckpt / "model.safetensors", framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if "lora_" in k}


def weight_digests(model) -> dict[str, str]:
    """``{name: "dtype sha256"}`` of every parameter and buffer of a model, names as in the base model (peft's
    ``base_model.model.`` and ``.base_layer`` taken out): two models with equal digests compute bit for bit
    the same forward under the same kernels."""
    import hashlib

    import torch

    out = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        key = name.replace("base_model.model.", "").replace(".base_layer", "")
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
        out[key] = f"{str(t.dtype).removeprefix('torch.')} {hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]}"
    return out


def child_checks(recipe: str, overrides: list[str], run_dir: Path, eval_dir: Path) -> dict:
    """The live policy against its export (module docstring, ``checks``)."""
    import gc

    import torch

    from maskrl.config import to_dict
    from maskrl.evaluate import run_harness
    from maskrl.models import load
    from maskrl.models.loading import llada_to_checkpoint
    from maskrl.models.standins import read_tensors, reference_logits
    from maskrl.pipeline import load_policy, read_prompt_card
    from maskrl.trainer import latest_checkpoint

    torch.set_num_threads(2)
    cfg = load_recipe(recipe, overrides)
    export = run_dir / "model"
    base_dir = Path(cfg.model.path)
    ckpt = latest_checkpoint(run_dir)
    out: dict = {"checkpoint": str(ckpt), "export": str(export)}
    t0 = time.time()

    # ---- the live policy: the run's own construction, LoRA tensors of its last checkpoint
    live = load_policy(cfg)
    state = _lora_state(ckpt)
    # a fresh construction of the same config draws LoRA's A matrices again: with a seeded init they equal the
    # run's own up to its few small updates (lr ~1e-6 for 3 steps), otherwise they are another random draw
    fresh = {k: v for k, v in live.model.state_dict().items() if "lora_A" in k}
    drift = max(float((fresh[k].float() - state[k].float()).abs().max()) for k in fresh if k in state)
    out["lora_init"] = {"max_abs_diff_fresh_vs_run": drift, "reproducible": drift < 1e-3}
    result = live.model.load_state_dict(state, strict=False)
    out["live_lora_tensors_loaded"] = len(state) - len(result.unexpected_keys)
    live.model.eval()
    family = live.family
    lora_cfg = live.model.peft_config["default"]
    scale = lora_cfg.lora_alpha / lora_cfg.r

    # ---- weights: exported update vs the adapter's own scale * B A
    per = {}
    names = sorted({k.split(".lora_")[0] for k in state})
    for mod in names:
        a = state[f"{mod}.lora_A.default.weight"].float()  # float32: bf16 differences are exact in it
        b = state[f"{mod}.lora_B.default.weight"].float()
        native = mod.removeprefix("base_model.model.") + ".weight"
        ck = llada_to_checkpoint(native) if family == "llada" else native
        w_base = read_tensors(base_dir, [ck])[ck]
        w_exp = read_tensors(export, [ck])[ck]
        dtype = str(w_exp.dtype).removeprefix("torch.")
        same = float((w_exp.float() == w_base.float()).float().mean())
        got = w_exp.float().sub_(w_base.float())
        del w_exp, w_base
        delta = (b @ a).mul_(scale)
        dn = float(delta.norm())
        per[ck] = {"update_norm": dn, "rel_error": float(got.sub_(delta).norm()) / dn if dn > 0 else None,
                   "equal_to_base_frac": same, "export_dtype": dtype}
        del got, delta
    errs = [v["rel_error"] for v in per.values() if v["rel_error"] is not None]
    out["export_weights"] = {
        "matrices": len(per), "lora_scale": scale,
        "max_update_norm": max(v["update_norm"] for v in per.values()) if per else 0.0,
        "median_rel_error": sorted(errs)[len(errs) // 2] if errs else None, "max_rel_error": max(errs) if errs else None,
        "mean_equal_to_base_frac": sum(v["equal_to_base_frac"] for v in per.values()) / max(1, len(per)),
        "export_dtypes": sorted({v["export_dtype"] for v in per.values()}),
        "per_matrix": dict(list(per.items())[:4])}
    out["export_weights"]["carries_update"] = bool(errs) and max(errs) < 0.05

    # ---- logits on a few real prompts: live, live with adapters off (the base), export (two readers)
    from maskrl.pipeline import prompt_formatter, task_and_data
    from maskrl.text import encode_prompts

    task, held_out, _, train = task_and_data(cfg)
    fmt = prompt_formatter(live, cfg.model.chat_template)
    prompt = fmt(train[0].prompt)
    ids, _ = encode_prompts(live.tokenizer, [prompt])
    ids = torch.cat([ids, torch.full((1, 8), live.mask_id)], 1)  # 8 masked positions, as in a rollout
    with torch.no_grad():
        l_live = live.logits(ids).float()
        with live.reference() as ref:
            l_base = ref.logits(ids).float()
    out["prompt_tokens_row0"] = int(ids.shape[1] - 8)

    # ---- greedy completions of the live policy on the eval rows (maskrl eval's code, the adapter), in the
    # recipe's dtype and, as the tie-free control, with every weight in float32
    card = read_prompt_card(export)
    from maskrl.evaluate import RULE_FIELDS

    def completions(folder: Path) -> list[str]:
        f = sorted(folder.glob("samples_L*.jsonl"))
        return [json.loads(x)["completion"] for x in f[0].read_text().splitlines() if x.strip()] if f else []

    def complete_rows(model, name: str) -> list[str]:
        run_harness(model=model, task_name=task.name, limit=EVAL_ROWS, out_dir=eval_dir.parent / name,
                    batch_size=EVAL_ROWS, progress=False, overwrite=True,
                    gen_lengths=card["eval_sampler"]["gen_length"], block_length=card["eval_sampler"]["block_length"],
                    steps=card["eval_sampler"]["steps"], chat_template=card["chat_template"],
                    rule={k: v for k, v in card["eval_sampler"].items() if k in RULE_FIELDS})
        return completions(eval_dir.parent / name)

    c_live = complete_rows(live, "eval_live")
    d_live = weight_digests(live.model)
    live.model.float()
    c_live32 = complete_rows(live, "eval_live_f32")
    del live, state, ref
    gc.collect()
    c_cli = completions(eval_dir)

    exp = load(export, dtype=cfg.model.dtype)
    d_exp = weight_digests(exp.model)
    with torch.no_grad():
        l_exp = exp.logits(ids).float()
    c_exp = complete_rows(exp, "eval_export_inproc")
    del exp
    gc.collect()
    exp32 = load(export, dtype=torch.float32)
    c_exp32 = complete_rows(exp32, "eval_export_f32")
    del exp32
    gc.collect()
    differ = sorted(k for k in d_live.keys() | d_exp.keys() if d_live.get(k) != d_exp.get(k))
    out["reloaded_weights"] = {"tensors": len(d_live), "bit_equal": not differ, "differ": differ[:8],
                               "n_differ": len(differ), "threads": torch.get_num_threads()}
    ref_l = reference_logits(export, ids)
    lo = 1 if family == "dream" else 0  # Dream's position 0 has no aligned logit
    effect = float((l_live - l_base)[:, lo:].abs().max())
    out["logits"] = {
        "update_effect_max_abs": effect,
        "export_vs_live_max_abs": float((l_exp - l_live)[:, lo:].abs().max()),
        "export_vs_base_max_abs": float((l_exp - l_base)[:, lo:].abs().max()),
        "layout_reader_vs_maskrl_load_max_abs": float((ref_l - l_exp)[:, lo:].abs().max()),
        "logit_scale_max_abs": float(l_live[:, lo:].abs().max()),
        "positions": int(ids.shape[1] - lo)}
    out["logits"]["export_error_over_update_effect"] = (out["logits"]["export_vs_live_max_abs"] / effect
                                                       if effect > 0 else None)

    # ---- lm-eval's model on the same rows
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    import maskrl.lm_eval_model  # noqa: F401  (registers "maskrl")

    lm = get_model("maskrl")(pretrained=str(export), dtype=str(cfg.model.dtype), batch_size=EVAL_ROWS)
    reqs = [Instance("generate_until", {}, (ex.prompt, {"until": []}), i) for i, ex in enumerate(held_out[:EVAL_ROWS])]
    lm_out = lm.generate_until(reqs)
    del lm
    gc.collect()
    out["completions"] = {"rows": len(c_live), "live": c_live, "maskrl_eval_export": c_cli, "lm_eval_export": lm_out,
                          "export_in_process": c_exp, "live_float32": c_live32, "export_float32": c_exp32,
                          "maskrl_eval_equal_live": c_cli == c_live, "lm_eval_equal_live": lm_out == c_live,
                          "in_process_equal_live": c_exp == c_live, "float32_equal": c_exp32 == c_live32,
                          "eval_sampler": card["eval_sampler"]}
    out["seconds"] = time.time() - t0
    out["peak_rss_gib"] = proc_status().get("VmHWM", 0) / GIB
    out["config_model"] = to_dict(cfg)["model"]
    return out


def _exact_prompt(tokenizer, n: int) -> str:
    """A text that tokenises to exactly ``n`` tokens (bos included) with this tokenizer."""
    from maskrl.text import encode_prompts

    for ch in "~^`|@#$&_":
        for k in range(max(1, n - 2), n + 2):
            text = ch * k
            if encode_prompts(tokenizer, [text])[0].shape[1] == n:
                return text
    raise RuntimeError(f"no text of exactly {n} tokens found for this tokenizer")


def child_count(recipe: str, overrides: list[str], prompt_length: int) -> dict:
    """Counted FLOPs of one step and measured peak of the next (module docstring, ``count``)."""
    import dataclasses
    import gc

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from maskrl.pipeline import load_policy
    from maskrl.plan import spread_rewards, synthetic_trainer
    from maskrl.tasks.base import Example, Task
    from maskrl.trainer import RLTrainer

    torch.set_num_threads(2)
    cfg = load_recipe(recipe, overrides)
    # as the plan counts it: each credit module at its worst case (CreditModule.for_planning: DiSPO keeps every
    # branched state, DTCA max_steps states a sequence)
    cfg.credit = [m.for_planning() for m in cfg.credit]
    cfg.output_dir = "/nonexistent-rehearsal-count"
    warm = load_recipe(recipe, [])
    from maskrl.plan import standin_config

    t = synthetic_trainer(standin_config(warm), 8)
    t.step()  # imports, kernels, optimizer code paths
    del t
    gc.collect()
    base = proc_status()["VmRSS"]
    policy = load_policy(cfg)
    policy = dataclasses.replace(policy, eos_id=-1, stop_ids=())  # no early stop: every completion L long
    gen = torch.Generator().manual_seed(0)

    class _Synthetic(Task):
        name = "rehearsal_synthetic"

        def reward(self, prompts, completions, **_):  # every group trains, as the plan assumes
            return spread_rewards(len(completions), cfg.train.group_size, gen)

    text = _exact_prompt(policy.tokenizer, prompt_length)
    trainer = RLTrainer(cfg, policy, _Synthetic(), [Example(id=i, prompt=text) for i in range(cfg.train.prompts_per_step)])
    lazy = proc_status()["VmRSS"] - base
    # the loader's tensors are views of the memory-mapped safetensors files: a page becomes resident only when
    # read (an embedding row no prompt uses never is). The plan counts every weight, as a GPU holds them, so
    # every parameter is read once here (2 processes under DDP read them all anyway: rank 0 broadcasts them).
    with torch.no_grad():
        for prm in policy.model.parameters():
            prm.sum()  # reads every page, allocates nothing large
    after_load = proc_status()["VmRSS"] - base
    t0 = time.time()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        trainer.step()
    first_s = time.time() - t0
    gc.collect()
    reset_peak()
    t0 = time.time()
    trainer.step()
    second_s = time.time() - t0
    peak = proc_status()["VmHWM"] - base
    return {"prompt_length": prompt_length, "measured_flops": int(fc.get_total_flops()),
            "measured_peak_gib": peak / GIB, "base_rss_gib": base / GIB, "after_load_gib": after_load / GIB,
            "after_load_untouched_gib": lazy / GIB,
            "rss_after_step_gib": (proc_status()["VmRSS"] - base) / GIB,
            "first_step_seconds": first_s, "second_step_seconds": second_s}


def _run_child(kind: str, args: list[str], log: Path, timeout: float = 3600) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, *args]
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=fh, stdin=subprocess.DEVNULL, text=True, env=_env(2),
                           cwd=ROOT, timeout=timeout)
    if p.returncode:
        return {"error": f"child {kind} exited {p.returncode}", "log_tail": _tail(log)}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["wall_seconds"] = time.time() - t0
    return res


def run_plan(recipe: str, overrides: list[str], log: Path, gpus: int, strategy: str, prompt_length: int | None,
             out_json: Path) -> dict:
    cmd = [_bin("maskrl"), "plan", "--config", str(recipe_path(recipe)), "--plugin", str(PLUGIN),
           "--gpus", str(gpus), "--strategy", strategy, "--gpu-memory", "1000GB", "--no-search", "--json", str(out_json)]
    if prompt_length:
        cmd += ["--prompt-length", str(prompt_length)]
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        p = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(2), cwd=ROOT)
    if p.returncode:
        return {"error": f"maskrl plan exited {p.returncode}", "log_tail": _tail(log)}
    plan = json.loads(out_json.read_text())
    plan["wall_seconds"] = time.time() - t0
    return plan


# ----------------------------------------------------------------------------------------------
# one recipe
# ----------------------------------------------------------------------------------------------
def standin_corpus(limit: int = 2000) -> list[str]:
    """Prompts of the 8B recipes' tasks (for the stand-in tokenizer's BPE): GSM8K and MATH-500 rows when
    the data are here, generated Countdown and Sudoku puzzles."""
    from maskrl.tasks import get_task

    texts = []
    for name in ("gsm8k", "math500"):
        try:
            task = get_task(name)
            rows = task.train_split() if hasattr(task, "train_split") else task.load()
            texts += [ex.prompt for ex in rows[:limit]]
        except (FileNotFoundError, OSError, ValueError):
            pass
    for name in ("countdown", "sudoku4x4"):
        texts += [ex.prompt for ex in get_task(name).generate(200, seed=12345)]
    return texts


def ensure_standin(work: Path, family: str, layers: int, width_divisor: int, seed: int = 0,
                   corpus_rows: int = 2000) -> Path:
    from maskrl.models.standins import write_standin

    folder = work / "standins" / (f"{family}_L{layers}_w{width_divisor}_s{seed}" + ("" if corpus_rows == 2000 else
                                                                                     f"_c{corpus_rows}"))
    if not (folder / "config.json").is_file():
        t0 = time.time()
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write_standin(tmp, family, layers, seed=seed, corpus=standin_corpus(corpus_rows), width_divisor=width_divisor)
        tmp.rename(folder)
        print(f"  wrote stand-in {folder} in {time.time() - t0:.0f} s", flush=True)
    return folder


def rehearse(recipe: str, layers: int, args) -> dict:
    """Every phase of one recipe (module docstring); returns the JSON record."""
    import platform

    import torch

    from maskrl.config import to_dict
    from maskrl.pipeline import task_and_data

    shipped = load_recipe(recipe)
    family = "dream" if shipped.model.path.startswith("Dream") else "llada"
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

    ov_a = rehearsal_overrides(shipped, standin, work / "a", steps, args.group_size, save_every=0 if args.smoke else 2)
    cfg = load_recipe(recipe, ov_a)
    rec["rehearsal_config"] = {k: to_dict(cfg)[k] for k in ("model", "rollout", "eval", "train", "objective",
                                                             "likelihood", "credit")}
    rec["overrides"] = ov_a
    rec["reduced"] = {"rollout.gen_length": f"{shipped.rollout.gen_length} -> {GEN_LENGTH}",
                      "train.prompts_per_step": f"{shipped.train.prompts_per_step} -> 1",
                      "train.group_size": f"{shipped.train.group_size} -> {args.group_size}",
                      "train.inner_iterations": f"{shipped.train.inner_iterations} -> {cfg.train.inner_iterations}",
                      "layers": f"{32 if family == 'llada' else 28} -> {layers}"}

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


def completion_faults(checks: dict) -> list[str]:
    """Faults of the live-vs-export comparison of ``checks`` (:func:`child_checks`).

    The stand-in is random, so its bf16 logits over 126k / 152k ids are flat (scale ~6, a bf16 step 1/32
    there) and a greedy decision is often an exact tie between bf16 logits: another kernel order (another
    process, thread count or CPU) flips it. Completions of another process (``maskrl eval``, lm-eval) that
    differ in bf16 are therefore a fault only unless three things show the export is the live policy: the
    reloaded bf16 weights are bit-equal to the live policy's, the export's completions in the same process
    equal the live policy's, and both in float32 (no ties at that precision) agree. Otherwise each
    failed condition is a fault of its own."""
    cm, rw = checks["completions"], checks.get("reloaded_weights")
    faults = []
    if rw is not None and not rw["bit_equal"]:
        faults.append(f"export: the reloaded {rw['n_differ']} of {rw['tensors']} tensors differ from the live policy's "
                      f"bits ({', '.join(rw['differ'][:4])})")
    if "in_process_equal_live" in cm and not cm["in_process_equal_live"]:
        faults.append("eval: the export's completions in the live policy's process differ from the live policy's")
    if "float32_equal" in cm and not cm["float32_equal"]:
        faults.append("eval: the export's float32 completions differ from the live policy's in float32")
    if rw is not None and not faults:  # the export is shown to be the live policy
        return []
    return faults + [f"{phase}: {who}'s completions on the export differ from the live policy's"
                     for key, phase, who in (("maskrl_eval_equal_live", "eval", "maskrl eval"),
                                             ("lm_eval_equal_live", "lm-eval", "the lm-eval model")) if not cm[key]]


def _plan_summary(plan: dict) -> dict:
    if "error" in plan:
        return plan
    m = plan["memory_gib"]
    return {"prompt_length": plan["recipe"]["prompt_length"], "prompt_length_source": plan["recipe"].get("prompt_length_source"),
            "static_gib": m["static"], "static_total_gib": m["static_total"], "activations_gib": m["activations"],
            "peak_by_phase_gib": m["peak_by_phase"], "peak_gib": m["peak"], "flops": plan["work"]["flops"],
            "forwards": plan["work"]["forwards"], "params": plan["model"]["params"],
            "trainable": plan["model"]["trainable"], "files_gib": plan.get("files_gib"),
            "wall_seconds": plan.get("wall_seconds")}


def _code_commit() -> dict:
    """The checkout's commit and whether ``src/`` or ``benchmarks/`` differ from it."""
    def git(*a):
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--", "src", "benchmarks"))}


def written_files(run: Path) -> dict:
    """Bytes of what run_a wrote: its last checkpoint's weights and optimizer files, and the export's
    safetensors (the merged weights and ``adapter/``), with the rank-0-only memory of the last window
    (rank 0 minus rank 1: the export and the trainer state are written by the main process only)."""
    ckpts = sorted((run / "checkpoints").glob("step_*"), key=lambda d: int(d.name.split("_")[1]))
    out: dict = {}
    if ckpts:
        last = ckpts[-1]
        out["checkpoint"] = {"folder": last.name, "weights_bytes": sum(f.stat().st_size for f in last.glob("model*.safetensors")),
                             "optimizer_bytes": sum(f.stat().st_size for f in last.glob("optimizer*.bin"))}
    if (run / "model").is_dir():
        out["export_bytes"] = sum(f.stat().st_size for f in (run / "model").rglob("*.safetensors"))
    return out


def plan_faults(rec: dict) -> list[str]:
    """The faults ``plan_vs_measured`` shows: an entry with ``within_15pct`` false, a rank whose measured
    peak is more than 15 % above the plan (``bound`` false), FLOPs planned other than counted."""
    out = []
    for k, v in rec.get("plan_vs_measured", {}).items():
        if isinstance(v, dict) and (v.get("within_15pct") is False or v.get("bound") is False):
            out.append(f"plan: {k} off by {100 * v['error']:+.1f} % (plan {v['plan_gib']:.3f} GiB, measured "
                       f"{v['measured_gib']:.3f} GiB)")
    one = rec.get("plan_vs_measured", {}).get("one_process_step", {})
    if "flops_plan" in one and not one["flops_equal"]:
        out.append(f"plan: FLOPs {one['flops_plan']:.6g} planned vs {one['flops_counted']:.6g} counted")
    return out


def rescore(folder: Path) -> list[Path]:
    """Recompute ``plan_vs_measured`` and its faults of every finished record in ``folder`` from the record's
    own phases (:func:`plan_vs_measured`, :func:`plan_faults`), keep its other faults, and say so in
    ``rescored`` (this checkout's commit). Returns the records rewritten."""
    done = []
    for f in sorted(folder.glob("*_L*.json")):
        rec = json.loads(f.read_text())
        if rec.get("benchmark") != "rehearse_8b" or "plan_vs_measured" not in rec:
            continue
        pvm = plan_vs_measured(rec, rec["phases"].get("plan", {}).get("files_gib"))
        faults = [x for x in rec["faults"] if not x.startswith("plan: ")]
        new = dict(rec, plan_vs_measured=pvm)
        new["faults"] = faults + plan_faults(new)
        if new != rec:
            new["rescored"] = {"by": _code_commit(), "why": "plan_vs_measured recomputed from the record's phases: "
                               "the 15 % check on the 2-process peak is on the largest rank (the plan is each "
                               "process's peak at the longest prompt); each rank is checked not to exceed it"}
            write_record(f, new)
            done.append(f)
    return done


def recount(record: Path, args, why: str) -> dict:
    """Run a finished record's ``plan`` and ``count`` phases again with this checkout's code (same recipe,
    overrides and prompt length; the stand-in rebuilt in ``args.work`` if it is gone), replace them in the
    record, recompute ``plan_vs_measured`` and its faults, and say so in ``recounted`` (commit, date,
    ``why``). The 2-process phases are kept: their windows are compared with the new plan."""
    rec = json.loads(record.read_text())
    family, layers = rec["family"], rec["layers"]
    standin = ensure_standin(Path(args.work), family, layers, rec.get("width_divisor", 1))
    ov = [f"model.path={standin}" if o.startswith("model.path=") else o for o in expand(rec["overrides"], args.work)]
    work = Path(args.work) / f"{rec['recipe']}_L{layers}_recount"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    P = rec["phases"]["plan"]["prompt_length"]
    before = {"plan_peak_gib": rec["phases"]["plan"].get("peak_gib"),
              "count_peak_gib": rec["phases"].get("count", {}).get("measured_peak_gib")}
    print("  plan (again)", flush=True)
    rec["phases"]["plan"] = _plan_summary(run_plan(rec["recipe"], ov, log, 2, "ddp", P, work / "plan_ddp2.json"))
    print(f"  count (again, 1 process, P={P})", flush=True)
    rec["phases"]["count"] = _run_child("count", ["--recipe", rec["recipe"], "--overrides-json", json.dumps(ov),
                                                  "--prompt-length", str(P)], log)
    (work / "phases.json").write_text(json.dumps({k: rec["phases"][k] for k in ("plan", "count")}, default=str))
    rec["faults"] = [f for f in rec["faults"] if not f.startswith(("plan: ", "count: "))]
    for k in ("plan", "count"):
        if "error" in rec["phases"][k]:
            rec["faults"].append(f"{k}: {rec['phases'][k]['error']} (log: {log})")
    rec["plan_vs_measured"] = plan_vs_measured(rec, rec["phases"]["plan"].get("files_gib"))
    rec["faults"] += plan_faults(rec)
    rec.setdefault("recounted", []).append({"by": _code_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                            "why": why, "before": before})
    record.write_text(json.dumps(rec, indent=2, default=str) + "\n")
    return rec


def plan_vs_measured(rec: dict, files_gib: dict | None = None) -> dict:
    """The plan's per-process peak beside the measurements: the 1-process step (``count``, the plan without
    DDP's gradient buckets, at exactly the plan's prompt length) and the 2-process run's step windows
    (worker ``VmHWM`` minus the count process's memory before the model was built). The plan is each
    process's peak at the longest training prompt (its ``P``); a rank that drew only shorter prompts peaks
    lower, so the 15 % check is on the largest rank (``two_process_steps_2_3``), and each rank only has to
    stay under the plan (``bound``: at most 15 % above it)."""
    ph = rec["phases"]
    plan = ph.get("plan", {})
    if "peak_gib" not in plan:
        return {}
    out: dict = {}
    single = plan["peak_gib"] - plan["static_gib"].get("ddp_buckets", 0.0)
    cnt = ph.get("count", {})
    if "measured_peak_gib" in cnt:
        out["one_process_step"] = _err(single, cnt["measured_peak_gib"])
        out["one_process_step"]["flops_plan"] = plan["flops"]
        out["one_process_step"]["flops_counted"] = cnt["measured_flops"]
        out["one_process_step"]["flops_equal"] = plan["flops"] == cnt["measured_flops"]
    base = cnt.get("base_rss_gib")
    run = ph.get("run_a", {})
    if base and run.get("windows"):
        steps = [w for w in run["windows"] if w["name"].startswith("step_")]
        if steps:
            worst = 0.0
            for rank in sorted(steps[-1]["peak_gib"]):
                measured = max(w["peak_gib"].get(rank, 0) for w in steps) - base
                e = _err(plan["peak_gib"], measured)
                e["bound"] = e.pop("within_15pct") is not None and e["error"] >= -0.15
                out[f"two_process_rank{rank}_steps_2_3"] = e
                worst = max(worst, measured)
            out["two_process_steps_2_3"] = _err(plan["peak_gib"], worst)
    files = ph.get("files", {})
    if files_gib and "checkpoint" in files:
        c = files["checkpoint"]
        out["checkpoint_size"] = _err(files_gib["checkpoint"], (c["weights_bytes"] + c["optimizer_bytes"]) / GIB)
    if files_gib and "export_bytes" in files:
        out["export_size"] = _err(files_gib["export_disk"], files["export_bytes"] / GIB)
    last = [w for w in run.get("windows", []) if w["name"] == "last_step_to_exit"]
    if files_gib and last and {"0", "1"} <= set(last[0]["peak_gib"]):
        extra = last[0]["peak_gib"]["0"] - last[0]["peak_gib"]["1"]  # reported, not a fault: merge temporaries vary
        out["export_host_rank0_extra"] = {"plan_gib": files_gib["export_host"], "measured_gib": extra}
    return out


def _err(plan_gib: float, measured_gib: float) -> dict:
    e = plan_gib / measured_gib - 1 if measured_gib > 0 else None
    return {"plan_gib": plan_gib, "measured_gib": measured_gib, "error": e,
            "within_15pct": None if e is None else abs(e) <= 0.15}


def depth_series(recipe: str, depths: list[int], args) -> dict:
    """``count`` and ``plan`` at several depths (1 process): the per-block growth of the measured peak and
    its extrapolation to the published depth, beside the plan's."""
    shipped = load_recipe(recipe)
    family = "dream" if shipped.model.path.startswith("Dream") else "llada"
    full = 32 if family == "llada" else 28
    work = Path(args.work) / f"series_{recipe}"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    rows = []
    for n in depths:
        standin = ensure_standin(Path(args.work), family, n, args.width_divisor)
        ov = rehearsal_overrides(shipped, standin, work / f"L{n}", 1, args.group_size)
        plan = run_plan(recipe, ov, log, 1, "single", None, work / f"plan_L{n}.json")
        P = plan["recipe"]["prompt_length"]
        cnt = _run_child("count", ["--recipe", recipe, "--overrides-json", json.dumps(ov), "--prompt-length", str(P)], log)
        row = {"layers": n, "plan_peak_gib": plan["memory_gib"]["peak"], "plan_flops": plan["work"]["flops"],
               "count": cnt}
        if "measured_peak_gib" in cnt:
            row |= _err(plan["memory_gib"]["peak"], cnt["measured_peak_gib"])
        rows.append(row)
        print(f"  depth {n}: plan {row['plan_peak_gib']:.3f} GiB, measured {cnt.get('measured_peak_gib', float('nan')):.3f} GiB",
              flush=True)
    out = {"benchmark": "rehearse_8b_depth_series", "recipe": recipe, "family": family, "rows": rows,
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    ok = [r for r in rows if "measured_gib" in r]
    if len(ok) >= 2:
        (a, b) = ok[0], ok[1]
        per = (b["measured_gib"] - a["measured_gib"]) / (b["layers"] - a["layers"])
        fixed = a["measured_gib"] - per * a["layers"]
        out["fit_from_first_two"] = {"per_block_gib": per, "fixed_gib": fixed,
                                     f"extrapolated_{full}_blocks_gib": fixed + per * full}
        for r in ok[2:]:
            pred = fixed + per * r["layers"]
            r["extrapolated_from_first_two_gib"] = pred
            r["extrapolation_error"] = pred / r["measured_gib"] - 1
        # the plan at the published depth, same reduced lengths and rows
        plan_full = run_plan(recipe, [o if not o.startswith("model.path=") else
                                      f"model.path={'GSAI-ML/LLaDA-8B-Instruct' if family == 'llada' else 'Dream-org/Dream-v0-Instruct-7B'}"
                                      for o in rehearsal_overrides(shipped, Path("x"), work / "full", 1, args.group_size)],
                             log, 1, "single", rows[0]["count"].get("prompt_length"), work / "plan_full.json")
        if "memory_gib" in plan_full:
            out["plan_published_depth_gib"] = plan_full["memory_gib"]["peak"]
            out["extrapolated_vs_plan_published_depth"] = out["fit_from_first_two"][f"extrapolated_{full}_blocks_gib"] / plan_full["memory_gib"]["peak"] - 1
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", default="all", help="comma-separated recipe names (default: all 12)")
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
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--recipe", help=argparse.SUPPRESS)
    p.add_argument("--overrides-json", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--eval-dir", help=argparse.SUPPRESS)
    p.add_argument("--prompt-length", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        ov = json.loads(args.overrides_json)
        if args.child == "checks":
            res = child_checks(args.recipe, ov, Path(args.run_dir), Path(args.eval_dir))
        else:
            res = child_count(args.recipe, ov, args.prompt_length)
        print(json.dumps(res, default=str))
        return 0
    if args.rescore:
        for f in rescore(Path(args.out_dir)):
            print(f"rescored {f}")
        return 0
    names = RECIPES if args.recipes == "all" else [r.strip() for r in args.recipes.split(",") if r.strip()]
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
