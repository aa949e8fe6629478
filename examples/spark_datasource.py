"""Spark data sources: write rows as jobs, read job records with filters pushed down to Redis,
and stream the history of finished jobs into a Parquet sink, once per record.

Needs the ``spark`` extra (``pip install 'panqueue[spark]'``) and Java 17. Spark runs in local
mode here (``local[2]``, loopback only).

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/spark_datasource.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

import anyio
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from panqueue import Job, Registry
from panqueue.embedded import RedisServer
from panqueue.spark import register
from panqueue.testing import drain, run_worker

registry = Registry()


@registry.handler("invoices", attempts=1)
async def send_invoice(job: Job) -> None:
    if job.data["amount"] % 7 == 0:
        raise ValueError("amount refused by the payment provider")


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """PANQUEUE_URL if set, else a private server started (and stopped) here."""
    url = os.environ.get("PANQUEUE_URL")
    if url:
        yield url
        return
    with RedisServer(appendonly=False) as server:
        print(f"started a private server on {server.url}")
        yield server.url


def spark_session() -> SparkSession:
    # The Python workers Spark starts must be this interpreter (it has panqueue installed).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]")
             .appName("panqueue-datasource-example")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    return spark


def run_worker_until_drained(url: str) -> None:
    async def main() -> None:
        async with run_worker(registry, "invoices", url, concurrency=8):
            await drain(url, "invoices", timeout=60)

    anyio.run(main)


def stream_history(spark: SparkSession, url: str, out: str, checkpoint: str) -> int:
    """One run of a streaming query: what the history stream holds past the checkpoint's
    offsets, appended to the Parquet sink. Returns the rows the sink holds."""
    history = (spark.readStream.format("panqueue-history").option("url", url)
               .option("queue", "invoices").load())
    query = (history.writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    return spark.read.parquet(out).count()


def main() -> None:
    spark = spark_session()
    register(spark)  # format("panqueue") and format("panqueue-history")
    try:
        with redis_url() as url, tempfile.TemporaryDirectory() as tmp:
            invoices = (spark.range(1, 101, numPartitions=4).withColumnRenamed("id", "invoice")
                        .withColumn("amount", F.col("invoice") * 3))
            writer = (invoices.write.format("panqueue").mode("append")  # append: required
                      .option("url", url).option("queue", "invoices")
                      .option("id_column", "invoice").option("batch_size", "25"))
            writer.save()
            writer.save()  # a re-run: the ids exist, nothing is added twice
            jobs = (spark.read.format("panqueue").option("url", url)
                    .option("queue", "invoices").load())
            print(f"written twice, enqueued once: {jobs.count()} jobs")
            try:
                invoices.write.format("panqueue").option("url", url).option(
                    "queue", "invoices").save()
            except Exception as exc:  # Spark's default mode, ErrorIfExists
                print("without mode('append'): refused"
                      + (" (Append)" if "Append" in str(exc) else ""))

            run_worker_until_drained(url)
            out, checkpoint = f"{tmp}/history", f"{tmp}/checkpoint"
            print(f"history streamed: {stream_history(spark, url, out, checkpoint)} records")
            print(f"streamed again: {stream_history(spark, url, out, checkpoint)} records")

            # state = 'failed' is served by Redis: only the failed set's jobs are read.
            failed = jobs.where(F.col("state") == "failed")
            print(f"failed: {failed.count()} jobs")
            for row in (failed.groupBy("error_type").count().orderBy("error_type")
                        .collect()):
                print(f"  {row['error_type']}: {row['count']}")
            recent = jobs.where(F.col("finished_at") >= F.expr("now() - interval 1 hour"))
            print(f"finished in the last hour: {recent.count()} jobs")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
    print("done")
