"""Handlers for tests/test_permissions.py: module-level functions (a subprocess child imports
them by name), each told by its job's data what to try.

``queues`` serves them to a ``panqueue worker`` process with grants under ``$PERM_APP_DIR``
(``in`` readable, ``out`` writable); the tests also register them in registries of their own.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from panqueue import Job, Permissions, Registry


def transform(job: Job) -> dict[str, Any]:
    """Read a granted file, write its upper-case copy into a granted directory, and use what a
    real handler uses: lazy imports of the standard library, TLS with the system's CA store,
    ``tempfile`` (in the first write grant)."""
    import decimal
    import ssl
    import tempfile
    import zoneinfo

    with open(job.data["src"]) as source:
        text = source.read()
    with open(job.data["dst"], "w") as target:
        target.write(text.upper())
    fd, temp = tempfile.mkstemp()
    os.close(fd)
    os.unlink(temp)
    context = ssl.create_default_context()
    print("transform done", file=sys.stderr, flush=True)
    return {"fds": _open_fds(),
            "tmp": os.path.dirname(temp), "cas": context.cert_store_stats()["x509_ca"],
            "sum": str(decimal.Decimal("0.1") + decimal.Decimal("0.2")),
            "tz": str(zoneinfo.ZoneInfo("Europe/Paris")),
            "env": sorted(os.environ)}


def _open_fds() -> dict[str, str]:
    """This process's open descriptors and what each is (the one listing them is gone)."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            pass
    return fds


def read(job: Job) -> str:
    """Read the file ``job.data["path"]`` (``"WORKER_ENVIRON"``: the worker's environment)."""
    path = job.data["path"]
    if path == "WORKER_ENVIRON":
        path = f"/proc/{os.getppid()}/environ"
    with open(path, "rb") as file:
        return file.read(64).decode(errors="replace")


def chmod(job: Job) -> None:
    """Change the mode of ``job.data["path"]``: with os.chmod, or (``fd``) through ctypes on
    an O_PATH descriptor, which Landlock lets anyone open and Python's checks never see."""
    if job.data.get("fd"):
        import ctypes

        fd = os.open(job.data["path"], os.O_PATH)
        libc = ctypes.CDLL(None, use_errno=True)
        at_empty_path = 0x1000
        if libc.syscall(452, fd, b"", 0o777, at_empty_path) != 0:  # fchmodat2 (x86_64)
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), job.data["path"])
    else:
        os.chmod(job.data["path"], 0o777)


def listdir(job: Job) -> list[str]:
    return sorted(os.listdir(job.data["path"]))


async def read_async(job: Job) -> str:
    """An async handler (its own event loop in the child) that reads a granted file."""
    import asyncio

    await asyncio.sleep(0.01)
    with open(job.data["path"]) as file:
        return file.read()


def connect(job: Job) -> str:
    """Open a TCP connection to ``job.data["host"]``:``job.data["port"]``."""
    import socket

    with socket.create_connection((job.data["host"], job.data["port"]), timeout=10):
        return "connected"


def spin(job: Job) -> None:
    """Burn CPU until killed."""
    while True:
        pass


def run(job: Job) -> str:
    """Run ``job.data["argv"]`` and return its output."""
    import subprocess

    return subprocess.run(job.data["argv"], capture_output=True, text=True,
                          check=True).stdout


queues = Registry()
_DIR = os.environ.get("PERM_APP_DIR", "/nonexistent")
queues.handler("perm-read", executor="subprocess",
               permissions=Permissions(read=[f"{_DIR}/in"], write=[f"{_DIR}/out"]))(read)
queues.handler("perm-warn", executor="subprocess",
               permissions=Permissions(read=[f"{_DIR}/in"],
                                       on_unsupported="warn"))(listdir)
