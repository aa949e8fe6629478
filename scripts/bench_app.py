"""Handlers for scripts/bench.py (loaded by the worker process as ``bench_app:queues``).

* ``bench-noop``: an async no-op, concurrency 50: the process-rate figure.
* ``bench-latency``: an async handler, concurrency 1, that returns the wall-clock time (ns) at
  which it started, so the benchmark can measure pickup latency with sub-millisecond resolution
  in addition to the millisecond timestamps Redis records.

Both keep the default retention (1000 completed jobs), as a real deployment would.
"""

from __future__ import annotations

import time

from panqueue import Job, Registry

queues = Registry()


@queues.handler("bench-noop", concurrency=50)
async def noop(job: Job) -> None:
    return None


@queues.handler("bench-latency", concurrency=1)
async def stamp(job: Job) -> int:
    return time.time_ns()
