"""The thread executor: sync (blocking) handlers in daemon threads, off the event loop.

The worker's async code (claiming, lock renewal, wake-ups) is never blocked by a handler. A
Python thread cannot be killed: when an attempt times out, is cancelled or outlives the forced
shutdown phase, the executor stops waiting for it and ``job.should_stop()`` turns true; the
thread is a daemon thread, so it never keeps the process alive.

How jobs reach threads (:class:`_Pool`): a thread that finishes a job takes the next waiting
one itself, without sleeping, so a burst of quick jobs runs in the threads already awake instead
of waking one thread per job (each wake-up is a system call, and the woken thread must then win
the GIL from the busy event loop). Jobs submitted while no thread is awake go to one thread at
the end of the loop's round. A job that has waited :data:`PATIENCE` (a millisecond) while every
running job's thread is inside its handler gets a thread of its own: a handler that blocks never
holds up the jobs behind it for longer than that, and blocking handlers still run
``concurrency`` at once. (A thread outside its handler is about to take the next job; if it
waits, it waits for the GIL, which the interpreter hands over within its switch interval.) A
small watcher thread keeps that promise; it sleeps while no job waits.

Back on the event loop, a thread reports the jobs it finished with one loop callback when it
runs out of jobs (or, if its next job takes long, the watcher does after :data:`PATIENCE`), not
one each: every callback from a thread costs the loop a wake-up, and a loop woken mid-burst
only waits for the GIL. Each attempt waits on the loop's own primitive (an asyncio future, a
parked trio task) rather than an ``anyio.Event``.
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
    """One call of the handler: made on the event loop, run in a thread, delivered back. For a
    single job it is also the job's way to report from the thread (see :class:`_Reports`)."""

    __slots__ = ("abandoned", "chunk", "delivered", "fn", "inside", "job", "loop", "ok",
                 "since", "state", "stuck", "value", "waiter")

    def __init__(self, fn: Callable[[Any], Any], loop: _Loop, job: Job | None,
                 chunk: list[Job] | None = None) -> None:
        self.fn = fn
        self.loop = loop
        self.job = job  # a single job's call
        self.chunk = chunk  # a chunk's call
        self.state = _WAITING
        self.inside = False  # its thread is in the handler (not in the pool's code)
        self.since = 0.0  # when it was handed to the pool
        self.stuck = False  # abandoned while running: its thread is not counted as awake
        self.abandoned = False  # the attempt no longer waits for it
        self.delivered = False  # its end reached the waiting attempt
        self.ok = False
        self.value: Any = None
        self.waiter: Any = None  # the loop's primitive the attempt waits on

    def run(self) -> None:
        """In a pool thread. The jobs' views for the thread are made here, off the loop."""
        if self.abandoned:  # ended while waiting for a thread (and not yet dropped)
            return
        self.inside = True
        try:
            argument: Any
            if self.job is not None:
                argument = self.job.rebind(self.sink, self.should_stop)
            else:
                argument = [_Reports(self, job).view() for job in self.chunk or ()]
            self.value = self.fn(argument)
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

    def sink(self, kind: str, value: Any) -> Awaitable[None]:
        """The single job's reports from the handler's thread."""
        return _report(self, self.job, kind, value)

    def should_stop(self) -> bool:
        return self.abandoned or self.job is None or self.job.should_stop()


class _Reports:
    """A chunk's job's reports from the handler's thread."""

    __slots__ = ("call", "job")

    def __init__(self, call: _Call, job: Job) -> None:
        self.call = call
        self.job = job

    def sink(self, kind: str, value: Any) -> Awaitable[None]:
        return _report(self.call, self.job, kind, value)

    def should_stop(self) -> bool:
        return self.call.abandoned or self.job.should_stop()

    def view(self) -> Job:
        return self.job.rebind(self.sink, self.should_stop)


def _report(call: _Call, job: Job | None, kind: str, value: Any) -> Awaitable[None]:
    """From the handler's thread: report through the event loop, and wait for it (nothing once
    the attempt has given up on the call)."""
    if not call.abandoned and job is not None:
        anyio.from_thread.run(_await, job._sink(kind, value), token=call.loop.token)
    return DONE


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

    def wait(self, call: _Call) -> Awaitable[Any]:
        """What to await until the call is delivered (cancellable)."""
        raise NotImplementedError

    def wake(self, call: _Call) -> None:
        """On the loop: let the attempt waiting for ``call`` go on."""
        raise NotImplementedError

    def post(self) -> None:
        """From a thread: have the loop run :meth:`deliver` soon. Does nothing if the loop is
        gone: nobody waits any more."""
        raise NotImplementedError

    def soon(self, fn: Callable[[], None]) -> None:
        """On the loop: run ``fn`` once the callbacks ready now have run."""
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

    def wait(self, call: _Call) -> Awaitable[Any]:
        waiter: Awaitable[Any] = call.waiter
        return waiter

    def wake(self, call: _Call) -> None:
        waiter = call.waiter
        if not waiter.done():  # else cancelled: the attempt stopped waiting
            waiter.set_result(None)

    def deliver(self) -> None:
        with self.lock:
            calls, self.finished = self.finished, []
            self.scheduled = False
        for call in calls:  # wake(), inlined
            waiter = call.waiter
            if not waiter.done():
                waiter.set_result(None)

    def post(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.deliver)
        except RuntimeError:  # the loop is closed
            pass

    def soon(self, fn: Callable[[], None]) -> None:
        self.loop.call_soon(fn)


class _TrioLoop(_Loop):
    def __init__(self, lock: threading.Lock, token: anyio.lowlevel.EventLoopToken) -> None:
        import trio

        super().__init__(lock, token)
        self.trio = trio
        self.trio_token: Any = token.native_token
        self.soon_calls: list[Callable[[], None]] = []  # see soon()
        self.parked: Any = None
        self.runner = False

    def current(self) -> bool:
        try:
            return self.trio.lowlevel.current_trio_token() is self.trio_token
        except RuntimeError:
            return False

    def prepare(self, call: _Call) -> None:
        call.waiter = self.trio.lowlevel.current_task()

    def wait(self, call: _Call) -> Awaitable[Any]:
        lowlevel = self.trio.lowlevel

        def abort(_: Any) -> Any:
            call.waiter = None  # no longer parked: wake() must not reschedule it
            return lowlevel.Abort.SUCCEEDED

        return lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    def wake(self, call: _Call) -> None:
        task, call.waiter = call.waiter, None
        if task is not None:
            self.trio.lowlevel.reschedule(task)

    def post(self) -> None:
        try:
            self.trio_token.run_sync_soon(self.deliver)
        except self.trio.RunFinishedError:
            pass

    def soon(self, fn: Callable[[], None]) -> None:
        # Through a parked system task: run_sync_soon() would cost a write to trio's wake-up
        # socket each time.
        self.soon_calls.append(fn)
        task, self.parked = self.parked, None
        if task is not None:
            self.trio.lowlevel.reschedule(task)
        elif not self.runner:
            self.runner = True
            self.trio.lowlevel.spawn_system_task(self.run_soon_calls)

    async def run_soon_calls(self) -> None:
        lowlevel = self.trio.lowlevel

        def abort(_: Any) -> Any:  # the run is ending
            self.parked = None
            return lowlevel.Abort.SUCCEEDED

        while True:
            calls, self.soon_calls = self.soon_calls, []
            for fn in calls:
                fn()
            if not self.soon_calls:
                self.parked = lowlevel.current_task()
                await lowlevel.wait_task_rescheduled(abort)


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


# A thread to start and the call handed to it.
_Start = tuple[threading.Thread, "_Call"]


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
        self._flushing = False  # a _flush() is scheduled on the event loop
        self._running: set[_Call] = set()  # taken by a thread, not finished
        # Loops with finished calls they have not been told of, and since when.
        self._unposted: dict[_Loop, float] = {}
        self._closing = False

    def submit(self, call: _Call) -> None:
        """On the event loop. A call that finds no thread awake waits for the end of the loop's
        current round: the calls submitted in that round then go to one thread together, which
        the loop has stopped competing with for the GIL (a thread woken at once would take the
        GIL at each of the loop's system calls and hand it back for the next submission)."""
        call.since = monotonic()
        with self.lock:
            self._closing = False  # used again after close()
            self._waiting.append(call)
            if not self._awake:
                if self._flushing:
                    return
                self._flushing = True
                defer = True
            else:
                defer = False
                watcher = self._watch_locked()
        if defer:
            call.loop.soon(self._flush)
        elif watcher is not None:
            self._start(watcher, None)

    def _flush(self) -> None:
        """On the event loop, after the round that submitted calls while no thread was awake:
        one thread for them (if none took them meanwhile), the watcher for the others."""
        with self.lock:
            self._flushing = False
            if not self._waiting or self._awake:
                return
            start = self._hand_over(self._waiting.popleft())
            watcher = self._watch_locked() if self._waiting else None
        if start is not None:
            self._start(*start)
        if watcher is not None:
            self._start(watcher, None)

    def _watch_locked(self) -> threading.Thread | None:
        """Have the watcher watch the waiting calls and the finished calls not yet told to their
        loops; a watcher thread to start, if none runs. Under the lock."""
        if self._watching:
            return None
        self._watching = True
        if self._watcher:
            self._watch.release()
            return None
        self._watcher = True
        return threading.Thread(target=self._watch_loop, daemon=True,
                                name=f"{self._name}-watcher")

    def _hand_over(self, call: _Call) -> _Start | None:
        """Give ``call`` to an idle thread, or to a new one (returned with the call, to be
        started with :meth:`_start` once the lock is released). Under the lock."""
        call.state = _RUNNING
        self._awake += 1
        self._running.add(call)
        if self._idle:
            thread = self._idle.pop()
            thread.call = call
            thread.wake.release()
            return None
        self._started += 1
        return threading.Thread(target=self._serve, args=(call,), daemon=True,
                                name=f"{self._name}-{self._started}"), call

    def _start(self, thread: threading.Thread, call: _Call | None) -> None:
        """Start a pool thread for ``call``, or the watcher (``call`` None). A thread the
        system refuses (``can't start new thread``) fails its call with that error instead of
        leaving it to wait for ever; without a watcher, busy threads still take the waiting
        calls as they finish, and the next submission starts one again."""
        try:
            thread.start()
        except RuntimeError as exc:
            with self.lock:
                if call is None:
                    self._watcher = self._watching = False
                    return
                self._awake -= 1
                self._running.discard(call)
                call.state = _FINISHED
                call.ok, call.value = False, exc
                loop = call.loop
                if call.abandoned:
                    return
                loop.finished.append(call)
                if loop.scheduled or loop in self._unposted:
                    return
                loop.scheduled = True
            loop.post()

    def _serve(self, call: _Call | None) -> None:
        me = _Thread()
        while call is not None:
            while call is not None:  # then the waiting calls, while there are any
                call.run()
                loop = call.loop
                with self.lock:
                    if call.stuck:  # its attempt gave up on it: this thread is back
                        self._awake += 1
                    call.state = _FINISHED
                    self._running.discard(call)
                    if not call.abandoned:
                        loop.finished.append(call)
                        if not loop.scheduled and loop not in self._unposted:
                            self._unposted[loop] = monotonic()
                    posts: list[_Loop] = []
                    watcher = None
                    if self._waiting:
                        # The loop hears of finished calls when this thread runs out of calls,
                        # or from the watcher if the next call takes long.
                        call = self._waiting.popleft()
                        call.state = _RUNNING
                        self._running.add(call)
                        if self._unposted:
                            watcher = self._watch_locked()
                    else:
                        call = None
                        self._awake -= 1
                        sleep = not self._closing
                        if sleep:
                            self._idle.append(me)
                        posts = self._take_unposted(None)
                for loop in posts:
                    loop.post()
                if watcher is not None:
                    self._start(watcher, None)
            if sleep:
                me.wake.acquire()
                call, me.call = me.call, None

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
                posts = self._take_unposted(due)
                # A thread outside its handler (about to run a call, or just done with one) is
                # waiting for the GIL, not blocked: it takes the waiting calls once it runs (not
                # long: the interpreter switches threads every sys.getswitchinterval()). When
                # every thread is in a handler, a thread for each call that waited too long.
                live = any(not call.inside for call in self._running)
                while self._waiting and not live and self._waiting[0].since <= due:
                    start = self._hand_over(self._waiting.popleft())
                    if start is not None:
                        starts.append(start)
                if self._waiting:
                    delay = max(self._waiting[0].since - due, PATIENCE if live else 0)
                else:
                    delay = None
                if self._unposted:
                    first = min(self._unposted.values()) - due
                    delay = first if delay is None else min(delay, first)
                if delay is None:
                    self._watching = False
            for loop in posts:
                loop.post()
            for start in starts:
                self._start(*start)

    def _take_unposted(self, due: float | None) -> list[_Loop]:
        """The loops to tell of finished calls: those told nothing since ``due`` (all of them
        if None). Under the lock."""
        if not self._unposted:
            return []
        posts = [loop for loop, since in self._unposted.items() if due is None or since <= due]
        for loop in posts:
            del self._unposted[loop]
            loop.scheduled = True
        return posts

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
            self._start(*start)
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
        if timeout is not None:
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
            loop = self._loop = _current_loop(self._pool.lock)
        return loop

    async def _in_thread(self, call: _Call, timeout: float | None) -> Any:
        """Run ``call`` in a thread; its result, or raise what it raised."""
        loop = call.loop
        loop.prepare(call)
        self._pool.submit(call)
        scope = None
        try:
            if timeout is None:
                await loop.wait(call)
                call.delivered = True
            else:
                with anyio.move_on_after(timeout) as scope:
                    await loop.wait(call)
                    call.delivered = True
        finally:
            if not call.delivered:
                self._abandon(call, scope is not None and scope.cancelled_caught)
        if not call.delivered:
            raise JobTimeout(timeout or 0)
        return call.result()

    def _abandon(self, call: _Call, timed_out: bool) -> None:
        """Cancelled (shutdown, cancel request, lock lost) or timed out. A thread that runs the
        call runs on, and another takes the next job."""
        if self._pool.abandon(call):
            self.restarted("timeout" if timed_out else "stopped")

    async def aclose(self) -> None:
        self._pool.close()
