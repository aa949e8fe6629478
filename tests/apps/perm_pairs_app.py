"""Handlers for tests/test_permissions_pairings.py: sandboxed handlers that meet the queue's other
capabilities (timeouts, cancel, retries, recycled children, progress and logs, shutdown, limits,
partitions). Module-level functions (a subprocess child imports them by name), each told by its
job's data what to do.

``queues`` serves ``hold`` on the queue ``perm-pairs``, granted one process, to a ``panqueue
worker`` process (a test that signals the worker); the tests register the others in registries of
their own.
"""

from __future__ import annotations

import os
import time
from typing import Any

from panqueue import Job, Permissions, Registry


def _start_sleeper() -> int:
    """Start a process (a fork of this child, no program run) that sleeps for a minute: it must
    end with the child, whatever ends the child."""
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(60)
        finally:
            os._exit(0)
    return pid


def hold(job: Job) -> str:
    """Report this child's pid and, with ``data["grandchild"]``, the pid of a sleeping process it
    started (as progress), then hold the job: until ``job.should_stop()`` with
    ``data["poll"]``, else for a minute. ``data["quick"]``: return at once."""
    if job.data.get("quick"):
        return "quick"
    pids = {"child": os.getpid()}
    if job.data.get("grandchild"):
        pids["grandchild"] = _start_sleeper()
    job.progress(pids)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if job.data.get("poll") and job.should_stop():
            return "stopped"
        time.sleep(0.02)
    return "held to the end"


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


def read_on_retry(job: Job) -> str:
    """Attempt 1 reads ``data["denied"]`` (outside the grants), later attempts
    ``data["granted"]``."""
    return _read(job.data["denied"] if job.attempt == 1 else job.data["granted"])


def try_denied(job: Job) -> dict[str, Any]:
    """Try to read ``data["denied"]``: this child's pid and what the read raised (None: it was
    read)."""
    try:
        _read(job.data["denied"])
    except OSError as exc:
        return {"pid": os.getpid(), "raised": type(exc).__name__}
    return {"pid": os.getpid(), "raised": None}


def report(job: Job) -> str:
    """Progress and log lines around a granted read and a denied one."""
    job.progress(10)
    job.log("reading the granted file")
    text = _read(job.data["granted"])
    job.progress({"read": len(text)})
    try:
        _read(job.data["denied"])
    except PermissionError as exc:
        job.log(f"denied: {exc}")
    job.progress(100)
    return text


def consume(job: Job) -> int:
    """Allocate ``data["mb"]`` MB at once (and return how many), or with ``data["spin"]`` burn
    CPU until killed."""
    if job.data.get("spin"):
        while True:
            pass
    return len(bytearray(job.data["mb"] * 1024 * 1024)) // (1024 * 1024)


queues = Registry()
queues.handler("perm-pairs", executor="subprocess", timeout=60,
               permissions=Permissions(processes=1))(hold)
