"""A queue's event stream: the lifecycle events the scripts append, read as :class:`Event`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from panqueue._codec import decode
from panqueue._job import ErrorInfo
from panqueue._keys import QueueKeys
from panqueue._store.transport import Batch, Command, Op
from panqueue.errors import PanqueueError

__all__ = ["WATCH_MS", "Event", "ask", "last_event_id", "read_events", "stream_entries",
           "watch"]

# How long one read asks a queue to write its events (lua/lib/settings.lua watched,
# ends_watched). Until then, and always with Retention(events_always=True), every event is
# written; a read that only counts ends of jobs, and a wait for a result, ask for those alone.
# A queue nobody has asked writes no event but the end of a job that its finished set keeps
# none of.
WATCH_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Event:
    """One lifecycle event from a queue's event stream.

    ``type``: added, active, progress, completed, failed, retried, snoozed, suspended,
    rate_limited, stalled, cancelled, waiting, blocked, removed, paused, resumed. ``id`` is the
    stream id: pass it as ``after=`` to resume.
    ``fields`` holds the rest (``result``, ``error``, ``progress``, ``attempt``, ``state``,
    ``reason``), decoded.
    """

    id: str
    type: str
    queue: str
    job_id: str
    fields: dict[str, Any]


_EVENT_FIELDS = {b"r": "result", b"e": "error", b"pg": "progress", b"a": "attempt",
                 b"s": "state", b"fr": "reason", b"why": "why"}
_ENCODED_FIELDS = frozenset({b"r", b"e", b"pg"})


def _event(queue: str, entry_id: bytes, entry: dict[bytes, bytes]) -> Event:
    fields: dict[str, Any] = {}
    for raw_key, raw_value in entry.items():
        if raw_key in (b"ev", b"id"):
            continue
        key = _EVENT_FIELDS.get(raw_key, raw_key.decode())
        if raw_key in _ENCODED_FIELDS:
            value: Any = decode(raw_value)
            if raw_key == b"e":
                value = ErrorInfo.from_wire(value)
        elif raw_key == b"a":
            value = int(raw_value)
        else:
            value = raw_value.decode()
        fields[key] = value
    return Event(entry_id.decode(), entry[b"ev"].decode(), queue,
                 entry.get(b"id", b"").decode(), fields)


def stream_entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes] | None]]:
    """The ``(entry id, fields)`` of an XREAD or XREADGROUP reply on one stream, in the shape
    redis-py gives on either protocol: RESP2's list of ``[stream, entries]`` pairs, RESP3's
    map of stream to ``[entries]``. Nothing read: ``[]``, ``{}`` or ``None``. (Fields are
    ``None`` for an entry trimmed after XREADGROUP delivered it.)"""
    if not reply:
        return []
    if isinstance(reply, dict):
        [(_stream, [entries])] = reply.items()
        return list(entries)
    [(_stream, entries)] = reply
    return list(entries)


def ask(keys: QueueKeys, every: bool, *options: str) -> Command:
    """The write that asks one partition for every event (``every``) or for the ends of jobs
    alone, for the next :data:`WATCH_MS` (lua/lib/settings.lua watched, ends_watched)."""
    return Command(("SET", keys.events_read if every else keys.ends_read, "1", "PX", WATCH_MS,
                    *options))


def watch(parts: Sequence[QueueKeys], every: bool = True) -> Op[bool]:
    """Ask each partition of a queue to write every event (``every``), or only the events of a
    job's end (``completed``, ``failed``, ``cancelled``), for the next :data:`WATCH_MS`; True if
    each already did (somebody asked within that time). A reader the server refuses this write
    (an ACL user that may only read, a server over ``maxmemory``) reads on all the same: False,
    and it sees the events written anyway."""
    try:
        before = yield Batch(tuple(ask(keys, every, "GET") for keys in parts))
    except PanqueueError:
        return False
    return all(reply is not None for reply in before)


def last_event_id(keys: QueueKeys) -> Op[str]:
    reply = yield Command(("XREVRANGE", keys.events, "+", "-", "COUNT", 1))
    return reply[0][0].decode() if reply else "0-0"


def read_events(keys: QueueKeys, after: str, block_ms: int | None, count: int = 500
                ) -> Op[list[Event]]:
    """Events after stream id ``after``, waiting up to ``block_ms`` for the first one (None:
    not at all, only what is there now)."""
    wait = () if block_ms is None else ("BLOCK", block_ms)
    reply = yield Command(("XREAD", "COUNT", count, *wait, "STREAMS", keys.events, after))
    return [_event(keys.name, entry_id, entry or {})
            for entry_id, entry in stream_entries(reply)]


def events_now(keys: QueueKeys, after: str | None, count: int) -> Op[tuple[list[Event], str]]:
    """The events after ``after`` that are there now (at most ``count``), without waiting, and
    the position to read from next; with ``after`` None, none: the stream's end."""
    if after is None:
        end = yield from last_event_id(keys)
        return [], end
    events = yield from read_events(keys, after, None, count)
    return events, (events[-1].id if events else after)
