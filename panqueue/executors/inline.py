"""The inline executor: async handlers on the worker's own event loop (the fastest tier)."""

from __future__ import annotations

import inspect
from typing import Any

import anyio

from panqueue._job import Job
from panqueue.errors import ConfigError
from panqueue.executors.base import Executor, JobTimeout

__all__ = ["InlineExecutor"]


class InlineExecutor(Executor):
    """Awaits the handler coroutine directly. Forced shutdown is plain cancellation."""

    name = "inline"
    runs_chunks = True

    @classmethod
    def check_handler(cls, fn: Any, queue: str) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(
                f"handler for queue {queue!r} is a plain function; the inline executor runs "
                "async functions only (use executor='thread' for blocking code)")

    async def run(self, job: Job, timeout: float | None) -> Any:
        if timeout is None:  # awaited here: one coroutine fewer per job
            return await self.handler.fn(job)
        return await self._call(job, timeout)

    async def run_chunk(self, jobs: list[Job], timeout: float | None) -> Any:
        return await self._call(jobs, timeout)

    async def _call(self, argument: Job | list[Job], timeout: float | None) -> Any:
        if timeout is None:
            return await self.handler.fn(argument)
        with anyio.move_on_after(timeout) as scope:
            return await self.handler.fn(argument)
        if scope.cancelled_caught:
            raise JobTimeout(timeout)
        return None  # pragma: no cover - the handler returned inside the scope
