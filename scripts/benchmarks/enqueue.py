"""Enqueue rate: single adds from the async and the sync client, and ``add_bulk``.

* single: N sequential ``await queue.add(...)`` (QueueClient), and the same with
  ``SyncQueueClient``; 100 unmeasured adds first (connection, script cache).
* bulk: ``add_bulk`` in batches of 1000, the job data built before the clock starts.
"""

from __future__ import annotations

import time

from benchmarks.common import BATCH
from panqueue import QueueClient, SyncQueueClient


async def enqueue_async(url: str, n: int) -> float:
    """Jobs per second of ``n`` sequential ``await queue.add()``."""
    async with QueueClient(url) as client:
        queue = client.queue("bench-enqueue-async")
        for i in range(100):  # warm-up: connection, script cache
            await queue.add({"i": i})
        start = time.perf_counter()
        for i in range(n):
            await queue.add({"i": i})
        return n / (time.perf_counter() - start)


def enqueue_sync(url: str, n: int) -> float:
    """Jobs per second of ``n`` sequential ``queue.add()`` on the sync client."""
    with SyncQueueClient(url) as client:
        queue = client.queue("bench-enqueue-sync")
        for i in range(100):
            queue.add({"i": i})
        start = time.perf_counter()
        for i in range(n):
            queue.add({"i": i})
        return n / (time.perf_counter() - start)


async def enqueue_bulk(url: str, n: int) -> float:
    """Jobs per second of ``n`` jobs added with ``add_bulk``, BATCH at a time."""
    async with QueueClient(url) as client:
        queue = client.queue("bench-enqueue-bulk")
        await queue.add_bulk([{"i": i} for i in range(BATCH)])  # warm-up
        batches = [[{"i": i} for i in range(b, min(b + BATCH, n))] for b in range(0, n, BATCH)]
        start = time.perf_counter()
        for batch in batches:
            await queue.add_bulk(batch)
        return n / (time.perf_counter() - start)
