"""The worker's supervisor of sandboxed children: it decides the calls their filters hand over.

One daemon thread per worker process polls the seccomp listeners of every attached child. For a
connect or an addressed send it reads the address (and the data) from the child's memory,
checks the address against the child's :class:`~panqueue._sandbox.net.NetPolicy`, and performs
the call itself on a copy of the child's socket (``pidfd_getfd``) with the copy it read: letting
the kernel continue the child's call would read the memory again, after another thread of the
child could have changed it. A bind of a UDP socket is performed likewise, to a port the kernel
picks only; a TCP bind continues in the child, where Landlock decides its port; any other bind
(a socketpair's unix socket) is refused. For a process start (clone, fork, vfork) it counts the
child's live descendants and lets the call continue (its flags are registers the filter
already checked) or answers EAGAIN.

The thread never blocks on a child: a blocking socket's connect or send that would wait is
performed non-blocking and its answer sent when the socket is ready. It never dies either: an
unexpected error is logged at WARNING, the call is refused, and the loop goes on.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import fcntl
import functools
import ipaddress
import os
import select
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from panqueue._log import get_logger
from panqueue._sandbox import seccomp
from panqueue._sandbox.net import NetPolicy, show

__all__ = ["Supervisor", "supervisor"]

_log = get_logger("panqueue.sandbox")

_PIDFD_GETFD = 438  # where libseccomp does not know the name
_SOL_SOCKET, _SO_TYPE, _SO_ERROR, _SO_DOMAIN = 1, 3, 4, 39
_SOCK_STREAM, _SOCK_DGRAM = 1, 2
_AF_UNSPEC, _AF_INET, _AF_INET6 = 0, 2, 10
_MSG_DONTWAIT, _MSG_NOSIGNAL = 0x40, 0x4000
_SOCKADDR_MAX = 128  # sizeof(struct sockaddr_storage)
_IOV_MAX = 1024  # UIO_MAXIOV
_DATAGRAM_MAX = 65535
# A stream send copies at most this much per call; the caller sees a partial send, as a
# stream send may always be.
_STREAM_CHUNK = 256 * 1024
_DENIALS_KEPT = 100
_GONE_KEPT = 256
_MSGHDR = struct.Struct("@PIPNPNi")  # struct msghdr (name, namelen, iov, iovlen, control, ...)
_MSGHDR_SIZE = 7 * 8 if struct.calcsize("P") == 8 else 7 * 4
_MMSGHDR_SIZE = _MSGHDR_SIZE + 8 if struct.calcsize("P") == 8 else _MSGHDR_SIZE + 4
_IOVEC = struct.Struct("@PN")
_WAITING_MAX = 64  # calls of one child waiting for their sockets (each holds a descriptor)
_IN_FLIGHT = 1.0  # seconds a continued fork counts before /proc shows its process


class _Refuse(Exception):
    """Answer the call with ``-code``; ``denial`` (if any) is recorded for the child."""

    def __init__(self, code: int, denial: str = "") -> None:
        super().__init__(code, denial)
        self.code = code
        self.denial = denial


@dataclass
class _Reply:
    val: int = 0
    error: int = 0
    flags: int = 0


@dataclass
class _Process:
    """A process of a child's tree whose memory and descriptors the supervisor reaches."""

    tgid: int
    pidfd: int
    mem: int

    def close(self) -> None:
        for fd in (self.mem, self.pidfd):
            _close(fd)


@dataclass
class _Waiting:
    """A call performed non-blocking on a blocking socket, answered when the socket is ready."""

    child: _Child
    notif_id: int
    sock: int
    retry: Callable[[], _Reply | None]


@dataclass
class _Child:
    pid: int
    root: _Process
    listener: int
    policy: NetPolicy
    processes: int
    listening: bool = True
    others: dict[int, _Process] = field(default_factory=dict)
    denials: list[str] = field(default_factory=list)
    in_flight: dict[int, float] = field(default_factory=dict)  # starting thread -> until
    known: set[int] = field(default_factory=set)  # its descendants when last counted

    def deny(self, denial: str) -> None:
        # The first ones are kept, and the list only grows: a caller may remember how many it
        # has seen. A child that keeps trying adds nothing after the hundredth.
        if denial and len(self.denials) < _DENIALS_KEPT:
            self.denials.append(denial)

    def close(self) -> None:
        _close(self.listener)
        self.root.close()
        for process in self.others.values():
            process.close()
        self.others.clear()


def _close(fd: int) -> None:
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
    copy = int(_LIBC.syscall(ctypes.c_long(_pidfd_getfd_number()), ctypes.c_long(pidfd),
                             ctypes.c_long(fd), ctypes.c_long(0)))
    if copy < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return copy


_LIBC = _libc()


def _sockopt_int(sock: int, option: int) -> int:
    value = ctypes.c_int(0)
    size = ctypes.c_uint32(ctypes.sizeof(value))
    if _LIBC.getsockopt(sock, _SOL_SOCKET, option, ctypes.byref(value), ctypes.byref(size)) != 0:
        raise _Refuse(ctypes.get_errno())
    return value.value


def _parse_sockaddr(raw: bytes) -> tuple[int, str, int]:
    """(family, ip, port) of a sockaddr as the kernel will read it; ip "" when not inet."""
    if len(raw) < 2:
        raise _Refuse(errno.EINVAL)
    family = int.from_bytes(raw[:2], sys.byteorder)
    if family == _AF_INET:
        if len(raw) < 16:
            raise _Refuse(errno.EINVAL)
        return family, str(ipaddress.IPv4Address(raw[4:8])), int.from_bytes(raw[2:4], "big")
    if family == _AF_INET6:
        if len(raw) < 24:
            raise _Refuse(errno.EINVAL)
        return family, str(ipaddress.IPv6Address(raw[8:24])), int.from_bytes(raw[2:4], "big")
    return family, "", 0


def _fast_open(name: bytes | None) -> _Refuse:
    """The refusal of a TCP fast open send (a connect the filter cannot see), naming where."""
    try:
        _, ip, port = _parse_sockaddr(name) if name is not None else (0, "", 0)
    except _Refuse:
        ip = ""
    where = f"connect to {show(ip, port)} (TCP fast open)" if ip else "send with TCP fast open"
    return _Refuse(errno.EPERM, where)


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


class Supervisor:
    """Decides the calls the filters of attached children hand over. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: dict[int, _Child] = {}
        self._gone: collections.OrderedDict[int, list[str]] = collections.OrderedDict()
        self._waiting: dict[int, _Waiting] = {}
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread: threading.Thread | None = None
        self._numbers = {name: seccomp.syscall_number(name) for name in
                         ("connect", "bind", "sendto", "sendmsg", "sendmmsg", "clone", "fork",
                          "vfork")}
        # number -> (what it changes, the argument naming the process)
        self._scheduling = {
            seccomp.syscall_number(name): (what, arg) for name, what, arg in (
                ("sched_setaffinity", "CPU affinity", 0), ("sched_setscheduler", "scheduling", 0),
                ("sched_setparam", "scheduling", 0), ("sched_setattr", "scheduling", 0),
                ("setpriority", "priority", 1), ("ioprio_set", "I/O priority", 1))
            if seccomp.syscall_number(name) >= 0}
        self._notif: Any = None
        self._resp: Any = None

    # -- the worker's side ------------------------------------------------------------------

    def attach(self, pid: int, child_fd: int, policy: NetPolicy, processes: int) -> None:
        """Take over child ``pid``'s listener (its descriptor ``child_fd``): from now on its
        handed-over calls are decided here. The child must close its own copy afterwards."""
        pidfd = os.pidfd_open(pid)
        opened = [pidfd]
        try:
            listener = pidfd_getfd(pidfd, child_fd)
            opened.append(listener)
            if "seccomp" not in os.readlink(f"/proc/self/fd/{listener}"):
                raise OSError(errno.EINVAL, f"descriptor {child_fd} of process {pid} is not "
                                            "a seccomp listener")
            mem = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
        except BaseException:
            for fd in opened:
                _close(fd)
            raise
        child = _Child(pid, _Process(pid, pidfd, mem), listener, policy, processes)
        with self._lock:
            try:
                self._start()
            except BaseException:
                child.close()
                raise
            old = self._children.pop(pid, None)
            if old is not None:
                self._forget(old)
            self._children[pid] = child
            self._gone.pop(pid, None)
        self._wake()

    def detach(self, pid: int) -> None:
        """Child ``pid`` is gone (or to be released): close everything held for it. Its
        denials stay readable for a while."""
        with self._lock:
            child = self._children.pop(pid, None)
            if child is not None:
                self._forget(child)
                self._gone[pid] = list(child.denials)
                while len(self._gone) > _GONE_KEPT:
                    self._gone.popitem(last=False)
        self._wake()

    def denials(self, pid: int) -> list[str]:
        """What was denied to child ``pid``, in order (the first hundred; the list only grows
        while the child is attached, and stays readable a while after :meth:`detach`)."""
        with self._lock:
            child = self._children.get(pid)
            if child is not None:
                return list(child.denials)
            return list(self._gone.get(pid, ()))

    def attached(self) -> list[int]:
        with self._lock:
            return list(self._children)

    def _forget(self, child: _Child) -> None:
        for sock, waiting in list(self._waiting.items()):
            if waiting.child is child:
                del self._waiting[sock]
                _close(sock)
        child.close()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass

    def _start(self) -> None:
        if self._notif is None:
            notif = ctypes.POINTER(seccomp.Notif)()
            resp = ctypes.POINTER(seccomp.NotifResp)()
            rc = seccomp.library().seccomp_notify_alloc(ctypes.byref(notif), ctypes.byref(resp))
            if rc != 0:
                raise OSError(-rc, "libseccomp cannot allocate notifications")
            self._notif, self._resp = notif, resp
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="panqueue-sandbox-supervisor",
                                            daemon=True)
            self._thread.start()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except Exception as exc:  # never let the thread die: the children would hang
                _log.warning("sandbox supervisor error", error=f"{type(exc).__name__}: {exc}")

    def _turn(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        with self._lock:
            for child in self._children.values():
                if child.listening:
                    poller.register(child.listener, select.POLLIN)
            for sock in self._waiting:
                poller.register(sock, select.POLLOUT)
        ready = poller.poll()
        with self._lock:
            for fd, events in ready:
                if fd == self._wake_r:
                    try:
                        while os.read(self._wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                waiting = self._waiting.pop(fd, None)
                if waiting is not None:
                    self._resume(waiting)
                    continue
                found = next((c for c in self._children.values() if c.listener == fd), None)
                if found is None or not found.listening:
                    continue  # detached meanwhile
                if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) \
                        and not events & select.POLLIN:
                    found.listening = False  # every process of the child has exited
                    continue
                self._receive(found)

    def _receive(self, child: _Child) -> None:
        # Look again, without waiting: a receive with nothing pending would block the thread.
        again = select.poll()
        again.register(child.listener, select.POLLIN)
        if not any(events & select.POLLIN for _, events in again.poll(0)):
            return
        lib = seccomp.library()
        ctypes.memset(self._notif, 0, ctypes.sizeof(seccomp.Notif))  # the kernel insists
        if lib.seccomp_notify_receive(child.listener, self._notif) != 0:
            return  # the calling thread was interrupted or died meanwhile
        request = self._notif.contents
        notif_id, tid, nr = int(request.id), int(request.pid), int(request.data.nr)
        args = [int(a) for a in request.data.args]
        try:
            reply = self._decide(child, notif_id, tid, nr, args)
        except _Refuse as refusal:
            child.deny(refusal.denial)
            reply = _Reply(error=-refusal.code)
        except Exception as exc:
            _log.warning("sandbox supervisor refused a call it could not decide", pid=child.pid,
                         syscall=nr, error=f"{type(exc).__name__}: {exc}")
            reply = _Reply(error=-errno.EPERM)
        if reply is not None:
            self._respond(child, notif_id, reply)

    def _respond(self, child: _Child, notif_id: int, reply: _Reply) -> None:
        resp = self._resp.contents
        resp.id, resp.val, resp.error, resp.flags = notif_id, reply.val, reply.error, reply.flags
        # Fails when the calling thread was interrupted or died meanwhile: nothing to answer.
        seccomp.library().seccomp_notify_respond(child.listener, self._resp)

    def _may_wait(self, child: _Child) -> bool:
        """Whether one more of ``child``'s calls may wait for its socket: each holds a
        descriptor of the worker, which a child must not be able to exhaust."""
        return sum(w.child is child for w in self._waiting.values()) < _WAITING_MAX

    def _valid(self, child: _Child, notif_id: int) -> None:
        """The call is still waiting, so what was read belongs to it (its thread still exists
        and still is the one that made the call)."""
        if seccomp.library().seccomp_notify_id_valid(child.listener, notif_id) != 0:
            raise _Refuse(errno.EINTR)

    def _resume(self, waiting: _Waiting) -> None:
        try:
            reply = waiting.retry()
        except _Refuse as refusal:
            reply = _Reply(error=-refusal.code)
        except Exception as exc:
            _log.warning("sandbox supervisor error", pid=waiting.child.pid,
                         error=f"{type(exc).__name__}: {exc}")
            reply = _Reply(error=-errno.EPERM)
        if reply is None:
            self._waiting[waiting.sock] = waiting
            return
        _close(waiting.sock)
        self._respond(waiting.child, waiting.notif_id, reply)

    # -- deciding -------------------------------------------------------------------------------

    def _decide(self, child: _Child, notif_id: int, tid: int, nr: int,
                args: list[int]) -> _Reply | None:
        numbers = self._numbers
        if nr in (numbers["clone"], numbers["fork"], numbers["vfork"]):
            return self._process_start(child, tid)
        if nr in self._scheduling:
            return self._scheduling_call(child, self._scheduling[nr], args)
        process = self._process(child, tid, notif_id)
        if nr == numbers["connect"]:
            return self._connect(child, process, notif_id, args)
        if nr == numbers["bind"]:
            return self._bind(child, process, notif_id, args)
        if nr == numbers["sendto"]:
            return self._sendto(child, process, notif_id, args)
        if nr == numbers["sendmsg"]:
            return self._sendmsg(child, process, notif_id, args)
        if nr == numbers["sendmmsg"]:
            return self._sendmmsg(child, process, notif_id, args)
        _log.warning("sandbox supervisor got a call it does not handle", pid=child.pid,
                     syscall=nr)
        raise _Refuse(errno.EPERM)

    def _process_start(self, child: _Child, tid: int) -> _Reply:
        live = _descendants(child.pid)
        now = time.monotonic()
        # A start let through a moment ago may not show in /proc yet: it counts until its
        # thread asks again (its clone has returned by then), a new process shows, or a
        # second has gone by; so two threads' quick starts are not both let through on the
        # same count.
        in_flight = child.in_flight
        in_flight.pop(tid, None)
        for caller, until in sorted(in_flight.items(), key=lambda item: item[1]):
            if until <= now:
                del in_flight[caller]
        for caller in sorted(in_flight, key=in_flight.__getitem__)[:len(live - child.known)]:
            del in_flight[caller]
        child.known = live
        if len(live) + len(in_flight) >= child.processes:
            raise _Refuse(errno.EAGAIN, f"start a process (processes={child.processes})")
        in_flight[tid] = now + _IN_FLIGHT
        return _Reply(flags=seccomp.NOTIF_FLAG_CONTINUE)

    def _scheduling_call(self, child: _Child, call: tuple[str, int], args: list[int]) -> _Reply:
        """A change to the scheduling of a process named by pid: the child's own processes and
        threads may be changed (the pid is a register: the call continues), no other."""
        what, arg = call
        target = _int32(args[arg])
        try:
            tgid = _tgid(target) if target > 0 else -1
        except _Refuse:
            raise _Refuse(errno.ESRCH) from None
        if tgid == child.pid or tgid in _descendants(child.pid):
            return _Reply(flags=seccomp.NOTIF_FLAG_CONTINUE)
        raise _Refuse(errno.EPERM, f"change the {what} of process {target} (not one of its own)")

    def _process(self, child: _Child, tid: int, notif_id: int) -> _Process:
        """The process (thread group) of thread ``tid``: its memory and descriptors."""
        if tid == child.pid:
            return child.root
        tgid = _tgid(tid)
        if tgid == child.pid:
            return child.root
        process = child.others.get(tgid)
        if process is None:
            try:
                pidfd = os.pidfd_open(tgid)
            except OSError as exc:
                raise _Refuse(errno.ESRCH) from exc
            try:
                mem = os.open(f"/proc/{tgid}/mem", os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                _close(pidfd)
                raise _Refuse(errno.ESRCH) from exc
            process = _Process(tgid, pidfd, mem)
            try:
                self._valid(child, notif_id)  # tid was still the caller: tgid is its process
            except _Refuse:
                process.close()
                raise
            if len(child.others) >= 32:
                _prune(child)
            child.others[tgid] = process
        return process

    def _read(self, process: _Process, address: int, size: int) -> bytes:
        if size == 0:
            return b""
        if address == 0:
            raise _Refuse(errno.EFAULT)
        try:
            data = os.pread(process.mem, size, address)
        except (OSError, OverflowError):
            raise _Refuse(errno.EFAULT) from None
        if len(data) != size:
            raise _Refuse(errno.EFAULT)
        return data

    def _sockaddr(self, process: _Process, address: int, size: int) -> bytes:
        if size > _SOCKADDR_MAX:
            raise _Refuse(errno.EINVAL)
        return self._read(process, address, size)

    def _take(self, process: _Process, fd: int) -> int:
        if fd < 0:
            raise _Refuse(errno.EBADF)
        try:
            return pidfd_getfd(process.pidfd, fd)
        except OSError as exc:
            raise _Refuse(exc.errno or errno.EBADF) from None

    def _check(self, child: _Child, raw: bytes, sock_type: int, what: str) -> None:
        family, ip, port = _parse_sockaddr(raw)
        udp = sock_type == _SOCK_DGRAM
        if family in (_AF_INET, _AF_INET6):
            if not child.policy.allows(ip, port, udp=udp):
                shown = show(ip, port) + (" (udp)" if udp else "")
                raise _Refuse(errno.EPERM, f"{what} to {shown}")
            return
        if family == _AF_UNSPEC and what == "connect":
            return  # dissolves the association
        raise _Refuse(errno.EPERM, f"{what} to an address of family {family} (only IPv4 and "
                                   "IPv6 are granted)")

    def _connect(self, child: _Child, process: _Process, notif_id: int,
                 args: list[int]) -> _Reply | None:
        fd, address, size = _int32(args[0]), args[1], args[2] & 0xFFFFFFFF
        raw = self._sockaddr(process, address, size)
        self._valid(child, notif_id)
        sock = self._take(process, fd)
        try:
            self._check(child, raw, _sockopt_int(sock, _SO_TYPE), "connect")
            flags = fcntl.fcntl(sock, fcntl.F_GETFL)
            blocking = not flags & os.O_NONBLOCK
            if blocking and not self._may_wait(child):
                raise _Refuse(errno.EAGAIN, "connect: too many calls of this child waiting")
            if blocking:
                # The flag is the socket's, shared with the child: set only for this call, so
                # that the thread does not wait for the handshake.
                fcntl.fcntl(sock, fcntl.F_SETFL, flags | os.O_NONBLOCK)
            try:
                self._valid(child, notif_id)
                rc = _LIBC.connect(sock, raw, len(raw))
                code = ctypes.get_errno() if rc != 0 else 0
            finally:
                if blocking:
                    fcntl.fcntl(sock, fcntl.F_SETFL, flags)
            if code in (errno.EINPROGRESS, errno.EALREADY) and blocking:
                def finish(sock: int = sock) -> _Reply:
                    error = _sockopt_int(sock, _SO_ERROR)
                    return _Reply(error=-error) if error else _Reply()
                if not _writable(sock):  # a loopback handshake is often done already
                    self._waiting[sock] = _Waiting(child, notif_id, sock, finish)
                    sock = -1
                    return None
                return finish()
            return _Reply(error=-code) if code else _Reply()
        finally:
            if sock >= 0:
                _close(sock)

    def _bind(self, child: _Child, process: _Process, notif_id: int, args: list[int]) -> _Reply:
        fd, address, size = _int32(args[0]), args[1], args[2] & 0xFFFFFFFF
        raw = self._sockaddr(process, address, size)
        self._valid(child, notif_id)
        sock = self._take(process, fd)
        try:
            domain, sock_type = _sockopt_int(sock, _SO_DOMAIN), _sockopt_int(sock, _SO_TYPE)
            if domain not in (_AF_INET, _AF_INET6):
                # socketpair's unix sockets: an abstract name could squat one the host uses
                raise _Refuse(errno.EPERM, f"bind a socket of family {domain} (a unix socket)")
            if sock_type == _SOCK_STREAM:
                # Landlock decides which TCP ports: let the kernel bind, in the child.
                return _Reply(flags=seccomp.NOTIF_FLAG_CONTINUE)
            if len(raw) < 4:
                raise _Refuse(errno.EINVAL)
            port = int.from_bytes(raw[2:4], "big")  # same place in sockaddr_in and _in6
            if port != 0:
                raise _Refuse(errno.EPERM, f"bind UDP port {port} (only TCP ports are granted, "
                                           "by listen)")
            # Port 0 (the kernel picks one, as a send would): bound here, with the address read.
            if _LIBC.bind(sock, raw, len(raw)) != 0:
                return _Reply(error=-ctypes.get_errno())
            return _Reply()
        finally:
            _close(sock)

    def _send(self, child: _Child, notif_id: int, sock: int, data: bytes, name: bytes | None,
              flags: int, done: Callable[[int], None] | None = None) -> _Reply | None:
        """Perform the send on our copy ``sock`` (closed unless the answer waits)."""
        try:
            blocking = not flags & _MSG_DONTWAIT and not fcntl.fcntl(sock, fcntl.F_GETFL) \
                & os.O_NONBLOCK

            def attempt(sock: int = sock) -> _Reply | None:
                self._valid(child, notif_id)
                sent = _LIBC.sendto(sock, data, len(data), flags | _MSG_DONTWAIT | _MSG_NOSIGNAL,
                                    name, len(name) if name else 0)
                if sent >= 0:
                    if done is not None:
                        done(sent)
                    return _Reply(val=sent)
                code = ctypes.get_errno()
                if code in (errno.EAGAIN, errno.EWOULDBLOCK) and blocking:
                    return None
                return _Reply(error=-code)

            reply = attempt()
            if reply is None and not self._may_wait(child):
                reply = _Reply(error=-errno.EAGAIN)
            if reply is None:
                self._waiting[sock] = _Waiting(child, notif_id, sock, attempt)
                sock = -1
            return reply
        finally:
            if sock >= 0:
                _close(sock)

    def _payload(self, process: _Process, sock_type: int, pieces: list[tuple[int, int]]) -> bytes:
        """The bytes of ``pieces`` (address, length): a datagram whole (EMSGSIZE when too
        long), a stream's first :data:`_STREAM_CHUNK` bytes."""
        total = sum(length for _, length in pieces)
        limit = _STREAM_CHUNK if sock_type == _SOCK_STREAM else _DATAGRAM_MAX
        if total > limit and sock_type != _SOCK_STREAM:
            raise _Refuse(errno.EMSGSIZE)
        chunks: list[bytes] = []
        left = min(total, limit)
        for address, length in pieces:
            if left <= 0:
                break
            take = min(length, left)
            chunks.append(self._read(process, address, take))
            left -= take
        return b"".join(chunks)

    def _sendto(self, child: _Child, process: _Process, notif_id: int,
                args: list[int]) -> _Reply | None:
        fd, buffer, length = _int32(args[0]), args[1], args[2]
        flags, dest, size = args[3] & 0xFFFFFFFF, args[4], args[5] & 0xFFFFFFFF
        name = self._sockaddr(process, dest, size) if dest and size else None
        if flags & seccomp.MSG_FASTOPEN:
            raise _fast_open(name)
        sock = self._take(process, fd)
        try:
            sock_type = _sockopt_int(sock, _SO_TYPE)
            if name is not None:
                self._check(child, name, sock_type, "send")
            data = self._payload(process, sock_type, [(buffer, length)])
        except BaseException:
            _close(sock)
            raise
        return self._send(child, notif_id, sock, data, name, flags)

    def _message(self, process: _Process, raw: bytes, sock_type: int, flags: int,
                 child: _Child) -> tuple[bytes, bytes | None]:
        """A struct msghdr's payload and address, checked."""
        name_at, name_size, iov_at, iov_count, _, control_size, _ = _MSGHDR.unpack_from(raw)
        name = self._sockaddr(process, name_at, name_size) if name_at and name_size else None
        if flags & seccomp.MSG_FASTOPEN:
            raise _fast_open(name)
        if control_size:
            raise _Refuse(errno.EPERM, "send with ancillary data (sendmsg control messages)")
        if iov_count > _IOV_MAX:
            raise _Refuse(errno.EMSGSIZE)
        iovecs = self._read(process, iov_at, iov_count * _IOVEC.size) if iov_count else b""
        pieces = [_IOVEC.unpack_from(iovecs, i * _IOVEC.size) for i in range(iov_count)]
        if name is not None:
            self._check(child, name, sock_type, "send")
        return self._payload(process, sock_type, pieces), name

    def _sendmsg(self, child: _Child, process: _Process, notif_id: int,
                 args: list[int]) -> _Reply | None:
        fd, header, flags = _int32(args[0]), args[1], args[2] & 0xFFFFFFFF
        raw = self._read(process, header, _MSGHDR_SIZE)
        sock = self._take(process, fd)
        try:
            data, name = self._message(process, raw, _sockopt_int(sock, _SO_TYPE), flags, child)
        except BaseException:
            _close(sock)
            raise
        return self._send(child, notif_id, sock, data, name, flags)

    def _sendmmsg(self, child: _Child, process: _Process, notif_id: int,
                  args: list[int]) -> _Reply | None:
        fd, vector, count = _int32(args[0]), args[1], min(args[2] & 0xFFFFFFFF, _IOV_MAX)
        flags = args[3] & 0xFFFFFFFF
        if count == 0:
            return _Reply()
        raw = self._read(process, vector, count * _MMSGHDR_SIZE)
        sock = self._take(process, fd)
        sent = 0
        try:
            sock_type = _sockopt_int(sock, _SO_TYPE)
            messages = []
            for i in range(count):
                try:
                    messages.append(self._message(
                        process, raw[i * _MMSGHDR_SIZE:(i + 1) * _MMSGHDR_SIZE], sock_type,
                        flags, child))
                except _Refuse as refusal:
                    if not messages:
                        raise
                    child.deny(refusal.denial)
                    break
            self._valid(child, notif_id)

            def note_length(index: int) -> Callable[[int], None]:
                def done(length: int) -> None:
                    at = vector + index * _MMSGHDR_SIZE + _MSGHDR_SIZE
                    try:
                        os.pwrite(process.mem, struct.pack("@I", length), at)
                    except OSError:
                        pass
                return done

            first_data, first_name = messages[0]
            # The first message may wait for a blocking socket; the others go while they can.
            first = self._send(child, notif_id, os.dup(sock), first_data, first_name, flags,
                               note_length(0))
            if first is None or first.error:
                return first
            sent = 1
            for index, (data, name) in enumerate(messages[1:], start=1):
                reply = self._send(child, notif_id, os.dup(sock), data, name,
                                   flags | _MSG_DONTWAIT, note_length(index))
                if reply is None or reply.error:
                    break
                sent += 1
            return _Reply(val=sent)
        finally:
            _close(sock)


def _writable(sock: int) -> bool:
    ready = select.poll()
    ready.register(sock, select.POLLOUT)
    return bool(ready.poll(0))


def _tgid(tid: int) -> int:
    try:
        with open(f"/proc/{tid}/status", "rb") as file:
            for line in file:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    raise _Refuse(errno.ESRCH)


def _prune(child: _Child) -> None:
    """Forget the processes of ``child``'s tree that have exited (their pidfds are readable)."""
    for tgid, process in list(child.others.items()):
        ended = select.poll()
        ended.register(process.pidfd, select.POLLIN)
        if ended.poll(0):
            process.close()
            del child.others[tgid]


def _descendants(root: int) -> set[int]:
    """The processes (zombies included) that descend from ``root``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                stat = file.read()
            parent = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        below = children.get(todo.pop(), [])
        found.update(below)
        todo.extend(below)
    return found


_instance: Supervisor | None = None
_instance_lock = threading.Lock()


def supervisor() -> Supervisor:
    """This process's supervisor (its thread starts with the first attach)."""
    global _instance
    with _instance_lock:
        if _instance is None:
            _instance = Supervisor()
        return _instance


def _after_fork() -> None:
    global _instance, _instance_lock
    # Its thread did not survive the fork: a forked process starts afresh.
    _instance, _instance_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
