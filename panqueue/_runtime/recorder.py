"""The recorder: writes attempts' outcomes to Redis, riding out outages, and hands back the job
claimed next for the slot that freed up.

Completions are batched: jobs that finish in the same event-loop tick share one call, which
also claims a successor for each freed slot. A batch holds at most half the worker's slots, so a
busy worker keeps two calls going: Redis runs one while the worker runs the jobs the other
brought back, instead of each side waiting for the other in turn. Every claim-bearing call
carries a fresh token that is also its request id, so a call sent again after a lost reply is
answered from the script's memory instead of running twice (see lua/lib/memo.lua).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel

from panqueue._codec import check_json_compatible, encode
from panqueue._job import ErrorInfo, log_line
from panqueue._keys import QueueKeys
from panqueue._runtime.locks import Attempt, Event, Tokens
from panqueue._runtime.trouble import Trouble, episode_of
from panqueue._store import transitions
from panqueue._store.status import Status
from panqueue._store.transitions import (
    ClaimedJob,
    Completion,
    Failure,
    Finished,
    Snoozing,
    Suspended,
    Throttled,
    Unfinished,
)
from panqueue._store.transport import AsyncTransport, Op
from panqueue.errors import LockLost, PanqueueError

__all__ = ["Recorder"]

_MAX_LOG_LINES = 1000
# How long a release (forced shutdown) may take before it is left to the stalled sweep.
RELEASE_WAIT = 2.0


@dataclass(slots=True)
class _Pending(Completion):
    """A completion waiting in the batch being gathered."""

    status: Status | None = None  # None: not recorded (Redis away)
    next_job: ClaimedJob | None = None


@dataclass(slots=True)
class _Batch:
    """Completions sent in one call; ``done`` is set once it was answered (or given up)."""

    items: list[_Pending]
    done: Event


# What the log says when an ending finds its lock lost (the outcome is discarded).
_LOCK_LOST = {Failure: "lock lost before failure was recorded",
              Snoozing: "lock lost before the snooze was recorded",
              Throttled: "lock lost before the rate limit was recorded",
              Suspended: "lock lost before the sleep or wait was recorded"}


def _headline(error: ErrorInfo, limit: int = 200) -> str:
    """``Type: message`` on one line, the message cut at its first line and ``limit``
    characters (the whole message is the line's ``error`` field)."""
    lines = error.message.strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > limit or len(lines) > 1:
        message = message[:limit].rstrip() + " ..."
    return f"{error.type}: {message}" if message else error.type


def _traceback(error: ErrorInfo) -> dict[str, str]:
    """The recorded traceback of a failed attempt, as the ``exception`` field of its log line
    (shown under the line on the console, a string field in JSON)."""
    return {"exception": error.traceback} if error.traceback else {}


class Recorder:
    def __init__(self, transport: AsyncTransport, keys: QueueKeys, tokens: Tokens, *,
                 lock_ttl: float, keep_completed: int, keep_failed: int, concurrency: int,
                 stopping: Callable[[], bool], log: Any, new_event: Callable[[], Event],
                 max_snoozes: int | None = None) -> None:
        self._transport = transport
        self._keys = keys
        self._tokens = tokens
        self._lock_ttl = lock_ttl
        self._ttl_ms = max(1, int(lock_ttl * 1000))
        self._keep_completed = keep_completed
        self._keep_failed = keep_failed
        self._max_snoozes = max_snoozes
        self._stopping = stopping
        self._log = log
        # The batch still gathering (its leader has not sent it yet), if any.
        self._gathering: _Batch | None = None
        self._new_event = new_event  # the loop's own events (locks.native_events)
        self._max_batch = max(1, (concurrency + 1) // 2)
        self._trouble = Trouble(log, "recording outcomes", episode_of(transport))
        self._report_trouble = Trouble(log, "progress reporting", episode_of(transport))

    async def complete(self, job_id: str, token: str, result: bytes, log: Any
                       ) -> tuple[Status | None, ClaimedJob | None]:
        """Record a success; returns (its status: COMPLETED, LOCK_LOST, or None when Redis did
        not take it, the job claimed next for the slot).

        The first job to finish becomes the batch's leader: it yields once, so that jobs
        finishing in the same tick can join (up to half the slots), then sends them all in one
        call. Whether to claim
        successors is decided when the call is sent: a shutdown that began while the batch was
        gathering claims nothing.
        """
        pending = _Pending(job_id, token, result)
        batch = self._gathering
        if batch is not None and len(batch.items) < self._max_batch:
            batch.items.append(pending)
            await batch.done.wait()
        else:
            await self._lead_batch(pending)
        if pending.status == Status.LOCK_LOST:
            log.warning("lock lost before completion; result discarded", job_id=job_id,
                        error=str(LockLost(self._keys.name, job_id)))
        return pending.status, pending.next_job

    async def _lead_batch(self, first: _Pending) -> None:
        """Open a batch with ``first``, let the jobs finishing in this tick join it (a full
        batch makes the next one open its own), then send it.

        It yields until the batch is full, or twice and then as long as the last yield brought
        new members: asyncio runs every ready task within one yield, trio spreads them over
        scheduler passes in a random order (the leader may come first in the pass that runs
        the others)."""
        self._gathering = batch = _Batch([first], self._new_event())
        try:
            yields = 0
            while True:
                size = len(batch.items)
                await anyio.lowlevel.checkpoint()
                yields += 1
                grown = len(batch.items)
                if grown >= self._max_batch or (yields >= 2 and grown == size):
                    break
        finally:
            if self._gathering is batch:
                self._gathering = None
        items = batch.items
        claiming = not self._stopping()
        token = self._tokens.new()
        finished = await self._record(transitions.complete_batch(
            self._keys, items, claim_next=claiming, keep=self._keep_completed, token=token,
            ttl_ms=self._ttl_ms), items[0].job_id)
        if finished is not None:
            claimed = iter(finished.claimed.jobs)
            for pending, status in zip(items, finished.statuses, strict=True):
                pending.status = status
                if status == Status.COMPLETED and claiming:
                    pending.next_job = next(claimed, None)
        batch.done.set()

    async def complete_chunk(self, completions: list[Completion], log: Any,
                             claim_next: bool = True
                             ) -> tuple[list[Status | None], list[ClaimedJob]]:
        """Record the successes of one chunk in one call, claiming a next job for each (the
        slot's next chunk) unless ``claim_next`` is false or the worker stops; returns each
        one's status (None: not recorded, Redis away) and the jobs claimed."""
        claiming = claim_next and not self._stopping()
        finished = await self._record(transitions.complete_batch(
            self._keys, completions, claim_next=claiming, keep=self._keep_completed,
            token=self._tokens.new(), ttl_ms=self._ttl_ms), completions[0].job_id)
        if finished is None:
            return [None] * len(completions), []
        for item, status in zip(completions, finished.statuses, strict=True):
            if status == Status.LOCK_LOST:
                log.warning("lock lost before completion; result discarded", job_id=item.job_id,
                            error=str(LockLost(self._keys.name, item.job_id)))
        return list(finished.statuses), finished.claimed.jobs

    async def end_attempt(self, ending: Unfinished, log: Any, claim_next: bool = True
                          ) -> tuple[Status | None, ClaimedJob | None]:
        """Record an attempt that ended without completing its job (failed, snoozed, rate
        limited: :func:`transitions.end_attempt`); returns (status, the job claimed next for
        the slot, unless ``claim_next`` is false; None, None when Redis could not record it)."""
        claiming = claim_next and not self._stopping()
        finished = await self._record(transitions.end_attempt(
            self._keys, ending, max_snoozes=self._max_snoozes, claim_next=claiming,
            keep=self._keep_failed, token=self._tokens.new(), ttl_ms=self._ttl_ms),
            ending.job_id)
        if finished is None:
            return None, None
        status = finished.statuses[0]
        self._log_ending(ending, status, log)
        jobs = finished.claimed.jobs
        return status, (jobs[0] if jobs else None)

    def _log_ending(self, ending: Unfinished, status: Status, log: Any) -> None:
        if status == Status.LOCK_LOST:
            log.warning(_LOCK_LOST[type(ending)],
                        error=str(LockLost(self._keys.name, ending.job_id)))
        elif status == Status.CANCELLED:
            log.info("job cancelled")
        elif status.retried:
            # One line, no traceback: a retry is expected; the final failure carries it.
            assert isinstance(ending, Failure)
            error = ending.error
            delay = ending.delay_ms / 1000
            log.info(f"job attempt {ending.attempt} of {ending.max_attempts} failed: "
                     f"{_headline(error)}; retry in {delay:g} s", error=error.message,
                     error_type=error.type, max_attempts=ending.max_attempts,
                     retry_in_s=delay)
        elif status == Status.FAILED and isinstance(ending, Failure):
            error = ending.error
            reason = ending.reason or "max_attempts_exceeded"
            log.error(f"job failed on attempt {ending.attempt} of {ending.max_attempts} "
                      f"({reason}): {_headline(error)}", error=error.message,
                      error_type=error.type, reason=reason, max_attempts=ending.max_attempts,
                      **_traceback(error))
        elif status == Status.FAILED:  # a snooze past max_snoozes
            log.error(f"job failed: snoozed more than max_snoozes ({self._max_snoozes}) "
                      f"times", error_type="MaxSnoozesExceeded", reason="max_snoozes_exceeded",
                      max_snoozes=self._max_snoozes)
        elif status == Status.SNOOZED:
            log.debug("job snoozed", snooze_s=ending.delay_ms / 1000)
        elif status == Status.SUSPENDED:
            log.debug("job suspended")
        elif status == Status.RATE_LIMITED:
            log.info("handler rate limited; its key or queue pauses",
                     retry_after_s=ending.delay_ms / 1000)

    async def _record(self, op: Op[Finished], job_id: str) -> Finished | None:
        """Send a finishing call, riding out a Redis outage for up to half the lock TTL.

        The same call is sent again after a failure (its token is its request id). If Redis
        stays away longer, the outcome is dropped: the lock then expires and the stalled sweep
        runs the job again (at-least-once), which is the documented guarantee.
        """
        deadline = time.monotonic() + self._lock_ttl / 2
        request = next(op)  # one request, sent as often as needed; the reply is parsed once
        while True:
            try:
                reply = await self._transport.execute(request)
            except PanqueueError as exc:
                self._trouble.failed(exc)
                if time.monotonic() + self._trouble.backoff() > deadline:
                    self._log.error("could not record a job's outcome; it will run again",
                                    job_id=job_id, error=str(exc))
                    op.close()
                    return None
                await anyio.sleep(self._trouble.backoff())
            else:
                self._trouble.ok()
                try:
                    op.send(reply)
                except StopIteration as done:
                    result: Finished = done.value
                    return result
                raise AssertionError("a finishing transition makes one call")

    async def report(self, attempt: Attempt, kind: str, value: Any) -> None:
        """Progress and log lines from a running job (only while this attempt holds the lock).

        Best effort: when Redis cannot take a report (an outage, a full server) it is dropped
        with a warning once per outage, and the job goes on. A report from an attempt whose
        lock is lost raises :class:`LockLost` in the handler: it should stop.
        """
        if attempt.lost:
            raise LockLost(self._keys.name, attempt.job_id)
        if kind == "p":
            check_json_compatible(value, "progress")  # a bad value is the handler's error
            payload: Any = encode(value)
        else:  # a log line, stamped with when and in which attempt (see parse_log_line)
            payload = log_line(time.time(), attempt.number, value)
        try:
            await self._transport.run(transitions.progress(
                self._keys, attempt.job_id, attempt.token, kind, payload, _MAX_LOG_LINES))
        except PanqueueError as exc:
            self._report_trouble.failed(exc)
        else:
            self._report_trouble.ok()

    async def release(self, locks: list[tuple[str, str]]) -> None:
        """Give jobs back to waiting at once (bounded: the sweep covers a release that fails)."""
        if not locks:
            return
        error = f"no reply within {RELEASE_WAIT:g} s"
        with anyio.move_on_after(RELEASE_WAIT):
            try:
                await self._transport.run(transitions.release(self._keys, locks))
                return
            except PanqueueError as exc:
                error = str(exc)
        self._log.warning("could not release jobs; the stalled sweep will requeue them",
                          job_ids=[job_id for job_id, _ in locks], error=error)
