"""Record SDAR's own forward on a tiny checkpoint in SDAR's layout, as test data (issue 48, item 1).

Source: JetAstra/SDAR, commit c2041a8333333d685f6e15122c84f60f51f85ebd, files
``training/model/SDAR-4B-Chat/configuration_sdar.py`` and ``modeling_sdar.py`` (read from a checkout,
never committed here). Their code targets transformers 4.52.4 (``config.json``'s
``transformers_version``; it imports names transformers 5 removed, e.g. ``LossKwargs``), so this script
runs under transformers 4.52.4 put first on ``PYTHONPATH`` (with ``tokenizers`` 0.21, ``huggingface-hub``
< 1.0 and ``einops``; torch from the project's environment)::

    pip install --target /tmp/tf452 --no-deps transformers==4.52.4 "tokenizers<0.22" "huggingface-hub<1.0" einops
    PYTHONPATH=/tmp/tf452 python benchmarks/sdar_reference.py --sdar /path/to/SDAR --out tests/data/sdar_tiny

Three imports of their module are stubbed, because they need CUDA kernels (what each stub does is all it
does):

* ``flash_attn.ops.triton.layer_norm.rms_norm_fn`` (their ``SDARRMSNorm.forward``): replaced by the RMSNorm
  their own file keeps, commented out, under it -- ``w * (x.float() * rsqrt(mean(x²) + eps)).to(dtype)``
  -- which is what the Triton kernel computes (float32 statistics);
* ``flash_attn`` (``flash_attn_func``, used only when the attention mask is all True): absent, as their
  ``try/except`` allows; the recorded sequences span several blocks, so their SDPA branch runs;
* ``.fused_linear_diffusion_cross_entropy`` (imports ``triton``; used only by the training loss): an
  empty stand-in class.

and the project environment's ``kernels`` package (built for a newer ``huggingface-hub`` than
transformers 4.52.4 takes) is hidden from transformers (``sys.modules["kernels"] = None``), so that
transformers 4.52.4 uses its own layers, as it does where ``kernels`` is not installed.

What is recorded: the model is their ``SDARForCausalLM`` on a tiny config in SDAR's layout (the
published SDAR-4B-Chat ``config.json`` with small sizes and a small vocabulary), float32 weights drawn
from ``torch.Generator().manual_seed(0)``, in ``eval()`` mode. Its input is what ``generate.py`` gives
it: ``tril(ones(nb, nb))`` repeated to the block size, ``[1, T, T]``, and positions ``0 .. T-1``. Written
to ``--out``: ``config.json`` + ``generation_config.json`` (SDAR's keys, ``auto_map`` included) and
``model.safetensors`` (their tensor names, from their ``state_dict``), and ``reference.safetensors``
holding ``input_ids [N, T]`` and their ``logits [N, T, V]`` (float32).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch

COMMIT = "c2041a8333333d685f6e15122c84f60f51f85ebd"
FILES = ("configuration_sdar.py", "modeling_sdar.py")
SOURCE_DIR = "training/model/SDAR-4B-Chat"
PACKAGE = "_sdar_reference_code"

#: the published SDAR-4B-Chat config.json, with tiny sizes (and ids inside the tiny vocabulary)
TINY_CONFIG = {
    "architectures": ["SDARForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                 "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
    "attention_bias": False, "attention_dropout": 0.0, "attn_implementation": "sdpa",
    "bos_token_id": 93, "eos_token_id": 93, "block_size": 4, "mask_token_id": 95,
    "fuse_cross_entropy": False, "head_dim": 16, "hidden_act": "silu", "hidden_size": 48,
    "initializer_range": 0.02, "intermediate_size": 96, "max_position_embeddings": 256, "max_window_layers": 2,
    "model_type": "sdar", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "float32", "use_cache": False, "use_sliding_window": False,
    "vocab_size": 96,
}
GENERATION_CONFIG = {"bos_token_id": 93, "eos_token_id": [94, 93], "pad_token_id": 93}


def import_their_code(sdar: Path):
    """Their two files (read at ``COMMIT`` from the checkout ``sdar``) as a package, with the stubs above."""
    code = Path(tempfile.mkdtemp()) / PACKAGE
    code.mkdir()
    for name in FILES:
        text = subprocess.run(["git", "-C", str(sdar), "show", f"{COMMIT}:{SOURCE_DIR}/{name}"], check=True,
                              capture_output=True, text=True).stdout
        (code / name).write_text(text)
    (code / "__init__.py").write_text("")

    def rms_norm_fn(x, weight, bias=None, eps=1e-6, **_):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(dtype)

    import transformers.modeling_flash_attention_utils  # noqa: F401  (decides "no flash_attn" before the stubs exist)
    import transformers.modeling_utils  # noqa: F401  (imported with the real availability checks too)

    layer_norm = types.ModuleType("flash_attn.ops.triton.layer_norm")
    layer_norm.rms_norm_fn = rms_norm_fn
    for name in ("flash_attn", "flash_attn.ops", "flash_attn.ops.triton"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["flash_attn.ops.triton.layer_norm"] = layer_norm
    fused = types.ModuleType(f"{PACKAGE}.fused_linear_diffusion_cross_entropy")
    fused.FusedLinearDiffusionCrossEntropyLoss = type("FusedLinearDiffusionCrossEntropyLoss", (), {})
    sys.modules[fused.__name__] = fused
    sys.path.insert(0, str(code.parent))
    import importlib

    return importlib.import_module(f"{PACKAGE}.configuration_sdar"), importlib.import_module(f"{PACKAGE}.modeling_sdar")


def block_mask(length: int, block: int) -> torch.Tensor:
    """``generate.py``'s mask: ``tril(ones(nb, nb))`` repeated to the block size, cut to ``length``: ``[1, T, T]``."""
    nb = (length + block - 1) // block
    m = torch.tril(torch.ones(nb, nb)).repeat_interleave(block, 0).repeat_interleave(block, 1)
    return m[None, :length, :length]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sdar", type=Path, required=True, help="a git checkout of JetAstra/SDAR holding COMMIT")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    sys.modules["kernels"] = None  # see the module docstring
    import transformers

    assert transformers.__version__ == "4.52.4", f"run under transformers 4.52.4, not {transformers.__version__}"
    configuration, modeling = import_their_code(args.sdar)
    config = configuration.SDARConfig(**{k: v for k, v in TINY_CONFIG.items() if k not in ("auto_map",)})
    config._attn_implementation = "sdpa"
    model = modeling.SDARForCausalLM(config).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("norm.weight"):
                t.copy_(1.0 + 0.2 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(torch.randn(t.shape, generator=g) / t.shape[-1] ** 0.5)
    # rows of 11 tokens (three blocks of 4, the last partial), masks among them, as the sampler feeds them
    ids = torch.randint(0, 93, (3, 11), generator=g)
    ids[0, 6:] = TINY_CONFIG["mask_token_id"]
    ids[1, 2:9:2] = TINY_CONFIG["mask_token_id"]
    with torch.no_grad():
        logits = model(ids, attention_mask=block_mask(ids.shape[1], TINY_CONFIG["block_size"]),
                       position_ids=torch.arange(ids.shape[1])[None].expand_as(ids), use_cache=False).logits
    from safetensors.torch import save_file

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(TINY_CONFIG | {"transformers_version": "4.52.4"}, indent=2) + "\n")
    (args.out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, args.out / "model.safetensors",
              metadata={"format": "pt"})
    save_file({"input_ids": ids, "logits": logits.float().contiguous()}, args.out / "reference.safetensors",
              metadata={"source": f"JetAstra/SDAR@{COMMIT} {SOURCE_DIR}/modeling_sdar.py SDARForCausalLM",
                        "mask": "tril(ones(nb, nb)) repeated to block_size (generate.py)"})
    print(f"wrote {args.out}: logits {tuple(logits.shape)}, max |logit| {logits.abs().max():.3f}")


if __name__ == "__main__":
    main()
