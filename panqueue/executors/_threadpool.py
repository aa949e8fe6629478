"""The thread executor's threads: reusable daemon threads fed from one FIFO of waiting calls.

A thread that finishes a job takes the next waiting one itself, without sleeping, so a burst of
quick jobs runs in the threads already awake instead of waking one thread per job (each wake-up
is a system call, and the woken thread must then win the GIL from the busy event loop). Jobs
submitted while no thread is awake go to one thread at the end of the loop's round. A job that
has waited :data:`PATIENCE` (a millisecond) while every running job's thread is inside its
handler gets a thread of its own: a handler that blocks never holds up the jobs behind it for
longer than that, and blocking handlers still run ``concurrency`` at once. (A thread outside its
handler is about to take the next job; if it waits, it waits for the GIL, which the interpreter
hands over within its switch interval.) A small watcher thread keeps that promise; it sleeps
while no job waits.

Back on the event loop, a thread reports the jobs it finished with one loop callback when it
runs out of jobs (or, if its next job takes long, the watcher does after :data:`PATIENCE`), not
one each: every callback from a thread costs the loop a wake-up, and a loop woken mid-burst
only waits for the GIL. Each attempt waits on the loop's own primitive (an asyncio future, a
parked trio task) rather than an ``anyio.Event``.
"""

from __future__ import annotations

import abc
import threading
from collections import deque
from time import monotonic
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from panqueue.executors._loops import _Loop

__all__ = ["DROPPED", "FINISHED", "PATIENCE", "RUNNING", "WAITING", "Pool", "Task"]

#: Seconds a job may wait for a busy thread to take it before it gets a thread of its own.
PATIENCE = 0.001

# What happened to a call, as the pool sees it (changed under the pool's lock).
WAITING, RUNNING, FINISHED, DROPPED = range(4)


class Task(abc.ABC):
    """What the pool runs: a call made on the event loop ``loop``, run in a pool thread by
    :meth:`run`, and its end delivered back to that loop. The thread executor's calls are
    tasks; the pool knows them by this class alone."""

    __slots__ = ("abandoned", "inside", "loop", "ok", "since", "state", "stuck", "value",
                 "waiter")

    def __init__(self, loop: _Loop) -> None:
        self.loop = loop
        self.state = WAITING
        self.inside = False  # its thread is in the handler (not in the pool's code)
        self.since = 0.0  # when it was handed to the pool
        self.stuck = False  # abandoned while running: its thread is not counted as awake
        self.abandoned = False  # the attempt no longer waits for it
        self.ok = False  # it returned (``value`` is what), rather than raised (``value``: what)
        self.value: Any = None
        self.waiter: Any = None  # the loop's primitive the attempt waits on

    @abc.abstractmethod
    def run(self) -> None:
        """In a pool thread: do the work, leaving its end in :attr:`ok` and :attr:`value`."""


class _Thread:
    """A pool thread's mailbox: it sleeps on ``wake`` (held) until a call is left for it."""

    __slots__ = ("call", "wake")

    def __init__(self) -> None:
        self.call: Task | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


# A thread to start and the call handed to it.
_Start = tuple[threading.Thread, Task]


class Pool:
    """Reusable daemon threads fed from one FIFO of waiting calls (see the module docstring).

    Threads are started only when a call would otherwise wait: none is awake to take it, or it
    has waited :data:`PATIENCE` for the busy ones. The worker's slots bound how many calls run,
    so the pool exceeds the concurrency only by threads left running in abandoned calls.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self.lock = threading.Lock()
        self._waiting: deque[Task] = deque()
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
        self._running: set[Task] = set()  # taken by a thread, not finished
        # Loops with finished calls they have not been told of, and since when.
        self._unposted: dict[_Loop, float] = {}
        self._closing = False

    def submit(self, call: Task) -> None:
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
        one thread for them (if none took them meanwhile), the watcher for the others.

        A thread awake meanwhile (one back from an abandoned call takes the waiting calls as it
        comes back) is not enough: it may be in its next handler for long, and no one watched
        the calls submitted while no thread was awake. The watcher watches them as it watches
        every call waiting behind a busy thread."""
        with self.lock:
            self._flushing = False
            if not self._waiting:
                return
            start = None if self._awake else self._hand_over(self._waiting.popleft())
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

    def _hand_over(self, call: Task) -> _Start | None:
        """Give ``call`` to an idle thread, or to a new one (returned with the call, to be
        started with :meth:`_start` once the lock is released). Under the lock."""
        call.state = RUNNING
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

    def _start(self, thread: threading.Thread, call: Task | None) -> None:
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
                call.state = FINISHED
                call.ok, call.value = False, exc
                loop = call.loop
                if call.abandoned:
                    return
                loop.finished.append(call)
                if loop.scheduled or loop in self._unposted:
                    return
                loop.scheduled = True
            loop.post()

    def _serve(self, call: Task | None) -> None:
        me = _Thread()
        while call is not None:
            while call is not None:  # then the waiting calls, while there are any
                call.run()
                loop = call.loop
                with self.lock:
                    if call.stuck:  # its attempt gave up on it: this thread is back
                        self._awake += 1
                    call.state = FINISHED
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
                        call.state = RUNNING
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

    def abandon(self, call: Task) -> bool:
        """The attempt stops waiting for ``call``; whether a thread is left running it."""
        start = None
        with self.lock:
            call.abandoned = True
            if call.state == WAITING:  # no thread took it: it never runs
                call.state = DROPPED
                self._waiting.remove(call)
                return False
            if call.state != RUNNING or call.stuck:
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
