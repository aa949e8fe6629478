"""The messages of a queue's notify channel, read: the one place in Python that knows their
form. The scripts publish them (SPUBLISH on ``QueueKeys.notify``):

- ``"w"``: work may be claimable (``wake_if_work_appeared``, lua/lib/waiting.lua); a subscriber
  reports one of its own after a reconnect (``transport.base.WAKE``), since anything published
  meanwhile was lost;
- ``"h" .. msgpack {token, claim reply}``: a job handed to an idle worker (lua/lib/handoff.lua);
- ``"c" .. msgpack {job id, lock token}``: ``cancel(queue, id)`` was called for an active job
  (lua/lib/cancel_request.lua); ``"c:" .. job id`` from a script of an earlier version.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from panqueue._store.transitions import ClaimedJob, parse_claim

__all__ = ["CancelRequest", "Handoff", "Message", "WakeUp", "parse_message"]


@dataclass(frozen=True, slots=True)
class WakeUp:
    """Work may be claimable: claim now."""


@dataclass(frozen=True, slots=True)
class Handoff:
    """Jobs an add claimed for the idle registration ``token`` (a claim of the worker's that
    found nothing), locked with that token."""

    token: str
    jobs: list[ClaimedJob]


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """``cancel(queue, id)`` was called for an active job: the request as its worker hears it.
    ``token`` is the lock token of the run it is for; empty when the message did not say (a
    script of an earlier version published it)."""

    job_id: str
    token: str


Message = WakeUp | Handoff | CancelRequest

_WAKE_UP = WakeUp()


def parse_message(message: bytes) -> Message | None:
    """A message of the notify channel; None for one that is none of these (unknown, or cut
    short), which a worker ignores."""
    if message == b"w":
        return _WAKE_UP
    kind, payload = message[:1], message[1:]
    if kind == b"c" and payload.startswith(b":"):  # an earlier version's: the job id alone
        return CancelRequest(payload[1:].decode(errors="replace"), "")
    if kind not in (b"h", b"c"):
        return None
    try:
        first, second = msgpack.unpackb(payload, raw=True)
        if kind == b"c":
            return CancelRequest(first.decode(), second.decode())
        # Only a queue of one partition registers idle workers: its jobs are in partition 0.
        jobs, _ = parse_claim(second, 0, first.decode())
        return Handoff(first.decode(), jobs)
    except (ValueError, TypeError, AttributeError, IndexError, msgpack.UnpackException):
        return None
