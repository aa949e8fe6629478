"""The thread executor: sync (blocking) handlers in daemon threads, off the event loop.

The worker's async code (claiming, lock renewal, wake-ups) is never blocked by a handler. A
Python thread cannot be killed: when an attempt times out, is cancelled or outlives the forced
shutdown phase, the executor stops waiting for it and ``job.should_stop()`` turns true; the
thread is a daemon thread, so it never keeps the process alive. Such a thread may still be in
the handler when the same job runs here again (retried after its timeout, or claimed again
after its lock was lost): the new run's handler starts only once that thread has returned, so
one worker never runs a job twice at once. The wait counts towards the new attempt's timeout.

How jobs reach threads and how their ends get back to the event loop: :mod:`._threadpool`
and :mod:`._loops`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

try:
    import sniffio
except ImportError:  # not installed: nothing marks a running event loop in a context
    sniffio = None  # type: ignore[assignment]

from panqueue._job import DONE, Job, ReportKind
from panqueue.errors import ConfigError
from panqueue.executors._loops import _Loop, current_loop
from panqueue.executors._threadpool import FINISHED, PATIENCE, Pool, Task
from panqueue.executors.base import Executor, HandlerAborted, JobTimeout

__all__ = ["PATIENCE", "ThreadExecutor"]

# How often a run waiting for the thread of an earlier run of its job looks whether it has
# returned. A rare path (an attempt abandoned while its handler ran on, then the job run here
# again), and a handler that never returns must not hold a thread to watch it.
_LEFT_POLL = 0.02


class _Call(Task):
    """One call of the handler: made on the event loop, run in a thread, delivered back. For a
    single job it is also the job's way to report from the thread (see :class:`_Reports`)."""

    __slots__ = ("chunk", "context", "delivered", "fn", "job")

    def __init__(self, fn: Callable[[Any], Any], loop: _Loop, job: Job | None,
                 chunk: list[Job] | None = None) -> None:
        super().__init__(loop)
        self.fn = fn
        self.job = job  # a single job's call
        self.chunk = chunk  # a chunk's call
        self.delivered = False  # its end reached the waiting attempt
        # The attempt's context variables, as an inline handler sees them: where its worker
        # serves (a handler's enqueue adds there), a trace's span... but for the event loop's
        # own, as anyio's and trio's to_thread leave it: no loop runs in the handler's thread
        # (it may run one of its own).
        self.context = contextvars.copy_context()
        if sniffio is not None:  # anyio reads it where it is installed
            self.context.run(sniffio.current_async_library_cvar.set, None)

    def run(self) -> None:
        """In a pool thread. The jobs' views for the thread are made here, off the loop."""
        if self.abandoned:  # ended while waiting for a thread (and not yet dropped)
            return
        self.inside = True
        try:
            argument: Any
            if self.job is not None:
                argument = self.job.rebind(self.sink, self.should_stop, self.bridge)
            else:
                argument = [_Reports(self, job).view() for job in self.chunk or ()]
            self.value = self.context.run(self.fn, argument)
            self.ok = True
        except BaseException as exc:  # handed to the event loop, which re-raises it
            self.value = exc
        self.inside = False

    def result(self) -> Any:
        """On the event loop, once delivered: what the handler returned, or raise."""
        if self.ok:
            return self.value
        value = self.value
        if not isinstance(value, Exception):  # SystemExit, KeyboardInterrupt... in the thread
            raise HandlerAborted(value)
        raise value

    def sink(self, kind: ReportKind, value: Any) -> Awaitable[None]:
        """The single job's reports from the handler's thread."""
        return _report(self, self.job, kind, value)

    def should_stop(self) -> bool:
        return self.abandoned or self.job is None or self.job.should_stop()

    def bridge(self, op: str, *args: Any) -> Any:
        """The single job's durable calls (job.step, job.sleep, job.wait_for) from the
        handler's thread: run on the event loop, their result (or exception) brought back."""
        if self.abandoned or self.job is None:
            raise HandlerAborted(SystemExit("the attempt gave up on this thread"))
        return anyio.from_thread.run(self.job.relay_durable, op, *args, token=self.loop.token)


class _Reports:
    """A chunk's job's reports from the handler's thread."""

    __slots__ = ("call", "job")

    def __init__(self, call: _Call, job: Job) -> None:
        self.call = call
        self.job = job

    def sink(self, kind: ReportKind, value: Any) -> Awaitable[None]:
        return _report(self.call, self.job, kind, value)

    def should_stop(self) -> bool:
        return self.call.abandoned or self.job.should_stop()

    def view(self) -> Job:
        return self.job.rebind(self.sink, self.should_stop)


def _report(call: _Call, job: Job | None, kind: ReportKind, value: Any) -> Awaitable[None]:
    """From the handler's thread: report to ``job`` through the event loop, and wait for it
    (nothing once the attempt has given up on the call)."""
    if not call.abandoned and job is not None:
        report = job.progress(value) if kind == "p" else job.log(value)
        anyio.from_thread.run(_await, report, token=call.loop.token)
    return DONE


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
        self._pool = Pool(f"panqueue-{handler.queue}")
        self._loop: _Loop | None = None
        # Abandoned calls whose thread was still in the handler, by job id: a later run of
        # the job waits for that thread (see the module's docstring).
        self._left: dict[str, _Call] = {}

    async def run(self, job: Job, timeout: float | None) -> Any:
        if timeout is not None or (self._left and job.id in self._left):
            return await self._in_thread(_Call(self.handler.fn, self._current_loop(), job),
                                         timeout)
        # The same as _in_thread without a timeout, one coroutine fewer on the hot path.
        call = _Call(self.handler.fn, self._current_loop(), job)
        loop = call.loop
        loop.prepare(call)
        self._pool.submit(call)
        try:
            await loop.wait(call)
        except BaseException:
            self._abandon(call, False)
            raise
        return call.result()

    async def run_chunk(self, jobs: list[Job], timeout: float | None) -> Any:
        return await self._in_thread(
            _Call(self.handler.fn, self._current_loop(), None, list(jobs)), timeout)

    def _current_loop(self) -> _Loop:
        loop = self._loop
        if loop is None or not loop.current():
            loop = self._loop = current_loop(self._pool.lock)
        return loop

    async def _in_thread(self, call: _Call, timeout: float | None) -> Any:
        """Run ``call`` in a thread, once no thread runs an earlier call of its jobs; its
        result, or raise what it raised."""
        loop = call.loop
        submitted = False
        try:
            with anyio.move_on_after(timeout) as scope:
                if self._left:
                    await self._after_earlier_runs(call)
                loop.prepare(call)
                self._pool.submit(call)
                submitted = True
                await loop.wait(call)
                call.delivered = True
        finally:
            if submitted and not call.delivered:
                self._abandon(call, scope.cancelled_caught)
        if not call.delivered:
            raise JobTimeout(timeout or 0)
        return call.result()

    async def _after_earlier_runs(self, call: _Call) -> None:
        """Until no thread is left in the handler for an earlier call of ``call``'s jobs."""
        for job in [call.job] if call.job is not None else call.chunk or ():
            earlier = self._left.get(job.id)
            if earlier is None:
                continue
            while earlier.state != FINISHED:
                await anyio.sleep(_LEFT_POLL)
            if self._left.get(job.id) is earlier:
                del self._left[job.id]

    def _abandon(self, call: _Call, timed_out: bool) -> None:
        """Cancelled (shutdown, cancel request, lock lost) or timed out. A thread that runs the
        call runs on, and another takes the next job; a later run of the same job waits for it."""
        if self._pool.abandon(call):
            self.restarted("timeout" if timed_out else "stopped")
            if self._left:  # forget the threads that have returned since
                self._left = {job_id: left for job_id, left in self._left.items()
                              if left.state != FINISHED}
            for job in [call.job] if call.job is not None else call.chunk or ():
                self._left[job.id] = call

    async def aclose(self) -> None:
        self._pool.close()
