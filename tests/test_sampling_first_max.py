"""``first_max`` (the sampler's argmax) returns ``argmax``'s index: ties, NaN and infinities included."""
from __future__ import annotations

import pytest
import torch

from maskrl.sampling.commit import first_max, gumbel_max


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_first_max_equals_argmax(dtype):
    g = torch.Generator().manual_seed(0)
    for vocab in (1, 2, 33, 8192):
        for kind in range(4):
            z = torch.randint(0, 3 if kind else 1000, (17, vocab), generator=g).to(dtype)  # kind > 0: many ties
            if kind == 2:
                z[torch.rand(z.shape, generator=g) < 0.02] = float("nan")
            if kind == 3:
                z[:3], z[3:5] = float("-inf"), float("inf")
                z[5, ::2] = float("nan")
            assert torch.equal(first_max(z), z.argmax(-1)), (vocab, kind)


def test_first_max_takes_the_first_of_tied_maxima():
    z = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("nan"), 2.0, float("nan"), 5.0], [-1.0, -1.0, -1.0, -1.0]])
    assert first_max(z).tolist() == [1, 0, 0]


def test_gumbel_max_at_temperature_zero_is_the_argmax():
    z = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(gumbel_max(z, 0.0, None), z.argmax(-1))
