"""The child confines itself, once, before it answers ``ready`` (see docs/executors.md).

:func:`prepare` applies a first layer before the handler's module is imported: steps 1 to 3
with sys.path readable, and the second filter of step 4, so that code running on import is
held too. :func:`confine` then applies the whole, after the import; Landlock's layers add up,
so the project's files are no longer readable:

1. every file descriptor is closed but 0, 1, 2 and the protocol's pipes;
2. no_new_privs, and every capability dropped (bounding, ambient, effective, permitted,
   inheritable): a worker running as root gives its children none of root's powers;
3. Landlock: the runtime set read-only, the grants, the programs of ``run`` executable, TCP
   connect and bind only on the granted ports, no signals or abstract unix sockets outside;
4. the seccomp filter (:mod:`panqueue._sandbox.seccomp`), whose listener goes to the worker's
   supervisor when the policy needs one, and a second one for what Landlock does not cover:
   every change of a file's mode, owner, times or extended attributes (a child running as
   the files' owner could otherwise make any of the host's files world-readable, or
   unusable, without opening it), inotify watches. (Another process's scheduling is the main
   filter's: the child's own threads and processes only.)

Then :func:`install_audit_hook` gives Python code a clear ``PermissionError`` naming what was
denied before the kernel refuses (advisory: the kernel enforces).
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import socket
import sys
from collections.abc import Iterable
from typing import Any

from panqueue._sandbox import landlock

__all__ = ["METADATA_CALLS", "ConfineError", "adopt_orphans", "confine",
           "install_audit_hook", "prepare"]

# What Landlock does not govern: a file's mode, owner, times and extended attributes, by path
# or by descriptor (an O_PATH descriptor opens anything; fchmod works on one opened to read).
METADATA_CALLS = (
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
    "chown32", "fchown32", "lchown32", "utime", "utimes", "futimesat", "utimensat",
    "utimensat_time64", "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr",
    "fremovexattr", "setxattrat", "removexattrat",
)

_PR_CAPBSET_DROP = 24
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522


# Entries of the child's own /proc/<pid> it may not read: net/ shows every socket of the
# network namespace (the worker's Redis connections among them).
_PROC_HIDDEN = frozenset({"net"})


class ConfineError(RuntimeError):
    """The child could not apply its rules: it must not run any job."""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise ConfineError(f"{what}: {os.strerror(code)}")


def _close_fds(keep: Iterable[int]) -> None:
    kept = sorted({0, 1, 2, *keep})
    start = 0
    for fd in kept:
        if fd > start:
            os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, 1 << 20)


def adopt_orphans() -> None:
    """Make this process the reaper of its orphaned descendants (before the handler's module
    is imported): a helper that module starts and detaches stays a child of ours, and
    :func:`confine` then refuses to leave it unconfined beside the handler."""
    _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _no_children() -> None:
    """No process started before the rules apply may outlive that moment: it would be free
    of them (and could share memory with the handler)."""
    children = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as file:
                children += file.read().split()
        except FileNotFoundError:
            pass
    if children:
        raise ConfineError(f"the handler's module started processes ({', '.join(children)}) "
                           "before the child's rules apply; they would run unconfined")


def _single_threaded() -> None:
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        names = []
        for tid in threads:
            try:
                with open(f"/proc/self/task/{tid}/comm") as file:
                    names.append(f"{tid} {file.read().strip()}")
            except OSError:
                names.append(tid)
        raise ConfineError(f"the child runs {len(threads)} threads before its rules apply "
                           f"({', '.join(names)}; does the handler's module start threads when "
                           "imported?); the rules hold only for the thread that applies them")


def _drop_privileges(libc: ctypes.CDLL) -> None:
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    try:
        with open("/proc/sys/kernel/cap_last_cap") as file:
            last_cap = int(file.read())
    except (OSError, ValueError):
        last_cap = 63
    for cap in range(last_cap + 1):
        # EPERM without CAP_SETPCAP: such a process holds no capability to lose anyway, and
        # no_new_privs keeps it from gaining any through execve.
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset (dropping capabilities)")


@functools.cache
def _own_proc_entries() -> tuple[str, ...]:
    """This process's /proc entries it may read (listed once: the first layer does not let
    it list /proc/<pid> itself again)."""
    own = f"/proc/{os.getpid()}"
    # Not the links (root, cwd, exe): a rule opens what a link points to, and root's rule
    # would grant the whole filesystem.
    return tuple(f"{own}/{entry}" for entry in os.listdir(own)
                 if entry not in _PROC_HIDDEN and not os.path.islink(f"{own}/{entry}"))


def _landlock(policy: dict[str, Any], extra_read: Iterable[str] = ()) -> None:
    abi, why = landlock.abi_version()
    if abi < 6:
        raise ConfineError(why or f"Landlock ABI {abi} < 6")
    rules = landlock.Ruleset(abi)
    rules.allow_paths(policy["runtime"], landlock.FS_READ)
    # Its own /proc entries, except net/: the host's sockets (who listens where).
    rules.allow_paths(_own_proc_entries(), landlock.FS_READ)
    rules.allow_paths(policy["devices"], landlock.FS_READ | landlock.ACCESS_FS_WRITE_FILE)
    rules.allow_paths(policy["execute"], landlock.FS_EXECUTE)
    rules.allow_paths(policy["read"], landlock.FS_READ)
    rules.allow_paths(policy["write"], landlock.FS_WRITE)
    rules.allow_paths(extra_read, landlock.FS_READ)
    for port in policy["connect_ports"]:
        rules.allow_port(int(port), landlock.ACCESS_NET_CONNECT_TCP)
    for port in policy["listen_ports"]:
        rules.allow_port(int(port), landlock.ACCESS_NET_BIND_TCP)
    rules.restrict_self()


def _deny_what_landlock_misses() -> None:
    """A seccomp filter of its own, for what Landlock does not govern: each of
    :data:`METADATA_CALLS` fails with EPERM, and so does watching files with inotify (it
    reports activity anywhere) or making a unix socket. (Another process's scheduling is the
    main filter's, :mod:`panqueue._sandbox.seccomp`.)"""
    from panqueue._sandbox.seccomp import ACT_ALLOW, ACT_EPERM, _Rules, library

    rules = _Rules(ACT_ALLOW)
    try:
        for name in METADATA_CALLS:
            rules.add(ACT_EPERM, name)
        rules.add(ACT_EPERM, "inotify_add_watch")
        # Unix sockets by path (a container runtime's, a database's) are outside Landlock's
        # rules: none, from the first layer on (socketpair stays).
        rules.add(ACT_EPERM, "socket", (0, 4, socket.AF_UNIX, 0))  # SCMP_CMP_EQ
        result = library().seccomp_load(rules.ctx)
        if result < 0:
            raise ConfineError(f"seccomp_load: {os.strerror(-result)}")
    finally:
        rules.release()


def _import_paths() -> list[str]:
    """Where the import system looks: every entry of sys.path (the working directory for
    ``''``), as this child has it."""
    paths = []
    for entry in sys.path:
        path = os.path.abspath(entry or os.getcwd())
        if os.path.exists(path):
            paths.append(path)
    return paths


_prepared = False


def prepare(policy: dict[str, Any], *, keep: Iterable[int] = ()) -> int:
    """The first layer, before the handler's module is imported: everything of
    :func:`confine`, the main seccomp filter included, with sys.path readable too (the module
    and what it imports). Code that runs on import (a dependency's, too) is then held by the
    same rules as the handler (files, ports, programs, processes, sessions), apart from the
    project's files, which :func:`confine` takes away once the import is done. Returns the
    seccomp listener's descriptor for the worker's supervisor, or -1. ConfineError when it
    cannot be applied."""
    global _prepared
    if sys.platform != "linux":
        raise ConfineError("not Linux")
    try:
        from panqueue._sandbox.seccomp import FilterSpec, install_filter
    except ImportError as exc:
        raise ConfineError(f"the seccomp filter is not available ({exc})") from None
    try:
        _close_fds(keep)
        _single_threaded()
        _drop_privileges(_libc())
        _landlock(policy, _import_paths())
        _deny_what_landlock_misses()
        spec = policy["filter"]
        listener = install_filter(FilterSpec(
            run=bool(spec["run"]), processes=int(spec["processes"]), inet=bool(spec["inet"]),
            listen=bool(spec["listen"]), landlock_after=True))
    except ConfineError:
        raise
    except Exception as exc:
        raise ConfineError(f"{type(exc).__name__}: {exc}") from exc
    _prepared = True
    return listener


def confine(policy: dict[str, Any], *, keep: Iterable[int] = ()) -> int:
    """Apply ``policy`` (:func:`panqueue._sandbox.policy.to_wire`) to this process, for good.

    ``keep``: descriptors to keep open besides 0, 1 and 2 (the protocol's pipes). Returns the
    seccomp listener's descriptor for the worker's supervisor, or -1 when the policy needs no
    supervisor. Raises :class:`ConfineError` when any step fails: the child must then exit.
    """
    if sys.platform != "linux":
        raise ConfineError("not Linux")
    try:
        from panqueue._sandbox.seccomp import FilterSpec, install_filter
    except ImportError as exc:
        raise ConfineError(f"the seccomp filter is not available ({exc})") from None
    try:
        _close_fds(keep)
        _single_threaded()
        _no_children()
        if _prepared:  # the filter holds since before the import: the import paths go
            _landlock(policy)
            return -1
        libc = _libc()
        _drop_privileges(libc)
        _landlock(policy)
        _deny_what_landlock_misses()
        spec = policy["filter"]
        return install_filter(FilterSpec(run=bool(spec["run"]), processes=int(spec["processes"]),
                                         inet=bool(spec["inet"]), listen=bool(spec["listen"])))
    except ConfineError:
        raise
    except Exception as exc:
        raise ConfineError(f"{type(exc).__name__}: {exc}") from exc


_METADATA_EVENTS = {"os.chmod": "changing the mode", "os.chown": "changing the owner",
                    "os.utime": "changing the times", "os.setxattr": "setting an attribute",
                    "os.removexattr": "removing an attribute"}


def install_audit_hook(policy: dict[str, Any]) -> None:
    """Refuse, in Python and with a message naming it, a connect or a program the kernel
    would refuse anyway (the kernel's own errors do not say what was denied)."""
    from panqueue._sandbox.net import NetPolicy

    net = NetPolicy.from_wire(policy["net"])
    grants = ", ".join(policy.get("net_grants") or []) or "none"
    programs = {os.path.realpath(p) for p in policy.get("run") or []}
    run_grants = ", ".join(policy.get("run") or []) or "none"

    def check_program(program: Any) -> None:
        if isinstance(program, bytes):
            program = os.fsdecode(program)
        if isinstance(program, os.PathLike):
            program = os.fspath(program)
        if not isinstance(program, str):
            return
        path = program if "/" in program else (shutil.which(program) or program)
        if os.path.realpath(path) not in programs:
            raise PermissionError(f"permissions deny running {program} (run grants: "
                                  f"{run_grants})")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.connect":
            address = args[1] if len(args) > 1 else None
            if isinstance(address, tuple) and len(address) >= 2 and isinstance(address[0], str) \
                    and isinstance(address[1], int):
                host, port = address[0], address[1]
                if net.allows_literal(host, port) is False:
                    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                    raise PermissionError(f"permissions deny connect to {shown} (net grants: "
                                          f"{grants})")
        elif event == "subprocess.Popen":
            executable, argv = args[0], args[1]
            if executable is None:
                if isinstance(argv, (str, bytes, os.PathLike)):
                    executable = argv
                elif argv:
                    executable = next(iter(argv))
            check_program(executable)
        elif event in _METADATA_EVENTS:
            raise PermissionError(f"permissions deny {_METADATA_EVENTS[event]} of {args[0]!r} "
                                  "(no grant allows changing a file's metadata)")
        elif event in ("os.exec", "os.posix_spawn"):
            check_program(args[0])
        elif event == "os.spawn":
            check_program(args[1])

    sys.addaudithook(hook)
