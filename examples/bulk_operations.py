"""Operating at scale: tag jobs, find them by tag or error type, act on all of them at once,
and steer a running worker from the outside.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/bulk_operations.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import anyio

from panqueue import Job, JobState, QueueClient, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

queues = Registry()
upstream_up = False  # the import source is down at first: some imports time out


@queues.handler("imports", attempts=1, concurrency=2)
async def import_row(job: Job) -> str:
    row = job.data["row"]
    if row % 3 == 0 and not upstream_up:
        raise TimeoutError(f"the upstream did not answer for row {row}")
    if row == 4:
        raise ValueError("row 4 is malformed")
    return f"imported row {row}"


async def wait_for(client: QueueClient, queue: str, **wanted: int) -> dict[JobState, int]:
    """Until ``queue``'s counts are as ``wanted`` (state=count), then the counts."""
    while True:
        counts = await client.counts(queue)
        if all(counts[JobState(state)] == n for state, n in wanted.items()):
            return counts
        await anyio.sleep(0.05)


async def main(url: str) -> None:
    global upstream_up
    async with QueueClient(url) as client:
        imports = client.queue("imports")
        # Two tenants' imports: each job carries its tenant's tag and the import's.
        for row in range(8):
            await imports.add({"row": row}, tags=["tenant:42", "import:nov"])
        tenant_7 = client.queue("imports", tags=["tenant:7"])  # a default tag for add_bulk
        await tenant_7.add_bulk([{"row": 100 + n} for n in range(4)])
        await imports.add({"row": 1000}, delay=3600, tags=["tenant:7"])
        found = await client.list_jobs("imports", "waiting", tag="tenant:7")
        print(f"tenant:7 has {len(found)} waiting jobs, tags {found[0].tags}")

        # Tenant 7 cancelled its contract: cancel every job of it, waiting or delayed.
        print(f"cancelled for tenant:7: {await client.cancel_jobs('imports', tag='tenant:7')}")
        print(f"running it again cancels {await client.cancel_jobs('imports', tag='tenant:7')}")

        async with anyio.create_task_group() as tg:
            worker = Worker(queues, "imports", url=url, name="importer-1",
                            heartbeat_interval=0.2)
            await tg.start(worker.run)
            await wait_for(client, "imports", waiting=0, active=0)
            timeouts = await client.list_jobs("imports", "failed", error_type="TimeoutError")
            print(f"failed with TimeoutError: rows {sorted(j.data['row'] for j in timeouts)}")

            # The upstream is back: retry only the timeouts, not the malformed row.
            upstream_up = True
            moved = await client.retry_failed("imports", error_type="TimeoutError")
            print(f"retried {moved} timed-out jobs")
            counts = await wait_for(client, "imports", waiting=0, active=0, failed=1)
            print(f"now completed={counts[JobState.COMPLETED]}, failed={counts[JobState.FAILED]}")

            # Remote control: the worker applies each command at its next heartbeat.
            await client.control("importer-1", concurrency=4)
            while [w.concurrency for w in await client.workers("imports")] != [4]:
                await anyio.sleep(0.05)
            print("importer-1 now runs up to 4 jobs at once")
            await client.control("importer-1", "stop")
        print("importer-1 stopped on request")

        removed = await client.remove_jobs("imports", tag="tenant:7", state="cancelled")
        print(f"removed tenant:7's cancelled jobs: {removed}")


if __name__ == "__main__":
    configure_logging(level="critical")  # the failures below are the point: not logged
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
