"""Handlers for the batch tests: work that completes, fails, retries or takes its time, a
callback that counts its runs in Redis, and a job that opens a child batch from its handler.
``panqueue worker batch_app:queues`` serves them in the multi-process tests."""

from __future__ import annotations

import time
from typing import Any

import anyio
import redis

from panqueue import Fail, Job, QueueClient, Registry, Retention

queues = Registry()


@queues.handler("batch-work", attempts=3, concurrency=8, lock_ttl=2.0)
async def work(job: Job) -> dict[str, Any]:
    """``fail``: fail for good; ``fail_first``: fail attempts before that one (then complete);
    ``sleep``: take that long."""
    if job.data.get("sleep"):
        await anyio.sleep(job.data["sleep"])
    if job.data.get("fail"):
        raise Fail("asked to fail")
    if job.attempt < job.data.get("fail_first", 0):
        raise RuntimeError(f"attempt {job.attempt} fails on purpose")
    return {"n": job.data.get("n"), "attempt": job.attempt}


@queues.handler("batch-done", concurrency=4)
async def callback(job: Job) -> None:
    """A batch's callback: counts its runs (per job id) and keeps its data, in Redis."""
    _count_run(job)


@queues.handler("batch-done-unkept", retention=Retention(completed=0))
async def unkept_callback(job: Job) -> None:
    """A callback whose queue keeps no completed job: it is deleted as soon as it ran, as
    retention does to any callback in time."""
    _count_run(job)


def _count_run(job: Job) -> None:
    client = redis.Redis.from_url(job.data["url"])
    client.incr(f"runs:{job.id}")
    client.rpush("callbacks", f"{job.id} {time.time()}")
    client.set(f"data:{job.id}", repr(job.data))
    client.close()


@queues.handler("batch-spread", partitions=4, concurrency=8)
async def spread(job: Job) -> None:
    """Work of a queue of four partitions: ``fail`` fails for good."""
    if job.data.get("fail"):
        raise Fail("asked to fail")


@queues.handler("batch-parent", lock_ttl=5.0)
async def open_child(job: Job) -> str:
    """A job of a batch that opens a child batch of ``children`` jobs whose callback is a job
    of the parent batch."""
    async with QueueClient(job.data["url"]) as client:
        child = await client.batch(on_complete=("batch-done", {"url": job.data["url"],
                                                               "child": True}),
                                   parent=job.data["batch"])
        await child.add_bulk("batch-work", [{"n": i, "sleep": 0.05}
                                            for i in range(job.data["children"])])
        await child.close()
        return child.id
