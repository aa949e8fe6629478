"""Handlers for the failover tests (Sentinel and Cluster). Every run writes one line to a
journal of its process (``$FAILOVER_JOURNAL``/journal-<pid>.log) before it returns: the test's
record of how often each job ran, kept outside Redis, so a failover cannot lose it.

Completed jobs are all kept (``Retention(completed=-1)``), and a short lock TTL lets the stalled
sweep hand back a job whose claim or completion a failover lost within seconds."""

from __future__ import annotations

import os

import anyio

from panqueue import Backoff, Job, Registry, Retention

queues = Registry()

_COMMON = dict(lock_ttl=3.0, max_stalls=1000, attempts=25, backoff=Backoff.fixed(0.1),
               retention=Retention(completed=-1, failed=-1, failed_for=None))
# The Cluster test spreads its jobs over this many queues (so over every master).
CLUSTER_QUEUES = 6
_journal_fd: int | None = None


def _journal(job: Job) -> None:
    global _journal_fd
    if _journal_fd is None:
        path = os.path.join(os.environ["FAILOVER_JOURNAL"], f"journal-{os.getpid()}.log")
        _journal_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_journal_fd, f"{job.queue} {job.id} {job.attempt}\n".encode())


async def _run(job: Job) -> str:
    _journal(job)
    await anyio.sleep(float(os.environ.get("FAILOVER_JOB_SECONDS", "0")))
    return job.id


queues.handler("fo-sentinel", concurrency=10, **_COMMON)(_run)
for _index in range(CLUSTER_QUEUES):
    queues.handler(f"fo-cluster-{_index}", concurrency=20, **_COMMON)(_run)
