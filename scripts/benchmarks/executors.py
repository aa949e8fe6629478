"""The executor comparison (``--executors``, and part of the full run; not of ``--quick``
alone): the process-rate measurement for the inline, thread and subprocess executors.

ONE worker process (``bench_app:executors``) per case: a no-op handler at concurrency 50
(inline, thread) and 2 and 8 (subprocess), and a handler burning 10 ms of CPU at concurrency 2.
Warm-up jobs run first (they start the subprocess children), then the window opens. CPU per job
counts the worker process and its children (live ones from /proc/<pid>/stat, reaped ones from
cutime/cstime). ``--quick --executors`` uses smaller N.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import (
    BATCH,
    Bench,
    counts,
    last_finished_ms,
    log,
    print_table,
    start_worker,
    started_ms,
    stop_worker,
    thread_count,
    tree_cpu_seconds,
    wait_for,
)
from panqueue import JobState, SyncQueueClient

APP = "bench_app:executors"

# (handler, executor, concurrency) in the order measured and printed.
CASES = [
    ("noop", "inline", 50),
    ("noop", "thread", 50),
    ("noop", "subprocess", 2),
    ("noop", "subprocess", 8),
    ("cpu", "inline", 2),
    ("cpu", "thread", 2),
    ("cpu", "subprocess", 2),
]


def run(bench: Bench, quick: bool) -> list[dict[str, Any]]:
    """Every case of CASES, in order, each on an emptied server."""
    sizes = {  # (measured jobs, warm-up jobs) by handler
        "noop": (1_000, 200) if quick else (20_000, 2_000),
        "cpu": (200, 20) if quick else (1_000, 20),
    }
    results = []
    for kind, executor, concurrency in CASES:
        n, warmup = sizes[kind]
        bench.redis.flushdb()
        log(f"executors: {n} {kind} jobs (+{warmup} warm-up), {executor}, "
            f"concurrency {concurrency}")
        results.append(executor_rate(bench, kind, executor, concurrency, n, warmup))
    return results


def executor_rate(bench: Bench, kind: str, executor: str, concurrency: int, n: int,
                  warmup: int) -> dict[str, Any]:
    """ONE worker process drains ``warmup`` + ``n`` pre-filled jobs of a ``bench-x-*`` queue.

    The window opens once the warm-up jobs are claimed (the first measured job has started; the
    subprocess children exist by then) and closes when the queue is empty. Jobs in the window =
    waiting + active when it opens (all of them complete inside it).
    """
    name = f"bench-x-{kind}-{executor}"
    total = warmup + n
    with SyncQueueClient(bench.url) as client:
        queue = client.queue(name)
        ids: list[str] = []
        for b in range(0, total, BATCH):
            ids += [h.id for h in queue.add_bulk([{"i": i}
                                                   for i in range(b, min(b + BATCH, total))])]
    assert counts(bench, name)[JobState.WAITING] == total
    first_id = ids[warmup]

    def waiting_active() -> tuple[int, int]:
        now = counts(bench, name)
        return now[JobState.WAITING], now[JobState.ACTIVE]

    proc = start_worker(bench, name, concurrency, app=APP)
    try:
        wait_for(lambda: waiting_active()[0] < n, 120, 0.0005, "the warm-up jobs", proc)
        (own0, kids0, _), t0 = tree_cpu_seconds(proc.pid), time.monotonic()
        waiting0, active0 = waiting_active()
        first_started = started_ms(bench, name, first_id)
        wait_for(lambda: sum(waiting_active()) == 0, 600, 0.005, "the queue to drain", proc)
        (own1, kids1, children), t1 = tree_cpu_seconds(proc.pid), time.monotonic()
        threads = thread_count(proc.pid)
        last_finished = last_finished_ms(bench, name)
        failed = counts(bench, name)[JobState.FAILED]
    finally:
        code = stop_worker(proc)
    if failed:
        raise RuntimeError(f"{failed} jobs of {name} failed")
    if not first_started:
        raise RuntimeError(f"{name}: the first measured job's start time was already trimmed")
    jobs = waiting0 + active0
    span_s = (last_finished - first_started) / 1000
    return {
        "executor": executor,
        "handler": kind,
        "concurrency": concurrency,
        "jobs": n,
        "warmup_jobs": warmup,
        "jobs_per_s": n / span_s,
        "span_s": span_s,
        "jobs_in_cpu_window": jobs,
        "jobs_per_s_polled": jobs / (t1 - t0),
        "worker_cpu_us_per_job": (own1 - own0) / jobs * 1e6,
        "children_cpu_us_per_job": (kids1 - kids0) / jobs * 1e6,
        "total_cpu_us_per_job": (own1 - own0 + kids1 - kids0) / jobs * 1e6,
        "worker_cores": (own1 - own0) / (t1 - t0),
        "children_cores": (kids1 - kids0) / (t1 - t0),
        "children": children,
        "worker_threads": threads,
        "worker_exit_code": code,
    }


def report(results: list[dict[str, Any]]) -> None:
    print("executors: ONE worker process (bench_app:executors); CPU in µs per job, "
          "cores = CPU s per wall s")
    rows = []
    for res in results:
        handler = "no-op" if res["handler"] == "noop" else "10 ms CPU"
        children = f"{res['children_cpu_us_per_job']:,.0f}" if res["children"] else "-"
        rows.append((
            handler, res["executor"], str(res["concurrency"]), f"{res['jobs']:,}",
            f"{res['jobs_per_s']:,.0f}", f"{res['worker_cpu_us_per_job']:,.0f}", children,
            f"{res['total_cpu_us_per_job']:,.0f}",
            f"{res['worker_cores']:.2f} + {res['children_cores']:.2f}",
            str(res["worker_threads"]),
        ))
    print_table(
        ("handler", "executor", "conc.", "jobs", "jobs/s", "worker µs", "children µs",
         "total µs", "cores (worker + children)", "threads"),
        rows,
        (False, False, True, True, True, True, True, True, True, True))
