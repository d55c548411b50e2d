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


def sharp_tiny():
    """The tiny model with a 40x output layer: confident enough that the threshold schedule commits
    several tokens in some steps, so rows take different numbers of steps."""
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    with torch.no_grad():
        a.model.get_output_embeddings().weight.mul_(40.0)
    a.model.eval()
    return a
