"""The worker's entry in its queue's worker registry: written every ``interval`` seconds with the
jobs it runs, live for three beats, removed at a clean stop (``client.workers()`` reads it).

While a handler blocks the event loop, the beats stop with everything else on it; the
watchdog thread (``watchdog.py``) then writes the same entry (:meth:`Heartbeat.writes`) with
how long the loop has been blocked, so a live worker stays listed, marked as blocked.

The loop's own beat also takes the commands an operator queued for the worker
(``client.control``: stop, pause, resume, a new concurrency) and hands them to the worker, so
a command is applied within one heartbeat interval."""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from panqueue._keys import QueueKeys
from panqueue._runtime.trouble import Trouble, episode_of
from panqueue._store import transitions
from panqueue._store.transport import AsyncTransport, Op
from panqueue.errors import PanqueueError

__all__ = ["BEATS_PER_TTL", "Heartbeat"]

# An entry outlives its last beat by this many beats: one late or lost beat does not make a
# live worker vanish, and a dead one is gone within 3 x interval.
BEATS_PER_TTL = 3


class Heartbeat:
    """Beats for one worker on one queue. ``running`` returns the ids of the jobs it runs now."""

    def __init__(self, transport: AsyncTransport, parts: list[QueueKeys], *, name: str,
                 concurrency: Callable[[], tuple[int, bool]], running: Callable[[], list[str]],
                 interval: float, log: Any,
                 on_commands: Callable[[list[str]], Awaitable[None]] | None = None) -> None:
        self._transport = transport
        self._parts = parts  # every partition has the entry: explain reads its own
        self._name = name
        self._concurrency = concurrency  # (concurrency now, paused by a command)
        self._on_commands = on_commands
        self._running = running
        self.interval = interval
        self._ttl_ms = max(1, int(interval * BEATS_PER_TTL * 1000))
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._trouble = Trouble(log, "worker heartbeat", episode_of(transport))
        self._take = ""  # the request id of the commands' take not applied yet

    def writes(self, loop_blocked_ms: int = 0, take_commands: str = ""
               ) -> list[Op[tuple[int, list[str]]]]:
        """The writes of one beat, one per partition (also run from the watchdog's thread,
        with ``loop_blocked_ms`` > 0, while the loop is blocked). ``take_commands`` (a request
        id): the home partition's write takes the commands queued for the worker."""
        running = self._running()
        concurrency, paused = self._concurrency()
        return [transitions.heartbeat(
            keys, self._name, self._ttl_ms, host=self._host, pid=self._pid,
            queues=[keys.name], concurrency=concurrency, running=running,
            loop_blocked_ms=loop_blocked_ms, paused=paused,
            take_commands=take_commands if index == 0 else "")
            for index, keys in enumerate(self._parts)]

    async def beat(self) -> None:
        # The request id of the commands' take: kept until a beat has applied what it took,
        # so that a beat whose reply was lost, or whose later write failed, is tried again
        # under it and gets the same commands back.
        if self._on_commands is not None and not self._take:
            self._take = os.urandom(8).hex()
        commands: list[str] = []
        for write in self.writes(take_commands=self._take):
            _, taken = await self._transport.run(write)
            commands += taken
        if self._on_commands is not None:
            self._take = ""
            await self._on_commands(commands)  # every beat: none is a beat's check too

    async def run(self) -> None:
        """Beat until cancelled. A failed beat is retried sooner; the entry lives on meanwhile
        until its TTL runs out."""
        while True:
            try:
                await self.beat()
            except PanqueueError as exc:
                self._trouble.failed(exc)
                await anyio.sleep(min(self._trouble.backoff(), self.interval))
                continue
            self._trouble.ok()
            await anyio.sleep(self.interval)

    async def leave(self) -> None:
        """Remove the entry now (a clean stop). If Redis cannot be reached the entry expires
        by itself within its TTL."""
        try:
            for keys in self._parts:
                await self._transport.run(transitions.leave_registry(keys, self._name))
        except PanqueueError:
            pass
