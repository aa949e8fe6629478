"""Handlers for the prefix tests: ``panqueue worker prefix_app:queues --prefix app`` serves a
plain queue, a partitioned one, a batch's callback queue and a scheduled one, all under the
prefix (run as a Redis ACL user limited to it)."""

from __future__ import annotations

from typing import Any

from panqueue import Job, Registry

queues = Registry()


@queues.handler("acl-plain", concurrency=4)
async def plain(job: Job) -> Any:
    return job.data


@queues.handler("acl-parts", partitions=4, concurrency=4)
async def parts(job: Job) -> Any:
    return job.data


@queues.handler("acl-done")
async def batch_done(job: Job) -> Any:
    return job.data


@queues.handler("acl-sched")
async def ticked(job: Job) -> None:
    return None


queues.schedule("acl-tick", "acl-sched", every=0.5, data={"tick": True})
