"""The worker's summary line: what it did since the last one, logged at a fixed interval."""

from __future__ import annotations

import time
from typing import Any, Protocol

import anyio

__all__ = ["log_summary"]


class Counted(Protocol):
    processed: int  # jobs completed
    failed: int  # jobs that ended FAILED


async def log_summary(counts: Counted, interval: float, log: Any) -> None:
    """Every ``interval`` seconds, log the jobs completed and failed since the previous line and
    the rate (jobs finished per second over that time); nothing while no job finished, so that
    a worker serving idle queues writes no lines. Runs until cancelled."""
    processed, failed, since = counts.processed, counts.failed, time.monotonic()
    while True:
        await anyio.sleep(interval)
        now = time.monotonic()
        done, lost = counts.processed - processed, counts.failed - failed
        if not done and not lost:
            since = now  # idle: nothing to say; the next line's rate is over its interval
            continue
        log.info("worker summary", processed=done, failed=lost,
                 rate=round((done + lost) / max(now - since, 1e-9), 1),
                 total_processed=counts.processed, total_failed=counts.failed)
        processed, failed, since = counts.processed, counts.failed, now
