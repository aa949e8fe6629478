"""The worker's transitions, one typed function each: claim, complete a batch, end an attempt
that did not complete its job (failed, snoozed, rate limited by the handler: one value,
:class:`Unfinished`, one function, :func:`end_attempt`), renew, release, report progress, sweep
stalled jobs, promote delayed ones, expire jobs past their deadline to start.

Each function is an operation (a generator a transport drives, like those of ``ops``): it
builds the script's ARGV and turns the reply into named values, so the runtime never sees
either. Statuses are :class:`Status` codes, the same numbers the Lua scripts name. A claimed
job comes out typed: its stored options read (and checked) here, its batch named.

Longer than 400 lines: one short typed function per worker transition, each with the
parsing of its reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from panqueue._codec import decode, encode
from panqueue._job import ErrorInfo
from panqueue._keys import QueueKeys
from panqueue._options import JobOptions
from panqueue._store.loader import SCRIPTS, Script
from panqueue._store.ops import encode_error
from panqueue._store.ops.batches import BATCH_OPTION
from panqueue._store.status import Status
from panqueue._store.transport import Batch, Command, Op, ScriptCall
from panqueue.errors import PanqueueError, PayloadError

__all__ = [
    "Claimed",
    "ClaimedJob",
    "Completion",
    "Failure",
    "Finished",
    "Snoozing",
    "Suspended",
    "Throttled",
    "Unfinished",
    "cancels_requested",
    "claim",
    "complete_batch",
    "durable_record",
    "end_attempt",
    "expire_due",
    "extend",
    "give_back_starts",
    "heartbeat",
    "leave_registry",
    "parse_claim",
    "pause_for",
    "peers",
    "progress",
    "promote",
    "release",
    "step_done",
    "sweep_stalled",
    "take_signal",
    "take_starts",
]

_STALL_ERROR = encode_error(
    ErrorInfo("Stalled", "the job's lock expired too many times (its worker died or hung)"))


# The records of the hot path are plain slotted dataclasses (not frozen: a frozen one costs an
# object.__setattr__ per field on every job).


@dataclass(slots=True)
class ClaimedJob:
    """A job a claim handed to this worker, locked by the claim's token."""

    id: str
    data: bytes  # as stored: decoded by the attempt that runs the job (its failure if it fails)
    attempt: int
    enqueued_at_ms: int
    options: dict[str, Any]  # the job's stored options ({}: none of its own)
    token: str
    partition: int = 0  # of a partitioned queue: where the job is (its scripts run there)
    batch: str = ""  # the batch the job belongs to ('' = none)
    unreadable: str = ""  # why its stored options could not be read ('' = they could)
    first_run: bool = False  # it never ran before: no run has written its durable record

    def job_options(self, defaults: JobOptions) -> JobOptions:
        """``defaults`` (its handler's) overridden by the job's stored options. Options that
        cannot be read raise :class:`PayloadError`: the attempt fails (under ``defaults``),
        and no other job's does."""
        if self.unreadable:
            raise PayloadError(f"the job's stored options cannot be read: {self.unreadable}")
        try:
            return defaults.merged(self.options)
        except (ValueError, TypeError, PanqueueError) as exc:
            raise PayloadError(f"the job's stored options cannot be read: {exc}") from None

    def options_with(self, name: str, value: Any) -> bytes:
        """The job's stored options with option ``name`` set to ``value``, in their stored
        form (for :attr:`Failure.options`)."""
        return encode({**self.options, name: value})


@dataclass(slots=True)
class Claimed:
    """What a claim took. ``wake_in_ms``: when nothing was taken, how long until something may
    be claimable (the next delayed job, a rate limit running out); -1 when unknown."""

    jobs: list[ClaimedJob]
    wake_in_ms: int


@dataclass(slots=True)
class Completion:
    """One successful attempt to record."""

    job_id: str
    token: str
    result: bytes


@dataclass(slots=True)
class Unfinished:
    """An attempt that ended without completing its job, as :func:`end_attempt` records it:
    one subclass per way to end (:class:`Failure`, :class:`Snoozing`, :class:`Throttled`),
    each recorded by a script of its own over the steps they share (lua/lib/ending.lua)."""

    job_id: str
    token: str
    attempt: int
    duration_ms: int
    delay_ms: int  # until the job may run again: the retry delay, the snooze, the pause


@dataclass(slots=True)
class Failure(Unfinished):
    """A failed attempt: retried after ``delay_ms`` while attempts remain, else the job fails."""

    error: ErrorInfo
    max_attempts: int
    final: bool  # never retry (Fail, cancellation)
    reason: str  # the failure reason if this ends the job ('' = attempts ran out)
    options: bytes = b""  # the job's options from now on (b'': unchanged; see _tracing)


@dataclass(slots=True)
class Snoozing(Unfinished):
    """An attempt that snoozed its job (``Snooze``): run it again in ``delay_ms``, no attempt
    used."""


@dataclass(slots=True)
class Throttled(Unfinished):
    """An attempt whose handler raised ``RateLimited``: its key or queue pauses for
    ``delay_ms`` and the job goes back, no attempt used."""


@dataclass(slots=True)
class Suspended(Unfinished):
    """An attempt whose durable handler sleeps (``kind`` "sleep") or waits for a signal
    ("signal", ``name``): the job is DELAYED until then, no attempt used. ``index``: the
    sleep's or the wait's order in the run, by which its wake time or deadline is stored.
    A sleep wakes at ``at_ms`` (ms since the epoch) or, when that is 0, ``delay_ms`` from now;
    a wait times out ``timeout_ms`` after it first began (-1: never)."""

    kind: str
    index: int
    at_ms: int = 0
    timeout_ms: int = -1
    name: str = ""


@dataclass(slots=True)
class Finished:
    """What a complete or fail call did: a status per job, and the jobs it claimed next."""

    statuses: list[Status]
    claimed: Claimed


_STATUS = {status.value: status for status in Status}  # faster than Status(n) on the hot path


def _call(script: Script, keys: QueueKeys, args: Sequence[Any]) -> ScriptCall:
    return ScriptCall(script, (keys.prefix,), tuple(args))


def _claimed_job(reply: list[Any], i: int, token: str, partition: int) -> ClaimedJob:
    """The job whose claim record (id, data, attempt, enqueued_at, options) starts at ``i``.
    The attempt comes as a string when the job never ran before (lua/lib/activate.lua)."""
    attempt = reply[i + 2]
    job = ClaimedJob(reply[i].decode(), reply[i + 1], int(attempt), int(reply[i + 3] or 0),
                     {}, token, partition, first_run=isinstance(attempt, bytes))
    if blob := reply[i + 4]:
        try:
            stored = decode(blob)
        except PayloadError as exc:  # an extension type
            job.unreadable = str(exc)
            return job
        except (ValueError, msgpack.UnpackException) as exc:
            job.unreadable = f"not msgpack ({str(exc) or type(exc).__name__})"
            return job
        if not isinstance(stored, dict):
            job.unreadable = f"not a map ({type(stored).__name__})"
            return job
        job.options = stored
        # A batch's jobs carry it in their options (ops/batches.py, batch_options).
        batch = stored.get(BATCH_OPTION)
        if isinstance(batch, str):
            job.batch = batch
    return job


def parse_claim(reply: list[Any], offset: int = 0, token: str = "", partition: int = 0
                ) -> tuple[list[ClaimedJob], int]:
    """The claim part of a claim / complete / fail reply, from ``offset``: (jobs locked with
    ``token``, wake_in ms or -1)."""
    count = int(reply[offset])
    jobs = [_claimed_job(reply, offset + 2 + 5 * n, token, partition) for n in range(count)]
    return jobs, int(reply[offset + 1])


def _claimed(reply: list[Any], offset: int, token: str, keys: QueueKeys) -> Claimed:
    jobs, wake_in = parse_claim(reply, offset, token, keys.partition)
    return Claimed(jobs, wake_in)


def claim(keys: QueueKeys, token: str, ttl_ms: int, n: int, *,
          withdraw: Sequence[str] = (), idle_ms: int = 0, start_by_ms: int = 0) -> Op[Claimed]:
    """WAITING -> ACTIVE for up to ``n`` jobs, locked with ``token``. The token must be fresh
    for this call: it is also the call's request id, so a resend answers the same jobs.

    ``withdraw``: the tokens of this worker's idle registrations: the call ends them and takes
    over the jobs handed to them meanwhile (counted among the ``n``, locked with ``token``).
    ``idle_ms``: when nothing is claimed, register ``token`` as idle for that long, so that an
    add hands the next job straight to this worker (see lua/lib/handoff.lua; the message is
    read by ``notify.parse_message``).
    ``start_by_ms``: the deadline of the rate-limit starts taken for this claim
    (:func:`take_starts`); a claim that runs after it claims nothing and answers ``wake_in_ms``
    0, so that the worker gives them back and takes fresh ones.
    """
    reply = yield _call(SCRIPTS.claim, keys, (token, ttl_ms, n, idle_ms, start_by_ms,
                                              *withdraw))
    return _claimed(reply, 0, token, keys)


def cancels_requested(keys: QueueKeys, ids: Sequence[str]) -> Op[list[bool]]:
    """Whether ``cancel(queue, id)`` was called for each of these active jobs (lua/cancel.lua
    marks the job, then tells its worker over the notify channel)."""
    if not ids:
        return []
    flags = yield Batch(tuple(Command(("HEXISTS", keys.job(i), "cx")) for i in ids),
                        route=keys.prefix)
    return [bool(flag) for flag in flags]


def complete_batch(keys: QueueKeys, batch: Sequence[Completion], *, claim_next: bool,
                   keep: int, token: str, ttl_ms: int) -> Op[Finished]:
    """ACTIVE -> COMPLETED for each job whose token still holds; with ``claim_next``, claims
    a next job for each completed one (locked with ``token``, fresh for this call)."""
    flag = 1 if claim_next else 0
    args: list[Any] = [keep, token, ttl_ms, len(batch)]
    for item in batch:
        args += [item.job_id, item.token, item.result, flag]
    reply = yield _call(SCRIPTS.complete, keys, args)
    return Finished([_STATUS[int(s)] for s in reply[:len(batch)]],
                    _claimed(reply, len(batch), token, keys))


def end_attempt(keys: QueueKeys, ending: Unfinished, *, max_snoozes: int | None,
                claim_next: bool, keep: int, token: str, ttl_ms: int) -> Op[Finished]:
    """Record an attempt that ended without completing its job, with the attempt's entry in
    the job's history: a failure is retried (or ends the job FAILED), a snooze delays the job
    (or fails it once it snoozed more than ``max_snoozes`` times; ``None``: no limit), a rate
    limit pauses the job's key or queue and puts the job back; a job whose cancellation was
    requested ends CANCELLED instead. Then claims a next job with ``token`` (fresh for this
    call) if asked."""
    head = (ending.job_id, ending.token)
    tail = (1 if claim_next else 0, token, ttl_ms)
    entry: dict[str, Any] = {"attempt": ending.attempt}
    if isinstance(ending, Failure):
        error = ending.error
        entry |= {"type": error.type, "message": error.message,
                  "duration_ms": ending.duration_ms, "max_attempts": ending.max_attempts}
        call = _call(SCRIPTS.fail, keys, (
            *head, encode_error(error), encode(entry), ending.max_attempts, ending.delay_ms,
            1 if ending.final else 0, ending.reason, keep, *tail, ending.options))
    elif isinstance(ending, Snoozing):
        entry |= {"type": "Snoozed", "message": f"snoozed for {ending.delay_ms / 1000:g} s",
                  "duration_ms": ending.duration_ms, "delay_ms": ending.delay_ms}
        call = _call(SCRIPTS.snooze, keys, (
            *head, ending.delay_ms, encode(entry), -1 if max_snoozes is None else max_snoozes,
            keep, *tail))
    elif isinstance(ending, Throttled):
        entry |= {"type": "RateLimited",
                  "message": f"rate limited; retry after {ending.delay_ms / 1000:g} s",
                  "duration_ms": ending.duration_ms, "retry_after_ms": ending.delay_ms}
        call = _call(SCRIPTS.rate_limited, keys, (
            *head, ending.delay_ms, encode(entry), keep, *tail))
    elif isinstance(ending, Suspended):
        message = "sleeping" if ending.kind == "sleep" else f"waiting for {ending.name!r}"
        entry |= {"type": "Suspended", "message": message, "duration_ms": ending.duration_ms}
        if ending.kind == "signal":
            entry["signal"] = ending.name  # what a listing says it waits for (_listing.py)
        call = _call(SCRIPTS.suspend, keys, (
            *head, encode(entry), keep, *tail, ending.kind, ending.index, ending.at_ms,
            ending.timeout_ms if ending.kind == "signal" else ending.delay_ms, ending.name))
    else:
        raise TypeError(f"no transition records {type(ending).__name__}")
    reply = yield call
    status = _STATUS[int(reply[0])]
    if status == Status.LOCK_LOST:
        return Finished([status], Claimed([], -1))
    return Finished([status], _claimed(reply, 1, token, keys))


def durable_record(keys: QueueKeys, job_id: str) -> Op[dict[bytes, bytes]]:
    """A durable job's record (its steps, sleeps and waits: lua/lib/layout.lua), read once by
    the first durable call of a run."""
    reply = yield Command(("HGETALL", keys.durable(job_id)))
    return dict(reply or {})


def step_done(keys: QueueKeys, job_id: str, token: str, name: str, result: bytes) -> Op[bool]:
    """Store a finished step's result (msgpack); False when the lock is lost (nothing
    written)."""
    reply = yield _call(SCRIPTS.step, keys, (job_id, token, name, result))
    return bool(reply)


def take_signal(keys: QueueKeys, job_id: str, token: str, index: int, name: str
                ) -> Op[tuple[int, bytes]]:
    """The run's ``index``-th wait, for signal ``name``: (1, payload) a kept signal taken,
    (2, b'') timed out, (0, b'') nothing yet, (-1, b'') the lock is lost."""
    reply = yield _call(SCRIPTS.signal_take, keys, (job_id, token, index, name))
    code = int(reply[0])
    return code, (reply[1] if code == 1 else b"")


def extend(keys: QueueKeys, ttl_ms: int, locks: Sequence[tuple[str, str]]
           ) -> Op[set[tuple[str, str]]]:
    """Renew the locks ``(job id, token)``; returns the locks that are lost."""
    reply = yield _call(SCRIPTS.extend, keys,
                        (ttl_ms, *(item for pair in locks for item in pair)))
    return {(reply[i].decode(), reply[i + 1].decode()) for i in range(0, len(reply), 2)}


def release(keys: QueueKeys, locks: Sequence[tuple[str, str]]) -> Op[int]:
    """Give jobs back to waiting at once (forced shutdown); returns how many were released."""
    reply = yield _call(SCRIPTS.release, keys, tuple(item for pair in locks for item in pair))
    return int(reply)


def progress(keys: QueueKeys, job_id: str, token: str, kind: str, payload: Any,
             max_lines: int) -> Op[bool]:
    """A progress value (``kind`` 'p', msgpack payload) or a log line ('l'); False when the
    lock is lost (nothing written)."""
    reply = yield _call(SCRIPTS.progress, keys, (job_id, token, kind, payload, max_lines))
    return bool(reply)


def sweep_stalled(keys: QueueKeys, max_stalls: int, keep_failed: int, limit: int = 1000
                  ) -> Op[tuple[int, int]]:
    """Requeue (or fail, past ``max_stalls``) active jobs whose lock deadline has passed;
    returns (requeued, failed)."""
    requeued, failed = yield _call(SCRIPTS.stalled, keys,
                                   (max_stalls, limit, keep_failed, _STALL_ERROR))
    return int(requeued), int(failed)


def expire_due(keys: QueueKeys, limit: int = 1000) -> Op[int]:
    """End the jobs not started by their deadline (``add(..., expires=)``) CANCELLED with
    reason ``expired``; returns how many."""
    reply = yield _call(SCRIPTS.expire, keys, (limit,))
    return int(reply)


def promote(keys: QueueKeys) -> Op[int]:
    """Move due delayed jobs to waiting; returns how many moved."""
    moved, _ = yield _call(SCRIPTS.promote, keys, ())
    return int(moved)


def heartbeat(keys: QueueKeys, name: str, ttl_ms: int, *, host: str, pid: int,
              queues: Sequence[str], concurrency: int, running: Sequence[str],
              loop_blocked_ms: int = 0, paused: bool = False, take_commands: str = ""
              ) -> Op[tuple[int, list[str]]]:
    """Write this worker's entry in the queue's registry, live for ``ttl_ms`` (the server
    stamps the beat and keeps the first beat's time as the start). ``loop_blocked_ms``: the
    worker's event loop has not run for that long (the watchdog thread writes the entry
    then); the server turns it into the time the blockage began. ``paused``: the worker was
    paused by a command. Returns the server time and, with ``take_commands`` (a request id),
    the commands queued for the worker (``client.control``, lua/control.lua), oldest first:
    the same ones again for the same request id (a resend, or a beat tried again)."""
    fields: dict[str, Any] = {"host": host, "pid": pid, "queues": list(queues),
                              "concurrency": concurrency, "running": list(running)}
    if loop_blocked_ms > 0:
        fields["loop_blocked_ms"] = loop_blocked_ms
    if paused:
        fields["paused"] = True
    record = encode(fields)
    reply = yield _call(SCRIPTS.heartbeat, keys, (name, ttl_ms, record, take_commands))
    return int(reply[0]), [command.decode() for command in reply[1:]]



def peers(keys: QueueKeys) -> Op[list[str]]:
    """The names of the queue's workers that claim now (live, not paused, no blocked event
    loop, concurrency above 0), from the registry of partition ``keys``."""
    names = yield _call(SCRIPTS.peers, keys, ())
    return [name.decode() for name in names]


def leave_registry(keys: QueueKeys, name: str) -> Op[None]:
    """Remove this worker's entry from the queue's registry (a clean stop)."""
    yield _call(SCRIPTS.heartbeat, keys, (name, 0, b"", ""))


def take_starts(keys: QueueKeys, wanted: int, limit: int, per_ms: int, name: str
                ) -> Op[tuple[int, int, int]]:
    """A partitioned queue's global rate limit: take up to ``wanted`` starts from its shared
    window (named ``name:1`` ...); (taken, ms until one is free when none was, the deadline
    by which the claim that uses them must run: :func:`claim`'s ``start_by_ms``)."""
    taken, wake_in, start_by, _ = yield ScriptCall(SCRIPTS.rate_take, (keys.shared_rate,),
                                                   (wanted, limit, per_ms, name))
    return int(taken), int(wake_in), int(start_by)


def give_back_starts(keys: QueueKeys, name: str, first: int, last: int) -> Op[None]:
    """Give back starts ``name:first`` .. ``name:last`` that no job used."""
    if first <= last:
        yield Command(("ZREM", keys.shared_rate,
                       *(f"{name}:{i}" for i in range(first, last + 1))))


def pause_for(keys: QueueKeys, ms: int) -> Op[None]:
    """Pause one partition for ``ms``, as a handler's RateLimited paused another one."""
    yield _call(SCRIPTS.pause_for, keys, (ms,))
