"""A handler module whose import does what a hostile dependency would do on import: read a
secret of the host, make a unix socket (to reach a container runtime's, say), send a datagram
out, start a process and a session of its own (to outlive the child). Under permissions the
child imports it inside the rules' first layer, seccomp filter included, so each is refused;
``SECRET``, ``UNIX``, ``UDP``, ``FORK`` and ``SESSION`` say what happened."""

from __future__ import annotations

from panqueue import Job

try:
    with open("/etc/shadow") as _file:
        SECRET = _file.read(16)
except OSError as _exc:
    SECRET = f"denied: {_exc}"
try:
    import socket as _socket

    _socket.socket(_socket.AF_UNIX).close()
    UNIX = "made a unix socket"
except OSError as _exc:
    UNIX = f"denied: {_exc}"


try:
    with _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM) as _udp:
        _udp.sendto(b"out at import", ("127.0.0.1", 9))
    UDP = "sent a datagram"
except OSError as _exc:
    UDP = f"denied: {_exc}"
try:
    import os as _os

    if _os.fork() == 0:
        _os._exit(0)
    FORK = "started a process"
except OSError as _exc:
    FORK = f"denied: {_exc}"
try:
    _os.setsid()
    SESSION = "made a session"
except OSError as _exc:
    SESSION = f"denied: {_exc}"


def secret(job: Job) -> list[str]:
    return [SECRET, UNIX, UDP, FORK, SESSION]
