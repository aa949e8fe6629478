"""Partitioned queues: ``partitions=N`` spreads one queue over N hash tags.

On Redis Cluster each partition's keys (``{q:<queue>#<i>}``) live on the master that owns its
slot, so one queue uses several masters' cores. Producers route each job by its key (keyed
mode) or id; one claim loop per worker asks the partitions in turn; counts, lists and events
cover the whole queue. On a single server (as here) the partitions share it, which is how an
application runs in development before it moves to a cluster.

    PANQUEUE_URL=redis+cluster://127.0.0.1:7000 python examples/partitioned_queue.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import uuid

import anyio

from panqueue import Job, JobState, QueueClient, RateLimit, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

QUEUE = f"events-{uuid.uuid4().hex[:6]}"
PARTITIONS = 3

queues = Registry()


# Keyed: each tenant's jobs live in one partition, so key_concurrency holds exactly; the rate
# limit stays one limit for the whole queue, across partitions and workers.
@queues.handler(QUEUE, partitions=PARTITIONS, mode="keyed", key_concurrency=1, concurrency=8,
                rate_limit=RateLimit(max=500, per=1.0))
async def record(job: Job) -> str:
    return f"{job.data['tenant']}:{job.data['n']}"


async def main(url: str) -> None:
    async with QueueClient(url) as client:
        queue = client.queue(record)
        handles = [await queue.add({"tenant": f"t{i % 6}", "n": i}, key=f"t{i % 6}",
                                   job_id=f"event-{i}")
                   for i in range(60)]
        # A custom id is idempotent on a partitioned queue too: the same id and key route to
        # the same partition, where the add finds the job.
        again = await queue.add({"tenant": "t0", "n": 0}, job_id="event-0", key="t0")
        print(f"re-adding job {again.id} found it: created={again.created}")

        waiting = await client.counts(QUEUE)
        print(f"counts over all partitions: waiting={waiting[JobState.WAITING]}")

        worker = Worker(queues, QUEUE, url=url)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            results = [await h.result(timeout=30) for h in handles]
            await worker.shutdown()
        print(f"{len(results)} jobs completed, first result {results[0]!r}")
        counts = await client.counts(QUEUE)
        print(f"counts over all partitions: completed={counts[JobState.COMPLETED]}")
        tenants = sorted({r.split(":")[0] for r in results})
        print(f"tenants served: {', '.join(tenants)}")
        await client.purge(QUEUE, [JobState.COMPLETED])
    print("done")


if __name__ == "__main__":
    configure_logging(level="warning")
    with url_or_private_server() as url:
        anyio.run(main, url)
