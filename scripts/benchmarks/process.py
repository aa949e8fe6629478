"""Process rate: how fast ONE worker process drains a queue of no-op jobs.

The queue is pre-filled with N no-op jobs, then one worker process (``python -m panqueue worker
bench_app:queues --concurrency 50``) is started. The rate is jobs / (last finished_at - first
started_at), both from the server clock, so worker start-up is excluded. The worker's CPU time
(utime + stime from /proc/<pid>/stat, all threads) over the window the benchmark polls gives
µs/job, and redis-server's the same way.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import (
    BATCH,
    Bench,
    counts,
    last_finished_ms,
    proc_cpu_seconds,
    start_worker,
    started_ms,
    stop_worker,
    wait_for,
)
from panqueue import JobState, SyncQueueClient

NOOP_QUEUE = "bench-noop"


def process_rate(bench: Bench, n: int, queue_name: str = NOOP_QUEUE, concurrency: int = 50,
                 app: str = "bench_app:queues") -> dict[str, Any]:
    """The process rate of ``queue_name`` (``app``'s handler, run at ``concurrency``)."""
    with SyncQueueClient(bench.url) as client:
        queue = client.queue(queue_name)
        first_id: str | None = None
        for b in range(0, n, BATCH):
            handles = queue.add_bulk([{"i": i} for i in range(b, min(b + BATCH, n))])
            first_id = first_id or handles[0].id
    assert counts(bench, queue_name)[JobState.WAITING] == n
    assert first_id is not None

    def waiting() -> int:
        return counts(bench, queue_name)[JobState.WAITING]

    def drained() -> bool:
        now = counts(bench, queue_name)
        return now[JobState.WAITING] + now[JobState.ACTIVE] == 0

    proc = start_worker(bench, queue_name, concurrency, app)
    try:
        # The window opens at the first claim: poll the waiting count tightly until it shrinks.
        wait_for(lambda: waiting() < n, 60, 0.0005, "the first claim", proc)
        cpu0, redis_cpu0, t0 = (proc_cpu_seconds(proc.pid), proc_cpu_seconds(bench.server_pid),
                                time.monotonic())
        first_started = started_ms(bench, queue_name, first_id)
        wait_for(drained, 600, 0.005, "the queue to drain", proc)
        cpu1, redis_cpu1, t1 = (proc_cpu_seconds(proc.pid), proc_cpu_seconds(bench.server_pid),
                                time.monotonic())
        last_finished = last_finished_ms(bench, queue_name)
        failed = counts(bench, queue_name)[JobState.FAILED]
    finally:
        code = stop_worker(proc)
    span_ms = last_finished - first_started
    if failed:
        raise RuntimeError(f"{failed} no-op jobs failed")
    return {
        "jobs": n,
        "jobs_per_s": n / (span_ms / 1000),
        "span_s": span_ms / 1000,
        "jobs_per_s_polled": n / (t1 - t0),
        "worker_cpu_us_per_job": (cpu1 - cpu0) / n * 1e6,
        "worker_cpu_utilisation": (cpu1 - cpu0) / (t1 - t0),
        "redis_cpu_us_per_job": (redis_cpu1 - redis_cpu0) / n * 1e6,
        "worker_exit_code": code,
    }
