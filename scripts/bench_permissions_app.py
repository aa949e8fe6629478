"""Handlers for ``scripts/bench.py --permissions`` (loaded by the worker process as
``bench_permissions_app:queues``): the same subprocess handlers with and without
``Permissions``, to measure what the kernel-enforced rules cost.

Each handler comes in three variants: ``plain`` (no permissions), ``files`` (read and write
grants on a scratch directory: Landlock and the seccomp filter, no supervisor) and ``net`` (the
same and an outbound grant for the benchmark's listener: the filter then hands connects to the
worker's supervisor, which is attached to every child).

* ``bench-p-{noop,cpu}-VARIANT``: a no-op, and 10 ms of pure-Python CPU work.
* ``bench-p-start-VARIANT``: a no-op with ``max_jobs_per_child=1``: every job starts (and ends)
  a child, so the time per job is dominated by the child's start.
* ``bench-p-connect-{plain,net}``: ``job.data["n"]`` TCP connects (and closes) to the
  benchmark's listener on 127.0.0.1; returns the mean µs per connect, timed in the child.

Where the listener and the scratch directory are comes from ``PANQUEUE_BENCH_CONNECT_PORT``
and ``PANQUEUE_BENCH_DIR``, which the children inherit (``env``). No handler declares a
concurrency: the benchmark sets it with the worker's ``--concurrency``.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time

from bench_app import burn_cpu

from panqueue import Job, Permissions, Registry

PORT = int(os.environ.get("PANQUEUE_BENCH_CONNECT_PORT", "9"))
SCRATCH = os.environ.get("PANQUEUE_BENCH_DIR", tempfile.gettempdir())
ENV = ["PATH", "PANQUEUE_BENCH_CONNECT_PORT", "PANQUEUE_BENCH_DIR"]
GRANTS = {
    "files": Permissions(read=[SCRATCH], write=[SCRATCH], env=ENV),
    "net": Permissions(read=[SCRATCH], write=[SCRATCH], net=[f"127.0.0.1:{PORT}"], env=ENV),
}

queues = Registry()


def noop(job: Job) -> None:
    return None


def cpu(job: Job) -> None:
    burn_cpu()


def connects(job: Job) -> float:
    """Mean µs per connect + close to the listener."""
    n = job.data["n"]
    started = time.perf_counter()
    for _ in range(n):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.connect(("127.0.0.1", PORT))
    return (time.perf_counter() - started) / n * 1e6


# One module-level function per queue: the child imports its handler by module:qualname.


@queues.handler("bench-p-noop-plain", executor="subprocess", env=ENV)
def noop_plain(job: Job) -> None:
    return noop(job)


@queues.handler("bench-p-noop-files", executor="subprocess", permissions=GRANTS["files"])
def noop_files(job: Job) -> None:
    return noop(job)


@queues.handler("bench-p-noop-net", executor="subprocess", permissions=GRANTS["net"])
def noop_net(job: Job) -> None:
    return noop(job)


@queues.handler("bench-p-cpu-plain", executor="subprocess", env=ENV)
def cpu_plain(job: Job) -> None:
    return cpu(job)


@queues.handler("bench-p-cpu-files", executor="subprocess", permissions=GRANTS["files"])
def cpu_files(job: Job) -> None:
    return cpu(job)


@queues.handler("bench-p-cpu-net", executor="subprocess", permissions=GRANTS["net"])
def cpu_net(job: Job) -> None:
    return cpu(job)


@queues.handler("bench-p-start-plain", executor="subprocess", env=ENV, max_jobs_per_child=1)
def start_plain(job: Job) -> None:
    return noop(job)


@queues.handler("bench-p-start-files", executor="subprocess", permissions=GRANTS["files"],
                max_jobs_per_child=1)
def start_files(job: Job) -> None:
    return noop(job)


@queues.handler("bench-p-start-net", executor="subprocess", permissions=GRANTS["net"],
                max_jobs_per_child=1)
def start_net(job: Job) -> None:
    return noop(job)


@queues.handler("bench-p-connect-plain", executor="subprocess", env=ENV)
def connect_plain(job: Job) -> float:
    return connects(job)


@queues.handler("bench-p-connect-net", executor="subprocess", permissions=GRANTS["net"])
def connect_net(job: Job) -> float:
    return connects(job)
