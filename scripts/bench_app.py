"""Handlers for scripts/bench.py (loaded by the worker process as ``bench_app:queues``,
``bench_app:executors`` and ``bench_app:keyed``).

``queues`` (the baseline figures):

* ``bench-noop``: an async no-op, concurrency 50: the process-rate figure.
* ``bench-noop-p4``: the same no-op on a queue of 4 partitions (``--partitions``).
* ``bench-noop-quiet``: the same no-op on a queue that keeps no events
  (``Retention(events=0)``: only the ends of jobs; ``scripts/redis_cost.py --no-events``).
* ``bench-latency``: an async handler, concurrency 1, that returns the wall-clock time (ns) at
  which it started, so the benchmark can measure pickup latency with sub-millisecond resolution
  in addition to the millisecond timestamps Redis records.

``executors`` (the executor comparison; concurrency comes from the worker's ``--concurrency``):

* ``bench-x-noop-{inline,thread,subprocess}``: a no-op on each executor.
* ``bench-x-cpu-{inline,thread,subprocess}``: 10 ms of pure-Python CPU work on each executor.

``keyed`` (``--keyed``: claim cost against the number of distinct concurrency keys):

* ``bench-keyed``: an async no-op on a keyed queue, ``key_concurrency=1``.
* ``bench-keyed-global``: the same no-op on a global queue, the baseline.

All keep the default retention (1000 completed jobs), as a real deployment would.
Subprocess handlers are module-level functions: the child imports them by name.
"""

from __future__ import annotations

import time

from panqueue import Job, Registry, Retention

#: CPU time one CPU-bound job burns, in seconds.
CPU_JOB_SECONDS = 0.010

queues = Registry()
executors = Registry()
keyed = Registry()


@queues.handler("bench-noop", concurrency=50)
async def noop(job: Job) -> None:
    return None


@queues.handler("bench-latency", concurrency=1)
async def stamp(job: Job) -> int:
    return time.time_ns()


def burn_cpu(seconds: float = CPU_JOB_SECONDS) -> int:
    """Pure-Python arithmetic until this thread has used ``seconds`` of CPU time.

    ``time.thread_time`` (the calling thread's CPU time), not ``time.process_time``: the latter
    counts every thread of the process, so two handler threads (or a handler thread and the
    worker's event loop) would each stop early on the other's CPU time. In a single-threaded
    process the two are the same.
    """
    end = time.thread_time() + seconds
    total = 0
    while time.thread_time() < end:
        for i in range(200):  # about 5 µs of bytecode between clock reads
            total += i * i
    return total


@executors.handler("bench-x-noop-inline", executor="inline")
async def noop_inline(job: Job) -> None:
    return None


@executors.handler("bench-x-noop-thread", executor="thread")
def noop_thread(job: Job) -> None:
    return None


@executors.handler("bench-x-noop-subprocess", executor="subprocess")
def noop_subprocess(job: Job) -> None:
    return None


@executors.handler("bench-x-cpu-inline", executor="inline")
async def cpu_inline(job: Job) -> None:
    burn_cpu()  # blocks the event loop for 10 ms: that is what is being measured


@executors.handler("bench-x-cpu-thread", executor="thread")
def cpu_thread(job: Job) -> None:
    burn_cpu()


@executors.handler("bench-x-cpu-subprocess", executor="subprocess")
def cpu_subprocess(job: Job) -> None:
    burn_cpu()


@keyed.handler("bench-keyed", mode="keyed", key_concurrency=1)
async def noop_keyed(job: Job) -> None:
    return None


@keyed.handler("bench-keyed-global")
async def noop_keyed_baseline(job: Job) -> None:
    return None


@queues.handler("bench-noop-p4", concurrency=50, partitions=4)
async def noop_partitioned(job: Job) -> None:
    return None


@queues.handler("bench-noop-quiet", concurrency=50, retention=Retention(events=0))
async def noop_quiet(job: Job) -> None:
    return None
