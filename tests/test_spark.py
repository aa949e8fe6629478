"""panqueue.spark on a real local[2] SparkSession and a private Redis."""

from __future__ import annotations

import datetime as dt
import decimal
import signal
import subprocess
import warnings

import pytest
import redis
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from panqueue import ConfigError, JobState, SyncQueueClient
from panqueue.spark import JOB_SCHEMA, enqueue_dataframe, read_jobs
from tests.helpers import panqueue_command, subprocess_env, wait_until


def test_rows_become_jobs_with_json_compatible_data_and_reruns_add_nothing(
        spark: SparkSession, redis_url: str) -> None:
    schema = T.StructType([
        T.StructField("user_id", T.LongType()),
        T.StructField("name", T.StringType()),
        T.StructField("signed_up", T.DateType()),
        T.StructField("seen", T.TimestampType()),
        T.StructField("balance", T.DecimalType(10, 2)),
        T.StructField("tags", T.ArrayType(T.StringType())),
        T.StructField("address", T.StructType([T.StructField("city", T.StringType())])),
        T.StructField("prefs", T.MapType(T.StringType(), T.IntegerType())),
        T.StructField("score", T.DoubleType()),
    ])
    rows = [(n, f"user {n}", dt.date(2026, 1, 1 + n % 28),
             dt.datetime(2026, 1, 1, 12, 0, n % 60, tzinfo=dt.UTC),
             decimal.Decimal("10.50") + n, ["a", str(n)], (f"city {n % 3}",), {"x": n}, n / 2)
            for n in range(1000)]
    df = spark.createDataFrame(rows, schema).repartition(4)
    stats = enqueue_dataframe(df, "users", url=redis_url, id_column="user_id", batch_size=64,
                              priority=3, attempts=2)
    assert (stats.added, stats.existing) == (1000, 0)
    again = enqueue_dataframe(df, "users", url=redis_url, id_column="user_id", batch_size=64)
    assert (again.added, again.existing) == (0, 1000)
    with SyncQueueClient(redis_url) as client:
        assert client.counts("users")[JobState.WAITING] == 1000
        info = client.get_job("users", "user_id:7")
    assert info.data == {
        "user_id": 7, "name": "user 7", "signed_up": "2026-01-08",
        "seen": "2026-01-01T12:00:07+00:00", "balance": "17.50", "tags": ["a", "7"],
        "address": {"city": "city 1"}, "prefs": {"x": 7}, "score": 3.5}
    assert info.priority == 3 and info.options == {"attempts": 2}


def test_a_retried_task_enqueues_every_row_exactly_once(spark: SparkSession, redis_url: str,
                                                        redis_client: redis.Redis) -> None:
    @F.udf(T.LongType(), useArrow=False)
    def fail_first_attempt(n):  # type: ignore[no-untyped-def]  # hints would make Spark guess a UDF kind
        # The first attempt of each task dies late in its partition: by then the writer has
        # enqueued thousands of the partition's rows (asserted below: existing > 0).
        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0 and n % 20_000 == 19_000:
            raise RuntimeError("simulated executor failure")
        return n

    df = (spark.range(0, 40_000, numPartitions=2)
          .withColumn("n", fail_first_attempt(F.col("id"))).drop("id"))
    stats = enqueue_dataframe(df, "retried", url=redis_url, id_column="n", batch_size=200)
    assert stats.added + stats.existing == 40_000
    assert stats.existing > 0  # the failed attempts had written part of their partitions
    with SyncQueueClient(redis_url) as client:
        assert client.counts("retried")[JobState.WAITING] == 40_000
    ids = {k.decode().rsplit(":", 1)[1]
           for k in redis_client.scan_iter(match="{q:retried}:job:*", count=1000)}
    assert ids == {str(n) for n in range(40_000)}


def test_unsupported_column_fails_before_anything_is_written(
        spark: SparkSession, redis_url: str, redis_client: redis.Redis) -> None:
    df = spark.createDataFrame([(1, bytearray(b"raw"))], "id long, blob binary")
    with pytest.raises(ConfigError, match="column 'blob' has type binary"):
        enqueue_dataframe(df, "bad", url=redis_url, id_column="id")
    nested = spark.createDataFrame([(1, [(bytearray(b"x"),)])],
                                   "id long, items array<struct<b: binary>>")
    with pytest.raises(ConfigError, match=r"column 'items\[\]\.b' has type binary"):
        enqueue_dataframe(nested, "bad", url=redis_url, id_column="id")
    with pytest.raises(ConfigError, match="id_column 'nope' is not a column"):
        enqueue_dataframe(df, "bad", url=redis_url, id_column="nope")
    assert redis_client.dbsize() == 0
    with_nulls = spark.createDataFrame([(None, "a")], "id long, v string").coalesce(1)
    with pytest.raises(Exception, match="a row has a null 'id' \\(id_column\\)"):
        enqueue_dataframe(with_nulls, "bad", url=redis_url, id_column="id")


def test_without_id_column_a_warning_says_what_a_retry_can_do(spark: SparkSession,
                                                              redis_url: str) -> None:
    df = spark.range(10).withColumnRenamed("id", "n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stats = enqueue_dataframe(df, "plain", url=redis_url, data_column="n",
                                  priority_column="n")
    assert stats.added == 10
    assert any("adds its rows again" in str(w.message) for w in caught)
    with SyncQueueClient(redis_url) as client:
        infos = [client.get_job("plain", str(i)) for i in range(1, 11)]
    assert sorted(i.data for i in infos) == list(range(10))
    assert {i.priority for i in infos} == set(range(10))


def test_read_jobs_returns_the_documented_schema_for_every_state(
        spark: SparkSession, redis_url: str) -> None:
    rows = [(n, n % 10 == 0) for n in range(200)]
    df = spark.createDataFrame(rows, "n long, fail boolean")
    enqueue_dataframe(df, "spark-jobs", url=redis_url, id_column="n")
    worker = subprocess.Popen(panqueue_command("worker", "spark_app:queues", "--url", redis_url,
                                               "--log-level", "error"),
                              env=subprocess_env(PANQUEUE_URL=redis_url))
    try:
        with SyncQueueClient(redis_url) as client:
            wait_until(lambda: client.counts("spark-jobs")[JobState.COMPLETED] == 180,
                       timeout=60, what="the worker to finish")
            wait_until(lambda: client.counts("spark-jobs")[JobState.FAILED] == 20, timeout=30,
                       what="the failures to be recorded")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    jobs = read_jobs(spark, "spark-jobs", url=redis_url)
    assert jobs.schema == JOB_SCHEMA
    by_state = {r["state"]: r["count"] for r in jobs.groupBy("state").count().collect()}
    assert by_state == {"completed": 180, "failed": 20}
    failed = jobs.filter("state = 'failed'").select("error_type", "failure_reason").distinct()
    assert {(r.error_type, r.failure_reason) for r in failed.collect()} == {
        ("ValueError", "max_attempts_exceeded")}
    done = jobs.filter("state = 'completed'").first()
    assert done is not None and done.wait_ms >= 0 and done.run_ms >= 0
    assert done.enqueued_at <= done.started_at <= done.finished_at
    only_failed = read_jobs(spark, "spark-jobs", url=redis_url, states=["failed"])
    assert only_failed.count() == 20
