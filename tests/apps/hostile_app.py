"""A hostile handler for tests/test_permissions_escapes.py: each job names, in
``job.data["attempt"]``, one way out of its sandbox, and the handler tries it for real.

The worker that imports this module gets the grants from its environment (the test sets them):
HOSTILE_IN (read), HOSTILE_OUT (write), HOSTILE_PORT (connect to 127.0.0.1 on it),
HOSTILE_HOST_PORT (connect to ``localhost`` on it, the second queue), HOSTILE_QUEUE and
HOSTILE_HOST_QUEUE (the queues' names). The child gets none of these variables. The code is for
x86_64 Linux (system call numbers, a few bytes of machine code).

A denied attempt lets the kernel's error (PermissionError or the call's OSError) propagate: the
job fails with it. An attempt that got through returns what it obtained (file contents, a server's
reply), so the job completes and the test shows what leaked; one that changed the child itself
(a namespace, a new filter, a raised limit, a chroot, a tracee) raises :class:`Escaped`, a
MemoryError, which also makes the worker replace this child instead of serving the next job in it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from panqueue import Job, Limits, Permissions, Registry

IN = os.environ.get("HOSTILE_IN", "/tmp")
OUT = os.environ.get("HOSTILE_OUT", "/tmp")
PORT = int(os.environ.get("HOSTILE_PORT", "9"))
HOST_PORT = int(os.environ.get("HOSTILE_HOST_PORT", "9"))
QUEUE = os.environ.get("HOSTILE_QUEUE", "hostile")
HOST_QUEUE = os.environ.get("HOSTILE_HOST_QUEUE", "hostile-host")
THREAD_QUEUE = os.environ.get("HOSTILE_THREAD_QUEUE", "hostile-thread")
FORK_QUEUE = os.environ.get("HOSTILE_FORK_QUEUE", "hostile-fork")
DAEMON_QUEUE = os.environ.get("HOSTILE_DAEMON_QUEUE", "hostile-daemon")
PROCESS_QUEUE = os.environ.get("HOSTILE_PROCESS_QUEUE", "hostile-process")
PROCESSES = 2
OPEN_FILES = 256
CPU_SECONDS = 60
JOB_TIMEOUT = 20.0

queues = Registry()

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# x86_64 system call numbers and constants the standard library does not name.
SYS_INIT_MODULE = 175
SYS_FINIT_MODULE = 313
SYS_SECCOMP = 317
SYS_IO_URING_SETUP = 425
SYS_CLONE3 = 435
SYS_PIDFD_GETFD = 438
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_PROCESS_VM_READV = 310
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_RET_ALLOW = 0x7FFF0000
PTRACE_ATTACH = 16
PTRACE_DETACH = 17
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
MSG_FASTOPEN = 0x20000000
IPPROTO_MPTCP = 262
F_SETSIG = 10
# System calls that loosen or reach past a sandbox, with arguments that do nothing harmful
# where the call is let through (a wrong magic, a null pointer, a query).
SYSCALLS: dict[str, tuple[int, tuple[int, ...]]] = {
    "userfaultfd": (323, (1,)),  # UFFD_USER_MODE_ONLY: allowed unprivileged
    "bpf": (321, (0, 0, 0)),  # BPF_MAP_CREATE, NULL
    "perf_event_open": (298, (0, 0, -1, -1, 0)),
    "keyctl": (250, (0, -3, 0)),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": (248, (0, 0, 0, 0, -3)),
    "mount": (165, (0, 0, 0, 0, 0)),
    "pivot_root": (155, (0, 0)),
    "open_by_handle_at": (304, (-100, 0, 0)),  # AT_FDCWD, NULL handle
    "kexec_load": (246, (0, 0, 0, 0)),
    "syslog": (103, (10, 0, 0)),  # SYSLOG_ACTION_SIZE_BUFFER
}


class Escaped(MemoryError):
    """The attempt got through and changed this child (MemoryError: the worker replaces it)."""


def _check(name: str, ret: int, *, denials: tuple[int, ...] = (errno.EPERM, errno.EACCES)
           ) -> int:
    """A libc or raw system call's return: -1 with a denial errno raises that error (as
    PermissionError for EPERM/EACCES); -1 with any other errno means the kernel's permission
    check let the call through, and so does success."""
    if ret == -1:
        err = ctypes.get_errno()
        if err in denials:
            raise OSError(err, f"{name}: {os.strerror(err)}")
        raise Escaped(f"{name} was let through (it failed later, with {errno.errorcode[err]})")
    return ret


def _syscall(name: str, number: int, *args: int | bytes | ctypes._SimpleCData | Any,
             denials: tuple[int, ...] = (errno.EPERM, errno.EACCES)) -> int:
    converted = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    return _check(name, _libc.syscall(ctypes.c_long(number), *converted), denials=denials)


def _allow_all_filter() -> Any:
    """A seccomp filter program of one instruction: allow every call."""

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    program = (SockFilter * 1)(SockFilter(0x06, 0, 0, SECCOMP_RET_ALLOW))  # BPF_RET|BPF_K
    return SockFprog(1, program), program


# ---- files


def read(data: dict[str, Any]) -> str:
    with open(data["path"], "rb") as f:
        return f.read(4096).decode(errors="replace")


def list_dir(data: dict[str, Any]) -> list[str]:
    return sorted(os.listdir(data["path"]))


def write(data: dict[str, Any]) -> str:
    with open(data["path"], "r+b") as f:
        f.write(b"overwritten")
    return "wrote"


def create(data: dict[str, Any]) -> str:
    with open(data["path"], "xb") as f:
        f.write(data.get("content", "created").encode())
    return "created"


def rename(data: dict[str, Any]) -> str:
    os.rename(data["path"], data["to"])
    return "renamed"


def delete(data: dict[str, Any]) -> str:
    os.unlink(data["path"])
    return "deleted"


def truncate(data: dict[str, Any]) -> str:
    os.truncate(data["path"], 0)
    return "truncated"


def make_dir(data: dict[str, Any]) -> str:
    os.mkdir(data["path"])
    return "made"


def mkfifo(data: dict[str, Any]) -> str:
    os.mkfifo(data["path"])
    return f"made a named pipe {data['path']}"


def chmod(data: dict[str, Any]) -> str:
    os.chmod(data["path"], 0o666)
    return f"made {data['path']} mode 666"


def utime(data: dict[str, Any]) -> str:
    os.utime(data["path"], (0, 0))
    return f"set the times of {data['path']} to 1970"


def setxattr(data: dict[str, Any]) -> str:
    os.setxattr(data["path"], "user.panqueue-escape", b"written")
    return f"set an extended attribute on {data['path']}"


def chown(data: dict[str, Any]) -> str:
    os.chown(data["path"], 65534, 65534)
    return f"gave {data['path']} to nobody"


def libc_call(data: dict[str, Any]) -> str:
    """The same changes through libc, where no Python-level check can see them."""
    name, path = data["name"], data["path"].encode()
    if name == "chmod":
        ret = _libc.chmod(path, 0o666)
    elif name == "utime":
        ret = _libc.utimensat(-100, path, None, 0)  # AT_FDCWD; now
    elif name == "setxattr":
        ret = _libc.setxattr(path, b"user.panqueue-escape", b"written", 7, 0)
    elif name == "chown":
        ret = _libc.chown(path, 65534, 65534)
    elif name == "execve":
        argv = (ctypes.c_char_p * 4)(path, b"-c", b"exit 0", None)
        ret = _libc.execve(path, argv, (ctypes.c_char_p * 1)(None))
    else:
        raise ValueError(name)
    _check(name, ret)
    return f"{name} of {data['path']} done through libc"


def inotify(job: Job) -> list[str]:
    """Watch a directory outside the grants and report the names created in it (what a listing
    would show) while the job waits for data['release'] in the write grant."""
    libc = _libc
    fd = _check("inotify_init1", libc.inotify_init1(os.O_NONBLOCK))
    try:
        _check("inotify_add_watch", libc.inotify_add_watch(fd, job.data["path"].encode(),
                                                             0x100 | 0x20))  # CREATE | OPEN
        job.progress("watching")
        deadline = time.monotonic() + 20
        events = b""
        while not os.path.exists(job.data["release"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        with contextlib.suppress(BlockingIOError):
            events = os.read(fd, 65536)
    finally:
        os.close(fd)
    names, offset = [], 0
    while offset + 16 <= len(events):
        length = int.from_bytes(events[offset + 12:offset + 16], sys.byteorder)
        names.append(events[offset + 16:offset + 16 + length].rstrip(b"\0").decode())
        offset += 16 + length
    return names


def hard_link_then_read(data: dict[str, Any]) -> str:
    os.link(data["path"], data["to"])
    return read({"path": data["to"]})


def symlink_then_read(data: dict[str, Any]) -> str:
    os.symlink(data["path"], data["to"])
    return read({"path": data["to"]})


def libc_read(data: dict[str, Any]) -> str:
    """open(2) and read(2) through libc: C code, not Python's io."""
    fd = _check("open", _libc.open(data["path"].encode(), os.O_RDONLY))
    buffer = ctypes.create_string_buffer(4096)
    n = _check("read", _libc.read(fd, buffer, 4096))
    _libc.close(fd)
    return buffer.raw[:n].decode(errors="replace")


# ---- descriptors and other processes


def descriptors(data: dict[str, Any]) -> dict[str, Any]:
    """What this child holds: /proc/self/fd's targets (None if it cannot be listed) and the
    kind of every descriptor 3..64 that fstat accepts."""
    listed: dict[str, str] | None = {}
    listing_error = None
    try:
        for name in os.listdir("/proc/self/fd"):
            try:
                listed[name] = os.readlink(f"/proc/self/fd/{name}")
            except OSError:  # the descriptor of the listing itself, closed by now
                pass
    except OSError as exc:
        listed, listing_error = None, repr(exc)
    kinds = {}
    for fd in range(3, 65):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        kinds[str(fd)] = ("pipe" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode)
                          else "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode)
                          else "chr" if stat.S_ISCHR(mode) else f"mode {mode:o}")
    return {"listed": listed, "listing_error": listing_error, "fstat": kinds}


def steal_fd(data: dict[str, Any]) -> str:
    """pidfd_getfd: a copy of the worker's descriptors (its Redis connections among them)."""
    pidfd = os.pidfd_open(data["pid"])
    denied = 0
    for target in range(3, 65):
        ret = _libc.syscall(ctypes.c_long(SYS_PIDFD_GETFD), ctypes.c_long(pidfd),
                            ctypes.c_long(target), ctypes.c_long(0))
        if ret >= 0:
            mode = os.fstat(ret).st_mode
            os.close(ret)
            return f"took the worker's fd {target} (mode {mode:o})"
        if ctypes.get_errno() in (errno.EPERM, errno.EACCES):
            denied += 1
    if denied:
        raise OSError(errno.EPERM, f"pidfd_getfd: {os.strerror(errno.EPERM)}")
    raise Escaped("pidfd_getfd was let through (no descriptor found to take)")


def read_mem(data: dict[str, Any]) -> str:
    """Open /proc/<pid>/mem and read from the first mapping /proc/<pid>/maps names."""
    pid = data["pid"]
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        with open(f"/proc/{pid}/maps") as maps:
            start = int(maps.readline().split("-")[0], 16)
        return f"opened /proc/{pid}/mem and read {os.pread(fd, 16, start)!r}"
    except OSError as exc:
        return f"opened /proc/{pid}/mem (then {exc!r})"
    finally:
        os.close(fd)


def vm_read(data: dict[str, Any]) -> str:
    """process_vm_readv of 16 bytes of another process at a fixed address: EFAULT (nothing
    mapped there) still means the access check let the call through."""

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    buffer = ctypes.create_string_buffer(16)
    local = Iovec(ctypes.cast(buffer, ctypes.c_void_p), 16)
    remote = Iovec(0x400000, 16)
    ret = _libc.syscall(ctypes.c_long(SYS_PROCESS_VM_READV), ctypes.c_long(data["pid"]),
                        ctypes.byref(local), ctypes.c_long(1), ctypes.byref(remote),
                        ctypes.c_long(1), ctypes.c_long(0))
    if ret == -1 and ctypes.get_errno() in (errno.EPERM, errno.EACCES):
        raise OSError(ctypes.get_errno(), "process_vm_readv: "
                      + os.strerror(ctypes.get_errno()))
    if ret == -1:  # EFAULT: the address was not mapped, but the access check passed
        return f"process_vm_readv was let through ({errno.errorcode[ctypes.get_errno()]})"
    return f"read {buffer.raw[:ret]!r}"


def ptrace(data: dict[str, Any]) -> str:
    pid = data["pid"]
    _check("ptrace", _libc.ptrace(ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(pid), None, None))
    os.waitpid(pid, 0x40000000)  # __WALL: its attach stop
    _libc.ptrace(ctypes.c_long(PTRACE_DETACH), ctypes.c_long(pid), None, None)
    raise Escaped(f"attached to {pid} with ptrace")


def kill(data: dict[str, Any]) -> str:
    os.kill(data["pid"], data["signal"])
    return f"signal {data['signal']} delivered to {data['pid']}"


def wait(job: Job) -> dict[str, int]:
    """Report this child's pid, count the SIGUSR2s it gets, and end once data['release']
    exists (a file the test creates in the write grant)."""
    received = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: received.append(signum))
    job.progress({"pid": os.getpid()})
    deadline = time.monotonic() + 30
    while not os.path.exists(job.data["release"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"signals": len(received), "released": os.path.exists(job.data["release"])}


# ---- network


def connect(data: dict[str, Any]) -> str:
    family = socket.AF_INET6 if ":" in data["host"] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect((data["host"], data["port"]))
        s.sendall(data.get("payload", "PING\r\n").encode())
        reply = s.recv(100) if data.get("reply") else b""
        return f"connected to {data['host']}:{data['port']}, got {reply!r}"


def fastopen(data: dict[str, Any]) -> str:
    """TCP fast open: sendto with MSG_FASTOPEN connects without connect()."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.sendto(b"PING\r\n", MSG_FASTOPEN, (data["host"], data["port"]))
        return f"fast-opened {data['host']}:{data['port']}, got {s.recv(100)!r}"


def udp(data: dict[str, Any]) -> str:
    """A datagram by sendto, sendmsg, sendmmsg (through libc: two messages) or connect+send."""
    address = (data["host"], data["port"])
    how = data.get("how", "connect" if data.get("connect") else "sendto")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        if how == "connect":
            s.connect(address)
            s.send(b"udp-escape")
        elif how == "sendmsg":
            s.sendmsg([b"udp-escape"], [], 0, address)
        elif how == "sendmmsg":
            _sendmmsg(s.fileno(), address)
        else:
            s.sendto(b"udp-escape", address)
        return f"sent by {how}"


def _sendmmsg(fd: int, address: tuple[str, int]) -> None:
    class SockaddrIn(ctypes.Structure):
        _fields_ = [("family", ctypes.c_ushort), ("port", ctypes.c_uint16),
                    ("addr", ctypes.c_uint32), ("zero", ctypes.c_char * 8)]

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_char_p), ("len", ctypes.c_size_t)]

    class Msghdr(ctypes.Structure):
        _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                    ("iov", ctypes.POINTER(Iovec)), ("iovlen", ctypes.c_size_t),
                    ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                    ("flags", ctypes.c_int)]

    class Mmsghdr(ctypes.Structure):
        _fields_ = [("hdr", Msghdr), ("len", ctypes.c_uint)]

    name = SockaddrIn(socket.AF_INET, socket.htons(address[1]),
                      int.from_bytes(socket.inet_aton(address[0]), "little"))
    iov = Iovec(b"udp-escape", 10)
    messages = (Mmsghdr * 2)()
    for message in messages:
        message.hdr = Msghdr(ctypes.cast(ctypes.byref(name), ctypes.c_void_p),
                             ctypes.sizeof(name), ctypes.pointer(iov), 1, None, 0, 0)
    _check("sendmmsg", _libc.sendmmsg(fd, messages, 2, 0))


def udp_unspec(data: dict[str, Any]) -> str:
    """sendto(2) with an address of family AF_UNSPEC: for UDP the kernel takes it as IPv4."""

    class SockaddrIn(ctypes.Structure):
        _fields_ = [("family", ctypes.c_ushort), ("port", ctypes.c_uint16),
                    ("addr", ctypes.c_uint32), ("zero", ctypes.c_char * 8)]

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        address = SockaddrIn(socket.AF_UNSPEC, socket.htons(data["port"]),
                             int.from_bytes(socket.inet_aton(data["host"]), "little"))
        _check("sendto", _libc.sendto(s.fileno(), b"udp-escape", 10, 0, ctypes.byref(address),
                                      ctypes.sizeof(address)))
        return "sent"


def udp_bind(data: dict[str, Any]) -> str:
    """A UDP socket bound to a chosen port: a UDP server."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", data["port"]))
        return f"bound UDP 127.0.0.1:{data['port']}"


def redis_ping(data: dict[str, Any]) -> Any:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(host=data["host"], port=data["port"], socket_connect_timeout=5,
                         retry=Retry(NoBackoff(), 0))  # one try: a refusal is final
    try:
        return client.ping()
    finally:
        client.close()


def listen(data: dict[str, Any]) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", data["port"]))
        s.listen()
        return f"listening on 127.0.0.1:{data['port']}"


def unix_datagram(data: dict[str, Any]) -> str:
    """A datagram to a unix socket of the host, from a socketpair's socket (socketpair is the
    one way to get a unix socket)."""
    first, second = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with first, second:
        first.sendto(b"unix-escape", data["address"])
        return f"sent to {data['address']!r}"


def unix_bind(data: dict[str, Any]) -> str:
    """Bind a unix name (abstract, or a path): a server the host's processes could reach."""
    first, second = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with first, second:
        first.bind(data["address"])
        return f"bound {data['address']!r}"


def unix(data: dict[str, Any]) -> str:
    """Connect to a unix socket: an abstract name (starting with NUL) or a path."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(data["address"])
        s.sendall(b"unix-escape")
        return f"connected to {data['address']!r}"


def libc_connect(data: dict[str, Any]) -> str:
    """socket(2) and connect(2) through libc, then PING: C code, not Python's socket module."""

    class SockaddrIn(ctypes.Structure):
        _fields_ = [("family", ctypes.c_ushort), ("port", ctypes.c_uint16),
                    ("addr", ctypes.c_uint32), ("zero", ctypes.c_char * 8)]

    fd = _check("socket", _libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0))
    try:
        address = SockaddrIn(socket.AF_INET, socket.htons(data["port"]),
                             int.from_bytes(socket.inet_aton(data["host"]), "little"))
        _check("connect", _libc.connect(fd, ctypes.byref(address), ctypes.sizeof(address)))
        _libc.send(fd, b"PING\r\n", 6, 0)
        buffer = ctypes.create_string_buffer(100)
        n = _libc.recv(fd, buffer, 100, 0)
        return f"connected to {data['host']}:{data['port']} through libc, got {buffer.raw[:n]!r}"
    finally:
        _libc.close(fd)


# ---- programs and processes


def run(data: dict[str, Any]) -> str:
    done = subprocess.run([data["program"], "-c", "echo ran"], capture_output=True, timeout=10)
    return f"ran {data['program']}: {done.stdout!r}"


def execv(data: dict[str, Any]) -> str:
    os.execv(data["program"], [data["program"], "-c", "exit 0"])


def posix_spawn(data: dict[str, Any]) -> str:
    pid = os.posix_spawn(data["program"], [data["program"], "-c", "exit 0"], {})
    os.waitpid(pid, 0)
    return f"spawned {data['program']} as {pid}"


def fork(data: dict[str, Any]) -> str:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return f"forked {pid}"


def i386(data: dict[str, Any]) -> str:
    """A system call of the 32-bit ABI (int 0x80), which a filter written for x86_64 numbers
    does not match: eax = number, ebx/ecx/edx = arguments."""
    args = [*data.get("args", ()), 0, 0, 0]
    code = b"\x53"  # push rbx (callee-saved)
    for opcode, value in zip((0xB8, 0xBB, 0xB9, 0xBA), [data["number"], *args[:3]], strict=True):
        code += bytes([opcode]) + (value & 0xFFFFFFFF).to_bytes(4, "little")
    code += b"\xcd\x80\x5b\xc3"  # int 0x80; pop rbx; ret
    memory = mmap.mmap(-1, mmap.PAGESIZE,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    memory.write(code)
    function = ctypes.CFUNCTYPE(ctypes.c_int)(
        ctypes.addressof(ctypes.c_char.from_buffer(memory)))
    ret = function()
    name = data["name"]
    if ret in (-errno.EPERM, -errno.EACCES, -errno.ENOSYS):
        raise OSError(-ret, f"{name} (i386): {os.strerror(-ret)}")
    if ret < 0:
        raise Escaped(f"{name} (i386) was let through (it failed later, with "
                      f"{errno.errorcode.get(-ret, ret)})")
    if name == "fork":
        if ret == 0:
            os._exit(0)
        os.waitpid(ret, 0)
    raise Escaped(f"{name} (i386) returned {ret}")


def clone3(data: dict[str, Any]) -> str:
    """The raw clone3 call (glibc's fork would fall back to clone)."""
    args = (ctypes.c_uint64 * 11)()
    args[4] = signal.SIGCHLD  # exit_signal; no flags, no stack: a fork
    pid = _syscall("clone3", SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args),
                   denials=(errno.EPERM, errno.EACCES, errno.ENOSYS))
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return f"clone3 made {pid}"


# ---- undoing the rules


def raise_rlimit(data: dict[str, Any]) -> str:
    """Raise a limit the worker set: the soft CPU limit (the job's CPU budget: the kernel lets
    any process raise a soft limit up to its hard one) or the hard open-files limit (which
    needs CAP_SYS_RESOURCE)."""
    which = resource.RLIMIT_CPU if data["limit"] == "cpu" else resource.RLIMIT_NOFILE
    soft, hard = resource.getrlimit(which)
    if data["limit"] == "cpu":
        if soft == resource.RLIM_INFINITY:
            raise AssertionError("the worker set no CPU limit on this child")
        new = (hard, hard)
    else:
        if hard != OPEN_FILES:
            raise AssertionError(f"the child's hard open-files limit is {hard}, not {OPEN_FILES}")
        new = (hard * 4, hard * 4)
    if data["call"] == "prlimit":
        resource.prlimit(0, which, new)
    else:
        resource.setrlimit(which, new)
    raise Escaped(f"raised the {data['limit']} limit from {(soft, hard)} to "
                  f"{resource.getrlimit(which)}")


def prctl_seccomp(data: dict[str, Any]) -> str:
    program, _keep = _allow_all_filter()
    _check("prctl(PR_SET_SECCOMP)", _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                                                ctypes.byref(program), 0, 0))
    raise Escaped("installed a seccomp filter with prctl")


def prctl_dumpable(data: dict[str, Any]) -> str:
    _check("prctl(PR_SET_DUMPABLE)", _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0))
    raise Escaped("set PR_SET_DUMPABLE")


def seccomp(data: dict[str, Any]) -> str:
    program, _keep = _allow_all_filter()
    _syscall("seccomp", SYS_SECCOMP, SECCOMP_SET_MODE_FILTER, 0, ctypes.byref(program))
    raise Escaped("installed a seccomp filter with seccomp(2)")


def landlock(data: dict[str, Any]) -> str:
    attr = ctypes.c_uint64(1)  # handled_access_fs = EXECUTE
    fd = _syscall("landlock_create_ruleset", SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                  ctypes.sizeof(attr), 0)
    os.close(fd)
    raise Escaped("created a Landlock ruleset")


def landlock_wider(data: dict[str, Any]) -> str:
    """A Landlock layer of the handler's own that grants reading everything, then a read of
    ``data["path"]``: a layer only ever narrows, so what the others deny stays denied."""
    read_file = 1 << 2  # LANDLOCK_ACCESS_FS_READ_FILE
    attr = ctypes.c_uint64(read_file)
    ruleset = _syscall("landlock_create_ruleset", SYS_LANDLOCK_CREATE_RULESET,
                       ctypes.byref(attr), ctypes.sizeof(attr), 0)
    root = os.open("/", os.O_PATH)
    try:

        class PathBeneath(ctypes.Structure):
            _pack_ = 1
            _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

        rule = PathBeneath(read_file, root)
        _syscall("landlock_add_rule", SYS_LANDLOCK_CREATE_RULESET + 1, ruleset, 1,
                 ctypes.byref(rule), 0)
        _syscall("landlock_restrict_self", SYS_LANDLOCK_CREATE_RULESET + 2, ruleset, 0)
    finally:
        os.close(root)
        os.close(ruleset)
    return read(data)


def unshare(data: dict[str, Any]) -> str:
    _check("unshare", _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET))
    raise Escaped("unshared a user and a network namespace")


def setns(data: dict[str, Any]) -> str:
    """Join a namespace (its own, through a pidfd: any success is an escape)."""
    pidfd = os.pidfd_open(os.getpid())
    try:
        _check("setns", _libc.setns(pidfd, CLONE_NEWNET))
    finally:
        os.close(pidfd)
    raise Escaped("setns let it join a network namespace")


def chroot(data: dict[str, Any]) -> str:
    os.chroot(data["path"])
    raise Escaped(f"chrooted into {data['path']}")


def init_module(data: dict[str, Any]) -> str:
    image = ctypes.create_string_buffer(b"\x7fELF" + b"\0" * 60)
    _syscall("init_module", SYS_INIT_MODULE, image, 64, b"")
    raise Escaped("init_module succeeded")


def finit_module(data: dict[str, Any]) -> str:
    fd = os.open(data["path"], os.O_RDONLY)
    try:
        _syscall("finit_module", SYS_FINIT_MODULE, fd, b"", 0)
    finally:
        os.close(fd)
    raise Escaped("finit_module succeeded")


def io_uring(data: dict[str, Any]) -> str:
    """io_uring performs opens and connects in the kernel, past any system-call filter."""
    params = ctypes.create_string_buffer(120)
    fd = _syscall("io_uring_setup", SYS_IO_URING_SETUP, 4, params)
    os.close(fd)
    return "set up an io_uring"


def raw_syscall(data: dict[str, Any]) -> str:
    number, args = SYSCALLS[data["name"]]
    ret = _syscall(data["name"], number, *args)
    raise Escaped(f"{data['name']} returned {ret}")


def status(data: dict[str, Any]) -> dict[str, str]:
    """This child's capabilities, no_new_privs and seccomp mode, from /proc/self/status."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    names = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
    return {name: fields[name].strip() for name in names if name in fields}


def environment(data: dict[str, Any]) -> dict[str, str]:
    return dict(os.environ)


def pidfd_signal(data: dict[str, Any]) -> str:
    pidfd = os.pidfd_open(data["pid"])
    try:
        signal.pidfd_send_signal(pidfd, data["signal"])
    finally:
        os.close(pidfd)
    return f"signal {data['signal']} delivered to {data['pid']} through a pidfd"


def killpg(data: dict[str, Any]) -> str:
    os.killpg(data["pgid"], data["signal"])
    return f"signal {data['signal']} delivered to process group {data['pgid']}"


def sigio(data: dict[str, Any]) -> str:
    """Have the kernel signal another process: a pipe owned (F_SETOWN) by it, O_ASYNC, the
    signal chosen with F_SETSIG, then data written into the pipe."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(r, fcntl.F_SETOWN, data["pid"])
        fcntl.fcntl(r, F_SETSIG, data["signal"])
        fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
        os.write(w, b"x")
    finally:
        os.close(r)
        os.close(w)
    return f"armed signal {data['signal']} for {data['pid']} through O_ASYNC"


def mptcp(data: dict[str, Any]) -> str:
    """A multipath TCP socket: another protocol behind SOCK_STREAM."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP) as s:
        s.settimeout(5)
        s.connect((data["host"], data["port"]))
        s.sendall(b"PING\r\n")
        return f"connected to {data['host']}:{data['port']} with MPTCP, got {s.recv(100)!r}"


def sockopt(data: dict[str, Any]) -> str:
    """A socket option that reroutes or connects: TCP_FASTOPEN_CONNECT (a connect from the first
    send), IP_OPTIONS with loose source routing, IPv6 routing headers."""
    family = socket.AF_INET6 if data["level"] == socket.IPPROTO_IPV6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        value = bytes(data["value"]) if isinstance(data["value"], list) else data["value"]
        try:
            s.setsockopt(data["level"], data["option"], value)
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EACCES):
                raise
            raise Escaped(f"setsockopt was let through (then {exc!r})") from None
        return "set"


def socket_kind(data: dict[str, Any]) -> str:
    """Only create a socket of a kind (raw, packet, netlink, vsock): no traffic."""
    with socket.socket(data["family"], data["type"], data.get("proto", 0)):
        return f"created a socket {data['family']}/{data['type']}"


def sysv_shm(data: dict[str, Any]) -> str:
    """Attach a System V shared memory segment of the host by its key and read it."""
    _libc.shmat.restype = ctypes.c_void_p
    segment = _check("shmget", _libc.shmget(data["key"], 0, 0))
    address = _libc.shmat(segment, None, 0o10000)  # SHM_RDONLY
    if address in (None, ctypes.c_void_p(-1).value):
        _check("shmat", -1)
    content = ctypes.string_at(address, 64)
    _libc.shmdt(ctypes.c_void_p(address))
    return f"read the segment: {content.rstrip(bytes(1)).decode(errors='replace')}"


def sysv_msg(data: dict[str, Any]) -> str:
    """Take a message from a System V message queue of the host by its key."""
    queue = _check("msgget", _libc.msgget(data["key"], 0))
    buffer = ctypes.create_string_buffer(8 + 256)
    n = _check("msgrcv", _libc.msgrcv(queue, buffer, 256, 0, 0o4000))  # IPC_NOWAIT
    return f"took a message: {buffer.raw[8:8 + n].decode(errors='replace')}"


def sysv_sem(data: dict[str, Any]) -> str:
    """Set a System V semaphore of the host (found by its key) to 42."""
    semaphores = _check("semget", _libc.semget(data["key"], 0, 0))
    _check("semctl", _libc.semctl(semaphores, 0, 16, 42))  # SETVAL
    return "set the host's semaphore to 42"


def posix_mq(data: dict[str, Any]) -> str:
    """Take a message from a POSIX message queue of the host by its name."""
    queue = _check("mq_open", _libc.mq_open(data["name"].encode(), os.O_RDONLY | os.O_NONBLOCK))
    buffer = ctypes.create_string_buffer(8192)
    n = _check("mq_receive", _libc.mq_receive(queue, buffer, 8192, None))
    _libc.mq_close(queue)
    return f"took a message: {buffer.raw[:n].decode(errors='replace')}"


def schedule(data: dict[str, Any]) -> str:
    """Change how the kernel schedules another process (the same user needs no capability)."""
    pid, how = data["pid"], data["how"]
    if how == "nice":
        os.setpriority(os.PRIO_PROCESS, pid, 10)
    elif how == "affinity":
        os.sched_setaffinity(pid, {min(os.sched_getaffinity(0))})
    elif how == "policy":
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    else:  # I/O priority: the idle class
        _syscall("ioprio_set", 251, 1, pid, 3 << 13)
    return f"changed the {how} of {pid}"


def _hold() -> tuple[int, int]:
    """Start a process that waits for a byte on a pipe: (pid, the pipe's write end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # whatever happens here, this copy must not go on as the child
        try:
            os.close(w)
            os.read(r, 1)
        finally:
            os._exit(0)
    os.close(r)
    return pid, w


def _release(held: list[tuple[int, int]]) -> None:
    for pid, w in held:
        os.write(w, b"x")
        os.close(w)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def fork_beyond(data: dict[str, Any]) -> str:
    """Hold data['hold'] processes, then start one more."""
    held: list[tuple[int, int]] = []
    try:
        for _ in range(data["hold"]):
            held.append(_hold())
        extra = os.fork()
        if extra == 0:
            os._exit(0)
        os.waitpid(extra, 0)
        return f"started a process ({extra}) beside {len(held)} others"
    finally:
        _release(held)


def daemon_then_fork(data: dict[str, Any]) -> str:
    """Start a process that starts another and exits (the grandchild lives on, re-parented),
    hold one more, then start another: the grandchild must still count."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            if os.fork() == 0:
                os.close(w)
                os.read(r, 1)
        finally:
            os._exit(0)
    os.close(r)
    os.waitpid(middle, 0)
    held: list[tuple[int, int]] = []
    try:
        for _ in range(data["hold"] - 1):
            held.append(_hold())
        extra = os.fork()
        if extra == 0:
            os._exit(0)
        os.waitpid(extra, 0)
        return f"started {extra} while a daemonized grandchild and {len(held)} others lived"
    finally:
        _release(held)
        os.write(w, b"x")
        os.close(w)
        deadline = time.monotonic() + 5
        with contextlib.suppress(ChildProcessError):  # the grandchild, re-parented to us
            while time.monotonic() < deadline and os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(0.01)


def leave_behind(data: dict[str, Any]) -> int:
    """Start a process that detaches (its parent exits, so it is re-parented) and lives on,
    then end this child (Escaped: the worker replaces it). Returns nothing: the detached
    process's pid is reported as progress first."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            with contextlib.suppress(OSError):  # a new session, where the filter allows one
                os.setsid()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                os.close(w)
                time.sleep(60)
            else:
                os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    pid = int(os.read(r, 32))
    os.close(r)
    os.waitpid(middle, 0)
    return pid


def fork_race(data: dict[str, Any]) -> int:
    """data['threads'] threads start a process each at the same moment (the processes wait on
    a pipe): how many got one. A count checked before each start, and the start let go on,
    could let several through at once."""
    import threading

    r, w = os.pipe()
    barrier = threading.Barrier(data["threads"])
    started: list[int] = []
    lock = threading.Lock()

    def start() -> None:
        barrier.wait()
        try:
            pid = os.fork()
        except OSError:
            return
        if pid == 0:
            try:
                os.read(r, 1)
            finally:
                os._exit(0)
        with lock:
            started.append(pid)

    threads = [threading.Thread(target=start) for _ in range(data["threads"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.write(w, b"x" * len(started))
    for pid in started:
        os.waitpid(pid, 0)
    os.close(r)
    os.close(w)
    return len(started)


def fork_and_read(data: dict[str, Any]) -> str:
    """A process this child starts reads data['path'] and reports how it went."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with open(data["path"], "rb") as f:
                report = b"read: " + f.read(200)
        except OSError as exc:
            report = f"refused: {type(exc).__name__}".encode()
        try:
            os.write(w, report)
        finally:
            os._exit(0)
    os.close(w)
    report = os.read(r, 4096)
    os.waitpid(pid, 0)
    os.close(r)
    return report.decode(errors="replace")


def loader_exec(data: dict[str, Any]) -> str:
    """Run a program that is only readable through the dynamic loader, which every run grant
    makes executable: execve(ld.so, [ld.so, program, ...]) from C, in a started process, its
    output through a pipe."""
    loader = data["loader"].encode()
    argv_list = [loader, data["program"].encode(), *(a.encode() for a in data["args"]), None]
    argv = (ctypes.c_char_p * len(argv_list))(*argv_list)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(w, 1)
            os.dup2(w, 2)
            _libc.execve(loader, argv, (ctypes.c_char_p * 1)(None))
            os.write(w, f"execve: {os.strerror(ctypes.get_errno())}".encode())
        finally:
            os._exit(0)
    os.close(w)
    output = b""
    while chunk := os.read(r, 4096):
        output += chunk
    os.close(r)
    os.waitpid(pid, 0)
    text = output.decode(errors="replace")
    if text.startswith("execve: "):
        err = {os.strerror(e): e for e in (errno.EPERM, errno.EACCES)}.get(text[8:])
        if err is not None:
            raise OSError(err, text)
        raise Escaped(f"execve of the loader was let through ({text})")
    return f"ran {data['program']} through {data['loader']}: {text[:200]!r}"


def memfd_exec(data: dict[str, Any]) -> str:
    """Copy a readable program into an anonymous memory file and execute that (from C, in a
    started process, its output through a pipe): with execveat(AT_EMPTY_PATH), or with execve
    of /proc/self/fd/N (data['via'])."""
    with open(data["program"], "rb") as f:
        image = f.read()
    memfd = os.memfd_create("hostile", 0)
    os.write(memfd, image)
    argv = (ctypes.c_char_p * 3)(b"program", *(a.encode() for a in data["args"][:1]))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(w, 1)
            os.dup2(w, 2)
            if data.get("via") == "/proc/self/fd":
                _libc.execve(f"/proc/self/fd/{memfd}".encode(), argv,
                             (ctypes.c_char_p * 1)(None))
            else:
                _libc.syscall(ctypes.c_long(322), ctypes.c_long(memfd), b"", argv,  # execveat
                              (ctypes.c_char_p * 1)(None), ctypes.c_long(0x1000))  # EMPTY_PATH
            os.write(w, f"execve: {os.strerror(ctypes.get_errno())}".encode())
        finally:
            os._exit(0)
    os.close(w)
    output = b""
    while chunk := os.read(r, 4096):
        output += chunk
    os.close(r)
    os.close(memfd)
    os.waitpid(pid, 0)
    text = output.decode(errors="replace")
    if text.startswith("execve: "):
        err = {os.strerror(e): e for e in (errno.EPERM, errno.EACCES)}.get(text[8:])
        if err is not None:
            raise OSError(err, text)
        raise Escaped(f"execveat of a memory file was let through ({text})")
    return f"ran a copy of {data['program']} from memory: {text[:200]!r}"


def run_exit_code(data: dict[str, Any]) -> int:
    return subprocess.run([data["program"]], timeout=10).returncode


def forge(data: dict[str, Any]) -> str:
    """Write a forged frame straight onto the child's protocol pipe to the worker, then end
    the child (so that its real answer never follows)."""
    import msgpack

    kind = data["frame"]
    if kind == "garbage":
        body = b"\xc1" * 8  # a byte msgpack never uses
    elif kind == "not a map":
        body = msgpack.packb(7)
    elif kind == "ext result":
        body = msgpack.packb({"t": "done", "ok": True, "r": msgpack.ExtType(5, b"x")})
    elif kind == "bytes result":
        body = msgpack.packb({"t": "done", "ok": True, "r": b"\xff\xfe"}, use_bin_type=True)
    elif kind == "deep progress":
        value: Any = []
        for _ in range(100_000):
            value = [value]
        body = msgpack.packb({"t": "p", "v": value})
    elif kind == "huge length":
        body = b""
    else:
        raise ValueError(kind)
    header = (0xFFFFFFF0 if kind == "huge length" else len(body)).to_bytes(4, "big")
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and \
                    fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                os.write(fd, header + body)
                break
        except OSError:
            continue
    else:
        raise RuntimeError("no protocol pipe found")
    time.sleep(0.2)
    os._exit(0)


def benign(data: dict[str, Any]) -> str:
    return "fine"


ATTEMPTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    f.__name__: f for f in (
        read, list_dir, write, create, rename, delete, truncate, make_dir, hard_link_then_read,
        symlink_then_read, libc_read, descriptors, steal_fd, read_mem, vm_read, ptrace, kill,
        connect, fastopen, udp, redis_ping, listen, unix, libc_connect, run, execv, posix_spawn,
        fork, clone3, raise_rlimit, prctl_seccomp, prctl_dumpable, seccomp, landlock,
        landlock_wider, unshare,
        setns, chroot, init_module, finit_module, io_uring, raw_syscall, status, environment,
        pidfd_signal, killpg, sigio, mptcp, socket_kind, udp_bind, i386, chmod, utime, setxattr,
        chown, unix_datagram, unix_bind, libc_call, sysv_shm, sysv_msg, sysv_sem, posix_mq,
        schedule, udp_unspec, mkfifo, forge, fork_beyond, daemon_then_fork, fork_and_read,
        run_exit_code, loader_exec, memfd_exec, sockopt, leave_behind, fork_race, benign)}


def _try(job: Job) -> Any:
    if job.data["attempt"] == "wait":
        return wait(job)
    if job.data["attempt"] == "leave_behind":
        job.progress({"pid": leave_behind(job.data), "child": os.getpid()})
        raise Escaped("ending this child: is the process it started ended with it?")
    if job.data["attempt"] == "inotify":
        return inotify(job)
    return ATTEMPTS[job.data["attempt"]](job.data)


# A job timeout, so that an attempt which leaves its child hung fails instead of holding a slot.
@queues.handler(QUEUE, executor="subprocess", concurrency=2, timeout=JOB_TIMEOUT,
                limits=Limits(open_files=OPEN_FILES, cpu_seconds=CPU_SECONDS),
                permissions=Permissions(read=[IN], write=[OUT], net=[f"127.0.0.1:{PORT}"]))
def hostile(job: Job) -> Any:
    return _try(job)


@queues.handler(PROCESS_QUEUE, executor="subprocess", timeout=JOB_TIMEOUT,
                permissions=Permissions(read=[IN], processes=PROCESSES, run=["/usr/bin/true"]))
def hostile_processes(job: Job) -> Any:
    return _try(job)


@queues.handler(HOST_QUEUE, executor="subprocess", timeout=JOB_TIMEOUT,
                permissions=Permissions(net=[f"localhost:{HOST_PORT}"]))
def hostile_host(job: Job) -> Any:
    return _try(job)


# Registered in the worker only: importing hostile_threads (hostile_fork) in a child starts its
# thread (process), and the children of the queues above import this module; the children of
# these two queues import only their own module.
if sys.argv[:1] != ["-c"]:
    from hostile_fork import read_through_helper
    from hostile_threads import read_through_thread

    queues.handler(THREAD_QUEUE, executor="subprocess", timeout=JOB_TIMEOUT,
                   permissions=Permissions(read=[IN]))(read_through_thread)
    queues.handler(FORK_QUEUE, executor="subprocess", timeout=JOB_TIMEOUT,
                   permissions=Permissions(read=[IN]))(read_through_helper)
    queues.handler(DAEMON_QUEUE, executor="subprocess", timeout=JOB_TIMEOUT,
                   permissions=Permissions(read=[IN], env=["HOSTILE_DOUBLE_FORK"])
                   )(read_through_helper)
