"""The registry's handlers as producers: :class:`Handler` (``handler.enqueue`` /
``handler.aenqueue``) and the clients a registry opens for them.

A :class:`~panqueue.Registry` made with ``url=`` (else ``PANQUEUE_URL``) lets its handlers add
jobs to their own queues without a client opened by hand, the way Celery's ``delay`` and RQ's
``enqueue`` are used. What it opens lives here:

- one blocking producer for the whole process, opened by the first ``enqueue`` of any thread
  (the producer is thread-safe; opening it is done once, under a lock);
- one async producer per event loop, opened by the first ``aenqueue`` in that loop: an async
  connection belongs to the loop it was made in, so a loop never uses another's.

``registry.close()`` closes the blocking one; ``await registry.aclose()`` the current loop's.
Both may be called more than once, and a later ``enqueue`` opens a fresh one.

Where they add: in a handler that a worker runs, where that worker serves (its URL and key
prefix, :data:`SERVED`, which the worker sets for its tasks and the thread executor carries
into its threads); elsewhere the registry's ``url``/``prefix``, else ``PANQUEUE_URL`` and
``PANQUEUE_PREFIX``. A producer is kept for each place.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import anyio.lowlevel

from panqueue._handler import HandlerBase, HandlerOptions
from panqueue._job import PayloadT
from panqueue._options import Backoff, Dedup
from panqueue.errors import ConfigError

if TYPE_CHECKING:
    from panqueue._producer import Dependency, JobHandle, Producer, SyncJobHandle, SyncProducer
    from panqueue._queue import Queue, SyncQueue

__all__ = ["SERVED", "Handler", "RegistryClients", "check_registry_url"]

#: The URL and key prefix of the worker whose task this is (set by the worker for everything it
#: runs): a handler's ``enqueue`` adds where the handler is served from.
SERVED: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
    "panqueue_served", default=None)

P = ParamSpec("P")
R = TypeVar("R")


class Handler(HandlerBase[P, R, PayloadT]):
    """A registered handler: callable like the decorated function, and a producer for its
    queue. ``PayloadT`` is its jobs' data type (see :class:`HandlerBase`), which
    :meth:`enqueue` and :meth:`aenqueue` take."""

    def __init__(self, queue: str, fn: Callable[P, R], options: HandlerOptions,
                 job_defaults: dict[str, Any], clients: RegistryClients) -> None:
        super().__init__(queue, fn, options, job_defaults)
        self._clients = clients

    def enqueue(self, data: PayloadT = None, *,  # type: ignore[assignment]
                job_id: str | None = None, delay: float | None = None,
                run_at: datetime | None = None, priority: int | None = None,
                attempts: int | None = None, backoff: Backoff | None = None,
                timeout: float | None = None, key: str | None = None,
                dedup: Dedup | None = None, depends_on: Sequence[Dependency] | None = None,
                durable: bool = False, expires: float | datetime | None = None,
                tags: Sequence[str] | None = None) -> SyncJobHandle:
        """Add a job to this handler's queue, blocking, through the registry's client (opened
        on first use from ``Registry(url=...)``, else ``PANQUEUE_URL``; one for the process,
        safe from any thread). The options are those of :meth:`panqueue.SyncQueue.add`, over
        the handler's producer defaults."""
        queue: SyncQueue[PayloadT] = self._clients.sync_queue(self)
        return queue.add(data, job_id=job_id, delay=delay, run_at=run_at, priority=priority,
                         attempts=attempts, backoff=backoff, timeout=timeout, key=key,
                         dedup=dedup, depends_on=depends_on, durable=durable, expires=expires,
                         tags=tags)

    async def aenqueue(self, data: PayloadT = None, *,  # type: ignore[assignment]
                       job_id: str | None = None, delay: float | None = None,
                       run_at: datetime | None = None, priority: int | None = None,
                       attempts: int | None = None, backoff: Backoff | None = None,
                       timeout: float | None = None, key: str | None = None,
                       dedup: Dedup | None = None,
                       depends_on: Sequence[Dependency] | None = None, durable: bool = False,
                       expires: float | datetime | None = None,
                       tags: Sequence[str] | None = None) -> JobHandle:
        """:meth:`enqueue` for async code, through the registry's client for the running
        event loop (asyncio or trio; one per loop, opened on first use)."""
        queue: Queue[PayloadT] = self._clients.queue(self)
        return await queue.add(data, job_id=job_id, delay=delay, run_at=run_at,
                               priority=priority, attempts=attempts, backoff=backoff,
                               timeout=timeout, key=key, dedup=dedup, depends_on=depends_on,
                               durable=durable, expires=expires, tags=tags)


def check_registry_url(url: str | None) -> str | None:
    """``Registry(url=...)``'s URL, checked for form (nothing is connected)."""
    if url is None:
        return None
    if not isinstance(url, str):
        raise ConfigError(f"Registry(url=...) must be a Redis URL (str) or None, got {url!r}")
    from panqueue._store import check_url

    return check_url(url)


class RegistryClients:
    """The producers of one registry: blocking ones, and ones per running event loop, each for
    one place (a URL and a key prefix: see the module's docstring).

    The producer side (the client, the store, redis-py) is imported on the first enqueue: a
    process that imports an application's handlers to run them (a subprocess executor's
    child) does not load it."""

    def __init__(self, url: str | None, prefix: str | None = None) -> None:
        self.url = url
        self.prefix = prefix
        self._lock = threading.Lock()
        self._sync: dict[tuple[str, str | None], SyncProducer] = {}
        # Keyed by the loop object (an asyncio loop, trio's token) and the place, the loop held
        # alongside so the key's id is not reused while the entry lives.
        self._async: dict[tuple[int, str, str | None], tuple[Any, Producer]] = {}

    def resolve(self) -> tuple[str, str | None]:
        """Where to add: the serving worker's URL and prefix, else the registry's, else
        ``PANQUEUE_URL`` and ``PANQUEUE_PREFIX``."""
        served = SERVED.get()
        if served is not None:
            return served
        url = self.url or os.environ.get("PANQUEUE_URL")
        if not url:
            raise ConfigError("handler.enqueue() needs a Redis URL: make the registry with "
                              "Registry(url='redis://...') or set PANQUEUE_URL")
        from panqueue._keys import check_prefix
        from panqueue._store import check_url

        return check_url(url), check_prefix(
            self.prefix or os.environ.get("PANQUEUE_PREFIX") or None)

    def sync_queue(self, handler: Handler[Any, Any, PayloadT]) -> SyncQueue[PayloadT]:
        """``handler``'s queue through the blocking producer of its place."""
        from panqueue._producer import SyncProducer, target
        from panqueue._queue import SyncQueue

        url, prefix = self.resolve()
        with self._lock:
            producer = self._sync.get((url, prefix))
            if producer is None:
                producer = self._sync[url, prefix] = SyncProducer(url, prefix=prefix)
        return SyncQueue(producer, target(handler, {}, prefix))

    def queue(self, handler: Handler[Any, Any, PayloadT]) -> Queue[PayloadT]:
        """``handler``'s queue through the running event loop's producer of its place."""
        from panqueue._producer import Producer, target
        from panqueue._queue import Queue

        url, prefix = self.resolve()
        loop = _current_loop()
        key = (id(loop), url, prefix)
        with self._lock:
            entry = self._async.get(key)
            if entry is None or entry[0] is not loop:
                self._forget_closed_loops()
                entry = self._async[key] = (loop, Producer(url, prefix=prefix))
        return Queue(entry[1], target(handler, {}, prefix))

    def close(self) -> None:
        with self._lock:
            producers, self._sync = list(self._sync.values()), {}
            self._forget_closed_loops()
        for producer in producers:
            producer.close()

    async def aclose(self) -> None:
        loop = _current_loop()
        with self._lock:
            mine = [key for key, (held, _) in self._async.items() if held is loop]
            entries = [self._async.pop(key) for key in mine]
        for _, producer in entries:
            await producer.aclose()

    def _forget_closed_loops(self) -> None:
        """Drop the entries of asyncio loops that are closed: nothing can run on them any
        more (their connections were not closed in time; see :meth:`aclose`)."""
        for key, (loop, _) in list(self._async.items()):
            is_closed = getattr(loop, "is_closed", None)
            if is_closed is not None and is_closed():
                del self._async[key]


def _current_loop() -> Any:
    """The running event loop: asyncio's loop object, or trio's token."""
    return anyio.lowlevel.current_token().native_token
