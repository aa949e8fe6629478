"""Producing jobs and administering queues: ``QueueClient`` (async) and ``SyncQueueClient``.

Both clients build the same operations (``_store.ops``) and differ only in how they
drive them: awaiting an async transport, or blocking on redis-py's sync client. Validating a
producer's arguments is an operation's job too (``ops.new_job``).

Longer than our usual 300 lines on purpose: the two clients mirror each other method for
method (each method one line over an operation), and side by side in one file is where a
method added to one and not the other shows.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar, overload

import anyio

from panqueue._job import JobInfo, JobState, PayloadT
from panqueue._keys import QueueKeys
from panqueue._options import Backoff, Dedup
from panqueue._registry import Handler
from panqueue._store import (
    AsyncTransport,
    Event,
    Explanation,
    NewJob,
    Op,
    ScheduleInfo,
    SyncTransport,
    WorkerInfo,
    check_url,
    open_async_transport,
    ops,
)
from panqueue._store.ops import partitions as parted
from panqueue._url import resolve_url
from panqueue.errors import ConfigError, ConnectionError, PayloadError

if TYPE_CHECKING:
    from panqueue._batch import Batch, SyncBatch

__all__ = ["FlowJob", "JobHandle", "Queue", "QueueClient", "SyncJobHandle", "SyncQueue",
           "SyncQueueClient"]

T = TypeVar("T")
D = TypeVar("D")

# What ``depends_on`` takes: a job id, or the handle of a job of the same queue.
Dependency: TypeAlias = "str | JobHandle | SyncJobHandle"

_EVENTS_BLOCK_MS = 1000
_RECONNECT_MIN = 0.05
_RECONNECT_MAX = 5.0

_QUEUE_DEFAULTS = frozenset({"delay", "priority", "attempts", "backoff", "timeout", "expires"})
# How long ``add(..., durable=True)`` waits for the server's fsync.
DURABLE_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class FlowJob:
    """One job of a flow (``queue.add_flow``): ``depends_on`` names earlier jobs of the same
    flow by index, or existing jobs of the queue by id or handle."""

    data: Any = None
    depends_on: Sequence[int | Dependency] = ()
    job_id: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _queue_target(queue: str | Handler[Any, Any], defaults: dict[str, Any]
                  ) -> tuple[QueueKeys, dict[str, Any], str, int | None]:
    """Keys, producer defaults, declared mode ('' = whatever the queue has) and partition count
    (None = whatever the queue has) of a handle."""
    mode = defaults.pop("mode", "")
    partitions = None
    if isinstance(queue, Handler):
        merged = {**queue.job_defaults, **defaults}
        name = queue.queue
        mode = mode or queue.options.mode
        partitions = queue.options.partitions
    else:
        merged = dict(defaults)
        name = queue
    if mode not in ("", "global", "keyed"):
        raise ConfigError(f"mode must be 'global' or 'keyed', got {mode!r}")
    unknown = set(merged) - _QUEUE_DEFAULTS
    if unknown:
        raise ConfigError(f"unknown queue default(s): {', '.join(sorted(unknown))} "
                          f"(allowed: {', '.join(sorted(_QUEUE_DEFAULTS))})")
    return QueueKeys(name), merged, mode, partitions


def _stored_form(data: Any) -> Any:
    """A dataclass instance as the dict it is stored as (``dataclasses.asdict``, nested ones
    included); anything else unchanged, for ``ops.new_job`` to check."""
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return dataclasses.asdict(data)
    return data


def _new_jobs(defaults: dict[str, Any], items: Iterable[Any]) -> list[NewJob]:
    jobs = []
    for index, item in enumerate(items):
        try:
            jobs.append(ops.new_job(defaults, _stored_form(item), {}))
        except PayloadError as exc:
            raise PayloadError(f"item {index}: {exc}") from None
    return jobs


def _dependency_ids(queue: str, depends_on: Any) -> Any:
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


def _flow_jobs(name: str, defaults: dict[str, Any], flow: Sequence[FlowJob]) -> list[NewJob]:
    """Give every job of a flow an id and turn index references into ids. A job may only
    depend on earlier ones, so a flow is always acyclic."""
    prefix = f"flow:{uuid.uuid4().hex[:16]}"
    ids: list[str] = []
    jobs = []
    for index, node in enumerate(flow):
        if not isinstance(node, FlowJob):
            raise ConfigError(f"flow item {index} must be a panqueue.FlowJob, got {node!r}")
        deps = []
        for ref in node.depends_on:
            if isinstance(ref, JobHandle | SyncJobHandle):
                try:
                    [ref] = _dependency_ids(name, [ref])
                except ConfigError as exc:
                    raise ConfigError(f"flow item {index}: {exc}") from None
            if isinstance(ref, int) and not isinstance(ref, bool):
                if not 0 <= ref < index:
                    raise ConfigError(f"flow item {index}: depends_on index {ref} must point to "
                                      "an earlier item")
                deps.append(ids[ref])
            else:
                deps.append(str(ref))
        job_id = node.job_id or f"{prefix}:{index}"
        try:
            job = ops.new_job(defaults, _stored_form(node.data),
                              {**node.options, "job_id": job_id, "depends_on": deps})
            jobs.append(job if node.job_id else dataclasses.replace(job, unique_id=True))
        except PayloadError as exc:
            raise PayloadError(f"flow item {index}: {exc}") from None
        ids.append(job_id)
    return jobs


# --------------------------------------------------------------------------- async


class JobHandle:
    """A job added through :class:`QueueClient`: its id, and ways to read it back."""

    __slots__ = ("_client", "_keys", "created", "id", "queue")

    def __init__(self, client: QueueClient, keys: QueueKeys, job_id: str, created: bool) -> None:
        self._client = client
        self._keys = keys
        self.id = job_id
        self.queue = keys.name
        self.created = created

    async def info(self) -> JobInfo:
        return await self._client._run(self._client._parts.on_job(self.queue, self.id,
                                                                  ops.get_job))

    async def result(self, timeout: float | None = None) -> Any:
        """Wait for the job to finish and return its result.

        Raises :class:`JobFailed` if it ended FAILED or CANCELLED, and :class:`TimeoutError`
        after ``timeout`` seconds. Waits on the queue's event stream, not by polling.
        """
        return await self._client._run(self._client._parts.on_job(
            self.queue, self.id, ops.wait_result, timeout, self._client.url))

    def __repr__(self) -> str:
        return f"<JobHandle {self.queue}/{self.id}>"


class Queue(Generic[PayloadT]):
    """A queue handle with per-queue defaults; ``add`` arguments override them.

    ``client.queue(handler)`` of a handler typed ``Job[Email]`` is a ``Queue[Email]``: type
    checkers then check the data given to ``add``, ``add_bulk`` and ``add_chain``. A queue
    named by a string is a ``Queue[Any]``. A dataclass instance is stored as its
    ``dataclasses.asdict``.
    """

    def __init__(self, client: QueueClient, keys: QueueKeys, defaults: dict[str, Any],
                 mode: str = "", partitions: int | None = None) -> None:
        self._client = client
        self.keys = keys
        self.name = keys.name
        self.defaults = defaults
        self.mode = mode
        self.partitions = partitions

    async def add(self, data: PayloadT = None, *,  # type: ignore[assignment]
                  job_id: str | None = None, delay: float | None = None,
                  run_at: datetime | None = None, priority: int | None = None,
                  attempts: int | None = None,
                  backoff: Backoff | None = None, timeout: float | None = None,
                  key: str | None = None, dedup: Dedup | None = None,
                  depends_on: Sequence[Dependency] | None = None,
                  durable: bool = False,
                  expires: float | datetime | None = None) -> JobHandle:
        """Add one job. With ``job_id``, adding an existing id returns that job unchanged.

        ``key``: the concurrency key (keyed queues). ``dedup``: see :class:`Dedup`.
        ``depends_on``: jobs of this queue that must complete first, as ids or handles (the
        job is BLOCKED until then). ``durable``: return only once the server has fsynced the
        write. ``expires``: seconds from now (on the server's clock) or an aware datetime: a job
        not started by then ends CANCELLED with failure reason ``expired`` and never runs.
        """
        job = ops.new_job(self.defaults, _stored_form(data), dict(
            job_id=job_id, delay=delay, run_at=run_at, priority=priority, attempts=attempts,
            backoff=backoff, timeout=timeout, key=key, dedup=dedup,
            depends_on=_dependency_ids(self.name, depends_on), expires=expires))
        [(job_id_, created)] = await self._client._run(self._add(
            [job], DURABLE_TIMEOUT_MS if durable else None))
        return JobHandle(self._client, self.keys, job_id_, created)

    async def add_bulk(self, items: Iterable[PayloadT]) -> list[JobHandle]:
        """Add many jobs (each item is one job's data) in one round trip. Every item is
        validated first: one bad item raises PayloadError and nothing is written."""
        jobs = _new_jobs(self.defaults, items)
        added = await self._client._run(self._add(jobs))
        return [JobHandle(self._client, self.keys, i, c) for i, c in added]

    async def add_flow(self, flow: Sequence[FlowJob]) -> list[JobHandle]:
        """Add a tree (or any DAG) of jobs with their dependencies in one atomic call."""
        jobs = _flow_jobs(self.name, self.defaults, flow)
        added = await self._client._run(self._add(jobs, together=True))
        return [JobHandle(self._client, self.keys, i, c) for i, c in added]

    async def add_chain(self, items: Iterable[PayloadT]) -> list[JobHandle]:
        """Add jobs that run one after another: each depends on the one before."""
        return await self.add_flow(_chain(items))

    def job(self, job_id: str) -> JobHandle:
        """A handle on an existing job, by id."""
        return JobHandle(self._client, self.keys, job_id, False)

    def _add(self, jobs: Sequence[NewJob], durable_timeout_ms: int | None = None,
             together: bool = False) -> Op[list[tuple[str, bool]]]:
        return _add_op(self._client._parts, self, jobs, self._client._spread(len(jobs)),
                       durable_timeout_ms, together)


class QueueClient:
    """The async client: ``async with QueueClient(url) as client: ...``."""

    def __init__(self, url: str | None = None) -> None:
        self.url = check_url(resolve_url(url))
        self._transport: AsyncTransport | None = None
        self._parts = parted.PartitionCounts()
        self._spread = _Spread()

    async def __aenter__(self) -> QueueClient:
        self._connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    def _connect(self) -> AsyncTransport:
        if self._transport is None:
            self._transport = open_async_transport(self.url)
        return self._transport

    async def _run(self, op: Op[T]) -> T:
        return await self._connect().run(op)

    async def aclose(self) -> None:
        if self._transport is not None:
            transport, self._transport = self._transport, None
            await transport.aclose()

    @overload
    def queue(self, queue: Handler[Any, Any, D], **defaults: Any) -> Queue[D]: ...

    @overload
    def queue(self, queue: str, **defaults: Any) -> Queue[Any]: ...

    def queue(self, queue: str | Handler[Any, Any, Any], **defaults: Any) -> Queue[Any]:
        """A handle on a queue with producer defaults (``priority``, ``delay``, ``attempts``,
        ``backoff``, ``timeout``) and optionally ``mode`` ('global' or 'keyed': adds fail
        if the queue's stored mode differs). A handler's queue is typed by its payload
        (``Queue[Email]`` for a handler of ``Job[Email]``)."""
        keys, merged, mode, partitions = _queue_target(queue, defaults)
        return Queue(self, keys, merged, mode, partitions)

    async def batch(self, on_complete: tuple[str, Any], on_success: tuple[str, Any] | None = None,
                    *, parent: Batch | str | None = None) -> Batch:
        """Open a batch (panqueue/_batch.py): ``on_complete=("queue", data)`` is added once
        the batch is closed and every job in it ended; ``on_success`` only if none failed.
        ``parent``: a batch whose jobs these callbacks become (a child batch)."""
        from panqueue._batch import Batch, batch_opening
        batch_id, opening = batch_opening(on_complete, on_success, parent)
        await self._run(opening)
        return Batch(self, batch_id)

    async def ping(self) -> None:
        """Check that Redis answers; raises :class:`ConnectionError` if it cannot be reached."""
        await self._run(ops.ping())

    async def queues(self) -> list[str]:
        """The names of every queue that has state in Redis, sorted. Scans the keyspace (every
        master of a cluster): for dashboards and operators, not for a hot path."""
        return await self._run(ops.queues())

    async def queue_exists(self, queue: str) -> bool:
        """Whether ``queue`` has state in Redis (a job was added to it or a worker served it)."""
        return await self._run(ops.known_queue(QueueKeys(queue)))

    async def is_paused(self, queue: str) -> bool:
        """Whether ``queue`` is paused (:meth:`pause`)."""
        return await self._run(ops.is_paused(QueueKeys(queue)))

    async def get_job(self, queue: str, job_id: str) -> JobInfo:
        return await self._run(self._parts.on_job(queue, job_id, ops.get_job))

    async def list_jobs(self, queue: str, state: JobState | str, *, limit: int = 100,
                        offset: int = 0) -> list[JobInfo]:
        """Up to ``limit`` jobs of ``queue`` in ``state``, after the first ``offset`` of them.

        Finished states (completed, failed, cancelled) come newest first; waiting jobs in the
        order workers will claim them (a keyed queue's one per key in turn: first the keys
        ready to run, then those held by their rate limit or at their concurrency limit);
        delayed jobs by when they are due; blocked ones by when they were blocked; active ones
        by their lock deadline. A job that leaves the state while the list is read is left
        out. ``state`` is a :class:`JobState` or its value (``"failed"``).

        ``offset`` pages through that order: a page costs O(log N + limit) in Redis at any
        depth (a keyed queue's waiting jobs: one LLEN per waiting key besides).
        """
        return await self._run(self._parts.on_all(queue, parted.all_list_jobs, state, limit,
                                                  offset))

    async def counts(self, queue: str) -> dict[JobState, int]:
        return await self._run(self._parts.on_all(queue, parted.all_counts))

    async def pause(self, queue: str) -> None:
        await self._run(self._parts.on_all(queue, parted.all_pause, True))

    async def resume(self, queue: str) -> None:
        await self._run(self._parts.on_all(queue, parted.all_pause, False))

    async def cancel(self, queue: str, job_id: str) -> JobState:
        return await self._run(self._parts.on_job(queue, job_id, ops.cancel))

    async def retry_failed(self, queue: str, ids: Sequence[str] | None = None) -> int:
        return await self._run(self._parts.on_all(queue, parted.all_retry_failed, ids))

    async def remove(self, queue: str, job_id: str) -> bool:
        return await self._run(self._parts.on_job(queue, job_id, ops.remove))

    async def workers(self, queue: str | None = None) -> list[WorkerInfo]:
        """The live workers of ``queue`` (``None``: of every queue, one entry per worker name),
        from their heartbeats. A worker that stopped cleanly is gone at once; one that died is
        gone within three heartbeat intervals."""
        if queue is not None:
            return await self._run(ops.workers(QueueKeys(queue)))
        found = []
        for name in await self.queues():
            found += await self._run(ops.workers(QueueKeys(name)))
        return ops.merge_workers(found)

    async def explain(self, queue: str, job_id: str) -> Explanation:
        """Why the job is in its state, from Redis alone: paused, delayed until when, blocked
        on which dependency, its key busy, rate-limited, queued behind how many jobs, no live
        worker, running on which worker, or finished (how and when)."""
        return await self._run(self._parts.on_job(queue, job_id, ops.explain))

    async def purge(self, queue: str, states: Iterable[JobState | str] | None = None) -> int:
        """Delete the jobs of ``queue`` in ``states`` and return how many were deleted.
        ``None``: every job that is not active, and the queue's settings unless a job is
        active or a live worker serves the queue.
        Active jobs are deleted only when ``states`` names ACTIVE (their workers then lose
        their locks). Dependents of a deleted job that still wait for it fail."""
        return await self._run(self._parts.on_all(queue, parted.all_purge, _states(states)))

    async def schedules(self, queue: str) -> list[ScheduleInfo]:
        """The queue's schedules as registered in Redis, with their next run times."""
        return await self._run(ops.list_schedules(QueueKeys(queue)))

    async def remove_schedule(self, queue: str, name: str) -> bool:
        """Delete a schedule from Redis (a worker whose registry still defines it registers
        it again when it starts)."""
        return await self._run(ops.remove_schedule(QueueKeys(queue), name))

    async def read_events(self, queue: str, after: str | None = None, *, limit: int = 500
                          ) -> tuple[list[Event], str]:
        """The events of ``queue`` after stream id ``after`` that are there now (at most
        ``limit``), without waiting, and the id to pass as ``after`` next time. With ``after``
        None: no events, and the id of the stream's end (start watching from now)."""
        return await self._run(self._parts.on_all(queue, parted.all_events, after, limit))

    async def events(self, queue: str, *, after: str | None = None) -> AsyncIterator[Event]:
        """Lifecycle events of a queue, as they happen, forever.

        ``after``: a stream id to resume from (an :attr:`Event.id`, or a position
        :meth:`read_events` returned); default: only new events. On a partitioned queue the
        partitions' events arrive merged by time, each within 0.2 s.
        A broken connection is re-established and reading resumes where it stopped, so no
        event is skipped (unless the capped stream dropped it meanwhile).
        """
        positions: list[str] | None = None
        delay = _RECONNECT_MIN
        turn = 0
        while True:
            try:
                if positions is None:
                    positions = await self._run(self._parts.on_all(
                        queue, parted.event_positions, after))
                batch, positions = await self._run(self._parts.on_all(
                    queue, parted.next_events, positions, _EVENTS_BLOCK_MS, turn))
            except ConnectionError:
                await anyio.sleep(delay)
                delay = min(delay * 2, _RECONNECT_MAX)
                continue
            delay = _RECONNECT_MIN
            turn += 1
            for event in batch:
                yield event


# --------------------------------------------------------------------------- sync


class SyncJobHandle:
    """:class:`JobHandle` for :class:`SyncQueueClient` (blocking methods)."""

    __slots__ = ("_client", "_keys", "created", "id", "queue")

    def __init__(self, client: SyncQueueClient, keys: QueueKeys, job_id: str,
                 created: bool) -> None:
        self._client = client
        self._keys = keys
        self.id = job_id
        self.queue = keys.name
        self.created = created

    def info(self) -> JobInfo:
        return self._client._run(self._client._parts.on_job(self.queue, self.id, ops.get_job))

    def result(self, timeout: float | None = None) -> Any:
        return self._client._run(self._client._parts.on_job(
            self.queue, self.id, ops.wait_result, timeout, self._client.url))

    def __repr__(self) -> str:
        return f"<SyncJobHandle {self.queue}/{self.id}>"


class SyncQueue(Generic[PayloadT]):
    """:class:`Queue` for :class:`SyncQueueClient` (typed the same way)."""

    def __init__(self, client: SyncQueueClient, keys: QueueKeys, defaults: dict[str, Any],
                 mode: str = "", partitions: int | None = None) -> None:
        self._client = client
        self.keys = keys
        self.name = keys.name
        self.defaults = defaults
        self.mode = mode
        self.partitions = partitions

    def add(self, data: PayloadT = None, *,  # type: ignore[assignment]
            job_id: str | None = None, delay: float | None = None,
            run_at: datetime | None = None, priority: int | None = None,
            attempts: int | None = None, backoff: Backoff | None = None,
            timeout: float | None = None, key: str | None = None, dedup: Dedup | None = None,
            depends_on: Sequence[Dependency] | None = None,
            durable: bool = False,
            expires: float | datetime | None = None) -> SyncJobHandle:
        job = ops.new_job(self.defaults, _stored_form(data), dict(
            job_id=job_id, delay=delay, run_at=run_at, priority=priority, attempts=attempts,
            backoff=backoff, timeout=timeout, key=key, dedup=dedup,
            depends_on=_dependency_ids(self.name, depends_on), expires=expires))
        [(job_id_, created)] = self._client._run(self._add(
            [job], DURABLE_TIMEOUT_MS if durable else None))
        return SyncJobHandle(self._client, self.keys, job_id_, created)

    def add_bulk(self, items: Iterable[PayloadT]) -> list[SyncJobHandle]:
        jobs = _new_jobs(self.defaults, items)
        added = self._client._run(self._add(jobs))
        return [SyncJobHandle(self._client, self.keys, i, c) for i, c in added]

    def add_flow(self, flow: Sequence[FlowJob]) -> list[SyncJobHandle]:
        jobs = _flow_jobs(self.name, self.defaults, flow)
        added = self._client._run(self._add(jobs, together=True))
        return [SyncJobHandle(self._client, self.keys, i, c) for i, c in added]

    def add_chain(self, items: Iterable[PayloadT]) -> list[SyncJobHandle]:
        return self.add_flow(_chain(items))

    def job(self, job_id: str) -> SyncJobHandle:
        return SyncJobHandle(self._client, self.keys, job_id, False)

    def _add(self, jobs: Sequence[NewJob], durable_timeout_ms: int | None = None,
             together: bool = False) -> Op[list[tuple[str, bool]]]:
        return _add_op(self._client._parts, self, jobs, self._client._spread(len(jobs)),
                       durable_timeout_ms, together)


class SyncQueueClient:
    """The blocking client, for scripts, web apps without an event loop, and Spark executors."""

    def __init__(self, url: str | None = None) -> None:
        self.url = check_url(resolve_url(url))
        self._transport: SyncTransport | None = None
        self._parts = parted.PartitionCounts()
        self._spread = _Spread()
        # The client may be shared by threads (a web app's thread pool): the first connection
        # is made once, not once per thread that finds none (an extra one would be dropped and
        # closed under the thread still using it).
        self._connecting = threading.Lock()

    def __enter__(self) -> SyncQueueClient:
        self._connect()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _connect(self) -> SyncTransport:
        transport = self._transport
        if transport is None:
            with self._connecting:
                transport = self._transport
                if transport is None:
                    transport = self._transport = SyncTransport(self.url)
        return transport

    def _run(self, op: Op[T]) -> T:
        return self._connect().run(op)

    def close(self) -> None:
        if self._transport is not None:
            transport, self._transport = self._transport, None
            transport.close()

    @overload
    def queue(self, queue: Handler[Any, Any, D], **defaults: Any) -> SyncQueue[D]: ...

    @overload
    def queue(self, queue: str, **defaults: Any) -> SyncQueue[Any]: ...

    def queue(self, queue: str | Handler[Any, Any, Any], **defaults: Any) -> SyncQueue[Any]:
        """Blocking :meth:`QueueClient.queue`."""
        keys, merged, mode, partitions = _queue_target(queue, defaults)
        return SyncQueue(self, keys, merged, mode, partitions)

    def batch(self, on_complete: tuple[str, Any], on_success: tuple[str, Any] | None = None,
              *, parent: SyncBatch | str | None = None) -> SyncBatch:
        """Blocking :meth:`QueueClient.batch`."""
        from panqueue._batch import SyncBatch, batch_opening
        batch_id, opening = batch_opening(on_complete, on_success, parent)
        self._run(opening)
        return SyncBatch(self, batch_id)

    def ping(self) -> None:
        """Blocking :meth:`QueueClient.ping`."""
        self._run(ops.ping())

    def queues(self) -> list[str]:
        """Blocking :meth:`QueueClient.queues`."""
        return self._run(ops.queues())

    def queue_exists(self, queue: str) -> bool:
        return self._run(ops.known_queue(QueueKeys(queue)))

    def is_paused(self, queue: str) -> bool:
        return self._run(ops.is_paused(QueueKeys(queue)))

    def get_job(self, queue: str, job_id: str) -> JobInfo:
        return self._run(self._parts.on_job(queue, job_id, ops.get_job))

    def list_jobs(self, queue: str, state: JobState | str, *, limit: int = 100,
                  offset: int = 0) -> list[JobInfo]:
        """Blocking :meth:`QueueClient.list_jobs`."""
        return self._run(self._parts.on_all(queue, parted.all_list_jobs, state, limit, offset))

    def counts(self, queue: str) -> dict[JobState, int]:
        return self._run(self._parts.on_all(queue, parted.all_counts))

    def pause(self, queue: str) -> None:
        self._run(self._parts.on_all(queue, parted.all_pause, True))

    def resume(self, queue: str) -> None:
        self._run(self._parts.on_all(queue, parted.all_pause, False))

    def cancel(self, queue: str, job_id: str) -> JobState:
        return self._run(self._parts.on_job(queue, job_id, ops.cancel))

    def retry_failed(self, queue: str, ids: Sequence[str] | None = None) -> int:
        return self._run(self._parts.on_all(queue, parted.all_retry_failed, ids))

    def remove(self, queue: str, job_id: str) -> bool:
        return self._run(self._parts.on_job(queue, job_id, ops.remove))

    def workers(self, queue: str | None = None) -> list[WorkerInfo]:
        """Blocking :meth:`QueueClient.workers`."""
        if queue is not None:
            return self._run(ops.workers(QueueKeys(queue)))
        found = []
        for name in self.queues():
            found += self._run(ops.workers(QueueKeys(name)))
        return ops.merge_workers(found)

    def explain(self, queue: str, job_id: str) -> Explanation:
        """Blocking :meth:`QueueClient.explain`."""
        return self._run(self._parts.on_job(queue, job_id, ops.explain))

    def purge(self, queue: str, states: Iterable[JobState | str] | None = None) -> int:
        """Blocking :meth:`QueueClient.purge`."""
        return self._run(self._parts.on_all(queue, parted.all_purge, _states(states)))

    def schedules(self, queue: str) -> list[ScheduleInfo]:
        return self._run(ops.list_schedules(QueueKeys(queue)))

    def remove_schedule(self, queue: str, name: str) -> bool:
        return self._run(ops.remove_schedule(QueueKeys(queue), name))

    def read_events(self, queue: str, after: str | None = None, *, limit: int = 500
                    ) -> tuple[list[Event], str]:
        """See :meth:`QueueClient.read_events`."""
        return self._run(self._parts.on_all(queue, parted.all_events, after, limit))

    def events(self, queue: str, *, after: str | None = None) -> Iterator[Event]:
        """Blocking :meth:`QueueClient.events`."""
        positions: list[str] | None = None
        delay = _RECONNECT_MIN
        turn = 0
        while True:
            try:
                if positions is None:
                    positions = self._run(self._parts.on_all(queue, parted.event_positions,
                                                             after))
                batch, positions = self._run(self._parts.on_all(
                    queue, parted.next_events, positions, _EVENTS_BLOCK_MS, turn))
            except ConnectionError:
                time.sleep(delay)
                delay = min(delay * 2, _RECONNECT_MAX)
                continue
            delay = _RECONNECT_MIN
            turn += 1
            yield from batch


class _Spread:
    """Where a producer's jobs without id, key or dependency go: the partitions in turn."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self, n: int) -> int:
        start, self._next = self._next, self._next + n
        return start


def _add_op(parts: parted.PartitionCounts, queue: Queue[Any] | SyncQueue[Any],
            jobs: Sequence[NewJob], spread: int, durable_timeout_ms: int | None,
            together: bool) -> Op[list[tuple[str, bool]]]:
    """Add ``jobs`` to ``queue``, each in its partition. No jobs (an empty bulk, flow or
    chain) is nothing to add: nothing is asked of the server."""
    if not jobs:
        return []
    return (yield from parts.add(queue.name, queue.partitions, jobs, queue.mode, spread,
                                 durable_timeout_ms, together))


def _states(states: Iterable[JobState | str] | None) -> list[JobState | str] | None:
    """A purge's states as a list (a single state, passed bare, counts as one)."""
    if states is None:
        return None
    if isinstance(states, str):
        return [states]
    return list(states)


def _chain(items: Iterable[Any]) -> list[FlowJob]:
    return [FlowJob(data, depends_on=(index - 1,) if index else ())
            for index, data in enumerate(items)]
