"""Redis access for the rest of panqueue: the only module that knows asyncio from trio.

* On asyncio, ``redis.asyncio`` (standalone, cluster, or a Sentinel-managed master) is used
  directly, but for a standalone server's wake-up subscriptions, read on an asyncio protocol
  of panqueue's own (``aio_subscriber``).
* On trio, ``redis.asyncio`` cannot run: a standalone server is spoken to over trio's own sockets
  (``native``); Cluster and Sentinel use redis-py's sync client in worker threads (``thread``).
* The sync client (``SyncQueueClient``, Spark executors) uses redis-py's sync client as is.

Operations elsewhere are written once, as generators that yield requests (a script call, a
command, or a batch of commands) and receive replies; :meth:`SyncTransport.run` and
:meth:`AsyncTransport.run` drive them. So the async and sync clients share every line of logic.

redis-py's errors never leave this package: :func:`translate_error` maps each to panqueue's (see
:mod:`panqueue.errors`), and every call into redis-py runs inside ``errors._translated``.

The modules: ``requests`` (what an operation asks for), ``options`` (URLs, timeouts),
``errors`` (the translation), ``sync`` (the blocking transport), ``base`` (the async surface),
``aio`` and ``aio_subscriber`` (asyncio), ``native`` and ``thread`` (trio), ``standalone`` (the
connection options of one server, for ``native`` and ``aio_subscriber``);
:func:`open_async_transport` picks the async one.
"""

from __future__ import annotations

from panqueue._store.transport import options, standalone
from panqueue._store.transport.aio import _AsyncioTransport
from panqueue._store.transport.base import AsyncSubscriber, AsyncTransport
from panqueue._store.transport.errors import translate_error
from panqueue._store.transport.options import (
    CONNECT_TIMEOUT,
    SOCKET_TIMEOUT,
    URL_SCHEMES,
    check_url,
    redact_url,
)
from panqueue._store.transport.requests import Batch, Command, Op, Request, Scan, ScriptCall
from panqueue._store.transport.sync import SyncTransport
from panqueue._store.transport.thread import _ThreadTransport
from panqueue.errors import ConfigError

__all__ = [
    "CONNECT_TIMEOUT",
    "SOCKET_TIMEOUT",
    "URL_SCHEMES",
    "AsyncSubscriber",
    "AsyncTransport",
    "Batch",
    "Command",
    "Op",
    "Request",
    "Scan",
    "ScriptCall",
    "SyncTransport",
    "check_url",
    "open_async_transport",
    "options",
    "redact_url",
    "translate_error",
]


def _running_on_trio() -> bool:
    try:
        import sniffio
    except ImportError:  # trio always brings sniffio; without it we are on asyncio
        return False
    try:
        return bool(sniffio.current_async_library() == "trio")
    except sniffio.AsyncLibraryNotFoundError:
        return False


def open_async_transport(url: str, prefix: str | None = None) -> AsyncTransport:
    """The async transport for the event loop this is called from, whose operations build
    their keys under ``prefix`` (taken as checked)."""
    transport = _open_async_transport(url)
    transport.prefix = prefix
    return transport


def _open_async_transport(url: str) -> AsyncTransport:
    if not _running_on_trio():
        return _AsyncioTransport(url)
    from panqueue._store.transport import native  # imports trio: only on trio

    is_cluster, _ = options._parse(url)
    if not is_cluster and options._sentinel_target(url) is None:
        try:
            settings = standalone.settings_for(url)
        except ValueError as exc:
            raise ConfigError(f"invalid Redis URL {redact_url(url)!r}: {exc}") from exc
        if settings is not None:
            return native._NativeTransport(url, settings)
    return _ThreadTransport(url)
