"""Block-causal attention of block-diffusion models (SDAR / TraDo, Fast-dLLM v2, LLaDA2.x): bidirectional
inside a block, causal across blocks, blocks counted from each row's first real token."""
from __future__ import annotations

import pytest
import torch

from maskrl.models import build_tiny
from maskrl.models.adapter import block_causal_mask


def _loop_mask(attention_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """Slow reference: allowed[n, i, j] from each row's positions, one pair at a time."""
    n, t = attention_mask.shape
    out = torch.zeros(n, t, t, dtype=torch.bool)
    for r in range(n):
        pos, p = [], 0
        for j in range(t):
            pos.append(p if attention_mask[r, j] else 0)
            p += int(bool(attention_mask[r, j]))
        for i in range(t):
            for j in range(t):
                out[r, i, j] = bool(attention_mask[r, j]) and pos[j] // block_size <= pos[i] // block_size
    return out


@pytest.mark.parametrize("block_size", [1, 3, 4, 32])
def test_block_causal_mask_equals_the_pairwise_rule(block_size):
    attention_mask = torch.tensor([[1] * 10, [0, 0, 0] + [1] * 7, [0] * 9 + [1]], dtype=torch.bool)
    got = block_causal_mask(attention_mask, block_size, torch.float32)[:, 0] == 0  # [N, T, T]
    assert torch.equal(got, _loop_mask(attention_mask, block_size))


@pytest.mark.numerics
def test_tiny_block_model_is_causal_across_blocks_and_bidirectional_inside():
    torch.manual_seed(0)
    adapter = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, block_size=4)
    ids = torch.randint(5, 20, (1, 12))
    base = adapter.logits(ids)
    later = ids.clone()
    later[0, 9] = 3  # block 2 changes
    moved = adapter.logits(later)
    eps = torch.finfo(torch.float32).eps * 64 * base.abs().max()
    assert (moved[0, :8] - base[0, :8]).abs().max() <= eps  # blocks 0 and 1 do not see block 2
    assert (moved[0, 8] - base[0, 8]).abs().max() > 1e-3  # position 8 sees position 9 (same block)
    # left padding: the same row behind three pad tokens gives the same logits at its tokens
    padded = torch.cat([torch.full((1, 3), adapter.pad_id), ids], dim=1)
    mask = torch.tensor([[0] * 3 + [1] * 12], dtype=torch.bool)
    assert (adapter.logits(padded, mask)[0, 3:] - base[0]).abs().max() <= eps


def test_block_size_is_saved_and_loaded(tmp_path):
    from maskrl.models import load, save_model

    adapter = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, block_size=4)
    save_model(adapter, tmp_path / "m")
    assert load(tmp_path / "m").block_size == 4
    assert build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64).block_size is None


def test_block_size_needs_a_positive_size():
    with pytest.raises(ValueError, match="block_size"):
        build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, block_size=0)


@pytest.mark.parametrize("raw, expected", [("4", 4), ("null", None)])
def test_config_reads_the_tiny_block_size(raw, expected):
    from maskrl.config import load_config

    assert load_config([], [f"model.tiny.block_size={raw}"]).model.tiny.block_size == expected


@pytest.mark.parametrize("raw", ["x", "2.5", "true"])
def test_config_refuses_a_block_size_that_is_not_an_integer(raw):
    from maskrl.config import load_config
    from maskrl.config.schema import ConfigError

    with pytest.raises(ConfigError, match="model.tiny.block_size: expected an integer"):
        load_config([], [f"model.tiny.block_size={raw}"])


@pytest.mark.parametrize("raw", ["0", "-4"])
def test_config_refuses_a_block_size_below_one(raw):
    """``maskrl config`` accepted 0 and -4; ``maskrl train`` then failed in the adapter with 'block_size 0 needs
    a positive size and attention='4d' (this adapter has attention='4d')', naming no config key."""
    from maskrl.config import load_config
    from maskrl.config.schema import ConfigError

    with pytest.raises(ConfigError, match=rf"^model\.tiny\.block_size: must be a positive integer or null "
                                          rf"\(full attention\), got {raw}$"):
        load_config([], [f"model.tiny.block_size={raw}"])
