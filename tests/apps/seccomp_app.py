"""A process that installs panqueue's seccomp filter on itself, then tries what a test names.

Usage: ``python seccomp_app.py SPEC CHECKS``, both JSON: SPEC is FilterSpec's fields, CHECKS a
list of ``[name, arg, ...]``. The process writes ``{"fd": N, "pid": P}`` (N = -1 without a
listener) as its first line; with a listener it waits for a line on stdin (the test has attached
its supervisor), closes N, then runs each check and writes one JSON line per check:
``{"check": name, "ok": value}`` or ``{"check": name, "errno": "EPERM"}``, and ``{"done": true}``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import errno
import importlib.util
import json
import os
import resource
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def _seccomp_module() -> ModuleType:
    """panqueue._sandbox.seccomp alone, without the package: the filter's module uses nothing
    else of panqueue, and the package's import (the whole runtime, about 0.4 s of CPU) would be
    most of what each of the tests' children costs."""
    package = importlib.util.find_spec("panqueue")
    assert package is not None and package.submodule_search_locations
    path = Path(next(iter(package.submodule_search_locations))) / "_sandbox" / "seccomp.py"
    spec = importlib.util.spec_from_file_location("panqueue._sandbox.seccomp", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


_seccomp = _seccomp_module()
FilterSpec, install_filter, syscall_number = (
    _seccomp.FilterSpec, _seccomp.install_filter, _seccomp.syscall_number)

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
LISTENER = -1


def _call(rc: int) -> int:
    if rc < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return rc


def _syscall(name: str, *args: int) -> int:
    return _call(libc.syscall(ctypes.c_long(syscall_number(name)),
                              *(ctypes.c_long(a) for a in args)))


def connect(host: str, port: int) -> str:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.connect((host, port))
        sock.sendall(b"ping")
        return sock.recv(4).decode()


def connect_timeout(host: str, port: int) -> str:
    # settimeout makes the socket non-blocking underneath: connect returns EINPROGRESS
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"ping")
        return sock.recv(4).decode()


def connect_ctypes(host: str, port: int) -> str:
    fd = _call(libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0))
    try:
        address = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) \
            + socket.inet_aton(host) + bytes(8)
        _call(libc.connect(fd, address, len(address)))
        return "connected"
    finally:
        os.close(fd)


def connect_changed_address(host: str, port: int, other: str) -> str:
    """A second thread rewrites the address while connect waits for the supervisor."""
    address = ctypes.create_string_buffer(
        struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton(host)
        + bytes(8), 16)
    stop = threading.Event()
    good, bad = address.raw, address.raw[:4] + socket.inet_aton(other) + bytes(8)

    def flip() -> None:
        while not stop.is_set():
            ctypes.memmove(address, bad, 16)
            ctypes.memmove(address, good, 16)

    results = set()
    thread = threading.Thread(target=flip)
    thread.start()
    try:
        for _ in range(50):
            fd = _call(libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0))
            try:
                libc.connect(fd, address, 16)
                peer = socket.socket(fileno=os.dup(fd))
                try:
                    results.add(peer.getpeername()[0])
                except OSError:
                    results.add("refused")
                finally:
                    peer.close()
            finally:
                os.close(fd)
    finally:
        stop.set()
        thread.join()
    return ",".join(sorted(results))


def many_waiting_connects(host: str, port: int, count: int, waiting: int) -> list[str]:
    """``count`` blocking connects from as many threads to an address that does not answer;
    the outcomes of all but ``waiting`` of them (which stay blocked until the process ends)."""
    outcomes: list[str] = []
    lock = threading.Condition()

    def attempt() -> None:
        try:
            with socket.socket() as sock:
                sock.connect((host, port))
                outcome = "connected"
        except OSError as exc:
            outcome = errno.errorcode.get(exc.errno or 0, str(exc))
        with lock:
            outcomes.append(outcome)
            lock.notify_all()

    for _ in range(count):
        threading.Thread(target=attempt, daemon=True).start()
    with lock:
        lock.wait_for(lambda: len(outcomes) >= count - waiting, timeout=30)
        return sorted(set(outcomes))


def parallel_connects(host: str, port: int, threads: int, each: int) -> list[str]:
    """``threads`` threads, each connecting ``each`` times: the distinct outcomes."""
    def run(_: int) -> list[str]:
        return [connect(host, port) for _ in range(each)]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return sorted({o for outcomes in pool.map(run, range(threads)) for o in outcomes})


def connect_asyncio(host: str, port: int) -> str:
    async def main() -> str:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"ping")
        await writer.drain()
        answer = await reader.readexactly(4)
        writer.close()
        await writer.wait_closed()
        return answer.decode()
    return asyncio.run(main())


def connect_bad_pointer(port: int) -> str:
    fd = _call(libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0))
    try:
        _call(libc.connect(fd, ctypes.c_void_p(8), 16))
        return "connected"
    finally:
        os.close(fd)


def connect_closed_fd(port: int) -> str:
    address = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) \
        + socket.inet_aton("127.0.0.1") + bytes(8)
    _call(libc.connect(900, address, len(address)))
    return "connected"


def udp_sendto(host: str, port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return sock.sendto(b"x", (host, port))


def udp_sendmsg(host: str, port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return sock.sendmsg([b"x"], [], 0, (host, port))


def udp_sendmmsg(host: str, port: int) -> int:
    """Two datagrams in one sendmmsg; returns how many went (and checks msg_len)."""
    fd = _call(libc.socket(socket.AF_INET, socket.SOCK_DGRAM, 0))
    try:
        address = ctypes.create_string_buffer(
            struct.pack("=H", socket.AF_INET) + struct.pack("!H", port)
            + socket.inet_aton(host) + bytes(8), 16)
        payloads = [ctypes.create_string_buffer(b"one", 3), ctypes.create_string_buffer(b"two!", 4)]
        iovecs = [(ctypes.c_uint64 * 2)(ctypes.addressof(p), len(p)) for p in payloads]
        vector = ctypes.create_string_buffer(64 * 2)
        for i, iov in enumerate(iovecs):
            header = struct.pack("@PI4xPNPNi4xI4x", ctypes.addressof(address), 16,
                                 ctypes.addressof(iov), 1, 0, 0, 0, 0)
            ctypes.memmove(ctypes.addressof(vector) + 64 * i, header, 64)
        sent = _call(libc.sendmmsg(fd, vector, 2, 0))
        lengths = [struct.unpack_from("@I", vector.raw, 64 * i + 56)[0] for i in range(2)]
        if lengths[:sent] != [3, 4][:sent]:
            raise AssertionError(f"msg_len {lengths}")
        return int(sent)
    finally:
        os.close(fd)


def tcp_sendmsg(host: str, port: int) -> str:
    """sendmsg without an address on a connected socket (asyncio's writelines does this)."""
    with socket.create_connection((host, port)) as sock:
        sock.sendmsg([b"pi", b"ng"])
        return sock.recv(4).decode()


def fastopen(host: str, port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.sendto(b"x", socket.MSG_FASTOPEN, (host, port))


def source_route() -> str:
    with socket.socket() as sock:
        # IPv4 loose source route through 127.0.0.2 (NOP, LSRR, length 7, pointer 4, address)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS,
                        bytes([1, 0x83, 7, 4]) + socket.inet_aton("127.0.0.2"))
        return "set"


def udp_bind(port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", port))
        return int(sock.getsockname()[1])


def abstract_bind() -> str:
    left, right = socket.socketpair()
    with left, right:
        left.bind(b"\0panqueue-test-squat")
        return "bound"


def unix_socket() -> str:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
    return "made"


def socketpair() -> str:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"hi")
        return right.recv(2).decode()


def raw_socket() -> str:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
    return "made"


def listen() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        return "listening"


def fork() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return 1


def fork_two() -> list[str]:
    """Fork a child that lives until told, then try a second; then, the first gone, a third."""
    results = []
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(read, 1)
        os._exit(0)
    results.append("first")
    try:
        second = os.fork()
        if second == 0:
            os._exit(0)
        os.waitpid(second, 0)
        results.append("second")
    except OSError as exc:
        results.append(errno.errorcode[exc.errno or 0])
    os.write(write, b"x")
    os.waitpid(pid, 0)
    third = os.fork()
    if third == 0:
        os._exit(0)
    os.waitpid(third, 0)
    results.append("third")
    return results


def fork_connect(host: str, port: int) -> str:
    """A forked process connects: the supervisor reads its memory, not its parent's."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            answer = connect(host, port)
        except OSError as exc:
            answer = errno.errorcode.get(exc.errno or 0, str(exc))
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    answer = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    return answer


def execve() -> str:
    os.execv("/bin/true", ["true"])
    return "still here"


def ptrace() -> int:
    return _call(libc.ptrace(0, 0, 0, 0))  # PTRACE_TRACEME


def prctl_seccomp() -> int:
    return _call(libc.prctl(22, 2, 0, 0, 0))  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER, NULL


def prctl_seccomp_high_bits() -> int:
    # The kernel reads prctl's option as an int: high bits must not slip past the filter.
    return _syscall("prctl", (1 << 32) | 22, 2, 0, 0, 0)


def prctl_dumpable() -> int:
    return _call(libc.prctl(4, 1, 0, 0, 0))  # PR_SET_DUMPABLE


def prctl_name() -> str:
    _call(libc.prctl(15, b"renamed", 0, 0, 0))  # PR_SET_NAME
    name = ctypes.create_string_buffer(16)
    _call(libc.prctl(16, name, 0, 0, 0))  # PR_GET_NAME
    return name.value.decode()


def seccomp_syscall() -> int:
    return _syscall("seccomp", 0, 0, 0)  # SECCOMP_SET_MODE_STRICT: the process would die


def unshare() -> int:
    return _call(libc.unshare(0x40000000))  # CLONE_NEWNET


def setns() -> int:
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        return _call(libc.setns(fd, 0))
    finally:
        os.close(fd)


def chroot() -> str:
    os.chroot("/")
    return "chrooted"


def landlock() -> int:
    return _syscall("landlock_create_ruleset", 0, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION


def setrlimit_raise() -> str:
    # The soft limit up to the hard one, through libc: Python turns EPERM into ValueError.
    _, hard = resource.getrlimit(resource.RLIMIT_STACK)
    limit = (ctypes.c_uint64 * 2)(hard, hard)
    _call(libc.setrlimit(resource.RLIMIT_STACK, limit))
    return "raised"


def getrlimit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def io_uring() -> int:
    params = ctypes.create_string_buffer(120)
    return _syscall("io_uring_setup", 1, ctypes.addressof(params))


def foreign_abi_in_a_thread() -> str:
    """An x32 system call (another ABI than the filter's) from a second thread."""
    thread = threading.Thread(target=lambda: libc.syscall(ctypes.c_long(0x40000000 | 521), 0, 0))
    thread.start()
    thread.join()
    return "survived"


def sysv_ipc() -> int:
    return _call(libc.msgget(0, 0o1000 | 0o600))  # IPC_PRIVATE, IPC_CREAT


def posix_mq() -> int:
    return _call(libc.mq_open(b"/panqueue-seccomp-test", os.O_RDONLY))


def _reschedule(how: str, pid: int) -> None:
    if how == "nice":
        os.setpriority(os.PRIO_PROCESS, pid, 5)
    elif how == "affinity":
        os.sched_setaffinity(pid, os.sched_getaffinity(0))
    elif how == "policy":
        os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
    else:  # I/O priority: IOPRIO_WHO_PROCESS, best effort class, level 7
        _syscall("ioprio_set", 1, pid, (2 << 13) | 7)


def schedule(how: str, target: Any) -> str:
    """Change the scheduling of ``target``: a pid, "thread" (another thread of this process)
    or "child" (a process this one started)."""
    if target == "thread":
        started, stop = threading.Event(), threading.Event()
        native: list[int] = []

        def park() -> None:
            native.append(threading.get_native_id())
            started.set()
            stop.wait()
        thread = threading.Thread(target=park)
        thread.start()
        started.wait()
        try:
            _reschedule(how, native[0])
        finally:
            stop.set()
            thread.join()
    elif target == "child":
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.read(read, 1)
            os._exit(0)
        try:
            _reschedule(how, pid)
        finally:
            os.write(write, b"x")
            os.waitpid(pid, 0)
    else:
        _reschedule(how, int(target))
    return "changed"


def threads() -> int:
    done = []
    thread = threading.Thread(target=lambda: done.append(1))
    thread.start()
    thread.join()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return len(done) + sum(pool.map(lambda n: n, [1, 1, 1, 1]))


def listener_closed() -> str:
    if LISTENER < 0:
        return "no listener"
    try:
        os.fstat(LISTENER)
    except OSError as exc:
        return errno.errorcode[exc.errno or 0]
    return "open"


def connect_loop(host: str, port: int, count: int) -> float:
    """Seconds per connect (and close) to ``host``:``port``, over ``count`` of them."""
    start = time.perf_counter()
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.connect((host, port))
        sock.close()
    return (time.perf_counter() - start) / count


CHECKS: dict[str, Callable[..., Any]] = {
    name: value for name, value in globals().items()
    if callable(value) and not name.startswith("_") and getattr(value, "__module__", "") == __name__
}


def main() -> None:
    global LISTENER
    spec, checks = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    fd = install_filter(FilterSpec(**spec)) if spec else -1
    print(json.dumps({"fd": fd, "pid": os.getpid()}), flush=True)
    if fd >= 0:
        sys.stdin.readline()
        os.close(fd)
        LISTENER = fd
    for name, *args in checks:
        try:
            result = {"check": name, "ok": CHECKS[name](*args)}
        except OSError as exc:
            result = {"check": name, "errno": errno.errorcode.get(exc.errno or 0, str(exc))}
        print(json.dumps(result), flush=True)
    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    main()
