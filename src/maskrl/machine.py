"""Where float bits are valid: the key under which exact (bit-for-bit) values are recorded.

A float32 or bf16 result is reproducible bit for bit only for the same software *and* the same float
kernels. torch's own vectorised kernels follow the ATen CPU capability (AVX2 / AVX-512 / default),
but its matrix products come from MKL and oneDNN, which choose their kernels (blocking, summation
order) by the processor itself: two AVX-512 machines of different vendors or generations give
different last bits, and a decoding rule that ranks near-equal confidences then commits other
tokens. The pinned digests (``tests/golden``) and the recorded Dream tokens
(``tests/golden/dream_reference.json``) are therefore keyed by :func:`float_key`, which names the
processor, and are checked exactly only where the key matches.
"""
from __future__ import annotations

import platform

import torch

_CPUINFO_FIELDS = ("vendor_id", "cpu family", "model", "stepping", "model name")


def cpu_identity(cpuinfo: str | None = None) -> str:
    """The processor as ``<vendor> family <f> model <m> stepping <s> (<model name>)``.

    Read from ``/proc/cpuinfo`` (its first processor; ``cpuinfo`` passes that file's text, for tests).
    Where the file is absent (not Linux) or lacks the fields, ``platform.processor()`` or
    ``"unknown-cpu"``; such a key never equals a Linux machine's, so exact checks skip there.
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                cpuinfo = fh.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # end of the first processor's block
            continue
        name, _, value = line.partition(":")
        name = name.strip()
        if name in _CPUINFO_FIELDS and name not in fields:
            fields[name] = value.strip()
    if not fields.get("vendor_id"):
        return platform.processor() or "unknown-cpu"
    return (f"{fields['vendor_id']} family {fields.get('cpu family', '?')} model {fields.get('model', '?')} "
            f"stepping {fields.get('stepping', '?')} ({fields.get('model name', '?')})")


def float_key(threads: int | None = None) -> str:
    """``torch<version>-<ATen CPU capability>-threads<n>-<cpu_identity()>``: where recorded bits hold.

    ``threads`` defaults to ``torch.get_num_threads()`` (a thread count splits reductions differently).
    """
    n = torch.get_num_threads() if threads is None else threads
    return f"torch{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}-threads{n}-{cpu_identity()}"
