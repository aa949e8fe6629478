"""Test your own handlers against a real server: a pytest plugin and two async helpers.

Enable the plugin in your top-level ``conftest.py``::

    pytest_plugins = ["panqueue.testing"]

or on the command line: ``pytest -p panqueue.testing``. It provides two fixtures:

``panqueue_server`` (session)
    A private :class:`~panqueue.embedded.RedisServer` (``redis-server``, ``valkey-server`` or
    the ``embedded`` extra's binary) on a free port of 127.0.0.1, without persistence, stopped
    and its directory deleted at the end of the session.
``panqueue_url`` (function)
    That server's URL, with its database flushed before the test.

The helpers :func:`run_worker` and :func:`drain` are plain anyio code: they work on asyncio and
trio, inside pytest or outside it, and importing this module does not need pytest.

:class:`FaultProxy` is a TCP proxy on 127.0.0.1 in front of a server, running in threads of its
own, that injects network faults: cut every connection, blackhole them, add latency, or lose
the reply to a command the server ran. Point a worker or client at ``proxy.url`` to test how
your code behaves when the network misbehaves.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import redis

from panqueue._client import QueueClient
from panqueue._faultproxy import SCRIPT_CALLS, FaultProxy
from panqueue._job import JobState
from panqueue._registry import Registry
from panqueue._runtime.worker import Worker
from panqueue.embedded import RedisServer
from panqueue.errors import TimeoutError as PanqueueTimeoutError

try:
    import pytest
except ImportError:  # the helpers below work without pytest; only the fixtures need it
    _HAVE_PYTEST = False
else:
    _HAVE_PYTEST = True

# The fixtures are found by pytest as module attributes; they are not part of ``import *``.
__all__ = ["SCRIPT_CALLS", "UNFINISHED", "FaultProxy", "drain", "run_worker"]

#: The states of a job that is not done yet; :func:`drain` waits until none is left.
UNFINISHED = frozenset({JobState.WAITING, JobState.DELAYED, JobState.BLOCKED, JobState.ACTIVE})


@asynccontextmanager
async def run_worker(registry: Registry, queue: str, url: str, *, grace: float = 5.0,
                     **worker_options: Any) -> AsyncIterator[Worker]:
    """A :class:`~panqueue.Worker` serving ``queue`` in the background for the duration of the
    block; yields the worker once it listens for work.

    ``worker_options`` go to ``Worker`` (``concurrency``, ``poll_interval``, ...). On exit the
    worker stops claiming, gives running jobs ``grace`` seconds to finish, then cancels them and
    releases them to waiting. ``url`` is required on purpose: a test never falls back to
    ``$PANQUEUE_URL`` or ``localhost:6379`` by accident. An error raised by the worker fails the
    block. Works on asyncio and trio (anyio task groups)::

        async with run_worker(queues, "emails", panqueue_url) as worker:
            ...
    """
    worker = Worker(registry, queue, url=url, **worker_options)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)  # raises here if the server cannot be reached
        try:
            yield worker
        finally:
            await worker.shutdown(grace=grace)


async def drain(url: str, queue: str, *, timeout: float = 10.0, interval: float = 0.02,
                prefix: str | None = None) -> dict[JobState, int]:
    """Wait until ``queue`` has no waiting, delayed, blocked or active job, and return its
    counts by state (so a test can assert how many completed and failed).

    Polls every ``interval`` seconds; raises :class:`panqueue.TimeoutError` with the counts
    after ``timeout`` seconds. It is async because the worker of :func:`run_worker` runs on the
    same event loop: a blocking wait there would stop the worker it waits for. Note that a
    job retried with a backoff is ``delayed`` until its next attempt, so drain waits for it.
    ``prefix``: the queue's key prefix, as its registry's.
    """
    deadline = time.monotonic() + timeout
    async with QueueClient(url, prefix=prefix) as client:
        while True:
            counts = await client.counts(queue)
            if not any(counts.get(state, 0) for state in UNFINISHED):
                return counts
            if time.monotonic() >= deadline:
                left = {str(s): n for s, n in counts.items() if s in UNFINISHED and n}
                raise PanqueueTimeoutError(
                    f"queue {queue!r} not drained after {timeout} s: {left} left")
            await anyio.sleep(interval)


if _HAVE_PYTEST:

    @pytest.fixture(scope="session")
    def panqueue_server() -> Iterator[RedisServer]:
        """A private server for the test session, on a free port, without persistence."""
        server = RedisServer(appendonly=False)
        server.start()
        try:
            yield server
        finally:
            server.cleanup()

    @pytest.fixture
    def panqueue_url(panqueue_server: RedisServer) -> str:
        """The session server's URL, with an empty database for this test."""
        client = redis.Redis.from_url(panqueue_server.url)
        try:
            client.flushdb()
        finally:
            client.close()
        return panqueue_server.url
