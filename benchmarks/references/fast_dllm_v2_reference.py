"""Record Fast-dLLM v2's own forward and its own decodings on a tiny checkpoint in its layout, as test data
(the block-diffusion families' reference parities; docs/models.md and docs/sampler.md, "Fast-dLLM v2").

Source: Fast-dLLM v2's remote code as published with ``Efficient-Large-Model/Fast_dLLM_v2_7B``
(``configuration.py``, ``modeling.py``: ``Fast_dLLM_QwenForCausalLM`` with its ``generate``) and NVlabs'
``v2/generation_functions.py`` (``batch_sample``, the decoder of its evaluation). The Hub files are not in
NVlabs/Fast-dLLM; the copy read here is the fork wangziyannb/Fast-dLLM at commit :data:`COMMIT`, files
``v2/configuration.py``, ``v2/modeling_ori.py`` (the unmodified modelling file; its ``v2/modeling.py`` is
the fork's edit) and ``v2/generation_functions.py`` (byte-identical to zzy-yuki/Fast-dLLM 71e276b's copy of
NVlabs'). They are read with ``git show`` from a clone (``--repo``) into a temporary folder and imported
from there, never copied into this project. The only difference to the Hub's ``modeling.py`` we know of is
its import line, ``from configuration import ...`` where the Hub package has ``from .configuration``: the
folder goes on ``sys.path`` so that line resolves as written.

Their code targets transformers 4.53 (``layer_type_validation``, ``past_key_value`` keyword, the
``DynamicCache.key_cache`` lists that ``batch_sample`` edits), so this script runs under transformers
4.53.3 put first on ``PYTHONPATH`` (torch from the project's environment)::

    pip install --target /tmp/tf453 --no-deps transformers==4.53.3 "tokenizers<0.22" "huggingface-hub<1.0" einops
    PYTHONPATH=/tmp/tf453:src python benchmarks/references/fast_dllm_v2_reference.py \\
        --repo /path/to/wangziyannb/Fast-dLLM

Nothing of theirs is stubbed: their file imports no CUDA kernel. The project environment's ``kernels``
package (built for a newer ``huggingface-hub``) is hidden from transformers (``sys.modules["kernels"] =
None``), so that their ``@use_kernel_forward_from_hub("RMSNorm")`` keeps their own RMSNorm, as it does
where ``kernels`` is not installed.

What is recorded:

* ``tests/data/fast_dllm_v2_tiny``: ``config.json`` in their layout (their ``Fast_dLLM_QwenConfig`` keys,
  ``architectures`` and ``auto_map``; tiny sizes, ``bd_size`` 8, a 96-id vocabulary, so the ids --
  ``mask_token_id`` 95, eos 94 -- are inside it), ``model.safetensors`` (their ``state_dict`` names),
  float32 weights drawn from ``torch.Generator().manual_seed(0)`` (attention sharpened and the output
  layer scaled so a step's confidences are apart by more than float noise; :func:`draw_weights`),
  and ``reference.safetensors``: ``input_ids [3, 19]`` and the logits ``[3, 19, 96]`` of their forward in
  ``eval()`` (their ``eval_block_diff_mask``, ``block_size`` 8; raw, unshifted: ``logits[i]`` predicts
  token ``i + 1``).
* ``tests/golden/fast_dllm_v2_reference.json``: for 8 prompts (lengths 3..22, every ``P mod 8`` but a
  prompt of exactly one block, below) and each setting of :data:`SETTINGS`, the tokens after the prompt
  that their ``generate`` returns at ``temperature=0`` (its own greedy rule: candidate = argmax,
  confidence = its softmax probability; ``use_block_cache=False``, the exact cache), and for the
  ``stop`` settings also their ``batch_sample`` on the whole batch (prompts right-padded with ``[MASK]``,
  as their ``eval.py`` does).

Not recorded: a prompt of exactly ``bd_size`` tokens -- their ``generate`` then prefills nothing (``>``
block_size) and decodes the next block without the prompt in its cache (the prompt is never seen); and
``use_block_cache=True`` (an approximate cache: the other sub-blocks' keys are stale).
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
REPO = "wangziyannb/Fast-dLLM"
COMMIT = "fd27cb3b4cb017db5058cd97ff315e67ba14e6ff"
FILES = {"configuration.py": "v2/configuration.py", "modeling_ori.py": "v2/modeling_ori.py",
         "generation_functions.py": "v2/generation_functions.py"}

#: their Fast_dLLM_QwenConfig keys (the published 7B config.json's), tiny sizes, ids inside the tiny vocabulary
TINY_CONFIG = {
    "architectures": ["Fast_dLLM_QwenForCausalLM"],
    "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig",
                 "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
    "attention_dropout": 0.0, "bd_size": 8, "bos_token_id": 93, "eos_token_id": 94, "mask_token_id": 95,
    "hidden_act": "silu", "hidden_size": 48, "initializer_range": 0.02, "intermediate_size": 96,
    "max_position_embeddings": 256, "max_window_layers": 2, "model_type": "Fast_dLLM_Qwen",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "float32", "use_cache": True, "use_sliding_window": False, "vocab_size": 96,
}
PROMPT_LENGTHS = (3, 5, 7, 9, 12, 16, 19, 22)  # P mod 8 = 3 5 7 1 4 0 3 6; never 8 (module docstring)
#: name -> (threshold, small_block_size, stop: the row ends at eos); max_new_tokens 40 (5 blocks)
SETTINGS = {
    "one_per_step": (1.0, 4, False),  # their generate's default threshold: the argmax alone each step
    "t0.9_sub4": (0.9, 4, False),
    "t0.5_sub2": (0.5, 2, False),
    "t0.7_whole": (0.7, 8, False),  # one sub-block: the whole block
    "stop_t0.9_sub4": (0.9, 4, True),
    "stop_t0.5_sub8": (0.5, 8, True),
}
MAX_NEW = 40
MASK_ROW = 0.5  # the [MASK] output row's scale (draw_weights)
NEVER = -1  # their stop_token for the settings without a stop (no id equals it)


def import_their_code(repo: Path):
    """Their three files (read at :data:`COMMIT` from the clone ``repo``) imported from a temporary folder."""
    folder = Path(tempfile.mkdtemp())
    for name, path in FILES.items():
        text = subprocess.run(["git", "-C", str(repo), "show", f"{COMMIT}:{path}"], check=True,
                              capture_output=True, text=True).stdout
        (folder / name).write_text(text)
    sys.path.insert(0, str(folder))
    return (importlib.import_module("configuration"), importlib.import_module("modeling_ori"),
            importlib.import_module("generation_functions"))


def draw_weights(model, seed: int = 0) -> None:
    """The recorded weights: N(0, 1/fan_in), norms 1 + N(0, 0.04); queries and keys x6, the output layer x4
    (decisions clear of float noise), its ``[MASK]`` row x2 only: ``[MASK]``'s probability reaches ~1 %, which
    moves their confidences (their softmax keeps it), and is never a recorded argmax (their loop would not
    end where the sub-block's most confident candidate is ``[MASK]``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("norm.weight"):
                t.copy_(1.0 + 0.2 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(torch.randn(t.shape, generator=g) / t.shape[-1] ** 0.5)
            if any(k in name for k in ("q_proj", "k_proj")):
                t.mul_(6.0)
        model.lm_head.weight.mul_(4.0)
        model.lm_head.weight[TINY_CONFIG["mask_token_id"]] *= MASK_ROW


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 93, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def run_generate(model, prompt: list[int], threshold: float, sub: int, stop: bool) -> list[int]:
    """Their ``generate`` at temperature 0: the tokens after the prompt (cut after the first stop)."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, mask_id=TINY_CONFIG["mask_token_id"],
                         threshold=threshold, small_block_size=sub, block_size=TINY_CONFIG["bd_size"],
                         stop_token=TINY_CONFIG["eos_token_id"] if stop else NEVER, temperature=0.0,
                         use_block_cache=False)
    return out[0, len(prompt):].tolist()


def run_batch_sample(model, gen, rows: list[list[int]], threshold: float, sub: int) -> list[list[int]]:
    """Their ``batch_sample`` (``eval.py``'s call: prompts right-padded with ``[MASK]``) at temperature 0."""
    mask, eos = TINY_CONFIG["mask_token_id"], TINY_CONFIG["eos_token_id"]
    width = max(map(len, rows))
    ids = torch.tensor([r + [mask] * (width - len(r)) for r in rows])
    sample = types.MethodType(gen.Fast_dLLM_QwenForCausalLM.batch_sample, model)
    out = sample(ids, tokenizer=types.SimpleNamespace(pad_token_id=TINY_CONFIG["bos_token_id"]),
                 block_size=TINY_CONFIG["bd_size"], max_new_tokens=MAX_NEW, small_block_size=sub,
                 min_len=min(map(len, rows)), seq_len=torch.tensor([len(r) for r in rows]), mask_id=mask,
                 threshold=threshold, stop_token=eos, use_block_cache=False, temperature=0.0)
    return [out[i][len(r):].tolist() for i, r in enumerate(rows)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", type=Path, required=True, help=f"a git clone of {REPO} holding COMMIT")
    p.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "fast_dllm_v2_tiny")
    p.add_argument("--golden", type=Path, default=ROOT / "tests" / "golden" / "fast_dllm_v2_reference.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    sys.modules["kernels"] = None  # see the module docstring
    import transformers
    from safetensors.torch import save_file

    assert transformers.__version__ == "4.53.3", f"run under transformers 4.53.3, not {transformers.__version__}"
    configuration, modeling, gen = import_their_code(args.repo)
    config = configuration.Fast_dLLM_QwenConfig(**{k: v for k, v in TINY_CONFIG.items() if k != "auto_map"})
    model = modeling.Fast_dLLM_QwenForCausalLM(config).eval()
    draw_weights(model)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 93, (3, 19), generator=g)  # blocks of 8: two whole, one partial
    ids[0, 11:] = TINY_CONFIG["mask_token_id"]
    ids[1, 3:17:3] = TINY_CONFIG["mask_token_id"]
    with torch.no_grad():
        logits = model(ids, block_size=TINY_CONFIG["bd_size"]).logits
    args.data.mkdir(parents=True, exist_ok=True)
    (args.data / "config.json").write_text(json.dumps(TINY_CONFIG | {"transformers_version": "4.53.3"},
                                                      indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, args.data / "model.safetensors",
              metadata={"format": "pt"})
    source = f"{REPO}@{COMMIT}"
    save_file({"input_ids": ids, "logits": logits.float().contiguous()}, args.data / "reference.safetensors",
              metadata={"source": f"{source} v2/modeling_ori.py Fast_dLLM_QwenForCausalLM, eval(), block_size 8"})
    rows = prompts()
    record = {"source": f"{source} v2/modeling_ori.py generate, v2/generation_functions.py batch_sample",
              "transformers": transformers.__version__, "max_new_tokens": MAX_NEW, "prompts": rows, "settings": {}}
    for name, (thr, sub, stop) in SETTINGS.items():
        entry = {"threshold": thr, "small_block_size": sub, "stop": stop,
                 "generate": [run_generate(model, r, thr, sub, stop) for r in rows]}
        if stop:
            entry["batch_sample"] = run_batch_sample(model, gen, rows, thr, sub)
        record["settings"][name] = entry
        ends = [r.index(TINY_CONFIG["eos_token_id"]) if TINY_CONFIG["eos_token_id"] in r else None
                for r in entry["generate"]]
        print(name, "eos at", ends, file=sys.stderr)
    args.golden.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.data} (logits {tuple(logits.shape)}, max |logit| {logits.abs().max():.3f}) and {args.golden}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
