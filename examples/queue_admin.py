"""Priorities and queue administration: pause, resume, counts, cancel, remove.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/queue_admin.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import anyio

from panqueue import (
    Job,
    JobFailed,
    JobNotFound,
    JobState,
    QueueClient,
    Registry,
    Worker,
    configure_logging,
)
from panqueue.embedded import url_or_private_server

queues = Registry()
order: list[str] = []  # the order in which the worker ran the "reports" jobs


@queues.handler("reports", concurrency=1)  # one at a time, so the order is visible
async def build_report(job: Job) -> str:
    order.append(job.data["name"])
    if job.data.get("slow"):
        await anyio.sleep(30)  # cancelled long before this ends
    return f"report {job.data['name']}"


def show(counts: dict[JobState, int]) -> str:
    return ", ".join(f"{state.value}={n}" for state, n in counts.items() if n)


async def main(url: str) -> None:
    worker = Worker(queues, "reports", url=url)
    async with anyio.create_task_group() as tg, QueueClient(url) as client:
        await tg.start(worker.run)
        reports = client.queue("reports")

        # While a queue is paused, jobs are added but not claimed.
        await client.pause("reports")
        print("paused 'reports'")
        added = [
            await reports.add({"name": "weekly"}),                  # priority 0 (the default)
            await reports.add({"name": "urgent-1"}, priority=10),   # higher runs first
            await reports.add({"name": "low"}, priority=-5),
            await reports.add({"name": "urgent-2"}, priority=10),   # FIFO within a priority
            await reports.add({"name": "monthly"}),
        ]
        dropped = await reports.add({"name": "obsolete"})
        print(f"while paused: {show(await client.counts('reports'))}")

        # Cancelling a waiting job takes effect at once.
        state = await client.cancel("reports", dropped.id)
        print(f"cancelled job {dropped.id} (it was {state.value})")

        await client.resume("reports")
        print("resumed 'reports'")
        for handle in added:
            await handle.result(timeout=10.0)
        print(f"run order: {' > '.join(order)}")

        # Cancelling a running job: its worker is told and stops the handler.
        slow = await reports.add({"name": "slow", "slow": True})
        while (await slow.info()).state is not JobState.ACTIVE:
            await anyio.sleep(0.02)
        state = await client.cancel("reports", slow.id)
        try:
            await slow.result(timeout=10.0)
        except JobFailed as exc:
            print(f"cancelled job {slow.id} while it was {state.value}: it ended {exc.state}")
        print(f"counts: {show(await client.counts('reports'))}")

        # remove() deletes a job that is not running.
        removed = await client.remove("reports", added[0].id)
        try:
            await added[0].info()
        except JobNotFound:
            print(f"removed job {added[0].id}: {removed}; reading it now raises JobNotFound")

        await worker.shutdown(grace=5.0)


if __name__ == "__main__":
    configure_logging(level="warning")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
