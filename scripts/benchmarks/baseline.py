"""The baseline figures (the default run): enqueue rate, process rate and pickup latency, and
their table. Each measurement is described in its own module (enqueue, process, latency)."""

from __future__ import annotations

from typing import Any

import anyio

from benchmarks.common import BATCH, Bench, log
from benchmarks.enqueue import enqueue_async, enqueue_bulk, enqueue_sync
from benchmarks.latency import pickup_latency
from benchmarks.process import process_rate


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    """The three measurements, one after the other on an emptied server; the result is the
    JSON output's ``enqueue``, ``process`` and ``latency``."""
    n_single = 3_000 if quick else 10_000
    n_bulk = 20_000 if quick else 100_000
    n_process = 10_000 if quick else 20_000
    n_latency = 100 if quick else 200
    backend = bench.backend
    log(f"enqueue: {n_single} single adds (async client on {backend})")
    single_async = anyio.run(enqueue_async, bench.url, n_single, backend=backend)
    log(f"enqueue: {n_single} single adds (sync client)")
    single_sync = enqueue_sync(bench.url, n_single)
    log(f"enqueue: {n_bulk} jobs with add_bulk, {BATCH} per batch")
    bulk = anyio.run(enqueue_bulk, bench.url, n_bulk, backend=backend)
    bench.redis.flushdb()
    log(f"process: {n_process} no-op jobs, one worker process, concurrency 50")
    process = process_rate(bench, n_process)
    bench.redis.flushdb()
    log(f"latency: {n_latency} jobs, one at a time, idle worker (concurrency 1)")
    latency = pickup_latency(bench, n_latency)
    return {
        "enqueue": {"single_async_jobs_per_s": single_async,
                    "single_sync_jobs_per_s": single_sync,
                    "bulk_jobs_per_s": bulk, "n_single": n_single, "n_bulk": n_bulk,
                    "bulk_batch": BATCH},
        "process": process,
        "latency": latency,
    }


def report(results: dict[str, Any], backend: str) -> None:
    enqueue, proc, lat = results["enqueue"], results["process"], results["latency"]
    n_single, n_bulk = enqueue["n_single"], enqueue["n_bulk"]
    rows = [
        ("enqueue, single, QueueClient", f"{enqueue['single_async_jobs_per_s']:,.0f}", "jobs/s",
         f"{n_single:,} sequential await add() ({backend})"),
        ("enqueue, single, SyncQueueClient", f"{enqueue['single_sync_jobs_per_s']:,.0f}",
         "jobs/s", f"{n_single:,} sequential add()"),
        ("enqueue, bulk", f"{enqueue['bulk_jobs_per_s']:,.0f}", "jobs/s",
         f"{n_bulk:,} jobs, add_bulk x {BATCH}"),
        ("process rate, 1 worker process", f"{proc['jobs_per_s']:,.0f}", "jobs/s",
         f"{proc['jobs']:,} no-op jobs, concurrency 50, {proc['span_s']:.2f} s "
         f"(polled: {proc['jobs_per_s_polled']:,.0f}/s)"),
        ("worker CPU per job", f"{proc['worker_cpu_us_per_job']:,.0f}", "µs/job",
         f"worker process at {proc['worker_cpu_utilisation']:.0%} of one core"),
        ("redis-server CPU per job", f"{proc['redis_cpu_us_per_job']:,.0f}", "µs/job",
         "same window (add excluded)"),
        ("pickup latency p50 / p95 / p99",
         "{p50:.0f} / {p95:.0f} / {p99:.0f}".format(**lat["server_ms"]), "ms",
         f"started_at - enqueued_at in Redis (1 ms resolution), n={lat['jobs']}"),
        ("pickup, add() call -> handler start",
         "{p50:.2f} / {p95:.2f} / {p99:.2f}".format(**lat["handler_ms"]), "ms",
         "p50 / p95 / p99, wall clock, includes the add round trip"),
        ("round trip add -> result() p50",
         "{p50:.2f}".format(**lat["roundtrip_ms"]), "ms",
         "p95 {p95:.2f}, p99 {p99:.2f}".format(**lat["roundtrip_ms"])),
    ]
    # Not print_table: the notes column is left unpadded and the rule spans the longest note.
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    header = ("figure", "value", "unit", "notes")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=False)]
    line = f"{header[0]:<{widths[0]}}  {header[1]:>{widths[1]}}  " \
           f"{header[2]:<{widths[2]}}  {header[3]}"
    print(line)
    print("-" * (len(line) + max(len(row[3]) for row in rows) - len(header[3])))
    for name, value, unit, note in rows:
        print(f"{name:<{widths[0]}}  {value:>{widths[1]}}  {unit:<{widths[2]}}  {note}")
