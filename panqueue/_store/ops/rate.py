"""A queue's rate limit as it stands now: the configured maximum, or less while an adaptive
limit (``RateLimit(adaptive=True)``) recovers from a handler's ``RateLimited``.

The claim computes the same figure inside its script (``lua/lib/rate.lua``); this is the read
side, for ``explain`` and tools that chart it.
"""

from __future__ import annotations

from panqueue._keys import QueueKeys
from panqueue._store.transport import Batch, Command, Op

__all__ = ["current_limit", "effective_rate_limit"]


def current_limit(maximum: int, step_ms: int, saved: bytes | None, now_ms: int) -> int:
    """The effective limit at ``now_ms`` from its stored form ``b"<limit>:<ms of the cut>"``:
    one more per whole recovery step since the cut, at most ``maximum``."""
    if step_ms <= 0 or saved is None:
        return maximum
    limit, cut = (int(part) for part in saved.split(b":", 1))
    return min(maximum, limit + (now_ms - cut) // step_ms)


def effective_rate_limit(keys: QueueKeys, key: str | None = None) -> Op[int | None]:
    """The number of starts per window the rate limit allows now: the queue's limit, or with
    ``key`` that key's (a per-key limit). ``None`` when the queue has no such limit."""
    commands = [Command(("HMGET", keys.meta, "rlm", "rlk", "rla", "rle")), Command(("TIME",))]
    if key is not None:
        commands.append(Command(("GET", keys.prefix + "rle:" + key)))
    meta, (seconds, micros), *own = yield Batch(tuple(commands))
    maximum, per_key, step, queue_cut = meta
    if maximum is None or (per_key == b"1") != (key is not None):
        return None
    now = int(seconds) * 1000 + int(micros) // 1000
    return current_limit(int(maximum), int(step or 0), own[0] if own else queue_cut, now)
