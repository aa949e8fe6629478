"""Job analytics with PySpark over the ``panqueue`` data source or the exported job history.

    .venv/bin/python scripts/job_analytics.py --url redis://HOST:6379/0 --queue emails \\
        [--queue reports ...] --out analytics/
    .venv/bin/python scripts/job_analytics.py --queue emails --parquet-in analytics/jobs.parquet \\
        --out analytics2/
    .venv/bin/python scripts/job_analytics.py --history analytics/history/ [--queue emails] \
        --out analytics3/
    .venv/bin/python scripts/job_analytics.py --demo --out /tmp/analytics [--chart docs/img/x.png]

Per queue it computes:

* completed and failed jobs per time bucket (``--bucket`` seconds, default 60: per minute), by
  ``finished_at``; the ``*_per_min`` columns scale the counts to jobs per minute;
* wait time (``started_at - enqueued_at``) and run time (``finished_at - started_at``) p50, p95
  and p99 (``percentile_approx``), over the jobs that have them;
* the failure rate by error type: failed jobs of each ``error_type`` (and ``failure_reason``)
  over all finished (completed + failed) jobs of the queue.

It writes, under ``--out``:

* ``jobs.parquet``: the job records as ``spark.read.format("panqueue")`` reads them (those of
  ``read_jobs``, schema ``panqueue.spark.JOB_SCHEMA``),
  partitioned by ``queue`` (not written again with ``--parquet-in``);
* ``per_minute.parquet``, ``latency.parquet``, ``failures.parquet``: the three aggregates;
* ``job_analytics.png``: completed/failed per minute per queue, and the latency percentiles
  (matplotlib, Agg backend);

and prints a short table. The analytics run over ``jobs.parquet`` once it is written, so Redis
is read once. ``--history PATH`` (repeatable) reads the Parquet dataset that
``panqueue.spark.export_history`` appends to instead (every finished job, not only those the
queue's retention keeps; schema ``HISTORY_SCHEMA``): no Redis, and ``--queue`` is optional.

Longer than our usual 300 lines: one command, read top to bottom (options, demo data, the three
aggregates, the chart); each part is a short function.

``--demo`` starts a private Redis server (127.0.0.1, a free port), enqueues a few thousand jobs
in waves into ``emails`` and ``reports`` (some of them fail, with different error types), runs
two worker processes (``scripts/analytics_demo_app.py``) until every job has finished, then runs
the analytics against it. It produced ``docs/img/job_analytics.png``.

Spark runs in local mode (``--master``, default ``local[2]``, loopback only) unless a master is
given; executors need network access to Redis and panqueue installed.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
DEMO_QUEUES = ["emails", "reports"]
PERCENTILES = (0.5, 0.95, 0.99)


# --------------------------------------------------------------------------- Spark


def spark_session(master: str) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("panqueue-job-analytics").master(master)
    if master.startswith("local"):
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.ui.enabled", "false"))
    spark = (builder.config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def load_jobs(spark: Any, args: argparse.Namespace, out: Path) -> Any:
    """The job records: from Redis (the panqueue data source, written to out/jobs.parquet),
    --parquet-in, or --history (export_history's dataset, one record per finished job)."""
    from pyspark.sql import functions as F

    if args.parquet_in or args.history:
        jobs = (spark.read.parquet(*args.history) if args.history
                else spark.read.parquet(args.parquet_in))
        if args.queue:
            jobs = jobs.where(F.col("queue").isin(args.queue))
        return jobs
    from panqueue.spark import register

    register(spark)  # the data source format("panqueue"): read_jobs's records
    frames = [spark.read.format("panqueue").option("url", args.url).option("queue", queue).load()
              for queue in args.queue]
    raw = frames[0]
    for frame in frames[1:]:
        raw = raw.unionByName(frame)
    path = out / "jobs.parquet"
    raw.write.mode("overwrite").partitionBy("queue").parquet(str(path))
    return spark.read.parquet(str(path))


def analyse(jobs: Any, bucket_s: int) -> tuple[Any, Any, Any]:
    """(per_minute, latency, failures) DataFrames."""
    from pyspark.sql import functions as F

    finished = jobs.where(F.col("state").isin("completed", "failed")
                          & F.col("finished_at").isNotNull())
    per_minute = (
        finished.groupBy("queue", F.window("finished_at", f"{bucket_s} seconds")
                         .start.alias("bucket_start"))
        .agg(F.sum(F.when(F.col("state") == "completed", 1).otherwise(0)).alias("completed"),
             F.sum(F.when(F.col("state") == "failed", 1).otherwise(0)).alias("failed"))
        .withColumn("bucket_s", F.lit(bucket_s))
        .withColumn("completed_per_min", F.col("completed") * 60.0 / bucket_s)
        .withColumn("failed_per_min", F.col("failed") * 60.0 / bucket_s)
        .orderBy("queue", "bucket_start"))

    percentiles = F.array(*[F.lit(p) for p in PERCENTILES])
    latency_parts = []
    for metric, column in (("wait", "wait_ms"), ("run", "run_ms")):
        values = jobs.where(F.col(column).isNotNull())
        if metric == "run":
            values = values.where(F.col("state").isin("completed", "failed"))
        q = F.percentile_approx(column, percentiles, 10_000)
        latency_parts.append(
            values.groupBy("queue")
            .agg(F.count("*").alias("jobs"), q.alias("q"), F.avg(column).alias("mean_ms"),
                 F.max(column).alias("max_ms"))
            .select("queue", F.lit(metric).alias("metric"), "jobs",
                    F.col("q")[0].alias("p50_ms"), F.col("q")[1].alias("p95_ms"),
                    F.col("q")[2].alias("p99_ms"), "mean_ms", "max_ms"))
    latency = latency_parts[0].unionByName(latency_parts[1]).orderBy("queue", "metric")

    totals = finished.groupBy("queue").agg(F.count("*").alias("finished"))
    failures = (
        finished.where(F.col("state") == "failed")
        .groupBy("queue", F.coalesce("error_type", F.lit("(none)")).alias("error_type"),
                 "failure_reason")
        .agg(F.count("*").alias("failed"), F.first("error_message").alias("example_message"))
        .join(totals, "queue")
        .withColumn("failure_rate", F.col("failed") / F.col("finished"))
        .orderBy("queue", F.desc("failed")))
    return per_minute, latency, failures


# --------------------------------------------------------------------------- outputs


def draw_chart(per_minute: list[Any], latency: list[Any], path: Path, bucket_s: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    queues = sorted({r["queue"] for r in per_minute} | {r["queue"] for r in latency})
    colors = {q: plt.get_cmap("tab10")(i % 10) for i, q in enumerate(queues)}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7.2), dpi=80,
                                      gridspec_kw={"height_ratios": [1.1, 1]})
    for queue in queues:
        rows = [r for r in per_minute if r["queue"] == queue]
        xs = [r["bucket_start"] for r in rows]
        top.plot(xs, [r["completed_per_min"] for r in rows], marker="o", markersize=3,
                 color=colors[queue], label=f"{queue}: completed")
        top.plot(xs, [r["failed_per_min"] for r in rows], marker="x", markersize=4,
                 linestyle="--", color=colors[queue], label=f"{queue}: failed")
    unit = "minute" if bucket_s == 60 else f"{bucket_s} s bucket"
    top.set_title(f"Jobs finished per minute (by finished_at, one point per {unit})")
    top.set_ylabel("jobs / min")
    top.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    top.grid(alpha=0.3)
    top.legend(fontsize=8, ncol=2)

    labels = [(m, p) for m in ("wait", "run") for p in ("p50", "p95", "p99")]
    width = 0.8 / max(1, len(queues))
    for i, queue in enumerate(queues):
        by_metric = {r["metric"]: r for r in latency if r["queue"] == queue}
        values = [by_metric[m][f"{p}_ms"] if m in by_metric else 0 for m, p in labels]
        xs = [j + (i - (len(queues) - 1) / 2) * width for j in range(len(labels))]
        bars = bottom.bar(xs, values, width, color=colors[queue], label=queue)
        bottom.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
    bottom.set_xticks(range(len(labels)), [f"{m} {p}" for m, p in labels])
    bottom.set_yscale("log")
    bottom.set_ylabel("ms (log scale)")
    bottom.set_title("Wait time (enqueued → started) and run time (started → finished)")
    bottom.grid(axis="y", alpha=0.3)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def print_tables(latency: list[Any], failures: list[Any], totals: dict[str, dict[str, int]]
                 ) -> None:
    print(f"{'queue':<12} {'finished':>8} {'failed':>6} {'fail %':>6}  "
          f"{'wait p50/p95/p99 ms':>22}  {'run p50/p95/p99 ms':>22}")
    for queue in sorted(totals):
        t = totals[queue]
        cells = []
        for metric in ("wait", "run"):
            row = next((r for r in latency if r["queue"] == queue and r["metric"] == metric),
                       None)
            cells.append("-" if row is None else
                         f"{row['p50_ms']:.0f} / {row['p95_ms']:.0f} / {row['p99_ms']:.0f}")
        rate = t["failed"] / t["finished"] * 100 if t["finished"] else 0.0
        print(f"{queue:<12} {t['finished']:>8,} {t['failed']:>6,} {rate:>5.1f}%  "
              f"{cells[0]:>22}  {cells[1]:>22}")
    if failures:
        print()
        print(f"{'queue':<12} {'error type':<24} {'failure_reason':<22} {'failed':>6} "
              f"{'rate':>6}")
        for r in failures:
            print(f"{r['queue']:<12} {r['error_type']:<24} {r['failure_reason'] or '-':<22} "
                  f"{r['failed']:>6,} {r['failure_rate'] * 100:>5.1f}%")


def run_analytics(args: argparse.Namespace) -> None:
    from pyspark.sql import functions as F

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spark = spark_session(args.master)
    try:
        jobs = load_jobs(spark, args, out)
        per_minute, latency, failures = analyse(jobs, args.bucket)
        per_minute.write.mode("overwrite").parquet(str(out / "per_minute.parquet"))
        latency.write.mode("overwrite").parquet(str(out / "latency.parquet"))
        failures.write.mode("overwrite").parquet(str(out / "failures.parquet"))
        pm_rows = spark.read.parquet(str(out / "per_minute.parquet")).orderBy(
            "queue", "bucket_start").collect()
        lat_rows = spark.read.parquet(str(out / "latency.parquet")).collect()
        fail_rows = spark.read.parquet(str(out / "failures.parquet")).orderBy(
            "queue", F.desc("failed")).collect()
        totals = {r["queue"]: {"finished": r["finished"], "failed": r["failed"] or 0}
                  for r in jobs.where(F.col("state").isin("completed", "failed"))
                  .groupBy("queue")
                  .agg(F.count("*").alias("finished"),
                       F.sum(F.when(F.col("state") == "failed", 1)).alias("failed"))
                  .collect()}
        n_jobs = jobs.count()
    finally:
        spark.stop()
    chart = Path(args.chart) if args.chart else out / "job_analytics.png"
    draw_chart(pm_rows, lat_rows, chart, args.bucket)
    if args.chart:  # the copy under --out as well
        draw_chart(pm_rows, lat_rows, out / "job_analytics.png", args.bucket)
    written = "" if args.parquet_in or args.history else "jobs.parquet, "
    print(f"{n_jobs:,} jobs in {', '.join(sorted(totals)) or 'no finished jobs'}; "
          f"written to {out}/ ({written}per_minute.parquet, latency.parquet, "
          f"failures.parquet, job_analytics.png)")
    print()
    print_tables(lat_rows, fail_rows, totals)


# --------------------------------------------------------------------------- demo


def demo_jobs(rng: random.Random, wave: int) -> dict[str, list[dict[str, Any]]]:
    """One wave of jobs: sizes follow a slow swell, so the per-minute chart has a shape."""
    size = 1.0 + 0.8 * math.sin(wave / 2.0)
    emails = []
    for _ in range(int(220 * size)):
        outcome = rng.choices(["ok", "bad_address", "refused"], [92, 5, 3])[0]
        n = rng.randrange(1_000_000)
        emails.append({"to": f"user{n}@example.com", "ms": rng.randint(5, 40),
                       "outcome": outcome})
    reports = []
    for _ in range(int(60 * size)):
        outcome = rng.choices(["ok", "missing_column", "slow", "flaky", "flaky_once"],
                              [86, 4, 2, 2, 6])[0]
        reports.append({"ms": int(rng.lognormvariate(4.2, 0.5)), "outcome": outcome,
                        "column": rng.choice(["region", "revenue", "sku"])})
    return {"emails": emails, "reports": reports}


def start_workers(url: str, n: int, log_file: Any) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS), str(ROOT),
                                         *filter(None, [env.get("PYTHONPATH")])])
    return [subprocess.Popen([sys.executable, "-m", "panqueue", "worker",
                              "analytics_demo_app:queues", "--url", url, "--log-level",
                              "warning"], cwd=SCRIPTS, env=env, stdin=subprocess.DEVNULL,
                             stdout=log_file, stderr=log_file)
            for _ in range(n)]


def run_demo(args: argparse.Namespace) -> None:
    from panqueue import JobState, SyncQueueClient
    from panqueue.embedded import RedisServer

    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with RedisServer(appendonly=False) as server, \
            open(out / "demo-workers.log", "wb") as log_file:
        print(f"demo: private server on {server.url}")
        workers = start_workers(server.url, 2, log_file)
        total = {q: 0 for q in DEMO_QUEUES}
        try:
            with SyncQueueClient(server.url) as client:
                for wave in range(args.waves):
                    for queue, items in demo_jobs(rng, wave).items():
                        client.queue(queue).add_bulk(items)
                        total[queue] += len(items)
                    time.sleep(args.wave_interval)
                print(f"demo: enqueued {total['emails']:,} emails and "
                      f"{total['reports']:,} reports in {args.waves} waves; waiting for the "
                      "workers")
                deadline = time.monotonic() + 300
                busy = (JobState.WAITING, JobState.ACTIVE, JobState.DELAYED)
                while any(client.counts(q)[s] for q in DEMO_QUEUES for s in busy):
                    if any(w.poll() is not None for w in workers):
                        raise RuntimeError("a demo worker exited early; see "
                                           f"{out / 'demo-workers.log'}")
                    if time.monotonic() > deadline:
                        raise RuntimeError("the demo jobs did not finish within 300 s")
                    time.sleep(0.5)
        finally:
            for w in workers:
                if w.poll() is None:
                    w.send_signal(signal.SIGTERM)
            for w in workers:
                try:
                    w.wait(30)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
        args.url = server.url
        args.queue = DEMO_QUEUES
        run_analytics(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="Redis URL (default: $PANQUEUE_URL)")
    parser.add_argument("--queue", action="append", help="a queue to analyse (repeatable)")
    parser.add_argument("--parquet-in", metavar="PATH",
                        help="read job records from this Parquet (a jobs.parquet written "
                             "earlier) instead of Redis")
    parser.add_argument("--history", action="append", metavar="PATH",
                        help="read the job history that panqueue.spark.export_history wrote "
                             "to this Parquet dataset instead of Redis (repeatable)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--bucket", type=int, default=60,
                        help="time bucket in seconds for the per-minute figures (default 60)")
    parser.add_argument("--chart", metavar="PNG", help="also write the chart here")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--demo", action="store_true",
                        help="start a private server, run a demo workload, then analyse it")
    parser.add_argument("--waves", type=int, default=12, help="--demo: waves of jobs")
    parser.add_argument("--wave-interval", type=float, default=5.0,
                        help="--demo: seconds between waves")
    parser.add_argument("--seed", type=int, default=7, help="--demo: random seed")
    args = parser.parse_args(argv)
    if args.demo:
        run_demo(args)
        return 0
    if args.history and args.parquet_in:
        parser.error("--history and --parquet-in are two sources: give one")
    if not args.queue and not args.history:
        parser.error("--queue is required (unless --demo or --history)")
    if not args.parquet_in and not args.history:
        args.url = args.url or os.environ.get("PANQUEUE_URL")
        if not args.url:
            parser.error("--url (or PANQUEUE_URL) is required unless --parquet-in or "
                         "--history is given")
    run_analytics(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
