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
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.workers import WorkerInfo, workers
from panqueue._store.tokens import parse_lock_token
from panqueue._store.transport import Batch, Command, Op, ScriptCall
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


def _why(keys: QueueKeys, job_id: str, again: bool = True) -> Op[Explanation]:
    jkey = keys.job(job_id)
    fields = yield Command(("HMGET", jkey, "s", "ft", "fr", "k", "dx", "tk"))
    if fields[0] is None:
        raise JobNotFound(keys.name, job_id)
    state = JobState(fields[0].decode())
    if state.is_final:
        return _finished(state, fields[1], fields[2])
    if state is JobState.BLOCKED:
        return (yield from _blocked(keys, job_id, fields[4]))
    live = yield from workers(keys)
    if state is JobState.ACTIVE:
        deadline = yield Command(("ZSCORE", keys.active, job_id))
        holder = next((w for w in live if job_id in w.running), None)
        if holder is None and fields[5] is not None:
            # Between two beats a newly claimed job is not in its worker's record yet; its
            # lock token names the worker.
            owner = parse_lock_token(fields[5].decode())
            holder = next((w for w in live if owner and w.name == owner.worker), None)
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
    # Waiting or delayed: what holds it is what holds the claim, so the server answers with the
    # claim's own rules (lua/explain.lua); only the words are written here.
    verdict = yield ScriptCall(SCRIPTS.explain, (keys.prefix,), (job_id,))
    kind = verdict[0].decode()
    if kind == "state":
        return (yield from _moved(keys, job_id, verdict[1].decode(), again))
    if kind not in ("delayed", "paused", "paused_until"):
        state = JobState.WAITING  # a due delayed job: the script moved it, as a claim would
    return (yield from _held(keys, job_id, state, kind, verdict[1:], live))


def _moved(keys: QueueKeys, job_id: str, now: str, again: bool) -> Op[Explanation]:
    """The script found the job in another state than the one read just before (``now``; ''
    when it is gone), or a due delayed job that no claim moves yet."""
    if now == JobState.DELAYED.value:
        # Due, behind more due jobs than one claim moves to waiting (lib/waiting.lua
        # promote_due): no claim takes it before those.
        return Explanation(JobState.DELAYED, "delayed", "due, behind other due jobs that "
                           "claims and upkeep move to waiting first; it follows them")
    if again:  # it moved while it was read: explain where it is now
        return (yield from _why(keys, job_id, again=False))
    if not now:
        raise JobNotFound(keys.name, job_id)
    state = JobState(now)
    reason: Reason = ("running" if state is JobState.ACTIVE else "blocked"
                      if state is JobState.BLOCKED else "finished" if state.is_final
                      else "queued")
    return Explanation(state, reason, f"it changed state twice while it was read, now "
                       f"{state.value}; ask again")


def _limit(limit: Any, per: Any, maximum: Any) -> str:
    """The rate limit in force, in words: "<n> starts per <s> s", and by how much a handler's
    RateLimited has cut an adaptive one."""
    cut = f", cut from {int(maximum)} by RateLimited" if int(limit) < int(maximum) else ""
    return f"{int(limit)} starts per {int(per) / 1000:g} s{cut}"


def _held(keys: QueueKeys, job_id: str, state: JobState, kind: str, args: list[Any],
          live: list[WorkerInfo]) -> Op[Explanation]:
    """The words for the answer of lua/explain.lua (its header lists the answers)."""
    if kind == "delayed":
        history = yield Command(("HGET", keys.job(job_id), "h"))
        last = _last_entry(history)
        if last.get("type") == "Snoozed":
            return Explanation(state, "snoozed", f"snoozed by its handler until "
                               f"{_at(args[0])} (attempt {last.get('attempt')} raised "
                               "Snooze; no attempt used); it moves to waiting then")
        return Explanation(state, "delayed", f"delayed until {_at(args[0])}; it moves to "
                           "waiting then (a worker's upkeep promotes it)")
    if kind == "paused":
        return Explanation(state, "paused", f"queue {keys.name!r} is paused; "
                           "resume it (client.resume) and workers will claim the job")
    if kind == "paused_until":
        return Explanation(state, "rate_limited", "a handler raised RateLimited: queue "
                           f"{keys.name!r} starts no job until {_at(args[0])} "
                           "(client.resume ends the pause now)")
    if kind == "rate":
        return Explanation(state, "rate_limited", "the queue's rate limit "
                           f"({_limit(*args[1:4])}) is used up until {_at(args[0])}")
    if kind == "expired":
        return Explanation(state, "expired", f"its deadline to start passed at "
                           f"{_at(args[0])} (add(..., expires=)): it will never run; the "
                           "next claim or the expiry sweep ends it cancelled (expired)")
    if kind == "key_limited":
        return Explanation(state, "rate_limited", f"key {args[0].decode()!r} is rate limited "
                           f"until {_at(args[1])} (its rate limit is used up, or a handler "
                           "of the key raised RateLimited)")
    if kind == "key_busy":
        return (yield from _key_busy(keys, args[0].decode(), int(args[1]), int(args[2]),
                                     int(args[3])))
    if kind == "key_unready":
        return Explanation(state, "key_busy", f"key {args[0].decode()!r} is not among the "
                           "keys ready to start a job, though neither its limit nor its rate "
                           "holds it: no claim takes it until a job of the key changes")
    if kind == "rate_room":
        ahead, room = int(args[0]), int(args[1])
        return Explanation(state, "rate_limited", "the queue's rate limit "
                           f"({_limit(*args[2:5])}) has room for {room} more "
                           f"start{'s' * (room != 1)} now, and {ahead} "
                           f"job{'s' * (ahead != 1)} start before it")
    ahead, partitions, key = int(args[0]), int(args[1]), args[2].decode()
    if partitions > 1:
        shared = yield from _shared_window(keys, state, partitions)
        if shared is not None:
            return shared
    if not live:
        return Explanation(state, "no_worker", f"no live worker serves queue {keys.name!r}; "
                           "start one (panqueue worker) to run the job")
    if key:
        return Explanation(state, "queued", f"waiting behind {ahead} job{'s' * (ahead != 1)} "
                           f"of key {key!r}")
    return _queued(state, ahead, live)


def _shared_window(keys: QueueKeys, state: JobState, partitions: int
                   ) -> Op[Explanation | None]:
    """A partitioned queue's global rate limit: one window outside every partition, which the
    workers take starts from before they claim (lua/rate_take.lua). Asked with the same script,
    wanting no start: None when it has room (or the queue has no such limit)."""
    saved = yield Command(("GET", keys.shared_rate + ":limit"))  # rate_take.lua keeps it there
    if saved is None:
        return None
    limit, per = (int(part) for part in saved.split(b":", 1))
    _, wake_in, _ = yield ScriptCall(SCRIPTS.rate_take, (keys.shared_rate,),
                                     (0, limit, per, "explain"))
    if int(wake_in) < 0:
        return None
    seconds, micros = yield Command(("TIME",))
    free_at = int(seconds) * 1000 + int(micros) // 1000 + int(wake_in)
    return Explanation(state, "rate_limited", f"the queue's rate limit ({limit} starts per "
                       f"{per / 1000:g} s, one window for its {partitions} partitions) is used "
                       f"up until {_at(free_at)}")


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


def _key_busy(keys: QueueKeys, key: str, running: int, ahead: int, kc: int
              ) -> Op[Explanation]:
    """Key ``key`` runs ``kc`` jobs at a time: ``running`` run and ``ahead`` of its jobs wait
    before this one, which fills them."""
    state = JobState.WAITING
    holders: list[str] = []
    if running:
        active = yield Command(("ZRANGE", keys.active, 0, _ACTIVE_SCAN - 1))
        ids = [m.decode() for m in active]
        owners = yield Batch(tuple(Command(("HGET", keys.job(i), "k")) for i in ids))
        holders = [i for i, k in zip(ids, owners, strict=True) if k is not None
                   and k.decode() == key]
    held = f"job{'s' * (len(holders) != 1)} {', '.join(holders) or '(unknown)'}"
    if not ahead:
        return Explanation(state, "key_busy", f"key {key!r} is at its concurrency limit "
                           f"({kc}): held by {held}; it runs when one finishes")
    running_now = f"{running} running ({held}) and " if running else ""
    return Explanation(state, "key_busy", f"key {key!r} runs {kc} job{'s' * (kc != 1)} at a "
                       f"time, and its slots go to {running_now}{ahead} waiting before this "
                       "one; it runs when those have started and a slot frees")


def _queued(state: JobState, ahead: int, live: list[WorkerInfo]) -> Explanation:
    capacity = sum(w.concurrency for w in live)
    busy = sum(len(w.running) for w in live)
    full = (", all of them taken (as of the workers' last heartbeats): a claim takes it when "
            "one frees") if busy >= capacity else ""
    return Explanation(state, "queued", f"waiting behind {ahead} job{'s' * (ahead != 1)}; "
                       f"{len(live)} live worker{'s' * (len(live) != 1)} with {capacity} "
                       f"slot{'s' * (capacity != 1)} in all serve{'s' * (len(live) == 1)} "
                       f"the queue{full}")
