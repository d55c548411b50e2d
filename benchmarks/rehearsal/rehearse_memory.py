"""Memory of processes from ``/proc`` for the 8B rehearsal (:mod:`rehearse_8b`): a process's ``VmHWM`` /
``VmRSS``, resetting its peak (``clear_refs``), and a monitor thread that reads each training worker's peak
per step window; the CPU kernel libraries' per-shape caches turned off in the measured processes
(:data:`KERNEL_CACHES_OFF`)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

#: environment of every measured rehearsal process: the CPU kernel libraries' per-shape caches off. A bf16
#: matrix product on CPU goes through oneDNN (via ideep), which keeps each distinct problem shape's primitive --
#: its JIT-compiled kernel and buffers sized to that shape -- in two caches, oneDNN's own primitive cache
#: (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, default 1,024) and ideep's (``LRU_CACHE_CAPACITY``, default 1,024). A dense
#: model's step has few shapes, but the MoE experts' products have a data-dependent row count (the tokens routed to
#: each expert), so every forward adds shapes: on the LLaDA2 stand-in the caches held 0.19 GiB after two steps,
#: beside 0.28 GiB of tensors (weights, gradients, AdamW states), and the 2-process runs grew them from step to
#: step. A GPU process holds no such cache, and the plan counts tensors only; with the caches off the kernels are
#: the same (a primitive is built again for each call instead of being looked up), so the step computes the same
#: bits and its resident memory is its tensors'. ``tests/test_standins.py`` measures both settings.
KERNEL_CACHES_OFF = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0", "LRU_CACHE_CAPACITY": "1"}


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """``VmHWM`` and ``VmRSS`` of a process in bytes (``{}`` when it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    out[line.split(":")[0]] = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def reset_peak(pid: int | str = "self") -> bool:
    """Reset a process's peak resident set (``VmHWM``) to its current one (Linux >= 4.0)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class WorkerMonitor(threading.Thread):
    """Peak resident memory per worker process and per window between ``metrics.jsonl`` lines.

    Workers are the descendants of ``root`` whose environment has ``RANK`` (torchrun's); each window's
    peak is the worker's ``VmHWM`` at the window's end, after which it is reset. ``windows`` is a list of
    ``{"name", "seconds", "peak_bytes": {rank: bytes}}``.
    """

    def __init__(self, root: int, metrics: Path, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.metrics, self.interval = root, metrics, interval
        self.stop = threading.Event()
        self.windows: list[dict] = []
        self.max_rss: dict[int, int] = {}
        self.start_time = time.time()

    def _workers(self) -> dict[int, int]:
        import psutil

        found = {}
        try:
            for p in psutil.Process(self.root).children(recursive=True):
                try:
                    env = p.environ()
                except (psutil.Error, OSError):
                    continue
                if "RANK" in env and "maskrl.cli" in " ".join(p.cmdline()):
                    found[int(env["RANK"])] = p.pid
        except psutil.Error:
            pass
        return found

    def _lines(self) -> int:
        try:
            return sum(1 for line in self.metrics.read_text().splitlines() if line.strip())
        except FileNotFoundError:
            return 0

    def run(self) -> None:
        workers: dict[int, int] = {}
        last: dict[int, int] = {}
        seen = self._lines()  # a resumed run's file keeps the earlier steps' lines
        t0 = time.time()
        name = f"start_to_step_{seen + 1}"
        while not self.stop.is_set():
            if len(workers) < 2:
                workers.update(self._workers())
            for rank, pid in workers.items():
                st = proc_status(pid)
                if st:
                    last[rank] = st.get("VmHWM", 0)
                    self.max_rss[rank] = max(self.max_rss.get(rank, 0), st.get("VmRSS", 0))
            n = self._lines()
            if n > seen:
                now = time.time()
                peaks = {}
                for rank, pid in workers.items():
                    peaks[rank] = proc_status(pid).get("VmHWM", last.get(rank, 0))
                    reset_peak(pid)
                    last[rank] = 0
                self.windows.append({"name": name, "seconds": now - t0, "peak_bytes": peaks})
                seen, t0 = n, now
                name = f"step_{seen + 1}"
            time.sleep(self.interval)
        self.windows.append({"name": "last_step_to_exit", "seconds": time.time() - t0, "peak_bytes": dict(last)})


#: the RL step's phases, as :class:`maskrl.trainer.RLTrainer` methods: the rollout (with the merged LoRA copy),
#: the frozen θ_old / reference log-probs, each inner iteration's θ forwards and backwards, each optimizer step
STEP_PHASES = ("collect", "_frozen_log_probs", "_accumulate", "_update")


def phase_peaks(trainer, base: int) -> list[dict]:
    """Wrap the :data:`STEP_PHASES` of ``trainer`` (instance attributes; the class is not touched) so that each
    call records ``{"phase", "rss_before_gib", "peak_gib", "rss_after_gib"}`` -- resident memory above ``base``
    bytes, the peak (``VmHWM``) reset at the call's start -- in the returned list, as the calls run."""
    gib = 2 ** 30
    out: list[dict] = []

    def wrap(name: str, fn):
        def call(*a, **k):
            before = proc_status()["VmRSS"]
            reset_peak()
            res = fn(*a, **k)
            st = proc_status()
            out.append({"phase": name, "rss_before_gib": (before - base) / gib, "peak_gib": (st["VmHWM"] - base) / gib,
                        "rss_after_gib": (st["VmRSS"] - base) / gib})
            return res
        return call

    for name in STEP_PHASES:
        setattr(trainer, name, wrap(name, getattr(trainer, name)))
    return out

