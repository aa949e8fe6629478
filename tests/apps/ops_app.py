"""An app for the operator views' tests (tests/test_operator_views.py):
``panqueue worker ops_app:queues``."""

from __future__ import annotations

import anyio

from panqueue import Backoff, Job, Registry

queues = Registry()

# Each job runs until its worker stops (or is killed): it holds its slot meanwhile.
HOLD_SLOTS = 3


@queues.handler("ops-hold", concurrency=HOLD_SLOTS)
async def hold(job: Job) -> None:
    await anyio.sleep(3600)


@queues.handler("ops-one", concurrency=1)
async def hold_one(job: Job) -> None:
    await anyio.sleep(3600)


@queues.handler("ops-keyed", concurrency=4, mode="keyed", key_concurrency=1)
async def hold_keyed(job: Job) -> None:
    await anyio.sleep(3600)


@queues.handler("ops-flaky", attempts=3, backoff=Backoff.fixed(3600))
async def flaky(job: Job) -> None:
    raise ConnectionError(f"db at 127.0.0.1:5432 refused {job.data!r}")


# Queues for a process that serves many.
for index in range(4):
    @queues.handler(f"ops-many-{index}", concurrency=2)
    async def served(job: Job) -> None:
        return None


@queues.handler("ops-fail", attempts=1)
async def fails(job: Job) -> None:
    raise ValueError(f"cannot parse {job.data!r}")
