"""Model-family adapters, the built-in tiny model and checkpoint loading (docs/spec.md §1.1)."""
from maskrl.models.adapter import ModelAdapter, bidirectional_mask
from maskrl.models.loading import load
from maskrl.models.scale import apply_lora, chat_prompt, enable_gradient_checkpointing
from maskrl.models.export import save_model
from maskrl.models.tiny import build_tiny, load_tiny
from maskrl.models.tokenizer import build_char_tokenizer

__all__ = ["ModelAdapter", "bidirectional_mask", "build_tiny", "load_tiny", "save_model", "build_char_tokenizer",
           "load", "apply_lora", "enable_gradient_checkpointing", "chat_prompt"]
