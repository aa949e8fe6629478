"""The asyncio wake-up subscription to one standalone server, on asyncio's own protocol.

A job handed to an idle worker arrives as a message of its subscription. Read through
redis-py, every such message went through its retry wrapper, a timeout context per read and
its parser's stream reads. Here the protocol feeds the bytes to the reply reader as they
arrive (hiredis' when installed) and wakes the waiting worker. The connection is made as
redis-py would make it (:mod:`.standalone`: the URL's options, TLS, credentials, database).
A broken connection raises from :meth:`_ProtocolSubscriber.get`, and the caller subscribes
again. Cluster and Sentinel subscriptions stay on redis-py (:mod:`.aio`).

Once the worker asks for it (:meth:`_ProtocolSubscriber.deliver_to`), a message is acted on
where its bytes arrive: the protocol passes it on at once, and a job handed over is started
one turn of the event loop sooner than through a task that reads the subscription
(docs/performance.md).
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import anyio
import redis.exceptions

from panqueue._store.transport import resp
from panqueue._store.transport.base import _published, _ReplySubscriber
from panqueue._store.transport.standalone import Settings, connect_error, hello_commands

_E = redis.exceptions


class _Protocol(asyncio.Protocol):
    """The connection's bytes into the reader, and a wake-up for whoever waits on them. With a
    ``receive``, every whole reply is read as it arrives: messages go to ``receive``, the
    rest (the ping's answer, errors, an ended subscription) to ``replies`` for the waiter."""

    def __init__(self) -> None:
        self.reader = resp.new_reader()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.lost: BaseException | None = None  # why the connection ended, once it has
        self.receive: Callable[[bytes], object] | None = None
        self.replies: deque[Any] = deque()
        self.failed: Exception | None = None  # what reading or ``receive`` raised, once

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A transport as asyncio's loop makes it, or another loop's (uvloop's are no subclass
        # of asyncio.Transport: the class only names the methods used here).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        if self.receive is None or self._deliver():  # only a waiter's business wakes it
            self._wake()

    def _deliver(self) -> bool:
        """Pass on the whole replies read so far; True when one is (or an error was) left for
        the waiter."""
        receive, reader = self.receive, self.reader
        try:
            while receive is not None:
                reply = reader.gets()
                if reply is resp.MORE:
                    break
                data = _published(reply)
                if data is None:
                    self.replies.append(reply)
                else:
                    receive(data)
        except Exception as exc:  # raised from get(), as if read there
            self.failed, self.receive = exc, None
            return True
        return bool(self.replies)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or _E.ConnectionError("Connection closed by server.")
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _ProtocolSubscriber(_ReplySubscriber):
    def __init__(self, url: str, protocol: _Protocol) -> None:
        super().__init__(url)
        self._protocol = protocol

    @classmethod
    async def open(cls, url: str, settings: Settings, channels: Sequence[str]
                   ) -> _ProtocolSubscriber:
        """Connected, logged in (what redis-py sends first: :func:`hello_commands`) and
        subscribed (:meth:`_ReplySubscriber._open`)."""
        subscriber = cls(url, await _connect(settings))
        await subscriber._open(channels, hello_commands(settings), settings.timeout)
        return subscriber

    def deliver_to(self, receive: Callable[[bytes], object]) -> bool:
        self._protocol.receive = receive
        self._protocol._deliver()  # what came before: nobody waits now, get() finds the rest
        return True

    async def aclose(self) -> None:
        self._protocol.receive = None
        transport = self._protocol.transport
        if transport is not None:
            transport.abort()  # nothing is owed to the server: drop what is unsent

    async def _send(self, data: bytes) -> None:
        protocol = self._protocol
        transport = protocol.transport
        if protocol.lost is not None or transport is None or transport.is_closing():
            raise _E.ConnectionError("Connection closed by server.")
        transport.write(data)

    async def _next(self, timeout: float | None) -> Any:
        protocol = self._protocol
        reply = _taken(protocol)
        if reply is not resp.MORE:
            return reply
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if protocol.lost is not None:
                raise _E.ConnectionError(f"Error while reading from the server: "
                                         f"{protocol.lost}")
            waiter: asyncio.Future[None] = loop.create_future()
            protocol.waiter = waiter
            expiry = None if deadline is None else loop.call_at(deadline, _expire, waiter)
            try:
                await waiter
            finally:
                protocol.waiter = None
                if expiry is not None:
                    expiry.cancel()
            reply = _taken(protocol)
            if reply is not resp.MORE:
                return reply
            if protocol.lost is None and deadline is not None and loop.time() >= deadline:
                return None


def _taken(protocol: _Protocol) -> Any:
    """The next reply for the waiter, or :data:`resp.MORE`; raises what delivering raised."""
    if protocol.replies:
        return protocol.replies.popleft()
    if protocol.failed is not None:
        raise protocol.failed
    return protocol.reader.gets()


async def _connect(settings: Settings) -> _Protocol:
    loop = asyncio.get_running_loop()
    with anyio.move_on_after(settings.connect_timeout or math.inf) as scope:
        try:
            if settings.path is not None:
                _, protocol = await loop.create_unix_connection(_Protocol, settings.path)
            else:
                _, protocol = await loop.create_connection(
                    _Protocol, settings.host, settings.port, ssl=settings.tls,
                    server_hostname=settings.host if settings.tls is not None else None)
        except OSError as exc:
            raise _E.ConnectionError(connect_error(settings, exc)) from exc
    if scope.cancelled_caught:
        raise _E.TimeoutError("Timeout connecting to server")
    transport = protocol.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None and settings.path is None and settings.keepalive:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in settings.keepalive_options.items():
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    return protocol
