"""The claim part of a claim / complete / fail reply, parsed, for the script tests that call
the scripts directly. The worker uses :mod:`panqueue._store.transitions`, which reads the same
reply into its typed results; once those tests do too, this module goes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ClaimedJob", "parse_claim"]


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    id: str
    data: bytes
    attempt: int
    enqueued_at_ms: int
    options: bytes


def parse_claim(reply: list[Any], offset: int = 0) -> tuple[list[ClaimedJob], int]:
    """Parse the claim part of a claim/complete/fail reply: (jobs, wake_in ms or -1)."""
    count = int(reply[offset])
    wake_in = int(reply[offset + 1])
    jobs = []
    i = offset + 2
    for _ in range(count):
        jobs.append(ClaimedJob(reply[i].decode(), reply[i + 1], int(reply[i + 2]),
                               int(reply[i + 3] or 0), reply[i + 4]))
        i += 5
    return jobs, wake_in
