"""Fast-dLLM v2 (``model_type: "Fast_dLLM_Qwen"``, ``Fast_dLLM_QwenForCausalLM``; NVlabs/Fast-dLLM v2,
``Efficient-Large-Model/Fast_dLLM_v2_7B``): block diffusion on Qwen2.5, loaded into transformers' own
:class:`~transformers.Qwen2ForCausalLM` without remote code (docs/spec.md §1.1; issue 48).

Facts relied on (the family's ``modeling.py`` / ``configuration.py`` as published with the 7B model):

* Qwen2 weights and names: q/k/v with bias, o_proj without, SiLU-gated MLP, RMSNorm, rotate-half RoPE;
  the config keys are Qwen2's.
* ``bd_size`` (32) is the block size: at inference, query block ``i`` attends keys of blocks ``<= i``
  (``eval_block_diff_mask``: ``q_idx // bd_size >= kv_idx // bd_size``), blocks counted from position 0.
* **Shifted logits** like Dream: ``logits[i]`` predicts token ``i + 1`` (the adapter re-aligns them).
* mask ``|<MASK>|`` 151665, stop ``<|im_end|>`` 151645.

Checked against the family's own ``Fast_dLLM_QwenForCausalLM`` (its forward and its ``generate``, on a tiny
checkpoint in its layout; ``benchmarks/references/fast_dllm_v2_reference.py``, docs/models.md).

Refused (``NotImplementedError`` naming the key): sliding-window attention, a scaled RoPE, a non-SiLU
activation. Exports: Qwen2 names and keys, ``model_type: "Fast_dLLM_Qwen"``, ``bd_size``,
``mask_token_id``, and the source's ``architectures`` / ``auto_map`` when it had them.
"""
from __future__ import annotations

from maskrl.models.families.base import FAMILIES
from maskrl.models.families.sdar import SDAR, block_size_of

#: Qwen2 config keys read from (and written to) a Fast-dLLM v2 ``config.json``
QWEN2_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
              "attention_dropout", "bos_token_id", "eos_token_id")

#: Fast-dLLM v2's block size when ``config.json`` has no ``bd_size`` (that of the published models)
FAST_DLLM_BLOCK_SIZE = 32


@FAMILIES.register("fast_dllm_v2")
class FastDLLMv2(SDAR):
    """Fast-dLLM v2: Qwen2, block-causal attention (``bd_size``), shifted logits, mask 151665."""

    name = "fast_dllm_v2"
    display_name = "Fast-dLLM v2"
    model_types = ("Fast_dLLM_Qwen",)
    architectures = ("Fast_dLLM_QwenForCausalLM",)
    model_class = "Qwen2ForCausalLM"
    mask_id, eos_id, stop_ids = 151665, 151645, (151643,)
    shift = True
    keys = QWEN2_KEYS

    def block_size(self, cfg: dict) -> int:
        return block_size_of(cfg, "bd_size", FAST_DLLM_BLOCK_SIZE, self.display_name)

    def export_config(self, model, adapter) -> dict:
        out = super().export_config(model, adapter)
        out["bd_size"] = out.pop("block_size")
        return out
