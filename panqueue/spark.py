"""PySpark integration: enqueue a DataFrame's rows as jobs, and read job records back.

``enqueue_dataframe`` writes from the Spark executors (each partition opens its own
``SyncQueueClient`` and adds its rows in batches of ``batch_size``, one script call each);
nothing is collected to the driver. With ``id_column`` the job ids are derived from that column,
so a re-run job or a retried/speculative task adds nothing twice.

``read_jobs`` lists a queue's job ids once on the driver, then reads the job records in
parallel, in pipelined batches, into a DataFrame with a fixed schema (``JOB_SCHEMA``).

Needs the ``spark`` extra (``pip install 'panqueue[spark]'``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import types as T

from panqueue._client import _new_job
from panqueue._job import JobInfo, JobState
from panqueue._keys import QueueKeys, check_queue_name
from panqueue._options import Backoff
from panqueue._store import redis_store as ops
from panqueue._store.transport import Batch, Command, SyncTransport, check_url
from panqueue._url import resolve_url
from panqueue.errors import ConfigError, PayloadError

__all__ = ["JOB_SCHEMA", "EnqueueStats", "enqueue_dataframe", "read_jobs"]


@dataclass(frozen=True, slots=True)
class EnqueueStats:
    """What ``enqueue_dataframe`` did: jobs created, and rows whose job already existed."""

    added: int
    existing: int


# --------------------------------------------------------------------------- rows to payloads

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


def to_json_value(value: Any) -> Any:
    """A Spark value as JSON-compatible data: dates and timestamps as ISO-8601 strings,
    decimals as strings, rows/structs as dicts, arrays as lists, maps as dicts."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, Row):
        return {k: to_json_value(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    raise PayloadError(f"value of type {type(value).__name__} has no JSON form")


def _job_id(id_column: str, value: Any) -> str:
    return f"{id_column}:{to_json_value(value)}"


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
) -> EnqueueStats:
    """Enqueue one job per row, from the Spark executors in parallel.

    Each job's data is the row as a dict (or ``data_column``'s value). With ``id_column`` the
    job id is ``"<id_column>:<value>"``: re-running, or Spark retrying a task, reports those
    rows as ``existing`` instead of adding them again. ``priority``/``delay``/``attempts``/...
    apply to every row; ``key_column``, ``priority_column`` and ``delay_column`` set them per
    row. Raises ConfigError before writing anything if a column has no JSON form.
    """
    check_queue_name(queue)
    url = check_url(resolve_url(url))
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be an int >= 1, got {batch_size!r}")
    columns = set(df.columns)
    for name, column in (("id_column", id_column), ("data_column", data_column),
                         ("key_column", key_column), ("priority_column", priority_column),
                         ("delay_column", delay_column)):
        if column is not None and column not in columns:
            raise ConfigError(f"{name} {column!r} is not a column of the DataFrame "
                              f"(columns: {', '.join(df.columns)})")
    payload_fields = [f for f in df.schema.fields if data_column is None or f.name == data_column]
    for struct_field in payload_fields:
        _check_type(struct_field.dataType, struct_field.name)
    defaults = {k: v for k, v in dict(priority=priority, delay=delay, attempts=attempts,
                                      backoff=backoff, timeout=timeout).items() if v is not None}
    _new_job(defaults, None, {})  # validates the options on the driver
    if id_column is None:
        warnings.warn(
            "enqueue_dataframe without id_column: a Spark task that is retried (or run "
            "speculatively) adds its rows again; pass id_column for exactly-once enqueueing",
            stacklevel=2)

    def add_partition(rows: Iterable[Row]) -> Iterator[tuple[int, int]]:
        transport = SyncTransport(url)
        keys = QueueKeys(queue)
        added = existing = 0
        batch = []
        try:
            for row in rows:
                values = row.asDict(recursive=False)
                data = to_json_value(values[data_column] if data_column else values)
                options: dict[str, Any] = {}
                if id_column is not None:
                    if values[id_column] is None:
                        raise ConfigError(f"a row has a null {id_column!r} (id_column): every "
                                          "row needs an id; rows before it were enqueued")
                    options["job_id"] = _job_id(id_column, values[id_column])
                if key_column is not None:
                    options["key"] = str(values[key_column])
                if priority_column is not None and values[priority_column] is not None:
                    options["priority"] = int(values[priority_column])
                if delay_column is not None and values[delay_column] is not None:
                    options["delay"] = float(values[delay_column])
                batch.append(_new_job(defaults, data, options))
                if len(batch) >= batch_size:
                    created = sum(c for _, c in transport.run(ops.add_jobs(keys, batch)))
                    added, existing = added + created, existing + len(batch) - created
                    batch = []
            if batch:
                created = sum(c for _, c in transport.run(ops.add_jobs(keys, batch)))
                added, existing = added + created, existing + len(batch) - created
        finally:
            transport.close()
        yield added, existing

    totals = df.rdd.mapPartitions(add_partition).fold((0, 0), lambda a, b: (a[0] + b[0],
                                                                            a[1] + b[1]))
    return EnqueueStats(added=totals[0], existing=totals[1])


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
_SETS = {JobState.WAITING: "wait", JobState.DELAYED: "delayed", JobState.BLOCKED: "blocked",
         JobState.ACTIVE: "active", JobState.COMPLETED: "completed", JobState.FAILED: "failed",
         JobState.CANCELLED: "cancelled"}


def _list_ids(transport: SyncTransport, keys: QueueKeys, states: list[JobState]) -> list[str]:
    ids: list[str] = []
    for state in states:
        ids += [m.decode() for m in transport.client.zrange(getattr(keys, _SETS[state]), 0, -1)]
        if state is JobState.WAITING:  # keyed queues keep waiting jobs in per-key lists
            for list_key in transport.client.scan_iter(match=f"{keys.prefix}k:wait:*",
                                                       count=1000):
                ids += [m.decode() for m in transport.client.lrange(list_key, 0, -1)]
    return ids


def _ms_between(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds() * 1000


def _record(info: JobInfo) -> tuple[Any, ...]:
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
    keys = QueueKeys(queue)
    url = check_url(resolve_url(url))
    wanted = list(_SETS) if states is None else [JobState(s) for s in states]
    transport = SyncTransport(url)
    try:
        ids = _list_ids(transport, keys, wanted)
    finally:
        transport.close()
    slices = partitions or max(1, min(spark.sparkContext.defaultParallelism * 4,
                                      len(ids) // _READ_BATCH + 1))

    def read_partition(part: Iterable[str]) -> Iterator[tuple[Any, ...]]:
        client = SyncTransport(url)
        try:
            chunk: list[str] = []
            for job_id in part:
                chunk.append(job_id)
                if len(chunk) >= _READ_BATCH:
                    yield from _read_chunk(client, keys, chunk)
                    chunk = []
            if chunk:
                yield from _read_chunk(client, keys, chunk)
        finally:
            client.close()

    rdd = spark.sparkContext.parallelize(ids, slices).mapPartitions(read_partition)
    return spark.createDataFrame(rdd, JOB_SCHEMA)


def _read_chunk(client: SyncTransport, keys: QueueKeys, ids: list[str]
                ) -> Iterator[tuple[Any, ...]]:
    hashes = client.execute(Batch(tuple(Command(("HGETALL", keys.job(i))) for i in ids)))
    for job_id, h in zip(ids, hashes, strict=True):
        if h:
            yield _record(JobInfo.from_hash(keys.name, job_id, h, []))
