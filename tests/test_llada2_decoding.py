"""LLaDA2's threshold decoding (issue 52 item 2) on the one block sampler, against the tokens of the family's own
``generate()`` (``tests/data/llada2_tiny/generate.json``, recorded by ``benchmarks/references/llada2_reference.py``) in its
greedy limit (temperature 0: argmax candidate, confidence its probability).

LLaDA2's rule per step of a block -- commit every mask whose confidence exceeds ``threshold`` when there are at
least the step's transfer count of them, else the count most confident (capped at the masks left) -- is the
sampler's ``remasking: low_confidence_dynamic`` under ``schedule: fixed`` with ``steps`` = blocks × LLaDA2's
``steps`` per block. Compared: the tokens left of maskrl's cut last block (LLaDA2 pads the window to whole
blocks and trims; maskrl's last block ends at ``gen_length``), on every row whose decisions are clear of float
noise (:class:`test_sampling_sdar.Margins`), with and without the exact block KV cache; more than half the rows
must qualify."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from maskrl.models import load
from maskrl.sampling import SamplerConfig, generate
from test_sampling_sdar import Margins, _noise

DATA = Path(__file__).resolve().parent / "data" / "llada2_tiny"
RECORD = json.loads((DATA / "generate.json").read_text())


def _adapter():
    adapter = load(DATA)
    adapter.block_size = RECORD["settings"]["block_length"]
    return adapter


def _config(cache: str) -> SamplerConfig:
    s = RECORD["settings"]
    blocks = s["gen_length"] // s["block_length"]
    return SamplerConfig(gen_length=s["gen_length"], block_length=s["block_length"], steps=blocks * s["steps"],
                         schedule="fixed", remasking="low_confidence_dynamic", threshold=s["threshold"],
                         temperature=0.0, cache=cache)


@pytest.mark.numerics
@pytest.mark.parametrize("cache", ["none", "block"])
def test_block_sampler_equals_llada2_generate(cache):
    adapter, cfg = _adapter(), _config(cache)
    assert RECORD["settings"]["temperature"] == 0.0 and RECORD["settings"]["mask_id"] == adapter.mask_id
    checked = 0
    for case in RECORD["cases"]:
        ids = torch.tensor([case["prompt"]])
        margins = Margins(cfg.threshold)
        got = generate(adapter, ids, torch.ones_like(ids, dtype=torch.bool), cfg, observers=[margins])
        if margins.low[0] <= _noise(adapter, ids):
            continue
        cut = cfg.gen_length - ids.shape[1] % adapter.block_size
        assert got.completion_ids[0, :cut].tolist() == case["generated"][:cut], case["prompt"]
        checked += 1
    assert 2 * checked > len(RECORD["cases"]), f"only {checked} rows clear of float noise"


def test_the_comparison_can_fail():
    """The same decoding with full attention (no block mask) gives other tokens on some row."""
    adapter, cfg = _adapter(), _config("none")
    adapter.block_size = None
    differ = 0
    for case in RECORD["cases"]:
        ids = torch.tensor([case["prompt"]])
        got = generate(adapter, ids, torch.ones_like(ids, dtype=torch.bool), cfg)
        cut = cfg.gen_length - ids.shape[1] % 4
        differ += got.completion_ids[0, :cut].tolist() != case["generated"][:cut]
    assert differ >= 1
