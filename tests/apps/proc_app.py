"""Handlers for the multi-process tests (imported by worker child processes)."""

from __future__ import annotations

import os
import random

import anyio
import redis

from panqueue import Job, RateLimit, Registry

queues = Registry()
_redis = redis.Redis.from_url(os.environ["PANQUEUE_URL"])


@queues.handler("crashy", lock_ttl=1.0)
async def crashy(job: Job) -> dict[str, int]:
    """The first run of each job hangs (the test kills that worker); later runs finish.
    Which run is the first is settled before the start is recorded, which the test waits for
    (a kill between the two would leave the next run to hang)."""
    first = _redis.set(f"ran:{job.id}", 1, nx=True)
    _redis.rpush(f"started:{job.id}", os.getpid())
    if first:
        await anyio.sleep(60)
    return {"pid": os.getpid()}


@queues.handler("shared", concurrency=10)
async def shared(job: Job) -> int:
    _redis.hincrby("executions", job.id, 1)
    await anyio.sleep(random.uniform(0, 0.005))
    return os.getpid()


@queues.handler("graceful")
async def graceful(job: Job) -> str:
    _redis.rpush(f"started:{job.id}", os.getpid())
    await anyio.sleep(job.data["seconds"])
    return "finished"


queues.schedule("every-second", "ticks", every=1.0, data={"kind": "tick"})


@queues.handler("ticks", concurrency=5)
async def tick(job: Job) -> str:
    _redis.hincrby("tick-runs", job.id, 1)
    return job.id


@queues.handler("limited", concurrency=10, rate_limit=RateLimit(max=5, per=1.0))
async def limited(job: Job) -> int:
    return os.getpid()


@queues.handler("tenants", concurrency=8, mode="keyed", key_concurrency=2)
async def tenant_job(job: Job) -> None:
    key = job.data["tenant"]
    n = _redis.hincrby("tenant-running", key, 1)
    _redis.eval("if tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') < tonumber(ARGV[2]) "
                "then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end", 1, "tenant-peak",
                key, n)
    _redis.rpush("tenant-order", key)
    await anyio.sleep(0.01)
    _redis.hincrby("tenant-running", key, -1)


@queues.handler("stuck-thread", executor="thread", lock_ttl=60)
def stuck_thread(job: Job) -> None:
    import time

    _redis.rpush(f"started:{job.id}", os.getpid())
    time.sleep(120)  # never checks should_stop(): only the forced phase ends this attempt


@queues.handler("chained", concurrency=4)
async def chained(job: Job) -> int:
    _redis.rpush("chain-order", job.data)
    await anyio.sleep(random.uniform(0, 0.01))
    return int(job.data)


@queues.handler("cancellable")
async def cancellable(job: Job) -> int:
    """Records each run; a job whose data says ``hold`` runs until it is cancelled."""
    _redis.rpush(f"started:{job.id}", os.getpid())
    if job.data.get("hold"):
        await anyio.sleep(60)
    return os.getpid()
