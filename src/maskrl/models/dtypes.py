"""Floating dtypes by name: the one rule the loaders, the exporter, the planner and the CLI share."""
from __future__ import annotations

import torch

DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
               "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
               "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A floating ``torch.dtype`` from itself or its name (``"bfloat16"``, ``"bf16"``, ``"torch.float32"``, ...).

    Raises:
        ValueError: naming the value given and listing the valid names (for an unknown name, a
            non-floating dtype or another type).
    """
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPE_NAMES.values():
            return dtype
    elif isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key in DTYPE_NAMES:
            return DTYPE_NAMES[key]
    raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_NAMES)}")
