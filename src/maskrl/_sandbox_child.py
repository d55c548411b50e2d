"""Child side of :mod:`maskrl.sandbox` -- not imported by the library, run as a script.

The parent starts ``python -s -c <this file's source> <result_fd> <request_fd>`` in a fresh
session, with a scrubbed environment, stdin on ``/dev/null`` and the working directory set to a
fresh temporary directory that holds ``.maskrl_spec.json`` (the program and the limits -- never
the tests). This script then

1. reads and deletes the spec;
2. enters new network, PID and mount namespaces (as root directly; otherwise through a user
   namespace; else none -- "basic" mode);
3. forks: the child is PID 1 of the new PID namespace, in a session of its own (when it exits, the
   kernel kills every process in the namespace); the parent stays outside, waits, reports its
   status, and on SIGTERM kills and reaps PID 1 (see ``_fork_namespace_init``);
4. in the child: builds a private file-system view and ``pivot_root``s into it (``_new_root``:
   system directories, the Python installation, a few ``/dev`` nodes, fresh ``/proc``,
   size-limited tmpfs on the working directory, ``/tmp``, ``/var/tmp``, ``/dev/shm``; read-only
   elsewhere); if that fails, falls back to the whole host tree made private and read-only
   (``_setup_mounts``); when running as root, drops to a fresh unprivileged uid (``UID_BASE`` +
   host pid);
5. sets resource limits (CPU, address space, file size, open files, processes), installs an
   audit-hook guard in basic mode, runs the program, then answers the parent's calls (``_serve``)
   until the request pipe closes.

Result protocol (one ASCII line each): ``C`` (namespace init forked), ``I <isolation>``, ``R``
(about to run user code), ``E`` (the program raised), ``O`` (the program ran; calls may come),
``V <k> <json>`` / ``F <k> <ExceptionName>`` per call, ``M`` (a MemoryError), ``D`` (request pipe
closed), and from the namespace parent ``X <wait status>``. Requests: one JSON line
``[k, ["n", name] | ["h", handle], args, kwargs]``. Values use the tagged form of ``_encode``.
Everything here runs in the program's interpreter and is untrusted by the parent, which
re-validates every answer.
Standard library only; works on Python >= 3.8.
"""
import sys

if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]  # never import from the (untrusted) working directory

import builtins
import ctypes
import json
import os
import re
import resource
import signal
import traceback
import types

UID_BASE = 200_000_000
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_CAP_VERSION_3 = 0x20080522
SYS_MOUNT_SETATTR = 442  # same number on every architecture (added in Linux 5.12)
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
O_PATH = getattr(os, "O_PATH", 0o10000000)

# Captured before user code runs, so that rebinding builtins or os.write cannot silence the harness.
_write, _read, _exit, _exec, _compile, _type = os.write, os.read, os._exit, builtins.exec, builtins.compile, builtins.type
_libc = ctypes.CDLL(None, use_errno=True)
_RESULT_FD = -1


def _emit(line):
    try:
        _write(_RESULT_FD, (line + "\n").encode("ascii", "replace"))
    except OSError:
        pass


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def _unshare(flags):
    return _libc.unshare(flags) == 0


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           "mount %s" % target)


def _readonly_tree(path):
    """Make every mount below ``path`` read-only (mount_setattr, Linux >= 5.12); False if unsupported."""
    attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY, 0, 0, 0)
    ret = _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE, ctypes.byref(attr),
                        ctypes.sizeof(attr))
    return ret == 0


def _pdeathsig():
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _drop_capabilities():
    """Empty the effective, permitted and inheritable capability sets (capset(2)), so that code
    running as root in the namespaces, or in a user namespace, cannot undo the mounts."""
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def _write_file(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def _plan_expose(paths):
    """``{dir that others cannot search: {child names to re-expose}}``, or None if impossible.

    A path is reachable by an unprivileged uid when every directory on it has the ``o+x`` bit.
    Only the topmost blocking directory is handled (replaced by a tmpfs holding just the needed
    children); a second blocking directory deeper down makes the plan impossible.
    """
    plan = {}
    for p in paths:
        p = os.path.realpath(p)
        if not os.path.exists(p):
            continue
        parts = [x for x in p.split("/") if x]
        cur = "/"
        for i, name in enumerate(parts):
            if not os.stat(cur).st_mode & 0o001:
                if cur == "/":
                    return None
                deeper = "/" + "/".join(parts[: i + 1])
                for j in range(i + 1, len(parts)):
                    if os.path.isdir(deeper) and not os.stat(deeper).st_mode & 0o001:
                        return None
                    deeper = os.path.join(deeper, parts[j])
                plan.setdefault(cur, set()).add(name)
                break
            cur = os.path.join(cur, name)
    return plan


def _same_dir(path, fd):
    try:
        a, b = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _bind(fd, target):
    os.makedirs(target, exist_ok=True)
    _mount("/proc/self/fd/%d" % fd, target, None, MS_BIND | MS_REC)


def _setup_mounts(workdir, tmpfs_mb, drop_uid, expose_paths, host_pid):
    """Private, read-only view of the host; fresh /proc; tmpfs scratch areas.

    Returns ``(flags, sandbox_uid or None)``. Raises OSError when the mount namespace is unusable
    (then nothing has been mounted, or only private/read-only changes).
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # never propagate anything back to the host
    flags = ["mntns"]
    if _readonly_tree("/"):
        flags.append("ro")
    plan = _plan_expose(expose_paths) if drop_uid else None
    uid = None
    if drop_uid and plan is not None:
        uid = UID_BASE + host_pid
    held = {anc: [(n, os.open(os.path.join(anc, n), O_PATH)) for n in sorted(kids)]
            for anc, kids in (plan or {}).items()} if uid is not None else {}
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    owner = ",uid=%d,gid=%d" % (uid, uid) if uid is not None else ""
    _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=700%s" % (tmpfs_mb, owner))
    wfd = os.open(workdir, O_PATH)
    for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        if os.path.isdir(d) and not os.path.islink(d):
            _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=1777" % tmpfs_mb)
    for anc, kids in held.items():
        _mount("tmpfs", anc, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        for name, fd in kids:
            if os.path.isdir("/proc/self/fd/%d" % fd):
                _bind(fd, os.path.join(anc, name))
            else:
                open(os.path.join(anc, name), "w").close()
                _mount("/proc/self/fd/%d" % fd, os.path.join(anc, name), None, MS_BIND)
            os.close(fd)
    if not _same_dir(workdir, wfd):  # the working directory sat below a covered directory: re-attach it
        _bind(wfd, workdir)
    os.chdir(workdir)
    os.close(wfd)
    return flags, uid


_PIVOT_ROOT = {"x86_64": 155, "amd64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203,
               "ppc64": 203, "s390x": 217, "i686": 217, "i386": 217}
MNT_DETACH = 2
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache",)
_DEV_NODES = ("null", "zero", "full", "random", "urandom")


def _python_dirs():
    """The Python installation: the interpreter's prefixes (a virtual environment and its base)
    and the directory of the executable. Never ``/`` itself."""
    dirs = set()
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(sys.executable)):
        if p:
            p = os.path.realpath(p)
            if p != "/" and os.path.isdir(p):
                dirs.add(p)
    return sorted(dirs)


def _bind_path(src, dst, is_dir):
    if is_dir:
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount(src, dst, None, MS_BIND | MS_REC)


def _new_root(workdir, tmpfs_mb, uid):
    """Replace the file system the program sees by a fresh one holding only the system
    directories (``/usr``, ``/lib*``, ``/bin``), the Python installation, a few ``/dev`` nodes,
    ``/etc/ld.so.cache``, a fresh ``/proc`` and private tmpfs scratch areas (``/tmp``,
    ``/var/tmp``, ``/dev/shm`` and the working directory), and ``pivot_root`` into it: the project
    tree, the datasets, home directories and everything else of the host are not there at all.
    Returns the flags it achieved (``fsview`` and ``ro``). Raises OSError on failure."""
    nr = _PIVOT_ROOT.get(os.uname().machine)
    if nr is None:
        raise OSError(0, "pivot_root: unknown architecture %s" % os.uname().machine)
    root = workdir
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    try:
        for d in _SYSTEM_DIRS:
            if os.path.islink(d):
                os.symlink(os.readlink(d), root + d)
            elif os.path.isdir(d):
                _bind_path(d, root + d, True)
        for d in _python_dirs():
            inside = any(d == s or d.startswith(s + "/") for s in _SYSTEM_DIRS if os.path.isdir(root + s))
            if not inside:
                _bind_path(d, root + d, True)
        for f in _SYSTEM_FILES:
            if os.path.isfile(f):
                _bind_path(f, root + f, False)
        os.makedirs(root + "/dev", exist_ok=True)
        for n in _DEV_NODES:
            if os.path.exists("/dev/" + n):
                _bind_path("/dev/" + n, root + "/dev/" + n, False)
        for n, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                          ("stderr", "/proc/self/fd/2")):
            os.symlink(target, root + "/dev/" + n)
        for d in ("/proc", "/tmp", "/var/tmp", "/dev/shm", "/.old_root", workdir):
            os.makedirs(root + d, exist_ok=True)
        flags = ["fsview"]
        if _readonly_tree(root):
            flags.append("ro")
        _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            _mount("tmpfs", root + d, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=1777" % tmpfs_mb)
        os.makedirs(root + workdir, exist_ok=True)
        owner = ",uid=%d,gid=%d" % (uid, uid) if uid is not None else ""
        _mount("tmpfs", root + workdir, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=700%s" % (tmpfs_mb, owner))
        os.chdir(root)
        _check(_libc.syscall(nr, b".", b".old_root"), "pivot_root")
    except BaseException:
        os.chdir("/")
        _libc.umount2(root.encode(), MNT_DETACH)
        raise
    os.chdir("/")
    _check(_libc.umount2(b"/.old_root", MNT_DETACH), "umount old root")
    os.chdir(workdir)
    return flags


def _set_limits(lim, nproc):
    def setl(which, value):
        resource.setrlimit(which, (value, value))

    cpu = int(lim["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    setl(resource.RLIMIT_AS, int(lim["memory_mb"]) << 20)
    setl(resource.RLIMIT_FSIZE, int(lim["file_mb"]) << 20)
    setl(resource.RLIMIT_NOFILE, int(lim["open_files"]))
    setl(resource.RLIMIT_CORE, 0)
    if nproc:
        setl(resource.RLIMIT_NPROC, int(lim["max_processes"]))


_DENY_EVENTS = frozenset({
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "os.system", "os.fork", "os.forkpty",
    "os.posix_spawn", "os.exec", "os.spawn", "subprocess.Popen", "os.kill", "os.killpg",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function",
})
_PATH_EVENTS = {"os.remove": (0,), "os.rename": (0, 1), "os.mkdir": (0,), "os.rmdir": (0,),
                "os.symlink": (1,), "os.link": (1,), "os.chmod": (0,), "os.chown": (0,),
                "os.truncate": (0,), "os.utime": (0,), "shutil.rmtree": (0,)}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _install_guard(workdir):
    """Basic mode only: an audit hook (PEP 578) refusing network, process creation, ctypes and
    file changes outside ``workdir``. Best effort -- not a security boundary."""
    root = os.path.realpath(workdir)
    realpath, fspath = os.path.realpath, os.fspath

    def inside(p):
        if isinstance(p, int):
            return True
        try:
            p = fspath(p)
            if isinstance(p, bytes):
                p = p.decode("utf-8", "replace")
            rp = realpath(p)
        except Exception:
            return False
        return rp == root or rp.startswith(root + "/")

    def hook(event, args):
        if event in _DENY_EVENTS or (event == "import" and args and args[0] in ("ctypes", "_ctypes")):
            raise PermissionError("maskrl sandbox (basic mode): %s is not allowed" % event)
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writes = (isinstance(flags, int) and flags & _WRITE_FLAGS) or (
                isinstance(mode, str) and any(c in mode for c in "wax+"))
            if writes and not inside(path):
                raise PermissionError("maskrl sandbox (basic mode): writing %r is not allowed" % (path,))
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and not inside(args[i]):
                    raise PermissionError("maskrl sandbox (basic mode): %s outside the working directory" % event)

    sys.addaudithook(hook)


def _safe_name(exc):
    return re.sub(r"[^A-Za-z0-9_.]", "", str(getattr(_type(exc), "__name__", "Exception")))[:60] or "Exception"


# ---- plain data: the only thing that leaves this process (the parent decodes it strictly again)
_PLAIN_SCALARS = (type(None), bool, str, float)
_MAX_DEPTH = 100
_handles = []  # objects that are not plain data, referred to by index


def _encode(value, depth=0):
    """Value -> JSON-able tagged form. Exact builtin types only (``type(v) is ...``, never
    isinstance, so no subclass and none of its overridden methods is consulted); anything else
    becomes a handle ``{"h": n}`` that the parent can only pass back or call."""
    t = _type(value)
    if depth > _MAX_DEPTH:
        raise ValueError("value nested deeper than %d levels" % _MAX_DEPTH)
    if t in _PLAIN_SCALARS:
        return value
    if t is int:
        return value if -(1 << 62) < value < (1 << 62) else {"i": _int_hex(value)}
    if t is list:
        return [_encode(v, depth + 1) for v in _list_items(value)]
    if t is tuple:
        return {"t": [_encode(v, depth + 1) for v in _tuple_items(value)]}
    if t is dict:
        return {"d": [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in _dict_items(value)]}
    if t is set or t is frozenset:
        return {"s" if t is set else "f": [_encode(v, depth + 1) for v in _set_items(value)]}
    if t is bytes:
        return {"b": _bytes_hex(value)}
    if t is complex:
        return {"c": [_complex_real(value), _complex_imag(value)]}
    if t in _ITER_TYPES:  # lazy builtin iterables: materialised here (the program's time)
        if t is range:
            return {"x": ["range", [_encode(value.start), _encode(value.stop), _encode(value.step)]]}
        items = []
        for v in value:
            if len(items) >= _MAX_ITEMS:
                raise ValueError("iterator longer than %d items" % _MAX_ITEMS)
            items.append(_encode(v, depth + 1))
        return {"x": [_ITER_TYPES[t], items]}
    name = _std_name(t)
    if name:
        if name in ("Counter", "OrderedDict", "defaultdict"):
            payload = [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in _dict_items(value)]
        elif name == "deque":
            payload = [_encode(v, depth + 1) for v in _list_items(list(value))]
        elif name == "Decimal":
            payload = _type(value).__str__(value)
        elif name == "Fraction":
            payload = [_encode(value.numerator, depth + 1), _encode(value.denominator, depth + 1)]
        else:  # Match: only its truth value (always true) travels
            _handles.append(value)
            payload = len(_handles) - 1
        return {"x": [name, payload]}
    _handles.append(value)
    return {"h": len(_handles) - 1}


def _decode(obj, g, depth=0):
    """The parent's tagged form -> value (arguments of a call)."""
    if depth > _MAX_DEPTH:
        raise ValueError("argument nested too deeply")
    t = _type(obj)
    if t is list:
        return [_decode(v, g, depth + 1) for v in obj]
    if t is not dict:
        return obj
    (tag, val), = obj.items()
    if tag == "i":
        return int(val, 16)
    if tag == "t":
        return tuple(_decode(v, g, depth + 1) for v in val)
    if tag == "d":
        return {_decode(k, g, depth + 1): _decode(v, g, depth + 1) for k, v in val}
    if tag == "s":
        return {_decode(v, g, depth + 1) for v in val}
    if tag == "f":
        return frozenset(_decode(v, g, depth + 1) for v in val)
    if tag == "b":
        return bytes.fromhex(val)
    if tag == "c":
        return complex(val[0], val[1])
    if tag == "h":
        return _handles[val]
    if tag == "r":
        return _lookup(g, val)
    raise ValueError("unknown tag %r" % tag)


# standard-library value types the parent rebuilds from plain data, by (module, name); found
# without importing those modules here (start-up time): a value of such a type means the program
# imported it, and the identity check in _std_name keeps look-alike classes out
_STD_NAMES = {("collections", "Counter"): "Counter", ("collections", "OrderedDict"): "OrderedDict",
              ("collections", "defaultdict"): "defaultdict", ("collections", "deque"): "deque",
              ("decimal", "Decimal"): "Decimal", ("fractions", "Fraction"): "Fraction", ("re", "Match"): "Match"}


def _std_name(t):
    key = (getattr(t, "__module__", None), getattr(t, "__qualname__", None))
    name = _STD_NAMES.get(key) if _type(key[0]) is str and _type(key[1]) is str else None
    module = sys.modules.get(key[0]) if name else None
    return name if module is not None and getattr(module, key[1], None) is t else None

_ITER_TYPES = {_type(x): name for x, name in (
    ((i for i in ()), "iter"), (map(int, ()), "iter"), (filter(None, ()), "iter"), (zip(), "iter"),
    (enumerate(()), "iter"), (reversed([]), "iter"), (iter([]), "iter"), (iter(()), "iter"), (iter(""), "iter"),
    (iter(range(0)), "iter"), (iter({}), "iter"), (iter(set()), "iter"), ({}.keys(), "keys"),
    ({}.values(), "values"), ({}.items(), "items"), (range(0), "range"))}
_MAX_ITEMS = 1 << 20

# the bound methods used above, captured before user code can patch the types' namespaces
# (builtin types cannot be patched, but a program could rebind these module-level names)
_list_items = list.__iter__
_tuple_items = tuple.__iter__
_dict_items = dict.items
_set_items = lambda s: _type(s).__iter__(s)  # noqa: E731 - set and frozenset
_int_hex = lambda v: format(v, "x")  # noqa: E731
_bytes_hex = bytes.hex
_complex_real = lambda c: c.real  # noqa: E731
_complex_imag = lambda c: c.imag  # noqa: E731
_dumps = json.dumps
_loads = json.loads


def _lookup(g, name):
    if name in g:
        return g[name]
    if hasattr(builtins, name):
        return getattr(builtins, name)
    raise NameError("name %r is not defined" % name)


def _serve(g, req_fd):
    """Answer the parent's calls until it closes the request pipe. Each request is one JSON line
    ``[k, target, args, kwargs]`` (target ``["n", name]`` or ``["h", handle]``); each answer one
    line ``V <k> <json>`` or ``F <k> <ExceptionName>``."""
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = _read(req_fd, 1 << 16)
            if not chunk:
                return
            buf += chunk
        line, _, buf = buf.partition(b"\n")
        k = -1
        try:
            k, target, args, kwargs = _loads(line.decode("ascii"))
            fn = _lookup(g, target[1]) if target[0] == "n" else _handles[target[1]]
            value = fn(*_decode(args, g), **{key: _decode(v, g) for key, v in kwargs.items()})
            out = _dumps(_encode(value), ensure_ascii=True, allow_nan=True, separators=(",", ":"))
        except MemoryError:
            _emit("M")
            _emit("F %d MemoryError" % k)
        except BaseException as e:  # noqa: BLE001 - SystemExit, KeyboardInterrupt ... all fail the call
            _emit("F %d %s" % (k, _safe_name(e)))
            try:
                traceback.print_exc()
            except BaseException:  # noqa: BLE001
                pass
        else:
            _emit("V %d %s" % (k, out))


def _run_user(code, req_fd):
    module = types.ModuleType("solution")
    sys.modules["solution"] = module
    g = module.__dict__
    g["__builtins__"] = builtins
    _emit("R")
    try:
        _exec(_compile(code, "<program>", "exec"), g)
    except MemoryError:
        _emit("M")
        _exit(1)
    except BaseException:  # noqa: BLE001 - any failure of the program (SyntaxError, SystemExit, ...)
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
        _emit("E")
        _flush_exit(1)
    _emit("O")
    _serve(g, req_fd)
    _emit("D")
    _flush_exit(0)


def _flush_exit(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    _exit(code)


def _fork_namespace_init():
    """Fork PID 1 of the new PID namespace; this process stays outside as its waiter.

    The waiter reports PID 1's wait status (``X``) and exits. On SIGTERM from the parent it kills
    PID 1 (which takes the namespace down) and still reaps it, so no zombie is left to an init that
    might never reap it. PID 1 starts a new session, so nothing inside can signal the waiter, which
    is also invisible from the namespace. Returns only in PID 1.
    """
    child = [0]

    def on_term(signum, _frame):
        if child[0]:
            try:
                os.kill(child[0], signal.SIGKILL)
            except OSError:
                pass
        else:
            _exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid:
        child[0] = pid
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        _emit("C")
        _, status = os.waitpid(pid, 0)
        _emit("X %d" % status)
        _exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.setsid()
    _pdeathsig()  # should the waiter be SIGKILLed after all, PID 1 dies, and with it the namespace


def main():
    global _RESULT_FD
    _RESULT_FD, req_fd = int(sys.argv[1]), int(sys.argv[2])
    os.set_inheritable(_RESULT_FD, False)  # programs the user code spawns do not get them
    os.set_inheritable(req_fd, False)
    workdir = os.getcwd()
    with open(".maskrl_spec.json", encoding="utf-8") as fh:
        spec = json.load(fh)
    os.unlink(".maskrl_spec.json")
    lim, mode = spec["limits"], spec["isolation"]
    host_pid = os.getpid()

    flags = []
    if mode == "auto" and os.geteuid() == 0 and _unshare(CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS):
        flags = ["netns", "pidns"]
    elif mode in ("auto", "userns"):
        uid, gid = os.getuid(), os.getgid()
        if _unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS):
            _write_file("/proc/self/setgroups", "deny")
            _write_file("/proc/self/uid_map", "%d %d 1" % (uid, uid))
            _write_file("/proc/self/gid_map", "%d %d 1" % (gid, gid))
            flags = ["userns", "netns", "pidns"]

    if flags:
        _fork_namespace_init()

    uid = None
    expose = [p for p in sys.path if p] + [os.path.dirname(os.path.realpath(sys.executable))]
    if flags:
        drop = os.geteuid() == 0 and "userns" not in flags
        done = False
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)  # never propagate anything back to the host
            readable = all(os.stat(d).st_mode & 0o005 == 0o005 for d in _python_dirs())
            uid = UID_BASE + host_pid if drop and readable else None
            flags += ["mntns"] + _new_root(workdir, int(lim["tmpfs_mb"]), uid)
            done = True
        except OSError as e:
            uid = None
            sys.stderr.write("maskrl sandbox: private file-system view failed (%s); showing the host "
                             "read-only instead\n" % e)
        if not done:
            try:
                more, uid = _setup_mounts(workdir, int(lim["tmpfs_mb"]), drop, expose, host_pid)
                flags += more
            except OSError as e:
                sys.stderr.write("maskrl sandbox: mount setup failed (%s); continuing without it\n" % e)
                os.chdir(workdir)
    elif os.geteuid() == 0 and _plan_expose(expose) == {}:  # root without namespaces (e.g. Docker)
        uid = UID_BASE + host_pid
        os.chown(workdir, uid, uid)
    _set_limits(lim, nproc=uid is not None or "userns" in flags)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        _pdeathsig()  # cleared by the credential change
        flags.append("uid")
    basic = "netns" not in flags
    try:
        _drop_capabilities()
    except OSError:
        if not basic:
            raise
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # exec can never gain privileges (setuid binaries)
    if basic:
        _install_guard(workdir)
        flags.insert(0, "basic")
    _emit("I " + ",".join(flags))
    os.umask(0o077)
    _run_user(spec["code"], req_fd)


main()
