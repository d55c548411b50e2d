"""Running untrusted generated Python code for code rewards (docs/spec.md §5: "all tests pass, run in a
sandboxed subprocess (time, memory, no network)"; guarantees and limits in ``docs/sandbox.md``).

Tests are data: the program runs in the sandbox, the tests run here, in the trusted process, and
every call they make to the program's functions crosses the boundary as plain data of exact
builtin types (see :func:`run_program`). Nothing the program redefines in its interpreter --
equality, truth values, hashing, builtins, exceptions, the harness -- decides a pass.

Every program runs in its own interpreter process, started in a new session (so in its own process
group), with a scrubbed environment, stdin on ``/dev/null`` and a fresh temporary working
directory that is deleted afterwards. The child (``maskrl/_sandbox_child.py``) isolates itself
with the strongest mechanism the machine allows, reported in :attr:`SandboxResult.isolation`:

* ``netns,pidns,mntns,fsview,ro,uid`` (running as root): new network namespace (only a down
  loopback, so no network at all), new PID namespace (every process the program starts dies with
  it), a private file-system view (``fsview``: ``pivot_root`` into a fresh tmpfs holding only the
  system directories, the Python installation, a few ``/dev`` nodes, a fresh ``/proc`` and
  size-limited tmpfs for the working directory, ``/tmp``, ``/var/tmp`` and ``/dev/shm``; no
  project tree, datasets or home directories), read-only outside the tmpfs, and a fresh
  unprivileged uid so that ``RLIMIT_NPROC`` caps the number of processes (the kernel does not
  enforce it for root); without ``fsview`` (the view could not be built) the host's file system
  is shown read-only instead;
* ``userns,netns,pidns,mntns,fsview,ro`` (unprivileged user with user namespaces): the same through
  a user namespace, keeping the caller's uid;
* ``basic`` (no namespaces): resource limits, a process-group kill, and a Python audit hook that
  refuses sockets, process creation, ``ctypes`` and file writes outside the working directory --
  best effort only, not a security boundary. As root (e.g. a Docker container without
  CAP_SYS_ADMIN) the program still drops to a fresh uid when the interpreter's files are readable
  by everyone: ``basic,uid``.

:func:`missing_protections` names what an isolation string lacks; training with code rewards
refuses to start when anything is missing unless ``task.allow_weak_sandbox`` is set.

In every mode: wall-clock timeout (at the limit, in namespace modes the namespace's init is killed,
which makes the kernel kill every process in it; then the process group gets SIGKILL), ``RLIMIT_CPU``, ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE``,
``RLIMIT_NOFILE``, no core files, no privilege gain through exec (``PR_SET_NO_NEW_PRIVS``),
``PYTHONHASHSEED=0``. Calls and answers travel over two dedicated pipes, so printing cannot change
the score.
"""
from __future__ import annotations

import collections
import importlib
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

__all__ = ["Limits", "SandboxResult", "SandboxError", "SandboxCallError", "run_program", "run_many", "default_workers",
           "probe_isolation", "missing_protections", "SANDBOX_UID_BASE"]

#: sandboxed programs run as uid ``SANDBOX_UID_BASE + pid`` when the parent is root
SANDBOX_UID_BASE = 200_000_000
ISOLATION_MODES = ("auto", "userns", "basic")
_CHILD_SOURCE = (Path(__file__).with_name("_sandbox_child.py")).read_text(encoding="utf-8")
_DRAIN_S = 0.2  # after the program exits, how long to wait for pipes still held by escaped processes
_TERM_GRACE_S = 1.0  # after SIGTERM, how long the sandbox may take to exit before SIGKILL


class SandboxError(RuntimeError):
    """The sandbox itself failed (interpreter missing, harness crashed before user code ran) -- never
    raised because of what the program does."""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one program.

    Attributes:
        timeout_s: wall-clock seconds for the whole run, interpreter start-up included.
        cpu_s: CPU seconds per process (``RLIMIT_CPU``); ``None`` means ``ceil(timeout_s)``.
        memory_mb: address space per process in MiB (``RLIMIT_AS``); a larger allocation raises
            ``MemoryError`` inside the program.
        max_processes: processes and threads of the sandbox uid (``RLIMIT_NPROC``), the program
            itself included; enforced in the ``uid`` and ``userns`` isolation modes.
        file_mb: largest file a process may write, MiB (``RLIMIT_FSIZE``).
        tmpfs_mb: size of each private tmpfs (working directory, ``/tmp``, ...), MiB.
        open_files: open file descriptors per process (``RLIMIT_NOFILE``).
        output_bytes: how many trailing bytes of stdout and of stderr the result keeps.
    """

    timeout_s: float = 10.0
    cpu_s: int | None = None
    memory_mb: int = 1024
    max_processes: int = 16
    file_mb: int = 16
    tmpfs_mb: int = 64
    open_files: int = 256
    output_bytes: int = 4096

    def __post_init__(self) -> None:
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"Limits.timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        for name in ("memory_mb", "max_processes", "file_mb", "tmpfs_mb", "open_files", "output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")
        if self.cpu_s is not None and (not isinstance(self.cpu_s, int) or self.cpu_s <= 0):
            raise ValueError(f"Limits.cpu_s must be a positive integer or None, got {self.cpu_s!r}")

    @property
    def effective_cpu_s(self) -> int:
        return self.cpu_s if self.cpu_s is not None else max(1, math.ceil(self.timeout_s))


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed program.

    Attributes:
        status: ``"ok"`` (program and every test ran; tests may have failed), ``"error"`` (the
            program raised, did not compile, exited or crashed before finishing its tests),
            ``"timeout"`` (wall-clock or CPU limit), ``"memory"`` (a ``MemoryError`` anywhere).
        passed: number of tests that ran without raising.
        total: number of tests given.
        stdout: last ``Limits.output_bytes`` of standard output (UTF-8, undecodable bytes replaced).
        stderr: last ``Limits.output_bytes`` of standard error (tracebacks of failing tests).
        elapsed_s: wall-clock seconds from start to the end of clean-up.
        isolation: the mechanisms in force, e.g. ``"netns,pidns,mntns,ro,uid"``, ``"basic,uid"`` or
            ``"basic"``.
        pid: host pid of the sandbox's first process, which is also its process group and session
            id; ``SANDBOX_UID_BASE + pid`` is the uid in ``uid`` mode.
        exit_status: the program's ``os.waitpid`` status (``None`` when it was killed by us).
        test_errors: one line per failing test, ``"test <i>: <ExceptionName>: <message>"``.
    """

    status: str
    passed: int
    total: int
    stdout: str
    stderr: str
    elapsed_s: float
    isolation: str
    pid: int
    exit_status: int | None
    test_errors: tuple[str, ...] = ()

    @property
    def fraction(self) -> float:
        """``passed / total`` in ``[0, 1]``; 0.0 when there are no tests."""
        return self.passed / self.total if self.total else 0.0

    @property
    def missing_protections(self) -> list[str]:
        """What this run's isolation lacks, as sentences (:func:`missing_protections`)."""
        return missing_protections(self.isolation)

    @property
    def uid(self) -> int | None:
        """The uid the program ran as in ``uid`` mode, else ``None``."""
        return SANDBOX_UID_BASE + self.pid if "uid" in self.isolation.split(",") else None


class _Tail:
    """Keeps the last ``n`` bytes written to it."""

    def __init__(self, n: int) -> None:
        self.n, self.buf = n, bytearray()

    def add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > 2 * self.n:
            del self.buf[: len(self.buf) - self.n]

    def text(self) -> str:
        return bytes(self.buf[-self.n:]).decode("utf-8", "replace")


def _child_env(workdir: str) -> dict[str, str]:
    """The complete environment of a sandboxed program: nothing is inherited from the parent."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "HOME": workdir, "TMPDIR": workdir, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8", "PYTHONSAFEPATH": "1"}


def _exited(pid: int) -> bool:
    """True once ``pid`` has exited; does not reap it, so its pid (= process group id) stays reserved."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _stop(pid: int) -> None:
    """End the sandbox whose first process is ``pid`` (our unreaped child, so the pid cannot be
    reused meanwhile): SIGTERM to it -- in namespace modes it then kills and reaps the namespace's
    init -- then, after at most ``_TERM_GRACE_S``, SIGKILL to its whole process group."""
    if not _exited(pid):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        end = time.monotonic() + _TERM_GRACE_S
        while not _exited(pid) and time.monotonic() < end:
            time.sleep(0.002)
    _kill_group(pid)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _rmtree(path: str) -> None:
    def fix(func, p, _exc):  # a program may chmod its own files to 000 (matters when not root)
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)
    if os.path.exists(path):
        raise SandboxError(f"could not delete the sandbox working directory {path}")


def run_program(code: str, tests: Sequence[str] = (), *, setup: str = "", remote: Sequence[str] = (),
                limits: Limits | None = None, python: str | None = None, isolation: str = "auto",
                tmp_root: str | os.PathLike | None = None) -> SandboxResult:
    """Run ``code`` in a sandbox and score it with ``tests``, which run in *this* (trusted) process.

    Tests are trusted Python snippets (typically one ``assert`` each), executed here in a namespace
    holding ``setup``'s definitions and the builtins. Each name in ``remote``, and every name a test
    reads that neither the builtins, ``setup``, the test itself nor a top-level standard-library
    module (imported here, e.g. ``sys``) provides, stands for the program's object of that name:
    calling it sends the call to the sandbox, whose answer comes back as plain data of exact
    builtin types (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, and
    ``list``/``tuple``/``dict``/``set``/``frozenset`` of these; a few standard-library value types
    and lazy iterators are rebuilt here from plain data, see ``docs/sandbox.md``) or, for anything
    else, as an opaque handle that can only be passed back or called (it equals only itself and has
    no truth value). So the comparison, the ``assert``, and every method it relies on run here, out
    of the program's reach. A test passes when it runs without raising. ``import random`` in a test
    gives a private generator seeded with 0. The program's module is named ``solution``, so ``if
    __name__ == "__main__":`` blocks do not run.

    Args:
        code: Python source of the program (untrusted).
        tests: trusted snippets run one after another after ``code``; each is scored separately,
            and ones left when the time runs out, or after the sandbox died, count as failed. A
            call the program answers by raising a builtin exception re-raises that exception type
            here; other failures raise :class:`SandboxCallError`.
        setup: trusted code run once here before the tests (imports, helpers the tests use).
        remote: names always bound to the program's objects, even when ``setup`` defines them.
        limits: resource limits (:class:`Limits`); defaults to ``Limits()``. The wall clock covers
            the program and every call.
        python: interpreter to run (default ``sys.executable``); Python >= 3.8.
        isolation: ``"auto"`` (strongest available), ``"userns"`` (force the user-namespace path)
            or ``"basic"`` (no namespaces; audit-hook guard only).
        tmp_root: directory in which the temporary working directory is made (default: the system
            temporary directory).

    Returns:
        A :class:`SandboxResult`; what the program does never raises here.

    Raises:
        ValueError: unknown ``isolation``; ``tests`` given as a single string; ``setup`` fails.
        SandboxError: the interpreter cannot be started or the harness fails before the program
            runs (e.g. an interpreter older than Python 3.8).
    """
    limits = limits or Limits()
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
    if isinstance(tests, str):
        raise ValueError("tests must be a sequence of snippets, not a single string")
    tests = [str(t) for t in tests]
    remote = [str(r) for r in remote]
    ns, compiled, names = _test_namespace(str(setup), tests, set(remote))
    spec = {"code": str(code), "isolation": isolation, "limits": {**asdict(limits), "cpu_s": limits.effective_cpu_s}}
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="maskrl-sbx-", dir=tmp_root)
    try:
        with open(os.path.join(workdir, ".maskrl_spec.json"), "w", encoding="utf-8") as fh:
            json.dump(spec, fh)
        session = _Session(workdir, python or sys.executable, limits, start)
        try:
            errors: list[str] = []
            passed = 0
            if session.wait_program():
                for name in set(names) | set(remote):
                    ns[name] = _Remote(session, ("n", name))
                for i, test in enumerate(compiled):
                    why = test if isinstance(test, str) else _run_test(test, ns, session)
                    if why is None:
                        passed += 1
                    else:
                        errors.append(f"test {i}: {why}")
            session.finish()
        finally:
            session.close()
        return session.result(passed, len(tests), errors, start)
    finally:
        _rmtree(workdir)


class SandboxCallError(Exception):
    """A call into the sandboxed program failed: it raised an exception that is not a builtin one
    (or ``SystemExit``, ...), it died or ran out of time, or its answer broke the protocol."""


_MAX_DEPTH = 100
_MAX_LINE_BYTES = 8 << 20  # one answer; a larger one ends the run


class _Remote:
    """A program object seen from the trusted side: a name in its module or a handle to a value
    that is not plain data. Calling it calls the object in the sandbox; it has no truth value,
    equals only itself, and exposes nothing else."""

    __slots__ = ("_session", "_target", "_truthy")

    def __init__(self, session: "_Session", target: tuple[str, Any], truthy: bool = False) -> None:
        self._session, self._target, self._truthy = session, target, truthy

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._session.call(self._target, args, kwargs)

    def __bool__(self) -> bool:
        if self._truthy:  # a re.Match, whose exact type the harness checked: always true
            return True
        raise TypeError("a program object (not plain data) has no truth value in a test")

    def __repr__(self) -> str:
        kind, what = self._target
        return f"<program object {what!r}>" if kind == "n" else f"<program value #{what} (not plain data)>"


def _trusted_builtins() -> dict[str, Any]:
    """The builtins the tests run with: the real ones, except that ``import random`` gives a
    private generator seeded with 0 (deterministic rewards; this process's global ``random`` state
    is never touched)."""
    import builtins
    import random as _random
    import types

    rng = _random.Random(0)
    private = types.ModuleType("random")
    for attr in dir(_random):
        if not attr.startswith("_"):
            bound = getattr(rng, attr, None)
            setattr(private, attr, bound if callable(bound) and not isinstance(bound, type) else getattr(_random, attr))
    real_import = builtins.__import__

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "random" and level == 0:
            return private
        return real_import(name, globals, locals, fromlist, level)

    return {**vars(builtins), "__import__": _import}


def _test_namespace(setup: str, tests: list[str], remote: set[str]) -> tuple[dict, list, list[str]]:
    """Namespace with ``setup`` run in it, each test compiled (or the SyntaxError text), and the
    names the tests use that neither the builtins nor ``setup`` define (the program's names)."""
    import builtins

    ns: dict[str, Any] = {"__builtins__": _trusted_builtins(), "__name__": "maskrl_tests"}
    try:
        exec(_compiled_setup(setup), ns)  # noqa: S102 - trusted code (the dataset's)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"the tests' setup code failed: {type(e).__name__}: {e}") from e
    compiled: list[Any] = []
    names: set[str] = set()
    bound: set[str] = set()  # names the tests assign, define or import themselves
    for i, test in enumerate(tests):
        code, loaded, stored = _analyse_test(i, test)
        compiled.append(code)
        names |= loaded
        bound |= stored
    free = sorted(n for n in names - bound if n not in ns and not hasattr(builtins, n))
    std = set(getattr(sys, "stdlib_module_names", ())) - _IMPORT_SIDE_EFFECTS
    for n in [n for n in free if n in std and n not in remote]:  # e.g. a test using ``sys`` that only the program imported
        try:
            ns[n] = importlib.import_module(n)
        except ImportError:
            continue
    return ns, compiled, [n for n in free if n not in ns]


_COMPILE_LOCK = threading.Lock()
#: standard-library modules never imported on a test's behalf (importing them does something)
_IMPORT_SIDE_EFFECTS = frozenset({"antigravity", "this", "turtle", "turtledemo", "tkinter", "idlelib", "webbrowser"})


def _quiet_compile(source: Any, filename: str, flags: int = 0) -> Any:
    """``compile`` without the SyntaxWarning/DeprecationWarning of dataset code (e.g. ``'\\.'`` in
    a regex literal); the lock keeps ``catch_warnings`` from racing in ``run_many``'s threads."""
    with _COMPILE_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return compile(source, filename, "exec", flags)


@lru_cache(maxsize=1024)
def _compiled_setup(setup: str) -> Any:
    return _quiet_compile(setup, "<setup>")


@lru_cache(maxsize=16384)
def _analyse_test(i: int, test: str) -> tuple[Any, frozenset, frozenset]:
    """``(code object or "SyntaxError: ..." text, names read, names bound)`` of one test."""
    import ast

    try:
        tree = _quiet_compile(test, f"<test {i}>", ast.PyCF_ONLY_AST)
        code = _quiet_compile(tree, f"<test {i}>")
    except SyntaxError as e:
        return f"SyntaxError: {e.msg}", frozenset(), frozenset()
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            loaded.add(node.id)
        elif isinstance(node, ast.Name):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return code, frozenset(loaded), frozenset(bound)


def _run_test(code: Any, ns: dict, session: "_Session") -> str | None:
    """Run one compiled test here; ``None`` if it passed, else a one-line reason."""
    if session.dead:
        return f"not run ({session.dead})"
    try:
        exec(code, ns)  # noqa: S102 - trusted test code; program values arrive as plain data
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None


def _encode(value: Any, session: "_Session", depth: int = 0) -> Any:
    """A call argument -> the tagged JSON form (plain data, or program objects of this session)."""
    if depth > _MAX_DEPTH:
        raise ValueError("argument nested too deeply")
    t = type(value)
    if value is None or t in (bool, str, float):
        return value
    if t is int:
        return value if -(1 << 62) < value < (1 << 62) else {"i": format(value, "x")}
    if t is list:
        return [_encode(v, session, depth + 1) for v in value]
    if t is tuple:
        return {"t": [_encode(v, session, depth + 1) for v in value]}
    if t is dict:
        return {"d": [[_encode(k, session, depth + 1), _encode(v, session, depth + 1)] for k, v in value.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "f": [_encode(v, session, depth + 1) for v in value]}
    if t is bytes:
        return {"b": value.hex()}
    if t is complex:
        return {"c": [value.real, value.imag]}
    if t is _Remote and value._session is session:
        kind, what = value._target
        return {"r": what} if kind == "n" else {"h": what}
    raise SandboxCallError(f"cannot pass a {t.__name__} to the program (plain data and program objects only)")


def _decode(obj: Any, session: "_Session", depth: int = 0) -> Any:
    """The program's answer -> a value built here from exact builtin types only.

    Raises:
        SandboxCallError: anything but the documented tagged form (the program controls the text).
    """
    if depth > _MAX_DEPTH:
        raise SandboxCallError("answer nested too deeply")
    t = type(obj)
    if obj is None or t in (bool, str, int, float):
        return obj
    if t is list:
        return [_decode(v, session, depth + 1) for v in obj]
    if t is not dict or len(obj) != 1:
        raise SandboxCallError("malformed answer")
    (tag, val), = obj.items()
    try:
        if tag in ("t", "s", "f") and type(val) is list:
            items = [_decode(v, session, depth + 1) for v in val]
            return tuple(items) if tag == "t" else set(items) if tag == "s" else frozenset(items)
        if tag == "d" and type(val) is list:
            out = {}
            for pair in val:
                if type(pair) is not list or len(pair) != 2:
                    raise SandboxCallError("malformed dict in answer")
                out[_decode(pair[0], session, depth + 1)] = _decode(pair[1], session, depth + 1)
            return out
        if tag == "i" and type(val) is str and len(val) <= 1 << 20:
            return int(val, 16)
        if tag == "b" and type(val) is str:
            return bytes.fromhex(val)
        if tag == "c" and type(val) is list and len(val) == 2 and all(type(x) in (int, float) for x in val):
            return complex(float(val[0]), float(val[1]))
        if tag == "h" and type(val) is int and val >= 0:
            return _Remote(session, ("h", val))
        if tag == "x" and type(val) is list and len(val) == 2:
            return _decode_std(val[0], val[1], session, depth)
    except (TypeError, ValueError) as e:  # unhashable set member or dict key, bad hex
        raise SandboxCallError(f"malformed answer ({e})") from None
    raise SandboxCallError("malformed answer")


def _decode_std(name: Any, payload: Any, session: "_Session", depth: int) -> Any:
    """Standard-library value types, rebuilt here from plain data: ``collections.Counter``,
    ``OrderedDict``, ``defaultdict`` (without its factory), ``deque``, ``decimal.Decimal``,
    ``fractions.Fraction``, ``range``; lazy builtin iterators (generators, ``map``, ``filter``,
    ``zip``, ...) as an iterator over their items, dict views as dict views; a ``re.Match`` arrives
    as a truthy handle."""
    import collections
    import decimal
    import fractions

    if name in ("Counter", "OrderedDict", "defaultdict") and type(payload) is list:
        pairs = _decode({"d": payload}, session, depth).items()
        if name == "defaultdict":
            return collections.defaultdict(None, pairs)
        return collections.Counter(dict(pairs)) if name == "Counter" else collections.OrderedDict(pairs)
    if name == "deque" and type(payload) is list:
        return collections.deque(_decode(payload, session, depth))
    if name == "Decimal" and type(payload) is str and len(payload) <= 1 << 16:
        return decimal.Decimal(payload)
    if name == "Fraction" and type(payload) is list and len(payload) == 2:
        num, den = (_decode(v, session, depth + 1) for v in payload)
        if type(num) is int and type(den) is int and den > 0:
            return fractions.Fraction(num, den)
    if name in ("iter", "keys", "values", "items") and type(payload) is list:
        items = _decode(payload, session, depth)
        if name == "iter":
            return iter(items)
        if name == "keys":
            return dict.fromkeys(items).keys()
        if name == "values":
            return dict(enumerate(items)).values()
        if all(type(p) is tuple and len(p) == 2 for p in items):
            return dict(items).items()
    if name == "range" and type(payload) is list and len(payload) == 3 and all(type(v) is int for v in payload):
        return range(*payload)
    if name == "Match" and type(payload) is int and payload >= 0:
        return _Remote(session, ("h", payload), truthy=True)
    raise SandboxCallError("malformed answer")


class _Session:
    """One sandboxed interpreter: the program runs once, then answers calls until we close the
    request pipe. Every wait is bounded by the run's wall-clock deadline."""

    def __init__(self, workdir: str, python: str, limits: Limits, start: float) -> None:
        r_fd, w_fd = os.pipe()
        q_r, q_w = os.pipe()
        try:
            self.proc = subprocess.Popen([python, "-s", "-c", _CHILD_SOURCE, str(w_fd), str(q_r)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         pass_fds=(w_fd, q_r), env=_child_env(workdir), cwd=workdir,
                                         start_new_session=True)
        except OSError as e:
            os.close(r_fd)
            os.close(q_w)
            raise SandboxError(f"cannot start the sandbox interpreter {python!r}: {e}") from e
        finally:
            os.close(w_fd)
            os.close(q_r)
        os.set_blocking(q_w, False)
        self.r_fd, self.q_w = r_fd, q_w
        self.out, self.err = _Tail(limits.output_bytes), _Tail(limits.output_bytes)
        self.sinks = {self.proc.stdout.fileno(): self.out.add, self.proc.stderr.fileno(): self.err.add,
                      r_fd: self._feed}
        self.sel = selectors.DefaultSelector()
        for fd in self.sinks:
            self.sel.register(fd, selectors.EVENT_READ)
        self.deadline = start + limits.timeout_s
        self.partial, self.lines, self.pending = bytearray(), collections.deque(), bytearray()
        self.exit_seen_at: float | None = None
        self.timed_out = self.overflow = False
        self.isolation, self.ran, self.program_failed, self.memory, self.done = "", False, False, False, False
        self.status_word: int | None = None
        self.next_k = 0
        self.closed = False

    # -- low level
    @property
    def dead(self) -> str | None:
        """Why no more calls can be answered, or ``None``."""
        if self.timed_out:
            return "time limit"
        if self.overflow:
            return "answer too large or malformed"
        if self.exit_seen_at is not None or self.closed:
            return "the program's process ended"
        return None

    def _feed(self, data: bytes) -> None:
        self.partial += data
        while True:
            cut = self.partial.find(b"\n")
            if cut < 0:
                break
            self.lines.append(bytes(self.partial[:cut]).decode("ascii", "replace"))
            del self.partial[: cut + 1]
        if len(self.partial) > _MAX_LINE_BYTES:
            self.overflow = True

    def _pump(self) -> bool:
        """One round of I/O (at most 50 ms). False once nothing more can arrive."""
        now = time.monotonic()
        if self.exit_seen_at is None and _exited(self.proc.pid):
            self.exit_seen_at = now
            _kill_group(self.proc.pid)  # leftovers of the program's process group (basic mode)
        if self.exit_seen_at is not None and (now > self.exit_seen_at + _DRAIN_S or not self.sel.get_map()):
            return False
        if self.exit_seen_at is None and now >= self.deadline:
            self.timed_out = True
            return False
        if self.overflow:
            return False
        if self.pending and not self.closed and self.q_w not in {k.fd for k in self.sel.get_map().values()}:
            self.sel.register(self.q_w, selectors.EVENT_WRITE)
        wait = min(self.deadline - now, 0.05) if self.exit_seen_at is None else _DRAIN_S
        for key, _ in self.sel.select(max(wait, 0.0)):
            if key.fd == self.q_w:
                try:
                    del self.pending[: os.write(self.q_w, self.pending[:65536])]
                except BlockingIOError:
                    pass
                except OSError:  # the program closed its end: it will never answer
                    self.pending.clear()
                if not self.pending:
                    self.sel.unregister(self.q_w)
                continue
            data = os.read(key.fd, 65536)
            if data:
                self.sinks[key.fd](data)
            else:
                self.sel.unregister(key.fd)
        return True

    def _line(self) -> str | None:
        """The next answer line (``V``/``F``), handling status lines on the way; ``None`` when no
        answer can come any more. The ``O``/``E`` lines end the wait for the program too."""
        while True:
            while self.lines:
                line = self.lines.popleft()
                tag, _, rest = line.partition(" ")
                if tag == "I":
                    self.isolation = rest
                elif tag == "R":
                    self.ran = True
                elif tag == "M":
                    self.memory = True
                elif tag == "D":
                    self.done = True
                elif tag == "X" and rest.lstrip("-").isdigit():
                    self.status_word = int(rest)
                elif tag in ("V", "F", "O", "E"):
                    return line
            if self.dead and self.dead != "the program's process ended":
                return None
            if not self._pump() and not self.lines:
                return None

    def wait_program(self) -> bool:
        """Wait for the program to finish running; True if it did without raising."""
        line = self._line()
        if line == "O":
            return True
        self.program_failed = line == "E"
        return False

    def call(self, target: tuple[str, Any], args: tuple, kwargs: dict) -> Any:
        """Call a program object with plain-data arguments; returns the decoded answer."""
        if self.dead:
            raise SandboxCallError(f"the program can no longer answer ({self.dead})")
        k, self.next_k = self.next_k, self.next_k + 1
        request = [k, list(target), _encode(list(args), self), {str(n): _encode(v, self) for n, v in kwargs.items()}]
        self.pending += json.dumps(request, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"
        try:  # most requests fit the pipe at once; the rest is written as the program reads
            del self.pending[: os.write(self.q_w, self.pending)]
        except BlockingIOError:
            pass
        except OSError:  # the program closed its end: it will never answer
            self.pending.clear()
        line = self._line()
        if line is None:
            raise SandboxCallError(f"no answer from the program ({self.dead or 'it stopped'})")
        tag, _, rest = line.partition(" ")
        got, _, payload = rest.partition(" ")
        if tag not in ("V", "F") or got != str(k):
            self.overflow = True  # the program wrote to the result pipe itself: stop trusting it
            raise SandboxCallError("the program broke the answer protocol")
        if tag == "F":
            exc = getattr(__import__("builtins"), payload, None)
            if isinstance(exc, type) and issubclass(exc, Exception) and exc.__module__ == "builtins":
                raise exc(f"raised by the program: {payload}")
            raise SandboxCallError(f"the call raised {payload}")
        try:
            value = json.loads(payload)
        except (ValueError, RecursionError):
            raise SandboxCallError("malformed answer") from None
        try:
            return _decode(value, self)
        except RecursionError:
            raise SandboxCallError("answer nested too deeply") from None

    def finish(self) -> None:
        """Close the request pipe (the program then ends) and wait for it within the deadline."""
        if not self.closed:
            if self.q_w in {k.fd for k in self.sel.get_map().values()}:
                self.sel.unregister(self.q_w)
            os.close(self.q_w)
            self.closed = True
            self.pending.clear()
        while not self.timed_out and not self.overflow and self._pump():
            self._line_drain()  # as it arrives: a program spamming its result pipe costs no memory here
        self._line_drain()
        if not self.timed_out and not self.overflow:
            while not _exited(self.proc.pid):  # pipes closed but the process lingers
                if time.monotonic() >= self.deadline:
                    self.timed_out = True
                    break
                time.sleep(0.005)

    def _line_drain(self) -> None:
        while self.lines:
            tag, _, rest = self.lines.popleft().partition(" ")
            if tag == "D":
                self.done = True
            elif tag == "X" and rest.lstrip("-").isdigit():
                self.status_word = int(rest)
            elif tag == "M":
                self.memory = True
            elif tag == "I":
                self.isolation = rest
            elif tag == "R":
                self.ran = True

    def close(self) -> None:
        _stop(self.proc.pid)
        self.proc.wait()
        self.sel.close()
        os.close(self.r_fd)
        if not self.closed:
            os.close(self.q_w)
            self.closed = True
        self.proc.stdout.close()
        self.proc.stderr.close()

    def result(self, passed: int, total: int, errors: list[str], start: float) -> SandboxResult:
        status_word = self.status_word
        if status_word is None and not self.timed_out and self.proc.returncode is not None:
            rc = self.proc.returncode  # basic mode: the program is the process we started
            status_word = (-rc) & 0x7F if rc < 0 else (rc & 0xFF) << 8
        stderr = self.err.text()
        if not self.ran and not self.timed_out:
            raise SandboxError(f"sandbox harness failed before running the program (exit {self.proc.returncode}):\n{stderr}")
        signalled = status_word is not None and os.WIFSIGNALED(status_word)
        cpu_killed = signalled and os.WTERMSIG(status_word) in (signal.SIGXCPU, signal.SIGKILL)
        if self.timed_out or cpu_killed:
            status = "timeout"
        elif self.memory:
            status = "memory"
        elif self.done and not self.program_failed:
            status = "ok"
        else:
            status = "error"
        return SandboxResult(status=status, passed=passed, total=total, stdout=self.out.text(), stderr=stderr,
                             elapsed_s=time.monotonic() - start, isolation=self.isolation or "unknown",
                             pid=self.proc.pid, exit_status=None if self.timed_out else status_word,
                             test_errors=tuple(errors))


def default_workers() -> int:
    """``min(4, usable CPUs)``: the default size of :func:`run_many`'s pool."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def run_many(jobs: Sequence[tuple], *, workers: int | None = None, **kwargs) -> list[SandboxResult]:
    """Run many ``(code, tests)`` or ``(code, tests, setup, remote)`` jobs with at most ``workers``
    sandboxes alive at once.

    Each sandbox is its own process; the pool is threads that wait on them. Results come back in
    the order of ``jobs``. ``kwargs`` go to :func:`run_program` (``limits``, ``python``, ...).

    Raises:
        ValueError: ``workers`` below 1.
        SandboxError: as :func:`run_program`.
    """
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if not jobs:
        return []
    def one(job: tuple) -> SandboxResult:
        code, tests, *rest = job
        extra = dict(zip(("setup", "remote"), rest))
        return run_program(code, tests, **extra, **kwargs)

    if workers == 1 or len(jobs) == 1:
        return [one(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        return list(pool.map(one, jobs))


#: what each isolation flag protects; :func:`missing_protections` names those absent
_PROTECTIONS = (
    ("netns", "no network namespace: network access is refused only by a Python audit hook, which "
              "native code and known tricks bypass"),
    ("pidns", "no PID namespace: processes that leave the process group can outlive the run"),
    ("fsview", "no private file-system view: the program can read the host's files (the project tree, "
               "the datasets with the expected outputs, home directories)"),
)


def missing_protections(isolation: str) -> list[str]:
    """The protections a run with this :attr:`SandboxResult.isolation` string lacks, as sentences
    (``[]`` for ``"netns,pidns,mntns,fsview,ro,uid"`` or the user-namespace equivalent). Training
    with code rewards refuses to start when this is not empty, unless ``task.allow_weak_sandbox``."""
    flags = set(isolation.split(","))
    out = [text for flag, text in _PROTECTIONS if flag not in flags]
    if not flags & {"uid", "userns"}:
        out.append("no unprivileged identity: the program runs with the caller's full rights")
    return out


@lru_cache(maxsize=None)
def probe_isolation(python: str | None = None) -> str:
    """The isolation ``run_program`` achieves on this machine (runs one trivial program)."""
    return run_program("pass", python=python).isolation
