"""Handlers for the job-capability tests (snooze, expiry, rate limited by the handler), one
per executor where the executor matters. Module-level, so a subprocess child imports them."""

from __future__ import annotations

from typing import Any

import redis

from panqueue import Job, RateLimited, Registry, Retry, Snooze

queues = Registry()


def _poll(job: Job) -> dict[str, Any]:
    """Snooze for ``step`` seconds the first ``snoozes`` times the job runs (the runs are
    counted in Redis at ``url``: the outside state); ``bad``: snooze with that value instead."""
    if "bad" in job.data:
        raise Snooze(job.data["bad"])
    runs = redis.Redis.from_url(job.data["url"]).incr(f"runs:{job.id}")
    if runs <= job.data["snoozes"]:
        raise Snooze(job.data["step"])
    return {"attempt": job.attempt, "runs": runs}


@queues.handler("cap-snooze-inline")
async def poll_inline(job: Job) -> dict[str, Any]:
    return _poll(job)


@queues.handler("cap-snooze-thread", executor="thread")
def poll_thread(job: Job) -> dict[str, Any]:
    return _poll(job)


@queues.handler("cap-snooze-subprocess", executor="subprocess")
def poll_subprocess(job: Job) -> dict[str, Any]:
    return _poll(job)


@queues.handler("cap-snooze-capped", max_snoozes=2, attempts=3)
async def always_snooze(job: Job) -> None:
    raise Snooze(0.01)


RAN: list[str] = []  # the ids of the jobs "cap-expiry" ran (in-process workers only)


@queues.handler("cap-expiry", attempts=3)
async def expiring(job: Job) -> str:
    RAN.append(job.id)
    if "retry_in" in job.data:
        raise Retry(delay=job.data["retry_in"])
    return "ran"


def _throttle(job: Job) -> dict[str, Any]:
    """Refused (RateLimited) the first ``limited`` times the job runs (counted in Redis at
    ``url``); ``bad``: RateLimited with that value instead."""
    if "bad" in job.data:  # "nan": a NaN (job data cannot hold one)
        raise RateLimited(float("nan") if job.data["bad"] == "nan" else job.data["bad"])
    runs = redis.Redis.from_url(job.data["url"]).incr(f"runs:{job.id}")
    if runs <= job.data.get("limited", 0):
        raise RateLimited(job.data["retry_after"])
    return {"attempt": job.attempt, "runs": runs}


@queues.handler("cap-throttle-inline")
async def throttle_inline(job: Job) -> dict[str, Any]:
    return _throttle(job)


@queues.handler("cap-throttle-thread", executor="thread")
def throttle_thread(job: Job) -> dict[str, Any]:
    return _throttle(job)


@queues.handler("cap-throttle-subprocess", executor="subprocess")
def throttle_subprocess(job: Job) -> dict[str, Any]:
    return _throttle(job)


@queues.handler("cap-throttle-keyed", mode="keyed", key_concurrency=1, concurrency=4)
async def throttle_keyed(job: Job) -> dict[str, Any]:
    return _throttle(job)
