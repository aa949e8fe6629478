"""The async transport on trio for one standalone server: Redis' protocol over trio's own
sockets, so a call costs no hand-over to a thread and back.

It answers as redis-py does, so the operations cannot tell it from the other transports:

* the connection options come from redis-py's own reading of the URL (credentials, database,
  timeouts, TLS files and checks, unix sockets), and a new connection says what redis-py's
  would (HELLO 3 with the credentials, or AUTH on RESP2; SELECT);
* replies go through redis-py's response callbacks (``TIME`` as a tuple, ``HGETALL`` as a
  dict, ...), and an error reply raises the class redis-py raises for its code, with the same
  message (in a batch: the first error, as ``Command # n (...) of pipeline caused error: ``);
* a pooled connection is checked before use (closed by the server: dropped), a call whose
  pooled connection broke anyway is sent once more on a new connection, and a call
  still unanswered after the socket timeout raises ``TimeoutError``; a connection that a
  cancelled or failed call leaves with a reply in flight is closed, never reused.

Wake-up subscriptions are made on trio's sockets too (:class:`_NativeSubscriber`): a job
handed to an idle worker reaches it without a thread's hand-over, and an idle worker holds no
thread while it waits.

Cluster and Sentinel URLs, and the rare option it does not know (OCSP checks, a credential
provider), stay on redis-py in threads (:mod:`.thread`), their subscriptions too.
"""

from __future__ import annotations

import math
import select
import socket
import textwrap
from collections.abc import Sequence
from typing import Any

import redis
import redis.connection
import redis.exceptions
import trio

from panqueue._store.transport import resp
from panqueue._store.transport.base import AsyncSubscriber, AsyncTransport, _ReplySubscriber
from panqueue._store.transport.errors import _translated
from panqueue._store.transport.options import _SCAN_COUNT
from panqueue._store.transport.requests import (
    Command,
    Functions,
    Request,
    Scan,
    ScriptCall,
    _batch_args,
    call_script_async,
)
from panqueue._store.transport.standalone import Settings, connect_error, hello_commands

_E = redis.exceptions


class _Connection:
    """One connection: a stream and the reader of its replies."""

    def __init__(self, stream: trio.abc.Stream, sock: Any) -> None:
        self._stream = stream
        self._socket = sock
        self._reader = resp.new_reader()

    @classmethod
    async def open(cls, settings: Settings) -> _Connection:
        with trio.move_on_after(settings.connect_timeout or math.inf) as scope:
            try:
                connection = await cls._connect(settings)
            except OSError as exc:
                raise _E.ConnectionError(connect_error(settings, exc)) from exc
            except trio.BrokenResourceError as exc:  # a failed TLS handshake
                cause = exc.__cause__ or exc
                raise _E.ConnectionError(
                    f"Error connecting to {settings.address}. {cause}") from exc
        if scope.cancelled_caught:
            raise _E.TimeoutError("Timeout connecting to server")
        try:
            await connection._hello(settings)
        except BaseException:
            connection.close()
            raise
        return connection

    @classmethod
    async def _connect(cls, settings: Settings) -> _Connection:
        if settings.path is not None:
            unix = await trio.open_unix_socket(settings.path)
            return cls(unix, unix.socket)
        tcp = await trio.open_tcp_stream(settings.host, settings.port)
        if settings.keepalive:
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in settings.keepalive_options.items():
                tcp.setsockopt(socket.IPPROTO_TCP, option, value)
        if settings.tls is None:
            return cls(tcp, tcp.socket)
        stream = trio.SSLStream(tcp, settings.tls, server_hostname=settings.host)
        try:
            await stream.do_handshake()
        except BaseException:
            tcp.socket.close()
            raise
        return cls(stream, tcp.socket)

    async def _hello(self, settings: Settings) -> None:
        """What redis-py sends on a new connection (:func:`hello_commands`)."""
        commands = hello_commands(settings)
        with trio.move_on_after(settings.timeout or math.inf) as scope:
            replies = await self.roundtrip(b"".join(resp.pack(c) for c in commands), len(commands))
        if scope.cancelled_caught:
            raise _E.TimeoutError("Timeout reading from socket")
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    async def roundtrip(self, payload: bytes, count: int) -> list[Any]:
        """Send ``payload`` and read ``count`` replies. An error reply that redis-py takes
        for a broken connection (LOADING, NOAUTH, ...) raises; the caller closes it."""
        await self.send(payload)
        replies = [await self.receive() for _ in range(count)]
        for reply in replies:
            if isinstance(reply, _E.ConnectionError):
                raise reply
        return replies

    async def send(self, payload: bytes) -> None:
        try:
            await self._stream.send_all(payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise _E.ConnectionError(f"Error while talking to the server: {exc}") from exc

    async def receive(self) -> Any:
        """The next reply (or, on a subscribed connection, pushed message), waiting for it. A
        wait cancelled midway loses nothing: what arrived stays in the reader."""
        reader = self._reader
        try:
            while True:
                reply = reader.gets()
                if reply is not resp.MORE:
                    return reply
                data = await self._stream.receive_some(resp.RECEIVE_SIZE)
                if not data:
                    raise _E.ConnectionError("Connection closed by server.")
                reader.feed(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise _E.ConnectionError(f"Error while talking to the server: {exc}") from exc

    def is_reusable(self) -> bool:
        """Whether this connection, idle in the pool, can carry the next call: nothing is
        there to read on it. A server that closed it (a restart, ``CLIENT KILL``, its idle
        ``timeout``, a proxy's) left an end of file to read, and bytes that no call asked for
        would be taken for the next call's reply. One poll of the socket, no round trip: the
        check redis-py makes of a connection it takes from its pool."""
        fd = self._socket.fileno()
        if fd < 0:
            return False
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return not poller.poll(0)
        readable, _, _ = select.select([fd], [], [], 0)
        return not readable

    def close(self) -> None:
        self._socket.close()


def _shorten(text: str) -> str:
    return textwrap.shorten(text, width=100, placeholder="...", break_long_words=True)


class _NativeTransport(AsyncTransport):
    """trio, standalone: pooled connections on trio sockets (see the module's notes)."""

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.is_cluster = False
        self._settings = settings
        self._idle: list[_Connection] = []
        self._closed = False
        self._functions = Functions()

    async def execute(self, request: Request) -> Any:
        with _translated(self.url):
            if isinstance(request, ScriptCall):
                return await call_script_async(request, self._functions, self._command)
            if isinstance(request, Command):
                return await self._command(request.args)
            if isinstance(request, Scan):
                return await self._scan(request.match)
            return await self._pipeline([_batch_args(c) for c in request.commands])

    def _shaped(self, args: Sequence[Any], reply: Any) -> Any:
        """A reply as redis-py returns it for a command sent with these arguments."""
        callback = self._settings.callbacks.get(args[0])
        return reply if callback is None else callback(reply)

    async def _command(self, args: Sequence[Any]) -> Any:
        reply = (await self._roundtrip(resp.pack(args), 1))[0]
        if isinstance(reply, Exception):
            raise reply
        return self._shaped(args, reply)

    async def _pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        if not commands:
            return []
        replies = await self._roundtrip(b"".join(resp.pack(c) for c in commands), len(commands))
        for number, (args, reply) in enumerate(zip(commands, replies, strict=True), 1):
            if isinstance(reply, _E.ResponseError):
                shown = " ".join(a.decode("utf-8", "replace") if isinstance(a, bytes) else str(a)
                                 for a in args)
                reply.args = (f"Command # {number} ({_shorten(shown)}) of "
                              f"pipeline caused error: {reply.args[0]}", *reply.args[1:])
                raise reply
        return [self._shaped(args, reply) for args, reply in zip(commands, replies, strict=True)]

    async def _scan(self, match: str) -> list[bytes]:
        keys: list[bytes] = []
        cursor: Any = 0
        while True:
            cursor, page = await self._command(("SCAN", cursor, "MATCH", match, "COUNT",
                                                _SCAN_COUNT))
            keys.extend(page)
            if int(cursor) == 0:
                return keys

    async def _roundtrip(self, payload: bytes, count: int) -> list[Any]:
        """One round trip on a pooled connection; once more, on a new connection, if that one
        broke or could not be opened (see ``options._standalone_options``). The retry never
        takes another pooled connection: whatever broke the first (a restart, a kill of every
        client) most likely broke those too, in a way their check before use may not see yet
        (the server's end of file still on its way)."""
        try:
            return await self._roundtrip_once(payload, count, self._pooled())
        except _E.ConnectionError:
            return await self._roundtrip_once(payload, count, None)

    def _pooled(self) -> _Connection | None:
        """The most recently used idle connection that can carry a call; the dead ones before
        it are closed on the way."""
        while self._idle:
            connection = self._idle.pop()
            if connection.is_reusable():
                return connection
            connection.close()
        return None

    async def _roundtrip_once(self, payload: bytes, count: int,
                              connection: _Connection | None) -> list[Any]:
        if connection is None:
            connection = await _Connection.open(self._settings)
        answered = False
        try:
            with trio.move_on_after(self._settings.timeout or math.inf) as scope:
                replies = await connection.roundtrip(payload, count)
                answered = True
        finally:
            if answered and not self._closed:
                self._idle.append(connection)
            else:  # a reply may be in flight: never reuse the connection
                connection.close()
        if not answered and scope.cancelled_caught:
            raise _E.TimeoutError("Timeout reading from socket")
        return replies

    async def subscribe(self, *channels: str) -> AsyncSubscriber:
        with _translated(self.url):
            return await _NativeSubscriber.open(self.url, self._settings, channels)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


class _NativeSubscriber(_ReplySubscriber):
    """A wake-up subscription on a trio connection of its own."""

    def __init__(self, url: str, connection: _Connection) -> None:
        super().__init__(url)
        self._connection = connection

    @classmethod
    async def open(cls, url: str, settings: Settings, channels: Sequence[str]
                   ) -> _NativeSubscriber:
        """Connected, logged in and subscribed (:meth:`_ReplySubscriber._open`)."""
        subscriber = cls(url, await _Connection.open(settings))  # logged in already
        await subscriber._open(channels)
        return subscriber

    async def _next(self, timeout: float | None) -> Any:
        with trio.move_on_after(math.inf if timeout is None else timeout):
            return await self._connection.receive()
        return None

    async def _send(self, data: bytes) -> None:
        await self._connection.send(data)

    async def aclose(self) -> None:
        self._connection.close()
