"""Wake-ups: the queue's notify channel, which tells idle workers there is work (or hands them a
job outright, lua/lib/handoff.lua) and running ones that a job was cancelled.

The subscription exists before the first claim (so no wake-up is lost), is pinged when quiet and
replaced when it breaks or stops answering; after a reconnect the worker looks for work at once,
since anything published meanwhile was lost. A partitioned queue has a channel per partition:
one subscription per node carries the channels of the partitions it serves, and any of them
wakes the one claim loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from panqueue._keys import QueueKeys
from panqueue._runtime.trouble import RETRY_CAP, Trouble, episode_of
from panqueue._store.notify import CancelRequest, Handoff, WakeUp, parse_message
from panqueue._store.transport import AsyncSubscriber, AsyncTransport
from panqueue.errors import ConnectionError, PanqueueError

__all__ = ["WakeUps"]

# Closing a broken subscription is shielded but bounded.
_CLOSE_WAIT = 2.0


class WakeUps:
    def __init__(self, transport: AsyncTransport, parts: list[QueueKeys], *,
                 health_interval: float, on_cancel: Callable[[CancelRequest], None],
                 on_handoff: Callable[[Handoff], None], log: Any) -> None:
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

    def heard(self) -> bool:
        """Whether a wake-up came since the claim loop last armed (before its last claim)."""
        return self._wake.is_set()

    async def _by_node(self, channels: list[str]) -> list[list[str]]:
        """``channels`` grouped by the node that serves them: one subscription each."""
        groups: dict[str, list[str]] = {}
        for channel in channels:
            groups.setdefault(await self._transport.node_of(channel), []).append(channel)
        return list(groups.values())

    async def subscribe(self) -> list[tuple[list[str], AsyncSubscriber]]:
        """The first subscriptions, one per node, made before the first claim (a refusal
        raises here)."""
        made: list[tuple[list[str], AsyncSubscriber]] = []
        try:
            for channels in await self._by_node(self._channels):
                made.append((channels, await self._transport.subscribe(*channels)))
        except BaseException:
            with anyio.move_on_after(_CLOSE_WAIT, shield=True):
                for _, subscriber in made:
                    await subscriber.aclose()
            raise
        return made

    async def listen(self, first: list[tuple[list[str], AsyncSubscriber]]) -> None:
        async with anyio.create_task_group() as tg:
            for channels, subscriber in first:
                tg.start_soon(self._listen, tg, channels, subscriber)

    async def _listen(self, tg: anyio.abc.TaskGroup, channels: list[str],
                      first: AsyncSubscriber | None) -> None:
        subscriber = first
        delay = 0.1
        # The channel's failures count in the episode of the worker's other activities: an
        # outage is one line for them all.
        trouble = Trouble(self._log, "wake-up channel", episode_of(self._transport))
        while True:
            if subscriber is None:
                try:
                    # Slots may have moved to other nodes since (resharding, failover): the
                    # channels that left this node get subscriptions of their own.
                    mine, *moved = await self._by_node(channels)
                    for others in moved:
                        tg.start_soon(self._listen, tg, others, None)
                    channels = mine
                    subscriber = await self._transport.subscribe(*channels)
                except PanqueueError as exc:
                    trouble.failed(exc)  # the claim loop polls meanwhile
                    await anyio.sleep(delay)
                    delay = min(delay * 2, RETRY_CAP)
                    continue
                delay = 0.1
                trouble.ok()
                self._wake.set()  # anything published while we were away: look now
            try:
                await self._until_broken(subscriber)
            except PanqueueError as exc:
                trouble.failed(exc)
                # Redis may be gone, and an idle claim loop would not find out before its poll
                # interval: it claims now, and so retries (and reports its trouble) until
                # Redis answers, instead of waiting for a channel that cannot wake it.
                self._wake.set()
            finally:
                with anyio.move_on_after(_CLOSE_WAIT, shield=True):
                    await subscriber.aclose()
            subscriber = None

    async def _until_broken(self, subscriber: AsyncSubscriber) -> None:
        ping_sent: float | None = None
        # Where the subscriber can, it acts on each message as it arrives (a handed job starts
        # a turn of the loop sooner); get() then returns the ping's answers alone.
        subscriber.deliver_to(self._heard)
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
                continue
            if self._heard(message):
                # The handed job's slot task runs before this task reads on: the next read
                # (with its timeout) would otherwise come first (docs/performance.md).
                await anyio.sleep(0)
            # (The message is not kept while the channel is quiet: it may carry a job's data.)
            message = None

    def _heard(self, message: bytes) -> bool:
        """Act on a message of the channel; True when it handed jobs over."""
        heard = parse_message(message)
        if isinstance(heard, WakeUp):
            self._wake.set()
        elif isinstance(heard, Handoff):
            self._on_handoff(heard)
            return True
        elif isinstance(heard, CancelRequest):
            self._on_cancel(heard)
        return False
