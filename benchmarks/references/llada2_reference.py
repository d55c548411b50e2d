"""Record LLaDA2's own forward (and its ``generate()``) on a tiny checkpoint in LLaDA2's layout, as test data
(issue 52, items 1 and 2).

Source: the family's ``configuration_llada2_moe.py`` and ``modeling_llada2_moe.py`` (inclusionAI's Hub code
for LLaDA2.0-mini, with the ``generate()`` of block decoding), read from ZHZisZZ/dllm commit
``ca176752fbceec49c6b4777a2c18ae88e4eb10ed``, folder ``dllm/pipelines/llada2/models/`` (never committed
here). It runs under the project's transformers (5.25) with these stubs, each doing only what is said:

* ``transformers.utils.import_utils.is_torch_fx_available`` (removed in transformers 5): returns ``False``
  (their file only wraps a mask helper for torch.fx tracing with it);
* ``ROPE_INIT_FUNCTIONS["default"]`` (transformers 5 dropped the "default" entry): the standard inverse
  frequencies ``1 / θ^(2i/R)`` over ``R = head_dim · partial_rotary_factor`` dims, attention scaling 1 --
  what transformers 4's default RoPE init computes from the same config;
* for ``generate()`` only: their ``generate()`` builds its additive mask (0 / −inf) in bfloat16, which SDPA
  refuses beside float32 queries; the model's ``forward`` is wrapped to cast that mask to the model's dtype
  first (0 and −inf are exact in both).

What is recorded: their ``LLaDA2MoeModelLM`` on the published LLaDA2.0-mini ``config.json`` (dFactory
``configs/model_configs/llada2_mini``) with tiny sizes (2 layers, the first dense, 8 experts in 4 groups,
2 groups kept, 2 active + 1 shared, head_dim 16, partial rotary 0.5, vocab 96 with eos/pad 93 and
``mask_token_id`` 95 written to ``config.json`` since 156895 lies outside the tiny vocabulary),
float32 weights from ``torch.Generator().manual_seed(0)`` (the expert bias drawn too, so it steers the
routing), ``eval()`` mode, SDPA attention. Inputs as their ``generate()`` builds them: the block-causal
mask ``tril(ones(nb, nb))`` repeated to the block size (4 here), positions ``0 .. T-1``. Written to
``--out``: ``config.json`` (their keys), ``model.safetensors`` (their tensor names), and
``reference.safetensors``: ``input_ids [N, T]``, their ``logits [N, T, V]`` in float32, and the same forward
of the weights in bfloat16 as ``from_pretrained`` would build it (``logits_bf16``, :func:`as_loaded_in_bf16`); plus ``generate.json``: the tokens of their
``generate()`` at temperature 0 (their argmax path), block 4, 4 steps per block, threshold 0.3, for
eight prompts of 2 to 9 tokens; and ``generate_edit.json``: LLaDA2.1's ``generate()`` (the same commit's
``dllm/pipelines/llada21/models/``, token editing) and LLaDA2.0's eos stop, :data:`EDIT_SETTINGS`, with their
forward counts (:func:`record_edits`).

    PYTHONPATH=src python benchmarks/references/llada2_reference.py --dllm /path/to/ZHZisZZ-dllm-checkout --out tests/data/llada2_tiny
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

COMMIT = "ca176752fbceec49c6b4777a2c18ae88e4eb10ed"
SOURCE_DIR = "dllm/pipelines/llada2/models"
FILES = ("configuration_llada2_moe.py", "modeling_llada2_moe.py")
PACKAGE = "_llada2_reference_code"
BLOCK = 4

#: the published LLaDA2.0-mini config.json (dFactory configs/model_configs/llada2_mini), tiny sizes
TINY_CONFIG = {
    "architectures": ["LLaDA2MoeModelLM"],
    "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                 "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                 "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
    "attention_dropout": 0.0, "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96,
    "first_k_dense_replace": 1, "hidden_act": "silu", "max_position_embeddings": 256, "model_type": "llada2_moe",
    "moe_intermediate_size": 24, "norm_topk_prob": True, "num_experts_per_tok": 2, "norm_head": False,
    "num_attention_heads": 4, "num_experts": 8, "num_key_value_heads": 2, "rope_theta": 600000,
    "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float32", "use_bias": False,
    "use_rmsnorm": True, "rms_norm_eps": 1e-06, "head_dim": 16, "num_shared_experts": 1, "use_cache": False,
    "use_qkv_bias": False, "embedding_dropout": 0.0, "norm_softmax": False, "output_dropout": 0.0,
    "vocab_size": 96, "rotary_dim": 8, "using_split_qkv_in_self_attention": False, "router_dtype": "fp32",
    "moe_router_enable_expert_bias": True, "routed_scaling_factor": 2.5, "n_group": 4, "topk_group": 2,
    "score_function": "sigmoid", "initializer_range": 0.02, "max_window_layers": 28,
    "output_router_logits": False, "pad_token_id": 93, "eos_token_id": 93, "partial_rotary_factor": 0.5,
    "use_sliding_window": False, "mask_token_id": 95,  # not in the published config.json: generate()'s default there
}
MASK_ID, EOS_ID = 95, 93


def import_their_code(dllm: Path, source_dir: str = SOURCE_DIR, files: tuple[str, str] = FILES, package: str = PACKAGE):
    """Their two files (read at ``COMMIT`` from the checkout ``dllm``) as a package, with the stubs above."""
    code = Path(tempfile.mkdtemp()) / package
    code.mkdir()
    for name in files:
        text = subprocess.run(["git", "--git-dir", str(dllm), "show", f"{COMMIT}:{source_dir}/{name}"], check=True,
                              capture_output=True, text=True).stdout
        (code / name).write_text(text)
    (code / "__init__.py").write_text("")
    import transformers.modeling_rope_utils as rope_utils
    import transformers.utils.import_utils as import_utils

    import_utils.is_torch_fx_available = lambda: False

    def default_rope(config, device=None, *_, **__):
        dim = int(config.head_dim * getattr(config, "partial_rotary_factor", 1.0))
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float().to(device) / dim))
        return inv, 1.0

    rope_utils.ROPE_INIT_FUNCTIONS["default"] = default_rope
    sys.path.insert(0, str(code.parent))
    return tuple(importlib.import_module(f"{package}.{name[:-3]}") for name in files)


def block_mask(length: int, block: int) -> torch.Tensor:
    """``generate()``'s mask: ``tril(ones(nb, nb))`` repeated to the block size, cut: ``[1, 1, T, T]`` bool."""
    nb = (length + block - 1) // block
    m = torch.tril(torch.ones(nb, nb)).repeat_interleave(block, 0).repeat_interleave(block, 1)
    return m[None, None, :length, :length].bool()


def draw_weights(model: torch.nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                t.copy_(1.0 + 0.2 * torch.randn(t.shape, generator=g))
            elif name.endswith("expert_bias"):
                t.copy_(0.3 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(torch.randn(t.shape, generator=g) / t.shape[-1] ** 0.5)


def as_loaded_in_bf16(modeling, config, model: torch.nn.Module) -> torch.nn.Module:
    """Their model as ``from_pretrained(..., torch_dtype=torch.bfloat16)`` builds it: constructed under the
    default dtype bfloat16 (so the RoPE ``inv_freq``, made in float32 explicitly, stays float32) and the
    weights cast to bfloat16 (not ``model.to(bfloat16)``, which would round ``inv_freq`` too)."""
    torch.set_default_dtype(torch.bfloat16)
    try:
        out = modeling.LLaDA2MoeModelLM(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    out.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    return out


#: LLaDA2.1's ``generate()`` (token editing) and LLaDA2.0's eos stop, recorded into ``generate_edit.json``:
#: name -> (source folder, generate() keywords beyond the shared ones); ``FREQUENT`` stands in for eos in the
#: stop settings (the tiny model seldom emits 93, and generate() takes eos_id as an argument)
FREQUENT = 7
EDIT_SETTINGS = {
    "edit_0.5": ("llada21", {"threshold": 0.3, "editing_threshold": 0.5, "max_post_steps": 4}),
    "edit_0.0": ("llada21", {"threshold": 0.5, "editing_threshold": 0.0, "max_post_steps": 4}),
    "edit_0.5_post_0": ("llada21", {"threshold": 0.3, "editing_threshold": 0.5, "max_post_steps": 0}),
    "edit_0.5_eos_early_stop": ("llada21", {"threshold": 0.3, "editing_threshold": 0.5, "max_post_steps": 4,
                                            "eos_early_stop": True, "eos_id": FREQUENT}),
    "llada20_eos_stop": ("llada2", {"threshold": 0.3, "steps": BLOCK, "eos_id": FREQUENT}),
}
EDIT_PROMPT_LENGTHS = (4, 8, 5, 12, 3, 4, 6, 8)
#: LLaDA2.1's block loop has no step bound: where the argmax at the most confident mask is ``[M]`` itself (their
#: candidates include it) it writes ``[M]`` back and never ends; a prompt whose call passes this many forwards
#: is drawn again
MAX_FORWARDS = 200


class Stuck(RuntimeError):
    """Their ``generate()`` passed :data:`MAX_FORWARDS` forwards."""


def record_edits(dllm: Path, state: dict, modeling20, g: torch.Generator) -> dict:
    """Run :data:`EDIT_SETTINGS` on the weights ``state`` at temperature 0 (their argmax branch), block 4,
    gen_length 12, for prompts of :data:`EDIT_PROMPT_LENGTHS` tokens drawn from ``g`` (one on which a call
    does not end, :data:`MAX_FORWARDS`, drawn again: counted in ``redrawn``); per case the returned tokens and
    the number of model forwards their loop ran."""
    configuration, modeling21 = import_their_code(dllm, "dllm/pipelines/llada21/models",
                                                  ("configuration_llada21_moe.py", "modeling_llada21_moe.py"),
                                                  "_llada21_reference_code")
    models = {}
    for name, modeling, cfg_mod in (("llada21", modeling21, configuration), ("llada2", modeling20, None)):
        cfg_cls = cfg_mod.LLaDA2MoeConfig if cfg_mod else modeling.LLaDA2MoeConfig
        config = cfg_cls(**{k: v for k, v in TINY_CONFIG.items() if k != "auto_map"})
        config._attn_implementation = "sdpa"
        model = modeling.LLaDA2MoeModelLM(config).eval()
        model.load_state_dict(state)
        forward, calls = model.forward, [0]

        def counted(x, attention_mask=None, _f=forward, _c=calls, **kw):
            _c[0] += 1
            if _c[0] > MAX_FORWARDS:
                raise Stuck
            return _f(x, attention_mask=attention_mask.float(), **kw)

        model.forward = counted
        models[name] = (model, calls)
    settings = {key: {"temperature": 0.0, "block_length": BLOCK, "gen_length": 12, "mask_id": MASK_ID,
                      "eos_id": EOS_ID, "eos_early_stop": False} | kw for key, (which, kw) in EDIT_SETTINGS.items()}
    cases, redrawn = {key: [] for key in EDIT_SETTINGS}, 0
    for n in EDIT_PROMPT_LENGTHS:
        while True:
            q = torch.randint(0, 93, (1, n), generator=g)
            try:
                got = {}
                for key, (which, _) in EDIT_SETTINGS.items():
                    model, calls = models[which]
                    calls[0] = 0
                    with torch.no_grad():
                        gen = model.generate(inputs=q, **settings[key])[0].tolist()
                    got[key] = {"prompt": q[0].tolist(), "generated": gen, "forwards": calls[0]}
                break
            except Stuck:
                redrawn += 1
        for key in EDIT_SETTINGS:
            cases[key].append(got[key])
    return {key: {"source": f"ZHZisZZ/dllm@{COMMIT} dllm/pipelines/{which}/models LLaDA2MoeModelLM.generate",
                  "settings": settings[key], "redrawn": redrawn, "cases": cases[key]}
            for key, (which, _) in EDIT_SETTINGS.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dllm", type=Path, required=True, help="git directory of ZHZisZZ/dllm holding COMMIT")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    configuration, modeling = import_their_code(args.dllm)
    config = configuration.LLaDA2MoeConfig(**{k: v for k, v in TINY_CONFIG.items() if k != "auto_map"})
    config._attn_implementation = "sdpa"
    model = modeling.LLaDA2MoeModelLM(config).eval()
    g = torch.Generator().manual_seed(0)
    draw_weights(model, g)
    ids = torch.randint(0, 93, (3, 11), generator=g)  # three blocks of 4, the last partial
    ids[0, 6:] = MASK_ID
    ids[1, 2:9:2] = MASK_ID
    pos = torch.arange(ids.shape[1])[None].expand_as(ids)
    with torch.no_grad():
        logits = model(ids, attention_mask=block_mask(ids.shape[1], BLOCK), position_ids=pos).logits
        bf16 = as_loaded_in_bf16(modeling, config, model)
        logits_bf16 = bf16(ids, attention_mask=block_mask(ids.shape[1], BLOCK), position_ids=pos).logits
        forward = model.forward
        model.forward = lambda x, attention_mask=None, **kw: forward(x, attention_mask=attention_mask.float(), **kw)
        prompts = [torch.randint(0, 93, (1, n), generator=g) for n in (5, 8, 3, 6, 4, 7, 9, 2)]
        gens = [model.generate(inputs=q, temperature=0.0, block_length=BLOCK, gen_length=12, steps=BLOCK,
                               threshold=0.3, eos_id=EOS_ID, mask_id=MASK_ID, eos_early_stop=False)[0].tolist()
                for q in prompts]
    from safetensors.torch import save_file

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(TINY_CONFIG | {"transformers_version": "4.52.3"}, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, args.out / "model.safetensors",
              metadata={"format": "pt"})
    save_file({"input_ids": ids, "logits": logits.float().contiguous(), "logits_bf16": logits_bf16.float().contiguous()},
              args.out / "reference.safetensors",
              metadata={"source": f"ZHZisZZ/dllm@{COMMIT} {SOURCE_DIR}/modeling_llada2_moe.py LLaDA2MoeModelLM",
                        "mask": "tril(ones(nb, nb)) repeated to block 4 (generate())"})
    record = {"source": f"ZHZisZZ/dllm@{COMMIT} {SOURCE_DIR}/modeling_llada2_moe.py LLaDA2MoeModelLM.generate",
              "settings": {"temperature": 0.0, "block_length": BLOCK, "steps": BLOCK, "gen_length": 12,
                           "threshold": 0.3, "eos_id": EOS_ID, "mask_id": MASK_ID, "eos_early_stop": False},
              "cases": [{"prompt": q[0].tolist(), "generated": out} for q, out in zip(prompts, gens)]}
    (args.out / "generate.json").write_text(json.dumps(record, indent=1) + "\n")
    model.forward = forward
    edits = record_edits(args.dllm, model.state_dict(), modeling, g)
    (args.out / "generate_edit.json").write_text(json.dumps(edits, indent=1) + "\n")
    print(f"wrote {args.out}: logits {tuple(logits.shape)}, max |logit| {logits.abs().max():.3f}, "
          f"bf16 max diff {(logits_bf16.float() - logits).abs().max():.4f}, generated {gens}")


if __name__ == "__main__":
    main()
