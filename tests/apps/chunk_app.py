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
    """The first chunk hangs (the test kills its worker); later ones count each job's run."""
    ids = [job.id for job in jobs]
    _redis.rpush("chunk-started", f"{os.getpid()}:{','.join(ids)}")
    if _redis.set("chunk-ran", 1, nx=True):
        await anyio.sleep(60)
    for job_id in ids:
        _redis.hincrby("chunk-completions", job_id, 1)
    return [os.getpid()] * len(jobs)
