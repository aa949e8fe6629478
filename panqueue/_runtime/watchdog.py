"""A thread that notices when a handler blocks the worker's event loop, and keeps locks alive.

An inline handler that runs blocking code (``time.sleep``, CPU work) stops the event loop:
nothing else runs, including lock renewal, so the job would be declared stalled and run twice.
The watchdog lives in its own thread, which such a handler cannot starve. When the loop has not
answered for ``threshold`` seconds it logs a warning naming the handler, and while the loop stays
blocked it renews the running jobs' locks itself, over a connection of its own. When the loop
answers again it logs that the blockage ended, and how long it lasted.

Only the handler that blocks is named. Several workers may share one loop (a pool serving
several queues in one process), each with its watchdog, and a blocked loop starves them all:
every one of them renews its own jobs' locks, but a worker whose handler merely awaits is not
to blame. So the watchdog looks at what the loop's thread is executing: the thread's current
frame (``sys._current_frames``) and the frames that called it. A coroutine being executed is on
that stack, one suspended at an await is not; the handler blocks the loop exactly when the code
of its function is on the stack. Only then does this worker's watchdog warn, with the line the
loop is stuck on. A loop blocked by other code is not blamed on any handler.

Not forever: a loop blocked for good (a handler stuck in a blocking call) would hold every job
of the worker hostage. After ``RENEW_BOUND`` lock TTLs of blockage the watchdog stops renewing
and says so; the locks then expire and the stalled sweep gives the jobs to other workers. If
the loop ever comes back, its own renewal finds those locks lost and stops the attempts.

The worker's registry entry (``heartbeat.py``) is written by the loop too. While the loop is
blocked, the watchdog writes the entry every beat instead, marked with how long the loop has
been blocked: the worker is alive, and ``client.workers()`` and ``explain`` say so rather
than reporting it dead while its locks are still renewed. This lasts as long as the blockage:
the process is alive and says what state it is in.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

from panqueue._keys import QueueKeys
from panqueue._store import transitions
from panqueue._store.transport import Op, SyncTransport
from panqueue.errors import PanqueueError

__all__ = ["LoopWatchdog"]

BEAT_INTERVAL = 0.1
# How many lock TTLs of a blocked loop the watchdog keeps the locks alive for.
RENEW_BOUND = 10


def _codes(fn: Any) -> frozenset[CodeType]:
    """The code objects of ``fn`` and of the functions it wraps (``__wrapped__``, as
    ``functools.wraps`` and :class:`~panqueue.Handler` leave it): one of them is on the loop's
    stack while the handler runs on it."""
    codes: set[CodeType] = set()
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if isinstance(code, CodeType):
            codes.add(code)
        fn = getattr(fn, "__wrapped__", None)
    return frozenset(codes)


class LoopWatchdog:
    def __init__(self, *, url: str, parts: list[QueueKeys], handler: Callable[..., Any],
                 handler_name: str, executor_name: str, lock_ttl: float,
                 running: Callable[[], list[tuple[str, str]]],
                 renewed: Callable[[list[tuple[str, str]], float], None], log: Any,
                 threshold: float = 1.0,
                 partition_of: Callable[[tuple[str, str]], int] = lambda lock: 0,
                 registry: Callable[[int], list[Op[Any]]] | None = None,
                 registry_every: float = math.inf, prefix: str | None = None) -> None:
        self._url = url
        self._prefix = prefix
        # The code of the handler's frames (see the module's docstring); the loop's thread is
        # the one that starts the watchdog.
        self._codes = _codes(handler)
        self._loop_thread: int | None = None
        self._parts = parts
        self._partition_of = partition_of
        self._handler_name = handler_name
        self._executor_name = executor_name
        self._lock_ttl_ms = max(1, int(lock_ttl * 1000))
        self._renew_every = lock_ttl / 3
        self._running = running
        self._renewed = renewed
        # The registry entry's writes, given how long (ms) the loop has been blocked, and how
        # often the loop itself writes them (the heartbeat interval).
        self._registry = registry
        self._registry_every = registry_every
        self._renew_for = RENEW_BOUND * lock_ttl
        self._log = log
        self._threshold = threshold
        self._last_beat = time.monotonic()
        self._stop = threading.Event()
        self._transport: SyncTransport | None = None
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                         name=f"panqueue-watchdog-{handler_name}")

    def beat(self) -> None:
        """Called from the event loop every BEAT_INTERVAL seconds."""
        self._last_beat = time.monotonic()

    def start(self) -> None:
        """Called from the event loop's thread."""
        self._loop_thread = threading.get_ident()
        self._last_beat = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._transport is not None:
            self._transport.close()

    def _watch(self) -> None:
        warned_for = 0.0  # the beat time of the blockage already reported
        gave_up_for = 0.0  # the beat time of the blockage whose locks were let go
        last_renewal = 0.0
        last_entry = 0.0
        # Renewal must start before a lock renewed just before the blockage can expire.
        act_after = min(self._threshold, self._renew_every)
        # The entry is written from here once the loop counts as blocked (as for the warning)
        # or has missed a beat, whichever comes first: well before the last entry the loop
        # wrote expires (it lives three beats, written at most one beat before the blockage).
        entry_after = min(self._threshold, self._registry_every)
        while not self._stop.wait(BEAT_INTERVAL / 2):
            beat = self._last_beat
            blocked = time.monotonic() - beat
            if warned_for and beat != warned_for:
                self._log.warning(
                    f"handler no longer blocks the event loop: the blockage ended after "
                    f"{beat - warned_for:.1f} s", handler=self._handler_name,
                    blocked_s=round(beat - warned_for, 2))
                warned_for = 0.0
            if blocked >= entry_after and \
                    time.monotonic() - last_entry >= self._registry_every:
                last_entry = time.monotonic()
                self._keep_entry(blocked)
            if blocked < act_after:
                continue
            try:
                jobs = self._running()
            except RuntimeError:  # the loop changed the dict under us: it is not blocked
                continue
            if not jobs:
                continue
            if blocked >= self._renew_for:
                if gave_up_for != beat:
                    gave_up_for = beat
                    self._log.error(
                        "event loop blocked for too long; no longer renewing locks: the stalled "
                        "sweep will give these jobs to other workers",
                        handler=self._handler_name, blocked_s=round(blocked, 2),
                        bound_s=round(self._renew_for, 3),
                        job_ids=[job_id for job_id, _ in jobs])
            elif time.monotonic() - last_renewal >= self._renew_every:
                last_renewal = time.monotonic()
                self._renew(jobs)
            if blocked >= self._threshold and warned_for != beat:
                at = self._blocking_at()
                if at is None:  # another worker's handler, or other code, blocks the loop
                    continue
                warned_for = beat
                advice = (" (use executor='thread' for blocking code)"
                          if self._executor_name == "inline" else "")
                self._log.warning(
                    "handler is blocking the event loop" + advice,
                    handler=self._handler_name, blocked_s=round(blocked, 2), at=at,
                    job_ids=[job_id for job_id, _ in jobs])

    def blocking(self) -> str | None:
        """``module:function at file:line`` if this worker's handler is on the stack of the
        loop's thread right now, else None (a handler with no code of its own to look for is
        never named here). Callable from any thread; meaningful while the loop is blocked."""
        if not self._codes:
            return None
        at = self._blocking_at()
        return None if at is None else f"{self._handler_name} at {at}"

    def _blocking_at(self) -> str | None:
        """Where this worker's handler is (``file:line in function``, the innermost of its
        frames) if it is on the stack of the loop's thread, else None. A handler with no code
        of its own to look for (a callable object) is blamed as before: it may be the one."""
        frame = sys._current_frames().get(self._loop_thread) \
            if self._loop_thread is not None else None
        while frame is not None:
            code = frame.f_code
            if code in self._codes:
                return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
            frame = frame.f_back
        return None if self._codes else "unknown"

    def _keep_entry(self, blocked: float) -> None:
        if self._registry is None:
            return
        try:
            writes = self._registry(max(1, int(blocked * 1000)))
        except RuntimeError:  # the loop changed the attempts under us: it is not blocked
            return
        try:
            if self._transport is None:
                self._transport = SyncTransport(self._url, self._prefix)
            for write in writes:
                self._transport.run(write)
        except PanqueueError as exc:
            self._log.warning("registry entry from the watchdog failed", error=str(exc))

    def _renew(self, jobs: list[tuple[str, str]]) -> None:
        try:
            if self._transport is None:
                self._transport = SyncTransport(self._url, self._prefix)
            sent = time.monotonic()
            grouped: dict[int, list[tuple[str, str]]] = {}
            for lock in jobs:
                grouped.setdefault(self._partition_of(lock), []).append(lock)
            lost: set[tuple[str, str]] = set()
            for partition, locks in grouped.items():
                lost |= set(self._transport.run(transitions.extend(
                    self._parts[partition], self._lock_ttl_ms, locks)))
        except PanqueueError as exc:
            self._log.warning("lock renewal from the watchdog failed", error=str(exc))
            return
        self._renewed([lock for lock in jobs if lock not in lost], sent)
