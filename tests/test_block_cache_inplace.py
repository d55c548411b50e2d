"""The block cache's window forwards written in place (docs/sampler.md, "Block-diffusion models"): a window
forward that writes its keys/values into the preallocated store and attends the store's filled prefix equals
the forward against a concatenated copy of the cache bit for bit, for rows whose windows start at different
columns, all rows or a subset, plain steps and refills, shifted or not; the store keeps every column a row
reads later."""
from __future__ import annotations

import pytest
import torch

from conftest import benchmark_script
from maskrl.sampling import SamplerConfig
from maskrl.sampling.blockcache import BlockKVCache
from maskrl.text import encode_prompts

PROMPTS = ["a", "abc", "x + y = 3", "the cat sat on"]


def _concatenated(ad, store, rows, x, a, pos, w0, width):
    """The slow reference: a fresh cache of the rows' first ``max(w0)`` columns (each row's from its ``w0`` on
    masked) with the window's keys/values appended (``[g, W, d]`` hidden, the window's keys/values)."""
    wcols = w0[:, None] + torch.arange(width)
    reach = int(w0.max())
    past = [(k[rows, :, :reach].clone(), v[rows, :, :reach].clone()) for k, v in store]
    key_mask = torch.cat([a[:, :reach] & (torch.arange(reach)[None] < w0[:, None]), a.gather(1, wcols)], 1)
    key_pos = torch.cat([pos[:, :reach], pos.gather(1, wcols)], 1)
    return ad.decoder_forward(x.gather(1, wcols), key_mask, pos.gather(1, wcols), past=past, return_kv=True,
                              key_positions=key_pos)


@pytest.mark.numerics
@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("write", [False, True])
@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [1, 2, 3], [0, 2, 3]])
def test_in_place_window_equals_the_concatenated_cache_bit_for_bit(shift, write, rows):
    """All rows and consecutive ones (a view of the store), others (a copy of their caches)."""
    ad = benchmark_script("references/sdar_generate_reference.py", "sdar_reference").tiny_block_model(block_size=4)
    ad.shift = shift
    b, L = 4, 16
    ids, mask = encode_prompts(ad.tokenizer, PROMPTS)
    n, p = ids.shape
    comp = torch.randint(5, 40, (n, L + b), generator=torch.Generator().manual_seed(0))
    x = torch.cat([ids, comp], 1)
    a = torch.cat([mask, torch.ones(n, L, dtype=torch.bool), torch.zeros(n, b, dtype=torch.bool)], 1)
    cache = BlockKVCache(ad, SamplerConfig(gen_length=L, block_length=b, steps=L, cache="block"), n, p,
                         ad.position_ids(a[:, :p + L]), torch.zeros(n, dtype=torch.long))
    with torch.no_grad():
        _, kv = ad.decoder_forward(x, a, cache.pos_ids, return_kv=True)
        cache._write(torch.arange(n), torch.arange(x.shape[1]).expand(n, -1), kv)  # every column filled
        rows = torch.tensor(rows)
        w0 = p + torch.tensor([5, 1, 4, 5])[rows] - (0 if write else int(shift))  # rows at different columns
        width = 2 * b if write else b + int(shift)
        xr, ar, pos = x[rows], a[rows], cache.pos_ids[rows]
        want, win_kv = _concatenated(ad, cache.store, rows, xr, ar, pos, w0, width)
        before = [(k.clone(), v.clone()) for k, v in cache.store]
        got = cache._window(rows, xr, ar, w0, width, write)
    assert torch.equal(got, want)
    valid = w0 if write else w0 + int(shift)  # [g] columns a row reads later: [0, valid)
    for (k, v), (k0, v0), (wk, wv) in zip(cache.store, before, win_kv):
        for i, r in enumerate(rows.tolist()):
            assert torch.equal(k[r, :, :valid[i]], k0[r, :, :valid[i]]) and torch.equal(v[r, :, :valid[i]], v0[r, :, :valid[i]])
            if write:  # a refill's keys/values at its own columns
                assert torch.equal(k[r, :, w0[i]:w0[i] + width], wk[i]) and torch.equal(v[r, :, w0[i]:w0[i] + width], wv[i])
        out = sorted(set(range(n)) - set(rows.tolist()))
        assert torch.equal(k[out], k0[out]) and torch.equal(v[out], v0[out])  # rows not in the forward untouched
