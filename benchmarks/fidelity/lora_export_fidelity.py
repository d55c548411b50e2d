"""Does a LoRA run's exported ``model/`` folder hold what training learned?

Runs ``maskrl train`` on the built-in tiny model with a bf16 base and LoRA (the 7-8B recipes' setting:
rank 8, lr 3e-6 by default), then compares, for every weight the adapter touches:

* ``equal_to_base``: the fraction of entries of the exported (merged) weight ``W'`` that equal the
  base weight ``W`` exactly (an update rounded away leaves the entry at the base);
* ``rel_error``: ``||(W' - W) - ΔW||_F / ||ΔW||_F`` over all adapted weights, ``ΔW = (α / r) B A``
  from the saved adapter (``model/adapter/``), compared in float64 -- 0 for an export that carries
  the update, 1 for one that lost it;
* ``max_logit_diff_*``: ``max |logits|`` difference of ``maskrl.models.load(model/)`` (float32, and
  ``dtype=bfloat16`` as ``maskrl eval --dtype bfloat16`` loads it) against the bf16 base plus the saved
  adapter (peft, float32 adapter: the training policy), and of the base alone, on random masked inputs;
* ``logit_update_rel_error_fp32``: in float32 compute, ``||logits(export) − logits(policy)|| /
  ||logits(policy) − logits(base)||`` -- how much of the change training made to the logits the
  export misses (the policy in float32: its bf16 base values plus the adapter, no bf16 rounding of
  activations);
* the dtype of the exported weights.

A short float32 SFT (60 steps) comes first, so that rollouts earn rewards and the adapter moves.
Writes JSON (``--out``, default stdout; ``lora_export_fidelity.before.json`` is the same run on the
code that merged into bf16)::

    PYTHONPATH=src python benchmarks/fidelity/lora_export_fidelity.py --out benchmarks/fidelity/lora_export_fidelity.json
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def run(rank: int, lr: float, steps: int, workdir: Path) -> dict:
    from safetensors import safe_open

    from maskrl.cli import main
    from maskrl.config import load_config
    from maskrl.models import load
    from maskrl.models.loading import checkpoint_files
    from maskrl.pipeline import load_policy

    sft = workdir / "sft"  # a short float32 SFT first: the random model earns no reward, so no update
    base_sets = ["task.train_size=1024", "sft.steps=60", "sft.batch_size=32", "sft.lr=1e-3", "sft.warmup_steps=5"]
    cfg_file = ["--config", str(ROOT / "configs" / "demo_sudoku.yaml")]
    assert main(["sft", *cfg_file, *[a for s in base_sets for a in ("--set", s)], "--out", str(sft)]) == 0
    sets = [f"model.path={sft}", "model.dtype=bfloat16", f"model.lora_rank={rank}", f"model.lora_alpha={2 * rank}", f"train.lr={lr}",
            f"train.steps={steps}", "train.prompts_per_step=4", "train.group_size=4", "train.inner_iterations=1",
            "train.eval_every=0", "train.micro_batch_size=0", "rollout.gen_length=16", "rollout.block_length=16",
            "rollout.steps=8", "task.train_size=256", "task.eval_limit=8", f"output_dir={workdir / 'run'}"]
    args = cfg_file + [a for s in sets for a in ("--set", s)]
    t0 = time.time()
    assert main(["train", *args]) == 0
    seconds = time.time() - t0
    folder = workdir / "run" / "model"

    cfg = load_config([str(ROOT / "configs" / "demo_sudoku.yaml")], sets)
    cfg.model = dataclasses.replace(cfg.model, lora_rank=0)
    base = load_policy(cfg).model  # the run's starting weights: the SFT folder in bf16
    base_state = {k: v.double() for k, v in base.state_dict().items()}

    from peft import PeftModel

    adapted = PeftModel.from_pretrained(load_policy(cfg).model, folder / "adapter")
    delta = {}
    for name, module in adapted.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            key = name.removeprefix("base_model.model.") + ".weight"
            delta[key] = module.get_delta_weight("default").double()

    files = checkpoint_files(folder)
    exported, dtypes = {}, set()
    for key in delta:
        with safe_open(files[key], framework="pt") as f:
            t = f.get_tensor(key)
        dtypes.add(str(t.dtype).removeprefix("torch."))
        exported[key] = t.double()
    entries = sum(d.numel() for d in delta.values())
    equal = sum(int((exported[k] == base_state[k]).sum()) for k in delta)
    err = sum(float(((exported[k] - base_state[k]) - delta[k]).pow(2).sum()) for k in delta) ** 0.5
    norm = sum(float(delta[k].pow(2).sum()) for k in delta) ** 0.5

    back = load(folder)  # float32: the merged weights as written
    back_bf16 = load(folder, dtype=torch.bfloat16)  # what `maskrl eval --dtype bfloat16` evaluates
    g = torch.Generator().manual_seed(0)
    vocab = back.model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (4, 24), generator=g)
    ids[:, 12:] = back.mask_id
    from maskrl.models.adapter import ModelAdapter

    ref = ModelAdapter(model=adapted.eval(), mask_id=back.mask_id, eos_id=back.eos_id, pad_id=back.pad_id)
    with torch.no_grad():
        want = ref.logits(ids).float()
        diff = float((back.logits(ids).float() - want).abs().max())
        diff_bf16 = float((back_bf16.logits(ids).float() - want).abs().max())
        live32 = ModelAdapter(model=copy.deepcopy(adapted).float().eval(), mask_id=back.mask_id, eos_id=back.eos_id,
                              pad_id=back.pad_id)
        want32 = live32.logits(ids)
        with live32.reference() as base32:
            moved = float((want32 - base32.logits(ids)).norm())
        logit_err = float((back.logits(ids) - want32).norm()) / moved
        base_diff = float((ModelAdapter(model=base.eval(), mask_id=back.mask_id, eos_id=back.eos_id,
                                        pad_id=back.pad_id).logits(ids).float() - ref.logits(ids).float()).abs().max())
    return {"rank": rank, "lr": lr, "steps": steps, "adapted_weights": len(delta), "adapted_entries": entries,
            "equal_to_base": equal / entries, "rel_error": err / norm, "delta_norm": norm,
            "exported_dtypes": sorted(dtypes), "max_logit_diff_vs_base_plus_adapter": diff,
            "max_logit_diff_bf16_load_vs_base_plus_adapter": diff_bf16,
            "logit_update_rel_error_fp32": logit_err,
            "max_logit_diff_base_vs_base_plus_adapter": base_diff, "train_seconds": seconds}


def main_cli(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-6)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(a.rank, a.lr, a.steps, Path(tmp))
    result["torch"] = torch.__version__
    text = json.dumps(result, indent=2) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main_cli())
