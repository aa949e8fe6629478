"""Scale-out: 1, 2 and 4 worker processes draining one queue (``--scale`` only; not part of
the full run).

The process-rate measurement (``process``) with k worker processes instead of one: the same
``bench_app:queues`` no-op handler on ``bench-noop``, concurrency 50 each. The queue is paused,
filled with N no-op jobs (``add_bulk``, 1000 per call), the k workers are started together,
and once each has registered in the worker registry and subscribed to the queue's wake-ups
(``CLIENT LIST``), the queue is resumed: no worker's start-up falls inside the window, which
opens at the first claim and closes when the queue is empty. jobs/s = N / (last finished_at -
first started_at), server clock (and "polled", the benchmark's own clock over the window, as a
cross-check).

CPU over the window, from /proc (utime + stime): redis-server's as a share of one core (the
ceiling: Redis runs its commands on one thread), the k workers' together (100 % = one core;
each worker's share is in the JSON output, to show the work was spread), and the machine's
idle share (``/proc/stat``, all CPUs: idle + iowait over all jiffies). Per job, Redis µs/job
gives the rate at which its core would be full: 1 / (µs/job).

Each count runs on an emptied server after an unmeasured warm-up drain (a fresh redis-server
is slower on its first script calls). N is 100,000 (``--quick``: 20,000).
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from benchmarks.common import (
    BATCH,
    Bench,
    counts,
    last_finished_ms,
    log,
    print_table,
    proc_cpu_seconds,
    start_worker,
    started_ms,
    stop_worker,
    wait_for,
)
from benchmarks.process import NOOP_QUEUE
from panqueue import JobState, SyncQueueClient

PROCESSES = (1, 2, 4)
CONCURRENCY = 50
WARMUP_JOBS = 5_000


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    n = 20_000 if quick else 100_000
    log(f"scale: warm-up, {WARMUP_JOBS:,} jobs, 1 worker process")
    bench.redis.flushdb()
    drain(bench, 1, WARMUP_JOBS)
    rows = []
    for k in PROCESSES:
        bench.redis.flushdb()
        log(f"scale: {n:,} no-op jobs, {k} worker process{'es' if k > 1 else ''}, "
            f"concurrency {CONCURRENCY} each")
        rows.append(drain(bench, k, n))
    bench.redis.flushdb()
    return {"jobs": n, "concurrency": CONCURRENCY, "runs": rows}


def machine_jiffies() -> tuple[int, int]:
    """(idle + iowait, all) jiffies of all CPUs since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:9]]  # user .. steal; guests are in user
    return fields[3] + fields[4], sum(fields)


def subscribed_connections(bench: Bench) -> int:
    """Connections to the server subscribed to a channel (SUBSCRIBE or SSUBSCRIBE)."""
    return sum(1 for c in bench.redis.client_list()
               if int(c.get("sub", 0)) + int(c.get("ssub", 0)) > 0)


def drain(bench: Bench, k: int, n: int, queue_name: str = NOOP_QUEUE, partitions: int = 1
          ) -> dict[str, Any]:
    """Fill a paused queue with ``n`` no-op jobs, start ``k`` workers, resume, time the drain."""
    with SyncQueueClient(bench.url) as client:
        client.pause(queue_name)
        queue = client.queue(queue_name)
        first_ids: list[str] = []  # the first job of each partition (the adds turn through them)
        for b in range(0, n, BATCH):
            handles = queue.add_bulk([{"i": i} for i in range(b, min(b + BATCH, n))])
            first_ids = first_ids or [h.id for h in handles[:partitions]]
        assert first_ids and counts(bench, queue_name)[JobState.WAITING] == n

        procs = [start_worker(bench, queue_name, CONCURRENCY) for _ in range(k)]
        try:
            def all_ready() -> bool:
                exited = [p.returncode for p in procs if p.poll() is not None]
                if exited:
                    raise RuntimeError(f"a worker exited with code {exited[0]} before the run")
                # Registered, and subscribed to the wake-ups (the benchmark's own connections
                # subscribe to nothing): the resume's wake-up reaches every worker.
                return (len(client.workers(queue_name)) == k
                        and subscribed_connections(bench) >= k)

            wait_for(all_ready, 120, 0.01, f"{k} workers to be ready")
            client.resume(queue_name)
            figures = measure_window(bench, procs, n, first_ids, queue_name)
        finally:
            codes = [stop_worker(p) for p in procs]
    return {**figures, "worker_exit_codes": codes}


def measure_window(bench: Bench, procs: list[subprocess.Popen[bytes]], n: int,
                   first_ids: list[str], queue_name: str = NOOP_QUEUE) -> dict[str, Any]:
    def waiting() -> int:
        return counts(bench, queue_name)[JobState.WAITING]

    def drained() -> bool:
        exited = [p.returncode for p in procs if p.poll() is not None]
        if exited:
            raise RuntimeError(f"a worker exited with code {exited[0]} during the run")
        now = counts(bench, queue_name)
        return now[JobState.WAITING] + now[JobState.ACTIVE] == 0

    def cpu() -> tuple[list[float], float, tuple[int, int], float]:
        return ([proc_cpu_seconds(p.pid) for p in procs], proc_cpu_seconds(bench.server_pid),
                machine_jiffies(), time.monotonic())

    # The window opens at the first claim: poll the waiting count tightly until it shrinks.
    wait_for(lambda: waiting() < n, 60, 0.0005, "the first claim")
    # Read now: retention deletes the first jobs long before the queue is empty. A partitioned
    # queue's window opens when the first partition's head started (the claims turn through
    # the partitions: each head starts within the first turn).
    starts: dict[str, int] = {}

    def heads_started() -> bool:
        for job_id in first_ids:
            if job_id not in starts and (started := started_ms(bench, queue_name, job_id)):
                starts[job_id] = started
        return len(starts) == len(first_ids)

    wait_for(heads_started, 10, 0.0005, "the first job of each partition to start")
    first_started = min(starts.values())
    workers0, redis0, (idle0, all0), t0 = cpu()
    wait_for(drained, 900, 0.005, "the queue to drain")
    workers1, redis1, (idle1, all1), t1 = cpu()
    span_ms = last_finished_ms(bench, queue_name) - first_started
    failed = counts(bench, queue_name)[JobState.FAILED]
    if failed:
        raise RuntimeError(f"{failed} no-op jobs failed")
    wall = t1 - t0
    each = [c1 - c0 for c0, c1 in zip(workers0, workers1, strict=True)]
    return {
        "processes": len(procs),
        "jobs_per_s": n / (span_ms / 1000),
        "span_s": span_ms / 1000,
        "jobs_per_s_polled": n / wall,
        "redis_cpu_utilisation": (redis1 - redis0) / wall,
        "redis_cpu_us_per_job": (redis1 - redis0) / n * 1e6,
        "workers_cpu_utilisation": sum(each) / wall,
        "workers_cpu_us_per_job": sum(each) / n * 1e6,
        "each_worker_cpu_utilisation": [c / wall for c in each],
        "machine_idle": (idle1 - idle0) / (all1 - all0) if all1 > all0 else 0.0,
    }


def report(figures: dict[str, Any]) -> None:
    print()
    print(f"scale-out: {figures['jobs']:,} no-op jobs on one queue, k worker processes, "
          f"concurrency {figures['concurrency']} each (CPU: % of one core over the window)")
    print_table(
        ["k", "jobs/s", "polled", "Redis CPU %", "Redis µs/job", "workers CPU %",
         "workers µs/job", "machine idle %", "rate at 100 % Redis"],
        [[str(row["processes"]), f"{row['jobs_per_s']:,.0f}", f"{row['jobs_per_s_polled']:,.0f}",
          f"{row['redis_cpu_utilisation']:.0%}", f"{row['redis_cpu_us_per_job']:.1f}",
          f"{row['workers_cpu_utilisation']:.0%}", f"{row['workers_cpu_us_per_job']:.1f}",
          f"{row['machine_idle']:.0%}",
          f"{1e6 / row['redis_cpu_us_per_job']:,.0f}/s" if row["redis_cpu_us_per_job"] else "-"]
         for row in figures["runs"]],
        [True] * 9)
