"""Spark data sources over panqueue (PySpark 4's Python Data Source API).

A module of its own beside ``panqueue.spark``, which holds the functions (``enqueue_dataframe``,
``read_jobs``, ``export_history``) and the schemas and row conversions they share with these
classes; this one holds only the Data Source API's classes, which use that code:

* ``panqueue`` (:class:`JobsDataSource`): ``spark.read.format("panqueue")`` reads the job
  records of ``read_jobs`` (``JOB_SCHEMA``), one input partition per queue partition and state,
  with ``state`` and ``finished_at`` filters pushed down; ``df.write.format("panqueue")
  .mode("append")`` enqueues as ``enqueue_dataframe`` does (its :class:`EnqueuePlan`).
* ``panqueue-history`` (:class:`HistoryDataSource`): ``spark.readStream.format(
  "panqueue-history")`` streams the history stream's records (``HISTORY_SCHEMA``); the offsets
  are the last stream id read per queue partition, kept in the query's checkpoint.

``panqueue.spark.register(spark)`` registers both. Spark plans and reads these in Python
worker processes: everything a reader or writer keeps is pickled, and each task opens its own
connection.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql import Row
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)

from panqueue._job import JobState
from panqueue._keys import QueueKeys, check_queue_name
from panqueue._spark_rows import (
    HISTORY_SCHEMA,
    JOB_SCHEMA,
    EnqueuePlan,
    Server,
    job_record,
    plan_enqueue,
)
from panqueue._store import ops
from panqueue._store.ops.history import parse_record
from panqueue._store.ops.jobs import state_set
from panqueue._store.transport import Command, Op
from panqueue.errors import ConfigError

__all__ = ["HistoryDataSource", "JobsDataSource"]

_READ_BATCH = 500
_STREAM_BATCH = 1000
_FINAL = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


def _connection(options: Any) -> tuple[Server, str]:
    """The checked ``url`` (default ``$PANQUEUE_URL``), ``prefix`` (default
    ``$PANQUEUE_PREFIX``) and ``queue`` options."""
    queue = options.get("queue")
    if not queue:
        raise ConfigError("option 'queue' is required: .option('queue', '<queue name>')")
    check_queue_name(queue)
    return Server.resolve(options.get("url"), options.get("prefix")), queue


def _int_option(options: Any, name: str, low: int = 1) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"option {name!r} must be an integer, got {value!r}") from None
    if number < low:
        raise ConfigError(f"option {name!r} must be ≥ {low}, got {number}")
    return number


def _float_option(options: Any, name: str) -> float | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"option {name!r} must be a number, got {value!r}") from None


def _ms(value: Any) -> float | None:
    """A filter's timestamp literal in ms since the epoch (naive: UTC, as Spark passes them)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return float(value.timestamp()) * 1000
    return None


class JobsDataSource(DataSource):
    """``format("panqueue")``: read a queue's job records, or enqueue a DataFrame's rows.

    Options: ``url`` (default ``$PANQUEUE_URL``), ``prefix`` (the key prefix, default
    ``$PANQUEUE_PREFIX``), ``queue`` (required); reading: ``states``
    (comma-separated, default all) and ``pushdown`` (``false``: no ``pushFilters``, for a
    session where ``spark.sql.python.filterPushdown.enabled`` stays off); writing: those of
    ``enqueue_dataframe`` (``id_column``, ``data_column``, ``batch_size``, ``priority``,
    ``delay``, ``attempts``, ``timeout``, ``key_column``, ``priority_column``,
    ``delay_column``, ``queue_mode``).
    """

    @classmethod
    def name(cls) -> str:
        return "panqueue"

    def schema(self) -> T.StructType:
        return JOB_SCHEMA

    def reader(self, schema: T.StructType) -> DataSourceReader:
        server, queue = _connection(self.options)
        states = self.options.get("states")
        try:
            wanted = (list(JobState) if not states else
                      [JobState(s.strip()) for s in states.split(",") if s.strip()])
        except ValueError as exc:
            raise ConfigError(f"option 'states': {exc} (states: "
                              f"{', '.join(s.value for s in JobState)})") from None
        pushdown = self.options.get("pushdown", "true").lower()
        if pushdown not in ("true", "false"):
            raise ConfigError(f"option 'pushdown' must be 'true' or 'false', got {pushdown!r}")
        reader = _PushdownJobsReader if pushdown == "true" else _JobsReader
        return reader(server, queue, wanted)

    def writer(self, schema: T.StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ConfigError("format('panqueue') only adds jobs: write with mode('append') "
                              "(overwrite would mean replacing the queue's jobs)")
        server, queue = _connection(self.options)
        o = self.options
        plan = plan_enqueue(
            schema, queue, url=server.url, prefix=server.prefix, id_column=o.get("id_column"),
            data_column=o.get("data_column"),
            batch_size=_int_option(o, "batch_size") or 1000,
            priority=_int_option(o, "priority", low=-(1 << 62)),
            delay=_float_option(o, "delay"), attempts=_int_option(o, "attempts"),
            timeout=_float_option(o, "timeout"), key_column=o.get("key_column"),
            priority_column=o.get("priority_column"), delay_column=o.get("delay_column"),
            mode=o.get("queue_mode", ""))
        return _JobsWriter(plan)


class _JobsReader(DataSourceReader):
    """One input partition per (queue partition, state): each task lists its set's ids and
    reads their records in pipelined batches, as ``read_jobs``'s executors do."""

    def __init__(self, server: Server, queue: str, states: list[JobState]) -> None:
        self.server = server
        self.queue = queue
        self.states = states
        # finished_at bounds in ms (inclusive), from pushed filters; only final states have it.
        self.finished_min: float | None = None
        self.finished_max: float | None = None

    def partitions(self) -> Sequence[InputPartition]:
        states = self.states
        if self.finished_min is not None or self.finished_max is not None:
            states = [s for s in states if s in _FINAL]
        if self.finished_min is not None and self.finished_max is not None \
                and self.finished_min > self.finished_max:
            states = []
        if not states:
            return []
        with self.server.producer() as producer:
            parts = producer.run(producer.partitions(self.queue))
        return [InputPartition((keys, state.value)) for keys in parts for state in states]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        keys, state_name = partition.value
        state = JobState(state_name)
        with self.server.producer() as producer:
            if state in _FINAL and (self.finished_min is not None
                                    or self.finished_max is not None):
                low = "-inf" if self.finished_min is None else math.floor(self.finished_min)
                high = "+inf" if self.finished_max is None else math.ceil(self.finished_max)
                ids = producer.run(_ids_by_score(keys, state, low, high))
            else:
                ids = producer.run(ops.list_ids(keys, state, None))
            for start in range(0, len(ids), _READ_BATCH):
                chunk = ids[start:start + _READ_BATCH]
                # Skips jobs removed since the listing, and jobs that have moved on to another
                # state (the task of that state's set reads them, if it lists them).
                for info in producer.run(ops.read_jobs(keys, chunk, states={state},
                                                       logs=False)):
                    yield job_record(info)


def _ids_by_score(keys: QueueKeys, state: JobState, low: Any, high: Any) -> Op[list[str]]:
    reply = yield Command(("ZRANGEBYSCORE", state_set(keys, state), low, high))
    return [member.decode() for member in reply]


class _PushdownJobsReader(_JobsReader):
    """Takes ``state`` filters (=, IN, <>) and ``finished_at`` ranges (and IS NOT NULL) from
    Spark: only the sets of the states asked for are read, and a time range reads the
    finished sets by score (the finish time). The state filters are done here; the time
    filters are handed back too (Spark checks them again on the records read)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        from pyspark.sql.datasource import (
            EqualTo,
            GreaterThan,
            GreaterThanOrEqual,
            In,
            IsNotNull,
            LessThan,
            LessThanOrEqual,
            Not,
        )

        for f in filters:
            column = f.attribute if not isinstance(f, Not) else getattr(f.child, "attribute", ())
            if column == ("state",):
                if isinstance(f, EqualTo):
                    self.states = [s for s in self.states if s.value == f.value]
                elif isinstance(f, In):
                    self.states = [s for s in self.states if s.value in f.value]
                elif isinstance(f, Not) and isinstance(f.child, EqualTo):
                    self.states = [s for s in self.states if s.value != f.child.value]
                elif isinstance(f, Not) and isinstance(f.child, In):
                    self.states = [s for s in self.states if s.value not in f.child.value]
                else:
                    yield f  # (a value that is no state's name matches nothing)
            elif column == ("finished_at",):
                ms = _ms(getattr(f, "value", None))
                if isinstance(f, (GreaterThan, GreaterThanOrEqual)) and ms is not None:
                    self.finished_min = ms if self.finished_min is None else max(
                        self.finished_min, ms)
                elif isinstance(f, (LessThan, LessThanOrEqual)) and ms is not None:
                    self.finished_max = ms if self.finished_max is None else min(
                        self.finished_max, ms)
                elif isinstance(f, EqualTo) and ms is not None:
                    self.finished_min = ms if self.finished_min is None else max(
                        self.finished_min, ms)
                    self.finished_max = ms if self.finished_max is None else min(
                        self.finished_max, ms)
                elif isinstance(f, IsNotNull):
                    self.states = [s for s in self.states if s in _FINAL]
                    continue
                yield f  # checked again by Spark: the bounds are rounded to whole ms
            else:
                yield f


class _EnqueueCommit(WriterCommitMessage):
    def __init__(self, added: int, existing: int) -> None:
        self.added = added
        self.existing = existing


class _JobsWriter(DataSourceWriter):
    """Each task enqueues its rows with ``enqueue_dataframe``'s code (:class:`EnqueuePlan`):
    with ``id_column``, a retried or speculative task adds nothing twice."""

    def __init__(self, plan: EnqueuePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        added, existing = self.plan.add_rows(iterator)
        return _EnqueueCommit(added, existing)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # every task's jobs were added as it ran: there is nothing left to publish

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # jobs already added stay; with id_column a re-run adds only the missing ones


# --------------------------------------------------------------------------- history stream


def _time(ms: int | None) -> dt.datetime | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def _diff(start: int | None, end: int | None) -> float | None:
    return None if start is None or end is None else float(end - start)


def _history_tuple(queue: str, record: ops.HistoryRecord) -> tuple[Any, ...]:
    return (record.id, queue, record.state, record.attempts, _time(record.enqueued_ms),
            _time(record.started_ms), _time(record.finished_ms),
            _diff(record.enqueued_ms, record.started_ms),
            _diff(record.started_ms, record.finished_ms), record.error_type,
            record.error_message, record.reason, record.worker, record.entry)


class HistoryDataSource(DataSource):
    """``readStream.format("panqueue-history")``: the history stream's records
    (``HISTORY_SCHEMA``). Options: ``url``, ``prefix``, ``queue`` (required), ``startingOffsets``
    (``earliest``, the default: every record the stream still holds; ``latest``: only
    records added after the query starts)."""

    @classmethod
    def name(cls) -> str:
        return "panqueue-history"

    def schema(self) -> T.StructType:
        return HISTORY_SCHEMA

    def streamReader(self, schema: T.StructType) -> DataSourceStreamReader:
        server, queue = _connection(self.options)
        starting = self.options.get("startingOffsets", "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise ConfigError("option 'startingOffsets' must be 'earliest' or 'latest', got "
                              f"{starting!r}")
        return _HistoryStreamReader(server, queue, starting == "latest")


class _HistoryStreamReader(DataSourceStreamReader):
    """Offsets: ``{"<queue partition>": "<last stream id read>"}``. A micro-batch reads, per
    partition, the entries after its start offset up to its end offset (XRANGE, exclusive
    start), so a query restarted from its checkpoint reads each entry once. The stream is not
    acknowledged or trimmed by this reader (its retention trims it)."""

    def __init__(self, server: Server, queue: str, latest: bool) -> None:
        self.server = server
        self.queue = queue
        self.latest = latest

    def _last_ids(self) -> dict[str, str]:
        with self.server.producer() as producer:
            parts = producer.run(producer.partitions(self.queue))
            return {str(keys.partition): producer.run(_last_entry(keys)) for keys in parts}

    def initialOffset(self) -> dict[str, str]:
        if self.latest:
            return self._last_ids()
        return {p: "0-0" for p in self._last_ids()}

    # The signature of PySpark 4.0 and 4.1 (4.2 added start and limit, and still calls this
    # one, without admission control): one method for every 4.x.
    def latestOffset(self) -> dict[str, str]:  # type: ignore[override]
        return self._last_ids()

    def partitions(self, start: dict[str, str], end: dict[str, str]
                   ) -> Sequence[InputPartition]:
        with self.server.producer() as producer:
            parts = {str(keys.partition): keys
                     for keys in producer.run(producer.partitions(self.queue))}
        return [InputPartition((parts[p].history, start.get(p, "0-0"), last))
                for p, last in sorted(end.items())
                if p in parts and last != start.get(p, "0-0")]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        key, after, last = partition.value
        with self.server.producer() as producer:
            while True:
                entries = producer.run(_entries_after(key, after, last, _STREAM_BATCH))
                for entry, fields in entries:
                    yield _history_tuple(self.queue, parse_record(entry, fields))
                if len(entries) < _STREAM_BATCH:
                    return
                after = entries[-1][0].decode()

    def commit(self, end: dict[str, str]) -> None:
        pass  # the offsets live in the query's checkpoint; nothing is acknowledged in Redis


def _last_entry(keys: QueueKeys) -> Op[str]:
    reply = yield Command(("XREVRANGE", keys.history, "+", "-", "COUNT", 1))
    return reply[0][0].decode() if reply else "0-0"


def _entries_after(key: str, after: str, last: str, count: int
                   ) -> Op[list[tuple[bytes, dict[bytes, bytes]]]]:
    reply = yield Command(("XRANGE", key, f"({after}", last, "COUNT", count))
    return [(entry, fields if isinstance(fields, dict)
             else dict(zip(fields[::2], fields[1::2], strict=True)))
            for entry, fields in reply]
