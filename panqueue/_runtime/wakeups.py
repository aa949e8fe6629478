"""Wake-ups: the queue's notify channel, which tells idle workers there is work (or hands them a
job outright, lua/lib/handoff.lua) and running ones that a job was cancelled.

The subscription exists before the first claim (so no wake-up is lost), is pinged when quiet and
replaced when it breaks or stops answering; after a reconnect the worker looks for work at once,
since anything published meanwhile was lost. A partitioned queue has a channel per partition;
each is listened to, and any of them wakes the one claim loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio

from panqueue._keys import QueueKeys
from panqueue._store.transport import AsyncSubscriber, AsyncTransport
from panqueue.errors import ConnectionError, PanqueueError

__all__ = ["WakeUps"]

# Closing a broken subscription is shielded but bounded.
_CLOSE_WAIT = 2.0


class WakeUps:
    def __init__(self, transport: AsyncTransport, parts: list[QueueKeys], *,
                 health_interval: float, on_cancel: Callable[[str], None],
                 on_handoff: Callable[[bytes], None], log: Any) -> None:
        self._transport = transport
        self._channels = [keys.notify for keys in parts]
        self._health_interval = health_interval
        self._on_cancel = on_cancel
        self._on_handoff = on_handoff
        self._log = log
        self._wake = anyio.Event()

    def arm(self) -> anyio.Event:
        """A fresh event that the next wake-up sets (armed before each claim)."""
        self._wake = anyio.Event()
        return self._wake

    def wake(self) -> None:
        """Wake the claim loop now (as a wake-up message would)."""
        self._wake.set()

    async def subscribe(self) -> list[AsyncSubscriber]:
        """The first subscriptions, made before the first claim (a refusal raises here)."""
        made: list[AsyncSubscriber] = []
        try:
            for channel in self._channels:
                made.append(await self._transport.subscribe(channel))
        except BaseException:
            with anyio.move_on_after(_CLOSE_WAIT, shield=True):
                for subscriber in made:
                    await subscriber.aclose()
            raise
        return made

    async def listen(self, first: list[AsyncSubscriber]) -> None:
        if len(first) == 1:
            await self._listen(self._channels[0], first[0])
            return
        async with anyio.create_task_group() as tg:
            for channel, subscriber in zip(self._channels, first, strict=True):
                tg.start_soon(self._listen, channel, subscriber)

    async def _listen(self, channel: str, first: AsyncSubscriber) -> None:
        subscriber: AsyncSubscriber | None = first
        delay = 0.1
        while True:
            if subscriber is None:
                try:
                    subscriber = await self._transport.subscribe(channel)
                except PanqueueError as exc:
                    if delay == 0.1:
                        self._log.warning("wake-up channel unavailable; polling",
                                          error=str(exc))
                    await anyio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                delay = 0.1
                self._log.info("wake-up channel re-established")
                self._wake.set()  # anything published while we were away: look now
            try:
                await self._until_broken(subscriber)
            except PanqueueError as exc:
                self._log.warning("wake-up channel broken; reconnecting", error=str(exc))
            finally:
                with anyio.move_on_after(_CLOSE_WAIT, shield=True):
                    await subscriber.aclose()
            subscriber = None

    async def _until_broken(self, subscriber: AsyncSubscriber) -> None:
        ping_sent: float | None = None
        while True:
            message = await subscriber.get(timeout=self._health_interval)
            now = time.monotonic()
            if message is None:
                if ping_sent is None:
                    await subscriber.ping()
                    ping_sent = now
                elif now - ping_sent > self._health_interval * 2:
                    raise ConnectionError("no answer to health-check ping")
                continue
            if message == b"":
                ping_sent = None
            elif message == b"w":
                self._wake.set()
            elif message.startswith(b"h"):
                self._on_handoff(message[1:])
            elif message.startswith(b"c:"):
                self._on_cancel(message[2:].decode())
