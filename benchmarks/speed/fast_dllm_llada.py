"""maskrl's sampler against Fast-dLLM's LLaDA code, side by side on one random LLaDA-layout checkpoint:
every cache (none / prefix / dual) x schedule (fixed / threshold), tokens compared cell by cell.

Fast-dLLM's ``llada/generate.py`` (``generate``, ``generate_with_prefix_cache``, ``generate_with_dual_cache``)
and its ``llada/model/modeling_llada.py`` (NVlabs/Fast-dLLM 24cc59e) are imported at run time from a folder
holding them; that code is not part of maskrl and is never committed: point ``--fast-dllm`` (or
``$MASKRL_FAST_DLLM_LLADA``) at a checkout's ``llada/`` folder. Its model is built at random (seed 0) by its
own class and saved in LLaDA's layout; maskrl loads that folder (:func:`maskrl.models.load`), and the two
forwards' logits are compared first (max |Δ| is recorded).

Both decode greedily (temperature 0: Fast-dLLM's ``add_gumbel_noise`` returns the logits, maskrl draws no
noise), LLaDA's low-confidence rule, blocks of ``--block-length``, the fixed schedule at two tokens a step
(``steps = L / 2``) and the threshold schedule at 0.9. The output layer is scaled by ``--head-scale`` so that
the random model's distributions are peaked enough for the threshold rule to commit several tokens a step.

Timing: one thread, process CPU seconds of each ``generate`` call (the machine may be shared), Fast-dLLM
and maskrl alternated call by call (which one goes first alternates too), ``--reps`` repetitions (``--batch-reps`` for the
batch cells, which cost Fast-dLLM ``--batch`` calls each), the median of the per-repetition ratios reported. Fast-dLLM's functions decode one row per call
(``x = torch.full((1, ...))``): the ``batch`` cells time it over ``--batch`` prompts one call each, and
maskrl once on the whole batch (``maskrl batches, Fast-dLLM cannot``); each row's tokens are compared.

    PYTHONPATH=src python benchmarks/speed/fast_dllm_llada.py --fast-dllm /path/to/Fast-dLLM/llada \\
        --out benchmarks/speed/fast_dllm_llada.json

Two compatibility shims let the mid-2025 code run on transformers >= 5 (what they do is all they do): a
stand-in ``einops`` is put in ``sys.modules`` when the package is absent (only a block type this checkpoint
does not have uses it), and the model's config gets back the ``use_cache = False`` that ``LLaDAConfig``
passes but transformers 5 drops.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

CACHES = ("none", "prefix", "dual")
SCHEDULES = ("fixed", "threshold")


def import_fast_dllm(folder: Path):
    """Fast-dLLM's ``generate`` module and ``LLaDAModelLM`` / ``LLaDAConfig`` from ``folder`` (its ``llada/``)."""
    if not (folder / "generate.py").is_file() or not (folder / "model" / "modeling_llada.py").is_file():
        raise SystemExit(f"--fast-dllm {folder}: no generate.py and model/modeling_llada.py there "
                         "(NVlabs/Fast-dLLM's llada/ folder)")
    try:
        import einops  # noqa: F401
    except ImportError:  # only LLaDA's flex-attention block uses it
        stub = types.ModuleType("einops")
        stub.rearrange = lambda *a, **k: (_ for _ in ()).throw(NotImplementedError("einops stand-in"))
        sys.modules["einops"] = stub
    sys.path.insert(0, str(folder))
    import generate as fd  # Fast-dLLM's llada/generate.py
    from model.configuration_llada import LLaDAConfig
    from model.modeling_llada import LLaDAModelLM
    return fd, LLaDAModelLM, LLaDAConfig


def llada_config(args) -> dict:
    """LLaDA-8B-Instruct's config.json keys with the benchmark's dimensions."""
    w, v = args.width, args.vocab
    return {"model_type": "llada", "architectures": ["LLaDAModelLM"], "activation_type": "silu", "alibi": False,
            "alibi_bias_max": 8.0, "attention_dropout": 0.0, "attention_layer_norm": False,
            "attention_layer_norm_with_affine": True, "bias_for_layer_norm": False, "block_group_size": 1,
            "block_type": "llama", "d_model": w, "embedding_dropout": 0.0, "embedding_size": v,
            "eos_token_id": v - 2, "flash_attention": False, "include_bias": False, "include_qkv_bias": False,
            "init_cutoff_factor": None, "init_device": "cpu", "init_fn": "mitchell", "init_std": 0.02,
            "input_emb_norm": False, "layer_norm_type": "rms", "layer_norm_with_affine": True,
            "mask_token_id": v - 1, "max_sequence_length": 1024, "mlp_hidden_size": 3 * w, "mlp_ratio": 4,
            "multi_query_attention": None, "n_heads": w // 64, "n_kv_heads": w // 64, "n_layers": args.layers,
            "pad_token_id": v - 3, "precision": "fp32", "residual_dropout": 0.0, "rms_norm_eps": 1e-05, "rope": True,
            "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False, "use_cache": False,
            "vocab_size": v, "weight_tying": False}


def build_models(args, LLaDAModelLM, LLaDAConfig, folder: Path):
    """Fast-dLLM's model at random (seed 0, head scaled), saved to ``folder``, and maskrl's adapter of it."""
    from safetensors.torch import save_file

    from maskrl.models import load

    cfg = llada_config(args)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ref = LLaDAModelLM(LLaDAConfig(**cfg), init_params=True).eval()
    ref.config.use_cache = False  # transformers >= 5 no longer keeps the key LLaDAConfig passes on
    with torch.no_grad():
        ref.model.transformer.ff_out.weight.mul_(args.head_scale)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: t.contiguous() for k, t in ref.state_dict().items()}, folder / "model.safetensors")
    ad = load(folder, mask_id=cfg["mask_token_id"], eos_id=cfg["eos_token_id"], pad_id=cfg["pad_token_id"])
    return ref, ad


def fast_dllm_call(fd, ref, prompt, cache, schedule, args):
    fn = {"none": fd.generate, "prefix": fd.generate_with_prefix_cache, "dual": fd.generate_with_dual_cache}[cache]
    x, nfe = fn(ref, prompt, steps=args.gen_length // 2, gen_length=args.gen_length, block_length=args.block_length,
              temperature=0.0, remasking="low_confidence", mask_id=args.vocab - 1,
              threshold=0.9 if schedule == "threshold" else None)
    return x[:, prompt.shape[1]:], nfe


def maskrl_call(ad, prompts, cache, schedule, args):
    from maskrl.sampling import SamplerConfig, generate

    sc = SamplerConfig(gen_length=args.gen_length, block_length=args.block_length, steps=args.gen_length // 2,
                       temperature=0.0, remasking="low_confidence", cache=cache, schedule=schedule, threshold=0.9)
    ro = generate(ad, prompts, torch.ones_like(prompts, dtype=torch.bool), sc)
    return ro.completion_ids, int(ro.num_steps.max())


def timed(fn):
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def measure(fd, ref, ad, prompts, args, on_rep=lambda cells: None) -> dict:
    """Every cell, alternated: ``{cell: {fast_dllm_s, maskrl_s, ratio, tokens_equal, ...}}``; ``on_rep(cells)``
    after each repetition (the record is written then, so a stopped run keeps the repetitions it finished)."""
    cells = {}
    wanted = set(args.cells.split(",")) if args.cells else None
    for cache in CACHES:
        for schedule in SCHEDULES:
            for rows in (1, args.batch):
                key = f"{cache}/{schedule}/batch{rows}"
                if wanted is None or key in wanted:
                    cells[key] = {"fast_dllm_s": [], "maskrl_s": [], "tokens_equal": True, "rows": rows}
    if wanted is not None and wanted - set(cells):
        raise SystemExit(f"--cells: no cell {sorted(wanted - set(cells))}; cells are cache/schedule/batchN with cache in "
                         f"{CACHES}, schedule in {SCHEDULES}, N 1 or --batch")
    for rep in range(args.reps):
        for i, (key, c) in enumerate(cells.items()):
            if c["rows"] > 1 and rep >= args.batch_reps:
                continue
            cache, schedule, _ = key.split("/")
            p = prompts[:c["rows"]]
            runs = {"fast_dllm": lambda: [fast_dllm_call(fd, ref, p[r:r + 1], cache, schedule, args)
                                          for r in range(len(p))],
                    "maskrl": lambda: maskrl_call(ad, p, cache, schedule, args)}
            order = ("fast_dllm", "maskrl") if (rep + i) % 2 == 0 else ("maskrl", "fast_dllm")
            got = {name: timed(runs[name]) for name in order}
            c["fast_dllm_forwards"] = sum(nfe for _, nfe in got["fast_dllm"][1])
            got["fast_dllm"] = (got["fast_dllm"][0], torch.cat([x for x, _ in got["fast_dllm"][1]]))
            c["maskrl_batched_steps"] = got["maskrl"][1][1]
            got["maskrl"] = (got["maskrl"][0], got["maskrl"][1][0])
            c["fast_dllm_s"].append(got["fast_dllm"][0])
            c["maskrl_s"].append(got["maskrl"][0])
            same = torch.equal(got["fast_dllm"][1], got["maskrl"][1])
            c["tokens_equal"] &= same
            c["rows_equal"] = int((got["fast_dllm"][1] == got["maskrl"][1]).all(-1).sum())
            print(f"rep {rep} {key}: Fast-dLLM {got['fast_dllm'][0]:.2f} s, maskrl {got['maskrl'][0]:.2f} s, "
                  f"ratio {got['fast_dllm'][0] / got['maskrl'][0]:.2f}, tokens equal {same}", flush=True)
        on_rep(summarize(cells, args))
    return summarize(cells, args)


def summarize(cells: dict, args) -> dict:
    """Each cell's per-repetition ratios, their median and the tokens per second of both."""
    for c in cells.values():
        c["ratio_fast_dllm_over_maskrl"] = [f / m for f, m in zip(c["fast_dllm_s"], c["maskrl_s"])]
        c["median_ratio"] = statistics.median(c["ratio_fast_dllm_over_maskrl"])
        c["maskrl_tokens_per_s"] = c["rows"] * args.gen_length / statistics.median(c["maskrl_s"])
        c["fast_dllm_tokens_per_s"] = c["rows"] * args.gen_length / statistics.median(c["fast_dllm_s"])
    return cells


def main(argv: list[str] | None = None) -> dict:
    from maskrl.machine import cpu_identity
    from maskrl.records import write_record

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast-dllm", type=Path, default=os.environ.get("MASKRL_FAST_DLLM_LLADA"),
                    help="NVlabs/Fast-dLLM's llada/ folder (or $MASKRL_FAST_DLLM_LLADA)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--head-scale", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-reps", type=int, default=1, help="repetitions of the batch cells (at most --reps)")
    ap.add_argument("--cells", help="comma-separated cells to run (e.g. dual/fixed/batch1); default: all")
    ap.add_argument("--background-load", type=int, default=0, metavar="K",
                    help="K busy processes (one thread each, matrix products and copies over 64 MiB) running "
                         "beside the measurement, to see how the ratios move on a loaded machine")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.fast_dllm is None:
        ap.error("--fast-dllm (or $MASKRL_FAST_DLLM_LLADA) is required")
    torch.set_num_threads(1)
    fd, LLaDAModelLM, LLaDAConfig = import_fast_dllm(Path(args.fast_dllm))
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        ref, ad = build_models(args, LLaDAModelLM, LLaDAConfig, Path(tmp))
        prompts = torch.randint(0, args.vocab - 3, (args.batch, args.prompt_length),
                                generator=torch.Generator().manual_seed(1))
        logit_diff = float((ref(prompts).logits - ad.logits(prompts)).abs().max())
        print(f"max |logits(Fast-dLLM) - logits(maskrl)| = {logit_diff:.3g}", flush=True)
        given = list(argv if argv is not None else sys.argv[1:])
        kept = [a for i, a in enumerate(given)
                if not (a.startswith("--fast-dllm") or (i and given[i - 1] == "--fast-dllm"))]
        record = {"command": "PYTHONPATH=src python benchmarks/speed/fast_dllm_llada.py --fast-dllm <Fast-dLLM>/llada "
                             + " ".join(kept),
                  "fast_dllm": "NVlabs/Fast-dLLM 24cc59e, llada/generate.py + llada/model/modeling_llada.py",
                  "threads": 1, "timer": "process CPU seconds per generate call, alternated",
                  "processor": cpu_identity(), "torch": torch.__version__,
                  "cpu_load_1min_at_start": os.getloadavg()[0], "max_abs_logit_diff": logit_diff,
                  "args": {k: v for k, v in vars(args).items() if k not in ("fast_dllm", "out")},
                  "fast_dllm_batches": False, "complete": False, "cells": {}}

        def save(cells, done=False):
            record.update(cells=cells, complete=done, cpu_load_1min_at_end=os.getloadavg()[0])
            if args.out:
                write_record(args.out, record)

        with background_load(args.background_load):
            save(measure(fd, ref, ad, prompts, args, on_rep=save), done=True)
    return record


#: one busy process of ``--background-load``: matrix products and copies over 64 MiB, one thread, until killed
_BUSY = ("import torch\ntorch.set_num_threads(1)\na = torch.randn(2048, 2048)\nb = torch.empty(4096, 4096)\n"
         "while True:\n    a @ a\n    b.copy_(torch.randn(4096, 4096))\n")


@contextlib.contextmanager
def background_load(k: int):
    """``k`` busy processes (:data:`_BUSY`) beside the block, stopped after it (none when ``k == 0``)."""
    procs = [subprocess.Popen([sys.executable, "-c", _BUSY]) for _ in range(k)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
