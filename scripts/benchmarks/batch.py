"""Batches (``--batch`` only; not part of the full run): adding N jobs through a batch against
plain ``add_bulk``, on the same server in the same run.

* plain: ``client.queue(q).add_bulk`` in calls of BATCH (1000) jobs.
* batch: one ``batch.add_bulk(q, items)`` of all N jobs, which registers each chunk of 1000 ids
  in the batch's slot and then adds the chunk with the add script (two round trips per 1000).

The job data is built before the clock starts; each run uses a fresh queue. Three runs of each,
alternated, best kept. N = 100,000 (``--quick``: 20,000).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import anyio

from benchmarks.common import BATCH, Bench, log, print_table
from panqueue import QueueClient

ROUNDS = 3


async def _plain(url: str, items: list[dict[str, int]]) -> float:
    async with QueueClient(url) as client:
        queue = client.queue(f"bench-plain-{uuid.uuid4().hex[:8]}")
        await queue.add_bulk(items[:10])  # warm-up: connection, script cache
        chunks = [items[b:b + BATCH] for b in range(0, len(items), BATCH)]
        start = time.perf_counter()
        for chunk in chunks:
            await queue.add_bulk(chunk)
        return len(items) / (time.perf_counter() - start)


async def _batched(url: str, items: list[dict[str, int]]) -> float:
    async with QueueClient(url) as client:
        name = f"bench-batch-{uuid.uuid4().hex[:8]}"
        warm = await client.batch(on_complete=("bench-batch-done", {}))
        await warm.add_bulk(name, items[:10])
        batch = await client.batch(on_complete=("bench-batch-done", {}))
        start = time.perf_counter()
        await batch.add_bulk(name, items)
        rate = len(items) / (time.perf_counter() - start)
        info = await batch.info()
        assert info.total == info.pending == len(items), info
        return rate


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    n = 20_000 if quick else 100_000
    items = [{"i": i} for i in range(n)]
    log(f"batch: {n:,} jobs, batch.add_bulk against add_bulk, best of {ROUNDS} alternated")
    plain: list[float] = []
    batched: list[float] = []
    for _ in range(ROUNDS):
        plain.append(anyio.run(_plain, bench.url, items, backend=bench.backend))
        batched.append(anyio.run(_batched, bench.url, items, backend=bench.backend))
        bench.redis.flushdb()
    return {"jobs": n, "add_bulk_per_s": max(plain), "batch_add_bulk_per_s": max(batched),
            "ratio": max(batched) / max(plain), "runs_add_bulk": plain,
            "runs_batch": batched}


def report(figures: dict[str, Any]) -> None:
    print(f"Adding {figures['jobs']:,} jobs (best of {ROUNDS} alternated runs, same server):")
    print_table(["how", "jobs/s"],
                [["client add_bulk, 1000 per call", f"{figures['add_bulk_per_s']:,.0f}"],
                 ["batch.add_bulk (register + add per 1000)",
                  f"{figures['batch_add_bulk_per_s']:,.0f}"]],
                [False, True])
    print(f"batch / plain: {figures['ratio']:.2f}")
