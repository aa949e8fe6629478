"""The worker registry: which workers serve a queue, what they run, when they last beat.

Each worker writes its entry once per beat (``transitions.heartbeat``, ``lua/heartbeat.lua``)
into its queue's own keys, so the registry lives in the queue's hash slot like the rest of the
queue (Redis Cluster). An entry expires a few beats after the last one: readers see only live
entries, and :func:`workers` prunes the expired ones (``lua/workers.lua``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from panqueue._codec import decode
from panqueue._job import from_ms
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.base import script_call
from panqueue._store.transport import Op

__all__ = ["WorkerInfo", "merge_workers", "workers"]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker as its last heartbeat described it (``client.workers()``).

    ``running``: the ids of the jobs it was running at that beat. ``started_at`` and
    ``heartbeat_at`` are aware UTC datetimes from the Redis server's clock.
    ``loop_blocked_since``: set while the worker's event loop is blocked (a handler running
    blocking code on it): the worker is alive, its watchdog thread keeps the entry and its
    jobs' locks, and nothing else of it runs until the loop is back.
    """

    name: str
    host: str
    pid: int
    queues: list[str]
    running: list[str]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    loop_blocked_since: datetime | None = None


def workers(keys: QueueKeys) -> Op[list[WorkerInfo]]:
    """The live workers of one queue, by name (expired entries are pruned)."""
    reply = yield script_call(SCRIPTS.workers, keys)
    found = []
    for i in range(1, len(reply), 3):
        record: dict[str, Any] = decode(reply[i + 2]) or {}
        started = from_ms(int(record.get("started") or 0))
        beat = from_ms(int(record.get("beat") or 0))
        assert started is not None and beat is not None
        found.append(WorkerInfo(
            name=reply[i].decode(),
            host=str(record.get("host", "")),
            pid=int(record.get("pid") or 0),
            queues=[str(q) for q in record.get("queues") or [keys.name]],
            running=[str(job_id) for job_id in record.get("running") or []],
            concurrency=int(record.get("concurrency") or 0),
            started_at=started,
            heartbeat_at=beat,
            loop_blocked_since=from_ms(record.get("loop_blocked_since")),
        ))
    return sorted(found, key=lambda w: w.name)


def merge_workers(found: list[WorkerInfo]) -> list[WorkerInfo]:
    """One entry per worker name from the entries of several queues: the queues and running
    jobs together, the earliest start and the latest beat."""
    merged: dict[str, WorkerInfo] = {}
    for info in found:
        seen = merged.get(info.name)
        if seen is None:
            merged[info.name] = info
            continue
        merged[info.name] = WorkerInfo(
            name=info.name, host=info.host, pid=info.pid,
            queues=sorted({*seen.queues, *info.queues}),
            running=[*seen.running, *(j for j in info.running if j not in seen.running)],
            concurrency=max(seen.concurrency, info.concurrency),
            started_at=min(seen.started_at, info.started_at),
            heartbeat_at=max(seen.heartbeat_at, info.heartbeat_at),
            loop_blocked_since=min((s for s in (seen.loop_blocked_since,
                                                info.loop_blocked_since) if s is not None),
                                   default=None),
        )
    return sorted(merged.values(), key=lambda w: w.name)
