"""Record the family's own ``LLaDA2MoeModelLM`` reading maskrl's exports of a trained LLaDA2 policy, as test
data (issue 52, item 6).

Two trained policies are built from ``tests/data/llada2_tiny`` by :func:`trained_policies` (full fine-tuning,
and LoRA r 2 on attention, the dense MLP and the shared expert), each with weights moved by a seeded
integer draw, so the build is the same on every processor; each is written by
:func:`maskrl.models.save_model` (LoRA merged in float32). The family's own code (the copy in ZHZisZZ/dllm
commit ``ca176752fbceec49c6b4777a2c18ae88e4eb10ed``, imported with the stubs of ``llada2_reference.py``,
never committed here) then reads each export folder as its ``from_pretrained`` does -- its config class on
the exported ``config.json``, its model class on the exported shards, no key missing or unexpected; the RoPE
``inv_freq`` buffer, which transformers 5's ``from_pretrained`` leaves uninitialised in their model (they
target transformers 4.52, whose loader builds it), set by their rotary class's own ``__init__`` -- and
its logits on ``tests/data/llada2_tiny/reference.safetensors``'s ``input_ids`` under ``generate()``'s block
mask (block 4) are written to ``--out`` (``export_reference.safetensors``: ``full``, ``lora``). The test
(``tests/test_llada2_export.py``) rebuilds the policies and compares its live logits with these.

    PYTHONPATH=src python benchmarks/references/llada2_export_reference.py --dllm /path/to/ZHZisZZ-dllm.git \\
        --out tests/data/llada2_tiny
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llada2_reference import BLOCK, COMMIT, SOURCE_DIR, block_mask, import_their_code  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "llada2_tiny"
STEP = 1e-3  # the weight moves: integers in [-20, 20] times STEP


def _move(tensors, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in tensors:
            t.add_(torch.randint(-20, 21, t.shape, generator=g).to(t.dtype) * STEP)


def trained_policies(folder: Path = DATA) -> dict:
    """``{"full": adapter, "lora": adapter}``: the tiny checkpoint (block 4) after a stand-in for training:
    every parameter moved (full fine-tuning; the expert bias, a buffer, is not), or LoRA r 2 (``apply_lora``
    defaults: no routed experts) with its ``A`` and ``B`` matrices set by the draw."""
    from maskrl.models import apply_lora, load

    full = load(folder)
    full.block_size = BLOCK
    _move(full.model.parameters(), seed=1)
    lora = load(folder)
    lora.block_size = BLOCK
    lora = apply_lora(lora, rank=2)
    with torch.no_grad():
        for n, p in lora.model.named_parameters():
            if "lora_" in n:
                p.zero_()
    _move([p for n, p in lora.model.named_parameters() if "lora_" in n], seed=2)
    return {"full": full, "lora": lora}


def family_logits(folder: Path, configuration, modeling, ids: torch.Tensor) -> torch.Tensor:
    """The family's own model read from an export ``folder`` as its ``from_pretrained`` does; its float32
    logits ``[N, T, V]`` of ``ids`` under ``generate()``'s block mask (positions ``0 .. T-1``).

    Raises:
        ValueError: the family's loader found tensors missing, unexpected or mismatched (named).
    """
    config = configuration.LLaDA2MoeConfig.from_pretrained(folder)
    config._attn_implementation = "sdpa"
    model, info = modeling.LLaDA2MoeModelLM.from_pretrained(folder, config=config, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise ValueError(f"{folder}: the family's loader reports {bad}")
    rotary = model.model.rotary_emb  # transformers 5's from_pretrained leaves this non-persistent buffer unset
    rotary.inv_freq.copy_(type(rotary)(config).inv_freq)  # (their code targets 4.52): their own init, re-run
    pos = torch.arange(ids.shape[1])[None].expand_as(ids)
    with torch.no_grad():
        return model.eval()(ids, attention_mask=block_mask(ids.shape[1], BLOCK), position_ids=pos).logits.float()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dllm", type=Path, required=True, help="git directory of ZHZisZZ/dllm holding COMMIT")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    from safetensors.torch import load_file, save_file

    from maskrl.models import save_model

    configuration, modeling = import_their_code(args.dllm)
    ids = load_file(DATA / "reference.safetensors")["input_ids"]
    out, tmp = {}, Path(tempfile.mkdtemp())
    for kind, adapter in trained_policies().items():
        folder = save_model(adapter, tmp / kind)
        out[kind] = family_logits(folder, configuration, modeling, ids).contiguous()
        with torch.no_grad():
            live = adapter.logits(ids)
        print(f"{kind}: max |their logits on the export - our live logits| {(out[kind] - live).abs().max():.3g} "
              f"(max |logit| {live.abs().max():.3f})")
    save_file(out, args.out / "export_reference.safetensors",
              metadata={"source": f"ZHZisZZ/dllm@{COMMIT} {SOURCE_DIR}/modeling_llada2_moe.py LLaDA2MoeModelLM."
                                  "from_pretrained on maskrl exports", "mask": f"generate()'s, block {BLOCK}"})


if __name__ == "__main__":
    main()
