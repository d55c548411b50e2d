"""``make test``'s second pass (issue 19 item 7) really runs under the kernel set and thread count it
asks for: ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``) picks torch's CPU kernels at
import, ``MASKRL_TEST_THREADS`` the threads of every test (``conftest._threads``)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch


@pytest.mark.numerics
def test_this_process_runs_the_requested_kernels_and_threads():
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    if asked:
        assert torch.backends.cpu.get_cpu_capability() == asked.upper()
    # from the environment, not conftest's constant: a conftest that stops reading the variable fails here
    assert torch.get_num_threads() == int(os.environ.get("MASKRL_TEST_THREADS", "1"))


@pytest.mark.parametrize("asked", ["default", "avx2"])
def test_the_kernel_variable_takes_effect(asked):
    """On every x86-64 machine the tests run on (AVX2 at least), both kernel sets can be forced."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("not an AVX2 / AVX-512 CPU")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": asked}
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == asked.upper()
