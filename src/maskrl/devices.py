"""Device strings checked before any work (``--device``)."""
from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; any other device string (``cpu``, ``cuda``,
    ``cuda:1``, ``mps``, ...) is checked to exist here.

    Raises:
        ValueError: naming the string when torch does not know it, or when that device is not
            available on this machine (no CUDA build or GPU, an index beyond the devices present).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"device {name!r} is not a device string (e.g. auto, cpu, cuda, cuda:1, mps): {e}") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            raise ValueError(f"device {name!r} is not available here ({count} CUDA device(s) visible"
                             f"{'' if torch.backends.cuda.is_built() else '; this torch build has no CUDA'}); "
                             "use --device auto or cpu")
        return device
    try:
        torch.empty(1, device=device)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError / AssertionError by backend
        first = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:160]
        raise ValueError(f"device {name!r} is not available here ({type(e).__name__}: {first}); "
                         "use --device auto or cpu") from None
    return device
