"""A handler module whose import does what a hostile dependency would do on import: read a
secret of the host, and make a unix socket (to reach a container runtime's, say). Under
permissions the child imports it inside the rules' first layer, so both are refused;
``SECRET`` and ``UNIX`` say what happened."""

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


def secret(job: Job) -> list[str]:
    return [SECRET, UNIX]
