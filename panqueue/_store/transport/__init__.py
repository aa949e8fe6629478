"""Redis access for the rest of panqueue: the only module that knows asyncio from trio.

* On asyncio, ``redis.asyncio`` (standalone, cluster, or a Sentinel-managed master) is used
  directly.
* On trio, ``redis.asyncio`` cannot run, so redis-py's sync client is called in worker threads.
* The sync client (``SyncQueueClient``, Spark executors) uses redis-py's sync client as is.

Operations elsewhere are written once, as generators that yield requests (a script call, a
command, or a batch of commands) and receive replies; :meth:`SyncTransport.run` and
:meth:`AsyncTransport.run` drive them. So the async and sync clients share every line of logic.

redis-py's errors never leave this package: :func:`translate_error` maps each to panqueue's (see
:mod:`panqueue.errors`), and every call into redis-py runs inside ``errors._translated``.

The modules: ``requests`` (what an operation asks for), ``options`` (URLs, timeouts),
``errors`` (the translation), ``sync`` (the blocking transport), ``base`` (the async surface),
``aio`` (asyncio) and ``thread`` (trio); :func:`open_async_transport` picks the async one.
"""

from __future__ import annotations

from panqueue._store.transport import options
from panqueue._store.transport.aio import _AsyncioTransport
from panqueue._store.transport.base import AsyncSubscriber, AsyncTransport
from panqueue._store.transport.errors import translate_error
from panqueue._store.transport.options import (
    CONNECT_TIMEOUT,
    SOCKET_TIMEOUT,
    check_url,
    redact_url,
)
from panqueue._store.transport.requests import Batch, Command, Op, Request, Scan, ScriptCall
from panqueue._store.transport.sync import SyncTransport
from panqueue._store.transport.thread import _ThreadTransport

__all__ = [
    "CONNECT_TIMEOUT",
    "SOCKET_TIMEOUT",
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


def open_async_transport(url: str) -> AsyncTransport:
    """The async transport for the event loop this is called from."""
    if _running_on_trio():
        return _ThreadTransport(url)
    return _AsyncioTransport(url)
