"""What a finishing script (complete, fail, snooze, rate_limited) did to each job: one named
code per outcome.

The Lua scripts return these numbers; ``lua/lib/status.lua`` names the same values, and a test
holds the two together.
"""

from __future__ import annotations

import enum

__all__ = ["Status"]


class Status(enum.IntEnum):
    LOCK_LOST = -1  # the token no longer matched: the job was left unchanged
    RETRY_NOW = 1  # failed attempt; back to waiting
    RETRY_DELAYED = 2  # failed attempt; delayed by the backoff
    FAILED = 3  # failed for good (the dead-letter set)
    CANCELLED = 4  # its cancellation was requested: ended cancelled
    COMPLETED = 5  # completed
    SNOOZED = 6  # the handler snoozed it: delayed (or waiting), no attempt used
    RATE_LIMITED = 7  # the handler raised RateLimited: waiting, key or queue paused
    SUSPENDED = 8  # a durable sleep or wait for a signal: delayed, no attempt used

    @property
    def retried(self) -> bool:
        return self in (Status.RETRY_NOW, Status.RETRY_DELAYED)
