"""RateLimited: the handler reports that an outside service refuses for now.

A CRM answers "429 Too Many Requests, retry after 0.3 s" for one account. The handler raises
RateLimited(retry_after=0.3): the job goes back to waiting without using an attempt, and that
account's key starts no job for 0.3 s (a keyed queue; a global queue pauses as a whole), on
every worker. The other accounts keep running meanwhile.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/handler_rate_limited.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import time

import anyio

from panqueue import Job, QueueClient, RateLimited, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

queues = Registry()
refused_once: set[str] = set()  # the CRM's side: each "busy" account refuses its first call
finished_at: dict[str, float] = {}


@queues.handler("crm-sync", mode="keyed", key_concurrency=1, concurrency=4, attempts=1)
async def sync(job: Job) -> str:
    account = job.data["account"]
    if account == "busy" and account not in refused_once:
        refused_once.add(account)
        raise RateLimited(retry_after=0.3)  # the CRM's Retry-After
    finished_at[job.data["record"]] = time.monotonic()
    return f"{job.data['record']} synced (attempt {job.attempt})"


async def main(url: str) -> None:
    worker = Worker(queues, "crm-sync", url=url)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with QueueClient(url) as client:
            crm = client.queue("crm-sync")
            started = time.monotonic()
            jobs = [await crm.add({"account": account, "record": record}, key=account)
                    for account, record in [("busy", "busy-1"), ("busy", "busy-2"),
                                            ("quiet", "quiet-1")]]
            for job in jobs:
                print(await job.result(timeout=10.0))
            for record in ("quiet-1", "busy-1", "busy-2"):
                waited = finished_at[record] - started >= 0.3
                print(f"{record}: {'after' if waited else 'during'} the busy account's pause")
            info = await jobs[0].info()
            entry = info.history[0]
            print(f"busy-1 history: {entry['type']}, retry after {entry['retry_after_ms']} ms; "
                  f"attempts used: {info.attempts}")
        await worker.shutdown(grace=5.0)


if __name__ == "__main__":
    configure_logging(level="error")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
