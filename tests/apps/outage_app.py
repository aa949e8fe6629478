"""Handlers for tests/test_long_outages.py: one echo queue per worker process (so each worker's
claims are seen apart), with a lock TTL shorter than the outages the tests make; a
partitioned echo queue for tests/test_cluster_master_down.py; and a queue whose jobs sleep."""

from __future__ import annotations

from typing import Any

import anyio

from panqueue import Job, Registry

queues = Registry()
QUEUES = ("outage-asyncio", "outage-trio")


async def _echo(job: Job) -> Any:
    return job.data


for _name in QUEUES:
    queues.handler(_name, lock_ttl=5.0)(_echo)
# On a cluster, its partitions spread over the masters (tests/test_cluster_master_down.py).
PARTITIONED = "outage-partitioned"
queues.handler(PARTITIONED, partitions=3, concurrency=4)(_echo)


@queues.handler("outage-slow")
async def _slow(job: Job) -> Any:
    """Runs ``job.data`` seconds: a job running through an outage."""
    await anyio.sleep(job.data)
    return "done"
