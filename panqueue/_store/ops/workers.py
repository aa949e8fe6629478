"""The worker registry: which workers serve a queue, what they run, when they last beat.

Each worker writes its entry once per beat (``transitions.heartbeat``, ``lua/heartbeat.lua``)
into its queue's own keys, so the registry lives in the queue's hash slot like the rest of the
queue (Redis Cluster). An entry expires a few beats after the last one: readers see only live
entries, and :func:`workers` prunes the expired ones (``lua/workers.lua``).

What a worker runs is read from the jobs' locks, not only from its last beat: every running job
carries the lock token of the claim that took it, and the token names the worker
(``tokens.py``). A job claimed after the last beat, by a worker that was then killed, is still
shown as held by that worker until the stalled sweep takes it back or the entry expires.

One worker *process* serves one or more queues (``WorkerPool``: one ``Worker`` per queue, each
with its own entry): :func:`worker_processes` groups the entries by host and pid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from panqueue._check import MAX_CONCURRENCY, check_int
from panqueue._codec import decode
from panqueue._job import from_ms
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.base import script_call
from panqueue._store.tokens import parse_lock_token
from panqueue._store.transport import Batch, Command, Op
from panqueue.errors import ConfigError

__all__ = ["CONTROL_COMMANDS", "WorkerInfo", "WorkerProcess", "control", "control_command",
           "control_targets", "holders", "merge_workers", "worker_processes", "workers"]

# How many running jobs of a queue are read for the worker that holds each (their lock
# tokens). Past this, a worker's running jobs are those of its last beat.
ACTIVE_SCAN = 1000
# What ``client.control`` can ask of a worker (besides ``concurrency=N``).
CONTROL_COMMANDS = ("stop", "pause", "resume")
# The most a command may set a worker's concurrency to.


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
    #: Paused by ``client.control(name, "pause")``: it runs what it holds and claims nothing.
    paused: bool = False


def control_command(command: str | None, concurrency: int | None) -> str:
    """``client.control``'s arguments as the command a worker reads (lua/control.lua), or
    :class:`ConfigError` naming what is wrong."""
    if (command is None) == (concurrency is None):
        raise ConfigError("control takes one command: \"stop\", \"pause\", \"resume\", or "
                          "concurrency=N")
    if concurrency is not None:
        check_int(concurrency, "concurrency", low=1, high=MAX_CONCURRENCY)
        return f"concurrency:{concurrency}"
    if command not in CONTROL_COMMANDS:
        raise ConfigError(f"unknown control command {command!r} (one of: "
                          f"{', '.join(CONTROL_COMMANDS)}, or concurrency=N)")
    return command


def control_targets(name: str, processes: Sequence[WorkerProcess], queues: Sequence[str]
                    ) -> list[tuple[str, list[str]]]:
    """Whom ``client.control(name, ...)`` tells, as (worker name, its queues): every worker of
    the process whose row is named ``name`` (``host:pid`` for a process whose workers have
    names of their own), else the worker ``name`` in each of ``queues``."""
    for process in processes:
        if process.name == name:
            return [(w.name, list(w.queues)) for w in process.workers]
    return [(name, list(queues))]


def control(targets: Sequence[tuple[str, Sequence[str]]], command: str) -> Op[list[str]]:
    """Queue ``command`` for each worker of ``targets`` (name, queues) in each of its queues
    where it has a live entry (in the queue's home partition, whose beat takes it); returns
    the queues told."""
    told = []
    for name, queues in targets:
        for queue in queues:
            if (yield script_call(SCRIPTS.control, QueueKeys(queue), name, command)):
                told.append(queue)
    return told


def holders(keys: QueueKeys) -> Op[dict[str, str | None]]:
    """The running jobs of the queue (up to :data:`ACTIVE_SCAN`, soonest lock deadline first)
    mapped to the name of the worker whose claim locked each, from their lock tokens (None: a
    token that names none)."""
    active = yield Command(("ZRANGE", keys.active, 0, ACTIVE_SCAN - 1))
    ids = [member.decode() for member in active]
    if not ids:
        return {}
    tokens = yield Batch(tuple(Command(("HGET", keys.job(i), "tk")) for i in ids))
    held: dict[str, str | None] = {}
    for job_id, token in zip(ids, tokens, strict=True):
        parsed = None if token is None else parse_lock_token(token.decode())
        held[job_id] = None if parsed is None else parsed.worker
    return held


def workers(keys: QueueKeys) -> Op[list[WorkerInfo]]:
    """The live workers of one queue, by name (expired entries are pruned), each with the jobs
    it holds the locks of (and those of its last beat that no lock names)."""
    reply = yield script_call(SCRIPTS.workers, keys)
    held: dict[str, str | None] = {}
    if len(reply) > 1:
        held = yield from holders(keys)
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
            running=_running(reply[i].decode(), record.get("running") or [], held),
            concurrency=int(record.get("concurrency") or 0),
            started_at=started,
            heartbeat_at=beat,
            loop_blocked_since=from_ms(record.get("loop_blocked_since")),
            paused=bool(record.get("paused")),
        ))
    return sorted(found, key=lambda w: w.name)


def _running(name: str, beat: Sequence[Any], held: dict[str, str | None]) -> list[str]:
    """Worker ``name``'s running jobs: those of its last beat that no other worker's lock holds
    now (one that another worker took over is left out; one that finished since the beat, or
    runs in another partition of the queue, whose running jobs this read does not see, stays
    until the next beat), then those its locks hold that the beat did not list."""
    running = [str(job_id) for job_id in beat]
    kept = [j for j in running if held.get(j) in (None, name)]
    return kept + sorted(j for j, owner in held.items() if owner == name and j not in kept)


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
            paused=seen.paused or info.paused,
        )
    return sorted(merged.values(), key=lambda w: w.name)


@dataclass(frozen=True, slots=True)
class WorkerProcess:
    """One worker process (``panqueue worker``, a ``WorkerPool``, a ``Worker``) and every queue
    it serves, from the registry entries of its workers (``client.worker_processes()``).

    ``name``: the workers' name when they share one (``--name``), else ``host:pid``.
    ``concurrency``: its slots over every queue; ``running``: the jobs it runs on any of them.
    ``workers``: its entries, one per queue (or partition's queue), as ``client.workers()``
    gives them.
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
    workers: list[WorkerInfo] = field(default_factory=list)
    #: Paused by ``client.control(name, "pause")`` (any of its workers is).
    paused: bool = False


def worker_processes(found: list[WorkerInfo]) -> list[WorkerProcess]:
    """The entries ``found`` (of one queue or several) grouped into one row per process (host
    and pid), ordered by name. An entry seen once per queue counts once."""
    groups: dict[tuple[str, int], dict[tuple[str, tuple[str, ...]], WorkerInfo]] = {}
    for info in found:
        # The same worker read from several partitions of one queue is one entry.
        groups.setdefault((info.host, info.pid), {})[(info.name, tuple(info.queues))] = info
    rows = []
    for (host, pid), entries in groups.items():
        members = sorted(entries.values(), key=lambda w: (w.queues, w.name))
        names = {w.name for w in members}
        running: list[str] = []
        for w in members:
            running += [j for j in w.running if j not in running]
        rows.append(WorkerProcess(
            name=names.pop() if len(names) == 1 else f"{host}:{pid}",
            host=host, pid=pid,
            queues=sorted({q for w in members for q in w.queues}),
            running=running,
            concurrency=sum(w.concurrency for w in members),  # a Worker per queue
            started_at=min(w.started_at for w in members),
            heartbeat_at=max(w.heartbeat_at for w in members),
            loop_blocked_since=min((w.loop_blocked_since for w in members
                                    if w.loop_blocked_since is not None), default=None),
            workers=members,
            paused=any(w.paused for w in members),
        ))
    return sorted(rows, key=lambda p: (p.name, p.host, p.pid))
