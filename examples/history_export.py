"""Job history: every finished job's record goes to the queue's history stream, and
``export_history`` appends the records not yet exported to a Parquet dataset, once each.

Needs the ``spark`` extra (``pip install 'panqueue[spark]'``) and Java 17. A worker runs 60 jobs
(every 10th fails), the export writes their records to Parquet, a second export finds nothing
new, and Spark reads the dataset back. Spark runs in local mode here (``local[2]``, loopback
only); docs/spark.md shows the same export as a scheduled ``spark-submit`` on a cluster.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/history_export.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import os
import sys
import tempfile

import anyio
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from panqueue import Job, QueueClient, Registry, Retention, Worker
from panqueue.embedded import url_or_private_server
from panqueue.spark import export_history

queues = Registry()


# Retention(history=) bounds the history stream; the completed jobs themselves are kept only
# 10 here, yet every one of them reaches the export.
@queues.handler("orders", concurrency=8, retention=Retention(completed=10, history=10_000))
async def ship(job: Job) -> str:
    if job.data % 10 == 0:
        raise ValueError(f"order {job.data} has no address")
    return f"shipped {job.data}"


async def run_jobs(url: str) -> None:
    """Add 60 jobs and run them to their end with one worker."""
    async with QueueClient(url) as client, anyio.create_task_group() as tg:
        worker = Worker(queues, "orders", url=url)
        tg.start_soon(worker.run)
        handles = await client.queue("orders").add_bulk(list(range(1, 61)))
        for handle in handles:
            try:
                await handle.result(timeout=30)
            except Exception:  # the failed ones: their record says why
                pass
        await worker.shutdown(5)


def spark_session() -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]")
             .appName("panqueue-history-example")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    return spark


def main() -> None:
    with url_or_private_server() as url:
        anyio.run(run_jobs, url)
        spark = spark_session()
        try:
            with tempfile.TemporaryDirectory() as out:
                path = os.path.join(out, "orders-history")
                first = export_history(spark, "orders", url=url, path=path)
                print(f"first export: {first.exported} records in {first.batches} batch(es), "
                      f"{first.lost} lost")
                again = export_history(spark, "orders", url=url, path=path)
                print(f"second export: {again.exported} new records")

                history = spark.read.parquet(path)
                totals = history.agg(F.count("*").alias("records"),
                                     F.countDistinct("id").alias("jobs")).first()
                assert totals is not None
                print(f"the dataset holds {totals['records']} records, {totals['jobs']} jobs")
                for row in history.groupBy("state", "error_type").count().orderBy(
                        "state").collect():
                    print(f"  {row['state']:<10} {row['error_type'] or '-':<12} {row['count']}")
                worst = history.orderBy(history.run_ms.desc()).first()
                assert worst is not None
                print(f"slowest run: job {worst['id']} on worker {worst['worker']!r}, "
                      f"{worst['run_ms']:.0f} ms")
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
    print("done")
