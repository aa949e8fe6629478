"""Why a job is where it is (``client.explain``): the job, its queue's settings, its place in
line, its dependencies, the rate limit and the worker registry, read from Redis and turned into
one reason and a sentence a person can act on."""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

import msgpack

from panqueue._job import JobState, from_ms
from panqueue._keys import QueueKeys
from panqueue._store.ops.rate import effective_rate_limit
from panqueue._store.ops.workers import WorkerInfo, workers
from panqueue._store.transport import Batch, Command, Op
from panqueue.errors import JobNotFound

__all__ = ["Explanation", "Reason", "explain"]

Reason = Literal["paused", "delayed", "snoozed", "blocked", "rate_limited", "key_busy", "queued",
                 "no_worker", "running", "finished", "expired"]

# How many running jobs explain looks through for those that hold a busy key.
_ACTIVE_SCAN = 1000


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why job ``id`` is in ``state``: ``reason`` in one word, ``detail`` in a sentence (until
    when, behind how many jobs, which dependency, which worker holds it)."""

    state: JobState
    reason: Reason
    detail: str


def _at(ms: bytes | int | float | None) -> str:
    when = from_ms(None if ms is None else int(float(ms)))
    return "an unknown time" if when is None else _fmt(when)


def _fmt(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def explain(keys: QueueKeys, job_id: str) -> Op[Explanation]:
    """Read the job and what holds it, and say why it is where it is (:class:`JobNotFound` if
    there is no such job); a job of a batch says which."""
    explanation = yield from _why(keys, job_id)
    batch = yield Command(("HGET", keys.job(job_id), "b"))
    if batch is None:
        return explanation
    return replace(explanation, detail=f"{explanation.detail} (a job of batch "
                   f"{batch.decode()}: client.batch)")


def _why(keys: QueueKeys, job_id: str) -> Op[Explanation]:
    jkey = keys.job(job_id)
    fields, meta, time_reply = yield Batch((
        Command(("HMGET", jkey, "s", "ft", "fr", "k", "dx", "tk")),
        Command(("HMGET", keys.meta, "paused", "mode", "kc", "rlm", "rlp", "rlk", "pu")),
        Command(("TIME",)),
    ))
    if fields[0] is None:
        raise JobNotFound(keys.name, job_id)
    state = JobState(fields[0].decode())
    now = int(time_reply[0]) * 1000 + int(time_reply[1]) // 1000
    if state.is_final:
        return _finished(state, fields[1], fields[2])
    if state is JobState.DELAYED:
        due, history = yield Batch((Command(("ZSCORE", keys.delayed, job_id)),
                                    Command(("HGET", jkey, "h"))))
        last = _last_entry(history)
        if last.get("type") == "Snoozed":
            return Explanation(state, "snoozed", f"snoozed by its handler until {_at(due)} "
                               f"(attempt {last.get('attempt')} raised Snooze; no attempt "
                               "used); it moves to waiting then")
        return Explanation(state, "delayed", f"delayed until {_at(due)}; it moves to waiting "
                           "then (a worker's upkeep promotes it)")
    if state is JobState.BLOCKED:
        return (yield from _blocked(keys, job_id, fields[4]))
    live = yield from workers(keys)
    if state is JobState.ACTIVE:
        deadline = yield Command(("ZSCORE", keys.active, job_id))
        holder = next((w for w in live if job_id in w.running), None)
        if holder is None and fields[5] is not None:
            # Between two beats a newly claimed job is not in its worker's record yet; its
            # lock token names the worker ("<worker name>:<random>:<n>", _runtime/locks.py).
            owner = fields[5].decode().rsplit(":", 2)[0]
            holder = next((w for w in live if w.name == owner), None)
        if holder is not None and holder.loop_blocked_since is not None:
            return Explanation(state, "running", f"running on worker {holder.name} "
                               f"(pid {holder.pid} on {holder.host}), alive, but its event "
                               "loop has been blocked since "
                               f"{_fmt(holder.loop_blocked_since)} (a handler running blocking "
                               "code on it: use executor='thread' for such code); its "
                               f"watchdog keeps the lock, whose deadline is {_at(deadline)}")
        if holder is not None:
            return Explanation(state, "running", f"running on worker {holder.name} "
                               f"(pid {holder.pid} on {holder.host}); its lock deadline is "
                               f"{_at(deadline)}")
        return Explanation(state, "running", "running, lock deadline "
                           f"{_at(deadline)}; no live worker reports it: if its worker died, "
                           "the stalled sweep puts it back to waiting after that deadline")
    paused, mode, kc, rate_max, rate_per, rate_per_key, paused_until = meta
    if paused is not None:
        return Explanation(state, "paused", f"queue {keys.name!r} is paused; "
                           "resume it (client.resume) and workers will claim the job")
    if paused_until is not None and int(paused_until) > now and mode != b"keyed":
        return Explanation(state, "rate_limited", "a handler raised RateLimited: queue "
                           f"{keys.name!r} starts no job until {_at(paused_until)} "
                           "(client.resume ends the pause now)")
    if not live:
        return Explanation(state, "no_worker", f"no live worker serves queue {keys.name!r}; "
                           "start one (panqueue worker) to run the job")
    keyed = mode == b"keyed"
    rate_max_n = int(rate_max or 0)
    if rate_max_n > 0 and rate_per_key != b"1":
        window = int(rate_per or 0)
        limit = (yield from effective_rate_limit(keys)) or rate_max_n  # adaptive: maybe lower
        # The claim drops the starts at or before now - window (lib/rate.lua).
        since = f"({now - window}"
        used = int((yield Command(("ZCOUNT", keys.rate, since, "+inf"))))
        # The next start waits until enough starts leave the window to go below the limit.
        leaving = [] if used < limit else (yield Command((
            "ZRANGEBYSCORE", keys.rate, since, "+inf", "LIMIT", used - limit, 1)))
        if leaving:
            started = yield Command(("ZSCORE", keys.rate, leaving[0]))
            free_at = int(float(started)) + window
            cut = f", cut from {rate_max_n} by RateLimited" if limit < rate_max_n else ""
            return Explanation(state, "rate_limited", f"the queue's rate limit ({limit} "
                               f"starts per {window / 1000:g} s{cut}) is used up until "
                               f"{_at(free_at)}")
    if keyed:
        return (yield from _keyed(keys, job_id, fields[3], int(kc or 1)))
    ahead = yield Command(("ZRANK", keys.wait, job_id))
    return _queued(state, int(ahead or 0), live)


def _last_entry(history: bytes | None) -> dict[Any, Any]:
    """The newest entry of a job's history (what the last attempt or snooze recorded)."""
    last: Any = {}
    if history:
        try:
            for entry in msgpack.Unpacker(io.BytesIO(history), raw=False,
                                          strict_map_key=False):
                last = entry
        except ValueError:  # a damaged history: say what the state alone says
            return {}
    return last if isinstance(last, dict) else {}


def _finished(state: JobState, finished_ms: bytes | None, reason: bytes | None) -> Explanation:
    when = _at(finished_ms)
    if state is JobState.COMPLETED:
        how = f"completed at {when}"
    elif state is JobState.CANCELLED and reason == b"expired":
        return Explanation(state, "expired", f"expired at {when}: it had not started by its "
                           "deadline (add(..., expires=)), so it never ran")
    elif state is JobState.CANCELLED:
        how = f"cancelled at {when}"
    else:
        why = reason.decode() if reason else "error"
        how = (f"failed at {when} ({why}); retry it with client.retry_failed, after fixing "
               "what its error says")
    return Explanation(state, "finished", how)


def _blocked(keys: QueueKeys, job_id: str, dead: bytes | None) -> Op[Explanation]:
    state = JobState.BLOCKED
    if dead is not None:
        return Explanation(state, "blocked", f"blocked on job {dead.decode()}, which was "
                           "cancelled or deleted: it can never run; cancel or remove it")
    needs = yield Command(("SMEMBERS", keys.needs(job_id)))
    deps = sorted(member.decode() for member in needs)
    if not deps:
        return Explanation(state, "blocked", "blocked, with no dependency left to wait for")
    dep_states = yield Batch(tuple(Command(("HGET", keys.job(d), "s")) for d in deps))
    parts = [f"job {d} ({s.decode() if s else 'gone'})" for d, s in zip(deps, dep_states,
                                                                         strict=True)]
    return Explanation(state, "blocked", f"blocked on {', '.join(parts)}: it moves to waiting "
                       "once every dependency has completed")


def _keyed(keys: QueueKeys, job_id: str, key_raw: bytes | None, kc: int) -> Op[Explanation]:
    state = JobState.WAITING
    key = key_raw.decode() if key_raw else ""
    running, limited, position = yield Batch((
        Command(("HGET", keys.key_active, key)),
        Command(("ZSCORE", keys.limited, key)),
        Command(("LPOS", keys.key_list(key), job_id)),
    ))
    if limited is not None:
        return Explanation(state, "rate_limited", f"key {key!r} is rate limited until "
                           f"{_at(limited)} (its rate limit is used up, or a handler of the "
                           "key raised RateLimited)")
    if int(running or 0) >= kc:
        active = yield Command(("ZRANGE", keys.active, 0, _ACTIVE_SCAN - 1))
        ids = [m.decode() for m in active]
        owners = yield Batch(tuple(Command(("HGET", keys.job(i), "k")) for i in ids))
        holders = [i for i, k in zip(ids, owners, strict=True) if k is not None
                   and k.decode() == key]
        return Explanation(state, "key_busy", f"key {key!r} is at its concurrency limit "
                           f"({kc}): held by job{'s' if len(holders) != 1 else ''} "
                           f"{', '.join(holders) or '(unknown)'}; it runs when one finishes")
    ahead = int(position or 0)
    return Explanation(state, "queued", f"waiting behind {ahead} job{'s' * (ahead != 1)} "
                       f"of key {key!r}")


def _queued(state: JobState, ahead: int, live: list[WorkerInfo]) -> Explanation:
    capacity = sum(w.concurrency for w in live)
    return Explanation(state, "queued", f"waiting behind {ahead} job{'s' * (ahead != 1)}; "
                       f"{len(live)} live worker{'s' * (len(live) != 1)} with {capacity} "
                       f"slot{'s' * (capacity != 1)} in all serve{'s' * (len(live) == 1)} "
                       "the queue")
