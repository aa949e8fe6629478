"""Spark: enqueue a DataFrame's rows as jobs from the executors, and read the jobs back.

Needs the ``spark`` extra (``pip install 'panqueue[spark]'``) and Java 17. Spark runs in local
mode here (``local[2]``, loopback only); on a cluster the same calls run on the executors, which
then need network access to Redis and panqueue installed.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/spark_enqueue.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from panqueue.embedded import RedisServer
from panqueue.spark import enqueue_dataframe, read_jobs


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
             .appName("panqueue-example")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    return spark


def main() -> None:
    spark = spark_session()
    try:
        with redis_url() as url:
            # 200 customers, 4 partitions. Every 4th row is delayed by an hour (delay_column).
            customers = (spark.range(1, 201, numPartitions=4)
                         .withColumnRenamed("id", "customer_id")
                         .withColumn("email", F.format_string("user%d@example.com",
                                                              "customer_id"))
                         .withColumn("signed_up", F.date_add(F.lit("2026-01-01").cast("date"),
                                                             F.col("customer_id").cast("int")))
                         .withColumn("delay_s", F.when(F.col("customer_id") % 4 == 0, 3600.0)))

            # id_column: job ids are "customer_id:<value>", so this is safe to re-run.
            stats = enqueue_dataframe(customers, "welcome-emails", url=url,
                                      id_column="customer_id", delay_column="delay_s",
                                      batch_size=50, attempts=3)
            print(f"first run: added={stats.added}, existing={stats.existing}")
            again = enqueue_dataframe(customers, "welcome-emails", url=url,
                                      id_column="customer_id", delay_column="delay_s",
                                      batch_size=50, attempts=3)
            print(f"second run: added={again.added}, existing={again.existing}")

            # Without id_column every run adds new jobs, and a warning says so.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                extra = enqueue_dataframe(customers.limit(5), "welcome-emails", url=url)
            print(f"without id_column: added={extra.added}; warning: "
                  f"{str(caught[0].message).split(':')[0]}")

            jobs = read_jobs(spark, "welcome-emails", url=url)
            print(f"read_jobs: {jobs.count()} jobs")
            for row in jobs.groupBy("state").count().orderBy("state").collect():
                print(f"  {row['state']}: {row['count']}")
            one = jobs.where(F.col("id") == "customer_id:7").first()
            assert one is not None
            print(f"job {one['id']}: state={one['state']}, data={one['data']}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
    print("done")
