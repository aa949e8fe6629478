"""A chunk handler for the crash test of tests/test_chunks.py (imported by worker processes)."""

from __future__ import annotations

import os

import anyio
import redis

from panqueue import Chunk, Job, Registry

queues = Registry()
_redis = redis.Redis.from_url(os.environ["PANQUEUE_URL"])


@queues.handler("chunk-crashy", chunk=Chunk(size=3, wait=5.0), lock_ttl=1.0)
async def crashy_chunk(jobs: list[Job]) -> list[int]:
    """The first chunk hangs (the test kills its worker); later ones count each job's run.

    Which run is the first is settled before the start is recorded: the test kills the worker
    once it sees the start, and a kill between the two would leave the next run to hang."""
    ids = [job.id for job in jobs]
    first = _redis.set("chunk-ran", 1, nx=True)
    _redis.rpush("chunk-started", f"{os.getpid()}:{','.join(ids)}")
    if first:
        await anyio.sleep(60)
    for job_id in ids:
        _redis.hincrby("chunk-completions", job_id, 1)
    return [os.getpid()] * len(jobs)
