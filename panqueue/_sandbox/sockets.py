"""The supervisor's connect, bind and addressed sends of sandboxed children.

For a connect or an addressed send it reads the address (and the data) from the child's memory,
checks the address against the child's :class:`~panqueue._sandbox.net.NetPolicy`, and performs
the call itself on a copy of the child's socket (``pidfd_getfd``) with the copy it read: letting
the kernel continue the child's call would read the memory again, after another thread of the
child could have changed it. A bind of a UDP socket is performed likewise, to a port the kernel
picks only; a TCP bind continues in the child, where Landlock decides its port; any other bind
(a socketpair's unix socket) is refused.

The supervisor's thread never blocks on a child: a blocking socket's connect or send that would
wait is performed non-blocking, and waits in :attr:`Sockets.waiting` until the socket is ready.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import os
import select
import struct
import sys
from collections.abc import Callable

from panqueue._sandbox import seccomp
from panqueue._sandbox.net import show
from panqueue._sandbox.reach import (
    LIBC,
    Child,
    Process,
    Refuse,
    Reply,
    Waiting,
    close,
    int32,
)

__all__ = ["Sockets"]

_SOL_SOCKET, _SO_TYPE, _SO_ERROR, _SO_DOMAIN = 1, 3, 4, 39
_SOCK_STREAM, _SOCK_DGRAM = 1, 2
_AF_UNSPEC, _AF_INET, _AF_INET6 = 0, 2, 10
_MSG_DONTWAIT, _MSG_NOSIGNAL = 0x40, 0x4000
_IOV_MAX = 1024  # UIO_MAXIOV
_DATAGRAM_MAX = 65535
# A stream send copies at most this much per call; the caller sees a partial send, as a
# stream send may always be.
_STREAM_CHUNK = 256 * 1024
_MSGHDR = struct.Struct("@PIPNPNi")  # struct msghdr (name, namelen, iov, iovlen, control, ...)
_MSGHDR_SIZE = 7 * 8 if struct.calcsize("P") == 8 else 7 * 4
_MMSGHDR_SIZE = _MSGHDR_SIZE + 8 if struct.calcsize("P") == 8 else _MSGHDR_SIZE + 4
_IOVEC = struct.Struct("@PN")
_WAITING_MAX = 64  # calls of one child waiting for their sockets (each holds a descriptor)


class Sockets:
    """The socket calls of every attached child, and those of them waiting for their socket.
    Used by the supervisor's thread alone, under its lock."""

    def __init__(self) -> None:
        # our copy of a waiting call's socket -> the call
        self.waiting: dict[int, Waiting] = {}

    def may_wait(self, child: Child) -> bool:
        """Whether one more of ``child``'s calls may wait for its socket: each holds a
        descriptor of the worker, which a child must not be able to exhaust."""
        return sum(w.child is child for w in self.waiting.values()) < _WAITING_MAX

    def forget(self, child: Child) -> None:
        """Drop ``child``'s waiting calls (it is detached: nobody is left to answer)."""
        for sock, waiting in list(self.waiting.items()):
            if waiting.child is child:
                del self.waiting[sock]
                close(sock)

    def _check(self, child: Child, raw: bytes, sock_type: int, what: str) -> None:
        family, ip, port = _parse_sockaddr(raw)
        udp = sock_type == _SOCK_DGRAM
        if family in (_AF_INET, _AF_INET6):
            if not child.policy.allows(ip, port, udp=udp):
                shown = show(ip, port) + (" (udp)" if udp else "")
                raise Refuse(errno.EPERM, f"{what} to {shown}")
            return
        if family == _AF_UNSPEC and what == "connect":
            return  # dissolves the association
        raise Refuse(errno.EPERM, f"{what} to an address of family {family} (only IPv4 and "
                                   "IPv6 are granted)")

    def connect(self, child: Child, process: Process, notif_id: int,
                args: list[int]) -> Reply | None:
        fd, address, size = int32(args[0]), args[1], args[2] & 0xFFFFFFFF
        raw = process.sockaddr(address, size)
        child.valid(notif_id)
        sock = process.take(fd)
        try:
            self._check(child, raw, _sockopt_int(sock, _SO_TYPE), "connect")
            flags = fcntl.fcntl(sock, fcntl.F_GETFL)
            blocking = not flags & os.O_NONBLOCK
            if blocking and not self.may_wait(child):
                raise Refuse(errno.EAGAIN, "connect: too many calls of this child waiting")
            if blocking:
                # The flag is the socket's, shared with the child: set only for this call, so
                # that the thread does not wait for the handshake.
                fcntl.fcntl(sock, fcntl.F_SETFL, flags | os.O_NONBLOCK)
            try:
                child.valid(notif_id)
                rc = LIBC.connect(sock, raw, len(raw))
                code = ctypes.get_errno() if rc != 0 else 0
            finally:
                if blocking:
                    fcntl.fcntl(sock, fcntl.F_SETFL, flags)
            if code in (errno.EINPROGRESS, errno.EALREADY) and blocking:
                def finish(sock: int = sock) -> Reply:
                    error = _sockopt_int(sock, _SO_ERROR)
                    return Reply(error=-error) if error else Reply()
                if not _writable(sock):  # a loopback handshake is often done already
                    self.waiting[sock] = Waiting(child, notif_id, sock, finish)
                    sock = -1
                    return None
                return finish()
            return Reply(error=-code) if code else Reply()
        finally:
            if sock >= 0:
                close(sock)

    def bind(self, child: Child, process: Process, notif_id: int, args: list[int]) -> Reply:
        fd, address, size = int32(args[0]), args[1], args[2] & 0xFFFFFFFF
        raw = process.sockaddr(address, size)
        child.valid(notif_id)
        sock = process.take(fd)
        try:
            domain, sock_type = _sockopt_int(sock, _SO_DOMAIN), _sockopt_int(sock, _SO_TYPE)
            if domain not in (_AF_INET, _AF_INET6):
                # socketpair's unix sockets: an abstract name could squat one the host uses
                raise Refuse(errno.EPERM, f"bind a socket of family {domain} (a unix socket)")
            if sock_type == _SOCK_STREAM:
                # Landlock decides which TCP ports: let the kernel bind, in the child.
                return Reply(flags=seccomp.NOTIF_FLAG_CONTINUE)
            if len(raw) < 4:
                raise Refuse(errno.EINVAL)
            port = int.from_bytes(raw[2:4], "big")  # same place in sockaddr_in and _in6
            if port != 0:
                raise Refuse(errno.EPERM, f"bind UDP port {port} (only TCP ports are granted, "
                                           "by listen)")
            # Port 0 (the kernel picks one, as a send would): bound here, with the address read.
            if LIBC.bind(sock, raw, len(raw)) != 0:
                return Reply(error=-ctypes.get_errno())
            return Reply()
        finally:
            close(sock)

    def _send(self, child: Child, notif_id: int, sock: int, data: bytes, name: bytes | None,
              flags: int, done: Callable[[int], None] | None = None) -> Reply | None:
        """Perform the send on our copy ``sock`` (closed unless the answer waits)."""
        try:
            blocking = not flags & _MSG_DONTWAIT and not fcntl.fcntl(sock, fcntl.F_GETFL) \
                & os.O_NONBLOCK

            def attempt(sock: int = sock) -> Reply | None:
                child.valid(notif_id)
                sent = LIBC.sendto(sock, data, len(data), flags | _MSG_DONTWAIT | _MSG_NOSIGNAL,
                                    name, len(name) if name else 0)
                if sent >= 0:
                    if done is not None:
                        done(sent)
                    return Reply(val=sent)
                code = ctypes.get_errno()
                if code in (errno.EAGAIN, errno.EWOULDBLOCK) and blocking:
                    return None
                return Reply(error=-code)

            reply = attempt()
            if reply is None and not self.may_wait(child):
                reply = Reply(error=-errno.EAGAIN)
            if reply is None:
                self.waiting[sock] = Waiting(child, notif_id, sock, attempt)
                sock = -1
            return reply
        finally:
            if sock >= 0:
                close(sock)

    def _payload(self, process: Process, sock_type: int, pieces: list[tuple[int, int]]) -> bytes:
        """The bytes of ``pieces`` (address, length): a datagram whole (EMSGSIZE when too
        long), a stream's first :data:`_STREAM_CHUNK` bytes."""
        total = sum(length for _, length in pieces)
        limit = _STREAM_CHUNK if sock_type == _SOCK_STREAM else _DATAGRAM_MAX
        if total > limit and sock_type != _SOCK_STREAM:
            raise Refuse(errno.EMSGSIZE)
        chunks: list[bytes] = []
        left = min(total, limit)
        for address, length in pieces:
            if left <= 0:
                break
            take = min(length, left)
            chunks.append(process.read(address, take))
            left -= take
        return b"".join(chunks)

    def sendto(self, child: Child, process: Process, notif_id: int,
               args: list[int]) -> Reply | None:
        fd, buffer, length = int32(args[0]), args[1], args[2]
        flags, dest, size = args[3] & 0xFFFFFFFF, args[4], args[5] & 0xFFFFFFFF
        name = process.sockaddr(dest, size) if dest and size else None
        if flags & seccomp.MSG_FASTOPEN:
            raise _fast_open(name)
        sock = process.take(fd)
        try:
            sock_type = _sockopt_int(sock, _SO_TYPE)
            if name is not None:
                self._check(child, name, sock_type, "send")
            data = self._payload(process, sock_type, [(buffer, length)])
        except BaseException:
            close(sock)
            raise
        return self._send(child, notif_id, sock, data, name, flags)

    def _message(self, process: Process, raw: bytes, sock_type: int, flags: int,
                 child: Child) -> tuple[bytes, bytes | None]:
        """A struct msghdr's payload and address, checked."""
        name_at, name_size, iov_at, iov_count, _, control_size, _ = _MSGHDR.unpack_from(raw)
        name = process.sockaddr(name_at, name_size) if name_at and name_size else None
        if flags & seccomp.MSG_FASTOPEN:
            raise _fast_open(name)
        if control_size:
            raise Refuse(errno.EPERM, "send with ancillary data (sendmsg control messages)")
        if iov_count > _IOV_MAX:
            raise Refuse(errno.EMSGSIZE)
        iovecs = process.read(iov_at, iov_count * _IOVEC.size) if iov_count else b""
        pieces = [_IOVEC.unpack_from(iovecs, i * _IOVEC.size) for i in range(iov_count)]
        if name is not None:
            self._check(child, name, sock_type, "send")
        return self._payload(process, sock_type, pieces), name

    def sendmsg(self, child: Child, process: Process, notif_id: int,
                args: list[int]) -> Reply | None:
        fd, header, flags = int32(args[0]), args[1], args[2] & 0xFFFFFFFF
        raw = process.read(header, _MSGHDR_SIZE)
        sock = process.take(fd)
        try:
            data, name = self._message(process, raw, _sockopt_int(sock, _SO_TYPE), flags, child)
        except BaseException:
            close(sock)
            raise
        return self._send(child, notif_id, sock, data, name, flags)

    def sendmmsg(self, child: Child, process: Process, notif_id: int,
                 args: list[int]) -> Reply | None:
        fd, vector, count = int32(args[0]), args[1], min(args[2] & 0xFFFFFFFF, _IOV_MAX)
        flags = args[3] & 0xFFFFFFFF
        if count == 0:
            return Reply()
        raw = process.read(vector, count * _MMSGHDR_SIZE)
        sock = process.take(fd)
        sent = 0
        try:
            sock_type = _sockopt_int(sock, _SO_TYPE)
            messages = []
            for i in range(count):
                try:
                    messages.append(self._message(
                        process, raw[i * _MMSGHDR_SIZE:(i + 1) * _MMSGHDR_SIZE], sock_type,
                        flags, child))
                except Refuse as refusal:
                    if not messages:
                        raise
                    child.deny(refusal.denial)
                    break
            child.valid(notif_id)

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
            return Reply(val=sent)
        finally:
            close(sock)


def _sockopt_int(sock: int, option: int) -> int:
    value = ctypes.c_int(0)
    size = ctypes.c_uint32(ctypes.sizeof(value))
    if LIBC.getsockopt(sock, _SOL_SOCKET, option, ctypes.byref(value), ctypes.byref(size)) != 0:
        raise Refuse(ctypes.get_errno())
    return value.value


def _parse_sockaddr(raw: bytes) -> tuple[int, str, int]:
    """(family, ip, port) of a sockaddr as the kernel will read it; ip "" when not inet."""
    if len(raw) < 2:
        raise Refuse(errno.EINVAL)
    family = int.from_bytes(raw[:2], sys.byteorder)
    if family == _AF_INET:
        if len(raw) < 16:
            raise Refuse(errno.EINVAL)
        return family, str(ipaddress.IPv4Address(raw[4:8])), int.from_bytes(raw[2:4], "big")
    if family == _AF_INET6:
        if len(raw) < 24:
            raise Refuse(errno.EINVAL)
        return family, str(ipaddress.IPv6Address(raw[8:24])), int.from_bytes(raw[2:4], "big")
    return family, "", 0


def _fast_open(name: bytes | None) -> Refuse:
    """The refusal of a TCP fast open send (a connect the filter cannot see), naming where."""
    try:
        _, ip, port = _parse_sockaddr(name) if name is not None else (0, "", 0)
    except Refuse:
        ip = ""
    where = f"connect to {show(ip, port)} (TCP fast open)" if ip else "send with TCP fast open"
    return Refuse(errno.EPERM, where)


def _writable(sock: int) -> bool:
    ready = select.poll()
    ready.register(sock, select.POLLOUT)
    return bool(ready.poll(0))
