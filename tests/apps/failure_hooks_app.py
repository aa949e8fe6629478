"""Failure callbacks (``Registry.on_failure``) for the worker process tests: each records its
calls in a Redis list, one callback raises (logged, not fatal)."""

from __future__ import annotations

import json
import os

import anyio
import redis

from panqueue import Backoff, Chunk, ChunkFailure, Job, Registry

queues = Registry()
_redis = redis.Redis.from_url(os.environ["PANQUEUE_URL"])


@queues.handler("hooks-flaky", attempts=2, backoff=Backoff.fixed(0.05))
async def flaky(job: Job) -> None:
    raise ConnectionError(f"upstream refused {job.data}")


@queues.handler("hooks-thread", executor="thread", attempts=1)
def in_thread(job: Job) -> None:
    raise KeyError(job.data)


@queues.handler("hooks-chunk", chunk=Chunk(size=10, wait=0.2), attempts=1)
async def rows(jobs: list[Job]) -> list[object]:
    """Fails the jobs whose data is negative, each alone (a ChunkFailure in its slot)."""
    return [ChunkFailure(i, ValueError(f"negative: {job.data}")) if job.data < 0 else job.data
            for i, job in enumerate(jobs)]


@queues.handler("hooks-durable", attempts=1)
async def durable(job: Job) -> object:
    """Sleeps, then waits for a signal: two suspensions, neither of them a failure."""
    first = await job.step("first", lambda: 1)
    await job.sleep(0.1)
    return {"first": first, "go": await job.wait_for("go")}


@queues.on_failure
def record(job: Job, exc: BaseException, final: bool) -> None:
    _redis.rpush("hooks:sync", json.dumps([job.queue, job.id, job.attempt,
                                            type(exc).__name__, str(exc), final]))


async def record_async(job: Job, exc: BaseException, final: bool) -> None:
    await anyio.sleep(0)
    _redis.rpush("hooks:async", json.dumps([job.id, job.attempt, final]))


queues.on_failure(record_async)


@queues.on_failure
def broken(job: Job, exc: BaseException, final: bool) -> None:
    raise ValueError("the error tracker is down")
