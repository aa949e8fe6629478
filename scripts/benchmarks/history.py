"""Job history (``--history`` only; not part of the full run; the export needs the ``spark``
extra and Java 17).

(a) What the history record costs a finished job: N jobs completed through the complete script
    (``transitions.complete_batch``, claimed beforehand with ``transitions.claim``), once on a
    queue whose ``Retention(history=0)`` turns the stream off and once with the default
    (100,000). Completion batches of 1 and of 50 jobs; the time of the complete calls only
    (wall clock at the client, one call at a time, so a round trip each) and the Redis CPU they
    used, per job.
(b) Memory per record: ``MEMORY USAGE`` of the stream (``SAMPLES 0``: every node) over its
    length, for the real records (a) wrote, and for the 1,000,000 of (c).
(c) ``panqueue.spark.export_history`` of 1,000,000 records on a ``local[2]`` SparkSession, to a
    Parquet dataset in a temporary directory, default ``batch_size`` (100,000). The records are
    filled in with pipelined XADDs of the fields the script writes (ops.HISTORY_FIELDS; 10,000
    per round trip; a realistic mix: 90 % completed, 8 % failed with an error, 2 % cancelled).
    The session start and a 10,000-record warm-up export are excluded.

N for (a) is 20,000 per run (``--quick``: 5,000), three runs of each row alternated and the best
kept; (c) is 1,000,000 (``--quick``: 100,000).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import BATCH, Bench, log, print_table, proc_cpu_seconds
from panqueue._codec import encode
from panqueue._keys import QueueKeys
from panqueue._store import ops, transitions
from panqueue._store.ops import NewJob
from panqueue._store.transport import Batch, Command

HISTORY_QUEUE = "bench-history"
FILL_BATCH = 10_000
ROUNDS = 3


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    bench.redis.flushdb()
    n = 5_000 if quick else 20_000
    result: dict[str, Any] = {"complete": [], "n_complete": n}
    for per_call in (1, 50):
        runs: dict[int, list[dict[str, Any]]] = {0: [], 100_000: []}
        for rep in range(ROUNDS):  # alternated, the best of each kept: a busy machine's noise
            for history in runs:
                runs[history].append(complete_cost(bench, n, per_call, history, rep))
        for measured in runs.values():
            best = min(measured, key=lambda r: r["redis_us_per_job"])
            best["us_per_job"] = min(r["us_per_job"] for r in measured)
            result["complete"].append(best)
    real = QueueKeys(f"{HISTORY_QUEUE}-b50-h100000-0")
    result["memory_real"] = stream_memory(bench, real)
    bench.redis.flushdb()
    result["export"] = export_bench(bench, 100_000 if quick else 1_000_000)
    bench.redis.flushdb()
    return result


def complete_cost(bench: Bench, n: int, per_call: int, history: int, rep: int
                  ) -> dict[str, Any]:
    """Complete ``n`` claimed jobs, ``per_call`` a call, on a queue keeping ``history``."""
    keys = QueueKeys(f"{HISTORY_QUEUE}-b{per_call}-h{history}-{rep}")
    store = bench.store
    store.run(ops.setup_queue(keys, "global", 1, 0, 0, False, keep_history=history))
    for start in range(0, n, BATCH):
        store.run(ops.add_jobs(keys, [NewJob(None, encode({"n": i}))
                                      for i in range(start, min(start + BATCH, n))]))
    log(f"history: completing {n:,} jobs, {per_call} per call, history={history:,}")
    result = encode("ok")
    claimed = []  # every job claimed first, so that the server's figures below are completes
    for call in range(n // per_call):
        token = f"bench:{per_call}-{history}:{call}"
        jobs = store.run(transitions.claim(keys, token, 600_000, per_call)).jobs
        claimed.append([transitions.Completion(job.id, token, result) for job in jobs])
    bench.redis.config_resetstat()
    elapsed = 0.0
    for batch in claimed:
        start = time.perf_counter()
        store.run(transitions.complete_batch(keys, batch, claim_next=False, keep=1000,
                                             token=batch[0].token + ":c", ttl_ms=60_000))
        elapsed += time.perf_counter() - start
    stats = bench.redis.info("commandstats")
    server_us = sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ("evalsha", "eval"))
    xadd = stats.get("cmdstat_xadd", {})  # the history record (the events stream's, too)
    return {"per_call": per_call, "history": history, "jobs": n,
            "us_per_job": elapsed / n * 1e6, "redis_us_per_job": server_us / n,
            "xadd_calls_per_job": xadd.get("calls", 0) / n,
            "xadd_us_per_call": xadd.get("usec", 0) / max(1, xadd.get("calls", 0)),
            "stream_length": int(store.execute(Command(("XLEN", keys.history))))}


def stream_memory(bench: Bench, keys: QueueKeys) -> dict[str, Any]:
    length = int(bench.store.execute(Command(("XLEN", keys.history))))
    used = int(bench.store.execute(Command(("MEMORY", "USAGE", keys.history, "SAMPLES", "0"))))
    return {"records": length, "bytes": used, "bytes_per_record": used / max(1, length)}


def fill(bench: Bench, keys: QueueKeys, n: int, now_ms: int) -> None:
    """``n`` history records, as record_history writes them, in pipelined XADDs."""
    fields = ops.HISTORY_FIELDS
    for start in range(0, n, FILL_BATCH):
        commands = []
        for i in range(start, min(start + FILL_BATCH, n)):
            finished = now_ms - (n - i) * 50  # one record every 50 ms: about 14 h of traffic
            kind = i % 50
            state, reason, error_type, message = (
                ("failed", "max_attempts_exceeded", "ConnectionError",
                 f"mail server refused job {i}") if kind < 4 else
                ("cancelled", "cancelled", "", "") if kind == 4 else ("completed", "", "", ""))
            values = (str(i + 1), state, 1 + (kind < 4), finished - 180, finished - 40, finished,
                      reason, error_type, message, "worker-7:host-3.internal:4242")
            pairs = [x for field, value in zip(fields, values, strict=True) for x in (field, value)]
            commands.append(Command(("XADD", keys.history, "*", *pairs)))
        bench.store.execute(Batch(tuple(commands), route=keys.history))


def export_bench(bench: Bench, n: int) -> dict[str, Any]:
    """export_history of ``n`` records on local[2], after a warm-up export."""
    from pyspark.sql import SparkSession

    from panqueue.spark import export_history

    now_ms = int(bench.store.run(ops.server_time_ms()))
    warm, keys = QueueKeys(HISTORY_QUEUE + "-warm-up"), QueueKeys(HISTORY_QUEUE)
    log(f"history: filling {n:,} records with pipelined XADDs")
    start = time.perf_counter()
    fill(bench, keys, n, now_ms)
    fill(bench, warm, 10_000, now_ms)
    filled = time.perf_counter() - start
    memory = stream_memory(bench, keys)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("panqueue-bench-history")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    out = tempfile.mkdtemp(prefix="panqueue-bench-history-")
    try:
        export_history(spark, warm.name, url=bench.url, path=os.path.join(out, "warm-up"))
        log(f"history: export_history of {n:,} records on local[2]")
        redis_cpu, start = proc_cpu_seconds(bench.server_pid), time.perf_counter()
        stats = export_history(spark, keys.name, url=bench.url, path=os.path.join(out, "h"))
        elapsed = time.perf_counter() - start
        redis_cpu = proc_cpu_seconds(bench.server_pid) - redis_cpu
        written = spark.read.parquet(os.path.join(out, "h")).count()
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(out + "/h")
                   for f in files if f.endswith(".parquet"))
    finally:
        spark.stop()
        shutil.rmtree(out, ignore_errors=True)
    assert stats.exported == written == n, (stats, written)
    return {"records": n, "fill_s": filled, "seconds": elapsed, "rows_per_s": n / elapsed,
            "batches": stats.batches, "redis_cpu_s": redis_cpu, "parquet_bytes": size,
            "memory": memory}


def report(figures: dict[str, Any]) -> None:
    print("What the history record costs a completion (complete script, claimed beforehand):")
    print_table(["jobs/call", "history", "jobs", "us/job", "Redis us/job", "XADDs/job",
                 "us/XADD", "stream length"],
                [[str(r["per_call"]), f"{r['history']:,}", f"{r['jobs']:,}",
                  f"{r['us_per_job']:.1f}", f"{r['redis_us_per_job']:.1f}",
                  f"{r['xadd_calls_per_job']:.0f}", f"{r['xadd_us_per_call']:.2f}",
                  f"{r['stream_length']:,}"] for r in figures["complete"]],
                [True] * 8)
    print(f"(best of {ROUNDS} alternated runs each; us/job at the client, one call at a time; "
          "Redis us/job from INFO commandstats; XADDs include the events stream's)")
    print()
    real, export = figures["memory_real"], figures["export"]
    print(f"History stream memory: {real['bytes_per_record']:.0f} bytes/record "
          f"({real['records']:,} records written by the complete script, "
          f"{real['bytes'] / 2**20:.1f} MiB); {export['memory']['bytes_per_record']:.0f} "
          f"bytes/record for the {export['records']:,} filled-in records "
          f"(with failures, {export['memory']['bytes'] / 2**20:.1f} MiB)")
    print(f"export_history on local[2]: {export['records']:,} records in "
          f"{export['seconds']:.1f} s = {export['rows_per_s']:,.0f} rows/s "
          f"({export['batches']} batches; Redis CPU {export['redis_cpu_s']:.1f} s; "
          f"Parquet {export['parquet_bytes'] / 2**20:.1f} MiB)")
