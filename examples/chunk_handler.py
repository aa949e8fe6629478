"""Chunk handlers: one call for many jobs (a bulk insert, a batched API request).

Rows to load into a warehouse arrive as one job each; inserting them one at a time would cost
a round trip per row. A chunk handler gets a list of jobs (up to Chunk.size, or fewer once
Chunk.wait seconds have passed since the first arrived), inserts them in one statement, and
returns one result per job, in order. A row that cannot be loaded gets a ChunkFailure in its
slot: that job alone fails and is retried on its own; the others complete.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/chunk_handler.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

from typing import Any, TypedDict

import anyio

from panqueue import (
    Backoff,
    Chunk,
    ChunkFailure,
    Job,
    QueueClient,
    Registry,
    Worker,
    configure_logging,
)
from panqueue.embedded import url_or_private_server

queues = Registry()
warehouse: list[dict[str, Any]] = []  # the "table": one list per insert statement below
statements: list[int] = []


class Row(TypedDict):
    sku: str
    qty: int


# Up to 50 rows per call; a lone row waits at most 0.2 s for company. A failed row is retried
# on its own, by its own policy (3 attempts here).
@queues.handler("rows", chunk=Chunk(size=50, wait=0.2), attempts=3, backoff=Backoff.fixed(0.1))
async def load_rows(jobs: list[Job[Row]]) -> list[Any]:
    results: list[Any] = []
    batch = []
    for i, job in enumerate(jobs):
        if job.data["qty"] < 0 and job.attempt == 1:  # fixed upstream before the retry
            results.append(ChunkFailure(i, ValueError(f"negative qty for {job.data['sku']}")))
            continue
        batch.append({**job.data, "qty": abs(job.data["qty"])})
        results.append({"row": len(warehouse) + len(batch) - 1})
    warehouse.extend(batch)  # one insert statement for the whole chunk
    statements.append(len(batch))
    return results


async def main(url: str) -> None:
    worker = Worker(queues, "rows", url=url)
    async with QueueClient(url) as client:
        rows = client.queue(load_rows)  # typed by the handler: add() takes a Row
        handles = await rows.add_bulk([{"sku": f"sku-{n}", "qty": n} for n in range(120)])
        bad = await rows.add({"sku": "sku-x", "qty": -3})
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            results = [await handle.result(timeout=10.0) for handle in handles]
            print(f"120 rows loaded by inserts of {statements[:3]} rows")
            print(f"first result: {results[0]}, last result: {results[-1]}")
            print(f"bad row: {await bad.result(timeout=10.0)} on attempt "
                  f"{(await bad.info()).attempts}")
            print(f"its first attempt: {(await bad.info()).history[0]['message']}")

            started = anyio.current_time()
            lone = await rows.add({"sku": "sku-late", "qty": 1})
            await lone.result(timeout=10.0)
            waited = anyio.current_time() - started
            print(f"a lone row ran once the chunk's 0.2 s wait was over: {waited >= 0.2}")
            await worker.shutdown(grace=5.0)


if __name__ == "__main__":
    configure_logging(level="error")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
