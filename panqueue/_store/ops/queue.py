"""A queue as a whole: which queues exist, their settings, pausing, and the changes an
operator makes to one job (cancel, remove, retry failed jobs, clean old ones)."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence

from panqueue._job import JobState
from panqueue._keys import QueueKeys, key_pattern
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.base import (
    DEFAULT_KEEP_EVENTS,
    DEFAULT_KEEP_FAILED,
    DEFAULT_KEEP_HISTORY,
    SCHEMA_VERSION,
    check_refusal,
    script_call,
)
from panqueue._store.transport import Command, Op, Scan
from panqueue.errors import ConfigError, JobNotFound, PanqueueError

__all__ = ["cancel", "clean", "is_paused", "known_queue", "pause", "ping", "purge", "queues",
           "remove", "retry_failed", "setup_queue"]

# How many jobs one purge call deletes (a call is atomic; a purge repeats it until done).
PURGE_BATCH = 1000

# Every queue that has state in Redis has its meta hash (the first write to a queue makes it):
# "{<prefix>:q:X}:meta" (key_pattern: under the prefix of the transport that runs the scan).
_META_REST = "*}:meta"


def ping() -> Op[None]:
    """Reach the server (a :class:`ConnectionError` if it cannot be reached)."""
    yield Command(("PING",))


def queues() -> Op[list[str]]:
    """The names of every queue with state in Redis, sorted. Scans the keyspace (on a cluster,
    every master): meant for operators, not for a hot path."""
    found = yield Scan(key_pattern("q", _META_REST))
    start = len(key_pattern("q", ""))
    names = set()
    for key in found:
        text = key.decode()
        # "{q:X#i}:meta" is partition i of queue X (queue names have no '#' and no brace). The
        # pattern matches other keys too: a job's or a tag's whose name ends in "}:meta".
        tag_end = text.find("}", start)
        if text[tag_end:] == "}:meta":
            names.add(text[start:tag_end].partition("#")[0])
    return sorted(names)


def known_queue(keys: QueueKeys) -> Op[bool]:
    """Whether the queue has ever been used (its meta hash exists)."""
    reply = yield Command(("EXISTS", keys.meta))
    return bool(reply)


def setup_queue(keys: QueueKeys, mode: str, key_concurrency: int, rate_max: int,
                rate_per_ms: int, rate_per_key: bool,
                keep_failed: int = DEFAULT_KEEP_FAILED,
                keep_history: int = DEFAULT_KEEP_HISTORY, rate_recover_ms: int = 0,
                keep_events: int = DEFAULT_KEEP_EVENTS, events_always: bool = False
                ) -> Op[None]:
    """Store a worker's settings of the queue, one partition of it (:class:`ConfigError` if
    they contradict the stored mode, or the stored partition count while jobs are stored).
    ``rate_recover_ms`` > 0 makes the rate limit adaptive (lua/lib/rate.lua)."""
    reply = yield script_call(SCRIPTS.setup, keys, mode, key_concurrency, rate_max, rate_per_ms,
                              1 if rate_per_key else 0, SCHEMA_VERSION, keep_failed,
                              keep_history, rate_recover_ms, keys.declared, keep_events,
                              1 if events_always else 0)
    check_refusal(keys, reply)


def events_written(parts: Sequence[QueueKeys]) -> Op[str]:
    """Which events the queue writes, as its workers set it up (the first partition's
    settings, which every partition's workers set alike): ``"ends"`` only those of a job's end
    (``Retention(events=0)``), ``"always"`` every event (``Retention(events_always=True)``),
    ``"read"`` every event while somebody reads them, else those of a job's end (the
    default: lua/lib/settings.lua watched)."""
    kept, always = yield Command(("HMGET", parts[0].meta, "ke", "ka"))
    if kept == b"0":
        return "ends"
    return "always" if always == b"1" else "read"


def is_paused(keys: QueueKeys) -> Op[bool]:
    reply = yield Command(("HEXISTS", keys.meta, "paused"))
    return bool(reply)


def pause(keys: QueueKeys, paused: bool) -> Op[None]:
    yield script_call(SCRIPTS.pause, keys, "1" if paused else "0")


def pause_like_home(parts: Sequence[QueueKeys]) -> Op[None]:
    """A partitioned queue paused by name before it was declared has only its first partition
    paused (a client could not know the others yet): the producer that stores the layout, and
    a worker starting on it, pause the rest."""
    if (yield from is_paused(parts[0])):
        for keys in parts[1:]:
            yield from pause(keys, True)


def cancel(keys: QueueKeys, job_id: str) -> Op[JobState]:
    """Cancel a job; returns the state it was in (an active job is cancelled by its worker)."""
    reply = yield script_call(SCRIPTS.cancel, keys, job_id, DEFAULT_KEEP_FAILED, "")
    if not reply:
        raise JobNotFound(keys.name, job_id)
    return JobState(reply.decode())


def signal(keys: QueueKeys, job_id: str, name: str, payload: bytes) -> Op[bool]:
    """Send a durable job the signal ``name`` with ``payload`` (msgpack): kept until a
    ``wait_for(name)`` takes it, and a job waiting for it now is woken. False when the job is
    final (nothing written). The call carries a request id of its own, so that a resend after
    a lost reply keeps the signal once."""
    reply = yield script_call(SCRIPTS.signal, keys, job_id, name, payload, os.urandom(12).hex())
    if reply is None:
        raise JobNotFound(keys.name, job_id)
    return bool(reply)


def retry_failed(keys: QueueKeys, ids: Sequence[str] | None, limit: int = 10_000) -> Op[int]:
    if ids is not None and not ids:
        # The script reads "no ids" as "the oldest failed jobs": an empty selection moves none.
        return 0
    reply = yield script_call(SCRIPTS.retry, keys, limit, *ids or ())
    return int(reply)


def remove(keys: QueueKeys, job_id: str) -> Op[bool]:
    reply = yield script_call(SCRIPTS.remove, keys, job_id, "")
    if reply == -1:
        raise PanqueueError(f"job {job_id!r} in queue {keys.name!r} is active; cancel it first")
    return bool(reply)


def clean(keys: QueueKeys, completed_age_ms: int, failed_age_ms: int, limit: int = 1000
          ) -> Op[int]:
    reply = yield script_call(SCRIPTS.clean, keys, completed_age_ms, failed_age_ms, limit)
    return int(reply)


def purge(keys: QueueKeys, states: Collection[JobState | str] | None,
          batch: int = PURGE_BATCH) -> Op[int]:
    """Delete every job in ``states`` (``None``: every job that is not active, then the queue's
    settings unless a job is active or a live worker serves the queue); returns how many were
    deleted. Each call of the script
    deletes up to ``batch`` jobs atomically; this repeats it until nothing is left."""
    if states is None:
        names: tuple[str, ...] = ("all",)
    else:
        try:
            names = tuple(sorted({JobState(s).value for s in states}))
        except ValueError:
            raise ConfigError(f"unknown job state in {list(states)!r} (states are: "
                              f"{', '.join(s.value for s in JobState)})") from None
        if not names:
            return 0
    total = 0
    while True:
        deleted, more = yield script_call(SCRIPTS.purge, keys, batch, *names)
        total += int(deleted)
        if not more:
            return total
