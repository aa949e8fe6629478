"""A handler module whose import does what a hostile dependency would do on import: read a
secret of the host. Under permissions the child imports it inside the rules' first layer, so
the read is refused; ``SECRET`` says what happened."""

from __future__ import annotations

from panqueue import Job

try:
    with open("/etc/shadow") as _file:
        SECRET = _file.read(16)
except OSError as _exc:
    SECRET = f"denied: {_exc}"


def secret(job: Job) -> str:
    return SECRET
