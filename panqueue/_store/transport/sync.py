"""The blocking transport: redis-py's sync client (``SyncQueueClient``, Spark executors, the
watchdog thread, and the trio transport's threads)."""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions
import redis.sentinel
from redis.retry import Retry as SyncRetry

from panqueue._keys import prefixed
from panqueue._store.transport.base import _confirm_subscription
from panqueue._store.transport.errors import _REDIS_ERRORS, _translated
from panqueue._store.transport.options import (
    _SCAN_COUNT,
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
    Op,
    Request,
    Scan,
    ScriptCall,
    T,
    _batch_args,
    call_script,
)
from panqueue._store.transport.resp import pack
from panqueue.errors import ConfigError, PanqueueError


class SyncTransport:
    """Blocking access through redis-py's sync client (thread-safe, pooled)."""

    def __init__(self, url: str, prefix: str | None = None) -> None:
        self.url = url
        self.prefix = prefix  # the key namespace its operations build keys in (_keys.prefixed)
        self.is_cluster, redis_url = _parse(url)
        self._sentinels: Any = None  # Sentinel URLs: the client of the sentinels
        self._functions = Functions()
        self.client: Any
        # Connections of a standalone client's pool kept out of it between script calls
        # (``_send``); None where the pool itself must hand each one out (Sentinel: it checks
        # each connection against the master's address; Cluster: a pool per node).
        self._kept: list[Any] | None = None
        with _translated(url):
            try:
                target = _sentinel_target(url)
                if target is not None:
                    self._sentinels, self.client = _sentinel_clients(
                        target, redis.sentinel.Sentinel, SyncRetry, redis_url)
                elif self.is_cluster:
                    self.client = redis.cluster.RedisCluster.from_url(redis_url,
                                                                           **_timeouts())
                else:
                    self.client = _pooled_client(redis.BlockingConnectionPool,
                                                     redis.Redis, redis_url, SyncRetry)
                    self._kept = []
                    _keeping.add(self)
            except ValueError as exc:
                raise ConfigError(f"invalid Redis URL {redact_url(url)!r}: {exc}") from exc

    def execute(self, request: Request) -> Any:
        with _translated(self.url):
            if isinstance(request, ScriptCall):
                return self._script(request)
            if self._kept:
                # Back to the pool, which the other requests go through: a client used from one
                # thread keeps one connection.
                self._give_back()
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

    def _script(self, call: ScriptCall) -> Any:
        if not self.is_cluster:
            return call_script(call, self._functions, self._send)
        # To the node of the call's key, named: redis-py would ask a node for the keys of an
        # FCALL (COMMAND GETKEYS, a round trip per call).
        node = self.client.get_node_from_key(call.keys[0])
        return call_script(call, self._functions, lambda command: self.client.execute_command(
            *command, target_nodes=node))

    def _send(self, command: tuple[Any, ...]) -> Any:
        """One command of a script call, packed here and its reply read by the connection
        itself. redis-py's ``execute_command`` adds per command what a script call does not use
        (timing and metrics hooks, reply callbacks), and its pool's check-out and check-in
        (a lock, metrics, events, a poll of the socket) cost a single ``add()`` about a sixth
        of the client's time: a standalone client keeps the connections its script calls used
        and takes one of those first. The pool's retry policy applies as it does there: a
        connection the server closed while it sat idle is replaced and the command sent
        again, once (``_standalone_options``); any error that leaves a reply half read makes
        redis-py close the connection, which the next call opens again."""
        kept, pool = self._kept, self.client.connection_pool
        try:
            conn = pool.get_connection() if kept is None else kept.pop()
        except IndexError:  # none kept now
            conn = pool.get_connection()
        try:
            return _call(conn, [pack(command)])
        finally:
            if kept is None:
                pool.release(conn)
            else:
                kept.append(conn)

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
        """Drive an operation; errors are thrown into it, so it can explain or handle them.
        Each step runs under this transport's key prefix (``_keys.prefixed``): the keys the
        operation builds are this namespace's."""
        prefix = self.prefix
        try:
            with prefixed(prefix):
                request = op.send(None)
            while True:
                try:
                    reply = self.execute(request)
                except PanqueueError as exc:
                    with prefixed(prefix):
                        request = op.throw(exc)
                else:
                    with prefixed(prefix):
                        request = op.send(reply)
        except StopIteration as done:
            result: T = done.value
            return result

    def node_of(self, key: str) -> str:
        """See AsyncTransport.node_of."""
        if not self.is_cluster:
            return ""
        with _translated(self.url):
            return str(self.client.get_node_from_key(key).name)

    def pubsub(self, *channels: str) -> Any:
        ps: Any = None
        with _translated(self.url):
            try:
                # On Cluster, see _AsyncioTransport.subscribe: a plain pub/sub on the channels'
                # master.
                ps = (self._owner(channels[0]) if self.is_cluster else self.client).pubsub(
                    push_handler_func=_pushed)
                for channel in channels:
                    ps.ssubscribe(channel)
                _confirm_subscription(ps.get_message, len(channels))
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

    def _give_back(self) -> None:
        """Return the kept connections to the pool."""
        kept = self._kept
        if not kept:
            return
        pool = self.client.connection_pool
        while kept:
            try:
                conn = kept.pop()
            except IndexError:  # another thread took the last one
                return
            pool.release(conn)

    def close(self) -> None:
        self._give_back()
        self._kept = None
        self.client.close()
        if self._sentinels is not None:
            # Each sentinel's client (redis-py 8.0 has no Sentinel.close()).
            for sentinel in self._sentinels.sentinels:
                with contextlib.suppress(*_REDIS_ERRORS):
                    sentinel.close()


def _pushed(message: Any) -> Any:
    """A pub/sub message (RESP3), as it came (see ``aio._pushed``)."""
    return message


def _call(conn: Any, packed: list[bytes]) -> Any:
    return conn.retry.call_with_retry(lambda: _round_trip(conn, packed),
                                      lambda _error: conn.disconnect())


def _round_trip(conn: Any, packed: list[bytes]) -> Any:
    conn.send_packed_command(packed)
    return conn.read_response()


# Transports keeping connections: a forked child must not use its parent's sockets (the pool
# itself starts afresh in a child, on its first use there).
_keeping: weakref.WeakSet[SyncTransport] = weakref.WeakSet()


def _forget_kept() -> None:
    for transport in list(_keeping):
        if transport._kept is not None:
            transport._kept = []


os.register_at_fork(after_in_child=_forget_kept)
