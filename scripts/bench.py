"""panqueue baseline benchmark: enqueue rate, process rate, pickup latency.

    .venv/bin/python scripts/bench.py [--quick] [--executors | --keyed] [--backend asyncio|trio]
                                      [--json FILE]

Starts a private redis-server on a free loopback port (append-only persistence OFF, RDB
snapshots off), runs every measurement against it, and stops it. The Redis on 6379 is never
touched. What each figure means is written up in docs/performance.md.

* enqueue, single: N sequential ``await queue.add(...)`` (QueueClient), and the same with
  ``SyncQueueClient``.
* enqueue, bulk: ``add_bulk`` in batches of 1000.
* process rate: the queue is pre-filled with no-op jobs, then ONE worker process
  (``python -m panqueue worker bench_app:queues --concurrency 50``) is started; the rate is
  jobs / (last finished_at - first started_at), both from the server clock. The worker's CPU
  time (utime + stime from /proc/<pid>/stat, all threads) over the same window gives µs/job.
* pickup latency: an idle worker (concurrency 1); one job at a time, each awaited with
  ``handle.result()`` and followed by a short idle gap; latency = started_at - enqueued_at as
  Redis recorded them (millisecond resolution), plus the handler's own start time (ns) against
  the moment ``add`` was called, and the add -> result round trip.

* executors (``--executors`` alone, and part of the full run; not of ``--quick`` alone): the
  same process-rate measurement (``bench_app:executors``, ONE worker process) for the inline,
  thread and subprocess executors: a no-op handler at concurrency 50 (inline, thread) and 2 and
  8 (subprocess), and a handler burning 10 ms of CPU at concurrency 2. Warm-up jobs run first
  (they start the subprocess children), then the window opens. CPU per job counts the worker
  process and its children (live ones from /proc/<pid>/stat, reaped ones from cutime/cstime).
  ``--quick --executors`` uses smaller N.

* keyed mode (``--keyed`` only; not part of the full run): for a global queue and keyed queues
  (key_concurrency 1) with 10, 1,000 and 100,000 keys, pre-fill 40,000 + 2K + 2,000 jobs with the
  add script directly, then (a) claim (n=50) + complete 20,000 jobs from this process, reading
  redis-server's main-thread CPU (INFO cpu) around each script call, and (b) claim 20,000 with
  ONE worker process (``bench_app:keyed``, concurrency 50). ``--keyed --quick``: 5,000 jobs per
  phase, 10,000 keys at most.

* spark mode (``--spark`` only; not part of the full run; needs the ``spark`` extra and Java
  17): on a fresh server with ``maxmemory 0`` (unlimited), (a) the single-process baseline:
  1,000,000 jobs with ``SyncQueueClient`` ``add_bulk`` in batches of 1000 (the job data built
  before the clock starts), then FLUSHDB; (b) ``panqueue.spark.enqueue_dataframe`` of the same
  1,000,000 rows on a ``local[2]`` SparkSession (``spark.range`` with 4 partitions and a few
  derived columns, ``id_column="order_id"``, ``batch_size=1000``), the session start and a
  10,000-row warm-up excluded; (c) ``read_jobs(...).count()`` over those 1,000,000 jobs, split
  into the driver's id listing (the ``read_jobs`` call) and the distributed read (``count()``).
  ``--spark --quick``: 100,000 rows.

``--backend trio`` runs the worker processes with ``--backend trio`` and the benchmark's own
async client on trio too. The sync client is the same in both modes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import redis

import panqueue
from panqueue import QueueClient, SyncQueueClient
from panqueue._codec import encode
from panqueue._keys import QueueKeys
from panqueue._store.redis_store import (
    DEFAULT_KEEP_COMPLETED,
    NewJob,
    add_call,
    parse_added,
    parse_claim,
    setup_queue,
)
from panqueue._store.scripts import SCRIPTS as LUA
from panqueue._store.scripts import Script
from panqueue._store.transport import SyncTransport
from panqueue.embedded import RedisServer

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
# The worker processes import the same panqueue as this process (a PYTHONPATH checkout too).
PANQUEUE_ROOT = Path(panqueue.__file__).resolve().parent.parent
APP = "bench_app:queues"
EXECUTORS_APP = "bench_app:executors"
KEYED_APP = "bench_app:keyed"
KEYED_CLAIM_N = 50
NOOP_QUEUE = "bench-noop"
LATENCY_QUEUE = "bench-latency"
BATCH = 1000
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- helpers


def log(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # fields[0] is field 3 (state)


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def child_pids(pid: int) -> list[int]:
    """The live children of a process (of any of its threads)."""
    pids: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                pids.extend(int(p) for p in f.read().split())
        except OSError:
            pass  # the thread is gone
    return pids


def tree_cpu_seconds(pid: int) -> tuple[float, float, int]:
    """(the process's own CPU, its children's CPU, live children): the children's figure is
    the live children's utime + stime plus the reaped children's (cutime + cstime)."""
    fields = _stat_fields(pid)
    own = (int(fields[11]) + int(fields[12])) / CLK_TCK
    children = (int(fields[13]) + int(fields[14])) / CLK_TCK
    live = child_pids(pid)
    for child in live:
        try:
            children += proc_cpu_seconds(child)
        except OSError:  # exited in between: counted in cutime/cstime next time
            pass
    return own, children, len(live)


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100)
    return ordered[int(rank) - 1]


def machine_info(server: RedisServer) -> dict[str, Any]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    version = subprocess.run([server.binary, "--version"], capture_output=True, text=True,
                             check=False).stdout.strip()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "redis_server": version,
        "redis_py": redis.__version__,
        "hiredis": _hiredis_version(),
        "panqueue": f"{panqueue.__version__} from {PANQUEUE_ROOT}{_git_state()}",
    }


def _git_state() -> str:
    """The commit of the checkout being measured (and whether it has local changes)."""
    try:
        head = subprocess.run(["git", "-C", str(PANQUEUE_ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(PANQUEUE_ROOT), "status", "--porcelain",
                                "--", "panqueue"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f" (git {head}{', modified' if dirty else ''})"


def _hiredis_version() -> str | None:
    try:
        import hiredis
    except ImportError:
        return None
    return str(getattr(hiredis, "__version__", "installed"))


def start_worker(url: str, queue: str, concurrency: int, backend: str,
                 log_file: Any, app: str = APP) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SCRIPTS), str(PANQUEUE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    args = [sys.executable, "-m", "panqueue", "worker", app, "-q", queue,
            "--concurrency", str(concurrency), "--log-level", "warning", "--url", url,
            "--backend", backend]
    return subprocess.Popen(args, cwd=SCRIPTS, env=env, stdin=subprocess.DEVNULL,
                            stdout=log_file, stderr=log_file)


def stop_worker(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float, what: str,
             proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"worker exited with code {proc.returncode} while waiting for "
                               f"{what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- enqueue


async def enqueue_async(url: str, n: int) -> float:
    async with QueueClient(url) as client:
        queue = client.queue("bench-enqueue-async")
        for i in range(100):  # warm-up: connection, script cache
            await queue.add({"i": i})
        start = time.perf_counter()
        for i in range(n):
            await queue.add({"i": i})
        return n / (time.perf_counter() - start)


def enqueue_sync(url: str, n: int) -> float:
    with SyncQueueClient(url) as client:
        queue = client.queue("bench-enqueue-sync")
        for i in range(100):
            queue.add({"i": i})
        start = time.perf_counter()
        for i in range(n):
            queue.add({"i": i})
        return n / (time.perf_counter() - start)


async def enqueue_bulk(url: str, n: int) -> float:
    async with QueueClient(url) as client:
        queue = client.queue("bench-enqueue-bulk")
        await queue.add_bulk([{"i": i} for i in range(BATCH)])  # warm-up
        batches = [[{"i": i} for i in range(b, min(b + BATCH, n))] for b in range(0, n, BATCH)]
        start = time.perf_counter()
        for batch in batches:
            await queue.add_bulk(batch)
        return n / (time.perf_counter() - start)


# --------------------------------------------------------------------------- process rate


def process_rate(url: str, r: redis.Redis, server_pid: int, n: int, backend: str,
                 log_file: Any) -> dict[str, Any]:
    prefix = f"{{q:{NOOP_QUEUE}}}:"
    wait_key, active_key = prefix + "wait", prefix + "active"
    with SyncQueueClient(url) as client:
        queue = client.queue(NOOP_QUEUE)
        first_id: str | None = None
        for b in range(0, n, BATCH):
            handles = queue.add_bulk([{"i": i} for i in range(b, min(b + BATCH, n))])
            first_id = first_id or handles[0].id
    assert r.zcard(wait_key) == n
    assert first_id is not None

    proc = start_worker(url, NOOP_QUEUE, 50, backend, log_file)
    try:
        # The window opens at the first claim: poll the wait set tightly until it shrinks.
        wait_for(lambda: r.zcard(wait_key) < n, 60, 0.0005, "the first claim", proc)
        cpu0, redis_cpu0, t0 = (proc_cpu_seconds(proc.pid), proc_cpu_seconds(server_pid),
                                time.monotonic())
        first_started = int(r.hget(prefix + f"job:{first_id}", "st") or 0)

        def drained() -> bool:
            pipe = r.pipeline(transaction=False)
            pipe.zcard(wait_key)
            pipe.zcard(active_key)
            return sum(pipe.execute()) == 0

        wait_for(drained, 600, 0.005, "the queue to drain", proc)
        cpu1, redis_cpu1, t1 = (proc_cpu_seconds(proc.pid), proc_cpu_seconds(server_pid),
                                time.monotonic())
        [(_, last_finished)] = r.zrange(prefix + "completed", -1, -1, withscores=True)
        failed = r.zcard(prefix + "failed")
    finally:
        code = stop_worker(proc)
    span_ms = int(last_finished) - first_started
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


# --------------------------------------------------------------------------- spark

SPARK_QUEUE = "bench-spark"


def spark_order(i: int) -> dict[str, Any]:
    """The job data of row ``i`` in the Spark benchmark (the same as the DataFrame's rows)."""
    return {"order_id": i, "customer": f"customer-{i % 50_000}", "amount": (i % 100_000) / 100,
            "country": ("FR", "DE", "GB", "US")[i % 4]}


def spark_bench(url: str, r: redis.Redis, server_pid: int, n: int) -> dict[str, Any]:
    """add_bulk baseline, then enqueue_dataframe and read_jobs on a local[2] SparkSession."""
    import warnings

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from panqueue.spark import enqueue_dataframe, read_jobs

    result: dict[str, Any] = {"rows": n, "batch": BATCH, "partitions": 4}
    # (a) the single-process baseline: add_bulk, 1000 jobs a call, data built beforehand.
    log(f"spark: {n:,} jobs with add_bulk (SyncQueueClient), {BATCH} per batch")
    batches = [[spark_order(i) for i in range(b, min(b + BATCH, n))] for b in range(0, n, BATCH)]
    with SyncQueueClient(url) as client:
        queue = client.queue(SPARK_QUEUE + "-bulk")
        queue.add_bulk(batches[0][:10])  # warm-up: connection, script cache
        redis_cpu, start = proc_cpu_seconds(server_pid), time.perf_counter()
        for batch in batches:
            queue.add_bulk(batch)
        elapsed = time.perf_counter() - start
        result["add_bulk_redis_cpu_us_per_row"] = (proc_cpu_seconds(server_pid)
                                                   - redis_cpu) / n * 1e6
    result["add_bulk_s"] = elapsed
    result["add_bulk_rows_per_s"] = n / elapsed
    result["redis_used_memory_mb"] = int(r.info("memory")["used_memory"]) / 2**20
    del batches
    r.flushdb()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    log("spark: starting a local[2] SparkSession (not measured)")
    spark = (SparkSession.builder.master("local[2]").appName("panqueue-bench")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    try:
        def orders(count: int) -> Any:
            return (spark.range(0, count, numPartitions=4)
                    .withColumnRenamed("id", "order_id")
                    .withColumn("customer", F.format_string("customer-%d",
                                                            F.col("order_id") % 50_000))
                    .withColumn("amount", (F.col("order_id") % 100_000) / 100)
                    .withColumn("country", F.element_at(F.array(*[F.lit(c) for c in
                                                                  ("FR", "DE", "GB", "US")]),
                                                        (F.col("order_id") % 4 + 1).cast("int"))))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enqueue_dataframe(orders(10_000), SPARK_QUEUE + "-warmup", url=url,
                              id_column="order_id", batch_size=BATCH)  # Python workers, JIT
        r.flushdb()
        log(f"spark: enqueue_dataframe of {n:,} rows, local[2], 4 partitions")
        redis_cpu, start = proc_cpu_seconds(server_pid), time.perf_counter()
        stats = enqueue_dataframe(orders(n), SPARK_QUEUE, url=url, id_column="order_id",
                                  batch_size=BATCH)
        elapsed = time.perf_counter() - start
        result["enqueue_redis_cpu_us_per_row"] = (proc_cpu_seconds(server_pid)
                                                  - redis_cpu) / n * 1e6
        if (stats.added, stats.existing) != (n, 0):
            raise RuntimeError(f"enqueue_dataframe: {stats}, expected {n} added")
        result["enqueue_s"] = elapsed
        result["enqueue_rows_per_s"] = n / elapsed
        with SyncQueueClient(url) as client:
            result["sample_data"] = client.get_job(SPARK_QUEUE, "order_id:77").data

        log(f"spark: read_jobs(...).count() over {n:,} jobs")
        redis_cpu, start = proc_cpu_seconds(server_pid), time.perf_counter()
        jobs = read_jobs(spark, SPARK_QUEUE, url=url)
        listed = time.perf_counter()
        count = jobs.count()
        done = time.perf_counter()
        result["read_redis_cpu_us_per_row"] = (proc_cpu_seconds(server_pid)
                                               - redis_cpu) / n * 1e6
        if count != n:
            raise RuntimeError(f"read_jobs counted {count} jobs, expected {n}")
        result["read_list_s"] = listed - start
        result["read_count_s"] = done - listed
        result["read_s"] = done - start
        result["read_rows_per_s"] = n / (done - start)
        result["read_partitions"] = jobs.rdd.getNumPartitions()
    finally:
        spark.stop()
    return result


# --------------------------------------------------------------------------- executors


def executor_rate(url: str, r: redis.Redis, kind: str, executor: str, concurrency: int,
                  n: int, warmup: int, backend: str, log_file: Any) -> dict[str, Any]:
    """ONE worker process drains ``warmup`` + ``n`` pre-filled jobs of a ``bench-x-*`` queue.

    The window opens once the warm-up jobs are claimed (the first measured job has started; the
    subprocess children exist by then) and closes when the queue is empty. Jobs in the window =
    waiting + active when it opens (all of them complete inside it).
    """
    name = f"bench-x-{kind}-{executor}"
    prefix = f"{{q:{name}}}:"
    wait_key, active_key = prefix + "wait", prefix + "active"
    total = warmup + n
    with SyncQueueClient(url) as client:
        queue = client.queue(name)
        ids: list[str] = []
        for b in range(0, total, BATCH):
            ids += [h.id for h in queue.add_bulk([{"i": i}
                                                   for i in range(b, min(b + BATCH, total))])]
    assert r.zcard(wait_key) == total
    first_id = ids[warmup]

    def counts() -> tuple[int, int]:
        pipe = r.pipeline(transaction=True)
        pipe.zcard(wait_key)
        pipe.zcard(active_key)
        waiting, active = pipe.execute()
        return int(waiting), int(active)

    proc = start_worker(url, name, concurrency, backend, log_file, app=EXECUTORS_APP)
    try:
        wait_for(lambda: r.zcard(wait_key) < n, 120, 0.0005, "the warm-up jobs", proc)
        (own0, kids0, _), t0 = tree_cpu_seconds(proc.pid), time.monotonic()
        waiting0, active0 = counts()
        first_started = int(r.hget(prefix + f"job:{first_id}", "st") or 0)
        wait_for(lambda: sum(counts()) == 0, 600, 0.005, "the queue to drain", proc)
        (own1, kids1, children), t1 = tree_cpu_seconds(proc.pid), time.monotonic()
        threads = thread_count(proc.pid)
        [(_, last_finished)] = r.zrange(prefix + "completed", -1, -1, withscores=True)
        failed = r.zcard(prefix + "failed")
    finally:
        code = stop_worker(proc)
    if failed:
        raise RuntimeError(f"{failed} jobs of {name} failed")
    if not first_started:
        raise RuntimeError(f"{name}: the first measured job's start time was already trimmed")
    jobs = waiting0 + active0
    span_s = (int(last_finished) - first_started) / 1000
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


# (handler, executor, concurrency) in the order measured and printed.
EXECUTOR_CASES = [
    ("noop", "inline", 50),
    ("noop", "thread", 50),
    ("noop", "subprocess", 2),
    ("noop", "subprocess", 8),
    ("cpu", "inline", 2),
    ("cpu", "thread", 2),
    ("cpu", "subprocess", 2),
]


def executor_rows(results: list[dict[str, Any]]) -> list[tuple[str, ...]]:
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
    return rows


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                right: Sequence[bool]) -> None:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(f"{c:>{w}}" if r else f"{c:<{w}}"
                         for c, w, r in zip(cells, widths, right, strict=True)).rstrip()

    print(fmt(header))
    print("-" * len(fmt(header)))
    for row in rows:
        print(fmt(row))


# --------------------------------------------------------------------------- latency


async def latency_run(url: str, n: int, gap: float) -> dict[str, list[float]]:
    server_ms: list[float] = []
    handler_ms: list[float] = []
    roundtrip_ms: list[float] = []
    async with QueueClient(url) as client:
        queue = client.queue(LATENCY_QUEUE)
        for i in range(n + 10):  # the first 10 are warm-up
            await anyio.sleep(gap)  # let the worker go idle again
            t_add = time.time_ns()
            handle = await queue.add({"i": i})
            started_ns = await handle.result(timeout=10)
            t_done = time.time_ns()
            info = await handle.info()
            if i < 10:
                continue
            assert info.started_at is not None and info.enqueued_at is not None
            server_ms.append((info.started_at - info.enqueued_at).total_seconds() * 1000)
            handler_ms.append((started_ns - t_add) / 1e6)
            roundtrip_ms.append((t_done - t_add) / 1e6)
    return {"server": server_ms, "handler": handler_ms, "roundtrip": roundtrip_ms}


def pickup_latency(url: str, r: redis.Redis, n: int, backend: str,
                   log_file: Any) -> dict[str, Any]:
    channel = f"{{q:{LATENCY_QUEUE}}}:notify"
    proc = start_worker(url, LATENCY_QUEUE, 1, backend, log_file)
    try:
        def subscribed() -> bool:
            reply = r.execute_command("PUBSUB", "SHARDNUMSUB", channel)
            return int(reply[1]) > 0

        wait_for(subscribed, 60, 0.01, "the worker to subscribe", proc)
        time.sleep(0.5)  # its first claim finds nothing: the worker is idle
        samples = anyio.run(latency_run, url, n, 0.02, backend=backend)
    finally:
        code = stop_worker(proc)

    def summary(values: list[float]) -> dict[str, float]:
        return {"p50": percentile(values, 50), "p95": percentile(values, 95),
                "p99": percentile(values, 99), "max": max(values)}

    return {
        "jobs": n,
        "server_ms": summary(samples["server"]),
        "handler_ms": summary(samples["handler"]),
        "roundtrip_ms": summary(samples["roundtrip"]),
        "worker_exit_code": code,
    }


# --------------------------------------------------------------------------- keyed mode


def _main_thread_cpu(info: dict[str, Any]) -> float:
    """redis-server's main-thread CPU (user + sys, s) from an ``INFO cpu`` reply: getrusage
    with µs resolution, where /proc/<pid>/stat only counts 10 ms ticks."""
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def _eval(pipe: Any, script: Script, prefix: str, *args: Any) -> None:
    pipe.execute_command("EVALSHA", script.sha, 1, prefix, *args)


def keyed_fill(r: redis.Redis, name: str, mode: str, n: int, n_keys: int) -> float:
    """Add ``n`` no-op jobs to queue ``name`` (keys ``key-<i mod n_keys>``, round robin, in
    keyed mode): the add script with 1000 jobs per call, 10 calls per pipeline. Returns s."""
    keys = QueueKeys(name)
    data = encode({"i": 0})
    r.script_load(LUA.add.body)
    start = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for b in range(0, n, BATCH):
        jobs = [NewJob(None, data, key=f"key-{i % n_keys}" if mode == "keyed" else "")
                for i in range(b, min(b + BATCH, n))]
        call = add_call(keys, jobs, mode)
        pipe.execute_command("EVALSHA", call.script.sha, 1, *call.keys, *call.args)
        if len(pipe) == 10 or b + BATCH >= n:
            for reply in pipe.execute():
                parse_added(keys, reply)  # raises on a refused batch
    return time.perf_counter() - start


def _waiting(r: redis.Redis, keys: QueueKeys, mode: str) -> int:
    if mode == "keyed":
        return int(r.hget(keys.meta, "kw") or 0)
    return int(r.zcard(keys.wait))


def keyed_raw(r: redis.Redis, name: str, mode: str, m: int) -> dict[str, Any]:
    """Claim and complete ``m`` jobs from this process, calling the scripts directly: one claim
    script call for up to KEYED_CLAIM_N jobs, then one complete call per job (no claim in it),
    all the completes of a round in one pipeline. The server's main-thread CPU is read with
    ``INFO cpu`` right before and after each claim call (and each completion pipeline), in the
    same pipeline, so it covers that script work alone (minus a calibrated INFO overhead)."""
    keys = QueueKeys(name)
    prefix = keys.prefix
    for script in (LUA.claim, LUA.complete):
        r.script_load(script.body)
    result_blob = encode(None)
    ttl = 30_000

    pipe = r.pipeline(transaction=False)
    for _ in range(200):  # INFO's own CPU, seen by two back-to-back reads
        pipe.info("cpu")
        pipe.info("cpu")
    infos = pipe.execute()
    overhead = sum(_main_thread_cpu(b) - _main_thread_cpu(a)
                   for a, b in zip(infos[::2], infos[1::2], strict=True)) / 200

    claimed = rounds = 0
    claim_cpu = complete_cpu = 0.0
    seq = 0

    def one_round() -> tuple[int, float, float]:
        nonlocal seq
        seq += 1
        token = f"bench-{seq}"
        pipe = r.pipeline(transaction=False)
        pipe.info("cpu")
        _eval(pipe, LUA.claim, prefix, token, ttl, KEYED_CLAIM_N)
        pipe.info("cpu")
        a, reply, b = pipe.execute()
        jobs, _ = parse_claim(reply)
        if not jobs:
            raise RuntimeError(f"{name}: the claim found nothing")
        pipe = r.pipeline(transaction=False)
        pipe.info("cpu")
        for job in jobs:
            _eval(pipe, LUA.complete, prefix, job.id, token, result_blob,
                  DEFAULT_KEEP_COMPLETED, 0, "", ttl)
        pipe.info("cpu")
        replies = pipe.execute()
        if any(done[0] != 1 for done in replies[1:-1]):
            raise RuntimeError(f"{name}: a completion lost its lock")
        return (len(jobs), _main_thread_cpu(b) - _main_thread_cpu(a) - overhead,
                _main_thread_cpu(replies[-1]) - _main_thread_cpu(replies[0]) - overhead)

    for _ in range(5):  # warm-up
        one_round()
    r.config_resetstat()
    start = time.perf_counter()
    while claimed < m:
        jobs, c1, c2 = one_round()
        claimed += jobs
        claim_cpu += c1
        complete_cpu += c2
        rounds += 1
    elapsed = time.perf_counter() - start
    stats = r.info("commandstats")

    def per_call(command: str) -> float | None:
        entry = stats.get(f"cmdstat_{command}")
        return None if entry is None else float(entry["usec_per_call"])

    return {
        "jobs": claimed,
        "jobs_per_claim": claimed / rounds,
        "jobs_per_s": claimed / elapsed,
        "claim_server_us_per_job": claim_cpu / claimed * 1e6,
        "complete_server_us_per_job": complete_cpu / claimed * 1e6,
        "server_us_per_job": (claim_cpu + complete_cpu) / claimed * 1e6,
        "info_overhead_us": overhead * 1e6,
        "commandstats_us_per_call": {c: per_call(c) for c in
                                     ("zpopmin", "zadd", "zrem", "zscore", "lpop", "hincrby",
                                      "xadd", "hset")},
    }


def keyed_worker(url: str, r: redis.Redis, name: str, mode: str, m: int,
                 backend: str, log_file: Any) -> dict[str, Any]:
    """ONE worker process (bench_app:keyed, concurrency 50) claims from the pre-filled queue;
    the window opens at its first claim and closes once ``m`` more jobs were claimed (polled
    every 5 ms from the waiting count); then the worker is stopped, jobs are left over."""
    keys = QueueKeys(name)
    waiting0 = _waiting(r, keys, mode)
    proc = start_worker(url, name, 50, backend, log_file, app=KEYED_APP)
    try:
        wait_for(lambda: _waiting(r, keys, mode) < waiting0, 60, 0.0005, "the first claim",
                 proc)
        cpu0, server0, t0 = (proc_cpu_seconds(proc.pid), _main_thread_cpu(r.info("cpu")),
                             time.monotonic())
        waiting_a = _waiting(r, keys, mode)
        wait_for(lambda: waiting_a - _waiting(r, keys, mode) >= m, 300, 0.005,
                 f"{m} claims", proc)
        cpu1, server1, t1 = (proc_cpu_seconds(proc.pid), _main_thread_cpu(r.info("cpu")),
                             time.monotonic())
        jobs = waiting_a - _waiting(r, keys, mode)
        failed = r.zcard(keys.failed)
    finally:
        code = stop_worker(proc)
    if failed:
        raise RuntimeError(f"{failed} jobs of {name} failed")
    return {
        "jobs": jobs,
        "jobs_per_s": jobs / (t1 - t0),
        "worker_cpu_us_per_job": (cpu1 - cpu0) / jobs * 1e6,
        "server_us_per_job": (server1 - server0) / jobs * 1e6,
        "worker_exit_code": code,
    }


def keyed_case(url: str, r: redis.Redis, n_keys: int | None, m: int,
               backend: str, log_file: Any) -> dict[str, Any]:
    """One row: a global queue (``n_keys`` None) or a keyed queue with ``n_keys`` keys."""
    mode = "global" if n_keys is None else "keyed"
    name = "bench-keyed-global" if n_keys is None else "bench-keyed"
    # Enough jobs that every key still has waiting jobs after both phases (2 * m claims): the
    # ready set keeps its size, and each completion puts its key back into it.
    n = 2 * m + 2 * (n_keys or 0) + 2_000
    r.flushdb()
    transport = SyncTransport(url)  # the worker's own setup call: mode, key concurrency 1
    try:
        transport.run(setup_queue(QueueKeys(name), mode, 1, 0, 0, False))
    finally:
        transport.close()
    label = "global" if n_keys is None else f"{n_keys:,} keys"
    log(f"keyed: {label}: filling {n:,} jobs")
    fill_s = keyed_fill(r, name, mode, n, n_keys or 1)
    if mode == "keyed":
        ready = int(r.zcard(QueueKeys(name).prefix + "k:ready"))
        if ready != n_keys:
            raise RuntimeError(f"{name}: {ready} ready keys after the fill, expected {n_keys}")
    log(f"keyed: {label}: {m:,} claims + completions from this process")
    raw = keyed_raw(r, name, mode, m)
    log(f"keyed: {label}: {m:,} jobs, one worker process, concurrency 50")
    worker = keyed_worker(url, r, name, mode, m, backend, log_file)
    return {"mode": mode, "keys": n_keys, "jobs_filled": n, "fill_s": fill_s,
            "fill_jobs_per_s": n / fill_s, "raw": raw, "worker": worker}


def keyed_rows(results: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    rows = []
    for res in results:
        raw, worker = res["raw"], res["worker"]
        zpopmin = raw["commandstats_us_per_call"]["zpopmin"]
        rows.append((
            "global" if res["keys"] is None else f"keyed, {res['keys']:,} keys",
            f"{res['jobs_filled']:,} in {res['fill_s']:.1f} s",
            f"{raw['jobs_per_claim']:.0f}",
            f"{raw['jobs_per_s']:,.0f}",
            f"{raw['claim_server_us_per_job']:.1f}",
            f"{raw['complete_server_us_per_job']:.1f}",
            "-" if zpopmin is None else f"{zpopmin:.2f}",
            f"{worker['jobs_per_s']:,.0f}",
            f"{worker['server_us_per_job']:.0f}",
            f"{worker['worker_cpu_us_per_job']:.0f}",
        ))
    return rows


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller N everywhere (and no executor comparison unless "
                             "--executors is given too)")
    parser.add_argument("--executors", action="store_true",
                        help="only the executor comparison (inline / thread / subprocess)")
    parser.add_argument("--keyed", action="store_true",
                        help="only the keyed-mode comparison: claim cost against the number of "
                             "distinct keys (not part of the full run)")
    parser.add_argument("--spark", action="store_true",
                        help="only the Spark figures: enqueue_dataframe and read_jobs on "
                             "local[2] against add_bulk, 1,000,000 rows (not part of the full "
                             "run; needs the spark extra and Java 17)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio",
                        help="event loop for the worker processes and the async client")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)

    n_single = 3_000 if args.quick else 10_000
    n_bulk = 20_000 if args.quick else 100_000
    n_process = 10_000 if args.quick else 20_000
    n_latency = 100 if args.quick else 200
    n_x_noop, warm_x_noop = (1_000, 200) if args.quick else (5_000, 500)
    n_x_cpu, warm_x_cpu = (200, 20) if args.quick else (1_000, 20)
    backend = args.backend
    keyed_counts: list[int | None] = [None, 10, 1_000, 10_000 if args.quick else 100_000]
    n_keyed = 5_000 if args.quick else 20_000
    run_keyed = args.keyed
    run_spark = args.spark
    n_spark = 100_000 if args.quick else 1_000_000
    run_baseline = not args.executors and not args.keyed and not args.spark
    run_executors = args.executors or (not args.quick and not args.keyed and not args.spark)
    mode = ("quick" if args.quick else "full") + (", executors only" if args.executors else "")
    if args.keyed:
        mode = ("quick" if args.quick else "full") + ", keyed mode only"
    if args.spark:
        mode = ("quick" if args.quick else "full") + ", spark only"

    server = RedisServer(appendonly=False, extra_args=("--maxmemory", "0"))
    server.start()
    log_path = Path(tempfile.mkstemp(prefix="panqueue-bench-worker-", suffix=".log")[1])
    started = time.monotonic()
    xres: list[dict[str, Any]] = []
    kres: list[dict[str, Any]] = []
    sres: dict[str, Any] | None = None
    try:
        assert server.pid is not None
        machine = machine_info(server)
        r = redis.Redis.from_url(server.url)
        print(f"panqueue benchmark, {machine['date']}  (mode: {mode}, backend: {backend})")
        print(f"machine: {machine['nproc']} CPUs, {machine['cpu_model']}, Linux "
              f"{machine['kernel']}; Python {machine['python']}; redis-py {machine['redis_py']}"
              f" (hiredis {machine['hiredis'] or 'not installed'})")
        print(f"panqueue {machine['panqueue']}")
        print(f"server:  {machine['redis_server']}")
        print(f"         private instance on 127.0.0.1:{server.port}, appendonly OFF, "
              "RDB snapshots off (figures exclude persistence cost)")
        print()

        with open(log_path, "ab") as log_file:
            if run_baseline:
                log(f"enqueue: {n_single} single adds (async client on {backend})")
                single_async = anyio.run(enqueue_async, server.url, n_single, backend=backend)
                log(f"enqueue: {n_single} single adds (sync client)")
                single_sync = enqueue_sync(server.url, n_single)
                log(f"enqueue: {n_bulk} jobs with add_bulk, {BATCH} per batch")
                bulk = anyio.run(enqueue_bulk, server.url, n_bulk, backend=backend)
                r.flushdb()
                log(f"process: {n_process} no-op jobs, one worker process, concurrency 50")
                proc = process_rate(server.url, r, server.pid, n_process, backend, log_file)
                r.flushdb()
                log(f"latency: {n_latency} jobs, one at a time, idle worker (concurrency 1)")
                lat = pickup_latency(server.url, r, n_latency, backend, log_file)
            if run_executors:
                for kind, executor, concurrency in EXECUTOR_CASES:
                    n, warmup = (n_x_noop, warm_x_noop) if kind == "noop" else (n_x_cpu,
                                                                               warm_x_cpu)
                    r.flushdb()
                    log(f"executors: {n} {kind} jobs (+{warmup} warm-up), {executor}, "
                        f"concurrency {concurrency}")
                    xres.append(executor_rate(server.url, r, kind, executor, concurrency, n,
                                              warmup, backend, log_file))
            if run_keyed:
                # A fresh redis-server is measurably slower for its first ~10,000 script calls
                # (the first keyed case came out 1.5x dearer on the server than the same case
                # repeated): warm it up with an unmeasured keyed fill and claim phase.
                log("keyed: warm-up (not measured)")
                r.flushdb()
                keyed_fill(r, "bench-keyed", "keyed", 2 * n_keyed, 10)
                keyed_raw(r, "bench-keyed", "keyed", n_keyed)
                for n_keys in keyed_counts:
                    kres.append(keyed_case(server.url, r, n_keys, n_keyed, backend, log_file))
            if run_spark:
                r.flushdb()
                sres = spark_bench(server.url, r, server.pid, n_spark)
    except BaseException:
        sys.stderr.write(f"worker log ({log_path}):\n{log_path.read_text()}\n")
        raise
    finally:
        server.cleanup()
    # The shutdown notice every worker prints on the benchmark's SIGTERM is not news.
    worker_log = "\n".join(line for line in log_path.read_text().splitlines()
                           if "SIGTERM received; finishing running jobs" not in line).strip()
    log_path.unlink()
    log(f"done in {time.monotonic() - started:.0f} s")

    if run_baseline:
        rows = [
            ("enqueue, single, QueueClient", f"{single_async:,.0f}", "jobs/s",
             f"{n_single:,} sequential await add() ({backend})"),
            ("enqueue, single, SyncQueueClient", f"{single_sync:,.0f}", "jobs/s",
             f"{n_single:,} sequential add()"),
            ("enqueue, bulk", f"{bulk:,.0f}", "jobs/s",
             f"{n_bulk:,} jobs, add_bulk x {BATCH}"),
            ("process rate, 1 worker process", f"{proc['jobs_per_s']:,.0f}", "jobs/s",
             f"{n_process:,} no-op jobs, concurrency 50, {proc['span_s']:.2f} s "
             f"(polled: {proc['jobs_per_s_polled']:,.0f}/s)"),
            ("worker CPU per job", f"{proc['worker_cpu_us_per_job']:,.0f}", "µs/job",
             f"worker process at {proc['worker_cpu_utilisation']:.0%} of one core"),
            ("redis-server CPU per job", f"{proc['redis_cpu_us_per_job']:,.0f}", "µs/job",
             "same window (add excluded)"),
            ("pickup latency p50 / p95 / p99",
             "{p50:.0f} / {p95:.0f} / {p99:.0f}".format(**lat["server_ms"]), "ms",
             f"started_at - enqueued_at in Redis (1 ms resolution), n={n_latency}"),
            ("pickup, add() call -> handler start",
             "{p50:.2f} / {p95:.2f} / {p99:.2f}".format(**lat["handler_ms"]), "ms",
             "p50 / p95 / p99, wall clock, includes the add round trip"),
            ("round trip add -> result() p50",
             "{p50:.2f}".format(**lat["roundtrip_ms"]), "ms",
             "p95 {p95:.2f}, p99 {p99:.2f}".format(**lat["roundtrip_ms"])),
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        header = ("figure", "value", "unit", "notes")
        widths = [max(w, len(h)) for w, h in zip(widths, header, strict=False)]
        line = f"{header[0]:<{widths[0]}}  {header[1]:>{widths[1]}}  " \
               f"{header[2]:<{widths[2]}}  {header[3]}"
        print(line)
        print("-" * (len(line) + max(len(row[3]) for row in rows) - len(header[3])))
        for name, value, unit, note in rows:
            print(f"{name:<{widths[0]}}  {value:>{widths[1]}}  {unit:<{widths[2]}}  {note}")
    if xres:
        if run_baseline:
            print()
        print("executors: ONE worker process (bench_app:executors); CPU in µs per job, "
              "cores = CPU s per wall s")
        print_table(
            ("handler", "executor", "conc.", "jobs", "jobs/s", "worker µs", "children µs",
             "total µs", "cores (worker + children)", "threads"),
            executor_rows(xres),
            (False, False, True, True, True, True, True, True, True, True))
    if kres:
        print(f"keyed mode: key_concurrency 1, keys round robin; {n_keyed:,} jobs per phase. "
              f"'this process': claim {KEYED_CLAIM_N} + complete each (pipelined), scripts "
              "called directly; server µs = redis-server main-thread CPU per job (INFO cpu); "
              "'worker': ONE worker process (bench_app:keyed), concurrency 50")
        print_table(
            ("queue", "filled", "jobs/claim", "claims/s", "claim µs", "complete µs",
             "ZPOPMIN µs/call", "worker jobs/s", "server µs", "worker µs"),
            keyed_rows(kres),
            (False, True, True, True, True, True, True, True, True, True))
    if sres is not None:
        print(f"spark: {sres['rows']:,} rows/jobs, batches of {sres['batch']}; "
              "enqueue_dataframe on local[2] (spark.range, 4 partitions, id_column), session "
              "start and warm-up excluded")
        print_table(
            ("figure", "rows/s", "seconds", "redis-server CPU µs/row", "notes"),
            [("add_bulk, SyncQueueClient, 1 process", f"{sres['add_bulk_rows_per_s']:,.0f}",
              f"{sres['add_bulk_s']:.1f}", f"{sres['add_bulk_redis_cpu_us_per_row']:.1f}",
              f"server-assigned ids; Redis used_memory {sres['redis_used_memory_mb']:,.0f} MB"),
             ("enqueue_dataframe, local[2]", f"{sres['enqueue_rows_per_s']:,.0f}",
              f"{sres['enqueue_s']:.1f}", f"{sres['enqueue_redis_cpu_us_per_row']:.1f}",
              "ids order_id:<n>"),
             ("read_jobs + count()", f"{sres['read_rows_per_s']:,.0f}", f"{sres['read_s']:.1f}",
              f"{sres['read_redis_cpu_us_per_row']:.1f}",
              f"listing ids on the driver {sres['read_list_s']:.1f} s, count() "
              f"{sres['read_count_s']:.1f} s over {sres['read_partitions']} partitions")],
            (False, True, True, True, False))
    if worker_log:
        print()
        print("worker output (warnings and errors):")
        print(worker_log)

    if args.json:
        payload: dict[str, Any] = {
            "machine": machine,
            "mode": mode,
            "backend": backend,
            "appendonly": False,
            "command": " ".join([".venv/bin/python", "scripts/bench.py",
                                 *(sys.argv[1:] if argv is None else argv)]),
        }
        if run_baseline:
            payload.update({
                "enqueue": {"single_async_jobs_per_s": single_async,
                            "single_sync_jobs_per_s": single_sync,
                            "bulk_jobs_per_s": bulk, "n_single": n_single, "n_bulk": n_bulk,
                            "bulk_batch": BATCH},
                "process": proc,
                "latency": lat,
            })
        if xres:
            payload["executors"] = xres
        if kres:
            payload["keyed"] = kres
        if sres is not None:
            payload["spark"] = sres
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
