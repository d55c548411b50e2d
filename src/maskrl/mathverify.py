"""Answer equivalence with math-verify, run in worker processes with a hard per-item timeout
(docs/spec.md §5: the gsm8k and math500 reward).

math-verify bounds its own ``parse``/``verify`` calls with ``signal.alarm``, which only works in the
main thread of a process; in a thread it raises, and some sympy calls can still hang past the alarm
(C code) or crash the interpreter. So every comparison runs in a worker **process** of a
:class:`VerifyPool`, and the caller waits at most ``timeout_s`` seconds per item. An item that times
out, or whose worker dies, scores as failed; the pool is then terminated (its workers are killed) and
a fresh one runs the remaining items. The caller never sees the failure as an exception.

Workers are started with the ``spawn`` method: the caller may hold threads (tokenizers, torch,
data loaders) that make ``fork`` unsafe. As with any ``spawn`` pool, a script that triggers scoring at
import time must keep its entry point under ``if __name__ == "__main__":``.

**Numbers are compared relatively.** math-verify's ``verify`` rounds decimals to a fixed number of
decimal places (``float_rounding=6``) and treats a numeric difference below its evaluation precision
as zero, so at small magnitudes different numbers pass for equal (``0.0000673`` for ``.0000672``,
``\\frac{1}{2^{98}}`` for ``\\frac{1}{2^{99}}``, ``10^{-21}`` for ``10^{-20}``). :func:`math_equal` keeps
every comparison math-verify makes and then checks the numbers itself
(:func:`numbers_differ`): two exact values (integers, fractions, powers, roots, π, ...) must be
equal, at any magnitude; a decimal must agree with the other value to
:data:`SIGNIFICANT_DIGITS` significant digits (math-verify's six places, read at every magnitude), or
to as many as the gold answer writes when it writes more. It only ever turns math-verify's "equal"
into "not equal", never the reverse.

This module imports nothing heavy at import time, so a worker only loads math-verify and sympy.
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import re
import signal
import threading
import time
from functools import lru_cache
from itertools import product
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


#: significant digits a decimal must share with the value it is compared with (math-verify rounds to
#: six decimal places, ``float_rounding=6``: six significant digits at magnitudes in [0.1, 1); here
#: at every magnitude). A gold answer that writes more digits asks for as many (:func:`written_digits`).
SIGNIFICANT_DIGITS = 6
#: decimal digits at which exact values (no decimal in them) are evaluated when sympy cannot decide
#: their equality exactly (irrational values: roots, π, logarithms, ...)
EXACT_EVAL_DIGITS = 60
#: relative difference below which two exact values evaluated at :data:`EXACT_EVAL_DIGITS` digits are
#: the same number (well above that evaluation's rounding, far below any difference a problem asks about)
EXACT_REL_TOL = 1e-45
#: expressions with more operations than this are left to math-verify alone (no symbolic difference)
_MAX_OPS = 200

_DECIMAL_LITERAL_RE = re.compile(r"(?<![\d.])(\d*)\.(\d+)")


def written_digits(text: str) -> int:
    """The most significant digits any decimal literal in ``text`` writes (0 when it has none):
    ``"0.0000672"`` -> 3, ``"36.00"`` -> 4, ``"3.14159265358979"`` -> 15, ``"\\frac{1}{2}"`` -> 0."""
    best = 0
    for whole, frac in _DECIMAL_LITERAL_RE.findall(text if isinstance(text, str) else ""):
        best = max(best, len((whole + frac).lstrip("0")))
    return best


def _percent_base(expr):
    """``x`` of a percentage ``x%`` as latex2sympy writes it (``x·UnevaluatedExpr(1/100)``), else ``None``."""
    from sympy import Mul, Rational, UnevaluatedExpr

    if isinstance(expr, Mul) and len(expr.args) == 2 and expr.args[1] == UnevaluatedExpr(Rational(1, 100)):
        return expr.args[0]
    return None


def _number(expr):
    """``expr`` evaluated (``doit``) when it is a number (no free symbols), else ``None``."""
    from sympy import Expr

    if not isinstance(expr, Expr):
        return None
    try:
        value = expr.doit()
    except Exception:  # noqa: BLE001 - a sympy object that cannot be evaluated is not compared here
        value = expr
    if not isinstance(value, Expr) or value.free_symbols or not value.is_number:
        return None
    return value


def _readings(expr) -> list:
    """The values a numeric answer can mean: one, or for a percentage ``x%`` both ``x/100`` and ``x``
    (math-verify accepts ``50`` for ``50\\%``); empty when ``expr`` is not a number."""
    base = _percent_base(expr)
    if base is not None:
        x = _number(base)
        return [] if x is None else [x / 100, x]
    x = _number(expr)
    return [] if x is None else [x]


def _evalf(value, digits: int):
    """``value`` as an mpmath number (real or complex) at ``digits`` decimal digits."""
    import mpmath

    re_part, im_part = value.evalf(digits).as_real_imag()
    with mpmath.workdps(digits):
        return mpmath.mpc(mpmath.mpf(str(re_part)), mpmath.mpf(str(im_part)))


def numbers_close(gold, pred, digits: int = SIGNIFICANT_DIGITS) -> bool:
    """Whether two sympy numbers are the same value under the relative rule of this module.

    * Both exact (no ``Float`` in either: integers, fractions, powers, roots, π, ...): equal as
      numbers -- rationals compared exactly, other values evaluated at :data:`EXACT_EVAL_DIGITS`
      digits and equal within a relative :data:`EXACT_REL_TOL` (so ``2^{99}`` is not ``2^{99} + 1``
      and ``\\frac{1}{2^{99}}`` is not ``\\frac{1}{2^{98}}``).
    * A decimal on either side: ``|gold − pred| ≤ ½·10^(e + 1 − digits)`` with ``e = ⌊log10 |gold|⌋``,
      i.e. they agree to ``digits`` significant digits of the gold value, at any magnitude
      (``0.0000673`` is not ``.0000672``; ``0.333333`` is ``\\frac{1}{3}``). A gold value of 0 needs 0.
    * Infinities and NaN: only the same one.
    """
    import mpmath
    from sympy import Float, S

    if gold == pred:
        return True
    special = (S.NaN, S.Infinity, S.NegativeInfinity, S.ComplexInfinity)
    if gold.has(*special) or pred.has(*special):
        return False
    if not gold.has(Float) and not pred.has(Float):
        if gold.is_Rational and pred.is_Rational:
            return False  # sympy's == is exact for rationals
        g, p = _evalf(gold, EXACT_EVAL_DIGITS), _evalf(pred, EXACT_EVAL_DIGITS)
        with mpmath.workdps(EXACT_EVAL_DIGITS):
            scale = max(abs(g), abs(p))
            return scale == 0 or abs(g - p) <= EXACT_REL_TOL * scale
    g, p = _evalf(gold, EXACT_EVAL_DIGITS), _evalf(pred, EXACT_EVAL_DIGITS)
    with mpmath.workdps(EXACT_EVAL_DIGITS):
        if g == 0:
            return p == 0
        e = int(mpmath.floor(mpmath.log10(abs(g))))
        return abs(g - p) <= mpmath.mpf(5) * mpmath.power(10, e - digits)


def _values_differ(gold, pred, digits: int) -> bool:
    gv, pv = _readings(gold), _readings(pred)
    if not gv or not pv:
        return False
    return not any(numbers_close(g, p, digits) for g in gv for p in pv)


def _constant_part(expr):
    syms = expr.free_symbols
    return expr.as_independent(*syms, as_Add=True)[0] if syms else expr


def _shifted(gold, pred, digits: int) -> bool:
    """Two symbolic expressions that differ by a number: whether that number matters
    (``x + 10^{-20}`` vs ``x + 10^{-21}``): the constant parts compared by :func:`numbers_close`."""
    from sympy import expand

    if gold.count_ops() > _MAX_OPS or pred.count_ops() > _MAX_OPS:
        return False
    d = expand(gold - pred)
    if d.free_symbols or not d.is_number or d == 0:
        return False
    c = _constant_part(expand(gold))
    return not numbers_close(c, c - d, digits)


def _assignment_value(expr):
    """``v`` of ``x = v`` (a symbol on the left; math-verify reads an assignment as its value), else ``None``."""
    from sympy import Eq, Symbol

    if isinstance(expr, Eq) and isinstance(expr.lhs, Symbol):
        return expr.rhs
    return None


def _sorted_by_value(items) -> list | None:
    """The members of a set in order of value (real part, then imaginary), ``None`` unless all are numbers."""
    keyed = []
    for i, x in enumerate(items):
        r = _readings(x)
        if not r:
            return None
        v = _evalf(r[0], EXACT_EVAL_DIGITS)
        keyed.append((v.real, v.imag, i, x))
    return [x for *_, x in sorted(keyed, key=lambda t: t[:3])]


def numbers_differ(gold, pred, digits: int = SIGNIFICANT_DIGITS) -> bool:
    """True when two parsed answers that math-verify calls equal hold numbers that are not
    (:func:`numbers_close`): a number, or a number in the same place of both answers -- an assignment
    ``x = v``, the members of sets and tuples (sets matched in order of value), the ends of intervals,
    the entries of matrices, the sides of relations, or a constant term by which two symbolic
    expressions differ. False whenever the answers are not of these shapes (the comparison is then
    math-verify's alone), and never raises.

    Args:
        gold, pred: ``math_verify.parse`` results (sympy objects; strings are never numbers here).
        digits: significant digits a decimal must share (see :data:`SIGNIFICANT_DIGITS`).
    """
    try:
        return _differ(gold, pred, digits, depth=0)
    except Exception:  # noqa: BLE001 - a sympy corner case: keep math-verify's verdict
        return False


def _differ(gold, pred, digits: int, depth: int) -> bool:
    from sympy import Basic, Expr, FiniteSet, Interval, MatrixBase, Tuple
    from sympy.core.relational import Relational

    if depth > 8 or not isinstance(gold, (Basic, MatrixBase)) or not isinstance(pred, (Basic, MatrixBase)):
        return False
    ga, pa = _assignment_value(gold), _assignment_value(pred)
    if ga is not None or pa is not None:  # x = v against v, or x = v against y = w: the values
        return _differ(gold if ga is None else ga, pred if pa is None else pa, digits, depth + 1)
    if isinstance(gold, MatrixBase) and isinstance(pred, MatrixBase):
        if gold.shape != pred.shape:
            return False
        return any(_differ(a, b, digits, depth + 1) for a, b in zip(gold, pred))
    if isinstance(gold, Interval) and isinstance(pred, Interval):
        return _differ(gold.start, pred.start, digits, depth + 1) or _differ(gold.end, pred.end, digits, depth + 1)
    if isinstance(gold, Interval) and isinstance(pred, (FiniteSet, Tuple)) and len(pred.args) == 2:
        gold = Tuple(gold.start, gold.end)  # math-verify reads "(a, b)" either way
    if isinstance(pred, Interval) and isinstance(gold, (FiniteSet, Tuple)) and len(gold.args) == 2:
        pred = Tuple(pred.start, pred.end)
    if isinstance(gold, (FiniteSet, Tuple)) and isinstance(pred, (FiniteSet, Tuple)):
        a, b = list(gold.args), list(pred.args)
        if len(a) != len(b):
            return False
        if isinstance(gold, FiniteSet) or isinstance(pred, FiniteSet):  # unordered: match by value
            a, b = _sorted_by_value(a), _sorted_by_value(b)
            if a is None or b is None:
                return False
        return any(_differ(x, y, digits, depth + 1) for x, y in zip(a, b))
    if isinstance(gold, Relational) and isinstance(pred, Relational):
        g = gold.lhs - gold.rhs
        same = [pred.lhs - pred.rhs] if type(gold) is type(pred) else []
        flipped = [pred.rhs - pred.lhs] if type(pred) is _inverse(type(gold)) else []
        options = same + flipped
        return bool(options) and all(_shifted(g, p, digits) or _values_differ(g, p, digits) for p in options)
    if isinstance(gold, Expr) and isinstance(pred, Expr):
        if gold.free_symbols or pred.free_symbols:
            return _shifted(gold, pred, digits)
        return _values_differ(gold, pred, digits)
    return False


def _inverse(rel: type) -> type | None:
    from sympy import Eq, GreaterThan, LessThan, StrictGreaterThan, StrictLessThan

    return {GreaterThan: LessThan, LessThan: GreaterThan, StrictGreaterThan: StrictLessThan,
            StrictLessThan: StrictGreaterThan, Eq: Eq}.get(rel)


def math_equal(gold: str, answer: str) -> bool:
    """True when ``answer`` is mathematically equivalent to ``gold``: math-verify says so, and the
    numbers in them agree under this module's relative rule (:func:`numbers_differ`).

    Both strings are bare answers (no ``\\boxed{}``; e.g. ``"\\frac{1}{2}"``, ``"1,000"``, ``"x=5"``);
    each is wrapped as ``\\boxed{...}`` and read with ``math_verify.parse`` (LaTeX and plain
    expressions; a string that sympy cannot read is kept and compared as a string). Each pair of
    readings is compared with ``math_verify.verify(gold, answer)`` (gold first: verify is not
    symmetric) and, when verify calls it equal, by :func:`numbers_differ`, with
    ``max(SIGNIFICANT_DIGITS, written_digits(gold))`` significant digits for decimals.

    Must run in the main thread of a process (math-verify uses ``signal.alarm``); call it through
    :class:`VerifyPool` (see :func:`verify_many`), not directly from threaded code.
    """
    from math_verify import parse, verify

    gold_parsed = _parse_gold(gold)
    pred_parsed = parse(_boxed(answer), parsing_timeout=MV_PARSE_TIMEOUT_S)
    if not gold_parsed or not pred_parsed:
        return False
    digits = max(SIGNIFICANT_DIGITS, written_digits(gold))
    return any(verify(g, p, timeout_seconds=MV_VERIFY_TIMEOUT_S) and not numbers_differ(g, p, digits)
               for g, p in product(gold_parsed, pred_parsed))


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
