"""Reading jobs back: the job hash's fields made into a :class:`JobInfo`, one job or many,
the jobs of a state in a useful order, counts per state. (Waiting for a job's result is in
ops/results.py.)

This module (with ops/results.py, which reads a job's state, result and error) and the Lua
scripts are the only places that know the job hash's field letters (``lua/lib/layout.lua``
lists them).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Sequence
from itertools import zip_longest
from typing import Any

import msgpack

from panqueue._check import check_int
from panqueue._codec import decode
from panqueue._durable import FOREVER_MS, steps_of
from panqueue._job import ErrorInfo, JobInfo, JobState, from_ms, parse_log_line
from panqueue._keys import QueueKeys
from panqueue._store.tokens import parse_lock_token
from panqueue._store.transport import Batch, Command, Op
from panqueue.errors import ConfigError, JobNotFound

__all__ = ["STATE_SETS", "counts", "due_delayed", "get_job", "list_ids", "list_jobs",
           "parse_job", "read_jobs", "state_set"]



def failed_attempt(entry: dict[Any, Any]) -> bool:
    """Whether a history entry is a failed attempt's: a snooze, a handler's RateLimited, a
    durable job's suspension and a stalled attempt (lua/stalled.lua, given back and counted
    as a stall) used none."""
    return bool(entry) and entry.get("type") not in (None, "Snoozed", "RateLimited", "Suspended",
                                                     "Stalled")


def parse_job(queue: str, job_id: str, fields: dict[bytes, bytes], logs: list[bytes],
              due: bytes | float | None = None, durable: dict[bytes, bytes] | None = None
              ) -> JobInfo:
    """The job stored in the hash ``fields`` (HGETALL of its key) with its ``logs``,
    ``due``, its score in the delayed set (ZSCORE), and its ``durable`` record (steps, sleeps,
    waits); :class:`JobNotFound` if the hash holds no job (it is empty, or has no state
    field)."""

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
    job_state = JobState(state)
    token = text(b"tk")
    holder = parse_lock_token(token) if token and job_state is JobState.ACTIVE else None
    last = history[-1] if history else {}
    retry = (job_state in (JobState.WAITING, JobState.DELAYED) and failed_attempt(last)
             and b"e" in fields)
    allowed = last.get("max_attempts") if retry else None
    lines = [parse_log_line(line.decode(errors="replace")) for line in logs]
    return JobInfo(
        id=job_id,
        queue=queue,
        state=job_state,
        data=decode(job_data(fields)),
        attempts=int(fields.get(b"a") or 0),
        progress=decode(fields.get(b"pg")),
        logs=[line.message for line in lines],
        result=decode(fields.get(b"r")),
        error=ErrorInfo.from_wire(decode(fields.get(b"e"))),
        enqueued_at=from_ms(fields.get(b"et")),
        started_at=from_ms(fields.get(b"st")),
        finished_at=from_ms(fields.get(b"ft")),
        ready_at=from_ms(fields.get(b"rt")),
        priority=int(fields.get(b"p") or 0),
        failure_reason=text(b"fr"),
        history=history,
        options=decode(fields.get(b"o")) or {},
        expires_at=from_ms(fields.get(b"x")),
        run_at=(from_ms(int(float(due))) if due is not None and float(due) < FOREVER_MS
                and job_state is JobState.DELAYED else None),
        worker=None if holder is None else holder.worker,
        retry_of=int(last.get("attempt") or 0) if retry else None,
        max_attempts=int(allowed) if isinstance(allowed, int) else None,
        log_lines=lines,
        tags=fields[b"tg"].decode().split("\n") if fields.get(b"tg") else [],
        **_durable_fields(job_state, durable or {}, last, due),
    )


def _durable_fields(state: JobState, record: dict[bytes, bytes], last: dict[str, Any],
                    due: bytes | float | None) -> dict[str, Any]:
    """JobInfo's view of a durable record: the steps (in the order they were stored, and
    when), and while the job is DELAYED by a suspension (its ``last`` history entry is the
    suspension's), the signal it waits for or the time it sleeps until (``due``, its score in
    the delayed set). A job DELAYED otherwise (a retry's backoff, a snooze) neither waits nor
    sleeps, whatever sleeps and waits its record holds from earlier runs."""
    if not record:
        return {}
    steps, stored_at = steps_of(record)
    waiting_for = sleeping_until = None
    if state is JobState.DELAYED and last.get("type") == "Suspended":
        raw = record.get(b"ws")
        if raw is not None:
            waiting_for = raw.decode(errors="replace")
        elif due is not None:
            sleeping_until = from_ms(int(float(due)))
    return {"steps": steps, "steps_at": {name: from_ms(at) for name, at in stored_at.items()},
            "waiting_for": waiting_for, "sleeping_until": sleeping_until}


def _no_ext(code: int, data: bytes) -> Any:
    return None


def get_job(keys: QueueKeys, job_id: str) -> Op[JobInfo]:
    jkey = keys.job(job_id)
    h, logs, due, durable = yield Batch((Command(("HGETALL", jkey)),
                                         Command(("LRANGE", jkey + ":logs", 0, -1)),
                                         Command(("ZSCORE", keys.delayed, job_id)),
                                         Command(("HGETALL", keys.durable(job_id)))))
    if not h:
        raise JobNotFound(keys.name, job_id)
    return parse_job(keys.name, job_id, h, logs, due, durable)


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
        requests.append(Command(("ZSCORE", keys.delayed, job_id)))
        if logs:
            requests.append(Command(("LRANGE", keys.job(job_id) + ":logs", 0, -1)))
    replies = yield Batch(tuple(requests))
    step = 3 if logs else 2
    wanted = None if states is None else frozenset(JobState(s).value for s in states)
    jobs = []
    for index, job_id in enumerate(ids):
        h = replies[index * step]
        state = h.get(b"s") if h else None
        if state is None or (wanted is not None and state.decode() not in wanted):
            continue
        jobs.append(parse_job(keys.name, job_id, h,
                              replies[index * step + 2] if logs else [],
                              replies[index * step + 1]))
    return jobs


# A job's data in up to eight parts, "d" then "d1" .. "d7" (lua/lib/job_data.lua).
_DATA_PARTS = (b"d1", b"d2", b"d3", b"d4", b"d5", b"d6", b"d7")


def job_data(fields: dict[bytes, bytes]) -> bytes | None:
    """The stored data of a job hash's fields: "d", joined with its further parts if any."""
    data = fields.get(b"d")
    if data is None or b"d1" not in fields:
        return data
    parts = [data]
    for name in _DATA_PARTS:
        part = fields.get(name)
        if part is None:
            break
        parts.append(part)
    return b"".join(parts)


# The sorted set that holds the jobs of each state (global mode's waiting jobs of the default
# priority are in the list ``keys.wait_list`` besides, see :func:`_wait_page`; keyed mode's
# waiting jobs are in per-key lists instead; the meta field "kw" counts them).
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


def scored(reply: list[Any]) -> list[tuple[bytes, float]]:
    """(member, score) of a ZRANGE ... WITHSCORES reply, given as pairs (RESP3) or as a flat
    list (RESP2)."""
    if reply and not isinstance(reply[0], list | tuple):
        reply = [reply[i:i + 2] for i in range(0, len(reply), 2)]
    return [(member, float(score)) for member, score in reply]


def first_scored(keys: QueueKeys, state: JobState, n: int) -> Op[list[tuple[bytes, float]]]:
    """The first ``n`` jobs in ``state`` (not waiting) in :func:`list_ids`' order, each with
    its score there: a time on the server's clock (when it is due, blocked since, its lock's
    deadline, when it finished), which orders the jobs of several partitions as it orders
    one's."""
    command = "ZREVRANGE" if state.is_final else "ZRANGE"
    return scored((yield Command((command, state_set(keys, state), 0, n - 1, "WITHSCORES"))))


def counts(keys: QueueKeys) -> Op[dict[JobState, int]]:
    replies = yield Batch((*(Command(("ZCARD", state_set(keys, s))) for s in STATE_SETS),
                           Command(("LLEN", keys.wait_list)),
                           Command(("HGET", keys.meta, "kw"))))
    result = {state: int(n) for state, n in zip(STATE_SETS, replies, strict=False)}
    # Waiting in global mode's list of the default priority, and in keyed mode's per-key lists.
    result[JobState.WAITING] += int(replies[-2]) + int(replies[-1] or 0)
    return result


# The wait set's members scored below this (priority 0 and above) go before the list
# (lua/lib/wait_order.lua WAIT_LIST_PLACE: (1,000,000 + 1) * 2**32).
_WAIT_LIST_PLACE = (1_000_000 + 1) * 2**32


def _wait_page(keys: QueueKeys, before: int, listed: int, first: int, last: int | None
               ) -> Op[list[str]]:
    """Global mode's waiting jobs from rank ``first`` to ``last`` (inclusive; ``None``: to the
    end) of the wait order: the wait set's jobs of a priority above the default, the list (the
    default priority), then the wait set's jobs below it; ``before`` and ``listed`` are how
    many the first two parts hold (lua/lib/wait_order.lua wait_range, which the claim and
    select.lua use)."""
    end = last if last is not None else 1 << 62
    requests = []
    if first < before:
        requests.append(Command(("ZRANGE", keys.wait, first, min(end, before - 1))))
    if end >= before and first < before + listed:
        requests.append(Command(("LRANGE", keys.wait_list, max(first - before, 0),
                                 min(end - before, listed - 1))))
    if end >= before + listed:
        requests.append(Command(("ZRANGE", keys.wait, max(first, before + listed) - listed,
                                 -1 if last is None else end - listed)))
    if not requests:
        return []
    replies = yield Batch(tuple(requests))
    return [member.decode() for reply in replies for member in reply]


def due_delayed(keys: QueueKeys) -> Op[tuple[int, float]]:
    """The delayed jobs already due (a worker's promotion moves them to waiting at its next
    tick: until then they are backlog too), and how long ago the first of them came due, in
    seconds (0 when none is due); on the server's clock."""
    seconds, micros = yield Command(("TIME",))
    now = int(seconds) * 1000 + int(micros) // 1000
    due, first = yield Batch((Command(("ZCOUNT", keys.delayed, "-inf", now)),
                              Command(("ZRANGE", keys.delayed, 0, 0, "WITHSCORES"))),
                             route=keys.prefix)
    if not int(due) or not first:
        return 0, 0.0
    return int(due), max(0.0, (now - scored(first)[0][1]) / 1000)


def list_ids(keys: QueueKeys, state: JobState, limit: int | None = 100, offset: int = 0
             ) -> Op[list[str]]:
    """The ids of up to ``limit`` jobs in ``state`` (``None``: all of them), skipping the
    first ``offset`` of that order.

    Order: finished states newest first; waiting jobs in the order they will be claimed;
    delayed jobs by when they are due; blocked jobs by when they were blocked; active jobs by
    their lock deadline. A keyed queue's waiting jobs are taken one per key in turn, like the
    claim does: the keys ready to run in the order the claim visits them, then those held by
    their rate limit (soonest free first), then those at their concurrency limit.

    Every state but a keyed queue's waiting jobs is one sorted set read by rank, so a page
    costs O(log N + limit) however deep ``offset`` goes. A keyed queue's waiting jobs past
    the first page cost one LLEN per key with waiting jobs besides (see :func:`_keyed_page`).
    """
    if limit is not None and limit < 1:
        return []
    end = -1 if limit is None else offset + limit - 1
    zrange = ("ZRANGE", state_set(keys, state), offset, end)
    if state.is_final:
        zrange = ("ZREVRANGE", *zrange[1:])
    if state is not JobState.WAITING:
        reply = yield Command(zrange)
        return [member.decode() for member in reply]
    # Keyed mode: every key with waiting jobs is ready, rate-limited, or at its concurrency
    # limit (then it has running jobs): the readiness invariant of lib/waiting.lua.
    before, listed, in_set, ready, limited, busy = yield Batch((
        Command(("ZCOUNT", keys.wait, "-inf", f"({_WAIT_LIST_PLACE}")),
        Command(("LLEN", keys.wait_list)),
        Command(("ZCARD", keys.wait)),
        Command(("ZRANGE", keys.ready, 0, -1)),
        Command(("ZRANGE", keys.limited, 0, -1)),
        Command(("HKEYS", keys.key_active)),
    ))
    n_waiting = int(in_set) + int(listed)
    ids = yield from _wait_page(keys, int(before), int(listed), offset,
                                None if limit is None else end)
    key_order = [key.decode() for key in dict.fromkeys([*ready, *limited, *sorted(busy)])]
    if offset:
        # Past the wait set's jobs, the keyed turns start at offset - (jobs in the wait set).
        rest = None if limit is None else limit - len(ids)
        if key_order and (rest is None or rest > 0):
            ids += yield from _keyed_page(keys, key_order, max(0, offset - int(n_waiting)),
                                          rest)
        return ids
    if limit is not None and len(ready) >= limit - len(ids):
        # Every ready key has a waiting job, so the first turn over them fills the list.
        key_order = key_order[:max(0, limit - len(ids))]
    if key_order:
        lists = yield Batch(tuple(Command(("LRANGE", keys.key_list(key), 0, end))
                                  for key in key_order))
        ids += [member.decode() for turn in zip_longest(*lists) for member in turn
                if member is not None]
    return ids if limit is None else ids[:limit]


def _keyed_page(keys: QueueKeys, key_order: list[str], skip: int, limit: int | None
                ) -> Op[list[str]]:
    """Jobs ``skip`` to ``skip + limit`` of the keyed turns over ``key_order``: turn ``r``
    takes the ``r``-th job of every key that has more than ``r`` (the claim's round robin).

    From the lists' lengths alone (one LLEN per key) this finds the turn the page starts in,
    then reads only the part of each list the page covers: O(keys + limit) however deep.
    """
    lengths = yield Batch(tuple(Command(("LLEN", keys.key_list(key))) for key in key_order))
    length = {key: int(n) for key, n in zip(key_order, lengths, strict=True)}
    ascending = sorted(length.values())
    below = [0]  # below[i]: the jobs of the i shortest lists
    for n in ascending:
        below.append(below[-1] + n)

    def before(turn: int) -> int:
        """How many jobs the turns before ``turn`` hold."""
        shorter = bisect_left(ascending, turn)  # lists used up before that turn
        return below[shorter] + turn * (len(ascending) - shorter)

    if skip >= below[-1]:
        return []
    low, high = 0, ascending[-1]  # the last turn whose start is at or before skip
    while low < high:
        middle = (low + high + 1) // 2
        if before(middle) <= skip:
            low = middle
        else:
            high = middle - 1
    turn, position = low, before(low)
    stop = below[-1] if limit is None else min(below[-1], skip + limit)
    taken: list[tuple[str, int]] = []  # (key, index in its list), in page order
    live = [key for key in key_order if length[key] > turn]
    while position < stop and live:
        for key in live:
            if skip <= position < stop:
                taken.append((key, turn))
            position += 1
            if position >= stop:
                break
        turn += 1
        live = [key for key in live if length[key] > turn]
    spans: dict[str, tuple[int, int]] = {}
    for key, index in taken:
        first, _ = spans.get(key, (index, index))
        spans[key] = (first, index)
    lists = yield Batch(tuple(Command(("LRANGE", keys.key_list(key), first, last))
                              for key, (first, last) in spans.items()))
    members = {key: [m.decode() for m in found]
               for key, found in zip(spans, lists, strict=True)}
    ids = []
    for key, index in taken:
        found = members[key]
        if index - spans[key][0] < len(found):  # a list that shrank meanwhile
            ids.append(found[index - spans[key][0]])
    return ids


def list_jobs(keys: QueueKeys, state: JobState | str, limit: int = 100, offset: int = 0
              ) -> Op[list[JobInfo]]:
    """Up to ``limit`` jobs in ``state`` after the first ``offset``, in :func:`list_ids`'
    order (jobs that leave the state while they are read are left out)."""
    try:
        state = JobState(state)
    except ValueError:
        raise ConfigError(f"unknown job state {state!r} (one of: "
                          f"{', '.join(s.value for s in JobState)})") from None
    check_int(limit, "limit", low=1)
    check_int(offset, "offset", low=0)
    ids = yield from list_ids(keys, state, limit, offset)
    jobs = yield from read_jobs(keys, ids, states=(state,))
    return jobs
