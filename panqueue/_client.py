"""The clients: ``QueueClient`` (async) and ``SyncQueueClient``, for producing jobs and
administering queues.

Both clients build the same operations (``_store.ops``) and differ only in how they drive
them, through their producer (``_producer.py``): awaiting an async transport, or blocking on
redis-py's sync client. Adding goes through the queue handles ``client.queue()`` returns
(``_queue.py``) and the batches ``client.batch()`` opens (``_batch.py``). Validating a
producer's arguments is an operation's job too (``ops.new_job``).

The two clients mirror each other method for method (each method one line over an
operation), side by side in one file, where a method added to one and not the other shows.

Longer than 400 lines because it holds both clients, each public method written twice (async and
blocking), each a line or two over one operation of ``_store.ops``: splitting them would put one
class's halves in two files.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

import anyio

from panqueue._batch import Batch, SyncBatch, new_batch, new_sync_batch
from panqueue._codec import DEFAULT_COMPRESS_OVER, DEFAULT_MAX_PAYLOAD, check_size, encode_checked
from panqueue._job import JobInfo, JobState
from panqueue._keys import QueueKeys, prefixed
from panqueue._producer import EventTail, Producer, SyncProducer, target
from panqueue._queue import Queue, SyncQueue
from panqueue._store import (
    Event,
    Explanation,
    Op,
    ScheduleInfo,
    WorkerInfo,
    WorkerProcess,
    check_url,
    ops,
)
from panqueue._store.ops import partitions as parted
from panqueue._store.ops.explain import Tool
from panqueue._store.ops.timings import Timings
from panqueue._url import resolve_url
from panqueue.errors import ConfigError, ConnectionError, PanqueueError

if TYPE_CHECKING:
    from panqueue._registry import Handler

__all__ = ["QueueClient", "SyncQueueClient"]

T = TypeVar("T")
D = TypeVar("D")


def signal_args(name: object, payload: Any, limit: int | None) -> tuple[str, bytes]:
    """A signal's name and its payload in stored form, checked before anything is sent (the
    payload bounded by the client's ``max_payload_bytes``, like a job's data)."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ConfigError(f"a signal's name must be a non-empty string of at most 200 "
                          f"characters, got {name!r}")
    blob = encode_checked(payload, "payload")
    check_size(len(blob), limit, "the signal's payload")
    return name, blob


# --------------------------------------------------------------------------- async


class QueueClient:
    """The async client: ``async with QueueClient(url) as client: ...``.

    ``prefix``: a namespace for every key the client reads and writes (``{<prefix>:q:<queue>}``),
    so that several applications share one Redis, each under its own ACL key pattern; the
    workers of the queues run with the same prefix. ``max_payload_bytes``: the bound of one
    job's encoded data and options (None: no bound); a job over it raises
    :class:`PayloadError` naming its size and nothing is written. ``compress_over_bytes``: a
    job's encoded data over this many bytes (default 1024; None: never) is stored compressed
    with zlib when that makes it smaller; every reader gets the data back as it was added.

    ``producer``: what the client adds and reads through (``_producer.py``), shared with the
    queue handles and batches it hands out; the package's own surface, not part of the API.
    """

    def __init__(self, url: str | None = None, *, prefix: str | None = None,
                 max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD,
                 compress_over_bytes: int | None = DEFAULT_COMPRESS_OVER) -> None:
        self.producer = Producer(check_url(resolve_url(url)), prefix=prefix,
                                 max_payload_bytes=max_payload_bytes,
                                 compress_over_bytes=compress_over_bytes)
        self.url = self.producer.url
        self.prefix = self.producer.prefix

    def _keys(self, queue: str) -> QueueKeys:
        with prefixed(self.prefix):
            return QueueKeys(queue)

    async def __aenter__(self) -> QueueClient:
        self.producer.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _run(self, op: Op[T]) -> T:
        return await self.producer.run(op)

    async def aclose(self) -> None:
        await self.producer.aclose()

    @overload
    def queue(self, queue: Handler[Any, Any, D], **defaults: Any) -> Queue[D]: ...

    @overload
    def queue(self, queue: str, **defaults: Any) -> Queue[Any]: ...

    def queue(self, queue: str | Handler[Any, Any, Any], **defaults: Any) -> Queue[Any]:
        """A handle on a queue with producer defaults (``priority``, ``delay``, ``attempts``,
        ``backoff``, ``timeout``) and optionally ``mode`` ('global' or 'keyed': adds fail
        if the queue's stored mode differs). A handler's queue is typed by its payload
        (``Queue[Email]`` for a handler of ``Job[Email]``)."""
        return Queue(self.producer, target(queue, defaults, self.prefix))

    async def batch(self, on_complete: tuple[str, Any], on_success: tuple[str, Any] | None = None,
                    *, parent: Batch | str | None = None) -> Batch:
        """Open a batch (panqueue/_batch.py): ``on_complete=("queue", data)`` is added once
        the batch is closed and every job in it ended; ``on_success`` only if none failed.
        ``parent``: a batch whose jobs these callbacks become (a child batch)."""
        return await new_batch(self, on_complete, on_success, parent)

    async def ping(self) -> None:
        """Check that Redis answers; raises :class:`ConnectionError` if it cannot be reached."""
        await self._run(ops.ping())

    async def queues(self) -> list[str]:
        """The names of every queue that has state in Redis, sorted. Scans the keyspace (every
        master of a cluster): for dashboards and operators, not for a hot path."""
        return await self._run(ops.queues())

    async def queue_exists(self, queue: str) -> bool:
        """Whether ``queue`` has state in Redis (a job was added to it or a worker served it)."""
        return await self._run(ops.known_queue(self._keys(queue)))

    async def is_paused(self, queue: str) -> bool:
        """Whether ``queue`` is paused (:meth:`pause`)."""
        return await self._run(ops.is_paused(self._keys(queue)))

    async def get_job(self, queue: str, job_id: str) -> JobInfo:
        return await self._run(self.producer.on_job(queue, job_id, ops.get_job))

    async def list_jobs(self, queue: str, state: JobState | str, *, tag: str | None = None,
                        error_type: str | None = None, limit: int = 100,
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

        ``tag``: only jobs added with that tag, read from the tag's index in the order they
        were added (finished states newest first). ``error_type``: only jobs whose last error
        is of that type (``"TimeoutError"``). Both filter on the server, which sends back only
        the page.
        """
        return await self._run(self.producer.on_all(queue, parted.all_list_jobs, state, limit,
                                                  offset, tag, error_type))

    async def counts(self, queue: str) -> dict[JobState, int]:
        return await self._run(self.producer.on_all(queue, parted.all_counts))

    async def pause(self, queue: str) -> None:
        await self._run(self.producer.on_all(queue, parted.all_pause, True))

    async def resume(self, queue: str) -> None:
        await self._run(self.producer.on_all(queue, parted.all_pause, False))

    async def cancel(self, queue: str, job_id: str) -> JobState:
        return await self._run(self.producer.on_job(queue, job_id, ops.cancel))

    async def signal(self, queue: str, job_id: str, name: str, payload: Any = None) -> bool:
        """Send the durable job ``job_id`` the signal ``name`` with a JSON-compatible
        ``payload``: ``job.wait_for(name)`` returns it. Kept until a wait takes it (several of
        one name are taken oldest first, one per wait); a job that waits for it now is woken.
        Returns False when the job is already final (nothing kept)."""
        name, blob = signal_args(name, payload, self.producer.max_payload_bytes)
        return await self._run(self.producer.on_job(queue, job_id, ops.signal, name, blob))

    async def retry_failed(self, queue: str, ids: Sequence[str] | None = None, *,
                           tag: str | None = None, error_type: str | None = None) -> int:
        """Move failed jobs back to waiting; returns how many moved. ``ids``: those jobs;
        ``tag`` / ``error_type``: every failed job that carries the tag and whose last error
        is of that type; neither: every failed job. Each script call moves a bounded chunk.
        Safe to run again: a job that is no longer failed is left as it is."""
        return await self._run(self.producer.on_all(queue, parted.all_retry_matching, ids, tag,
                                                  error_type))

    async def remove(self, queue: str, job_id: str) -> bool:
        return await self._run(self.producer.on_job(queue, job_id, ops.remove))

    async def cancel_jobs(self, queue: str, *, tag: str | None = None,
                          state: JobState | str | None = None) -> int:
        """Cancel every job of ``queue`` that carries ``tag`` and is in ``state`` (at least one
        of them; no state: every job not finished); returns how many were cancelled. An active
        job counts once its worker is told to stop it. Picked on the server a page at a time;
        safe to run again (finished jobs are left as they are)."""
        return await self._run(self.producer.on_all(queue, parted.all_cancel_jobs, tag, state))

    async def remove_jobs(self, queue: str, *, tag: str | None = None,
                          state: JobState | str | None = None) -> int:
        """Delete every job of ``queue`` that carries ``tag`` and is in ``state`` (at least one
        of them; no state: every job but the active ones, which are never removed); returns how
        many were deleted. Safe to run again."""
        return await self._run(self.producer.on_all(queue, parted.all_remove_jobs, tag, state))

    async def workers(self, queue: str | None = None) -> list[WorkerInfo]:
        """The live workers of ``queue`` (``None``: of every queue, one entry per worker name),
        from their heartbeats. A worker that stopped cleanly is gone at once; one that died is
        gone within three heartbeat intervals."""
        if queue is not None:
            return await self._run(ops.workers(self._keys(queue)))
        found = []
        for name in await self.queues():
            found += await self._run(ops.workers(self._keys(name)))
        return ops.merge_workers(found)

    async def worker_processes(self, queue: str | None = None) -> list[WorkerProcess]:
        """The live worker processes (of ``queue``, or of every queue): one row per process
        with every queue it serves, its slots over all of them and the jobs it runs; its
        entries per queue, as :meth:`workers` reads them, in ``workers``."""
        names = [queue] if queue is not None else await self.queues()
        found = []
        for name in names:
            found += await self._run(ops.workers(self._keys(name)))
        return ops.worker_processes(found)

    async def control(self, worker_name: str, command: str | None = None, *,
                      concurrency: int | None = None) -> None:
        """Tell a live worker to ``"stop"`` (as on SIGTERM: it claims nothing more and lets its
        running jobs finish within its grace period), ``"pause"`` (it claims nothing until
        ``"resume"``; running jobs go on) or ``"resume"``, or to run up to ``concurrency`` jobs
        at once from now on. The worker applies it at its next heartbeat. ``worker_name`` is
        the name :meth:`workers` lists; a worker serving several queues gets the command in
        each. A process's name as :meth:`worker_processes` lists it (``host:pid`` for one whose
        workers have names of their own, ``WorkerPool`` without ``name=``) tells every worker
        of that process (``concurrency`` is then each one's). Raises :class:`PanqueueError`
        when no live worker has that name."""
        wire = ops.control_command(command, concurrency)
        queues = await self.queues()
        targets = ops.control_targets(worker_name, await self.worker_processes(), queues)
        told = await self._run(ops.control(targets, wire))
        if not told:
            raise PanqueueError(_no_worker(worker_name))

    async def explain(self, queue: str, job_id: str, *, tool: Tool = "python") -> Explanation:
        """Why the job is in its state, from Redis alone: paused, delayed until when (a retry:
        after which error, attempt n of m), blocked on which dependency, its key busy,
        rate-limited, queued behind how many jobs (every slot taken: by which jobs, for how
        long), no live worker, running on which worker, or finished (how and when).

        ``tool``: whose words a hint uses: ``"python"`` (the client's calls), ``"cli"`` (the
        ``panqueue`` command to type) or ``"dashboard"`` (its buttons)."""
        return await self._run(self.producer.on_job(queue, job_id, ops.explain, tool,
                                                    self.prefix))

    async def purge(self, queue: str, states: Iterable[JobState | str] | None = None) -> int:
        """Delete the jobs of ``queue`` in ``states`` and return how many were deleted.
        ``None``: every job that is not active, and the queue's settings unless a job is
        active or a live worker serves the queue.
        Active jobs are deleted only when ``states`` names ACTIVE (their workers then lose
        their locks). Dependents of a deleted job that still wait for it fail."""
        return await self._run(self.producer.on_all(queue, parted.all_purge, _states(states)))

    async def schedules(self, queue: str) -> list[ScheduleInfo]:
        """The queue's schedules as registered in Redis, with their next run times."""
        return await self._run(ops.list_schedules(self._keys(queue)))

    async def remove_schedule(self, queue: str, name: str) -> bool:
        """Delete a schedule from Redis (a worker whose registry still defines it registers
        it again when it starts)."""
        return await self._run(ops.remove_schedule(self._keys(queue), name))

    async def timings(self, queue: str, *, window: float = 60.0) -> Timings:
        """Wait and run times (p50, p95) of the jobs of ``queue`` that completed or failed in
        the last ``window`` seconds (the newest 1,000 of them at most), read back from their
        job hashes: nothing is written for them on a job's path."""
        return await self._run(self.producer.on_all(queue, ops.recent_timings, window))

    async def read_events(self, queue: str, after: str | None = None, *, limit: int = 500,
                          watch: bool = True) -> tuple[list[Event], str]:
        """The events of ``queue`` after stream id ``after`` that are there now (at most
        ``limit``), without waiting, and the id to pass as ``after`` next time. With ``after``
        None: no events, and the id of the stream's end (start watching from now).

        A read asks the queue to write every event for the next hour: while nobody reads them,
        only the events of a job's end are written, and those only while somebody waits on a
        result or counts them (:class:`~panqueue.Retention`). ``watch=False`` asks for the
        ends of jobs alone (a reader that counts them)."""
        return await self._run(self.producer.on_all(queue, parted.all_events, after, limit,
                                                    watch))

    async def events(self, queue: str, *, after: str | None = None) -> AsyncIterator[Event]:
        """Lifecycle events of a queue, as they happen, forever.

        ``after``: a stream id to resume from (an :attr:`Event.id`, or a position
        :meth:`read_events` returned); default: only new events. On a partitioned queue the
        partitions' events arrive merged by time, each within 0.2 s. While it reads, the
        queue writes every event (see :meth:`read_events`).
        A broken connection is re-established and reading resumes where it stopped, so no
        event is skipped (unless the capped stream dropped it meanwhile).
        """
        tail = EventTail(self.producer, queue, after)
        while True:
            try:
                batch = await self._run(tail.next())
            except ConnectionError:
                await anyio.sleep(tail.backoff())
                continue
            for event in batch:
                yield event


# --------------------------------------------------------------------------- sync


class SyncQueueClient:
    """The blocking client, for scripts, web apps without an event loop, and Spark executors.
    ``producer``: see :class:`QueueClient`."""

    def __init__(self, url: str | None = None, *, prefix: str | None = None,
                 max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD,
                 compress_over_bytes: int | None = DEFAULT_COMPRESS_OVER) -> None:
        self.producer = SyncProducer(check_url(resolve_url(url)), prefix=prefix,
                                     max_payload_bytes=max_payload_bytes,
                                     compress_over_bytes=compress_over_bytes)
        self.url = self.producer.url
        self.prefix = self.producer.prefix

    def _keys(self, queue: str) -> QueueKeys:
        with prefixed(self.prefix):
            return QueueKeys(queue)

    def __enter__(self) -> SyncQueueClient:
        self.producer.connect()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _run(self, op: Op[T]) -> T:
        return self.producer.run(op)

    def close(self) -> None:
        self.producer.close()

    @overload
    def queue(self, queue: Handler[Any, Any, D], **defaults: Any) -> SyncQueue[D]: ...

    @overload
    def queue(self, queue: str, **defaults: Any) -> SyncQueue[Any]: ...

    def queue(self, queue: str | Handler[Any, Any, Any], **defaults: Any) -> SyncQueue[Any]:
        """Blocking :meth:`QueueClient.queue`."""
        return SyncQueue(self.producer, target(queue, defaults, self.prefix))

    def batch(self, on_complete: tuple[str, Any], on_success: tuple[str, Any] | None = None,
              *, parent: SyncBatch | str | None = None) -> SyncBatch:
        """Blocking :meth:`QueueClient.batch`."""
        return new_sync_batch(self, on_complete, on_success, parent)

    def ping(self) -> None:
        """Blocking :meth:`QueueClient.ping`."""
        self._run(ops.ping())

    def queues(self) -> list[str]:
        """Blocking :meth:`QueueClient.queues`."""
        return self._run(ops.queues())

    def queue_exists(self, queue: str) -> bool:
        return self._run(ops.known_queue(self._keys(queue)))

    def is_paused(self, queue: str) -> bool:
        return self._run(ops.is_paused(self._keys(queue)))

    def get_job(self, queue: str, job_id: str) -> JobInfo:
        return self._run(self.producer.on_job(queue, job_id, ops.get_job))

    def list_jobs(self, queue: str, state: JobState | str, *, tag: str | None = None,
                  error_type: str | None = None, limit: int = 100,
                  offset: int = 0) -> list[JobInfo]:
        """Blocking :meth:`QueueClient.list_jobs`."""
        return self._run(self.producer.on_all(queue, parted.all_list_jobs, state, limit, offset,
                                              tag, error_type))

    def counts(self, queue: str) -> dict[JobState, int]:
        return self._run(self.producer.on_all(queue, parted.all_counts))

    def pause(self, queue: str) -> None:
        self._run(self.producer.on_all(queue, parted.all_pause, True))

    def resume(self, queue: str) -> None:
        self._run(self.producer.on_all(queue, parted.all_pause, False))

    def cancel(self, queue: str, job_id: str) -> JobState:
        return self._run(self.producer.on_job(queue, job_id, ops.cancel))

    def signal(self, queue: str, job_id: str, name: str, payload: Any = None) -> bool:
        """:meth:`QueueClient.signal`."""
        name, blob = signal_args(name, payload, self.producer.max_payload_bytes)
        return self._run(self.producer.on_job(queue, job_id, ops.signal, name, blob))

    def retry_failed(self, queue: str, ids: Sequence[str] | None = None, *,
                     tag: str | None = None, error_type: str | None = None) -> int:
        """Blocking :meth:`QueueClient.retry_failed`."""
        return self._run(self.producer.on_all(queue, parted.all_retry_matching, ids, tag,
                                              error_type))

    def remove(self, queue: str, job_id: str) -> bool:
        return self._run(self.producer.on_job(queue, job_id, ops.remove))

    def cancel_jobs(self, queue: str, *, tag: str | None = None,
                    state: JobState | str | None = None) -> int:
        """Blocking :meth:`QueueClient.cancel_jobs`."""
        return self._run(self.producer.on_all(queue, parted.all_cancel_jobs, tag, state))

    def remove_jobs(self, queue: str, *, tag: str | None = None,
                    state: JobState | str | None = None) -> int:
        """Blocking :meth:`QueueClient.remove_jobs`."""
        return self._run(self.producer.on_all(queue, parted.all_remove_jobs, tag, state))

    def workers(self, queue: str | None = None) -> list[WorkerInfo]:
        """Blocking :meth:`QueueClient.workers`."""
        if queue is not None:
            return self._run(ops.workers(self._keys(queue)))
        found = []
        for name in self.queues():
            found += self._run(ops.workers(self._keys(name)))
        return ops.merge_workers(found)

    def worker_processes(self, queue: str | None = None) -> list[WorkerProcess]:
        """Blocking :meth:`QueueClient.worker_processes`."""
        names = [queue] if queue is not None else self.queues()
        found = []
        for name in names:
            found += self._run(ops.workers(self._keys(name)))
        return ops.worker_processes(found)

    def control(self, worker_name: str, command: str | None = None, *,
                concurrency: int | None = None) -> None:
        """Blocking :meth:`QueueClient.control`."""
        wire = ops.control_command(command, concurrency)
        targets = ops.control_targets(worker_name, self.worker_processes(), self.queues())
        if not self._run(ops.control(targets, wire)):
            raise PanqueueError(_no_worker(worker_name))

    def explain(self, queue: str, job_id: str, *, tool: Tool = "python") -> Explanation:
        """Blocking :meth:`QueueClient.explain`."""
        return self._run(self.producer.on_job(queue, job_id, ops.explain, tool, self.prefix))

    def purge(self, queue: str, states: Iterable[JobState | str] | None = None) -> int:
        """Blocking :meth:`QueueClient.purge`."""
        return self._run(self.producer.on_all(queue, parted.all_purge, _states(states)))

    def schedules(self, queue: str) -> list[ScheduleInfo]:
        return self._run(ops.list_schedules(self._keys(queue)))

    def remove_schedule(self, queue: str, name: str) -> bool:
        return self._run(ops.remove_schedule(self._keys(queue), name))

    def timings(self, queue: str, *, window: float = 60.0) -> Timings:
        """Blocking :meth:`QueueClient.timings`."""
        return self._run(self.producer.on_all(queue, ops.recent_timings, window))

    def read_events(self, queue: str, after: str | None = None, *, limit: int = 500,
                    watch: bool = True) -> tuple[list[Event], str]:
        """See :meth:`QueueClient.read_events`."""
        return self._run(self.producer.on_all(queue, parted.all_events, after, limit, watch))

    def events(self, queue: str, *, after: str | None = None) -> Iterator[Event]:
        """Blocking :meth:`QueueClient.events`."""
        tail = EventTail(self.producer, queue, after)
        while True:
            try:
                batch = self._run(tail.next())
            except ConnectionError:
                time.sleep(tail.backoff())
                continue
            yield from batch


def _no_worker(name: str) -> str:
    return (f"no live worker named {name!r} (`panqueue workers` lists them; a worker that "
            "stopped or died is gone within three heartbeats)")


def _states(states: Iterable[JobState | str] | None) -> list[JobState | str] | None:
    """A purge's states as a list (a single state, passed bare, counts as one)."""
    if states is None:
        return None
    if isinstance(states, str):
        return [states]
    return list(states)
