"""Operations on one queue's Redis data, written once for the sync and the async clients.

Each operation is a generator that yields requests (script calls, commands, batches) and
returns a Python value; a transport drives it (``transport.run(op)``). Reply parsing for the
worker's hot path (claims) lives here too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from panqueue._codec import decode, encode
from panqueue._job import ErrorInfo, JobInfo, JobState, from_ms
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS, Script
from panqueue._store.transport import Batch, Command, Op, ScriptCall
from panqueue.errors import ConfigError, JobFailed, JobNotFound, PanqueueError, TimeoutError

__all__ = [
    "ClaimedJob",
    "NewJob",
    "add_jobs",
    "cancel",
    "counts",
    "get_job",
    "list_ids",
    "parse_claim",
    "pause",
    "remove",
    "retry_failed",
    "wait_result",
]

# The layout version written to {q:X}:meta field v (a later layout change migrates from it).
SCHEMA_VERSION = 1
# How many finished jobs a queue keeps by default (completed, and failed/cancelled each).
DEFAULT_KEEP_COMPLETED = 1000
DEFAULT_KEEP_FAILED = 10_000
# How long one blocking read of the event stream may take before re-checking.
_RESULT_POLL_CHUNK = 1.0


def script_call(script: Script, keys: QueueKeys, *args: Any) -> ScriptCall:
    return ScriptCall(script, (keys.prefix,), args)


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job to add, validated and encoded."""

    job_id: str | None
    data: bytes
    priority: int = 0
    delay_ms: int = 0
    run_at_ms: int = 0
    options: bytes = b""
    key: str = ""
    depends_on: tuple[str, ...] = ()
    dedup_key: str = ""
    dedup_ttl_ms: int = 0
    dedup_strategy: str = ""


def _refused(reply: Any) -> str | None:
    """The message of a script's ``{'!', message}`` refusal, if that is what ``reply`` is."""
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == b"!":
        return str(reply[1].decode())
    return None


def add_call(keys: QueueKeys, jobs: Sequence[NewJob], mode: str = "") -> ScriptCall:
    args: list[Any] = [len(jobs), mode]
    for job in jobs:
        args += [job.job_id or "", job.data, job.priority, job.delay_ms, job.run_at_ms,
                 job.options, job.key, encode(list(job.depends_on)) if job.depends_on else "",
                 job.dedup_key, job.dedup_ttl_ms, job.dedup_strategy]
    return ScriptCall(SCRIPTS.add, (keys.prefix,), tuple(args))


def parse_added(keys: QueueKeys, reply: Any) -> list[tuple[str, bool]]:
    problem = _refused(reply)
    if problem is not None:
        raise ConfigError(f"queue {keys.name!r}: {problem}")
    return [(reply[i].decode(), bool(reply[i + 1])) for i in range(0, len(reply), 2)]


def add_jobs(keys: QueueKeys, jobs: Sequence[NewJob], mode: str = "",
             durable_timeout_ms: int | None = None) -> Op[list[tuple[str, bool]]]:
    """Add jobs in one script call. With ``durable_timeout_ms``, also wait (on the same
    connection) until the server reports the write fsynced to its append-only file."""
    call = add_call(keys, jobs, mode)
    if durable_timeout_ms is None:
        reply = yield call
        return parse_added(keys, reply)
    # Every request below goes to the server that holds the queue: on Redis Cluster, commands
    # without keys (INFO, WAITAOF) would otherwise reach an arbitrary master.
    server, persistence = yield Batch((Command(("INFO", "server")),
                                       Command(("INFO", "persistence"))), route=keys.prefix)
    version = tuple(int(part) for part in str(server.get("redis_version", "0.0")).split(".")[:2])
    if version < (7, 2):  # Valkey reports 7.2.x here too, and has WAITAOF
        raise ConfigError("durable=True needs a server with WAITAOF (Redis >= 7.2 or Valkey >= "
                          "8.0); this one has none, so nothing was added")
    if not int(persistence.get("aof_enabled", 0)):
        raise ConfigError("durable=True needs the server's append-only file (appendonly yes); "
                          "it is off, so nothing was added")
    # WAITAOF waits for the writes of *this connection*: send both in one pipeline (the batch
    # sends the script with EVAL, so a server without it cached cannot fail the pipeline).
    reply, persisted = yield Batch((call, Command(("WAITAOF", 1, 0, durable_timeout_ms))),
                                   route=keys.prefix)
    added = parse_added(keys, reply)
    if int(persisted[0]) < 1:
        raise PanqueueError(
            f"queue {keys.name!r}: the job(s) {', '.join(i for i, _ in added)} were added, but "
            f"the server did not confirm an fsync within {durable_timeout_ms} ms")
    return added


def setup_queue(keys: QueueKeys, mode: str, key_concurrency: int, rate_max: int,
                rate_per_ms: int, rate_per_key: bool,
                keep_failed: int = DEFAULT_KEEP_FAILED) -> Op[None]:
    reply = yield script_call(SCRIPTS.setup, keys, mode, key_concurrency, rate_max, rate_per_ms,
                              1 if rate_per_key else 0, SCHEMA_VERSION, keep_failed)
    problem = _refused(reply)
    if problem is not None:
        raise ConfigError(f"queue {keys.name!r}: {problem}")


def get_job(keys: QueueKeys, job_id: str) -> Op[JobInfo]:
    jkey = keys.job(job_id)
    h, logs = yield Batch((Command(("HGETALL", jkey)), Command(("LRANGE", jkey + ":logs", 0, -1))))
    if not h:
        raise JobNotFound(keys.name, job_id)
    return JobInfo.from_hash(keys.name, job_id, h, logs)


# The sorted set that holds the jobs of each state (keyed mode's waiting jobs are in per-key
# lists instead; the meta field "kw" counts them).
STATE_SETS = {
    JobState.WAITING: "wait",
    JobState.DELAYED: "delayed",
    JobState.BLOCKED: "blocked",
    JobState.ACTIVE: "active",
    JobState.COMPLETED: "completed",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
}


def state_set(keys: QueueKeys, state: JobState) -> str:
    return str(getattr(keys, STATE_SETS[state]))


def counts(keys: QueueKeys) -> Op[dict[JobState, int]]:
    replies = yield Batch((*(Command(("ZCARD", state_set(keys, s))) for s in STATE_SETS),
                           Command(("HGET", keys.meta, "kw"))))
    result = {state: int(n) for state, n in zip(STATE_SETS, replies, strict=False)}
    result[JobState.WAITING] += int(replies[-1] or 0)  # waiting in keyed mode's per-key lists
    return result


def is_paused(keys: QueueKeys) -> Op[bool]:
    reply = yield Command(("HEXISTS", keys.meta, "paused"))
    return bool(reply)


def known_queue(keys: QueueKeys) -> Op[bool]:
    """Whether the queue has ever been used (its meta hash exists)."""
    reply = yield Command(("EXISTS", keys.meta))
    return bool(reply)


def list_ids(keys: QueueKeys, state: JobState, limit: int = 100) -> Op[list[str]]:
    reply = yield Command(("ZRANGE", state_set(keys, state), 0, limit - 1))
    return [member.decode() for member in reply]


def pause(keys: QueueKeys, paused: bool) -> Op[None]:
    yield script_call(SCRIPTS.pause, keys, "1" if paused else "0")


def cancel(keys: QueueKeys, job_id: str) -> Op[JobState]:
    """Cancel a job; returns the state it was in (an active job is cancelled by its worker)."""
    reply = yield script_call(SCRIPTS.cancel, keys, job_id, DEFAULT_KEEP_FAILED)
    if not reply:
        raise JobNotFound(keys.name, job_id)
    return JobState(reply.decode())


def retry_failed(keys: QueueKeys, ids: Sequence[str] | None, limit: int = 10_000) -> Op[int]:
    reply = yield script_call(SCRIPTS.retry, keys, limit, *(ids or ()))
    return int(reply)


def remove(keys: QueueKeys, job_id: str) -> Op[bool]:
    reply = yield script_call(SCRIPTS.remove, keys, job_id)
    if reply == -1:
        raise PanqueueError(f"job {job_id!r} in queue {keys.name!r} is active; cancel it first")
    return bool(reply)


def wait_result(keys: QueueKeys, job_id: str, timeout: float | None) -> Op[Any]:
    """Wait until the job is final and return its result (raise JobFailed if it failed).

    Reads the queue's event stream with blocking XREAD, so it wakes on the completion event
    rather than polling the job. The stream position is taken *before* the job's state is read:
    a completion after that read is then always in the part of the stream still to be read,
    unless the stream's cap trimmed it first (a waiter that fell more than ~10,000 events
    behind). So each read of the stream also re-reads the job's state, in the same round trip:
    a completion whose event was trimmed is seen one read later.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    jkey = keys.job(job_id)
    last, fields = yield Batch((
        Command(("XREVRANGE", keys.events, "+", "-", "COUNT", 1)),
        Command(("HMGET", jkey, "s", "r", "e")),
    ))
    position = last[0][0] if last else b"0-0"
    caught_up = True  # whether the last read reached the end of the stream
    while True:
        state, result, error = fields
        if state is not None:
            outcome = _final_outcome(keys, job_id, state, result, error)
            if outcome is not None:
                return outcome[0]
        elif caught_up:
            # Gone (removed, or deleted by retention), and no final event of it is left to read.
            raise JobNotFound(keys.name, job_id)
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError(f"job {job_id!r} in queue {keys.name!r} did not finish within "
                               f"{timeout} s")
        block = _RESULT_POLL_CHUNK if remaining is None else min(remaining, _RESULT_POLL_CHUNK)
        fields, reply = yield Batch((
            Command(("HMGET", jkey, "s", "r", "e")),
            Command(("XREAD", "COUNT", _RESULT_READ_COUNT, "BLOCK", max(1, int(block * 1000)),
                     "STREAMS", keys.events, position)),
        ))
        caught_up = True
        for _stream, entries in reply or ():
            caught_up = len(entries) < _RESULT_READ_COUNT
            for entry_id, entry in entries:
                position = entry_id
                event = entry.get(b"ev")
                if entry.get(b"id") == job_id.encode() and event in _FINAL_EVENTS:
                    # The event carries the outcome: retention may already have deleted the job.
                    state = {b"completed": b"completed", b"failed": b"failed"}.get(
                        event, b"cancelled")
                    outcome = _final_outcome(keys, job_id, state, entry.get(b"r"),
                                             entry.get(b"e"))
                    if outcome is not None:
                        return outcome[0]


_RESULT_READ_COUNT = 1000
_FINAL_EVENTS = frozenset({b"completed", b"failed", b"cancelled"})


def _final_outcome(keys: QueueKeys, job_id: str, state: bytes, result: bytes | None,
                   error: bytes | None) -> tuple[Any] | None:
    name = state.decode()
    if name == JobState.COMPLETED:
        return (decode(result),)
    if name in (JobState.FAILED, JobState.CANCELLED):
        raise JobFailed(keys.name, job_id, name, ErrorInfo.from_wire(decode(error)))
    return None


# --------------------------------------------------------------------------- worker side


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


def encode_error(error: ErrorInfo) -> bytes:
    return encode(error.to_wire())


# --------------------------------------------------------------------------- schedules


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule as stored in Redis."""

    name: str
    queue: str
    next_run: datetime
    definition: dict[str, Any]


def server_time_ms() -> Op[int]:
    seconds, micros = yield Command(("TIME",))
    return int(seconds) * 1000 + int(micros) // 1000


def schedule_set(keys: QueueKeys, name: str, definition: bytes, first_run_ms: int) -> Op[bool]:
    reply = yield script_call(SCRIPTS.schedule, keys, "set", name, definition, first_run_ms)
    return bool(reply)


def schedule_tick(keys: QueueKeys, name: str, expected_ms: int, next_ms: int, job: NewJob
                  ) -> Op[bool]:
    reply = yield script_call(SCRIPTS.schedule, keys, "tick", name, expected_ms, next_ms,
                              job.job_id or "", job.data, job.priority, job.options)
    return bool(reply)


def schedule_times(keys: QueueKeys) -> Op[tuple[int, list[tuple[str, int]]]]:
    """The server's time and every schedule's next run (ms)."""
    (seconds, micros), entries = yield Batch((
        Command(("TIME",)),
        Command(("ZRANGE", keys.schedules, 0, -1, "WITHSCORES")),
    ))
    now = int(seconds) * 1000 + int(micros) // 1000
    return now, [(name.decode(), int(float(score))) for name, score in entries]


def list_schedules(keys: QueueKeys) -> Op[list[ScheduleInfo]]:
    _, entries = yield from schedule_times(keys)
    if not entries:
        return []
    definitions = yield Batch(tuple(Command(("HGET", keys.schedule(name), "def"))
                                    for name, _ in entries))
    return [ScheduleInfo(name, keys.name, from_ms(ms) or datetime.now(UTC), decode(d) or {})
            for (name, ms), d in zip(entries, definitions, strict=True)]


def remove_schedule(keys: QueueKeys, name: str) -> Op[bool]:
    reply = yield script_call(SCRIPTS.schedule, keys, "remove", name)
    return bool(reply)


def clean(keys: QueueKeys, completed_age_ms: int, failed_age_ms: int, limit: int = 1000
          ) -> Op[int]:
    reply = yield script_call(SCRIPTS.clean, keys, completed_age_ms, failed_age_ms, limit)
    return int(reply)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Event:
    """One lifecycle event from a queue's event stream.

    ``type``: added, active, progress, completed, failed, retried, stalled, cancelled, waiting,
    blocked, removed, paused, resumed. ``id`` is the stream id: pass it as ``after=`` to resume.
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


def last_event_id(keys: QueueKeys) -> Op[str]:
    reply = yield Command(("XREVRANGE", keys.events, "+", "-", "COUNT", 1))
    return reply[0][0].decode() if reply else "0-0"


def read_events(keys: QueueKeys, after: str, block_ms: int, count: int = 500
                ) -> Op[list[Event]]:
    """Events after stream id ``after``, waiting up to ``block_ms`` for the first one."""
    reply = yield Command(("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", keys.events,
                           after))
    return [_event(keys.name, entry_id, entry)
            for _stream, entries in reply or () for entry_id, entry in entries]
