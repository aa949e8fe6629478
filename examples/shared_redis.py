"""Two applications on one Redis: each under its own key prefix, and a bound on job size.

``billing`` and ``search`` both have a queue named ``tasks``. With ``prefix=`` every key of
each lives under ``{billing:...`` or ``{search:...``: neither sees the other's queues, jobs or
workers, and each can run as a Redis ACL user limited to its own keys and channels (see
docs/operations.md, "Sharing one Redis"). ``max_payload_bytes`` refuses a job too large to
belong in Redis before anything is written.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/shared_redis.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import os
from typing import Any

import anyio

from panqueue import Job, JobState, PayloadError, QueueClient, Registry, Worker
from panqueue.embedded import url_or_private_server

# The registry carries the prefix: its workers (and `panqueue worker billing:queues`) use it.
billing = Registry(prefix="billing")


@billing.handler("tasks")
async def charge(job: Job) -> dict[str, Any]:
    return {"charged": job.data["amount"]}


async def main(url: str) -> None:
    async with QueueClient(url, prefix="billing", max_payload_bytes=64_000) as bill, \
            QueueClient(url, prefix="search") as search:
        handles = [await bill.queue("tasks").add({"amount": n}) for n in (5, 7)]
        await search.queue("tasks").add({"reindex": "products"})
        print(f"billing sees {await bill.queues()}: "
              f"{(await bill.counts('tasks'))[JobState.WAITING]} waiting")
        print(f"search sees {await search.queues()}: "
              f"{(await search.counts('tasks'))[JobState.WAITING]} waiting")

        try:
            await bill.queue("tasks").add({"invoice_pdf": "x" * 100_000})
        except PayloadError as exc:
            print(f"refused: {exc}")

        worker = Worker(billing, "tasks", url=url)  # prefix "billing", from the registry
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            results = [await handle.result(timeout=10) for handle in handles]
            await worker.shutdown(grace=5.0)
        print(f"billing's worker ran {results}")
        print(f"search's job still waits: "
              f"{(await search.counts('tasks'))[JobState.WAITING]} waiting")
        for client in (bill, search):  # leave the server as we found it
            await client.purge("tasks")


if __name__ == "__main__":
    with url_or_private_server(announce=False) as url:
        if not os.environ.get("PANQUEUE_URL"):
            print(f"started a private server on {url}")
        anyio.run(main, url)
    print("done")
