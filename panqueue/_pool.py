"""WorkerPool: several Workers (one per queue) sharing one Redis connection pool and one
shutdown."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from panqueue._keys import check_prefix
from panqueue._registry import Registry
from panqueue._runtime.worker import Worker
from panqueue._store import AsyncTransport, open_async_transport
from panqueue._url import resolve_url

__all__ = ["WorkerPool"]


class WorkerPool:
    """Runs a Worker for each queue (default: every queue of the registry).

    Use ``await pool.run()`` to run until :meth:`shutdown`, or embed it in a service with
    ``async with WorkerPool(...) as pool:`` (workers run inside the block; leaving it shuts
    them down with the default grace).
    """

    def __init__(self, registry: Registry, *, url: str | None = None,
                 queues: Sequence[str] | None = None, concurrency: int | None = None,
                 grace: float = 30.0, prefix: str | None = None,
                 **worker_options: Any) -> None:
        self.url = resolve_url(url if url is not None else registry.url)
        # The key namespace of every worker (Worker's prefix; default: the registry's).
        self.prefix = check_prefix(prefix) if prefix is not None else registry.prefix
        self._registry = registry
        self._queues = list(queues) if queues is not None else registry.queues
        # The workers are made by run(), on the pool's connection (opened there: it needs the
        # event loop); their arguments are checked now, as making them would.
        inspect.signature(Worker).bind(registry, "", url=self.url, concurrency=concurrency,
                                       grace=grace, prefix=self.prefix, **worker_options)
        for name in self._queues:
            registry.get(name)  # an unknown queue: ConfigError
        self.grace = grace
        self._concurrency = concurrency
        self._worker_options = worker_options
        self.workers: list[Worker] = []
        self._stopping = False
        self._transport: AsyncTransport | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run every worker until :meth:`shutdown`; returns when all have stopped."""
        if self._stopping:  # shutdown() was called before run()
            task_status.started()
            return
        self._transport = open_async_transport(self.url, self.prefix)
        try:
            self.workers = [
                Worker(self._registry, name, url=self.url, concurrency=self._concurrency,
                       grace=self.grace, transport=self._transport, prefix=self.prefix,
                       **self._worker_options)
                for name in self._queues
            ]
            async with anyio.create_task_group() as tg:
                for worker in self.workers:
                    await tg.start(worker.run)
                task_status.started()
        finally:
            with anyio.move_on_after(2.0, shield=True):  # bounded, like each worker's own
                await self._transport.aclose()

    async def __aenter__(self) -> WorkerPool:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._tg.start(self.run)
        except BaseException as exc:
            await self._tg.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        assert self._tg is not None
        if exc is not None and not isinstance(exc, Exception):
            self._tg.cancel_scope.cancel()
        else:
            await self.shutdown()
        return await self._tg.__aexit__(exc_type, exc, tb)

    async def shutdown(self, grace: float | None = None) -> None:
        """Two-phase shutdown of every worker at once (see :meth:`Worker.shutdown`)."""
        self._stopping = True
        async with anyio.create_task_group() as tg:
            for worker in self.workers:
                tg.start_soon(worker.shutdown, self.grace if grace is None else grace)

    def force(self) -> None:
        """Skip the rest of the grace period of every worker."""
        self._stopping = True
        for worker in self.workers:
            worker.force()
