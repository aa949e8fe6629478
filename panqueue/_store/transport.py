"""Redis access for the rest of panqueue: the only module that knows asyncio from trio.

* On asyncio, ``redis.asyncio`` (standalone or cluster) is used directly.
* On trio, ``redis.asyncio`` cannot run, so redis-py's sync client is called in worker threads.
* The sync client (``SyncQueueClient``, Spark executors) uses redis-py's sync client as is.

Operations elsewhere are written once, as generators that yield requests (a script call, a
command, or a batch of commands) and receive replies; :meth:`SyncTransport.run` and
:meth:`AsyncTransport.run` drive them. So the async and sync clients share every line of logic.
"""

from __future__ import annotations

import functools
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

from panqueue._store.scripts import Script
from panqueue.errors import ConfigError
from panqueue.errors import ConnectionError as PanqueueConnectionError

__all__ = [
    "AsyncSubscriber",
    "AsyncTransport",
    "Batch",
    "Command",
    "Op",
    "ScriptCall",
    "SyncTransport",
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


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, ""))


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
                self.client = redis.Redis.from_url(redis_url)
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

    def _script(self, call: ScriptCall) -> Any:
        s = call.script
        try:
            return self.client.execute_command("EVALSHA", s.sha, len(call.keys), *call.keys,
                                               *call.args)
        except redis.exceptions.NoScriptError:
            return self.client.execute_command("EVAL", s.body, len(call.keys), *call.keys,
                                               *call.args)

    def run(self, op: Op[T]) -> T:
        try:
            request = next(op)
            while True:
                request = op.send(self.execute(request))
        except StopIteration as done:
            result: T = done.value
            return result

    def pubsub(self, channel: str) -> Any:
        ps = self.client.pubsub()
        try:
            ps.ssubscribe(channel)
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(self.url, exc) from exc
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


def _payload(message: Any) -> bytes | None:
    if message is None:
        return None
    kind = message.get("type")
    if kind in (b"pong", "pong"):
        return b""
    if kind in ("smessage", "message", b"smessage", b"message"):
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
        try:
            request = next(op)
            while True:
                request = op.send(await self.execute(request))
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
        try:
            if self.is_cluster:
                self.client: Any = redis.asyncio.cluster.RedisCluster.from_url(redis_url)
            else:
                self.client = redis.asyncio.Redis.from_url(redis_url)
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

    async def subscribe(self, channel: str) -> AsyncSubscriber:
        ps = self.client.pubsub()
        try:
            await ps.ssubscribe(channel)
        except _CONNECTION_ERRORS as exc:
            await ps.aclose()
            raise _connection_error(self.url, exc) from exc
        return _AsyncioSubscriber(self.url, ps)

    async def aclose(self) -> None:
        await self.client.aclose()


class _AsyncioSubscriber(AsyncSubscriber):
    def __init__(self, url: str, pubsub: Any) -> None:
        self._url = url
        self._pubsub = pubsub

    async def get(self, timeout: float) -> bytes | None:
        try:
            message = await self._pubsub.get_message(ignore_subscribe_messages=True,
                                                      timeout=timeout)
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(self._url, exc) from exc
        return _payload(message)

    async def ping(self) -> None:
        try:
            await self._pubsub.ping()
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(self._url, exc) from exc

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self._pubsub.aclose()
            except _CONNECTION_ERRORS:
                pass


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

    async def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            # The thread is abandoned on cancellation; it returns by itself within `timeout`.
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
        except _CONNECTION_ERRORS as exc:
            raise _connection_error(self._url, exc) from exc

    async def get(self, timeout: float) -> bytes | None:
        fn = functools.partial(self._pubsub.get_message, ignore_subscribe_messages=True,
                               timeout=timeout)
        return _payload(await self._call(fn))

    async def ping(self) -> None:
        await self._call(self._pubsub.ping)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(self._pubsub.close, abandon_on_cancel=True)
            except _CONNECTION_ERRORS:
                pass


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
