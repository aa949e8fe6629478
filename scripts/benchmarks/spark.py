"""Spark (``--spark`` only; not part of the full run; needs the ``spark`` extra and Java 17).

On a server with ``maxmemory 0`` (unlimited):

(a) the single-process baseline: N jobs with ``SyncQueueClient`` ``add_bulk`` in batches of
    1000 (the job data built before the clock starts), then FLUSHDB;
(b) ``panqueue.spark.enqueue_dataframe`` of the same N rows on a ``local[2]`` SparkSession
    (``spark.range`` with 4 partitions and a few derived columns, ``id_column="order_id"``,
    ``batch_size=1000``), the session start and a 10,000-row warm-up excluded;
(c) ``read_jobs(...).count()`` over those N jobs, split into the driver's id listing (the
    ``read_jobs`` call) and the distributed read (``count()``).

N is 1,000,000 (``--quick``: 100,000).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from benchmarks.common import BATCH, Bench, log, print_table, proc_cpu_seconds
from panqueue import SyncQueueClient

SPARK_QUEUE = "bench-spark"


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    bench.redis.flushdb()
    return spark_bench(bench, 100_000 if quick else 1_000_000)


def spark_order(i: int) -> dict[str, Any]:
    """The job data of row ``i`` in the Spark benchmark (the same as the DataFrame's rows)."""
    return {"order_id": i, "customer": f"customer-{i % 50_000}", "amount": (i % 100_000) / 100,
            "country": ("FR", "DE", "GB", "US")[i % 4]}


def spark_bench(bench: Bench, n: int) -> dict[str, Any]:
    """add_bulk baseline, then enqueue_dataframe and read_jobs on a local[2] SparkSession."""
    import warnings

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from panqueue.spark import enqueue_dataframe, read_jobs

    url, r, server_pid = bench.url, bench.redis, bench.server_pid
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


def report(sres: dict[str, Any]) -> None:
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
