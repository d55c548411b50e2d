"""maskrl's block decoding against SDAR's ``block_diffusion_generate`` (``benchmarks/references/sdar_generate_reference.py``;
docs/sampler.md, "Block-diffusion models").

``tests/golden/sdar_reference.json`` holds the tokens SDAR's own function produced (JetAstra/SDAR
``generate.py``, commit in the record) in its greedy limit on the tiny block model, through a shim giving
it the model call it makes. maskrl must give the same tokens, with and without its block cache, on every
row whose decisions are clear of float noise on the machine running the test (the margins of every
argmax, every confidence order and every threshold comparison along the row's trajectory,
:class:`Margins`), so the test holds on any CPU; more than half the rows must qualify (5 to 8 of 8 here).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import benchmark_script
import torch

ROOT = Path(__file__).resolve().parents[1]
RECORD = json.loads((ROOT / "tests" / "golden" / "sdar_reference.json").read_text())


def _bench():
    return benchmark_script("references/sdar_generate_reference.py", "sdar_reference")


BENCH = _bench()


class Margins:
    """Observer: the smallest decision margin of each row along its trajectory: the gap between the top two
    logits at every committed position, between the last committed and the first left confidence (the
    top-k's boundary; ``ranked``), and (``threshold`` given) between each mask's confidence and the threshold."""

    def __init__(self, threshold: float | None, ranked: bool = True):
        self.threshold, self.ranked, self.low = threshold, ranked, {}

    def on_step(self, view) -> None:
        z = view.logits.float()
        top2 = z.topk(2, dim=-1).values
        conf = torch.softmax(z, -1).max(-1).values
        owner = view.covered.nonzero()[:, 0]
        eligible = (view.masked & view.covered)[view.covered]  # [M]
        taken = view.committed[view.covered]
        for i, row in enumerate(view.rows.tolist()):
            mine = owner == i
            c_in, c_out = conf[mine & taken], conf[mine & eligible & ~taken]
            m = [float((top2[:, 0] - top2[:, 1])[mine & taken].min())]
            if self.ranked and len(c_out):
                m.append(float(c_in.min() - c_out.max()))
            if self.threshold is not None:
                m.append(float((conf[mine & eligible] - self.threshold).abs().min()))
            self.low[row] = min([self.low.get(row, 9.0)] + m)

    def result(self) -> dict:
        return {}


def _noise(adapter, ids) -> float:
    """Float noise of the decisions: 64 float32 ulps of the largest logit magnitude (a probability moves by
    at most twice its logits' error)."""
    with torch.no_grad():
        return 64 * torch.finfo(torch.float32).eps * float(adapter.logits(ids).abs().max())


def _compare(want: list[int], got: list[int], adapter, cut: int) -> bool:
    """SDAR's tokens left of maskrl's cut last block; where SDAR stopped first (``[MASK]``), maskrl pads."""
    return all((g == adapter.pad_id) if w == adapter.mask_id else (g == w) for w, g in zip(want[:cut], got[:cut]))


@pytest.mark.numerics
@pytest.mark.parametrize("cache", ["none", "block"])
@pytest.mark.parametrize("name", sorted(RECORD["settings"]))
def test_maskrl_equals_sdars_recorded_tokens(name, cache):
    from maskrl.sampling import generate

    rec = RECORD["settings"][name]
    adapter = BENCH.tiny_block_model(eos_bias=rec["eos_bias"], scale=rec["scale"])
    cfg = BENCH.maskrl_config(name, cache)
    checked = stopped = 0
    for prompt, want in zip(RECORD["prompts"], rec["tokens"]):
        ids = BENCH.encode(adapter, prompt)
        margins = Margins(cfg.threshold if cfg.remasking == "low_confidence_dynamic" else None,
                          ranked=cfg.remasking != "sequential")
        got = generate(adapter, ids, torch.ones_like(ids, dtype=torch.bool), cfg, observers=[margins])
        if margins.low[0] <= _noise(adapter, ids):
            continue
        cut = cfg.gen_length - ids.shape[1] % adapter.block_size
        assert _compare(want, got.completion_ids[0].tolist(), adapter, cut), f"{name} {prompt!r}"
        checked += 1
        stopped += adapter.mask_id in want
    assert 2 * checked > len(RECORD["prompts"]), f"only {checked} rows clear of float noise"
    assert stopped or name != "stop", "no row that SDAR stopped early was compared"


def test_the_comparison_can_fail():
    """The same settings on the full-attention tiny model (same weights, no block mask) give other tokens."""
    from maskrl.sampling import SamplerConfig, generate

    rec = RECORD["settings"]["static"]
    adapter = BENCH.tiny_block_model(eos_bias=rec["eos_bias"], scale=rec["scale"])
    adapter.block_size = None
    cfg = SamplerConfig(gen_length=32, block_length=4, steps=32, remasking="low_confidence_static")
    differ = 0
    for prompt, want in zip(RECORD["prompts"], rec["tokens"]):
        ids = BENCH.encode(adapter, prompt)
        got = generate(adapter, ids, torch.ones_like(ids, dtype=torch.bool), cfg)
        differ += not _compare(want, got.completion_ids[0].tolist(), adapter, 32 - ids.shape[1] % 4)
    assert differ >= 1
