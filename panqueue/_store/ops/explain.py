"""Why a job is where it is (``client.explain``): the job, its queue's settings, its place in
line, its dependencies, the rate limit and the worker registry, read from Redis and turned into
one reason and a sentence a person can act on.

This module holds every word of an explanation. What holds a waiting or delayed job comes from
``lua/explain.lua`` as a structured answer; the facts a person acts on travel with the words
(``Explanation.holders``: the jobs that hold the slots, and since when; ``due_at``;
``retry_of``; ``action``). A hint names the tool in use (``tool``): the client's Python call,
the command to type, or the dashboard's button; :data:`_HINTS` holds each one's words.

Longer than 400 lines by the table of words (``_HINTS``): each reason is said once per tool
(Python, CLI, dashboard) here, so that no caller rewrites them.
"""

from __future__ import annotations

import io
import shlex
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

import msgpack

from panqueue._codec import decode
from panqueue._durable import FOREVER_MS
from panqueue._job import ErrorInfo, JobState, from_ms
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.jobs import failed_attempt
from panqueue._store.ops.workers import WorkerInfo, workers
from panqueue._store.tokens import parse_lock_token
from panqueue._store.transport import Batch, Command, Op, ScriptCall
from panqueue.errors import ConfigError, JobNotFound

__all__ = ["Action", "Explanation", "Reason", "SlotHolder", "Tool", "explain"]

Reason = Literal["paused", "delayed", "signal", "snoozed", "blocked", "rate_limited", "key_busy",
                 "queued", "no_worker", "running", "finished", "expired"]
#: What a person can do about the job: resume its queue, retry it (a failed job), start a
#: worker (none serves the queue).
Action = Literal["resume", "retry", "start_worker"]
#: Who reads the explanation: a program (the client's Python calls), a person at a terminal
#: (``panqueue`` commands), or one in the dashboard (its buttons).
Tool = Literal["python", "cli", "dashboard"]

# How many running jobs explain looks through for those that hold a busy key.
_ACTIVE_SCAN = 1000
# How many of the jobs that hold the slots the detail names (``holders`` has them all).
_NAMED_HOLDERS = 5

# The one place a hint's words are written, for each tool: {queue} and {job} are filled in
# (quoted for a shell in the terminal's commands).
# {prefix} is "--prefix P " under a key prefix P (the commands act on that application's
# queues), else empty.
_HINTS: dict[str, dict[Tool, str]] = {
    "resume": {"python": "client.resume", "cli": "panqueue resume {prefix}{queue}",
               "dashboard": "the Resume button below"},
    "retry": {"python": "client.retry_failed",
              "cli": "panqueue dlq {prefix}{queue} --retry {job}",
              "dashboard": "the Retry button below"},
    "start_worker": {"python": "panqueue worker {prefix}", "cli": "panqueue worker {prefix}",
                     "dashboard": "panqueue worker {prefix}"},
    "batch": {"python": ": client.batch", "cli": "", "dashboard": ""},
    "signal": {"python": "client.signal({queue!r}, {job!r}, {name!r}, ...)",
               "cli": "panqueue signal {prefix}{queue} {job} {name} [JSON]",
               "dashboard": "panqueue signal {prefix}{queue} {job} {name} [JSON]"},
}


@dataclass(frozen=True, slots=True)
class SlotHolder:
    """A running job that holds a slot the explained job waits for: which worker runs it
    (None when no live worker names it), since when, and for how long (seconds, by the
    server's clock)."""

    job_id: str
    worker: str | None
    started_at: datetime | None
    running_for: float | None


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why job ``id`` is in ``state``: ``reason`` in one word, ``detail`` in a sentence (until
    when, behind how many jobs, which dependency, which worker holds it).

    The facts the sentence names, for a program: ``holders``, the running jobs that hold the
    slots it waits for (every slot of the queue's live workers, or its key's); ``due_at``, when
    a delayed job is due; ``retry_of``, for a retry waiting out its backoff, the attempt it
    follows (whose error is ``error``) and ``max_attempts``; ``action``, what a person can do
    about it.
    """

    state: JobState
    reason: Reason
    detail: str
    holders: tuple[SlotHolder, ...] = ()
    due_at: datetime | None = None
    retry_of: int | None = None
    max_attempts: int | None = None
    error: ErrorInfo | None = None
    action: Action | None = None


class _Words:
    """The hints for one tool and one job."""

    def __init__(self, tool: Tool, queue: str, job_id: str, prefix: str | None = None) -> None:
        if tool not in ("python", "cli", "dashboard"):
            raise ConfigError(f"tool must be 'python', 'cli' or 'dashboard', got {tool!r}")
        self.tool = tool
        # The terminal's commands, and those the dashboard names, are typed into a shell.
        self._quote = str if tool == "python" else shlex.quote
        self._fill = {"queue": self._quote(queue), "job": self._quote(job_id),
                      "prefix": f"--prefix {self._quote(prefix)} " if prefix else ""}

    def __call__(self, action: str, **more: str) -> str:
        return _HINTS[action][self.tool].format(
            **self._fill, **{name: self._quote(value) for name, value in more.items()}).strip()


def _at(ms: bytes | int | float | None) -> str:
    when = from_ms(None if ms is None else int(float(ms)))
    return "an unknown time" if when is None else _fmt(when)


def _fmt(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def explain(keys: QueueKeys, job_id: str, tool: Tool = "python", prefix: str | None = None
            ) -> Op[Explanation]:
    """Read the job and what holds it, and say why it is where it is (:class:`JobNotFound` if
    there is no such job); a job of a batch says which. ``tool``: whose words the hints use;
    ``prefix``: the client's key prefix, which the commands a hint names must be given."""
    words = _Words(tool, keys.name, job_id, prefix)
    explanation = yield from _why(keys, job_id, words)
    batch = yield Command(("HGET", keys.job(job_id), "b"))
    if batch is None:
        return explanation
    return replace(explanation, detail=f"{explanation.detail} (a job of batch "
                   f"{batch.decode()}{words('batch')})")


def _why(keys: QueueKeys, job_id: str, words: _Words, again: bool = True
         ) -> Op[Explanation]:
    jkey = keys.job(job_id)
    fields = yield Command(("HMGET", jkey, "s", "ft", "fr", "k", "dx", "tk", "x", "ra"))
    if fields[0] is None:
        raise JobNotFound(keys.name, job_id)
    state = JobState(fields[0].decode())
    if state.is_final:
        return _finished(state, fields[1], fields[2], words)
    if state is JobState.BLOCKED:
        return (yield from _blocked(keys, job_id, fields[4], fields[6], fields[7]))
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
        return (yield from _moved(keys, job_id, verdict[1].decode(), words, again))
    if kind not in ("delayed", "signal", "paused", "paused_until") and \
            verdict[-1] != b"delayed":
        state = JobState.WAITING  # a due delayed job: the script moved it, as a claim would
    return (yield from _held(keys, job_id, state, kind, verdict[1:], live, words))


def _moved(keys: QueueKeys, job_id: str, now: str, words: _Words, again: bool
           ) -> Op[Explanation]:
    """The script found the job in another state than the one read just before (``now``; ''
    when it is gone), or a due delayed job that no claim moves yet."""
    if now == JobState.DELAYED.value:
        # Due, behind more due jobs than one claim moves to waiting (lib/waiting.lua
        # promote_due): no claim takes it before those.
        return Explanation(JobState.DELAYED, "delayed", "due, behind other due jobs that "
                           "claims and upkeep move to waiting first; it follows them")
    if again:  # it moved while it was read: explain where it is now
        return (yield from _why(keys, job_id, words, again=False))
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
          live: list[WorkerInfo], words: _Words) -> Op[Explanation]:
    """The words for the answer of lua/explain.lua (its header lists the answers)."""
    if kind == "delayed":
        history, error = yield Command(("HMGET", keys.job(job_id), "h", "e"))
        last = _last_entry(history)
        due = from_ms(int(args[0]))
        if last.get("type") == "Snoozed":
            return Explanation(state, "snoozed", f"snoozed by its handler until "
                               f"{_at(args[0])} (attempt {last.get('attempt')} raised "
                               "Snooze; no attempt used); it moves to waiting then",
                               due_at=due)
        if last.get("type") == "Suspended":
            return Explanation(state, "delayed", f"sleeping (job.sleep) until {_at(args[0])}, "
                               "holding no slot; it moves to waiting then and its handler "
                               "runs again from the top, its steps replayed", due_at=due)
        failed = ErrorInfo.from_wire(decode(error)) if error else None
        if failed is not None and failed_attempt(last):
            return _retry(state, last, failed, args[0], due)
        return Explanation(state, "delayed", f"delayed until {_at(args[0])}; it moves to "
                           "waiting then (a worker's upkeep promotes it)", due_at=due)
    if kind == "signal":
        name, timeout = args[0].decode(errors="replace"), int(args[1])
        forever = timeout >= FOREVER_MS
        until = "with no timeout" if forever else f"until its timeout at {_at(timeout)}"
        return Explanation(state, "signal", f"waits for signal {name!r} (job.wait_for) {until},"
                           f" holding no slot; {words('signal', name=name)} makes it waiting",
                           due_at=None if forever else from_ms(timeout))
    if kind == "paused":
        return Explanation(state, "paused", f"queue {keys.name!r} is paused; "
                           f"resume it ({words('resume')}) and workers will claim the job",
                           action="resume")
    if kind == "paused_until":
        return Explanation(state, "rate_limited", "a handler raised RateLimited: queue "
                           f"{keys.name!r} starts no job until {_at(args[0])} "
                           f"({words('resume')} ends the pause now)", action="resume")
    if kind == "rate":
        return Explanation(state, "rate_limited", "the queue's rate limit "
                           f"({_limit(*args[1:4])}) is used up until {_at(args[0])}")
    if kind == "expired":
        return _expired(state, args[0], claimable=len(args) == 1)
    if kind == "key_limited":
        return Explanation(state, "rate_limited", f"key {args[0].decode()!r} is rate limited "
                           f"until {_at(args[1])} (its rate limit is used up, or a handler "
                           "of the key raised RateLimited)")
    if kind == "key_busy":
        return (yield from _key_busy(keys, args[0].decode(), int(args[1]), int(args[2]),
                                     int(args[3]), live))
    if kind == "key_unready":
        return Explanation(state, "key_busy", f"key {args[0].decode()!r} is not among the "
                           "keys ready to start a job, though neither its limit nor its rate "
                           "holds it: no claim takes it until a job of the key changes")
    if kind == "rate_room":
        return _room(state, f"the queue's rate limit ({_limit(*args[2:5])})", int(args[1]),
                     int(args[0]), "")
    if kind == "key_rate_room":
        return _room(state, f"key {args[0].decode()!r}'s rate limit ({_limit(*args[3:6])})",
                     int(args[2]), int(args[1]), " of the key")
    ahead, partitions, key = int(args[0]), int(args[1]), args[2].decode()
    before = int(args[3]) if len(args) > 3 else ahead
    if partitions > 1:
        shared = yield from _shared_window(keys, state, partitions, before)
        if shared is not None:
            return shared
    if not live:
        return Explanation(state, "no_worker", f"no live worker serves queue {keys.name!r}; "
                           f"start one ({words('start_worker')}) to run the job",
                           action="start_worker")
    # A worker an operator paused (client.control(name, "pause")) claims nothing.
    claiming = [w for w in live if not w.paused]
    if not claiming:
        names = ", ".join(sorted({w.name for w in live}))
        return Explanation(state, "no_worker", f"every live worker of queue {keys.name!r} is "
                           f"paused by an operator ({names}): none claims; resume one "
                           "(panqueue workers --resume NAME) or start another "
                           f"({words('start_worker')})", action="start_worker")
    live = claiming
    if key:
        return Explanation(state, "queued", f"waiting behind {ahead} job{'s' * (ahead != 1)} "
                           f"of key {key!r}")
    return (yield from _queued(keys, state, ahead, live))


def _shared_window(keys: QueueKeys, state: JobState, partitions: int, ahead: int
                   ) -> Op[Explanation | None]:
    """A partitioned queue's global rate limit: one window outside every partition, which the
    workers take starts from before they claim (lua/rate_take.lua). Asked with the same script,
    wanting no start: None when it has room for the job and the ``ahead`` jobs before it in its
    partition (or the queue has no such limit)."""
    saved = yield Command(("GET", keys.shared_rate + ":limit"))  # rate_take.lua keeps it there
    if saved is None:
        return None
    limit, per = (int(part) for part in saved.split(b":", 1))
    _, wake_in, _, room = yield ScriptCall(SCRIPTS.rate_take, (keys.shared_rate,),
                                           (0, limit, per, "explain"))
    window = (f"the queue's rate limit ({limit} starts per {per / 1000:g} s, one window for "
              f"its {partitions} partitions)")
    if int(wake_in) < 0:
        return None if int(room) > ahead else _room(state, window, int(room), ahead,
                                                     " of its partition")
    seconds, micros = yield Command(("TIME",))
    free_at = int(seconds) * 1000 + int(micros) // 1000 + int(wake_in)
    return Explanation(state, "rate_limited", f"{window} is used up until {_at(free_at)}")


def _room(state: JobState, window: str, room: int, ahead: int, of: str) -> Explanation:
    """A rate ``window`` (in words) with room for fewer starts than the ``ahead`` jobs (``of``
    which: its key, its partition) that start before the job."""
    return Explanation(state, "rate_limited", f"{window} has room for {room} more "
                       f"start{'s' * (room != 1)} now, and {ahead} job{'s' * (ahead != 1)}"
                       f"{of} start before it")


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


def _retry(state: JobState, last: dict[Any, Any], error: ErrorInfo, due_ms: Any,
           due: datetime | None) -> Explanation:
    """A retry waiting out its backoff: which attempt comes next, of how many, after which
    error, and when."""
    attempt = int(last.get("attempt") or 0)
    allowed = last.get("max_attempts")
    of = f" of {int(allowed)}" if allowed else ""
    message = error.message if len(error.message) <= 200 else error.message[:199] + "…"
    return Explanation(state, "delayed", f"retry {attempt + 1}{of} after {error.type}: "
                       f"{message}, due at {_at(due_ms)}; it moves to waiting then",
                       due_at=due, retry_of=attempt,
                       max_attempts=int(allowed) if allowed else None, error=error)


def _finished(state: JobState, finished_ms: bytes | None, reason: bytes | None,
              words: _Words) -> Explanation:
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
        return Explanation(state, "finished", f"failed at {when} ({why}); retry it with "
                           f"{words('retry')}, after fixing what its error says",
                           action="retry")
    return Explanation(state, "finished", how)


def _expired(state: JobState, deadline_ms: Any, claimable: bool = False) -> Explanation:
    """A job past its deadline to start; ``claimable``: it waits, so a claim ends it as well
    as the expiry sweep."""
    who = "the next claim or the expiry sweep" if claimable else "the expiry sweep"
    return Explanation(state, "expired", f"its deadline to start passed at "
                       f"{_at(deadline_ms)} (add(..., expires=)): it will never run; {who} "
                       "ends it cancelled (expired)")


def _blocked(keys: QueueKeys, job_id: str, dead: bytes | None, deadline: bytes | None,
             run_at: bytes | None) -> Op[Explanation]:
    """A blocked job: past its deadline to start (``deadline``, ms), on a dependency that will
    never complete (``dead``), or on the dependencies it still needs, after which it waits, or
    is delayed until ``run_at`` (ms) if that is still ahead."""
    state = JobState.BLOCKED
    seconds, micros = yield Command(("TIME",))
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    if deadline is not None and int(float(deadline)) <= now_ms:
        return _expired(state, int(float(deadline)))
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
    then = (f"is delayed until {_at(run_at)}" if run_at is not None
            and int(float(run_at)) > now_ms else "moves to waiting")
    return Explanation(state, "blocked", f"blocked on {', '.join(parts)}: it {then} once every "
                       "dependency has completed")


def _slot_holders(keys: QueueKeys, ids: list[str], live: list[WorkerInfo]
                  ) -> Op[tuple[SlotHolder, ...]]:
    """The running jobs ``ids`` as slot holders: the live worker that runs each (from the
    workers' view, which reads the jobs' lock tokens) and since when, longest running first."""
    if not ids:
        return ()
    replies = yield Batch((Command(("TIME",)),
                           *(Command(("HGET", keys.job(i), "st")) for i in ids)))
    seconds, micros = replies[0]
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    by_job = {j: w.name for w in live for j in w.running}
    found = []
    for job_id, started in zip(ids, replies[1:], strict=True):
        started_ms = None if started is None else int(float(started))
        found.append(SlotHolder(job_id, by_job.get(job_id), from_ms(started_ms),
                                None if started_ms is None
                                else max(0.0, (now_ms - started_ms) / 1000)))
    return tuple(sorted(found, key=lambda h: -(h.running_for or 0.0)))


def _held_by(holders: tuple[SlotHolder, ...]) -> str:
    """The jobs that hold the slots, in words: each with its worker and how long it has run,
    the longest running first."""
    if not holders:
        return "jobs no live worker reports"
    parts = []
    for h in holders[:_NAMED_HOLDERS]:
        how_long = "" if h.running_for is None else f" for {_duration(h.running_for)}"
        where = f" on {h.worker}" if h.worker else ""
        parts.append(f"job {h.job_id} (running{how_long}{where})")
    more = len(holders) - _NAMED_HOLDERS
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def _key_busy(keys: QueueKeys, key: str, running: int, ahead: int, kc: int,
              live: list[WorkerInfo]) -> Op[Explanation]:
    """Key ``key`` runs ``kc`` jobs at a time: ``running`` run and ``ahead`` of its jobs wait
    before this one, which fills them."""
    state = JobState.WAITING
    ids: list[str] = []
    if running:
        active = yield Command(("ZRANGE", keys.active, 0, _ACTIVE_SCAN - 1))
        scanned = [m.decode() for m in active]
        owners = yield Batch(tuple(Command(("HGET", keys.job(i), "k")) for i in scanned))
        ids = [i for i, k in zip(scanned, owners, strict=True) if k is not None
               and k.decode() == key]
    holders = yield from _slot_holders(keys, ids, live)
    held = _held_by(holders)
    if not ahead:
        return Explanation(state, "key_busy", f"key {key!r} is at its concurrency limit "
                           f"({kc}): held by {held}; it runs when one finishes",
                           holders=holders)
    running_now = f"{running} running ({held}) and " if running else ""
    return Explanation(state, "key_busy", f"key {key!r} runs {kc} job{'s' * (kc != 1)} at a "
                       f"time, and its slots go to {running_now}{ahead} waiting before this "
                       "one; it runs when those have started and a slot frees",
                       holders=holders)


def _queued(keys: QueueKeys, state: JobState, ahead: int, live: list[WorkerInfo]
            ) -> Op[Explanation]:
    capacity = sum(w.concurrency for w in live)
    running = [j for w in live for j in w.running]
    served = (f"{len(live)} live worker{'s' * (len(live) != 1)} with {capacity} "
              f"slot{'s' * (capacity != 1)} in all serve{'s' * (len(live) == 1)} the queue")
    behind = f"waiting behind {ahead} job{'s' * (ahead != 1)}"
    blocked = [w for w in live if w.loop_blocked_since is not None]
    if blocked and len(blocked) == len(live):
        # Each one's event loop is blocked: none claims until its loop turns again.
        since = min(w.loop_blocked_since for w in blocked if w.loop_blocked_since is not None)
        served += (f", but the event loop of {'each' if len(live) > 1 else 'its worker'} has "
                   f"been blocked since {_fmt(since)} (a handler running blocking code on it: "
                   "use executor='thread' for such code): nothing is claimed until it turns")
    if len(running) < capacity:
        return Explanation(state, "queued", f"{behind}; {served}")
    holders = yield from _slot_holders(keys, running, live)
    return Explanation(state, "queued", f"{behind}; {served}, all of them taken, by "
                       f"{_held_by(holders)}: a claim takes it when one frees",
                       holders=holders)
