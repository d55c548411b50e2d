"""A user's model family, outside ``src/``: one file, registered by name, detected by its ``model_type``.

``toy_block``: a Llama with every tensor name prefixed ``toy.`` and its block size under ``toy_block``
(config keys otherwise Llama's), block-causal attention, no logit shift. ``tests/test_block_families.py``
loads it with ``load_plugins([this file])``, then ``maskrl.models.load`` / ``save_model`` use it."""
from __future__ import annotations

from maskrl.models.families import FAMILIES, NativeFamily


@FAMILIES.register("toy_block")
class ToyBlock(NativeFamily):
    """Toy block family: Llama weights under ``toy.``-prefixed names, block size ``toy_block``."""

    name = "toy_block"
    display_name = "Toy"
    model_types = ("toy_block_llama",)
    model_class = "LlamaForCausalLM"
    mask_id, eos_id = 5, 4

    def native_config(self, cfg: dict):
        from transformers import LlamaConfig

        keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "max_position_embeddings")
        return LlamaConfig(**{k: cfg[k] for k in keys}, tie_word_embeddings=False, use_cache=False)

    def block_size(self, cfg: dict) -> int:
        return int(cfg["toy_block"])

    def to_native(self, name: str) -> str | None:
        return name.removeprefix("toy.") if name.startswith("toy.") else None

    def to_checkpoint(self, native: str) -> str:
        return "toy." + native

    def export_config(self, model, adapter) -> dict:
        c = model.config
        keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "max_position_embeddings")
        return {k: getattr(c, k) for k in keys} | {"model_type": "toy_block_llama", "toy_block": adapter.block_size,
                                                    "mask_token_id": adapter.mask_id, "eos_token_id": adapter.eos_id}
