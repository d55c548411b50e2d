"""Shared fixtures: tiny models built in milliseconds, never downloaded."""
from __future__ import annotations

import pytest
import torch

from maskrl.models import build_tiny


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)
    yield


@pytest.fixture
def tiny():
    """A randomly initialised tiny bidirectional Llama (fp32, eval mode)."""
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    a.model.eval()
    return a
