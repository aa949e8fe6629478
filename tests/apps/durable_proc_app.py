"""The handler of the durable crash tests (tests/test_durable_processes.py), served by real
worker processes: the worker is killed (SIGKILL) while it waits inside a step, or after a step,
the first time the job gets there; side effects are counted in Redis."""

from __future__ import annotations

import os

import anyio
import redis

from panqueue import Job, Registry

queues = Registry()
_redis = redis.Redis.from_url(os.environ["PANQUEUE_URL"])


async def _hang_once(job: Job, where: str) -> None:
    """The first time the job gets to ``where``, say so and hang there (the test kills the
    worker)."""
    if job.data["kill"] == where and _redis.set(f"hung:{job.id}", 1, nx=True):
        _redis.rpush(f"there:{job.id}", os.getpid())
        await anyio.sleep(60)


async def charge(job: Job) -> int:
    n = int(_redis.incr(f"runs:{job.id}:charge"))
    await _hang_once(job, "inside")
    return n


def ship(job: Job) -> int:
    return int(_redis.incr(f"runs:{job.id}:ship"))


@queues.handler("dur-crash", lock_ttl=1.0)
async def crash(job: Job) -> dict[str, int]:
    charged = await job.step("charge", charge, job)
    await _hang_once(job, "after")
    shipped = await job.step("ship", ship, job)
    return {"charged": charged, "shipped": shipped, "pid": os.getpid()}
