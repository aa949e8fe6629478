"""Redis access for the rest of panqueue: the only module that knows asyncio from trio.

* On asyncio, ``redis.asyncio`` (standalone or cluster) is used directly.
* On trio, ``redis.asyncio`` cannot run, so redis-py's sync client is called in worker threads.
* The sync client (``SyncQueueClient``, Spark executors) uses redis-py's sync client as is.

Operations elsewhere are written once, as generators that yield requests (a script call, a
command, or a batch of commands) and receive replies; :meth:`SyncTransport.run` and
:meth:`AsyncTransport.run` drive them. So the async and sync clients share every line of logic.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.to_thread
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry as SyncRetry

from panqueue._store.scripts import Script
from panqueue.errors import ConfigError, PanqueueError
from panqueue.errors import ConnectionError as PanqueueConnectionError

__all__ = [
    "AsyncSubscriber",
    "AsyncTransport",
    "Batch",
    "Command",
    "Op",
    "ScriptCall",
    "SyncTransport",
    "check_url",
    "open_async_transport",
    "redact_url",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ScriptCall:
    script: Script
    keys: tuple[str, ...]
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Command:
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Batch:
    """Commands sent in one round trip, in order, not as a transaction."""

    commands: tuple[Command, ...]


Request = ScriptCall | Command | Batch
Op = Generator[Request, Any, T]

_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
_CONNECTION_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.RedisClusterException,
    OSError,
)


_SECRET_PARAMS = re.compile(r"((?:^|&)(?:password|ssl_password)=)[^&]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL without its passwords (user:pass@ and ?password=), for messages and logs."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        netloc = f"{parts.username or ''}:***@{host}"
    query = _SECRET_PARAMS.sub(r"\1***", parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url  # nothing to hide
    redacted = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    if not netloc:  # unix:///path: urlunsplit would drop the empty authority
        redacted = redacted.replace(":", "://", 1)
    return redacted


def check_url(url: str) -> str:
    """Validate a URL's form (without connecting); returns it."""
    _parse(url)
    return url


def _parse(url: str) -> tuple[bool, str]:
    """Return (is_cluster, URL as redis-py understands it)."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"invalid Redis URL {url!r}: expected redis://host:port/db and friends")
    scheme = url.split("://", 1)[0].lower()
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"invalid Redis URL {redact_url(url)!r}: scheme must be one of {', '.join(_SCHEMES)}"
        )
    if scheme.endswith("+cluster"):
        return True, scheme.removesuffix("+cluster") + url[len(scheme) :]
    return False, url


def _standalone_options(url: str, retry_class: Any) -> dict[str, Any]:
    """Connection options for standalone servers (a URL's query string may override them).

    A pooled connection the server closed while it sat idle (restart, CLIENT KILL, idle
    timeout) is replaced and the command sent again, once. The rare command that reached the
    server before its connection broke may so run twice: workers tolerate that (at-least-once,
    lock tokens), and producers that need exactly-once adds pass a ``job_id``.
    """
    options: dict[str, Any] = {
        "retry": retry_class(NoBackoff(), 1),
        "retry_on_error": [redis.exceptions.ConnectionError],
        "health_check_interval": 30,
    }
    if not url.startswith("unix:"):
        options["socket_keepalive"] = True  # TCP only: unix sockets reject the option
    return options


def _node_url(redis_url: str, host: str, port: int) -> str:
    """``redis_url`` (credentials, TLS options and all) pointed at one cluster node."""
    parts = urlsplit(redis_url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{address}"))


def _server_error(url: str, exc: BaseException) -> PanqueueError:
    """Redis refused a command (ACL permissions, OOM, a wrong server version, ...)."""
    return PanqueueError(f"Redis at {redact_url(url)} refused a command: {exc}")


def _connection_error(url: str, exc: BaseException) -> PanqueueConnectionError:
    detail = str(exc) or type(exc).__name__
    return PanqueueConnectionError(f"cannot reach Redis at {redact_url(url)}: {detail}")


# --------------------------------------------------------------------------- sync


class SyncTransport:
    """Blocking access through redis-py's sync client (thread-safe, pooled)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_cluster, redis_url = _parse(url)
        try:
            if self.is_cluster:
                self.client: Any = redis.cluster.RedisCluster.from_url(redis_url)
            else:
                self.client = redis.Redis.from_url(redis_url,
                                                   **_standalone_options(redis_url, SyncRetry))
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(url, exc) from exc
        except ValueError as exc:
            raise ConfigError(f"invalid Redis URL {redact_url(url)!r}: {exc}") from exc

    def execute(self, request: Request) -> Any:
        try:
            if isinstance(request, ScriptCall):
                return self._script(request)
            if isinstance(request, Command):
                return self.client.execute_command(*request.args)
            pipe = self.client.pipeline(transaction=False)
            for command in request.commands:
                pipe.execute_command(*command.args)
            return pipe.execute()
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(self.url, exc) from exc
        except redis.exceptions.ResponseError as exc:
            raise _server_error(self.url, exc) from exc

    def _script(self, call: ScriptCall) -> Any:
        s = call.script
        try:
            return self.client.execute_command("EVALSHA", s.sha, len(call.keys), *call.keys,
                                               *call.args)
        except redis.exceptions.NoScriptError:
            return self.client.execute_command("EVAL", s.body, len(call.keys), *call.keys,
                                               *call.args)

    def run(self, op: Op[T]) -> T:
        """Drive an operation; errors are thrown into it, so it can explain or handle them."""
        try:
            request = next(op)
            while True:
                try:
                    reply = self.execute(request)
                except PanqueueError as exc:
                    request = op.throw(exc)
                else:
                    request = op.send(reply)
        except StopIteration as done:
            result: T = done.value
            return result

    def pubsub(self, channel: str) -> Any:
        try:
            if self.is_cluster:
                # See _AsyncioTransport.subscribe: a plain pub/sub on the channel's master.
                node = self.client.get_node_from_key(channel)
                ps = self.client.get_redis_connection(node).pubsub()
            else:
                ps = self.client.pubsub()
            ps.ssubscribe(channel)
            _confirm_subscription(ps.get_message)
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(self.url, exc) from exc
        except redis.exceptions.ResponseError as exc:
            if self.is_cluster and isinstance(exc, redis.exceptions.MovedError):
                # See _AsyncioTransport.subscribe: the slot moved; refresh the slot map.
                with contextlib.suppress(*_CONNECTION_ERRORS):
                    self.client.nodes_manager.initialize()
            raise _server_error(self.url, exc) from exc
        return ps

    def close(self) -> None:
        self.client.close()


# --------------------------------------------------------------------------- async


class AsyncSubscriber(ABC):
    """One subscription to a notify channel.

    :meth:`get` returns the next message payload, ``b""`` for the reply to :meth:`ping`, or
    ``None`` when ``timeout`` passed without either. A broken connection raises
    :class:`panqueue.ConnectionError`; the caller opens a new subscriber.
    """

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


def _confirm_subscription(get_message: Callable[..., Any]) -> None:
    """Read until the server confirms the subscription; a refusal (ACL: no channel access)
    raises here, at subscribe time, instead of surfacing later as a broken wake-up path."""
    deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT
    while time.monotonic() < deadline:
        message = get_message(timeout=0.5)
        if message is not None and message.get("type") in _SUBSCRIBED:
            return
    raise redis.exceptions.TimeoutError("no confirmation of the subscription")


def _payload(message: Any, url: str) -> bytes | None:
    if message is None:
        return None
    kind = message.get("type")
    if isinstance(kind, bytes):
        kind = kind.decode()
    if kind in ("pong", "ssubscribe"):  # a health-check answer, or a (re)subscription confirmed
        return b""
    if kind == "sunsubscribe":
        # The server ended the subscription (on Cluster: the channel's slot moved to another
        # node). Treat it as a broken connection: the listener subscribes again, on the new owner.
        raise PanqueueConnectionError(
            f"the server at {redact_url(url)} ended the wake-up subscription")
    if kind in ("smessage", "message"):
        data = message.get("data")
        return data if isinstance(data, bytes) else str(data).encode()
    return None


class AsyncTransport(ABC):
    """Async access; :func:`open_async_transport` picks the implementation for the backend."""

    url: str
    is_cluster: bool

    @abstractmethod
    async def execute(self, request: Request) -> Any:
        ...

    async def run(self, op: Op[T]) -> T:
        """Drive an operation; errors are thrown into it, so it can explain or handle them."""
        try:
            request = next(op)
            while True:
                try:
                    reply = await self.execute(request)
                except PanqueueError as exc:
                    request = op.throw(exc)
                else:
                    request = op.send(reply)
        except StopIteration as done:
            result: T = done.value
            return result

    async def script(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await self.execute(ScriptCall(script, tuple(keys), tuple(args)))

    @abstractmethod
    async def subscribe(self, channel: str) -> AsyncSubscriber:
        ...

    @abstractmethod
    async def aclose(self) -> None:
        ...


class _AsyncioTransport(AsyncTransport):
    def __init__(self, url: str) -> None:
        self.url = url
        self.is_cluster, redis_url = _parse(url)
        self._redis_url = redis_url
        try:
            if self.is_cluster:
                self.client: Any = redis.asyncio.cluster.RedisCluster.from_url(redis_url)
            else:
                self.client = redis.asyncio.Redis.from_url(
                    redis_url, **_standalone_options(redis_url, AsyncRetry))
        except ValueError as exc:
            raise ConfigError(f"invalid Redis URL {redact_url(url)!r}: {exc}") from exc

    async def execute(self, request: Request) -> Any:
        try:
            if isinstance(request, ScriptCall):
                s = request.script
                n = len(request.keys)
                try:
                    return await self.client.execute_command(
                        "EVALSHA", s.sha, n, *request.keys, *request.args)
                except redis.exceptions.NoScriptError:
                    return await self.client.execute_command(
                        "EVAL", s.body, n, *request.keys, *request.args)
            if isinstance(request, Command):
                return await self.client.execute_command(*request.args)
            pipe = self.client.pipeline(transaction=False)
            for command in request.commands:
                pipe.execute_command(*command.args)
            return await pipe.execute()
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(self.url, exc) from exc
        except redis.exceptions.ResponseError as exc:
            raise _server_error(self.url, exc) from exc

    async def subscribe(self, channel: str) -> AsyncSubscriber:
        owner: Any = None
        ps: Any = None
        try:
            if self.is_cluster:
                # redis-py's ClusterPubSub delivers sharded messages only through
                # get_sharded_message() and sends PING on another connection, so neither the
                # wake-ups nor the health check would arrive. Subscribe with a plain client on
                # the master that owns the channel's slot instead (same credentials and TLS).
                await self.client.initialize()
                node = self.client.get_node_from_key(channel)
                owner = redis.asyncio.Redis.from_url(
                    _node_url(self._redis_url, node.host, node.port))
            ps = (owner or self.client).pubsub()
            await ps.ssubscribe(channel)
            deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT
            while time.monotonic() < deadline:
                message = await ps.get_message(timeout=0.5)
                if message is not None and message.get("type") in _SUBSCRIBED:
                    break
            else:
                raise redis.exceptions.TimeoutError("no confirmation of the subscription")
        except _CONNECTION_ERRORS as exc:
            await _AsyncioSubscriber(self.url, ps, owner).aclose()
            raise _connection_error(self.url, exc) from exc
        except redis.exceptions.ResponseError as exc:
            await _AsyncioSubscriber(self.url, ps, owner).aclose()
            if self.is_cluster and isinstance(exc, redis.exceptions.MovedError):
                # The channel's slot moved to another master (resharding). Only commands
                # refresh redis-py's slot map, and an idle worker sends none, so every retry
                # would ask the old owner again: refresh the map so the next attempt subscribes
                # on the new owner.
                with contextlib.suppress(*_CONNECTION_ERRORS):
                    await self.client.nodes_manager.initialize()
            raise _server_error(self.url, exc) from exc
        return _AsyncioSubscriber(self.url, ps, owner)

    async def aclose(self) -> None:
        await self.client.aclose()


class _AsyncioSubscriber(AsyncSubscriber):
    def __init__(self, url: str, pubsub: Any, owner: Any = None) -> None:
        self._url = url
        self._pubsub = pubsub
        self._owner = owner  # the client made for this subscription alone (cluster), if any
        self._reconnected = False
        self._connections = _pubsub_connections(pubsub)
        for connection in self._connections:
            connection.register_connect_callback(self._on_connect)

    async def _on_connect(self, connection: Any) -> None:
        self._reconnected = True

    async def get(self, timeout: float) -> bytes | None:
        if self._reconnected:
            self._reconnected = False
            return WAKE
        try:
            message = await self._pubsub.get_message(ignore_subscribe_messages=False,
                                                      timeout=timeout)
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(self._url, exc) from exc
        except redis.exceptions.ResponseError as exc:
            raise _server_error(self._url, exc) from exc
        return _payload(message, self._url)

    async def ping(self) -> None:
        try:
            await self._pubsub.ping()
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(self._url, exc) from exc
        except redis.exceptions.ResponseError as exc:
            raise _server_error(self._url, exc) from exc

    async def aclose(self) -> None:
        for connection in self._connections:
            connection.deregister_connect_callback(self._on_connect)
        with anyio.CancelScope(shield=True):
            for resource in (self._pubsub, self._owner):
                if resource is not None:
                    with contextlib.suppress(*_CONNECTION_ERRORS):
                        await resource.aclose()


class _ThreadTransport(AsyncTransport):
    """trio: the sync client, called from anyio worker threads."""

    def __init__(self, url: str) -> None:
        self._sync = SyncTransport(url)
        self.url = url
        self.is_cluster = self._sync.is_cluster

    async def execute(self, request: Request) -> Any:
        return await anyio.to_thread.run_sync(self._sync.execute, request)

    async def subscribe(self, channel: str) -> AsyncSubscriber:
        ps = await anyio.to_thread.run_sync(self._sync.pubsub, channel)
        return _ThreadSubscriber(self.url, ps)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._sync.close)


class _ThreadSubscriber(AsyncSubscriber):
    def __init__(self, url: str, pubsub: Any) -> None:
        self._url = url
        self._pubsub = pubsub
        self._reconnected = False
        self._connections = _pubsub_connections(pubsub)
        for connection in self._connections:
            connection.register_connect_callback(self._on_connect)

    def _on_connect(self, connection: Any) -> None:
        self._reconnected = True

    async def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            # The thread is abandoned on cancellation; it returns by itself within `timeout`.
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(self._url, exc) from exc
        except redis.exceptions.ResponseError as exc:
            raise _server_error(self._url, exc) from exc

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
        for connection in self._connections:
            connection.deregister_connect_callback(self._on_connect)
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(*_CONNECTION_ERRORS):
                await anyio.to_thread.run_sync(self._pubsub.close, abandon_on_cancel=True)


def _running_on_trio() -> bool:
    try:
        import sniffio
    except ImportError:  # trio always brings sniffio; without it we are on asyncio
        return False
    try:
        return bool(sniffio.current_async_library() == "trio")
    except sniffio.AsyncLibraryNotFoundError:
        return False


def open_async_transport(url: str) -> AsyncTransport:
    """The async transport for the event loop this is called from."""
    if _running_on_trio():
        return _ThreadTransport(url)
    return _AsyncioTransport(url)
