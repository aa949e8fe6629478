"""Keyed concurrency and a rate limit: a fair queue shared by tenants.

The queue runs in keyed mode: every job carries a concurrency ``key`` (here the tenant), at most
``key_concurrency`` jobs of one key run at once, and keys with waiting work are served round
robin. A ``RateLimit`` caps how many jobs start in any window of ``per`` seconds, across every
worker of the queue (a sliding window on the Redis server's clock).

Tenant "acme" adds six jobs before tenant "globex" adds three. In a plain FIFO queue acme's
backlog would run first; here the tenants take turns, no tenant has more than one job running,
and no more than four jobs start in any second.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/keyed_rate_limit.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import uuid

import anyio

from panqueue import Job, QueueClient, RateLimit, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

# A fresh queue name per run, so that re-running against the same server starts clean.
QUEUE = f"tenant-exports-{uuid.uuid4().hex[:6]}"
RATE = RateLimit(max=4, per=1.0)

queues = Registry()
started: list[tuple[str, str]] = []  # (tenant, job name) in the order the jobs started
running: dict[str, int] = {}
max_running: dict[str, int] = {}


@queues.handler(QUEUE, concurrency=2, mode="keyed", key_concurrency=1, rate_limit=RATE)
async def export(job: Job) -> str:
    tenant = job.data["tenant"]
    started.append((tenant, job.data["name"]))
    running[tenant] = running.get(tenant, 0) + 1
    max_running[tenant] = max(max_running.get(tenant, 0), running[tenant])
    try:
        await anyio.sleep(0.05)  # pretend to export something
    finally:
        running[tenant] -= 1
    return f"exported {job.data['name']}"


def max_starts_in_window(times_ms: list[int], window_ms: int) -> int:
    """The most starts that fell into any window of `window_ms` milliseconds."""
    return max(sum(1 for t in times_ms if start <= t < start + window_ms) for start in times_ms)


async def main(url: str) -> None:
    worker = Worker(queues, QUEUE, url=url)
    async with QueueClient(url) as client:
        # The handle declares the mode: adding with key= to a queue no worker has set up yet
        # would otherwise make it a global queue (and be refused).
        queue = client.queue(QUEUE, mode="keyed")
        handles = [await queue.add({"tenant": "acme", "name": f"acme-{i}"}, key="acme")
                   for i in range(1, 7)]
        handles += [await queue.add({"tenant": "globex", "name": f"globex-{i}"}, key="globex")
                    for i in range(1, 4)]
        print(f"added {len(handles)} jobs: 6 for acme first, then 3 for globex")

        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            print(f"worker started (concurrency {worker.concurrency}, key_concurrency 1, "
                  f"rate limit {RATE.max} per {RATE.per} s)")
            for handle in handles:
                await handle.result(timeout=20.0)
            await worker.shutdown(grace=5.0)
        # started_at comes from the Redis server's clock: the time of the claim.
        infos = {info.data["name"]: info for info in [await h.info() for h in handles]}

    start_ms = {}
    for name, info in infos.items():
        assert info.started_at is not None
        start_ms[name] = int(info.started_at.timestamp() * 1000)
    first = min(start_ms.values())
    print("start order (seconds after the first start, server clock):")
    for tenant, name in started:
        print(f"  {(start_ms[name] - first) / 1000:5.2f}s  {tenant:<7} {name}")
    order = [tenant for tenant, _ in started]
    print(f"first six starts: {order[:6].count('acme')} acme, {order[:6].count('globex')} globex "
          "(round robin between the tenants)")
    print(f"most jobs running at once per tenant: acme {max_running['acme']}, "
          f"globex {max_running['globex']}")
    times = sorted(start_ms.values())
    most = max_starts_in_window(times, int(RATE.per * 1000))
    print(f"most starts in any {RATE.per} s window: {most} (limit {RATE.max})")
    print(f"all {len(started)} jobs started within {(times[-1] - first) / 1000:.1f} s: "
          "the limited worker slept until the window let the next job start")


if __name__ == "__main__":
    configure_logging(level="warning")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
