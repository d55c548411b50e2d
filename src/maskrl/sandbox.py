"""Running untrusted generated Python code for code rewards (SPEC §5: "all tests pass, run in a
sandboxed subprocess (time, memory, no network)"; guarantees and limits in ``docs/sandbox.md``).

Every program runs in its own interpreter process, started in a new session (so in its own process
group), with a scrubbed environment, stdin on ``/dev/null`` and a fresh temporary working
directory that is deleted afterwards. The child (``maskrl/_sandbox_child.py``) isolates itself
with the strongest mechanism the machine allows, reported in :attr:`SandboxResult.isolation`:

* ``netns,pidns,mntns,ro,uid`` (running as root): new network namespace (only a down loopback, so
  no network at all), new PID namespace (every process the program starts dies with it), private
  read-only view of the file system with size-limited tmpfs for the working directory, ``/tmp``,
  ``/var/tmp`` and ``/dev/shm``, and a fresh unprivileged uid so that ``RLIMIT_NPROC`` caps the
  number of processes (the kernel does not enforce it for root);
* ``userns,netns,pidns,mntns,ro`` (unprivileged user with user namespaces): the same through a user
  namespace, keeping the caller's uid;
* ``basic`` (no namespaces): resource limits, a process-group kill, and a Python audit hook that
  refuses sockets, process creation, ``ctypes`` and file writes outside the working directory --
  best effort only, not a security boundary. As root (e.g. a Docker container without
  CAP_SYS_ADMIN) the program still drops to a fresh uid when the interpreter's files are readable
  by everyone: ``basic,uid``.

In every mode: wall-clock timeout (at the limit, in namespace modes the namespace's init is killed,
which makes the kernel kill every process in it; then the process group gets SIGKILL), ``RLIMIT_CPU``, ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE``,
``RLIMIT_NOFILE``, no core files, no privilege gain through exec (``PR_SET_NO_NEW_PRIVS``),
``PYTHONHASHSEED=0``. Results travel over a dedicated pipe, so printing cannot change the score;
a program that deliberately attacks the test harness inside its own process (e.g. an ``__eq__``
that always returns True) can still fake passes -- the sandbox protects the host, not the metric.
"""
from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

__all__ = ["Limits", "SandboxResult", "SandboxError", "run_program", "run_many", "default_workers",
           "probe_isolation", "SANDBOX_UID_BASE"]

#: sandboxed programs run as uid ``SANDBOX_UID_BASE + pid`` when the parent is root
SANDBOX_UID_BASE = 200_000_000
ISOLATION_MODES = ("auto", "userns", "basic")
_CHILD_SOURCE = (Path(__file__).with_name("_sandbox_child.py")).read_text(encoding="utf-8")
_MAX_RESULT_BYTES = 1 << 20
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

    @property
    def fraction(self) -> float:
        """``passed / total`` in ``[0, 1]``; 0.0 when there are no tests."""
        return self.passed / self.total if self.total else 0.0

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


def run_program(code: str, tests: Sequence[str] = (), *, limits: Limits | None = None,
                python: str | None = None, isolation: str = "auto",
                tmp_root: str | os.PathLike | None = None) -> SandboxResult:
    """Run ``code`` and then each snippet of ``tests`` (in the program's namespace) in a sandbox.

    A test passes when it runs without raising (typically an ``assert`` statement). The program's
    module is named ``solution``, so ``if __name__ == "__main__":`` blocks do not run.

    Args:
        code: Python source of the program (untrusted).
        tests: Python snippets run one after another after ``code``; each is scored separately,
            and ones left when the time runs out count as failed.
        limits: resource limits (:class:`Limits`); defaults to ``Limits()``.
        python: interpreter to run (default ``sys.executable``); Python >= 3.8.
        isolation: ``"auto"`` (strongest available), ``"userns"`` (force the user-namespace path)
            or ``"basic"`` (no namespaces; audit-hook guard only).
        tmp_root: directory in which the temporary working directory is made (default: the system
            temporary directory).

    Returns:
        A :class:`SandboxResult`; what the program does never raises here.

    Raises:
        ValueError: unknown ``isolation``; ``tests`` given as a single string.
        SandboxError: the interpreter cannot be started or the harness fails before the program
            runs (e.g. an interpreter older than Python 3.8).
    """
    limits = limits or Limits()
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
    if isinstance(tests, str):
        raise ValueError("tests must be a sequence of snippets, not a single string")
    tests = [str(t) for t in tests]
    spec = {"code": str(code), "tests": tests, "isolation": isolation,
            "limits": {**asdict(limits), "cpu_s": limits.effective_cpu_s}}
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="maskrl-sbx-", dir=tmp_root)
    try:
        with open(os.path.join(workdir, ".maskrl_spec.json"), "w", encoding="utf-8") as fh:
            json.dump(spec, fh)
        return _run(workdir, python or sys.executable, limits, len(tests), start)
    finally:
        _rmtree(workdir)


def _run(workdir: str, python: str, limits: Limits, total: int, start: float) -> SandboxResult:
    r_fd, w_fd = os.pipe()
    try:
        proc = subprocess.Popen([python, "-s", "-c", _CHILD_SOURCE, str(w_fd)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(w_fd,),
                                env=_child_env(workdir), cwd=workdir, start_new_session=True)
    except OSError as e:
        os.close(r_fd)
        raise SandboxError(f"cannot start the sandbox interpreter {python!r}: {e}") from e
    finally:
        os.close(w_fd)
    out, err, res = _Tail(limits.output_bytes), _Tail(limits.output_bytes), bytearray()
    sinks = {proc.stdout.fileno(): out.add, proc.stderr.fileno(): err.add,
             r_fd: lambda d: res.extend(d[: max(0, _MAX_RESULT_BYTES - len(res))])}
    deadline = start + limits.timeout_s
    timed_out = False
    sel = selectors.DefaultSelector()
    try:
        for fd in sinks:
            sel.register(fd, selectors.EVENT_READ)
        exit_seen_at = None
        while sel.get_map():
            now = time.monotonic()
            if exit_seen_at is None and _exited(proc.pid):
                exit_seen_at = now
                _kill_group(proc.pid)  # leftovers of the program's process group (basic mode)
            if exit_seen_at is not None and now > exit_seen_at + _DRAIN_S:
                break  # pipes held by processes that escaped the group (basic mode only)
            if exit_seen_at is None and now >= deadline:
                timed_out = True
                break
            wait = min(deadline - now, 0.05) if exit_seen_at is None else _DRAIN_S
            for key, _ in sel.select(max(wait, 0.0)):
                data = os.read(key.fd, 65536)
                if data:
                    sinks[key.fd](data)
                else:
                    sel.unregister(key.fd)
        if not timed_out:
            while not _exited(proc.pid):  # pipes closed but the process lingers (e.g. closed its stdout)
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                time.sleep(0.005)
    finally:
        _stop(proc.pid)
        proc.wait()
        sel.close()
        os.close(r_fd)
        proc.stdout.close()
        proc.stderr.close()
    return _make_result(res.decode("ascii", "replace"), proc, out, err, timed_out, total, start)


def _make_result(report: str, proc: subprocess.Popen, out: _Tail, err: _Tail, timed_out: bool,
                 total: int, start: float) -> SandboxResult:
    isolation, ran, done, memory, status_word = "", False, False, False, None
    passed: set[int] = set()
    for line in report.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "I":
            isolation = rest
        elif tag == "R":
            ran = True
        elif tag == "P" and rest.isdigit() and int(rest) < total:
            passed.add(int(rest))
        elif tag == "F":
            memory |= rest.endswith(" MemoryError")
        elif tag == "M":
            memory = True
        elif tag == "D":
            done = True
        elif tag == "X" and rest.lstrip("-").isdigit():
            status_word = int(rest)
    if status_word is None and not timed_out and proc.returncode is not None:
        rc = proc.returncode  # basic mode: the program is the process we started
        status_word = (-rc) & 0x7F if rc < 0 else (rc & 0xFF) << 8
    stderr = err.text()
    if not ran and not timed_out:
        raise SandboxError(f"sandbox harness failed before running the program (exit {proc.returncode}):\n{stderr}")
    signalled = status_word is not None and os.WIFSIGNALED(status_word)
    cpu_killed = signalled and os.WTERMSIG(status_word) in (signal.SIGXCPU, signal.SIGKILL)
    if timed_out or cpu_killed:
        status = "timeout"
    elif memory:
        status = "memory"
    elif done:
        status = "ok"
    else:
        status = "error"
    return SandboxResult(status=status, passed=len(passed), total=total, stdout=out.text(), stderr=stderr,
                         elapsed_s=time.monotonic() - start, isolation=isolation or "unknown", pid=proc.pid,
                         exit_status=None if timed_out else status_word)


def default_workers() -> int:
    """``min(4, usable CPUs)``: the default size of :func:`run_many`'s pool."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def run_many(jobs: Sequence[tuple[str, Sequence[str]]], *, workers: int | None = None,
             **kwargs) -> list[SandboxResult]:
    """Run many ``(code, tests)`` jobs with at most ``workers`` sandboxes alive at once.

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
    if workers == 1 or len(jobs) == 1:
        return [run_program(code, tests, **kwargs) for code, tests in jobs]
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        return list(pool.map(lambda job: run_program(job[0], job[1], **kwargs), jobs))


@lru_cache(maxsize=None)
def probe_isolation(python: str | None = None) -> str:
    """The isolation ``run_program`` achieves on this machine (runs one trivial program)."""
    return run_program("pass", python=python).isolation
