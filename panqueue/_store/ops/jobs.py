"""Reading jobs back: the job hash's fields made into a :class:`JobInfo`, one job or many,
the jobs of a state in a useful order, counts per state, and waiting for a job's result.

This module and the Lua scripts are the only places that know the job hash's field letters
(``lua/lib/layout.lua`` lists them).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from itertools import zip_longest
from typing import Any

import msgpack

from panqueue._codec import decode
from panqueue._job import ErrorInfo, JobInfo, JobState, from_ms
from panqueue._keys import QueueKeys
from panqueue._store.ops.workers import WorkerInfo, workers
from panqueue._store.transport import Batch, Command, Op, redact_url
from panqueue.errors import ConfigError, JobFailed, JobNotFound, TimeoutError

__all__ = ["STATE_SETS", "counts", "get_job", "list_ids", "list_jobs", "parse_job", "read_jobs",
           "state_set", "wait_result"]

# How long one blocking read of the event stream may take before re-checking.
_RESULT_POLL_CHUNK = 1.0
_RESULT_READ_COUNT = 1000
_FINAL_EVENTS = frozenset({b"completed", b"failed", b"cancelled"})


def parse_job(queue: str, job_id: str, fields: dict[bytes, bytes], logs: list[bytes]
              ) -> JobInfo:
    """The job stored in the hash ``fields`` (HGETALL of its key) with its ``logs``;
    :class:`JobNotFound` if the hash holds no job (it is empty, or has no state field)."""

    def text(name: bytes) -> str | None:
        raw = fields.get(name)
        return None if raw is None else raw.decode()

    state = text(b"s")
    if state is None:
        # Every script that creates a job writes its state in the same step: a hash without
        # one is a leftover (a write that raced a delete), not a job.
        raise JobNotFound(queue, job_id)
    history: list[dict[str, Any]] = []
    if fields.get(b"h"):
        # The history is msgpack maps written one after another, one per attempt.
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=_no_ext)
        unpacker.feed(fields[b"h"])
        history = [entry for entry in unpacker if isinstance(entry, dict)]
    return JobInfo(
        id=job_id,
        queue=queue,
        state=JobState(state),
        data=decode(fields.get(b"d")),
        attempts=int(fields.get(b"a") or 0),
        progress=decode(fields.get(b"pg")),
        logs=[line.decode(errors="replace") for line in logs],
        result=decode(fields.get(b"r")),
        error=ErrorInfo.from_wire(decode(fields.get(b"e"))),
        enqueued_at=from_ms(fields.get(b"et")),
        started_at=from_ms(fields.get(b"st")),
        finished_at=from_ms(fields.get(b"ft")),
        priority=int(fields.get(b"p") or 0),
        failure_reason=text(b"fr"),
        history=history,
        options=decode(fields.get(b"o")) or {},
    )


def _no_ext(code: int, data: bytes) -> Any:
    return None


def get_job(keys: QueueKeys, job_id: str) -> Op[JobInfo]:
    jkey = keys.job(job_id)
    h, logs = yield Batch((Command(("HGETALL", jkey)), Command(("LRANGE", jkey + ":logs", 0, -1))))
    if not h:
        raise JobNotFound(keys.name, job_id)
    return parse_job(keys.name, job_id, h, logs)


def read_jobs(keys: QueueKeys, ids: Sequence[str], *, states: Collection[JobState] | None = None,
              logs: bool = True) -> Op[list[JobInfo]]:
    """The jobs ``ids``, in order, in one round trip. Jobs that are gone (removed since they
    were listed) are left out, and so are jobs in a state not in ``states`` (when given).
    ``logs=False`` leaves every job's log lines empty (and unread)."""
    if not ids:
        return []
    requests = []
    for job_id in ids:
        requests.append(Command(("HGETALL", keys.job(job_id))))
        if logs:
            requests.append(Command(("LRANGE", keys.job(job_id) + ":logs", 0, -1)))
    replies = yield Batch(tuple(requests))
    step = 2 if logs else 1
    wanted = None if states is None else frozenset(JobState(s).value for s in states)
    jobs = []
    for index, job_id in enumerate(ids):
        h = replies[index * step]
        state = h.get(b"s") if h else None
        if state is None or (wanted is not None and state.decode() not in wanted):
            continue
        jobs.append(parse_job(keys.name, job_id, h, replies[index * step + 1] if logs else []))
    return jobs


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


def list_ids(keys: QueueKeys, state: JobState, limit: int | None = 100) -> Op[list[str]]:
    """The ids of up to ``limit`` jobs in ``state`` (``None``: all of them).

    Order: finished states newest first; waiting jobs in the order they will be claimed;
    delayed jobs by when they are due; blocked jobs by when they were blocked; active jobs by
    their lock deadline. A keyed queue's waiting jobs are taken one per key in turn, like the
    claim does: the keys ready to run in the order the claim visits them, then those held by
    their rate limit (soonest free first), then those at their concurrency limit.
    """
    if limit is not None and limit < 1:
        return []
    end = -1 if limit is None else limit - 1
    zrange = ("ZREVRANGE" if state.is_final else "ZRANGE", state_set(keys, state), 0, end)
    if state is not JobState.WAITING:
        reply = yield Command(zrange)
        return [member.decode() for member in reply]
    # Keyed mode: every key with waiting jobs is ready, rate-limited, or at its concurrency
    # limit (then it has running jobs): the readiness invariant of lib/waiting.lua.
    waiting, ready, limited, busy = yield Batch((
        Command(zrange),
        Command(("ZRANGE", keys.ready, 0, -1)),
        Command(("ZRANGE", keys.limited, 0, -1)),
        Command(("HKEYS", keys.key_active)),
    ))
    ids = [member.decode() for member in waiting]
    key_order = list(dict.fromkeys([*ready, *limited, *sorted(busy)]))
    if limit is not None and len(ready) >= limit - len(ids):
        # Every ready key has a waiting job, so the first turn over them fills the list.
        key_order = key_order[:max(0, limit - len(ids))]
    if key_order:
        lists = yield Batch(tuple(Command(("LRANGE", keys.key_list(key.decode()), 0, end))
                                  for key in key_order))
        ids += [member.decode() for turn in zip_longest(*lists) for member in turn
                if member is not None]
    return ids if limit is None else ids[:limit]


def list_jobs(keys: QueueKeys, state: JobState | str, limit: int = 100) -> Op[list[JobInfo]]:
    """Up to ``limit`` jobs in ``state``, in :func:`list_ids`' order (jobs that leave the
    state while they are read are left out)."""
    try:
        state = JobState(state)
    except ValueError:
        raise ConfigError(f"unknown job state {state!r} (one of: "
                          f"{', '.join(s.value for s in JobState)})") from None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"limit must be an int >= 1, got {limit!r}")
    ids = yield from list_ids(keys, state, limit)
    jobs = yield from read_jobs(keys, ids, states=(state,))
    return jobs


def wait_result(keys: QueueKeys, job_id: str, timeout: float | None, url: str = "") -> Op[Any]:
    """Wait until the job is final and return its result (raise JobFailed if it failed).

    After ``timeout`` seconds it raises :class:`TimeoutError` saying what it saw: the job's
    state, the server (``url``, password redacted) and the queue's live workers.

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
            result = yield from _timed_out(keys, job_id, timeout, url)
            return result
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


def _timed_out(keys: QueueKeys, job_id: str, timeout: float | None, url: str) -> Op[Any]:
    """The end of a wait that ran out of time: the job's result if it finished just now,
    else a :class:`TimeoutError` with the job's state, the server and the live workers."""
    state, result, error = yield Command(("HMGET", keys.job(job_id), "s", "r", "e"))
    if state is not None:
        outcome = _final_outcome(keys, job_id, state, result, error)
        if outcome is not None:
            return outcome[0]
    live = yield from workers(keys)
    where = f" at {redact_url(url)}" if url else ""
    seen = "it is gone" if state is None else f"it is {state.decode()}"
    raise TimeoutError(f"job {job_id!r} in queue {keys.name!r} did not finish within {timeout} s: "
                       f"{seen}{where}, and {_serving(keys.name, live)}")


def _serving(queue: str, live: list[WorkerInfo]) -> str:
    """Who serves ``queue``: "no live worker serves 'q'", or how many, and how busy."""
    if not live:
        return f"no live worker serves {queue!r}"
    running = sum(len(w.running) for w in live)
    concurrency = sum(w.concurrency for w in live)
    if len(live) == 1:
        return (f"1 live worker serves {queue!r} ({live[0].name}), running "
                f"{_jobs(running)} (concurrency {concurrency})")
    return (f"{len(live)} live workers serve {queue!r}, running {_jobs(running)} "
            f"(concurrency {concurrency} in all)")


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


def _final_outcome(keys: QueueKeys, job_id: str, state: bytes, result: bytes | None,
                   error: bytes | None) -> tuple[Any] | None:
    name = state.decode()
    if name == JobState.COMPLETED:
        return (decode(result),)
    if name in (JobState.FAILED, JobState.CANCELLED):
        raise JobFailed(keys.name, job_id, name, ErrorInfo.from_wire(decode(error)))
    return None
