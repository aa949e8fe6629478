"""PySpark integration: enqueue a DataFrame's rows as jobs, and read job records back.

``enqueue_dataframe`` writes from the Spark executors (each partition opens its own
``SyncQueueClient`` and adds its rows in batches of ``batch_size``, one script call each);
nothing is collected to the driver. With ``id_column`` the job ids are derived from that column,
so a re-run job or a retried/speculative task adds nothing twice.

``read_jobs`` lists a queue's job ids once on the driver, then reads the job records in
parallel, in pipelined batches, into a DataFrame with a fixed schema (``JOB_SCHEMA``).

``export_history`` appends the records of a queue's history stream (one per finished job) that
no export has written yet to a Parquet dataset partitioned by date (``HISTORY_SCHEMA``), and
acknowledges them only once the write has committed.

``register(spark)`` registers the Spark data sources ``panqueue`` and ``panqueue-history``
(``spark.read/write.format("panqueue")``, ``spark.readStream.format("panqueue-history")``).
Their classes are in :mod:`panqueue.spark_sources`. What the functions and the data sources
share (the schemas, the row conversions and :class:`EnqueuePlan`, the per-partition enqueueing
of ``enqueue_dataframe``) is in ``panqueue._spark_rows``, which both import, and this module
re-exports.

Needs the ``spark`` extra (``pip install 'panqueue[spark]'``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import types as T

from panqueue._check import check_int
from panqueue._job import JobState
from panqueue._keys import QueueKeys, check_queue_name
from panqueue._options import Backoff
from panqueue._producer import SyncProducer
from panqueue._spark_rows import (
    HISTORY_SCHEMA,
    JOB_SCHEMA,
    EnqueuePlan,
    Server,
    converter,
    job_record,
    plan_enqueue,
)
from panqueue._store import ops
from panqueue.errors import ConfigError

__all__ = ["HISTORY_SCHEMA", "JOB_SCHEMA", "EnqueuePlan", "EnqueueStats", "HistoryExport",
           "converter", "enqueue_dataframe", "export_history", "plan_enqueue", "read_jobs",
           "register"]


@dataclass(frozen=True, slots=True)
class EnqueueStats:
    """What ``enqueue_dataframe`` did: jobs created, and rows whose job already existed."""

    added: int
    existing: int


# --------------------------------------------------------------------------- enqueue


def enqueue_dataframe(
    df: DataFrame,
    queue: str,
    *,
    url: str | None = None,
    prefix: str | None = None,
    id_column: str | None = None,
    data_column: str | None = None,
    batch_size: int = 1000,
    priority: int | None = None,
    delay: float | None = None,
    attempts: int | None = None,
    backoff: Backoff | None = None,
    timeout: float | None = None,
    key_column: str | None = None,
    priority_column: str | None = None,
    delay_column: str | None = None,
    mode: str = "",
) -> EnqueueStats:
    """Enqueue one job per row, from the Spark executors in parallel.

    Each job's data is the row as a dict (or ``data_column``'s value). With ``id_column`` the
    job id is ``"<id_column>:<value>"``: re-running, or Spark retrying a task, reports those
    rows as ``existing`` instead of adding them again. ``priority``/``delay``/``attempts``/...
    apply to every row; ``key_column``, ``priority_column`` and ``delay_column`` set them per
    row. ``mode`` ('global' or 'keyed') refuses a queue stored with the other mode. ``url``
    defaults to ``$PANQUEUE_URL``, ``prefix`` (the key prefix, as ``QueueClient(prefix=...)``)
    to ``$PANQUEUE_PREFIX``, both read on the driver. Raises ConfigError before writing
    anything if a column has no JSON form.
    """
    plan = plan_enqueue(df.schema, queue, url=url, prefix=prefix, id_column=id_column,
                        data_column=data_column, batch_size=batch_size, priority=priority,
                        delay=delay, attempts=attempts, backoff=backoff, timeout=timeout,
                        key_column=key_column, priority_column=priority_column,
                        delay_column=delay_column, mode=mode)
    if id_column is None:
        warnings.warn(
            "enqueue_dataframe without id_column: a Spark task that is retried (or run "
            "speculatively) adds its rows again; pass id_column for exactly-once enqueueing",
            stacklevel=2)

    def add_partition(rows: Iterable[Row]) -> Iterator[tuple[int, int]]:
        yield plan.add_rows(rows)

    totals = df.rdd.mapPartitions(add_partition).fold((0, 0), lambda a, b: (a[0] + b[0],
                                                                            a[1] + b[1]))
    return EnqueueStats(added=totals[0], existing=totals[1])


_READ_BATCH = 500


def read_jobs(spark: SparkSession, queue: str, *, url: str | None = None,
              prefix: str | None = None, states: Iterable[JobState | str] | None = None,
              partitions: int | None = None) -> DataFrame:
    """A DataFrame with one row per job of ``queue`` (schema: ``JOB_SCHEMA``).

    The ids are listed once on the driver; the records are read by the executors in pipelined
    batches. Jobs removed between listing and reading are skipped. ``url`` and ``prefix`` as
    for :func:`enqueue_dataframe`.
    """
    server = Server.resolve(url, prefix)
    wanted = list(JobState) if states is None else [JobState(s) for s in states]
    with server.producer() as producer:
        parts = producer.run(producer.partitions(queue))
        # A job moving between states while the states are listed can be listed twice.
        ids = list(dict.fromkeys((keys.partition, job_id) for keys in parts
                                 for state in wanted
                                 for job_id in producer.run(ops.list_ids(keys, state, None))))
    wanted_states = frozenset(wanted)
    slices = partitions or max(1, min(spark.sparkContext.defaultParallelism * 4,
                                      len(ids) // _READ_BATCH + 1))

    def read_partition(part: Iterable[tuple[int, str]]) -> Iterator[tuple[Any, ...]]:
        chunks: dict[int, list[str]] = {}  # by the queue partition that holds the jobs
        with server.producer() as producer:
            for partition, job_id in part:
                chunk = chunks.setdefault(partition, [])
                chunk.append(job_id)
                if len(chunk) >= _READ_BATCH:
                    yield from _read_chunk(producer, parts[partition], chunk, wanted_states)
                    chunk.clear()
            for partition, chunk in chunks.items():
                if chunk:
                    yield from _read_chunk(producer, parts[partition], chunk, wanted_states)

    rdd = spark.sparkContext.parallelize(ids, slices).mapPartitions(read_partition)
    return spark.createDataFrame(rdd, JOB_SCHEMA)


def _read_chunk(producer: SyncProducer, keys: QueueKeys, ids: list[str],
                states: frozenset[JobState]) -> Iterator[tuple[Any, ...]]:
    # Skips jobs removed since the listing, and jobs that moved to a state not asked for.
    for info in producer.run(ops.read_jobs(keys, ids, states=states, logs=False)):
        yield job_record(info)


# --------------------------------------------------------------------------- history export

_RECORD_SCHEMA = T.StructType([
    T.StructField("id", T.StringType(), False),
    T.StructField("state", T.StringType(), False),
    T.StructField("attempts", T.IntegerType(), False),
    T.StructField("enqueued_ms", T.LongType(), True),
    T.StructField("started_ms", T.LongType(), True),
    T.StructField("finished_ms", T.LongType(), False),
    T.StructField("failure_reason", T.StringType(), True),
    T.StructField("error_type", T.StringType(), True),
    T.StructField("error_message", T.StringType(), True),
    T.StructField("worker", T.StringType(), True),
    T.StructField("entry", T.StringType(), False),
])
_EXPORT_BATCH = 100_000
_ROWS_PER_SLICE = 50_000


@dataclass(frozen=True, slots=True)
class HistoryExport:
    """What ``export_history`` did: records written (and acknowledged), in how many batches,
    and records the stream dropped (``Retention.history``) before any export wrote them."""

    exported: int
    batches: int
    lost: int


def _history_row(record: ops.HistoryRecord) -> tuple[Any, ...]:
    return (record.id, record.state, record.attempts, record.enqueued_ms, record.started_ms,
            record.finished_ms, record.reason, record.error_type, record.error_message,
            record.worker, record.entry)


def _write_batch(spark: SparkSession, queue: str, batch: str, rows: list[tuple[Any, ...]],
                 path: str) -> None:
    """Write one batch's rows under ``path/date=.../batch=.../``. Dynamic partition overwrite
    replaces exactly the (date, batch) directories of these rows: writing the same batch again
    (a re-run after a failure) replaces its files instead of adding a second copy, and leaves
    every other batch alone."""
    from pyspark.sql import functions as F

    slices = max(1, min(spark.sparkContext.defaultParallelism,
                        len(rows) // _ROWS_PER_SLICE + 1))
    # Plain values, unverified (the driver built them): a third of the time of datetimes.
    raw = spark.createDataFrame(spark.sparkContext.parallelize(rows, slices), _RECORD_SCHEMA,
                                verifySchema=False)
    enqueued, started, finished = F.col("enqueued_ms"), F.col("started_ms"), F.col("finished_ms")
    frame = raw.select(
        "id", F.lit(queue).alias("queue"), "state", "attempts",
        F.timestamp_millis(enqueued).alias("enqueued_at"),
        F.timestamp_millis(started).alias("started_at"),
        F.timestamp_millis(finished).alias("finished_at"),
        (started - enqueued).cast("double").alias("wait_ms"),
        (finished - started).cast("double").alias("run_ms"),
        "error_type", "error_message", "failure_reason", "worker", "entry",
        # The UTC date, whatever the session's time zone.
        F.expr("date_from_unix_date(cast(floor(finished_ms / 86400000) as int))").alias("date"),
        F.lit(batch).alias("batch"))
    (frame.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
     .partitionBy("date", "batch").parquet(path))


def export_history(spark: SparkSession, queue: str, *, url: str | None = None,
                   prefix: str | None = None, path: str | os.PathLike[str],
                   batch_size: int = _EXPORT_BATCH) -> HistoryExport:
    """Append the records of ``queue``'s history stream that no export has written yet to the
    Parquet dataset at ``path`` (``HISTORY_SCHEMA``, partitioned by ``date`` of ``finished_at``
    in UTC, then by ``batch``), and acknowledge them.

    Records are read on the driver, ``batch_size`` at a time, through the stream's ``export``
    consumer group. A batch is acknowledged only after its write committed; an export that
    failed leaves its batch pending, and the next export writes that same batch again first,
    over the same directories: each record lands in the dataset once. Run one export of a queue
    at a time. ``url`` and ``prefix`` as for :func:`enqueue_dataframe`.
    """
    if not isinstance(spark, SparkSession):
        raise ConfigError(f"spark must be a SparkSession, got {spark!r}")
    check_queue_name(queue)
    server = Server.resolve(url, prefix)
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"path must be a non-empty str or path (where the Parquet dataset "
                          f"goes), got {path!r}")
    check_int(batch_size, "batch_size", low=1)
    exported = batches = lost = 0
    with server.producer() as producer:
        # A partitioned queue has a stream per partition; stream ids of different partitions
        # may be equal, so their batches are named after the partition too.
        parts = producer.run(producer.partitions(queue))
        for keys in parts:
            producer.run(ops.open_history_export(keys))
            while True:
                batch = producer.run(ops.read_history(keys, batch_size))
                if not batch.entries:
                    break
                lost += batch.skipped + batch.trimmed
                if batch.records:
                    name = batch.name if len(parts) == 1 else f"p{keys.partition}_{batch.name}"
                    _write_batch(spark, queue, name, [_history_row(r) for r in batch.records],
                                 path)
                producer.run(ops.acknowledge_history(keys, batch.entries))
                exported += len(batch.records)
                batches += 1
    return HistoryExport(exported=exported, batches=batches, lost=lost)


# --------------------------------------------------------------------------- data sources


def register(spark: SparkSession) -> None:
    """Register the data sources ``panqueue`` (read job records, enqueue rows) and
    ``panqueue-history`` (stream the job history) with ``spark``, and turn on
    ``spark.sql.python.filterPushdown.enabled`` in its session: the ``panqueue`` reader takes
    its ``state`` and ``finished_at`` filters from Spark (``pushFilters``), which PySpark
    refuses to plan with that setting off. (``.option("pushdown", "false")`` reads without.)
    The classes are in :mod:`panqueue.spark_sources`."""
    if not isinstance(spark, SparkSession):
        raise ConfigError(f"spark must be a SparkSession, got {spark!r}")
    from panqueue.spark_sources import HistoryDataSource, JobsDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(JobsDataSource)
    spark.dataSource.register(HistoryDataSource)
