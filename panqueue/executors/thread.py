"""The thread executor: sync (blocking) handlers in daemon threads, off the event loop.

The worker's async code (claiming, lock renewal, wake-ups) is never blocked by a handler. A
Python thread cannot be killed: when an attempt times out, is cancelled or outlives the forced
shutdown phase, the executor stops waiting for it and ``job.should_stop()`` turns true; the
thread is a daemon thread, so it never keeps the process alive.

How jobs reach threads (:class:`_Pool`): a thread that finishes a job takes the next waiting
one itself, without sleeping, so a burst of quick jobs runs in the threads already awake instead
of waking one thread per job (each wake-up is a system call, and the woken thread must then win
the GIL from the busy event loop). A job that waits while every awake thread is busy gets a
thread of its own once it has waited :data:`PATIENCE` (a millisecond): a handler that blocks
never holds up the jobs behind it for longer than that, and blocking handlers still run
``concurrency`` at once. A small watcher thread keeps that promise; it sleeps while no job waits.

Back on the event loop, finished jobs are delivered by one callback per burst, not one each
(every callback from a thread costs the loop a wake-up), and each attempt waits on the loop's
own primitive (an asyncio future, a parked trio task) rather than an ``anyio.Event``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from panqueue._job import DONE, Job
from panqueue.errors import ConfigError
from panqueue.executors.base import Executor, HandlerAborted, JobTimeout

__all__ = ["PATIENCE", "ThreadExecutor"]

#: Seconds a job may wait for a busy thread to take it before it gets a thread of its own.
PATIENCE = 0.001

# What happened to a call, as the pool sees it (changed under the pool's lock).
_WAITING, _RUNNING, _FINISHED, _DROPPED = range(4)


class _Call:
    """One call of the handler: made on the event loop, run in a thread, delivered back."""

    __slots__ = ("abandoned", "argument", "delivered", "fn", "loop", "ok", "since", "state",
                 "stuck", "value", "waiter")

    def __init__(self, fn: Callable[[Any], Any], loop: _Loop) -> None:
        self.fn = fn
        self.loop = loop
        self.argument: Any = None
        self.state = _WAITING
        self.since = 0.0  # when it was handed to the pool
        self.stuck = False  # abandoned while running: its thread is not counted as awake
        self.abandoned = False  # the attempt no longer waits for it
        self.delivered = False  # its end reached the waiting attempt
        self.ok = False
        self.value: Any = None
        self.waiter: Any = None  # the loop's primitive the attempt waits on

    def run(self) -> None:
        """In a pool thread."""
        if self.abandoned:  # ended while waiting for a thread (and not yet dropped)
            return
        try:
            self.value = self.fn(self.argument)
            self.ok = True
        except BaseException as exc:  # handed to the event loop, which re-raises it
            self.value = exc


class _Reports:
    """A job's reports from the handler's thread: through the event loop, waiting for them."""

    __slots__ = ("call", "job")

    def __init__(self, call: _Call, job: Job) -> None:
        self.call = call
        self.job = job

    def sink(self, kind: str, value: Any) -> Awaitable[None]:
        if not self.call.abandoned:
            anyio.from_thread.run(_await, self.job._sink(kind, value),
                                  token=self.call.loop.token)
        return DONE

    def should_stop(self) -> bool:
        return self.call.abandoned or self.job.should_stop()

    def view(self) -> Job:
        return self.job.rebind(self.sink, self.should_stop)


async def _await(awaitable: Awaitable[None]) -> None:
    await awaitable


class _Loop:
    """The event loop side of the calls made from one loop: how an attempt waits for its call,
    and the delivery of finished calls by one loop callback per burst."""

    def __init__(self, lock: threading.Lock, token: anyio.lowlevel.EventLoopToken) -> None:
        self.lock = lock  # the pool's: guards finished and scheduled
        self.token = token
        self.finished: list[_Call] = []
        self.scheduled = False

    def current(self) -> bool:
        """Whether this is the loop running the calling task."""
        raise NotImplementedError

    def prepare(self, call: _Call) -> None:
        """Before the call is submitted: what the attempt will wait on."""
        raise NotImplementedError

    async def wait(self, call: _Call) -> None:
        """Until the call is delivered (cancellable)."""
        raise NotImplementedError

    def wake(self, call: _Call) -> None:
        """On the loop: let the attempt waiting for ``call`` go on."""
        raise NotImplementedError

    def post(self) -> None:
        """From a thread: have the loop run :meth:`deliver` soon. Does nothing if the loop is
        gone: nobody waits any more."""
        raise NotImplementedError

    def deliver(self) -> None:
        with self.lock:
            calls, self.finished = self.finished, []
            self.scheduled = False
        for call in calls:
            self.wake(call)


class _AsyncioLoop(_Loop):
    def __init__(self, lock: threading.Lock, token: anyio.lowlevel.EventLoopToken) -> None:
        super().__init__(lock, token)
        self.loop = asyncio.get_running_loop()

    def current(self) -> bool:
        return asyncio._get_running_loop() is self.loop

    def prepare(self, call: _Call) -> None:
        call.waiter = self.loop.create_future()

    async def wait(self, call: _Call) -> None:
        await call.waiter
        call.delivered = True

    def wake(self, call: _Call) -> None:
        waiter = call.waiter
        if not waiter.done():  # else cancelled: the attempt stopped waiting
            waiter.set_result(None)

    def post(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.deliver)
        except RuntimeError:  # the loop is closed
            pass


class _TrioLoop(_Loop):
    def __init__(self, lock: threading.Lock, token: anyio.lowlevel.EventLoopToken) -> None:
        import trio

        super().__init__(lock, token)
        self.trio = trio
        self.trio_token: Any = token.native_token

    def current(self) -> bool:
        try:
            return self.trio.lowlevel.current_trio_token() is self.trio_token
        except RuntimeError:
            return False

    def prepare(self, call: _Call) -> None:
        call.waiter = self.trio.lowlevel.current_task()

    async def wait(self, call: _Call) -> None:
        lowlevel = self.trio.lowlevel

        def abort(_: Any) -> Any:
            call.waiter = None  # no longer parked: wake() must not reschedule it
            return lowlevel.Abort.SUCCEEDED

        await lowlevel.wait_task_rescheduled(abort)
        call.delivered = True

    def wake(self, call: _Call) -> None:
        task, call.waiter = call.waiter, None
        if task is not None:
            self.trio.lowlevel.reschedule(task)

    def post(self) -> None:
        try:
            self.trio_token.run_sync_soon(self.deliver)
        except self.trio.RunFinishedError:
            pass


def _current_loop(lock: threading.Lock) -> _Loop:
    token = anyio.lowlevel.current_token()
    if isinstance(token.native_token, asyncio.AbstractEventLoop):
        return _AsyncioLoop(lock, token)
    return _TrioLoop(lock, token)


class _Thread:
    """A pool thread's mailbox: it sleeps on ``wake`` (held) until a call is left for it."""

    __slots__ = ("call", "wake")

    def __init__(self) -> None:
        self.call: _Call | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


class _Pool:
    """Reusable daemon threads fed from one FIFO of waiting calls (see the module docstring).

    Threads are started only when a call would otherwise wait: none is awake to take it, or it
    has waited :data:`PATIENCE` for the busy ones. The worker's slots bound how many calls run,
    so the pool exceeds the concurrency only by threads left running in abandoned calls.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self.lock = threading.Lock()
        self._waiting: deque[_Call] = deque()
        self._idle: list[_Thread] = []  # asleep, the most recently used last
        self._awake = 0  # threads that look at _waiting before sleeping again (not stuck ones)
        self._started = 0
        # The watcher: a thread that hands calls waiting longer than PATIENCE to threads of
        # their own. It sleeps on _watch (held) while it is not watching.
        self._watch = threading.Lock()
        self._watch.acquire()
        self._watching = False
        self._watcher = False  # started and not told to stop
        self._closing = False

    def submit(self, call: _Call) -> None:
        call.since = monotonic()
        with self.lock:
            self._closing = False  # used again after close()
            if not self._awake:  # nobody would take it: a thread of its own, now
                start = self._hand_over(call)
            else:
                self._waiting.append(call)
                if self._watching:
                    return
                self._watching = True
                start = None
                if self._watcher:
                    self._watch.release()
                else:
                    self._watcher = True
                    threading.Thread(target=self._watch_loop, daemon=True,
                                     name=f"{self._name}-watcher").start()
        if start is not None:
            start.start()

    def _hand_over(self, call: _Call) -> threading.Thread | None:
        """Give ``call`` to an idle thread, or to a new one (returned, to be started once the
        lock is released). Under the lock."""
        call.state = _RUNNING
        self._awake += 1
        if self._idle:
            thread = self._idle.pop()
            thread.call = call
            thread.wake.release()
            return None
        self._started += 1
        return threading.Thread(target=self._serve, args=(call,), daemon=True,
                                name=f"{self._name}-{self._started}")

    def _serve(self, call: _Call | None) -> None:
        me = _Thread()
        while call is not None:
            call.run()
            loop = call.loop
            with self.lock:
                if call.stuck:  # its attempt gave up on it: this thread is back
                    self._awake += 1
                call.state = _FINISHED
                if not call.abandoned:
                    loop.finished.append(call)
                    post = not loop.scheduled
                    loop.scheduled = True
                else:
                    post = False
                if self._waiting:
                    call = self._waiting.popleft()
                    call.state = _RUNNING
                else:
                    call = None
                    self._awake -= 1
                    if not self._closing:
                        self._idle.append(me)
            if post:
                loop.post()
            if call is None and not self._closing:
                me.wake.acquire()
                call = me.call
                me.call = None

    def _watch_loop(self) -> None:
        delay: float | None = 0.0  # started by submit(), with a call waiting: look at once
        while True:
            if delay is None:
                self._watch.acquire()
            elif delay:
                self._watch.acquire(timeout=delay)
            starts = []
            with self.lock:
                if self._closing:
                    self._watcher = False
                    self._watching = False
                    return
                due = monotonic() - PATIENCE
                while self._waiting and self._waiting[0].since <= due:
                    start = self._hand_over(self._waiting.popleft())
                    if start is not None:
                        starts.append(start)
                if self._waiting:
                    delay = self._waiting[0].since - due
                else:
                    delay = None
                    self._watching = False
            for start in starts:
                start.start()

    def abandon(self, call: _Call) -> bool:
        """The attempt stops waiting for ``call``; whether a thread is left running it."""
        start = None
        with self.lock:
            call.abandoned = True
            if call.state == _WAITING:  # no thread took it: it never runs
                call.state = _DROPPED
                self._waiting.remove(call)
                return False
            if call.state != _RUNNING or call.stuck:
                return False
            call.stuck = True
            self._awake -= 1
            if self._waiting and not self._awake:  # the next call needs a thread now
                start = self._hand_over(self._waiting.popleft())
        if start is not None:
            start.start()
        return True

    def close(self) -> None:
        """Idle threads and the watcher exit; threads still running exit once done."""
        with self.lock:
            self._closing = True
            idle, self._idle = self._idle, []
            for thread in idle:
                thread.call = None
                thread.wake.release()
            if self._watcher and not self._watching:
                self._watching = True
                self._watch.release()


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
        self._pool = _Pool(f"panqueue-{handler.queue}")
        self._loop: _Loop | None = None

    async def run(self, job: Job, timeout: float | None) -> Any:
        call = self._call()
        call.argument = _Reports(call, job).view()
        return await self._in_thread(call, timeout)

    async def run_chunk(self, jobs: list[Job], timeout: float | None) -> Any:
        call = self._call()
        call.argument = [_Reports(call, job).view() for job in jobs]
        return await self._in_thread(call, timeout)

    def _call(self) -> _Call:
        loop = self._loop
        if loop is None or not loop.current():
            loop = self._loop = _current_loop(self._pool.lock)
        return _Call(self.handler.fn, loop)

    async def _in_thread(self, call: _Call, timeout: float | None) -> Any:
        """Run ``call`` in a thread; its result, or raise what it raised."""
        loop = call.loop
        loop.prepare(call)
        self._pool.submit(call)
        scope = None
        try:
            if timeout is None:
                await loop.wait(call)
            else:
                with anyio.move_on_after(timeout) as scope:
                    await loop.wait(call)
        finally:
            if not call.delivered:
                # Cancelled (shutdown, cancel request, lock lost) or timed out. A thread that
                # runs the call runs on, and another takes the next job.
                timed_out = scope is not None and scope.cancelled_caught
                if self._pool.abandon(call):
                    self.restarted("timeout" if timed_out else "stopped")
        if not call.delivered:
            raise JobTimeout(timeout or 0)
        if call.ok:
            return call.value
        value = call.value
        if not isinstance(value, Exception):  # SystemExit, KeyboardInterrupt... in the thread
            raise HandlerAborted(value)
        raise value

    async def aclose(self) -> None:
        self._pool.close()
