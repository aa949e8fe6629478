"""Lock tokens: what a claim locks its jobs with, and what names the run a cancel request is
for. The one place their form is written and read in Python (``lib/finish.lua``'s
``worker_of`` reads the worker name the same way, for the history stream).

A token is ``"<worker name>:<process>:<n>"``: the worker's name (which may itself hold a
colon), a random id of the worker process (unique per process whatever name the worker was
given) and the number of the claim-bearing call, so that each call's token is fresh.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LockToken", "lock_token", "parse_lock_token"]


@dataclass(frozen=True, slots=True)
class LockToken:
    """A lock token's parts."""

    worker: str
    process: str
    n: int


def lock_token(worker: str, process: str, n: int) -> str:
    """The token of call ``n`` of the worker process ``process`` (which has no colon)."""
    return f"{worker}:{process}:{n}"


def parse_lock_token(token: str) -> LockToken | None:
    """``token``'s parts; None for a string that is not a lock token."""
    parts = token.rsplit(":", 2)
    if len(parts) != 3:
        return None
    worker, process, n = parts
    if not process or not n.isascii() or not n.isdigit():
        return None
    return LockToken(worker, process, int(n))
