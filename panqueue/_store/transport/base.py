"""The async transport's surface (:class:`AsyncTransport`, :class:`AsyncSubscriber`) and what its
implementations share about wake-up subscriptions."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions

from panqueue._keys import prefixed
from panqueue._store.transport import resp
from panqueue._store.transport.errors import _translated
from panqueue._store.transport.options import redact_url
from panqueue._store.transport.requests import Op, Request, T
from panqueue.errors import ConnectionError as PanqueueConnectionError
from panqueue.errors import PanqueueError


class AsyncSubscriber(ABC):
    """One subscription to a notify channel.

    :meth:`get` returns the next message payload, ``b""`` for the reply to :meth:`ping`, or
    ``None`` when ``timeout`` passed without either. A broken connection raises
    :class:`panqueue.ConnectionError`; the caller opens a new subscriber.
    """

    def deliver_to(self, receive: Callable[[bytes], object]) -> bool:
        """From now on, pass each message's payload to ``receive`` as it arrives, on the event
        loop and outside any task, instead of returning it from :meth:`get` (which still
        returns the ping's answer and its timeouts, and raises what ``receive`` raised). True
        when this subscriber does so; False (the default) when messages keep coming from
        :meth:`get`. ``receive`` must need no task: outside one, anyio can neither start a
        task nor tell which loop runs, unless ``anyio.run`` started it."""
        return False

    @abstractmethod
    async def get(self, timeout: float) -> bytes | None:
        ...

    @abstractmethod
    async def ping(self) -> None:
        ...

    @abstractmethod
    async def aclose(self) -> None:
        ...


def _pubsub_connections(pubsub: Any) -> list[Any]:
    """The connections a (cluster) PubSub reads from, to watch them for reconnects."""
    connection = getattr(pubsub, "connection", None)
    if connection is not None:
        return [connection]
    shards = getattr(pubsub, "node_pubsub_mapping", None) or {}
    return [p.connection for p in shards.values() if getattr(p, "connection", None) is not None]


# redis-py re-subscribes by itself when a subscriber connection breaks; messages published in
# between are lost. Subscribers therefore watch their connections and, after a reconnect, report
# one synthetic wake-up so the worker claims again instead of waiting for the next poll.
WAKE = b"w"


_SUBSCRIBE_TIMEOUT = 10.0
_SUBSCRIBED = ("ssubscribe", b"ssubscribe")


def _confirm_subscription(get_message: Callable[..., Any], count: int = 1) -> None:
    """Read until the server confirms ``count`` subscriptions; a refusal (ACL: no channel
    access) raises here, at subscribe time, instead of surfacing later as a broken wake-up
    path."""
    deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT
    while time.monotonic() < deadline:
        message = get_message(timeout=0.5)
        if message is not None and message.get("type") in _SUBSCRIBED:
            count -= 1
            if count == 0:
                return
    raise redis.exceptions.TimeoutError("no confirmation of the subscription")


def _payload(message: Any, url: str) -> bytes | None:
    """What a subscriber reports for a message of redis-py's ``get_message`` (a dict): see
    :func:`_message_payload`."""
    if message is None:
        return None
    return _message_payload(message.get("type"), message.get("data"), url)


def _reply_payload(reply: Any, url: str) -> bytes | None:
    """The same for a pub/sub reply as read (``PubSub.parse_response``): the message's kind
    and its parts, data last; a bare ``PONG``; or None."""
    if reply is None:
        return None
    if isinstance(reply, bytes | str):  # PONG
        return b""
    return _message_payload(reply[0], reply[-1], url)


def _message_payload(kind: Any, data: Any, url: str) -> bytes | None:
    """A published message's data; b"" for a health-check answer or a (re)subscription
    confirmed; None for anything else. A subscription the server ended raises."""
    if isinstance(kind, bytes):
        kind = kind.decode()
    if kind in ("pong", "ssubscribe"):
        return b""
    if kind == "sunsubscribe":
        # The server ended the subscription (on Cluster: the channel's slot moved to another
        # node). Treat it as a broken connection: the listener subscribes again, on the new owner.
        raise PanqueueConnectionError(
            f"the server at {redact_url(url)} ended the wake-up subscription")
    if kind in _PUBLISHED:
        return _data(data)
    return None


# The kinds of a published message as read (RESP2 and RESP3 alike).
_PUBLISHED = ("smessage", "message", b"smessage", b"message")


def _data(data: Any) -> bytes:
    return data if isinstance(data, bytes) else str(data).encode()


def _published(reply: Any) -> bytes | None:
    """The payload of ``reply`` (as read) when it is a published message, else None."""
    if isinstance(reply, list) and len(reply) >= 3 and reply[0] in _PUBLISHED:
        return _data(reply[-1])
    return None


class _ReplySubscriber(AsyncSubscriber):
    """A subscription on a connection of its own, read reply by reply (``resp``'s reader): the
    subscribers of :mod:`.native` (trio) and :mod:`.aio_subscriber` (asyncio), which differ
    only in how they wait for the next reply (:meth:`_next`) and send (:meth:`_send`). A
    broken connection raises from :meth:`get`, and the caller subscribes again (it claims
    meanwhile: a message published while no connection listened is lost)."""

    def __init__(self, url: str) -> None:
        self._url = url

    @abstractmethod
    async def _next(self, timeout: float | None) -> Any:
        """The next reply or pushed message, or None once ``timeout`` seconds passed without a
        whole one (None: no bound). A wait cancelled midway loses nothing."""

    @abstractmethod
    async def _send(self, data: bytes) -> None:
        ...

    async def _open(self, channels: Sequence[str], hello: Sequence[tuple[Any, ...]] = (),
                    timeout: float | None = None) -> None:
        """Log in with ``hello`` (what redis-py sends first, :func:`.standalone.hello_commands`:
        none where the connection did so itself), each answered within ``timeout``, then
        subscribe (:meth:`_subscribe`). Closed when either fails."""
        try:
            if hello:
                await self._send(b"".join(resp.pack(command) for command in hello))
                for _ in hello:
                    reply = await self._next(timeout)
                    if reply is None:
                        raise redis.exceptions.TimeoutError("Timeout reading from socket")
                    if isinstance(reply, Exception):
                        raise reply
            await self._subscribe(channels)
        except BaseException:
            await self.aclose()
            raise

    async def _subscribe(self, channels: Sequence[str]) -> None:
        """Subscribe and read until the server confirmed every channel: a refusal (ACL: no
        access to the channel) raises here, at subscribe time, not later as a silent wake-up
        path."""
        await self._send(b"".join(resp.pack(("SSUBSCRIBE", c)) for c in channels))
        deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT
        waiting = len(channels)
        while waiting:
            reply = await self._next(max(0.0, deadline - time.monotonic()))
            if reply is None:
                raise redis.exceptions.TimeoutError("no confirmation of the subscription")
            if isinstance(reply, Exception):
                raise reply
            if isinstance(reply, list) and reply and reply[0] in _SUBSCRIBED:
                waiting -= 1

    async def get(self, timeout: float) -> bytes | None:
        with _translated(self._url):
            reply = await self._next(timeout)
            if reply is None:
                return None
            if isinstance(reply, Exception):
                raise reply
            return _reply_payload(reply, self._url)

    async def ping(self) -> None:
        with _translated(self._url):
            await self._send(resp.pack(("PING",)))


class AsyncTransport(ABC):
    """Async access; :func:`open_async_transport` picks the implementation for the backend."""

    url: str
    is_cluster: bool
    # The key namespace its operations build keys in (_keys.prefixed): open_async_transport's.
    prefix: str | None = None

    @abstractmethod
    async def execute(self, request: Request) -> Any:
        ...

    async def run(self, op: Op[T]) -> T:
        """Drive an operation; errors are thrown into it, so it can explain or handle them.
        Each step runs under this transport's key prefix (``_keys.prefixed``): the keys the
        operation builds are this namespace's."""
        prefix = self.prefix
        try:
            with prefixed(prefix):
                request = op.send(None)
            while True:
                try:
                    reply = await self.execute(request)
                except PanqueueError as exc:
                    with prefixed(prefix):
                        request = op.throw(exc)
                else:
                    with prefixed(prefix):
                        request = op.send(reply)
        except StopIteration as done:
            result: T = done.value
            return result

    @abstractmethod
    async def subscribe(self, *channels: str) -> AsyncSubscriber:
        """One connection subscribed to ``channels`` (on a cluster, all served by one node:
        see :meth:`node_of`)."""

    async def node_of(self, key: str) -> str:
        """The name of the node that serves ``key`` ('' when there is one server)."""
        return ""

    @abstractmethod
    async def aclose(self) -> None:
        ...
