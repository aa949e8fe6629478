"""The async transport on trio: ``redis.asyncio`` cannot run there, so redis-py's sync client is
called in worker threads."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from panqueue._store.transport.base import (
    WAKE,
    AsyncSubscriber,
    AsyncTransport,
    _payload,
    _pubsub_connections,
)
from panqueue._store.transport.errors import _REDIS_ERRORS, _translated
from panqueue._store.transport.options import _CLOSE_TIMEOUT, _parse, redact_url
from panqueue._store.transport.requests import Request
from panqueue._store.transport.sync import SyncTransport
from panqueue.errors import ConnectionError

# On trio, redis-py runs in worker threads, under a limiter of the transport's own: anyio's
# default one has 40 threads for the whole process, and each idle worker's subscriber holds a
# thread while it waits for a wake-up, so a pool of 40 queues would leave no thread for the
# claims. Commands get this many threads; every live subscription adds one.
_COMMAND_THREADS = 40


class _ThreadTransport(AsyncTransport):
    """trio: the sync client, called from anyio worker threads."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_cluster, _ = _parse(url)
        # redis-py's sync cluster client fetches the slot map as it is made: that waits on the
        # network and can fail (a seed that cannot serve yet), so it is made by the first call,
        # in that call's thread, and its failure is that call's, retried like any other (as
        # redis.asyncio's cluster client does on asyncio). Other clients connect lazily.
        self._made = None if self.is_cluster else SyncTransport(url)
        self._making = threading.Lock()
        self._closing = False
        self._limiter = anyio.CapacityLimiter(_COMMAND_THREADS)

    def _sync(self) -> SyncTransport:
        """The sync transport, made now if no call has made it yet (in a worker thread)."""
        made = self._made
        if made is None:
            with self._making:
                if self._made is None:
                    self._made = SyncTransport(self.url)
                    # Made by a call abandoned while the transport was closed: close it here,
                    # since aclose() may have looked before it existed (whichever looks last
                    # closes it; closing twice is harmless), and send nothing on it.
                    if self._closing:
                        self._made.close()
                        raise ConnectionError(f"the connection to {redact_url(self.url)} "
                                              f"was closed")
                made = self._made
        return made

    async def execute(self, request: Request) -> Any:
        # Cancellable like the asyncio transport: a cancelled call's thread is left to finish
        # on its own (within the socket timeout) and returns its connection to the pool.
        return await anyio.to_thread.run_sync(lambda: self._sync().execute(request),
                                              abandon_on_cancel=True, limiter=self._limiter)

    async def node_of(self, key: str) -> str:
        if self._made is not None:
            return self._made.node_of(key)
        return await anyio.to_thread.run_sync(lambda: self._sync().node_of(key),
                                              abandon_on_cancel=True, limiter=self._limiter)

    async def subscribe(self, *channels: str) -> AsyncSubscriber:
        self._limiter.total_tokens += 1  # the subscription's own thread, from now on
        # Cancellable like a command (a stopping worker must not wait out the socket timeout
        # of a server that stopped answering): the thread is left to finish on its own, and
        # whichever side learns last that the caller has gone closes what it opened.
        lock = threading.Lock()
        made: list[Any] = []
        gone: list[bool] = []

        def open_subscription() -> Any:
            ps = self._sync().pubsub(*channels)
            with lock:
                made.append(ps)
                abandoned = bool(gone)
            if abandoned:
                _close_quietly(ps)
            return ps

        try:
            ps = await anyio.to_thread.run_sync(open_subscription, abandon_on_cancel=True,
                                                limiter=self._limiter)
        except BaseException:
            with lock:
                gone.append(True)
                opened = list(made)
            for ps in opened:
                _close_quietly(ps)
            self._limiter.total_tokens -= 1
            raise
        return _ThreadSubscriber(self.url, ps, self._limiter)

    async def aclose(self) -> None:
        self._closing = True
        made = self._made
        if made is not None:
            await anyio.to_thread.run_sync(made.close, abandon_on_cancel=True,
                                           limiter=self._limiter)


class _ThreadSubscriber(AsyncSubscriber):
    def __init__(self, url: str, pubsub: Any, limiter: anyio.CapacityLimiter) -> None:
        self._url = url
        self._pubsub = pubsub
        self._limiter = limiter  # the transport's; this subscription added a token to it
        self._closed = False
        self._reconnected = False
        self._connections = _pubsub_connections(pubsub)
        for connection in self._connections:
            connection.register_connect_callback(self._on_connect)

    def _on_connect(self, connection: Any) -> None:
        self._reconnected = True

    async def _call(self, fn: Callable[[], Any]) -> Any:
        with _translated(self._url):
            # The thread is abandoned on cancellation; it returns by itself within `timeout`.
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True,
                                                  limiter=self._limiter)

    async def get(self, timeout: float) -> bytes | None:
        if self._reconnected:
            self._reconnected = False
            return WAKE
        fn = functools.partial(self._pubsub.get_message, ignore_subscribe_messages=False,
                               timeout=timeout)
        return _payload(await self._call(fn), self._url)

    async def ping(self) -> None:
        await self._call(self._pubsub.ping)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for connection in self._connections:
            connection.deregister_connect_callback(self._on_connect)
        with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            with contextlib.suppress(*_REDIS_ERRORS):
                await anyio.to_thread.run_sync(self._pubsub.close, abandon_on_cancel=True,
                                               limiter=self._limiter)
        self._limiter.total_tokens -= 1


def _close_quietly(pubsub: Any) -> None:
    """Close a subscription nobody will use (its connection may already be broken)."""
    with contextlib.suppress(*_REDIS_ERRORS):
        pubsub.close()
