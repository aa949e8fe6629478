"""Two queues for one worker process: one handler blocks the event loop, one only awaits."""

from __future__ import annotations

import os
import time

import anyio
import redis

from panqueue import Job, Registry

queues = Registry()
_redis = redis.Redis.from_url(os.environ["PANQUEUE_URL"])


@queues.handler("blocks")
async def blocks(job: Job) -> str:
    _redis.set("started:blocks", 1)
    time.sleep(job.data)  # blocks the loop the other queue's handler shares
    return "blocked"


@queues.handler("awaits")
async def awaits(job: Job) -> str:
    _redis.set("started:awaits", 1)
    await anyio.sleep(job.data)
    return "awaited"
