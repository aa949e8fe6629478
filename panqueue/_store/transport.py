"""Redis access for the rest of panqueue: the only module that knows asyncio from trio.

* On asyncio, ``redis.asyncio`` (standalone or cluster) is used directly.
* On trio, ``redis.asyncio`` cannot run, so redis-py's sync client is called in worker threads.
* The sync client (``SyncQueueClient``, Spark executors) uses redis-py's sync client as is.

Operations elsewhere are written once, as generators that yield requests (a script call, a
command, or a batch of commands) and receive replies; :meth:`SyncTransport.run` and
:meth:`AsyncTransport.run` drive them. So the async and sync clients share every line of logic.

redis-py's errors never leave this module: :func:`translate_error` maps each to panqueue's (see
:mod:`panqueue.errors`), and every call into redis-py runs inside :func:`_translated`.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator, Sequence
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

from panqueue._store.loader import Script
from panqueue.errors import ConfigError, PanqueueError, ServerUnavailable
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
    "translate_error",
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
    """Requests sent in one round trip, in order, not as a transaction.

    A script in a batch is sent with EVAL (its whole body): a pipeline cannot fall back from
    EVALSHA to EVAL for one command without reordering the others.

    ``route`` (a key): on Redis Cluster, send the whole batch on one connection to the master
    that owns this key's slot. Commands without keys (INFO, WAITAOF) need it to reach the node
    that holds the queue; without it, each command goes where its own keys live.
    """

    commands: tuple[Command | ScriptCall, ...]
    route: str | None = None


@dataclass(frozen=True, slots=True)
class Scan:
    """Every key that matches ``match`` (a SCAN run to its end, over every master of a
    cluster); the reply is a list of key names (bytes). Not allowed in a :class:`Batch`."""

    match: str


Request = ScriptCall | Command | Batch | Scan
Op = Generator[Request, Any, T]

_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")

# Every connection gets both timeouts (a URL's query string may override them, for example
# ?socket_timeout=30): a network that silently drops packets must end a call with an error,
# not hang it. The socket timeout must exceed the longest wait a request asks the server for:
# WAITAOF in durable adds (10 s) and the 1 s XREAD BLOCKs of result() and events().
CONNECT_TIMEOUT = 5.0
# Closing a connection is shielded from cancellation but bounded, so that a shutdown on a network
# that drops every packet still ends.
_CLOSE_TIMEOUT = 2.0
SOCKET_TIMEOUT = 15.0
# Keys asked for per SCAN call (a hint to the server).
_SCAN_COUNT = 1000


# --------------------------------------------------------------------------- errors

_CONNECTION_ERRORS = (
    redis.exceptions.ConnectionError,  # includes AuthenticationError, AuthorizationError
    redis.exceptions.TimeoutError,
    redis.exceptions.RedisClusterException,  # no node of the cluster could be reached
    OSError,
)
# Answers of a server that is there but cannot serve now. redis-py gives some their own class
# (and strips the code from the message); the others are recognised by their error code, at
# the start of the message or after redis-py's "Command # n (...) of pipeline caused error: ".
_UNAVAILABLE_CLASSES: tuple[tuple[type[Exception], str], ...] = (
    (redis.exceptions.OutOfMemoryError, "OOM"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
    (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
)
_UNAVAILABLE_CODE = re.compile(
    r"(?:^|caused error: )(OOM|BUSY|LOADING|READONLY|MASTERDOWN|TRYAGAIN|CLUSTERDOWN|NOREPLICAS)"
    r"\b")


def _unavailable_code(exc: BaseException) -> str | None:
    """The error code if ``exc`` says the server cannot serve now (OOM, BUSY, ...)."""
    for cls, code in _UNAVAILABLE_CLASSES:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, redis.exceptions.ResponseError):
        match = _UNAVAILABLE_CODE.search(str(exc))
        if match is not None:
            return match.group(1)
    return None


def translate_error(url: str, exc: BaseException) -> PanqueueError:
    """The panqueue error for an error of redis-py or of the socket under it.

    * the server cannot serve now (OOM, BUSY, LOADING, READONLY, ...): ServerUnavailable,
      which is a ConnectionError, so every path that rides out a lost connection rides this out
    * the connection failed, timed out or was refused at login: ConnectionError
    * the server refused the command (ACL, a wrong type, a script error): PanqueueError
    """
    if isinstance(exc, PanqueueError):
        return exc
    where = redact_url(url)
    detail = str(exc) or type(exc).__name__
    code = _unavailable_code(exc)
    if code is not None:
        if not detail.startswith(code):
            detail = f"{code} {detail}"
        return ServerUnavailable(f"Redis at {where} cannot serve now: {detail}")
    if isinstance(exc, _CONNECTION_ERRORS):
        return PanqueueConnectionError(f"cannot reach Redis at {where}: {detail}")
    if isinstance(exc, redis.exceptions.ResponseError):
        return PanqueueError(f"Redis at {where} refused a command: {detail}")
    return PanqueueError(f"Redis at {where}: {type(exc).__name__}: {detail}")


_REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)


@contextlib.contextmanager
def _translated(url: str) -> Iterator[None]:
    """Raise redis-py's errors (and the socket's) inside the block as panqueue's: every call
    into redis-py runs in one of these blocks."""
    try:
        yield
    except PanqueueError:
        raise
    except _REDIS_ERRORS as exc:
        raise translate_error(url, exc) from exc


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


def _timeouts() -> dict[str, Any]:
    return {"socket_connect_timeout": CONNECT_TIMEOUT, "socket_timeout": SOCKET_TIMEOUT}


def _standalone_options(url: str, retry_class: Any) -> dict[str, Any]:
    """Connection options for standalone servers (a URL's query string may override them).

    A pooled connection the server closed while it sat idle (restart, CLIENT KILL, idle
    timeout) is replaced and the command sent again, once. The rare command that reached the
    server before its connection broke may so run twice: workers tolerate that (at-least-once,
    lock tokens), and producers that need exactly-once adds pass a ``job_id``. A timeout is
    not retried: the server may still be running the command, and the call is already late.
    """
    options: dict[str, Any] = {
        "retry": retry_class(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
        "retry_on_error": [redis.exceptions.ConnectionError],
        "health_check_interval": 30,
        **_timeouts(),
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


def _script_args(call: ScriptCall, *, cached: bool) -> tuple[Any, ...]:
    """EVALSHA (``cached``) or EVAL arguments for a script call."""
    script = call.script
    return ("EVALSHA" if cached else "EVAL", script.sha if cached else script.body,
            len(call.keys), *call.keys, *call.args)


def _batch_args(request: Command | ScriptCall) -> tuple[Any, ...]:
    if isinstance(request, ScriptCall):
        return _script_args(request, cached=False)  # see Batch: no EVALSHA in a pipeline
    return request.args


# --------------------------------------------------------------------------- sync


class SyncTransport:
    """Blocking access through redis-py's sync client (thread-safe, pooled)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_cluster, redis_url = _parse(url)
        with _translated(url):
            try:
                if self.is_cluster:
                    self.client: Any = redis.cluster.RedisCluster.from_url(redis_url,
                                                                           **_timeouts())
                else:
                    self.client = redis.Redis.from_url(
                        redis_url, **_standalone_options(redis_url, SyncRetry))
            except ValueError as exc:
                raise ConfigError(f"invalid Redis URL {redact_url(url)!r}: {exc}") from exc

    def execute(self, request: Request) -> Any:
        with _translated(self.url):
            if isinstance(request, ScriptCall):
                try:
                    return self.client.execute_command(*_script_args(request, cached=True))
                except redis.exceptions.NoScriptError:
                    return self.client.execute_command(*_script_args(request, cached=False))
            if isinstance(request, Command):
                return self.client.execute_command(*request.args)
            if isinstance(request, Scan):
                return list(self.client.scan_iter(match=request.match, count=_SCAN_COUNT))
            if not (self.is_cluster and request.route is not None):
                return self._pipeline(self.client, request)
            try:
                return self._pipeline(self._owner(request.route), request)
            except redis.exceptions.MovedError:
                # The slot moved (resharding): refresh the slot map, send to the new owner.
                self.client.nodes_manager.initialize()
                return self._pipeline(self._owner(request.route), request)

    def _owner(self, key: str) -> Any:
        """The standalone client of the cluster master that owns ``key``'s slot."""
        return self.client.get_redis_connection(self.client.get_node_from_key(key))

    @staticmethod
    def _pipeline(client: Any, batch: Batch) -> Any:
        pipe = client.pipeline(transaction=False)
        for command in batch.commands:
            pipe.execute_command(*_batch_args(command))
        return pipe.execute()

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
        ps: Any = None
        with _translated(self.url):
            try:
                # On Cluster, see _AsyncioTransport.subscribe: a plain pub/sub on the channel's
                # master.
                ps = (self._owner(channel) if self.is_cluster else self.client).pubsub()
                ps.ssubscribe(channel)
                _confirm_subscription(ps.get_message)
            except Exception as exc:
                if ps is not None:
                    with contextlib.suppress(*_REDIS_ERRORS):
                        ps.close()
                if self.is_cluster and isinstance(exc, redis.exceptions.MovedError):
                    # See _AsyncioTransport.subscribe: the slot moved; refresh the slot map.
                    with contextlib.suppress(*_REDIS_ERRORS):
                        self.client.nodes_manager.initialize()
                raise
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
        # Cluster only: a standalone client per master, for batches routed to a slot's owner.
        self._owners: dict[str, Any] = {}
        try:
            if self.is_cluster:
                self.client: Any = redis.asyncio.cluster.RedisCluster.from_url(
                    redis_url, **_timeouts())
            else:
                self.client = redis.asyncio.Redis.from_url(
                    redis_url, **_standalone_options(redis_url, AsyncRetry))
        except ValueError as exc:
            raise ConfigError(f"invalid Redis URL {redact_url(url)!r}: {exc}") from exc

    async def execute(self, request: Request) -> Any:
        with _translated(self.url):
            if isinstance(request, ScriptCall):
                try:
                    return await self.client.execute_command(*_script_args(request, cached=True))
                except redis.exceptions.NoScriptError:
                    return await self.client.execute_command(
                        *_script_args(request, cached=False))
            if isinstance(request, Command):
                return await self.client.execute_command(*request.args)
            if isinstance(request, Scan):
                return [key async for key in self.client.scan_iter(match=request.match,
                                                                   count=_SCAN_COUNT)]
            if not (self.is_cluster and request.route is not None):
                return await self._pipeline(self.client, request)
            try:
                return await self._pipeline(await self._owner(request.route), request)
            except redis.exceptions.MovedError:
                # The slot moved (resharding): refresh the slot map, send to the new owner.
                await self.client.nodes_manager.initialize()
                return await self._pipeline(await self._owner(request.route), request)

    async def _owner(self, key: str) -> Any:
        """A standalone client of the cluster master that owns ``key``'s slot (redis-py's
        asyncio cluster has no public one), made once per master."""
        await self.client.initialize()
        node = self.client.get_node_from_key(key)
        owner = self._owners.get(node.name)
        if owner is None:
            owner = redis.asyncio.Redis.from_url(
                _node_url(self._redis_url, node.host, node.port),
                **_standalone_options(self._redis_url, AsyncRetry))
            self._owners[node.name] = owner
        return owner

    @staticmethod
    async def _pipeline(client: Any, batch: Batch) -> Any:
        pipe = client.pipeline(transaction=False)
        for command in batch.commands:
            pipe.execute_command(*_batch_args(command))
        return await pipe.execute()

    async def subscribe(self, channel: str) -> AsyncSubscriber:
        owner: Any = None
        ps: Any = None
        with _translated(self.url):
            try:
                if self.is_cluster:
                    # redis-py's ClusterPubSub delivers sharded messages only through
                    # get_sharded_message() and sends PING on another connection, so neither
                    # the wake-ups nor the health check would arrive. Subscribe with a plain
                    # client on the master that owns the channel's slot instead (same
                    # credentials and TLS).
                    await self.client.initialize()
                    node = self.client.get_node_from_key(channel)
                    owner = redis.asyncio.Redis.from_url(
                        _node_url(self._redis_url, node.host, node.port), **_timeouts())
                ps = (owner or self.client).pubsub()
                await ps.ssubscribe(channel)
                deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT
                while time.monotonic() < deadline:
                    message = await ps.get_message(timeout=0.5)
                    if message is not None and message.get("type") in _SUBSCRIBED:
                        break
                else:
                    raise redis.exceptions.TimeoutError("no confirmation of the subscription")
            except Exception as exc:
                await _AsyncioSubscriber(self.url, ps, owner).aclose()
                if self.is_cluster and isinstance(exc, redis.exceptions.MovedError):
                    # The channel's slot moved to another master (resharding). Only commands
                    # refresh redis-py's slot map, and an idle worker sends none, so every
                    # retry would ask the old owner again: refresh the map so the next attempt
                    # subscribes on the new owner.
                    with contextlib.suppress(*_REDIS_ERRORS):
                        await self.client.nodes_manager.initialize()
                raise
        return _AsyncioSubscriber(self.url, ps, owner)

    async def aclose(self) -> None:
        owners, self._owners = list(self._owners.values()), {}
        for owner in owners:
            with contextlib.suppress(*_REDIS_ERRORS):
                await owner.aclose()
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
        with _translated(self._url):
            message = await self._pubsub.get_message(ignore_subscribe_messages=False,
                                                      timeout=timeout)
        return _payload(message, self._url)

    async def ping(self) -> None:
        with _translated(self._url):
            await self._pubsub.ping()

    async def aclose(self) -> None:
        for connection in self._connections:
            connection.deregister_connect_callback(self._on_connect)
        with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            for resource in (self._pubsub, self._owner):
                if resource is not None:
                    with contextlib.suppress(*_REDIS_ERRORS):
                        await resource.aclose()


# On trio, redis-py runs in worker threads, under a limiter of the transport's own: anyio's
# default one has 40 threads for the whole process, and each idle worker's subscriber holds a
# thread while it waits for a wake-up, so a pool of 40 queues would leave no thread for the
# claims. Commands get this many threads; every live subscription adds one.
_COMMAND_THREADS = 40


class _ThreadTransport(AsyncTransport):
    """trio: the sync client, called from anyio worker threads."""

    def __init__(self, url: str) -> None:
        self._sync = SyncTransport(url)
        self.url = url
        self.is_cluster = self._sync.is_cluster
        self._limiter = anyio.CapacityLimiter(_COMMAND_THREADS)

    async def execute(self, request: Request) -> Any:
        # Cancellable like the asyncio transport: a cancelled call's thread is left to finish
        # on its own (within the socket timeout) and returns its connection to the pool.
        return await anyio.to_thread.run_sync(self._sync.execute, request,
                                              abandon_on_cancel=True, limiter=self._limiter)

    async def subscribe(self, channel: str) -> AsyncSubscriber:
        self._limiter.total_tokens += 1  # the subscription's own thread, from now on
        try:
            ps = await anyio.to_thread.run_sync(self._sync.pubsub, channel,
                                                limiter=self._limiter)
        except BaseException:
            self._limiter.total_tokens -= 1
            raise
        return _ThreadSubscriber(self.url, ps, self._limiter)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._sync.close, abandon_on_cancel=True,
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
