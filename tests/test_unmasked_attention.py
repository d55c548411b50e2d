"""The decoder forward with no attention mask (transformers' ``is_causal=False``), the in-place cache's slice write,
and the sampler's output layer on the ruled positions only (maskrl/models/attention.py, sampling/cache.py)."""
from __future__ import annotations

import pytest
import torch
from conftest import fresh_tiny, tiny_dream

import maskrl.models.adapter as adapter_module
from maskrl.models import build_tiny
from maskrl.models.attention import _tail_start, in_place_cache, unmasked_bidirectional
from maskrl.sampling import SamplerConfig, generate
from maskrl.sampling.cache import Hidden, head_at, split_head

MODELS = {"llama": fresh_tiny, "qwen2": lambda: tiny_dream(scale=20.0)}


def masked_only(monkeypatch):
    """Force the additive 4-D mask path (the forward as it was before the unmasked one)."""
    monkeypatch.setattr(adapter_module, "unmasked_bidirectional", lambda *a: False)


def tol(*ts: torch.Tensor) -> float:
    """A few float32 roundings of the tensors' scale."""
    return 64 * torch.finfo(torch.float32).eps * max(float(t.detach().abs().max()) for t in ts)


@pytest.mark.numerics
@pytest.mark.parametrize("name", sorted(MODELS))
def test_unmasked_forward_equals_the_masked_one(name, monkeypatch):
    ad = MODELS[name]()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(3, 40, (2, 12), generator=g)
    attn = torch.ones_like(x, dtype=torch.bool)
    pos = ad.position_ids(attn)
    with torch.no_grad():
        fast, kv = ad.decoder_forward(x, attn, pos, return_kv=True)
        store = [(k.clone(), v.clone()) for k, v in kv]
        w_fast, _ = ad.decoder_forward(x[:, 8:], attn, pos[:, 8:], past=store,
                                       write_at=torch.arange(8, 12).expand(2, -1))
        p_fast, _ = ad.decoder_forward(x[:, 8:], attn, pos[:, 8:], past=[(k[..., :8, :], v[..., :8, :]) for k, v in kv])
        masked_only(monkeypatch)
        slow, kv_slow = ad.decoder_forward(x, attn, pos, return_kv=True)
        store = [(k.clone(), v.clone()) for k, v in kv_slow]
        w_slow, _ = ad.decoder_forward(x[:, 8:], attn, pos[:, 8:], past=store,
                                       write_at=torch.arange(8, 12).expand(2, -1))
        p_slow, _ = ad.decoder_forward(x[:, 8:], attn, pos[:, 8:],
                                       past=[(k[..., :8, :], v[..., :8, :]) for k, v in kv_slow])
    for a, b in ((fast, slow), (w_fast, w_slow), (p_fast, p_slow)) + tuple(zip(kv[0], kv_slow[0])):
        torch.testing.assert_close(a, b, rtol=0, atol=tol(a, b))


def test_unmasked_forward_is_bidirectional():
    """A causal forward would leave column 0 unchanged when a later token changes."""
    ad = fresh_tiny()
    x = torch.randint(3, 40, (1, 10), generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[0, -1] = (x[0, -1] + 1) % 40
    attn = torch.ones_like(x, dtype=torch.bool)
    with torch.no_grad():
        hx, _ = ad.decoder_forward(x, attn, ad.position_ids(attn))
        hy, _ = ad.decoder_forward(y, attn, ad.position_ids(attn))
    assert unmasked_bidirectional(ad.model.get_decoder(), attn, False)
    assert (hx[0, 0] - hy[0, 0]).abs().max() > 1e-4


def test_unmasked_path_only_where_it_holds():
    ad = fresh_tiny()
    dec = ad.model.get_decoder()
    ones = torch.ones((2, 5), dtype=torch.bool)
    padded = ones.clone()
    padded[0, 0] = False
    assert unmasked_bidirectional(dec, ones, False)
    assert not unmasked_bidirectional(dec, padded, False)  # padding: the 4-D mask
    assert not unmasked_bidirectional(dec, ones, True)  # block-causal models: the 4-D mask
    assert not unmasked_bidirectional(torch.nn.Linear(2, 2), ones, False)  # a class not known to honour is_causal
    block = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, block_size=4)
    calls = []
    real = adapter_module.unmasked_bidirectional
    adapter_module.unmasked_bidirectional = lambda *a: calls.append(real(*a)) or calls[-1]
    try:
        with torch.no_grad():
            block.decoder_forward(torch.ones((1, 8), dtype=torch.long), torch.ones((1, 8), dtype=torch.bool),
                                  torch.arange(8)[None])
    finally:
        adapter_module.unmasked_bidirectional = real
    assert calls == [False]


def test_tail_write_equals_the_scatter():
    g = torch.Generator().manual_seed(2)
    keys, values = torch.randn(2, 3, 10, 4, generator=g), torch.randn(2, 3, 10, 4, generator=g)
    new_k, new_v = torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g)
    tail = torch.arange(6, 10).expand(2, -1)
    inner = torch.tensor([[2, 3, 4, 5], [6, 7, 8, 9]])
    assert _tail_start(tail, 10) == 6 and _tail_start(inner, 10) is None
    for cols in (tail, inner):
        k1, v1, k2, v2 = keys.clone(), values.clone(), keys.clone(), values.clone()
        layer = in_place_cache([(k1, v1)], cols).layers[0]
        assert (layer.tail is not None) == (cols is tail)
        out_k, out_v = layer.update(new_k, new_v)
        idx = cols[:, None, :, None].expand(-1, 3, -1, 4)
        assert out_k is k1 and out_v is v1
        assert torch.equal(k1, k2.scatter_(2, idx, new_k)) and torch.equal(v1, v2.scatter_(2, idx, new_v))


@pytest.mark.numerics
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("tau", [0.0, 0.9])
def test_rollouts_equal_the_masked_forward(cache, tau, monkeypatch):
    """Unpadded prompts (every key valid: the unmasked path): tokens as with the 4-D mask, probabilities
    within float tolerance."""
    ad = fresh_tiny()
    ids = torch.randint(3, 40, (3, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids, dtype=torch.bool)
    cfg = SamplerConfig(gen_length=16, block_length=4, steps=8, cache=cache, temperature=tau)
    fast = generate(ad, ids, mask, cfg, generator=torch.Generator().manual_seed(4))
    masked_only(monkeypatch)
    slow = generate(ad, ids, mask, cfg, generator=torch.Generator().manual_seed(4))
    assert torch.equal(fast.completion_ids, slow.completion_ids)
    assert torch.equal(fast.commit_step, slow.commit_step)
    torch.testing.assert_close(fast.commit_prob, slow.commit_prob, rtol=0, atol=tol(fast.commit_prob))


def test_the_output_layer_runs_on_the_ruled_positions_only(monkeypatch):
    """Without observers the step's output layer gets the block's still-masked positions alone."""
    ad = fresh_tiny()
    seen, real = [], ad.head
    monkeypatch.setattr(ad, "head", lambda h: seen.append(h.shape[0]) or real(h))
    ids = torch.randint(3, 40, (1, 6), generator=torch.Generator().manual_seed(5))
    ro = generate(ad, ids, torch.ones_like(ids, dtype=torch.bool),
                  SamplerConfig(gen_length=8, block_length=4, steps=4, cache="dual", temperature=0.0))
    # fixed schedule, 2 commits a step: 4 then 2 masked positions in each block
    assert seen == [4, 2, 4, 2]
    assert int(ro.num_steps.max()) == 4


def test_split_head_rows_are_those_of_their_own_call():
    ad = fresh_tiny()
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(2, 8, 32, generator=g)
    part = Hidden(torch.arange(2), hidden, torch.zeros(2, dtype=torch.long))
    cover = torch.zeros(2, 8, dtype=torch.bool)
    cover[:, 2:7] = True
    first = cover.clone()
    first[0, 3] = first[1, 5] = False
    with torch.no_grad():
        got = split_head(ad, [part], cover, first, 0)
        alone = head_at(ad, [part], first, 0)
        whole = head_at(ad, [part], cover, 0)
    fidx = cover.flatten().long().cumsum(0).view(2, 8) - 1
    assert torch.equal(got[fidx[first]], alone)
    torch.testing.assert_close(got, whole, rtol=0, atol=tol(whole))


def test_meta_tensors_keep_the_masked_path():
    """The planner runs forwards on the meta device, where no value can be read."""
    ad = fresh_tiny()
    meta = torch.ones((2, 5), dtype=torch.bool, device="meta")
    assert not unmasked_bidirectional(ad.model.get_decoder(), meta, False)
    assert _tail_start(torch.arange(6, 10, device="meta").expand(2, -1), 10) is None
