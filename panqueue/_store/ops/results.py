"""Waiting for a job's result: a blocking read of the queue's event stream that wakes on the
job's end, with the job's state read beside it, and what a wait that runs out of time says.
"""

from __future__ import annotations

import math
import time
from typing import Any

from panqueue._codec import decode
from panqueue._job import ErrorInfo, JobState
from panqueue._keys import QueueKeys
from panqueue._store.ops.events import WATCH_MS, ask, stream_entries
from panqueue._store.ops.workers import WorkerInfo, workers
from panqueue._store.transport import Batch, Command, Op, redact_url
from panqueue.errors import (
    ConnectionError,
    JobFailed,
    JobNotFound,
    PanqueueError,
    TimeoutError,
)

__all__ = ["wait_result"]

# How long one blocking read of the event stream may take before re-checking.
_RESULT_POLL_CHUNK = 1.0
_RESULT_READ_COUNT = 1000
# The events of a job's end, each named after the final state it ends in.
_FINAL_EVENTS = frozenset(state.encode() for state in JobState if state.is_final)
# A waiter asks again for the ends of jobs once half of its last ask's hour has gone.
_ASK_AGAIN_S = WATCH_MS / 2000


def wait_result(keys: QueueKeys, job_id: str, timeout: float | None, url: str = "") -> Op[Any]:
    """Wait until the job is final and return its result (raise JobFailed if it failed).

    After ``timeout`` seconds it raises :class:`TimeoutError` saying what it saw: the job's
    state, the server (``url``, password redacted) and the queue's live workers.

    Reads the queue's event stream with blocking XREAD, so it wakes on the completion event
    rather than polling the job. It first asks the queue to write the events of a job's end
    for the next hour (a queue writes them only while somebody waits or reads, see
    ops/events.py watch), in the same round trip, and again before that ask ends. The stream
    position is taken *before* the job's state is read: a completion after that read is then
    always in the part of the stream still to be read, unless the stream's cap trimmed it first
    (a waiter that fell more than ~10,000 events behind). So each read of the stream also
    re-reads the job's state, in the same round trip: a completion whose event was trimmed is
    seen one read later. A waiter the server refuses the ask (an ACL user that may only read,
    a server over ``maxmemory``) reads all the same, and sees a completion in the job's state
    within a read unless retention deleted the job first.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    jkey, wanted = keys.job(job_id), job_id.encode()
    last, fields, asked = yield from _ask_for_ends(keys, (
        Command(("XREVRANGE", keys.events, "+", "-", "COUNT", 1)),
        _read_outcome(jkey),
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
        reads = (
            _read_outcome(jkey),
            Command(("XREAD", "COUNT", _RESULT_READ_COUNT, "BLOCK", max(1, int(block * 1000)),
                     "STREAMS", keys.events, position)),
        )
        if time.monotonic() - asked > _ASK_AGAIN_S:
            fields, reply, asked = yield from _ask_for_ends(keys, reads)
        else:
            fields, reply = yield Batch(reads)
        entries = stream_entries(reply)
        caught_up = len(entries) < _RESULT_READ_COUNT
        for entry_id, entry_fields in entries:
            position = entry_id
            entry = entry_fields or {}
            event = entry.get(b"ev")
            if entry.get(b"id") == wanted and event in _FINAL_EVENTS:
                # The event carries the outcome: retention may already have deleted the job.
                outcome = _final_outcome(keys, job_id, event, entry.get(b"r"), entry.get(b"e"))
                if outcome is not None:
                    return outcome[0]


def _read_outcome(jkey: str) -> Command:
    """The read of a job's state, result and error."""
    return Command(("HMGET", jkey, "s", "r", "e"))


def _ask_for_ends(keys: QueueKeys, reads: tuple[Command, ...]) -> Op[tuple[Any, Any, float]]:
    """The replies of the two ``reads``, sent after an ask for the events of a job's end (see
    :func:`wait_result`) in one round trip, and when that ask was made (``time.monotonic``). An
    ask the server refused is left out and the reads are sent again without it: one refused
    for now (a server over ``maxmemory``, a replica, a lost connection) is made again at the
    next read, one refused for good (an ACL user that may only read) once the ask's time is
    up, as if it had been made."""
    asked = time.monotonic()
    try:
        _, first, second = yield Batch((ask(keys, False), *reads))
    except PanqueueError as refused:
        first, second = yield Batch(reads)
        if isinstance(refused, ConnectionError):
            asked = -math.inf
    return first, second, asked


def _timed_out(keys: QueueKeys, job_id: str, timeout: float | None, url: str) -> Op[Any]:
    """The end of a wait that ran out of time: the job's result if it finished just now,
    else a :class:`TimeoutError` with the job's state, the server and the live workers."""
    state, result, error = yield _read_outcome(keys.job(job_id))
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
