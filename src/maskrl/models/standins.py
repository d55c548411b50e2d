"""Real-width stand-ins of LLaDA-8B-Instruct, Dream-v0-Instruct-7B and SDAR-8B-Chat / TraDo-8B, and an
independent reader of their layouts.

A stand-in is a checkpoint folder in the family's own published layout -- the published
``config.json`` keys and values (width, heads, MLP size, vocabulary, RoPE θ, norm ε, special ids),
the family's tensor names, safetensors shards with ``model.safetensors.index.json`` and tokenizer
files -- with only the number of blocks reduced (e.g. 2 instead of 32 / 28) and random weights drawn
from a seeded ``torch.Generator``. It loads through the same :func:`maskrl.models.load` path as the
real checkpoint, so a CPU run on it exercises the 4,096-wide (3,584-wide) residual stream, the
126,464-row (152,064-row) output layer, bf16 weights under fp32 LoRA and every id the real models
use. No network and no remote code are involved.

Published facts used (docs/spec.md §1.1; the configs of ``GSAI-ML/LLaDA-8B-Instruct`` and
``Dream-org/Dream-v0-Instruct-7B``, the same values as :data:`maskrl.plan.KNOWN_MODELS`):

* LLaDA-8B: ``d_model`` 4096, ``n_heads`` = ``n_kv_heads`` 32, ``mlp_hidden_size`` 12288,
  ``embedding_size`` = ``vocab_size`` 126464, ``rope_theta`` 500000, ``rms_norm_eps`` 1e-5, untied,
  no biases; mask 126336, eos = pad 126081 (``<|endoftext|>``), bos 126080 (``<|startoftext|>``),
  end of turn 126348 (``<|eot_id|>``), header tokens 126346 / 126347.
* Dream-7B (Qwen2-7B shape): ``hidden_size`` 3584, 28 query / 4 key-value heads, ``intermediate_size``
  18944, ``vocab_size`` 152064 output rows, ``rope_theta`` 1e6, ``rms_norm_eps`` 1e-6, q/k/v biases,
  untied; eos = pad 151643 (``<|endoftext|>``), ``<|im_start|>`` 151644, ``<|im_end|>`` 151645, bos
  151665, mask 151666 (``<|mask|>``); the tokenizer has 151,667 ids, so the output layer's last 397
  rows have no tokenizer entry (as in the real model).
* SDAR-8B-Chat / TraDo-8B-Instruct (JetAstra/SDAR ``training/model/SDAR-8B-Chat/``, commit c2041a8):
  Qwen3 -- ``hidden_size`` 4096, 36 layers, 32 query / 8 key-value heads of ``head_dim`` 128, per-head
  RMSNorm of queries and keys (``q_norm`` / ``k_norm``) before RoPE, no biases, ``intermediate_size``
  12288, ``vocab_size`` 151936, ``rope_theta`` 1e6, ``rms_norm_eps`` 1e-6, untied; ``block_size`` 4
  (bidirectional inside a block, causal across blocks, blocks from position 0), no logit shift;
  eos = pad 151643, ``<|im_start|>`` 151644, ``<|im_end|>`` 151645 (``generation_config.json`` ends at
  ``[151645, 151643]``), mask 151669 (``<|MASK|>``), no bos; the tokenizer has 151,670 ids.
* LLaDA2.0-mini (:data:`LLADA2_MINI_CONFIG`): BailingMoeV2, ``hidden_size`` 2048, 16 query / 4 key-value heads
  of 128, the first block dense (``intermediate_size`` 5120), the others MoE with experts of
  ``moe_intermediate_size`` 512 and one shared expert, partial RoPE 0.5 (θ 600000), QK-norm, block 32. Its
  stand-in also reduces the experts (8, 2 active) and the vocabulary (4,608 rows, eos = pad 4500, mask
  4503, a ``<role>HUMAN</role>...<|role_end|>`` chat template: :data:`LLADA2_STANDIN`); its tensors are
  the family's per-expert names (:mod:`maskrl.models.llada2_moe`).

The tokenizer is not the published one (which needs a download): a byte-level BPE trained with
``tokenizers`` on a corpus the caller gives (task prompts), padded with ``<|reserved_i|>`` entries to
the family's tokenizer size, with the special tokens above at their published ids and a chat
template of the family's shape (LLaDA: Llama-3-style headers; Dream: Qwen2's ``<|im_start|>``
turns). Prompt lengths in tokens therefore differ from the real tokenizer's.

:func:`reference_logits` is the *family's own layout reader*: a plain-PyTorch forward written from the
architecture facts (LLaDA's Llama block with ``ff_proj`` the SiLU gate, RMSNorm, rotate-half RoPE in
float32; Qwen2's biased q/k/v with grouped key-value heads and the one-position logit shift), reading
the folder's tensors by their checkpoint names with ``safetensors``, never through transformers or
maskrl's loader. It checks both that maskrl's loader reads a folder right and that an export is in the
layout the family's own code expects.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable, Sequence

import torch

FAMILIES = ("llada", "dream", "sdar", "llada2")

#: published GSAI-ML/LLaDA-8B-Instruct config.json (32 blocks)
LLADA_8B_CONFIG: dict = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM",
                 "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 4096,
    "embedding_dropout": 0.0, "embedding_size": 126464, "eos_token_id": 126081, "flash_attention": False,
    "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
    "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
    "layer_norm_with_affine": True, "mask_token_id": 126336, "max_sequence_length": 4096, "mlp_hidden_size": 12288,
    "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": 32, "n_kv_heads": 32,
    "n_layers": 32, "pad_token_id": 126081, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False, "use_cache": False,
    "vocab_size": 126464, "weight_tying": False,
}

#: published Dream-org/Dream-v0-Instruct-7B config.json (28 blocks)
DREAM_7B_CONFIG: dict = {
    "architectures": ["DreamModel"], "model_type": "Dream",
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "attention_dropout": 0.0, "bos_token_id": 151665, "eos_token_id": 151643, "pad_token_id": 151643,
    "mask_token_id": 151666, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28, "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": False, "use_sliding_window": False, "vocab_size": 152064,
}

#: published JetLM/SDAR-8B-Chat config.json (36 blocks); TraDo-8B-Instruct has the same
SDAR_8B_CONFIG: dict = {
    "architectures": ["SDARForCausalLM"], "model_type": "sdar",
    "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                 "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "block_size": 4, "mask_token_id": 151669, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 32768, "max_window_layers": 36,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": False, "use_sliding_window": False, "vocab_size": 151936,
}
#: SDAR's generation_config.json end ids (all of them end a completion)
SDAR_GENERATION_CONFIG = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}

#: inclusionAI LLaDA2.0-mini's config.json (dFactory ``configs/model_configs/llada2_mini``, commit 92b6890, with
#: the Hub's ``model_type`` ``llada2_moe`` for dFactory's training type ``llada2_moe_veomni``; 20 blocks)
LLADA2_MINI_CONFIG: dict = {
    "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
    "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig", "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                 "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
    "attention_dropout": 0.0, "num_hidden_layers": 20, "hidden_size": 2048, "intermediate_size": 5120,
    "first_k_dense_replace": 1, "hidden_act": "silu", "max_position_embeddings": 16384, "moe_intermediate_size": 512,
    "norm_topk_prob": True, "num_experts_per_tok": 8, "norm_head": False, "num_attention_heads": 16, "num_experts": 256,
    "num_key_value_heads": 4, "rope_theta": 600000, "rope_scaling": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_bias": False, "use_rmsnorm": True, "rms_norm_eps": 1e-06, "head_dim": 128,
    "num_shared_experts": 1, "use_cache": False, "use_qkv_bias": False, "embedding_dropout": 0.0, "norm_softmax": False,
    "output_dropout": 0.0, "vocab_size": 157184, "rotary_dim": 64, "using_split_qkv_in_self_attention": False,
    "router_dtype": "fp32", "moe_router_enable_expert_bias": True, "routed_scaling_factor": 2.5, "n_group": 8,
    "topk_group": 4, "score_function": "sigmoid", "initializer_range": 0.02, "max_window_layers": 28,
    "output_router_logits": False, "pad_token_id": 156892, "partial_rotary_factor": 0.5, "use_sliding_window": False,
}
#: what the LLaDA2 stand-in reduces besides depth: 8 experts in 4 groups of 2 (2 groups kept), 2 active, the
#: shared expert as published; a 4,608-row vocabulary with eos = pad 4,500 and mask 4,503 (156,892 and 156,895
#: in the published model, which a reduced vocabulary cannot hold), written to config.json
LLADA2_STANDIN: dict = {"num_experts": 8, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "vocab_size": 4608,
                        "pad_token_id": 4500, "eos_token_id": 4500, "mask_token_id": 4503}

#: special tokens at their published ids, and the tokenizer size (ids below it have an entry)
SPECIAL_IDS = {
    "llada": {"<|startoftext|>": 126080, "<|endoftext|>": 126081, "<|mdm_mask|>": 126336,
              "<|start_header_id|>": 126346, "<|end_header_id|>": 126347, "<|eot_id|>": 126348},
    "dream": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|beginoftext|>": 151665,
              "<|mask|>": 151666},
    "sdar": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|MASK|>": 151669},
    "llada2": {"<|endoftext|>": 4500, "<|role_end|>": 4501, "<|mask|>": 4503, "<role>": 4504, "</role>": 4505},
}
TOKENIZER_SIZE = {"llada": 126464, "dream": 151667, "sdar": 151670, "llada2": 4608}
_ROLES = {"llada": dict(bos="<|startoftext|>", eos="<|endoftext|>", pad="<|endoftext|>", mask="<|mdm_mask|>"),
          "dream": dict(bos="<|beginoftext|>", eos="<|endoftext|>", pad="<|endoftext|>", mask="<|mask|>"),
          "sdar": dict(bos=None, eos="<|endoftext|>", pad="<|endoftext|>", mask="<|MASK|>"),
          "llada2": dict(bos=None, eos="<|endoftext|>", pad="<|endoftext|>", mask="<|mask|>")}
#: chat templates of each family's shape (Jinja, as transformers applies them)
CHAT_TEMPLATES = {
    "llada": ("{{ '<|startoftext|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
              "'<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    "dream": ("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
              "{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    "sdar": ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
             "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    "llada2": ("{% for m in messages %}{{ '<role>' + {'user': 'HUMAN'}.get(m['role'], m['role'] | upper) + '</role>' + "
               "m['content'] + '<|role_end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}"
               "{% endif %}"),
}
#: text the BPE is always trained on besides the caller's corpus (digits, operators, answer tags)
BASE_CORPUS = ("0123456789 + - * / = ( ) . , ? ! : ; <answer> </answer> <reasoning> </reasoning> \\boxed{} "
               "The answer is Let us think step by step. Solve the problem. Using the numbers create an equation "
               "that equals Fill in the Sudoku puzzle so that each row column and box contains")


def family_config(family: str, num_layers: int) -> dict:
    """The published ``config.json`` of ``family`` (``llada`` | ``dream`` | ``sdar`` | ``llada2``) with ``num_layers``
    blocks (``llada2``: LLaDA2.0-mini with the experts and vocabulary of :data:`LLADA2_STANDIN`).

    Raises:
        ValueError: an unknown family or ``num_layers`` < 1.
    """
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: expected one of {', '.join(FAMILIES)}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    cfg = dict({"llada": LLADA_8B_CONFIG, "dream": DREAM_7B_CONFIG, "sdar": SDAR_8B_CONFIG,
                "llada2": LLADA2_MINI_CONFIG | LLADA2_STANDIN}[family])
    if family == "llada":
        cfg["n_layers"] = num_layers
    else:
        cfg["num_hidden_layers"] = cfg["max_window_layers"] = num_layers
    return cfg


def narrowed_config(family: str, num_layers: int, width_divisor: int = 1) -> dict:
    """:func:`family_config` with the width, heads' size and MLP divided by ``width_divisor`` (head
    counts, vocabulary and ids kept): the reduced-width stand-ins of fast tests."""
    cfg = family_config(family, num_layers)
    if width_divisor == 1:
        return cfg
    k = int(width_divisor)
    if family == "llada":
        if cfg["d_model"] % (k * cfg["n_heads"]) or (cfg["d_model"] // k // cfg["n_heads"]) % 2:
            raise ValueError(f"width_divisor {k}: d_model 4096 / {k} must keep an even head size over 32 heads")
        cfg["d_model"] //= k
        cfg["mlp_hidden_size"] //= k
    else:
        if cfg["hidden_size"] % (k * cfg["num_attention_heads"]) or (cfg["hidden_size"] // k // cfg["num_attention_heads"]) % 2:
            raise ValueError(f"width_divisor {k}: hidden_size 3584 / {k} must keep an even head size over 28 heads")
        cfg["hidden_size"] //= k
        cfg["intermediate_size"] //= k
        if "head_dim" in cfg:  # SDAR: heads x head_dim is the width, both shrink alike
            cfg["head_dim"] //= k
        if "moe_intermediate_size" in cfg:  # LLaDA2: each expert's width too
            cfg["moe_intermediate_size"] //= k
    return cfg


# ----------------------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------------------
def build_tokenizer(family: str, corpus: Iterable[str] = (), bpe_size: int = 4096):
    """A byte-level BPE ``PreTrainedTokenizerFast`` of the family's size, special ids and chat template.

    Args:
        family: ``llada``, ``dream`` or ``sdar``.
        corpus: training text for the BPE merges (with :data:`BASE_CORPUS`); e.g. the task prompts.
        bpe_size: tokens learnt by the BPE trainer (alphabet included); ids ``[bpe_size, size)`` are
            ``<|reserved_i|>`` fillers, except the family's special tokens at their published ids.

    Returns:
        A tokenizer with ``len(tok)`` = 126,464 (LLaDA), 151,667 (Dream) or 151,670 (SDAR), ``mask_token``,
        ``eos_token``, ``pad_token``, ``bos_token`` (SDAR: none) set and ``chat_template`` of the family's shape.

    Raises:
        ValueError: an unknown family, or ``bpe_size`` reaching the first special id.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: expected one of {', '.join(FAMILIES)}")
    specials = SPECIAL_IDS[family]
    if bpe_size >= min(specials.values()):
        raise ValueError(f"bpe_size {bpe_size} reaches the first special id {min(specials.values())}")
    trainer = trainers.BpeTrainer(vocab_size=bpe_size, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    learner.train_from_iterator([BASE_CORPUS, *corpus], trainer)
    state = json.loads(learner.to_str())["model"]
    vocab: dict[str, int] = dict(state["vocab"])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    by_id = {i: s for s, i in specials.items()}
    for i in range(len(vocab), TOKENIZER_SIZE[family]):
        vocab[by_id.get(i, f"<|reserved_{i}|>")] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in sorted(specials, key=specials.get)])
    roles = _ROLES[family]
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=roles["bos"], eos_token=roles["eos"],
                                  pad_token=roles["pad"], mask_token=roles["mask"])
    out.chat_template = CHAT_TEMPLATES[family]
    return out


# ----------------------------------------------------------------------------------------------
# weights in the family's layout
# ----------------------------------------------------------------------------------------------
def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape of a LLaDA (``d_model`` key), Dream or SDAR config dict, in the
    family's own names (LLaDA: ``model.transformer.blocks.{i}.ff_proj.weight`` ...; Dream: Qwen2's, with
    q/k/v biases; SDAR: Qwen3's, ``head_dim`` wide heads, per-head ``q_norm`` / ``k_norm``, no biases)."""
    if cfg.get("model_type") == "llada2_moe":  # the module's own names are the family's (per expert)
        from maskrl.models.families.llada2 import LLaDA2
        from maskrl.models.llada2_moe import LLaDA2MoeModelLM

        with torch.device("meta"):
            model = LLaDA2MoeModelLM(LLaDA2().native_config(cfg))
        return {k: tuple(t.shape) for k, t in model.state_dict().items()}
    if "d_model" in cfg:
        d, f, v, n = cfg["d_model"], cfg["mlp_hidden_size"], cfg["embedding_size"], cfg["n_layers"]
        kv = cfg["n_kv_heads"] * d // cfg["n_heads"]
        out = {"model.transformer.wte.weight": (v, d)}
        for i in range(n):
            b = f"model.transformer.blocks.{i}."
            out |= {b + "attn_norm.weight": (d,), b + "q_proj.weight": (d, d), b + "k_proj.weight": (kv, d),
                    b + "v_proj.weight": (kv, d), b + "attn_out.weight": (d, d), b + "ff_norm.weight": (d,),
                    b + "ff_proj.weight": (f, d), b + "up_proj.weight": (f, d), b + "ff_out.weight": (d, f)}
        out |= {"model.transformer.ln_f.weight": (d,), "model.transformer.ff_out.weight": (v, d)}
        return out
    d, f, v, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    q, kv, qwen3 = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["model_type"] == "sdar"
    out = {"model.embed_tokens.weight": (v, d)}
    for i in range(n):
        b = f"model.layers.{i}."
        out |= {b + "input_layernorm.weight": (d,), b + "self_attn.q_proj.weight": (q, d),
                b + "self_attn.k_proj.weight": (kv, d), b + "self_attn.v_proj.weight": (kv, d),
                b + "self_attn.o_proj.weight": (d, q), b + "post_attention_layernorm.weight": (d,),
                b + "mlp.gate_proj.weight": (f, d), b + "mlp.up_proj.weight": (f, d), b + "mlp.down_proj.weight": (d, f)}
        out |= ({b + "self_attn.q_norm.weight": (hd,), b + "self_attn.k_norm.weight": (hd,)} if qwen3 else
                {b + "self_attn.q_proj.bias": (q,), b + "self_attn.k_proj.bias": (kv,), b + "self_attn.v_proj.bias": (kv,)})
    out |= {"model.norm.weight": (d,), "lm_head.weight": (v, d)}
    return out


def _draw(name: str, shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype, std: float) -> torch.Tensor:
    """One tensor: norms 1 + N(0, 0.05²) (not all ones, so that a misplaced norm is visible), biases
    and matrices N(0, std²); drawn in float32 chunks of at most 4,096 rows (bounded memory)."""
    out = torch.empty(shape, dtype=dtype)
    if name.endswith(("norm.weight", "ln_f.weight")):
        out.copy_(1 + 0.05 * torch.randn(shape, generator=gen))
        return out
    rows = shape[0]
    for start in range(0, rows, 4096):
        stop = min(rows, start + 4096)
        out[start:stop].copy_(std * torch.randn((stop - start, *shape[1:]), generator=gen))
    return out


def write_standin(folder: str | os.PathLike, family: str, num_layers: int = 2, *, seed: int = 0,
                  corpus: Iterable[str] = (), dtype: torch.dtype = torch.bfloat16, width_divisor: int = 1,
                  init_std: float = 0.02, bpe_size: int = 4096) -> Path:
    """Write a randomly initialised stand-in checkpoint in the family's published layout.

    Files: ``config.json`` (:func:`family_config`, ``num_layers`` blocks), one safetensors shard per
    block plus one for the embedding and one for the final norm and output layer, with
    ``model.safetensors.index.json``, and the tokenizer files of :func:`build_tokenizer`. Each tensor
    is drawn from its own ``torch.Generator`` seeded with ``seed`` and the tensor's index, so a tensor
    does not depend on the sharding; peak memory is about one shard.

    Args:
        folder: output folder (created; existing files are replaced).
        family: ``llada``, ``dream`` or ``sdar``.
        num_layers: blocks (32 / 28 / 36 in the published models).
        seed: weights' seed.
        corpus: text for the tokenizer's BPE (task prompts).
        dtype: stored dtype (bf16, as published).
        width_divisor: 1 for the real width; k > 1 divides width and MLP by k (fast tests only).
        init_std: standard deviation of the matrices (LLaDA's ``init_std`` 0.02; Dream's
            ``initializer_range`` 0.02).
        bpe_size: see :func:`build_tokenizer`.

    Returns:
        The folder, as a :class:`~pathlib.Path`.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = narrowed_config(family, num_layers, width_divisor)
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    shapes = tensor_shapes(cfg)
    groups: dict[str, list[str]] = {}
    for name in shapes:
        if ".blocks." in name or ".layers." in name:
            shard = "block_" + name.split(".")[3 if ".blocks." in name else 2]
        elif name in ("model.transformer.wte.weight", "model.embed_tokens.weight", "model.word_embeddings.weight"):
            shard = "embedding"
        else:
            shard = "head"
        groups.setdefault(shard, []).append(name)
    order = list(shapes)
    files = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map, total = {}, 0
    for file, names in zip(files, groups.values()):
        tensors = {}
        for name in names:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + order.index(name))
            tensors[name] = _draw(name, shapes[name], gen, dtype, init_std)
            total += tensors[name].numel() * tensors[name].element_size()
            weight_map[name] = file
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        del tensors
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if family == "sdar":
        (folder / "generation_config.json").write_text(json.dumps(SDAR_GENERATION_CONFIG, indent=2) + "\n")
    build_tokenizer(family, corpus, bpe_size).save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------------------------
# the family's own layout reader (independent of transformers and maskrl's loader)
# ----------------------------------------------------------------------------------------------
def read_tensors(folder: str | os.PathLike, names: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
    """Tensors of a folder by their checkpoint names (``model.safetensors.index.json`` or
    ``model.safetensors``), as stored; ``names`` limits which."""
    from safetensors import safe_open

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        wm = json.loads(index.read_text())["weight_map"]
    else:
        with safe_open(folder / "model.safetensors", framework="pt") as f:
            wm = {k: "model.safetensors" for k in f.keys()}
    want = list(wm) if names is None else list(names)
    missing = [n for n in want if n not in wm]
    if missing:
        raise KeyError(f"{folder}: no tensors {missing[:5]} in the checkpoint")
    out: dict[str, torch.Tensor] = {}
    for file in sorted({wm[n] for n in want}):
        with safe_open(folder / file, framework="pt") as f:
            for n in want:
                if wm[n] == file:
                    out[n] = f.get_tensor(n)
    return out


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w.float() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE on ``x`` [N, H, T, hd] (frequencies θ^(-2i/hd), duplicated over the halves)."""
    hd, t = x.shape[-1], x.shape[-2]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _lin(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    y = x @ w.float().T
    return y if b is None else y + b.float()


def reference_logits(folder: str | os.PathLike, input_ids: torch.Tensor, aligned: bool = True) -> torch.Tensor:
    """Logits of a LLaDA, Dream or SDAR layout folder from a plain float32 PyTorch forward (module docstring).

    Every query attends to every position (no causal mask, no padding: give unpadded rows); SDAR's
    queries attend the keys of their own and earlier blocks (``position // block_size``, positions from
    0), after RMSNorm of each head's query and key. Weights
    are read one block at a time and upcast per matrix product, so memory stays near one block.

    Args:
        folder: a folder with a LLaDA (``d_model`` key), Dream or SDAR ``config.json`` and its tensors.
        input_ids: ``[N, T]`` long.
        aligned: Dream's raw logit at ``i`` predicts token ``i + 1``; with ``aligned`` the result is
            shifted so that ``out[:, i]`` predicts token ``i`` (position 0 is then NaN); LLaDA and SDAR
            are unshifted either way.

    Returns:
        ``[N, T, V]`` float32.
    """
    cfg = json.loads((Path(folder) / "config.json").read_text())
    llada = "d_model" in cfg
    if llada:
        d, h, n = cfg["d_model"], cfg["n_heads"], cfg["n_layers"]
        kvh, eps, theta = cfg.get("n_kv_heads") or h, cfg["rms_norm_eps"], cfg["rope_theta"]
        top = read_tensors(folder, ["model.transformer.wte.weight"])
        x = top["model.transformer.wte.weight"][input_ids].float()
    else:
        d, h, n = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
        kvh, eps, theta = cfg["num_key_value_heads"], cfg["rms_norm_eps"], cfg["rope_theta"]
        top = read_tensors(folder, ["model.embed_tokens.weight"])
        x = top["model.embed_tokens.weight"][input_ids].float()
    del top
    hd = cfg.get("head_dim") or d // h
    nq, t = input_ids.shape
    sdar = cfg.get("model_type") == "sdar"
    blk = torch.arange(t) // cfg["block_size"] if sdar else torch.zeros(t, dtype=torch.long)
    hidden = blk[None, :] > blk[:, None]  # [T(query), T(key)]: a later block's key
    for i in range(n):
        if llada:
            p = f"model.transformer.blocks.{i}."
            names = {"an": "attn_norm.weight", "q": "q_proj.weight", "k": "k_proj.weight", "v": "v_proj.weight",
                     "o": "attn_out.weight", "fn": "ff_norm.weight", "g": "ff_proj.weight", "u": "up_proj.weight",
                     "dn": "ff_out.weight"}
        else:
            p = f"model.layers.{i}."
            names = {"an": "input_layernorm.weight", "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
                     "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
                     "fn": "post_attention_layernorm.weight", "g": "mlp.gate_proj.weight", "u": "mlp.up_proj.weight",
                     "dn": "mlp.down_proj.weight", "qb": "self_attn.q_proj.bias", "kb": "self_attn.k_proj.bias",
                     "vb": "self_attn.v_proj.bias"}
            if sdar:
                names = {k: v for k, v in names.items() if k not in ("qb", "kb", "vb")}
                names |= {"qn": "self_attn.q_norm.weight", "kn": "self_attn.k_norm.weight"}
        w = {k: v for k, v in zip(names, read_tensors(folder, [p + s for s in names.values()]).values())}
        a = _rms(x, w["an"], eps)
        q = _lin(a, w["q"], w.get("qb")).view(nq, t, h, hd).transpose(1, 2)
        k = _lin(a, w["k"], w.get("kb")).view(nq, t, kvh, hd).transpose(1, 2)
        v = _lin(a, w["v"], w.get("vb")).view(nq, t, kvh, hd).transpose(1, 2)
        if sdar:
            q, k = _rms(q, w["qn"], eps), _rms(k, w["kn"], eps)
        q, k = _rope(q, theta), _rope(k, theta)
        k, v = k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)
        scores = ((q @ k.transpose(-1, -2)) / math.sqrt(hd)).masked_fill(hidden, float("-inf"))
        x = x + _lin((torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(nq, t, h * hd), w["o"])
        f = _rms(x, w["fn"], eps)
        x = x + _lin(torch.nn.functional.silu(_lin(f, w["g"])) * _lin(f, w["u"]), w["dn"])
        del w
    if llada:
        w = read_tensors(folder, ["model.transformer.ln_f.weight", "model.transformer.ff_out.weight"])
        out = _lin(_rms(x, w["model.transformer.ln_f.weight"], eps), w["model.transformer.ff_out.weight"])
        return out
    w = read_tensors(folder, ["model.norm.weight", "lm_head.weight"])
    raw = _lin(_rms(x, w["model.norm.weight"], eps), w["lm_head.weight"])
    if not aligned or sdar:
        return raw
    out = torch.full_like(raw, float("nan"))
    out[:, 1:] = raw[:, :-1]
    return out
