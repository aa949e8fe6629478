"""Handlers for the multi-process tests (imported by worker child processes)."""

from __future__ import annotations

import os
import random

import anyio
import redis

from panqueue import Job, Registry

queues = Registry()
_redis = redis.Redis.from_url(os.environ["PANQUEUE_URL"])


@queues.handler("crashy", lock_ttl=1.0)
async def crashy(job: Job) -> dict[str, int]:
    """The first run of each job hangs (the test kills that worker); later runs finish."""
    _redis.rpush(f"started:{job.id}", os.getpid())
    if _redis.set(f"ran:{job.id}", 1, nx=True):
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
