"""What the supervisor holds of each sandboxed child, and how it reaches into the child's
processes: their memory (``/proc/<pid>/mem``), their descriptors (``pidfd_getfd``) and their
place in ``/proc``.

A call a filter hands over is answered with a :class:`Reply`, or refused by raising
:class:`Refuse`; a call performed non-blocking on a blocking socket waits as a
:class:`Waiting` until its socket is ready.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import select
from collections.abc import Callable
from dataclasses import dataclass, field

from panqueue._sandbox import seccomp
from panqueue._sandbox.net import NetPolicy

__all__ = ["LIBC", "Child", "Process", "Refuse", "Reply", "Waiting", "close", "int32",
           "pidfd_getfd", "tgid"]

_PIDFD_GETFD = 438  # where libseccomp does not know the name
_DENIALS_KEPT = 100
_SOCKADDR_MAX = 128  # sizeof(struct sockaddr_storage)
_OTHERS_KEPT = 32  # processes of a child's tree held open before the exited ones are pruned


class Refuse(Exception):
    """Answer the call with ``-code``; ``denial`` (if any) is recorded for the child."""

    def __init__(self, code: int, denial: str = "") -> None:
        super().__init__(code, denial)
        self.code = code
        self.denial = denial


@dataclass
class Reply:
    val: int = 0
    error: int = 0
    flags: int = 0


@dataclass
class Process:
    """A process of a child's tree whose memory and descriptors the supervisor reaches."""

    tgid: int
    pidfd: int
    mem: int

    def close(self) -> None:
        for fd in (self.mem, self.pidfd):
            close(fd)

    def read(self, address: int, size: int) -> bytes:
        """``size`` bytes of its memory at ``address`` (EFAULT when they cannot all be read)."""
        if size == 0:
            return b""
        if address == 0:
            raise Refuse(errno.EFAULT)
        try:
            data = os.pread(self.mem, size, address)
        except (OSError, OverflowError):
            raise Refuse(errno.EFAULT) from None
        if len(data) != size:
            raise Refuse(errno.EFAULT)
        return data

    def sockaddr(self, address: int, size: int) -> bytes:
        if size > _SOCKADDR_MAX:
            raise Refuse(errno.EINVAL)
        return self.read(address, size)

    def take(self, fd: int) -> int:
        """A copy of its descriptor ``fd``, the supervisor's to close."""
        if fd < 0:
            raise Refuse(errno.EBADF)
        try:
            return pidfd_getfd(self.pidfd, fd)
        except OSError as exc:
            raise Refuse(exc.errno or errno.EBADF) from None


@dataclass
class Waiting:
    """A call performed non-blocking on a blocking socket, answered when the socket is ready."""

    child: Child
    notif_id: int
    sock: int
    retry: Callable[[], Reply | None]


@dataclass
class Child:
    pid: int
    root: Process
    listener: int
    policy: NetPolicy
    processes: int
    listening: bool = True
    others: dict[int, Process] = field(default_factory=dict)
    denials: list[str] = field(default_factory=list)
    in_flight: dict[int, float] = field(default_factory=dict)  # starting thread -> until
    known: set[int] = field(default_factory=set)  # its descendants when last counted

    def deny(self, denial: str) -> None:
        # The first ones are kept, and the list only grows: a caller may remember how many it
        # has seen. A child that keeps trying adds nothing after the hundredth.
        if denial and len(self.denials) < _DENIALS_KEPT:
            self.denials.append(denial)

    def close(self) -> None:
        close(self.listener)
        self.root.close()
        for process in self.others.values():
            process.close()
        self.others.clear()

    def valid(self, notif_id: int) -> None:
        """The call is still waiting, so what was read belongs to it (its thread still exists
        and still is the one that made the call)."""
        if seccomp.library().seccomp_notify_id_valid(self.listener, notif_id) != 0:
            raise Refuse(errno.EINTR)

    def process(self, tid: int, notif_id: int) -> Process:
        """The process (thread group) of thread ``tid``: its memory and descriptors."""
        if tid == self.pid:
            return self.root
        group = tgid(tid)
        if group == self.pid:
            return self.root
        process = self.others.get(group)
        if process is None:
            try:
                pidfd = os.pidfd_open(group)
            except OSError as exc:
                raise Refuse(errno.ESRCH) from exc
            try:
                mem = os.open(f"/proc/{group}/mem", os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                close(pidfd)
                raise Refuse(errno.ESRCH) from exc
            process = Process(group, pidfd, mem)
            try:
                self.valid(notif_id)  # tid was still the caller: group is its process
            except Refuse:
                process.close()
                raise
            if len(self.others) >= _OTHERS_KEPT:
                self._prune()
            self.others[group] = process
        return process

    def _prune(self) -> None:
        """Forget the processes of the tree that have exited (their pidfds are readable)."""
        for group, process in list(self.others.items()):
            ended = select.poll()
            ended.register(process.pidfd, select.POLLIN)
            if ended.poll(0):
                process.close()
                del self.others[group]


def close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.connect.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.bind.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.sendto.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int,
                            ctypes.c_char_p, ctypes.c_uint32]
    libc.sendto.restype = ctypes.c_ssize_t
    libc.getsockopt.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                ctypes.c_void_p]
    return libc


@functools.cache
def _pidfd_getfd_number() -> int:
    try:
        number = seccomp.syscall_number("pidfd_getfd")
    except OSError:  # no libseccomp to ask
        number = -1
    return number if number >= 0 else _PIDFD_GETFD


def pidfd_getfd(pidfd: int, fd: int) -> int:
    """A copy of descriptor ``fd`` of the process ``pidfd`` refers to (close-on-exec)."""
    copy = int(LIBC.syscall(ctypes.c_long(_pidfd_getfd_number()), ctypes.c_long(pidfd),
                            ctypes.c_long(fd), ctypes.c_long(0)))
    if copy < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return copy


LIBC = _libc()


def int32(value: int) -> int:
    """A register's low 32 bits as the signed int the call takes (a descriptor, a pid)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def tgid(tid: int) -> int:
    """The process (thread group) of thread ``tid``; ESRCH when it is gone."""
    try:
        with open(f"/proc/{tid}/status", "rb") as file:
            for line in file:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    raise Refuse(errno.ESRCH)
