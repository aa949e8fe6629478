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
Their classes are in :mod:`panqueue.spark_sources`; they reuse this module's schemas, its row
conversions and :class:`EnqueuePlan` (the per-partition enqueueing of ``enqueue_dataframe``).
The split: here the functions and what they share, there only the Data Source API's classes.

Needs the ``spark`` extra (``pip install 'panqueue[spark]'``). Longer than our usual 400 lines:
the three functions share their Spark plumbing (schemas, conversions, the driver's and
executors' connections), which the data sources use too.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import random
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import types as T

from panqueue._check import check_int
from panqueue._job import JobInfo, JobState
from panqueue._keys import QueueKeys, check_queue_name
from panqueue._options import Backoff
from panqueue._producer import SyncProducer, Target, target
from panqueue._store import check_url, ops
from panqueue._url import resolve_url
from panqueue.errors import ConfigError

__all__ = ["HISTORY_SCHEMA", "JOB_SCHEMA", "EnqueuePlan", "EnqueueStats", "HistoryExport",
           "converter", "enqueue_dataframe", "export_history", "plan_enqueue", "read_jobs",
           "register"]


@dataclass(frozen=True, slots=True)
class EnqueueStats:
    """What ``enqueue_dataframe`` did: jobs created, and rows whose job already existed."""

    added: int
    existing: int


# --------------------------------------------------------------------------- rows to payloads

_ID_TYPES = (T.StringType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType,
             T.DateType, T.TimestampNTZType)
_SCALARS = (T.StringType, T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType,
            T.FloatType, T.DoubleType, T.DecimalType, T.DateType, T.TimestampType,
            T.TimestampNTZType, T.NullType)


def _check_type(data_type: T.DataType, path: str) -> None:
    """Refuse, before anything is written, a column with no JSON form (binary, intervals...)."""
    if isinstance(data_type, T.StructType):
        for struct_field in data_type.fields:
            _check_type(struct_field.dataType, f"{path}.{struct_field.name}")
    elif isinstance(data_type, T.ArrayType):
        _check_type(data_type.elementType, f"{path}[]")
    elif isinstance(data_type, T.MapType):
        if not isinstance(data_type.keyType, T.StringType):
            raise ConfigError(f"column {path!r} is a map with {data_type.keyType.simpleString()} "
                              "keys; only string keys have a JSON form")
        _check_type(data_type.valueType, f"{path}{{}}")
    elif not isinstance(data_type, _SCALARS):
        raise ConfigError(f"column {path!r} has type {data_type.simpleString()}, which has no "
                          "JSON form (drop or convert it before enqueueing)")


Converter = Callable[[Any], Any]


def converter(data_type: T.DataType) -> Converter:
    """A function turning values of a Spark type into JSON-compatible data: dates and
    timestamps as ISO-8601 strings (``timestamp`` in UTC with its offset, ``timestamp_ntz`` as
    written), decimals as strings, structs and maps as dicts, arrays as lists, NaN/inf as null."""
    if isinstance(data_type, T.StructType):
        fields = [(f.name, converter(f.dataType)) for f in data_type.fields]

        def struct(value: Any) -> Any:
            if value is None:
                return None
            return {name: convert(value[name]) for name, convert in fields}

        return struct
    if isinstance(data_type, T.ArrayType):
        element = converter(data_type.elementType)
        return lambda value: None if value is None else [element(v) for v in value]
    if isinstance(data_type, T.MapType):
        item = converter(data_type.valueType)
        return lambda value: None if value is None else {
            str(k): item(v) for k, v in value.items()}
    if isinstance(data_type, T.TimestampType):
        # PySpark hands these over as naive datetimes in the process's local time zone.
        return lambda value: None if value is None else value.astimezone(dt.UTC).isoformat()
    if isinstance(data_type, (T.DateType, T.TimestampNTZType)):
        return lambda value: None if value is None else value.isoformat()
    if isinstance(data_type, T.DecimalType):
        return lambda value: None if value is None else str(value)
    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        return lambda value: value if value is None or math.isfinite(value) else None
    return lambda value: value


def _job_id(id_column: str, value: Any) -> str:
    if isinstance(value, (dt.datetime, dt.date)):
        value = value.isoformat()
    return f"{id_column}:{value}"


# --------------------------------------------------------------------------- enqueue


def enqueue_dataframe(
    df: DataFrame,
    queue: str,
    *,
    url: str | None = None,
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
    row. ``mode`` ('global' or 'keyed') refuses a queue stored with the other mode. Raises
    ConfigError before writing anything if a column has no JSON form.
    """
    plan = plan_enqueue(df.schema, queue, url=url, id_column=id_column,
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


@dataclass(frozen=True, slots=True)
class EnqueuePlan:
    """How rows of one schema become jobs of one queue, checked on the driver
    (:func:`plan_enqueue`); :meth:`add_rows` runs in the executors. Shared by
    ``enqueue_dataframe`` and the ``panqueue`` data source's writer."""

    url: str
    to: Target
    to_data: Converter
    batch_size: int
    id_column: str | None
    data_column: str | None
    key_column: str | None
    priority_column: str | None
    delay_column: str | None

    def add_rows(self, rows: Iterable[Row]) -> tuple[int, int]:
        """Enqueue ``rows`` in batches of ``batch_size``: (jobs added, rows whose job existed)."""
        id_column, data_column = self.id_column, self.data_column
        added = existing = 0
        batch = []
        # Where this task's rows without id or key start: tasks spread over the partitions.
        with SyncProducer(self.url, spread=random.randrange(1 << 16)) as producer:
            # A partitioned queue: each batch goes out as one script call per partition,
            # pipelined (one round trip per node of a cluster), routed by the queue's layout
            # (read again if it changes meanwhile).
            def add(jobs: list[ops.NewJob]) -> int:
                return sum(c for _, c in producer.run(producer.add(self.to, jobs)))

            for row in rows:
                values = row.asDict(recursive=False)
                data = self.to_data(values[data_column] if data_column else row)
                options: dict[str, Any] = {}
                if id_column is not None:
                    if values[id_column] is None:
                        raise ConfigError(f"a row has a null {id_column!r} (id_column): every "
                                          "row needs an id; rows before it were enqueued")
                    options["job_id"] = _job_id(id_column, values[id_column])
                if self.key_column is not None and values[self.key_column] is not None:
                    options["key"] = str(values[self.key_column])
                if self.priority_column is not None and values[self.priority_column] is not None:
                    options["priority"] = int(values[self.priority_column])
                if self.delay_column is not None and values[self.delay_column] is not None:
                    options["delay"] = float(values[self.delay_column])
                batch.append(ops.new_job(self.to.defaults, data, options))
                if len(batch) >= self.batch_size:
                    created = add(batch)
                    added, existing = added + created, existing + len(batch) - created
                    batch = []
            if batch:
                created = add(batch)
                added, existing = added + created, existing + len(batch) - created
        return added, existing


def plan_enqueue(schema: T.StructType, queue: str, *, url: str | None = None,
                 id_column: str | None = None, data_column: str | None = None,
                 batch_size: int = 1000, priority: int | None = None,
                 delay: float | None = None, attempts: int | None = None,
                 backoff: Backoff | None = None, timeout: float | None = None,
                 key_column: str | None = None, priority_column: str | None = None,
                 delay_column: str | None = None, mode: str = "") -> EnqueuePlan:
    """Check the arguments of :func:`enqueue_dataframe` against the rows' ``schema``: a
    ConfigError here means nothing was written."""
    defaults = {k: v for k, v in dict(priority=priority, delay=delay, attempts=attempts,
                                      backoff=backoff, timeout=timeout).items() if v is not None}
    to = target(queue, {**defaults, "mode": mode})  # checks the mode and the queue's name
    url = check_url(resolve_url(url))
    check_int(batch_size, "batch_size", low=1)
    columns = schema.fieldNames()
    for name, column in (("id_column", id_column), ("data_column", data_column),
                         ("key_column", key_column), ("priority_column", priority_column),
                         ("delay_column", delay_column)):
        if column is not None and column not in columns:
            raise ConfigError(f"{name} {column!r} is not a column of the DataFrame "
                              f"(columns: {', '.join(columns)})")
    for struct_field in schema.fields:
        if data_column is None or struct_field.name == data_column:
            _check_type(struct_field.dataType, struct_field.name)
        if struct_field.name == id_column and not isinstance(struct_field.dataType, _ID_TYPES):
            raise ConfigError(f"id_column {id_column!r} has type "
                              f"{struct_field.dataType.simpleString()}; ids come from strings, "
                              "integers, decimals or dates")
    data_type = schema if data_column is None else schema[data_column].dataType
    ops.new_job(to.defaults, None, {})  # validates the options on the driver
    return EnqueuePlan(url, to, converter(data_type), batch_size, id_column, data_column,
                       key_column, priority_column, delay_column)


# --------------------------------------------------------------------------- read

JOB_SCHEMA = T.StructType([
    T.StructField("id", T.StringType(), False),
    T.StructField("queue", T.StringType(), False),
    T.StructField("state", T.StringType(), False),
    T.StructField("attempts", T.IntegerType(), False),
    T.StructField("priority", T.IntegerType(), False),
    T.StructField("enqueued_at", T.TimestampType(), True),
    T.StructField("started_at", T.TimestampType(), True),
    T.StructField("finished_at", T.TimestampType(), True),
    T.StructField("wait_ms", T.DoubleType(), True),
    T.StructField("run_ms", T.DoubleType(), True),
    T.StructField("error_type", T.StringType(), True),
    T.StructField("error_message", T.StringType(), True),
    T.StructField("failure_reason", T.StringType(), True),
    T.StructField("data", T.StringType(), True),
])

_READ_BATCH = 500


def _ms_between(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds() * 1000


def job_record(info: JobInfo) -> tuple[Any, ...]:
    """A job as a row of ``JOB_SCHEMA`` (read_jobs and the ``panqueue`` data source)."""
    return (info.id, info.queue, info.state.value, info.attempts, info.priority,
            info.enqueued_at, info.started_at, info.finished_at,
            _ms_between(info.enqueued_at, info.started_at),
            _ms_between(info.started_at, info.finished_at),
            None if info.error is None else info.error.type,
            None if info.error is None else info.error.message,
            info.failure_reason, json.dumps(info.data))


def read_jobs(spark: SparkSession, queue: str, *, url: str | None = None,
              states: Iterable[JobState | str] | None = None,
              partitions: int | None = None) -> DataFrame:
    """A DataFrame with one row per job of ``queue`` (schema: ``JOB_SCHEMA``).

    The ids are listed once on the driver; the records are read by the executors in pipelined
    batches. Jobs removed between listing and reading are skipped.
    """
    url = check_url(resolve_url(url))
    wanted = list(JobState) if states is None else [JobState(s) for s in states]
    with SyncProducer(url) as producer:
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
        with SyncProducer(url) as producer:
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

HISTORY_SCHEMA = T.StructType([
    T.StructField("id", T.StringType(), False),
    T.StructField("queue", T.StringType(), False),
    T.StructField("state", T.StringType(), False),
    T.StructField("attempts", T.IntegerType(), False),
    T.StructField("enqueued_at", T.TimestampType(), True),
    T.StructField("started_at", T.TimestampType(), True),
    T.StructField("finished_at", T.TimestampType(), False),
    T.StructField("wait_ms", T.DoubleType(), True),
    T.StructField("run_ms", T.DoubleType(), True),
    T.StructField("error_type", T.StringType(), True),
    T.StructField("error_message", T.StringType(), True),
    T.StructField("failure_reason", T.StringType(), True),
    T.StructField("worker", T.StringType(), True),
    T.StructField("entry", T.StringType(), False),
])
# A batch as the driver ships it: plain values (times in ms); the JVM derives the rest.
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
                   path: str | os.PathLike[str], batch_size: int = _EXPORT_BATCH
                   ) -> HistoryExport:
    """Append the records of ``queue``'s history stream that no export has written yet to the
    Parquet dataset at ``path`` (``HISTORY_SCHEMA``, partitioned by ``date`` of ``finished_at``
    in UTC, then by ``batch``), and acknowledge them.

    Records are read on the driver, ``batch_size`` at a time, through the stream's ``export``
    consumer group. A batch is acknowledged only after its write committed; an export that
    failed leaves its batch pending, and the next export writes that same batch again first,
    over the same directories: each record lands in the dataset once. Run one export of a queue
    at a time.
    """
    if not isinstance(spark, SparkSession):
        raise ConfigError(f"spark must be a SparkSession, got {spark!r}")
    check_queue_name(queue)
    url = check_url(resolve_url(url))
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"path must be a non-empty str or path (where the Parquet dataset "
                          f"goes), got {path!r}")
    check_int(batch_size, "batch_size", low=1)
    exported = batches = lost = 0
    with SyncProducer(url) as producer:
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
