"""maskrl.machine: the key that exact (bit-for-bit) records are valid under names the processor."""
from __future__ import annotations

import torch

from maskrl.machine import cpu_identity, float_key

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480C
stepping\t: 8
flags\t\t: fpu avx512f

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
"""


def test_cpu_identity_reads_the_first_processor_only():
    assert cpu_identity(CPUINFO) == "GenuineIntel family 6 model 143 stepping 8 (Intel(R) Xeon(R) Platinum 8480C)"


def test_two_processors_at_one_kernel_set_have_different_keys():
    amd = CPUINFO.split("\n\n")[1].replace("processor\t: 1", "processor\t: 0")
    assert cpu_identity(amd) == "AuthenticAMD family 25 model 17 stepping ? (?)"
    assert cpu_identity(amd) != cpu_identity(CPUINFO)


def test_without_cpuinfo_fields_the_identity_is_not_a_linux_one(monkeypatch):
    monkeypatch.setattr("platform.processor", lambda: "")
    assert cpu_identity("") == "unknown-cpu"
    assert cpu_identity("flags\t: avx2\n") == "unknown-cpu"


def test_float_key_names_torch_kernels_threads_and_processor():
    key = float_key(threads=3)
    assert key.startswith(f"torch{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}-threads3-")
    assert key.endswith(cpu_identity())
    assert float_key() == float_key(torch.get_num_threads())
