"""Model families, one module each, registered by name in :data:`FAMILIES` and detected from
``config.json`` by ``model_type`` (:func:`detect`; issue 48). See :mod:`maskrl.models.families.base`
for what a family holds and how to add one from outside ``src/``."""
from maskrl.models.families.base import (FAMILIES, Family, declared_block_size, detect, model_block_size,
                                         model_decode_rule, save_maskrl_layout)
from maskrl.models.families.native import NativeFamily
from maskrl.models.families import dream, fast_dllm, llada, llada2, maskrl_layout, sdar  # noqa: F401  (registers them)

__all__ = ["FAMILIES", "Family", "NativeFamily", "declared_block_size", "detect", "model_block_size",
           "model_decode_rule", "save_maskrl_layout"]
