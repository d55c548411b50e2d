"""Answer equivalence with math-verify, run in worker processes with a hard per-item timeout
(SPEC §5: the gsm8k and math500 reward).

math-verify bounds its own ``parse``/``verify`` calls with ``signal.alarm``, which only works in the
main thread of a process; in a thread it raises, and some sympy calls can still hang past the alarm
(C code) or crash the interpreter. So every comparison runs in a worker **process** of a
:class:`VerifyPool`, and the caller waits at most ``timeout_s`` seconds per item. An item that times
out, or whose worker dies, scores as failed; the pool is then terminated (its workers are killed) and
a fresh one runs the remaining items. The caller never sees the failure as an exception.

Workers are started with the ``spawn`` method: the caller may hold threads (tokenizers, torch,
data loaders) that make ``fork`` unsafe. As with any ``spawn`` pool, a script that triggers scoring at
import time must keep its entry point under ``if __name__ == "__main__":``.

This module imports nothing heavy at import time, so a worker only loads math-verify and sympy.
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from functools import lru_cache
from typing import Any, Callable, Sequence

logger = logging.getLogger(__name__)

#: math-verify's own alarms (whole seconds, the library's defaults), per parse and per comparison, in a worker.
MV_PARSE_TIMEOUT_S = 5
MV_VERIFY_TIMEOUT_S = 5
#: the hard wall-clock limit the caller waits per item (the backstop for math-verify's alarms).
DEFAULT_TIMEOUT_S = 20.0
DEFAULT_WORKERS = 2

#: statuses returned by :meth:`VerifyPool.map`
OK, ERROR, TIMEOUT = "ok", "error", "timeout"


def _boxed(answer: str) -> str:
    return "\\boxed{" + answer + "}"


@lru_cache(maxsize=8192)
def _parse_gold(gold: str) -> list:
    from math_verify import parse

    return parse(_boxed(gold), parsing_timeout=MV_PARSE_TIMEOUT_S)


def math_equal(gold: str, answer: str) -> bool:
    """True when ``answer`` is mathematically equivalent to ``gold`` according to math-verify.

    Both strings are bare answers (no ``\\boxed{}``; e.g. ``"\\frac{1}{2}"``, ``"1,000"``, ``"x=5"``);
    each is wrapped as ``\\boxed{...}`` and read with ``math_verify.parse`` (LaTeX and plain
    expressions; a string that sympy cannot read is kept and compared as a string), then compared
    with ``math_verify.verify(gold, answer)`` (gold first: verify is not symmetric).

    Must run in the main thread of a process (math-verify uses ``signal.alarm``); call it through
    :class:`VerifyPool` (see :func:`verify_many`), not directly from threaded code.
    """
    from math_verify import parse, verify

    gold_parsed = _parse_gold(gold)
    pred_parsed = parse(_boxed(answer), parsing_timeout=MV_PARSE_TIMEOUT_S)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=MV_VERIFY_TIMEOUT_S))


def _init_worker() -> None:
    # Ctrl-C goes to the whole process group; let the parent handle it and terminate us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # warm the imports so the first item's clock does not pay for them
        math_equal("1", "1")
    except Exception:  # noqa: BLE001 - a broken install shows up as per-item errors instead
        pass


def _ping() -> bool:
    return True


def _run_item(fn: Callable[..., Any], args: tuple) -> tuple[str, Any]:
    """Worker side: ``(OK, fn(*args))`` or ``(ERROR, "Type: message")``; never raises."""
    try:
        return OK, fn(*args)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - math-verify's TimeoutException is a BaseException
        try:
            msg = f"{type(e).__name__}: {e}"
        except Exception:  # noqa: BLE001 - str() of a sympy object can fail too
            msg = type(e).__name__
        return ERROR, msg[:300]


class VerifyPool:
    """A process pool running picklable calls with a hard per-item timeout.

    Args:
        workers: number of worker processes (>= 1).
        start_method: multiprocessing start method; ``"spawn"`` (default) is safe in a threaded parent.
        startup_timeout_s: how long to wait for a fresh pool's first worker to be ready (seconds).

    The pool is created lazily on the first :meth:`map` and re-created after a timeout; call
    :meth:`close` (or rely on the ``atexit`` hook of :func:`get_pool`) to stop the workers.
    ``map`` calls from several threads are serialised.
    """

    def __init__(self, workers: int = DEFAULT_WORKERS, start_method: str = "spawn",
                 startup_timeout_s: float = 120.0) -> None:
        if workers < 1:
            raise ValueError(f"workers={workers} must be >= 1")
        self.workers = workers
        self.start_method = start_method
        self.startup_timeout_s = startup_timeout_s
        self._pool: Any = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        #: how many pools this object has started (1 + number of restarts after hangs/crashes)
        self.starts = 0

    def _ensure(self):
        if self._pid != os.getpid():  # we were forked: the pool belongs to the parent, start our own
            self._pool, self._pid = None, os.getpid()
        if self._pool is None:
            ctx = mp.get_context(self.start_method)
            pool = ctx.Pool(self.workers, initializer=_init_worker)
            try:
                pool.apply_async(_ping).get(timeout=self.startup_timeout_s)
            except Exception as e:
                pool.terminate()
                raise RuntimeError(
                    f"math-verify worker pool did not start within {self.startup_timeout_s:.0f}s ({e!r}); "
                    "with the 'spawn' start method the calling script needs an "
                    "`if __name__ == \"__main__\":` guard"
                ) from e
            self._pool = pool
            self.starts += 1
        return self._pool

    def _terminate(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def close(self) -> None:
        """Kill the workers (idempotent); a later :meth:`map` starts a fresh pool."""
        got = self._lock.acquire(timeout=10)  # at exit, a stuck daemon thread must not block us
        try:
            if self._pid == os.getpid():
                self._terminate()
        finally:
            if got:
                self._lock.release()

    def map(self, fn: Callable[..., Any], arg_tuples: Sequence[tuple], timeout_s: float) -> list[tuple[str, Any]]:
        """Run ``fn(*args)`` for each tuple in ``arg_tuples`` in the workers.

        Args:
            fn: a module-level (picklable) function.
            arg_tuples: one argument tuple per item.
            timeout_s: seconds each item may run (wall clock, counted from when the previous item's
                result arrived, so queueing behind other items is not charged to it).

        Returns:
            One ``(status, value)`` per item, in order: ``("ok", result)``, ``("error", message)``
            when ``fn`` raised or the result could not be returned, ``("timeout", None)`` when the
            item hung or its worker died. Never raises for a failing item.
        """
        n = len(arg_tuples)
        out: list[tuple[str, Any]] = [(ERROR, "not run")] * n
        todo = list(range(n))
        with self._lock:
            while todo:
                pool = self._ensure()
                handles = [(i, pool.apply_async(_run_item, (fn, tuple(arg_tuples[i])))) for i in todo]
                todo = []
                clock = time.monotonic()
                for k, (i, handle) in enumerate(handles):
                    try:
                        out[i] = handle.get(timeout=max(0.0, clock + timeout_s - time.monotonic()))
                    except mp.TimeoutError:
                        out[i] = (TIMEOUT, None)
                        for j, later in handles[k + 1:]:
                            if later.ready():
                                out[j] = _collect(later)
                            else:
                                todo.append(j)
                        logger.warning("math-verify item timed out after %.1fs (or its worker died); "
                                       "restarting the pool for %d remaining items", timeout_s, len(todo))
                        self._terminate()
                        break
                    except Exception as e:  # noqa: BLE001 - e.g. arguments or result not picklable
                        out[i] = (ERROR, f"{type(e).__name__}: {e}"[:300])
                    clock = time.monotonic()
        return out


def _collect(handle) -> tuple[str, Any]:
    try:
        return handle.get(timeout=0)
    except Exception as e:  # noqa: BLE001
        return ERROR, f"{type(e).__name__}: {e}"[:300]


_DEFAULT_POOL: VerifyPool | None = None
_DEFAULT_LOCK = threading.Lock()


def get_pool() -> VerifyPool:
    """The shared pool (``DEFAULT_WORKERS`` workers), created on first use, stopped at exit."""
    global _DEFAULT_POOL
    with _DEFAULT_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = VerifyPool()
            atexit.register(_DEFAULT_POOL.close)
        return _DEFAULT_POOL


def verify_many(golds: Sequence[str], answers: Sequence[str | None], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                equal_fn: Callable[[str, str], bool] = math_equal, pool: VerifyPool | None = None) -> list[float]:
    """Score extracted answers against gold answers: 1.0 equivalent, else 0.0.

    Args:
        golds: gold answers (bare strings).
        answers: extracted answers; ``None`` or blank scores 0.0 without a worker call.
        timeout_s: hard per-item limit in seconds; a hung or crashed item scores 0.0.
        equal_fn: module-level ``(gold, answer) -> bool`` run in the workers (default :func:`math_equal`).
        pool: the pool to use (default :func:`get_pool`).

    Raises:
        ValueError: if the two sequences differ in length.
    """
    if len(golds) != len(answers):
        raise ValueError(f"{len(golds)} gold answers but {len(answers)} answers")
    rewards = [0.0] * len(golds)
    idx = [i for i, a in enumerate(answers) if a is not None and a.strip()]
    if not idx:
        return rewards
    results = (pool or get_pool()).map(equal_fn, [(golds[i], answers[i]) for i in idx], timeout_s)
    failed = {ERROR: 0, TIMEOUT: 0}
    for i, (status, value) in zip(idx, results):
        if status == OK:
            rewards[i] = 1.0 if value is True else 0.0
        else:
            failed[status] += 1
    if failed[ERROR] or failed[TIMEOUT]:
        logger.warning("math-verify: %d errors and %d timeouts out of %d items scored 0",
                       failed[ERROR], failed[TIMEOUT], len(idx))
    return rewards
