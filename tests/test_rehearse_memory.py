"""The rehearsal's memory instrument (``benchmarks/rehearsal/rehearse_memory.py``): what a measured process holds
besides the step's tensors.

An MoE layer's expert products have a data-dependent row count (the tokens routed to each expert), so each
forward brings matrix products of new shapes. On CPU a bf16 product runs through oneDNN, whose primitive cache
and ideep's LRU cache keep one primitive per shape (its JIT kernel and shape-sized buffers): resident memory
that grows with the shapes seen, which a GPU process does not hold and ``maskrl plan`` does not count. It made the
plan 26-46 % low on every LLaDA2 rehearsal record. The rehearsal's processes run with both caches off
(``KERNEL_CACHES_OFF``); these tests measure, in fresh processes, that an MoE layer's forwards and backwards
then leave nothing resident once their tensors are freed, that they do with the caches on, and that the outputs
are bit for bit the same either way.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import benchmark_script

#: the child: bf16 forward + backward of one LLaDA2 MoE layer (8 experts, 2 active + 1 shared, width 1024) on
#: 12 batches of 33..77 tokens (new per-expert row counts on every call); prints the resident memory left
#: after the calls (all their tensors freed) above the level after a first call, and a digest of the outputs
CHILD = r"""
import gc, hashlib, json, torch
torch.set_num_threads(1)
from maskrl.models.llada2_moe import LLaDA2MoeConfig, SparseMoE

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096

cfg = LLaDA2MoeConfig(hidden_size=1024, num_experts=8, num_experts_per_tok=2, num_shared_experts=1, n_group=4,
                      topk_group=2, moe_intermediate_size=512, pad_token_id=None)
g = torch.Generator().manual_seed(0)
moe = SparseMoE(cfg)
for p in moe.parameters():
    p.data = (torch.randn(p.shape, generator=g) * 0.02).to(torch.bfloat16)
xs = [torch.randn(1, n, 1024, generator=g).to(torch.bfloat16) for n in range(33, 81, 4)]
h = hashlib.sha256()

def call(x):
    x = x.clone().requires_grad_(True)
    y = moe(x)
    y.float().square().sum().backward()
    h.update(y.detach().view(torch.int16).numpy().tobytes()); h.update(x.grad.view(torch.int16).numpy().tobytes())

call(xs[0])
gc.collect()
start = rss()
for x in xs[1:]:
    call(x)
for p in moe.parameters():
    p.grad = None
gc.collect()
print(json.dumps({"held_bytes": rss() - start, "digest": h.hexdigest()}))
"""


def _child(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two fresh processes that import transformers: ~20 s of CPU
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="resident memory is read from /proc (Linux)")
def test_moe_forwards_leave_no_kernel_cache_resident_in_the_rehearsals_processes():
    benchmark_script("rehearsal/rehearse_memory.py")  # rehearse_launch imports it by name
    launch = benchmark_script("rehearsal/rehearse_launch.py")
    env = launch._env(1)  # every measured rehearsal process's environment
    caches_on = {k: v for k, v in env.items() if k not in launch.KERNEL_CACHES_OFF}
    on, off = _child(caches_on), _child(env)
    mib = 2 ** 20
    if on["held_bytes"] < 32 * mib:  # an AVX2-only CPU: bf16 products do not go through oneDNN, nothing is cached
        pytest.skip(f"this CPU / torch keeps no per-shape kernel cache ({on['held_bytes'] / mib:.1f} MiB held)")
    # 11 calls of new shapes: ~80 MiB held with the caches on (Xeon, AVX-512 bf16, torch 2.13); off: none
    assert off["held_bytes"] < 8 * mib, off
    assert on["digest"] == off["digest"]  # the same kernels: bit for bit the same outputs and gradients


#: the child of the test below: ``phase_peaks`` on a stand-in trainer, in a process of its own (in the suite's
#: process other tests' threads and freed heap would blur a resident-memory peak); prints the log as JSON
PEAKS_CHILD = r"""
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location("rehearse_memory", sys.argv[1])
mem = importlib.util.module_from_spec(spec); spec.loader.exec_module(mem)

class Trainer:
    def collect(self):
        torch.ones(16 * 2 ** 20)  # 64 MiB of float32, written, freed on return
        return "batch"
    def _frozen_log_probs(self):
        return None
    def _accumulate(self):
        return 0
    def _update(self):
        return True

t = Trainer()
log = mem.phase_peaks(t, mem.proc_status()["VmRSS"])
assert t.collect() == "batch" and t._update() is True and t._accumulate() == 0
assert Trainer().collect.__func__ is Trainer.collect  # the class is untouched: only the instance is wrapped
print(json.dumps(log))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="peaks are read from /proc (Linux)")
def test_phase_peaks_records_each_phase_call_and_its_allocation():
    """``phase_peaks`` wraps a trainer's step phases on the instance: one entry per call, in order, whose peak
    holds what the call allocated (a 64 MiB buffer written and freed inside ``collect``)."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "rehearsal" / "rehearse_memory.py"
    out = subprocess.run([sys.executable, "-c", PEAKS_CHILD, str(script)], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    log = json.loads(out.stdout.strip().splitlines()[-1])
    assert [e["phase"] for e in log] == ["collect", "_update", "_accumulate"]
    assert log[0]["peak_gib"] - log[0]["rss_before_gib"] >= 60 / 1024  # the 64 MiB buffer, in GiB
    assert log[1]["peak_gib"] - log[1]["rss_before_gib"] < 32 / 1024
