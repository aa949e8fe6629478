"""What panqueue.spark's functions and panqueue.spark_sources' data sources share:
:class:`Server` (where a queue's keys are), the checks and conversions from a DataFrame's rows
to job payloads, :class:`EnqueuePlan` (the per-partition enqueueing of ``enqueue_dataframe``
and of ``df.write.format("panqueue")``), and the schemas of the job records (``JOB_SCHEMA``,
``job_record``) and of the history (``HISTORY_SCHEMA``). Both modules import it; neither
imports the other (``panqueue.spark`` re-exports the public names).

Needs the ``spark`` extra.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Row
from pyspark.sql import types as T

from panqueue._check import check_int
from panqueue._job import JobInfo
from panqueue._keys import check_prefix
from panqueue._options import Backoff
from panqueue._producer import SyncProducer, Target, target
from panqueue._store import check_url, ops
from panqueue._url import resolve_url
from panqueue.errors import ConfigError

__all__ = ["HISTORY_SCHEMA", "JOB_SCHEMA", "Converter", "EnqueuePlan", "Server", "converter",
           "job_record", "plan_enqueue"]


@dataclass(frozen=True, slots=True)
class Server:
    """Where a queue's keys are: the Redis URL and the key prefix, resolved and checked on the
    driver (``url`` default ``$PANQUEUE_URL``, ``prefix`` default ``$PANQUEUE_PREFIX``, as the
    CLI's) and carried to the executors, whose environment may differ."""

    url: str
    prefix: str | None

    @classmethod
    def resolve(cls, url: str | None, prefix: str | None) -> Server:
        if prefix is None:
            prefix = os.environ.get("PANQUEUE_PREFIX") or None
        return cls(check_url(resolve_url(url)), check_prefix(prefix))

    def producer(self, spread: int = 0) -> SyncProducer:
        return SyncProducer(self.url, spread, prefix=self.prefix)

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


@dataclass(frozen=True, slots=True)
class EnqueuePlan:
    """How rows of one schema become jobs of one queue, checked on the driver
    (:func:`plan_enqueue`); :meth:`add_rows` runs in the executors. Shared by
    ``enqueue_dataframe`` and the ``panqueue`` data source's writer."""

    server: Server
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
        with self.server.producer(spread=random.randrange(1 << 16)) as producer:
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
                 prefix: str | None = None, id_column: str | None = None,
                 data_column: str | None = None, batch_size: int = 1000,
                 priority: int | None = None,
                 delay: float | None = None, attempts: int | None = None,
                 backoff: Backoff | None = None, timeout: float | None = None,
                 key_column: str | None = None, priority_column: str | None = None,
                 delay_column: str | None = None, mode: str = "") -> EnqueuePlan:
    """Check the arguments of :func:`enqueue_dataframe` against the rows' ``schema``: a
    ConfigError here means nothing was written."""
    defaults = {k: v for k, v in dict(priority=priority, delay=delay, attempts=attempts,
                                      backoff=backoff, timeout=timeout).items() if v is not None}
    server = Server.resolve(url, prefix)
    # Checks the mode and the queue's name.
    to = target(queue, {**defaults, "mode": mode}, server.prefix)
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
    return EnqueuePlan(server, to, converter(data_type), batch_size, id_column, data_column,
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
