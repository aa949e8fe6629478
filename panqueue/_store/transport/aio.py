"""The async transport on asyncio: ``redis.asyncio`` (standalone, cluster, or a master found
through Sentinel) directly."""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any

import anyio
import anyio.to_thread
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.exceptions
from redis.asyncio.retry import Retry as AsyncRetry

from panqueue._store.transport import resp, standalone
from panqueue._store.transport.aio_subscriber import _ProtocolSubscriber
from panqueue._store.transport.base import (
    _SUBSCRIBE_TIMEOUT,
    _SUBSCRIBED,
    WAKE,
    AsyncSubscriber,
    AsyncTransport,
    _pubsub_connections,
    _reply_payload,
)
from panqueue._store.transport.errors import _REDIS_ERRORS, _translated
from panqueue._store.transport.options import (
    _CLOSE_TIMEOUT,
    _SCAN_COUNT,
    _node_url,
    _parse,
    _pooled_client,
    _sentinel_clients,
    _sentinel_target,
    _timeouts,
    redact_url,
)
from panqueue._store.transport.requests import (
    Batch,
    Command,
    Functions,
    Request,
    Scan,
    ScriptCall,
    _batch_args,
    call_script_async,
)
from panqueue.errors import ConfigError


class _Packed:
    """A ``redis.asyncio`` connection whose commands hiredis packs (:func:`resp.pack`, the
    trio transport's packer), in C, where redis-py's asyncio connection packs them in Python,
    joining the buffer again for each argument: a completion call carries a few arguments per
    job, and packing was about an eighth of a worker's CPU per job (docs/performance.md). The
    bytes are the same (str as UTF-8, numbers as redis-py writes them; another type raises
    redis-py's DataError)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0].encode() if isinstance(args[0], str) else args[0]
        if b" " in first:  # "CONFIG GET": the server expects the words apart, as redis-py
            args = (*first.split(), *args[1:])
        return [resp.pack(args)]


class _PackedConnection(_Packed, redis.asyncio.Connection):
    pass


class _PackedSSLConnection(_Packed, redis.asyncio.SSLConnection):
    pass


class _PackedUnixConnection(_Packed, redis.asyncio.UnixDomainSocketConnection):
    pass


_PACKED: dict[type, type] = {
    redis.asyncio.Connection: _PackedConnection,
    redis.asyncio.SSLConnection: _PackedSSLConnection,
    redis.asyncio.UnixDomainSocketConnection: _PackedUnixConnection,
}


def _standalone_client(url: str) -> Any:
    """A ``redis.asyncio`` client of a standalone server, its commands packed by hiredis when
    it is installed (the connection class of ``url``'s scheme, with :class:`_Packed`)."""
    client = _pooled_client(redis.asyncio.BlockingConnectionPool, redis.asyncio.Redis, url,
                                AsyncRetry)
    pool = client.connection_pool  # no connection is made before the first command
    packed = _PACKED.get(pool.connection_class)
    if resp.hiredis is not None and packed is not None:
        pool.connection_class = packed
    return client


class _AsyncioTransport(AsyncTransport):
    def __init__(self, url: str) -> None:
        self.url = url
        self.is_cluster, redis_url = _parse(url)
        self._redis_url = redis_url
        # Cluster only: a standalone client per master, for batches routed to a slot's owner.
        self._owners: dict[str, Any] = {}
        self._sentinels: Any = None  # Sentinel URLs: the client of the sentinels
        self._functions = Functions()
        self.client: Any
        # Connections of a standalone client's pool kept out of it between script calls
        # (``_send``); None where the pool itself hands each one out (Sentinel, Cluster).
        self._kept: list[Any] | None = None
        try:
            target = _sentinel_target(url)
            if target is not None:
                self._sentinels, self.client = _sentinel_clients(
                    target, redis.asyncio.sentinel.Sentinel, AsyncRetry, redis_url)
            elif self.is_cluster:
                self.client = redis.asyncio.cluster.RedisCluster.from_url(
                    redis_url, **_timeouts())
            else:
                self.client = _standalone_client(redis_url)
                self._kept = []
        except ValueError as exc:
            raise ConfigError(f"invalid Redis URL {redact_url(url)!r}: {exc}") from exc

    async def execute(self, request: Request) -> Any:
        with _translated(self.url):
            if isinstance(request, ScriptCall):
                return await self._script(request)
            if self._kept:
                # Back to the pool, which the other requests go through.
                await self._give_back()
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

    async def _script(self, call: ScriptCall) -> Any:
        if self._kept is not None:
            return await call_script_async(call, self._functions, self._send)
        if not self.is_cluster:
            return await call_script_async(call, self._functions,
                                           lambda command: self.client.execute_command(*command))
        # To the node of the call's key, named: redis-py would ask a node for the keys of an
        # FCALL (COMMAND GETKEYS, a round trip per call).
        await self.client.initialize()
        node = self.client.get_node_from_key(call.keys[0])
        return await call_script_async(
            call, self._functions,
            lambda command: self.client.execute_command(*command, target_nodes=node))

    async def _send(self, command: tuple[Any, ...]) -> Any:
        """One command of a script call on a standalone server, as the sync transport sends
        it (``SyncTransport._send``): on a connection its script calls keep out of the pool,
        packed here, its reply read by the connection, under the pool's retry policy. A call
        cancelled or failed with its reply half read leaves the connection closed (redis-py
        closes it), and the next call opens it again."""
        kept = self._kept
        assert kept is not None
        try:
            conn = kept.pop()
        except IndexError:
            conn = await self.client.connection_pool.get_connection()
        try:
            packed = [resp.pack(command)]
            return await conn.retry.call_with_retry(lambda: _round_trip(conn, packed),
                                                    lambda _error: conn.disconnect())
        finally:
            kept.append(conn)

    async def _give_back(self) -> None:
        """Return the kept connections to the pool."""
        kept, pool = self._kept, self.client.connection_pool
        while kept:
            await pool.release(kept.pop())

    async def _owner(self, key: str) -> Any:
        """A standalone client of the cluster master that owns ``key``'s slot (redis-py's
        asyncio cluster has no public one), made once per master."""
        await self.client.initialize()
        node = self.client.get_node_from_key(key)
        owner = self._owners.get(node.name)
        if owner is None:
            owner = _standalone_client(_node_url(self._redis_url, node.host, node.port))
            self._owners[node.name] = owner
        return owner

    @staticmethod
    async def _pipeline(client: Any, batch: Batch) -> Any:
        pipe = client.pipeline(transaction=False)
        for command in batch.commands:
            pipe.execute_command(*_batch_args(command))
        return await pipe.execute()

    async def node_of(self, key: str) -> str:
        if not self.is_cluster:
            return ""
        with _translated(self.url):
            await self.client.initialize()
            return str(self.client.get_node_from_key(key).name)

    @functools.cached_property
    def _settings(self) -> standalone.Settings | None:
        """A standalone server's connection options, for its wake-up subscriptions, read at
        the first (about a millisecond: redis-py makes a client to read them). None: Sentinel,
        Cluster, or a URL that asks for what only redis-py does."""
        return None if self._kept is None else standalone.settings_for(self.url)

    async def subscribe(self, *channels: str) -> AsyncSubscriber:
        if self._settings is not None:  # one standalone server: on asyncio's own protocol
            with _translated(self.url):
                return await _ProtocolSubscriber.open(self.url, self._settings, channels)
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
                    node = self.client.get_node_from_key(channels[0])
                    owner = redis.asyncio.Redis.from_url(
                        _node_url(self._redis_url, node.host, node.port), **_timeouts())
                ps = (owner or self.client).pubsub(push_handler_func=_pushed)
                for channel in channels:  # one command each: on a cluster, slots differ
                    await ps.ssubscribe(channel)
                deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT
                waiting = len(channels)
                while time.monotonic() < deadline and waiting:
                    message = await ps.get_message(timeout=0.5)
                    if message is not None and message.get("type") in _SUBSCRIBED:
                        waiting -= 1
                if waiting:
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
        if self._kept:
            with contextlib.suppress(*_REDIS_ERRORS):
                await self._give_back()
        self._kept = None
        owners, self._owners = list(self._owners.values()), {}
        for owner in owners:
            with contextlib.suppress(*_REDIS_ERRORS):
                await owner.aclose()
        await self.client.aclose()
        if self._sentinels is not None:
            # Each sentinel's client (redis-py 8.0 has no Sentinel.aclose()).
            for sentinel in self._sentinels.sentinels:
                with contextlib.suppress(*_REDIS_ERRORS):
                    await sentinel.aclose()


async def _pushed(message: Any) -> Any:
    """A pub/sub message (RESP3), as it came. redis-py's own handler writes each one into a
    debug line first, formatting the whole message (a handed job's data) whatever the level,
    and gives its logger a handler of its own, writing to stderr."""
    return message


async def _round_trip(conn: Any, packed: list[bytes]) -> Any:
    await conn.send_packed_command(packed)
    return await conn.read_response()


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
        # The reply as read, not get_message's: that makes a dict of each message and awaits
        # redis-py's metrics hook for it, on the way of every job an idle worker is handed.
        with _translated(self._url):
            reply = await self._pubsub.parse_response(block=False, timeout=timeout)
        return _reply_payload(reply, self._url)

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
