"""The thread executor: sync (blocking) handlers in daemon threads, off the event loop.

The worker's async code (claiming, lock renewal, wake-ups) is never blocked by a handler. A
Python thread cannot be killed: when an attempt times out, is cancelled or outlives the forced
shutdown phase, the executor stops waiting for it and ``job.should_stop()`` turns true; the
thread is a daemon thread, so it never keeps the process alive.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from panqueue._job import DONE, Job
from panqueue.errors import ConfigError
from panqueue.executors.base import Executor, HandlerAborted, JobTimeout

__all__ = ["ThreadExecutor"]


class _DaemonThreads:
    """Reusable daemon threads; grows when all are busy (the worker's semaphore bounds how many
    jobs run, so the pool only exceeds the concurrency by threads that were abandoned)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                self._threads += 1
                threading.Thread(target=self._loop, daemon=True,
                                 name=f"{self._name}-{self._threads}").start()
        self._work.put(fn)

    def _loop(self) -> None:
        while True:
            fn = self._work.get()
            if fn is None:
                return
            fn()
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._work.put(None)


def _call_soon(token: anyio.lowlevel.EventLoopToken, fn: Callable[[], None]) -> None:
    """Schedule ``fn`` on the event loop without waiting for it (so the thread is free for the
    next job at once). Does nothing if the loop is gone: nobody waits any more."""
    native: Any = token.native_token
    try:
        if hasattr(native, "call_soon_threadsafe"):  # asyncio: the loop itself
            native.call_soon_threadsafe(fn)
        else:  # trio: a TrioToken
            native.run_sync_soon(fn)
    except RuntimeError:  # loop closed / trio.RunFinishedError
        pass


class _Finished:
    """Wakes the attempts whose threads finished: the events are set on the event loop by one
    callback per burst of finishing threads, not one each (every callback from a thread costs
    the loop a wake-up)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[anyio.Event] = []
        self._scheduled = False

    def add(self, token: anyio.lowlevel.EventLoopToken, event: anyio.Event) -> None:
        """Called from a handler's thread."""
        with self._lock:
            self._events.append(event)
            if self._scheduled:
                return
            self._scheduled = True
        _call_soon(token, self._set_all)

    def _set_all(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            self._scheduled = False
        for event in events:
            event.set()


async def _await(awaitable: Awaitable[None]) -> None:
    await awaitable


class ThreadExecutor(Executor):
    """Runs sync handlers in threads; ``job.progress()``/``job.log()`` are plain calls there."""

    name = "thread"
    runs_chunks = True

    @classmethod
    def check_handler(cls, fn: Any, queue: str) -> None:
        import inspect

        if inspect.iscoroutinefunction(fn):
            raise ConfigError(f"handler for queue {queue!r} is async; the thread executor runs "
                              "plain functions (use the default inline executor)")

    def __init__(self, handler: Any) -> None:
        super().__init__(handler)
        self._threads = _DaemonThreads(f"panqueue-{handler.queue}")
        self._finished = _Finished()

    async def run(self, job: Job, timeout: float | None) -> Any:
        return await self._in_thread(lambda for_thread: for_thread(job), timeout)

    async def run_chunk(self, jobs: list[Job], timeout: float | None) -> Any:
        return await self._in_thread(lambda for_thread: [for_thread(job) for job in jobs],
                                     timeout)

    async def _in_thread(self, argument: Callable[[Callable[[Job], Job]], Any],
                         timeout: float | None) -> Any:
        """Call the handler in a thread with ``argument(for_thread)``, where ``for_thread``
        makes a job's view for the thread (its reports go through the event loop)."""
        token = anyio.lowlevel.current_token()
        done = anyio.Event()
        outcome: list[tuple[bool, Any]] = []
        abandoned = False

        def for_thread(job: Job) -> Job:
            async_sink = job._sink

            def sink(kind: str, value: Any) -> Awaitable[None]:
                # Report from the handler's thread through the event loop, and wait for it.
                if not abandoned:
                    anyio.from_thread.run(_await, async_sink(kind, value), token=token)
                return DONE

            def should_stop() -> bool:
                return abandoned or job.should_stop()

            return job.rebind(sink, should_stop)

        handler_argument = argument(for_thread)
        fn = self.handler.fn
        finished = self._finished

        def work() -> None:
            try:
                outcome.append((True, fn(handler_argument)))
            except BaseException as exc:  # handed to the event loop, which re-raises it
                outcome.append((False, exc))
            finished.add(token, done)

        self._threads.submit(work)
        scope = anyio.move_on_after(timeout)
        try:
            with scope:
                await done.wait()
        finally:
            if not done.is_set():
                abandoned = True  # cancelled (shutdown, cancel request, lock lost) or timeout
                # The thread runs on, and the pool starts another for the next job.
                self.restarted("timeout" if scope.cancelled_caught else "stopped")
        if scope.cancelled_caught:
            raise JobTimeout(timeout or 0)
        ok, value = outcome[0]
        if ok:
            return value
        if not isinstance(value, Exception):  # SystemExit, KeyboardInterrupt... in the thread
            raise HandlerAborted(value)
        raise value

    async def aclose(self) -> None:
        self._threads.close()
