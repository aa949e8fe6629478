"""Adaptive rate limits: the queue learns how fast an outside API lets each tenant go.

A partner API accepts at most 4 calls per second for each tenant, but nobody wrote that down.
The queue is keyed by tenant with ``RateLimit(max=20, per=1.0, per_key=True, adaptive=True)``:
on the API's 429 the handler raises RateLimited, the job goes back to waiting without using an
attempt, and that tenant's effective limit halves (20 -> 10 -> 5 -> 2); every clean
``recover_every`` (here 0.5 s, 60 s by default) raises it by one again. Every worker of the queue
shares the same limit, kept in Redis.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/adaptive_rate_limit.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import time

import anyio

from panqueue import (
    Job,
    JobState,
    QueueClient,
    RateLimit,
    RateLimited,
    Registry,
    Worker,
    configure_logging,
)
from panqueue.embedded import url_or_private_server

PARTNER_LIMIT = 4  # calls per second per tenant: the API's secret
queues = Registry()
accepted: dict[str, list[float]] = {"acme": [], "globex": []}
refused: dict[str, list[float]] = {"acme": [], "globex": []}
attempts_seen: set[int] = set()


def partner_api(tenant: str) -> float | None:
    """The partner's answer: None (200 OK), or the seconds to wait (429, Retry-After)."""
    now = time.monotonic()
    recent = [t for t in accepted[tenant] if t > now - 1.0]
    if len(recent) < PARTNER_LIMIT:
        accepted[tenant].append(now)
        return None
    refused[tenant].append(now)
    return recent[-PARTNER_LIMIT] + 1.0 - now


@queues.handler("partner-sync", mode="keyed", key_concurrency=4, concurrency=8,
                rate_limit=RateLimit(max=20, per=1.0, per_key=True, adaptive=True,
                                     recover_every=0.5))
async def sync(job: Job) -> None:
    attempts_seen.add(job.attempt)
    retry_after = partner_api(job.data["tenant"])
    if retry_after is not None:
        raise RateLimited(retry_after=retry_after)


async def main(url: str) -> None:
    workers = [Worker(queues, "partner-sync", url=url) for _ in range(2)]
    async with anyio.create_task_group() as tg:
        for worker in workers:
            await tg.start(worker.run)
        async with QueueClient(url) as client:
            queue = client.queue("partner-sync")
            jobs = [await queue.add({"tenant": tenant, "n": n}, key=tenant)
                    for n in range(24) for tenant in ("acme", "globex")]
            print(f"added {len(jobs)} jobs for 2 tenants, 2 workers, limit 20/s per tenant")
            for job in jobs:
                await job.result(timeout=30.0)
            counts = await client.counts("partner-sync")
        for worker in workers:
            await worker.shutdown(grace=5.0)
    completed = sum(len(times) for times in accepted.values())
    print(f"completed {completed} of {len(jobs)} jobs, each once "
          f"(queue counts: completed={counts[JobState.COMPLETED]})")
    print(f"attempt numbers seen by the handler: {sorted(attempts_seen)} (429s use no attempt)")
    for tenant, times in refused.items():
        first = min(accepted[tenant])
        early = sum(1 for t in times if t < first + 1.0)
        print(f"{tenant}: {early} refusals in the first second (the limit coming down from 20), "
              f"{len(times) - early} after it, while the limit climbed back")

if __name__ == "__main__":
    configure_logging(level="error")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
