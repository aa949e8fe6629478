"""Adding and reading jobs, for everything that produces them: the clients, their queues and
batches, and Spark's executors.

Two halves. Turning a producer's arguments into ``NewJob`` values (``target``, ``new_jobs``,
``flow_jobs``, ``dependency_ids``) needs no connection. A :class:`Producer` (async) or
:class:`SyncProducer` is a connection to the store and what a producer remembers between calls:
the layouts of the queues it used, so that adds route without a read, and where its next job
that nothing routes goes. Its methods build operations (``_store.ops``) and ``run`` drives
them, so the async and sync producers share every line but the driving. :class:`JobHandle` and
:class:`SyncJobHandle`, what an add returns, read a job back through the producer that added it.

This is the package's internal surface for producing: the clients, ``_queue.py``, ``_batch.py``
and ``spark.py`` use these names and nothing private of each other.

Longer than 400 lines because the two halves meet in every add: a bulk's items are built once
against the options its producer resolves (``new_jobs`` validates the first and copies it), and
a producer routes what they build; apart, each half would import the other's private rules.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeAlias, TypeVar

from panqueue._codec import (
    DEFAULT_COMPRESS_OVER,
    DEFAULT_MAX_PAYLOAD,
    check_compress_over,
    check_max_payload,
    check_size,
    compress,
)
from panqueue._handler import HandlerBase
from panqueue._job import JobInfo
from panqueue._keys import QueueKeys, check_prefix, prefixed
from panqueue._store import (
    AsyncTransport,
    Event,
    NewJob,
    Op,
    SyncTransport,
    open_async_transport,
    ops,
)
from panqueue._store.ops import partitions as parted
from panqueue._store.ops.events import WATCH_MS
from panqueue._store.ops.events import watch as watch_events
from panqueue.errors import ConfigError, PayloadError

__all__ = ["DURABLE_TIMEOUT_MS", "EVENTS_BLOCK_MS", "Dependency", "EventTail", "FlowJob",
           "JobHandle", "Producer",
           "SyncJobHandle", "SyncProducer", "Target", "chain", "dependency_ids", "flow_jobs",
           "new_jobs", "stored_form", "target"]

T = TypeVar("T")

# What ``depends_on`` takes: a job id, or the handle of a job of the same queue.
Dependency: TypeAlias = "str | JobHandle | SyncJobHandle"

QUEUE_DEFAULTS = frozenset({"delay", "priority", "attempts", "backoff", "timeout", "expires",
                            "tags"})
# How long ``add(..., durable=True)`` waits for the server's fsync.
DURABLE_TIMEOUT_MS = 10_000
# How long one read of ``client.events`` blocks, and its waits after a failed read.
EVENTS_BLOCK_MS = 1000
RECONNECT_MIN = 0.05
RECONNECT_MAX = 5.0
# How often ``client.events`` asks again for every event: a sixth of what one ask lasts.
_WATCH_AGAIN_S = WATCH_MS / 1000 / 6


# --------------------------------------------------------------------------- what to add


@dataclass(frozen=True)
class FlowJob:
    """One job of a flow (``queue.add_flow``): ``depends_on`` names earlier jobs of the same
    flow by index, or existing jobs of the queue by id or handle."""

    data: Any = None
    depends_on: Sequence[int | Dependency] = ()
    job_id: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """Where a producer adds: the queue's keys, its producer defaults, the mode the producer
    declares ('' = whatever the queue has) and the partition count its handler declares
    (None = whatever the queue has)."""

    keys: QueueKeys
    defaults: dict[str, Any]
    mode: str = ""
    partitions: int | None = None

    @property
    def name(self) -> str:
        return self.keys.name


def target(queue: str | HandlerBase[Any, Any, Any], defaults: dict[str, Any],
           prefix: str | None = None) -> Target:
    """The target of ``client.queue(queue, **defaults)``, checked: ``defaults`` may name
    ``mode`` and the options of :data:`QUEUE_DEFAULTS`; a handler's job defaults come first.
    ``prefix``: the client's key namespace."""
    defaults = dict(defaults)
    mode = defaults.pop("mode", "")
    partitions = None
    if isinstance(queue, HandlerBase):
        merged = {**queue.job_defaults, **defaults}
        name = queue.queue
        mode = mode or queue.options.mode
        partitions = queue.options.partitions
    else:
        merged = defaults
        name = queue
    if mode not in ("", "global", "keyed"):
        raise ConfigError(f"mode must be 'global' or 'keyed', got {mode!r}")
    unknown = set(merged) - QUEUE_DEFAULTS
    if unknown:
        raise ConfigError(f"unknown queue default(s): {', '.join(sorted(unknown))} "
                          f"(allowed: {', '.join(sorted(QUEUE_DEFAULTS))})")
    with prefixed(prefix):
        keys = QueueKeys(name)
    return Target(keys, merged, mode, partitions)


def stored_form(data: Any) -> Any:
    """A dataclass instance as the dict it is stored as (``dataclasses.asdict``, nested ones
    included); anything else unchanged, for ``ops.new_job`` to check."""
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return dataclasses.asdict(data)
    return data


def new_jobs(defaults: dict[str, Any], items: Iterable[Any]) -> list[NewJob]:
    """One job per item of an ``add_bulk``, each item its data; a bad item is named by its
    index. The items share their options (the queue's defaults and the producer's trace): the
    first item's job validates them, the others copy it with their own data."""
    jobs: list[NewJob] = []
    for index, item in enumerate(items):
        try:
            if jobs:
                jobs.append(ops.job_alike(jobs[0], stored_form(item)))
            else:
                jobs.append(ops.new_job(defaults, stored_form(item), {}))
        except (PayloadError, ConfigError) as exc:  # the same kind, naming the item
            kind = PayloadError if isinstance(exc, PayloadError) else ConfigError
            raise kind(f"item {index}: {exc}") from None
    return jobs


def dependency_ids(queue: str, depends_on: Any) -> Any:
    """``depends_on`` with job handles replaced by their ids. A handle of another queue is a
    ConfigError (a job can wait only for jobs of its own queue); anything else is left for
    ``ops.new_job`` to check."""
    if depends_on is None or isinstance(depends_on, str) or not isinstance(depends_on,
                                                                           Iterable):
        return depends_on
    ids = []
    for dep in depends_on:
        if isinstance(dep, JobHandle | SyncJobHandle):
            if dep.queue != queue:
                raise ConfigError(f"depends_on: job {dep.id!r} of queue {dep.queue!r} cannot be a "
                                  f"dependency here: a job can depend only on jobs of its own "
                                  f"queue {queue!r}")
            dep = dep.id
        ids.append(dep)
    return ids


def flow_jobs(name: str, defaults: dict[str, Any], flow: Sequence[FlowJob]) -> list[NewJob]:
    """Give every job of a flow an id and turn index references into ids. A job may only
    depend on earlier ones, so a flow is always acyclic."""
    prefix = f"flow:{uuid.uuid4().hex[:16]}"
    ids: list[str] = []
    jobs = []
    for index, node in enumerate(flow):
        if not isinstance(node, FlowJob):
            raise ConfigError(f"flow item {index} must be a panqueue.FlowJob, got {node!r}")
        if not isinstance(node.depends_on, list | tuple) or not isinstance(node.options, dict):
            raise ConfigError(f"flow item {index}: depends_on must be a list (of earlier items' "
                              f"indexes, job ids or handles) and options a dict, got "
                              f"{node.depends_on!r} and {node.options!r}")
        deps = []
        for ref in node.depends_on:
            if isinstance(ref, JobHandle | SyncJobHandle):
                try:
                    [ref] = dependency_ids(name, [ref])
                except ConfigError as exc:
                    raise ConfigError(f"flow item {index}: {exc}") from None
            if isinstance(ref, int) and not isinstance(ref, bool):
                if not 0 <= ref < index:
                    raise ConfigError(f"flow item {index}: depends_on index {ref} must point to "
                                      "an earlier item")
                deps.append(ids[ref])
            elif isinstance(ref, str):
                deps.append(ref)
            else:
                raise ConfigError(f"flow item {index}: depends_on {ref!r} is neither an earlier "
                                  "item's index, a job id nor a job handle")
        job_id = node.job_id or f"{prefix}:{index}"
        try:
            job = ops.new_job(defaults, stored_form(node.data),
                              {**node.options, "job_id": job_id, "depends_on": deps})
            jobs.append(job if node.job_id else dataclasses.replace(job, unique_id=True))
        except (PayloadError, ConfigError) as exc:  # the same kind, naming the item
            kind = PayloadError if isinstance(exc, PayloadError) else ConfigError
            raise kind(f"flow item {index}: {exc}") from None
        ids.append(job_id)
    return jobs


def chain(items: Iterable[Any]) -> list[FlowJob]:
    """An ``add_chain`` as the flow it is: each job depends on the one before."""
    return [FlowJob(data, depends_on=(index - 1,) if index else ())
            for index, data in enumerate(items)]


# --------------------------------------------------------------------------- producers


class _Routes:
    """The operations of a producer, for either driver: what it remembers of the queues'
    layouts, and where its next job that neither an id, a key nor a dependency places goes
    (the partitions in turn)."""

    def __init__(self, spread: int, prefix: str | None = None,
                 max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD,
                 compress_over_bytes: int | None = DEFAULT_COMPRESS_OVER) -> None:
        self.layouts = parted.PartitionCounts()
        self._spread = spread
        self.prefix = check_prefix(prefix)
        self.max_payload_bytes = check_max_payload(max_payload_bytes)
        self.compress_over_bytes = check_compress_over(compress_over_bytes)

    def stored(self, jobs: Sequence[NewJob]) -> Sequence[NewJob]:
        """``jobs`` as they are written: each one's data compressed if it is over
        ``compress_over_bytes`` (after :meth:`check_sizes`, which bounds the data as encoded)."""
        over = self.compress_over_bytes
        if over is None or all(len(job.data) <= over for job in jobs):
            return jobs
        return [dataclasses.replace(job, data=compress(job.data, over)) for job in jobs]

    def check_sizes(self, jobs: Sequence[NewJob]) -> None:
        """:class:`PayloadError` if a job's encoded data and options are over
        ``max_payload_bytes`` (checked for every job before any is written)."""
        limit = self.max_payload_bytes
        if limit is None:
            return
        for index, job in enumerate(jobs):
            size = len(job.data) + len(job.options)
            if size > limit:  # the message is made only then
                what = "the job's data" if len(jobs) == 1 else f"job {index}'s data"
                check_size(size, limit, what + " (with its options)" if job.options else what)

    def add(self, to: Target, jobs: Sequence[NewJob], durable_timeout_ms: int | None = None,
            together: bool = False) -> Op[list[tuple[str, bool]]]:
        """Add ``jobs`` to ``to``, each in its partition: ``(job id, created)`` per job.
        ``together``: all in one script call, or none (a flow). No jobs (an empty bulk, flow or
        chain) is nothing to add: nothing is asked of the server. A job over
        ``max_payload_bytes`` adds none."""
        self.check_sizes(jobs)
        spread, self._spread = self._spread, self._spread + len(jobs)
        if not jobs:
            return []
        return (yield from self.layouts.add(to.name, to.partitions, self.stored(jobs), to.mode,
                                            spread, durable_timeout_ms, together))

    def add_to_batch(self, to: Target, batch_id: str, jobs: Sequence[NewJob]
                     ) -> Op[list[tuple[str, bool]]]:
        """Register ``jobs`` with batch ``batch_id`` and add them to ``to``."""
        self.check_sizes(jobs)
        return self.layouts.on_all(to.name, parted.add_to_batch, batch_id, self.stored(jobs),
                                   to.mode, declared=to.partitions)

    def on_job(self, queue: str, job_id: str, fn: Callable[..., Op[T]], *args: Any) -> Op[T]:
        """``fn(keys, job_id, *args)`` on the partition of ``queue`` that holds the job."""
        return self.layouts.on_job(queue, job_id, fn, *args)

    def on_all(self, queue: str, fn: Callable[..., Op[T]], *args: Any) -> Op[T]:
        """``fn(partitions, *args)``: an operation over every partition of ``queue``."""
        return self.layouts.on_all(queue, fn, *args)

    def partitions(self, queue: str) -> Op[list[QueueKeys]]:
        """The keys of every partition of ``queue``, under its stored layout."""
        return self.layouts.parts(queue, fresh=True)


class Producer(_Routes):
    """A producer on an async transport, opened on first use. ``url`` is taken as checked."""

    def __init__(self, url: str, spread: int = 0, *, prefix: str | None = None,
                 max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD,
                 compress_over_bytes: int | None = DEFAULT_COMPRESS_OVER) -> None:
        super().__init__(spread, prefix, max_payload_bytes, compress_over_bytes)
        self.url = url
        self._transport: AsyncTransport | None = None

    def connect(self) -> AsyncTransport:
        if self._transport is None:
            self._transport = open_async_transport(self.url, self.prefix)
        return self._transport

    async def run(self, op: Op[T]) -> T:
        return await self.connect().run(op)

    async def aclose(self) -> None:
        if self._transport is not None:
            transport, self._transport = self._transport, None
            await transport.aclose()


class SyncProducer(_Routes):
    """A producer on redis-py's blocking client, opened on first use; safe to share between
    threads. ``url`` is taken as checked."""

    def __init__(self, url: str, spread: int = 0, *, prefix: str | None = None,
                 max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD,
                 compress_over_bytes: int | None = DEFAULT_COMPRESS_OVER) -> None:
        super().__init__(spread, prefix, max_payload_bytes, compress_over_bytes)
        self.url = url
        self._transport: SyncTransport | None = None
        # The producer may be shared by threads (a web app's thread pool): the first connection
        # is made once, not once per thread that finds none (an extra one would be dropped and
        # closed under the thread still using it).
        self._connecting = threading.Lock()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def connect(self) -> SyncTransport:
        transport = self._transport
        if transport is None:
            with self._connecting:
                transport = self._transport
                if transport is None:
                    transport = self._transport = SyncTransport(self.url, self.prefix)
        return transport

    def run(self, op: Op[T]) -> T:
        return self.connect().run(op)

    def close(self) -> None:
        if self._transport is not None:
            transport, self._transport = self._transport, None
            transport.close()


class EventTail:
    """Where a reader of a queue's events is, kept across failed reads: ``client.events``
    runs :meth:`next` for ever, and after a read that failed waits :meth:`backoff` seconds and
    runs it again, resuming where the last read that succeeded stopped."""

    def __init__(self, producer: _Routes, queue: str, after: str | None) -> None:
        self._producer = producer
        self._queue = queue
        self._after = after
        self._positions: list[str] | None = None  # one stream id per partition
        self._turn = 0
        self._delay = RECONNECT_MIN
        self._streams: list[str] = []  # the partitions' event streams, as positions has them
        self._asked_at = 0.0  # when it last asked for every event (monotonic)

    def next(self) -> Op[list[Event]]:
        """The events that arrive within :data:`EVENTS_BLOCK_MS` (merged by time across the
        partitions)."""
        batch: list[Event]
        batch, self._positions = yield from self._producer.on_all(self._queue, self._read)
        self._delay = RECONNECT_MIN
        self._turn += 1
        return batch

    def _read(self, parts: Sequence[QueueKeys]) -> Op[tuple[list[Event], list[str]]]:
        streams = [keys.events for keys in parts]
        moved = streams != self._streams  # the first read too
        now = time.monotonic()
        if moved or now - self._asked_at > _WATCH_AGAIN_S:
            # Before its first read, again well before that ask ends, and on partitions it
            # has not asked: ask the queue to write every event (ops/events.py watch).
            yield from watch_events(parts)
            self._asked_at = now
        if self._positions is None:
            self._positions = yield from parted.event_positions(parts, self._after)
        elif moved:
            # The queue's layout changed under it (declared after the reading began, or laid
            # out again): a partition it follows keeps its place, a new one is read whole.
            known = dict(zip(self._streams, self._positions, strict=True))
            self._positions = [known.get(stream, "0-0") for stream in streams]
        self._streams = streams
        return (yield from parted.next_events(parts, self._positions, EVENTS_BLOCK_MS,
                                              self._turn))

    def backoff(self) -> float:
        """Seconds to wait after a failed read: doubling from 0.05 s, at most 5 s."""
        delay, self._delay = self._delay, min(self._delay * 2, RECONNECT_MAX)
        return delay


# --------------------------------------------------------------------------- job handles


class JobHandle:
    """A job added through :class:`QueueClient`: its id, and ways to read it back."""

    __slots__ = ("_producer", "created", "id", "queue")

    def __init__(self, producer: Producer, queue: str, job_id: str, created: bool) -> None:
        self._producer = producer
        self.id = job_id
        self.queue = queue
        self.created = created

    async def info(self) -> JobInfo:
        return await self._producer.run(self._producer.on_job(self.queue, self.id, ops.get_job))

    async def result(self, timeout: float | None = None) -> Any:
        """Wait for the job to finish and return its result.

        Raises :class:`JobFailed` if it ended FAILED or CANCELLED, and :class:`TimeoutError`
        after ``timeout`` seconds. Waits on the queue's event stream, not by polling.
        """
        return await self._producer.run(self._producer.on_job(
            self.queue, self.id, ops.wait_result, timeout, self._producer.url))

    def __repr__(self) -> str:
        return f"<JobHandle {self.queue}/{self.id}>"


class SyncJobHandle:
    """:class:`JobHandle` for :class:`SyncQueueClient` (blocking methods)."""

    __slots__ = ("_producer", "created", "id", "queue")

    def __init__(self, producer: SyncProducer, queue: str, job_id: str, created: bool) -> None:
        self._producer = producer
        self.id = job_id
        self.queue = queue
        self.created = created

    def info(self) -> JobInfo:
        return self._producer.run(self._producer.on_job(self.queue, self.id, ops.get_job))

    def result(self, timeout: float | None = None) -> Any:
        return self._producer.run(self._producer.on_job(
            self.queue, self.id, ops.wait_result, timeout, self._producer.url))

    def __repr__(self) -> str:
        return f"<SyncJobHandle {self.queue}/{self.id}>"
