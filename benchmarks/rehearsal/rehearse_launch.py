"""The 8B rehearsal's recipes and processes (:mod:`rehearse_8b`): the shipped recipes reduced to the
rehearsal's lengths and rows, the stand-in model, ``maskrl train`` / ``maskrl plan`` launched as fresh
processes, a child phase of the rehearsal run in its own process, and bit-for-bit comparisons of two
runs' checkpoints and metrics."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from rehearse_memory import KERNEL_CACHES_OFF, WorkerMonitor

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "benchmarks" / "rehearsal" / "rehearse_plugin.py"
#: the rehearsal's command line, which the children (``--child``) run in
SCRIPT = Path(__file__).resolve().parent / "rehearse_8b.py"
DEFAULT_OUT = ROOT / "results" / "rehearse_8b"
GIB = 2**30
#: every shipped 8B recipe; the first three are measured first (LLaDA diffu-GRPO, DiSPO, Dream)
RECIPES = ["llada8b_gsm8k_diffu_grpo", "llada8b_sudoku_dispo_diffu_grpo", "dream7b_gsm8k_diffu_grpo",
           "dream7b_countdown_dispo_diffu_grpo", "llada8b_gsm8k_wd1", "llada8b_gsm8k_gdpo", "llada8b_countdown_spg",
           "llada8b_countdown_dispo_spg", "llada8b_gsm8k_daca_diffu_grpo", "llada8b_countdown_daca_wd1",
           "llada8b_math500_rldf", "llada8b_math500_dtca"]
#: the block-diffusion recipes (SDAR-8B / TraDo-8B, the ``sdar`` stand-in); ``--recipes block`` names them
BLOCK_RECIPES = ["sdar8b_math500_tracerl", "trado8b_sudoku_dispo_diffu_grpo", "trado8b_math500_tracerl"]
#: blocks of each family's published model, which a stand-in reduces to ``--layers``
PUBLISHED_LAYERS = {"llada": 32, "dream": 28, "sdar": 36, "llada2": 20}
#: the block-diffusion families (their recipes keep their block and steps per block)
BLOCK_FAMILIES = ("sdar", "llada2")
#: the LLaDA2 recipes (LLaDA2.0-mini's stand-in: 8 experts, 4,608-row vocabulary; ``--recipes llada2`` names them)
LLADA2_RECIPES = ["llada2_mini_gsm8k_diffu_grpo", "llada2_mini_gsm8k_ebpo", "llada2_mini_countdown_dispo_diffu_grpo"]
GEN_LENGTH = 32
#: the smoke mode has no plan to take P from; its count runs at this prompt length
SMOKE_PROMPT_LENGTH = 32
EVAL_ROWS = 2


def recipe_path(name: str) -> Path:
    return ROOT / "configs" / f"{name}.yaml"


def standin_family(cfg) -> str:
    """The stand-in family of a shipped recipe: ``llada``, ``dream``, ``sdar`` (SDAR / TraDo) or ``llada2``, from the
    planner's shape of its ``model.path`` (:func:`maskrl.plan.shapes.model_shape`)."""
    from maskrl.plan.shapes import model_shape

    fam = model_shape(cfg).family
    if fam not in PUBLISHED_LAYERS:
        raise ValueError(f"model.path {cfg.model.path!r}: family {fam!r} has no real-width stand-in "
                         f"(maskrl.models.standins: {', '.join(PUBLISHED_LAYERS)})")
    return fam


def _reduced_block(s, block_model: bool) -> tuple[int, int]:
    """``(block_length, steps)`` of a sampler section reduced to :data:`GEN_LENGTH` tokens: a full-attention
    model decodes them as one block; a block-diffusion model keeps the recipe's block (its own block size)
    and its steps per block, so 32 tokens are ``32 / block`` blocks."""
    if not block_model:
        return GEN_LENGTH, max(1, GEN_LENGTH * s.steps // s.gen_length)
    if GEN_LENGTH % s.block_length or s.gen_length % s.block_length:
        raise ValueError(f"block_length {s.block_length} divides neither {GEN_LENGTH} nor gen_length {s.gen_length}")
    per_block = max(1, s.steps // (s.gen_length // s.block_length))
    return s.block_length, per_block * (GEN_LENGTH // s.block_length)


def rehearsal_overrides(cfg, standin: Path, out_dir: Path, steps: int, group_size: int, mu_cap: int = 2,
                        train_rows: int = 32, save_every: int = 0, block_model: bool = False) -> list[str]:
    """``--set`` overrides that reduce a shipped recipe to the rehearsal: the stand-in model, the
    rehearsal task, completion 32 tokens -- in one block at the recipe's tokens per step, or, on a
    block-diffusion model (``block_model``), in the recipe's blocks at its steps per block (:func:`_reduced_block`)
    -- 1 prompt × G per process, μ ≤ ``mu_cap``; everything else (LoRA, dtype, checkpointing, likelihood,
    objective, credit, cache, remasking, threshold, early stop, micro-batching) as the recipe says."""
    r, e, t = cfg.rollout, cfg.eval, cfg.train
    block_roll, steps_roll = _reduced_block(r, block_model)
    block_eval, steps_eval = _reduced_block(e, block_model)
    return [f"model.path={standin}", f"output_dir={out_dir}", f"task.name=rehearse_{cfg.task.name}",
            f"task.train_size={train_rows}", f"task.eval_limit={EVAL_ROWS}",
            f"rollout.gen_length={GEN_LENGTH}", f"rollout.block_length={block_roll}", f"rollout.steps={steps_roll}",
            f"eval.gen_length={GEN_LENGTH}", f"eval.block_length={block_eval}", f"eval.steps={steps_eval}",
            "train.prompts_per_step=1", f"train.group_size={group_size}",
            f"train.inner_iterations={min(t.inner_iterations, mu_cap)}", f"train.steps={steps}",
            f"train.save_every={save_every}", "train.log_every=1", "train.eval_every=0", "train.report_to=[]"]


def load_recipe(name: str, overrides: list[str] = ()):
    from maskrl.config import load_config

    return load_config([str(recipe_path(name))], list(overrides), plugins=[str(PLUGIN)])


def _env(threads: int = 1) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MALLOC_MMAP_THRESHOLD_="65536",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", **KERNEL_CACHES_OFF)
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


def _run_child(kind: str, args: list[str], log: Path, timeout: float = 3600, env: dict | None = None) -> dict:
    cmd = [sys.executable, str(SCRIPT), "--child", kind, *args]
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=fh, stdin=subprocess.DEVNULL, text=True, env=env or _env(2),
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


def _code_commit() -> dict:
    """The checkout's commit and whether ``src/`` or ``benchmarks/`` differ from it."""
    def git(*a):
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--", "src", "benchmarks"))}
