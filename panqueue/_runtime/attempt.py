"""One attempt: run a claimed job on its executor and return how it ended, as a value.

Nothing here writes to Redis; the recorder turns the :class:`Outcome` into the matching
transition. Whatever the handler raises or returns ends here as an outcome: no value from a
handler can stop the worker (see docs/executors.md).
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from panqueue import _tracing
from panqueue._check import is_number
from panqueue._codec import check_json_compatible, check_size, decode, encode
from panqueue._durable import DurableRun, DurableStore
from panqueue._job import ErrorInfo, Fail, Job, Retry
from panqueue._options import JobOptions
from panqueue._runtime.locks import Attempt, Attempts, Scope
from panqueue._store.ops.add import TRACE_OPTION
from panqueue._store.transitions import (
    ClaimedJob,
    Failure,
    Snoozing,
    Suspended,
    Throttled,
    Unfinished,
)
from panqueue.errors import PayloadError, RateLimited, Snooze
from panqueue.executors.base import (
    ChildCrashed,
    Executor,
    HandlerAborted,
    JobTimeout,
    RemoteError,
)

__all__ = ["AttemptRunner", "CancelRequested", "Ending", "Outcome", "ending_of", "failure_of",
           "split_raised"]

# The longest a retry delay or a snooze may be (a year); a longer, negative or non-finite one
# is refused.
_MAX_RETRY_DELAY = 365 * 24 * 3600.0
# A result of None, encoded (one byte: no max_payload_bytes refuses it).
_NONE = encode(None)


class Ending(enum.Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    LOST = "lost"  # the lock was lost: discard the outcome, the job belongs to another attempt
    RELEASE = "release"  # forced shutdown: give the job back to waiting
    SNOOZED = "snoozed"  # the handler raised Snooze: run it again later, no attempt used
    RATE_LIMITED = "rate_limited"  # the handler raised RateLimited: pause, run it again
    SUSPENDED = "suspended"  # a durable sleep or wait for a signal: delayed, no attempt used


@dataclass(slots=True)
class Outcome:
    """How an attempt ended. COMPLETED carries the encoded ``result``; FAILED, SNOOZED and
    RATE_LIMITED carry what to record as ``unfinished`` (a Failure, a Snoozing, a Throttled),
    which the recorder records with one call whichever it is; LOST and RELEASE carry
    nothing."""

    ending: Ending
    duration: float
    result: bytes = b""
    unfinished: Unfinished | None = None
    error: BaseException | None = None  # what the handler raised, when it did
    job: Job[Any] | None = None  # the job the handler got (None if it could not be built)

    @property
    def failure(self) -> Failure | None:
        """The failure to record, when the attempt failed."""
        return self.unfinished if isinstance(self.unfinished, Failure) else None


class CancelRequested(Fail):
    """The handler was stopped because ``cancel(queue, id)`` was called for its job."""

    def __init__(self) -> None:
        super().__init__("cancelled")


Report = Callable[[Attempt, str, Any], Awaitable[None]]
# Gives locks back to waiting while the worker is being cancelled (shielded): (job id, token)
# pairs of one partition (the second argument).
Release = Callable[[list[tuple[str, str]], int], Awaitable[None]]


class AttemptRunner:
    """Runs attempts of one handler's jobs on its executor."""

    def __init__(self, executor: Executor, queue: str, options: JobOptions, attempts: Attempts,
                 report: Report, give_back: Release, durable: DurableStore | None = None, *,
                 max_payload_bytes: int | None = None) -> None:
        self._executor = executor
        self._max_payload_bytes = max_payload_bytes
        self._queue = queue
        self._options = options
        self._attempts = attempts
        self._report = report
        self._give_back = give_back  # shielded: see Roles.give_back
        self._durable = durable

    def run(self, claimed: ClaimedJob, stopping: bool, scope: Scope) -> Awaitable[Outcome]:
        """The attempt of ``claimed``, to await (untraced: the attempt itself, one coroutine
        fewer per job) inside ``scope``, which the caller entered and which stops the attempt
        (:attr:`Attempt.scope`). A stopped attempt returns its outcome at once, awaiting
        nothing more: the caller then leaves ``scope`` before it awaits anything (a cancelled
        scope cancels every await inside it)."""
        if not _tracing.enabled():
            return self._run(claimed, stopping, scope)
        return self._traced(claimed, stopping, scope)

    async def _traced(self, claimed: ClaimedJob, stopping: bool, scope: Scope) -> Outcome:
        # Unreadable options are _run's to report, as the attempt's failure.
        stored = None if claimed.unreadable else claimed.options
        carrier = stored.get(TRACE_OPTION) if stored is not None else None
        with _tracing.attempt_span(self._queue, claimed.id, claimed.attempt, carrier) as span:
            outcome = await self._run(claimed, stopping, scope)
            failure = outcome.failure
            _tracing.end_attempt(span, outcome.ending.value,
                                 failure.error if failure is not None else None)
            if failure is not None and stored is not None:
                # The fail transition stores this span with the job: the next attempt links it.
                headers = carrier if isinstance(carrier, dict) else {}
                failure.options = claimed.options_with(TRACE_OPTION, {
                    **headers, _tracing.LINK: _tracing.traceparent(span)})
            return outcome

    async def _run(self, claimed: ClaimedJob, stopping: bool, scope: Scope) -> Outcome:
        attempt = self._attempts.start(claimed.id, claimed.token, stopping, claimed.partition,
                                       claimed.attempt, scope)
        stopped = False  # the attempt's scope stopped it (its cancellation ended the handler)
        options = self._options
        started = time.monotonic()
        outcome: Any = None
        error: BaseException | None = None
        job: Job[Any] | None = None
        run: DurableRun | None = None  # made by the handler's first durable call, if any
        store, first_run = self._durable, claimed.first_run

        def durable() -> DurableRun:  # kept by the job: it keeps no claimed data
            nonlocal run
            if run is None:
                assert store is not None
                run = DurableRun(store, attempt, self._max_payload_bytes, first_run=first_run)
            return run

        try:
            if claimed.options or claimed.unreadable:  # most jobs have none of their own
                options = claimed.job_options(options)

            def sink(kind: str, value: Any) -> Awaitable[None]:
                return self._report(attempt, kind, value)

            job = Job(id=claimed.id, queue=self._queue, data=decode(claimed.data),
                      attempt=claimed.attempt, options=options,
                      enqueued_at_ms=claimed.enqueued_at_ms, sink=sink,
                      should_stop=attempt.should_stop,
                      durable=None if store is None else durable)
            if attempt.cancel_requested:  # heard before the attempt started: do not run it
                raise CancelRequested()
            outcome = await self._executor.run(job, options.timeout)
        except Exception as exc:
            error = exc
        except anyio.get_cancelled_exc_class():
            if not scope.cancel_called:
                # The whole worker is being cancelled from outside: give the job back at once.
                self._attempts.end(attempt)
                await self._give_back([(claimed.id, claimed.token)], claimed.partition)
                raise
            stopped = True  # nothing is awaited from here until the caller leaves the scope
        except BaseExceptionGroup as group:  # the handler's own task group
            stopped, error = split_raised(group)
            if stopped and not scope.cancel_called:  # from outside, as above
                self._attempts.end(attempt)
                await self._give_back([(claimed.id, claimed.token)], claimed.partition)
                raise
        except SystemExit as exc:  # sys.exit() in an inline handler ends the attempt only
            error = HandlerAborted(exc)
        finally:
            self._attempts.end(attempt)
        duration = time.monotonic() - started
        if attempt.lost:
            return Outcome(Ending.LOST, duration)
        if run is not None and run.suspension is not None:
            # Whatever the handler did after (it caught the Suspend, or was cancelled), the run
            # ends where it asked to wait.
            wait = run.suspension
            return Outcome(Ending.SUSPENDED, duration, unfinished=Suspended(
                claimed.id, claimed.token, claimed.attempt, round(duration * 1000),
                wait.delay_ms, wait.kind, wait.index, wait.at_ms, wait.timeout_ms, wait.name))
        if attempt.forced and not attempt.cancel_requested:
            return Outcome(Ending.RELEASE, duration)
        if attempt.cancel_requested and stopped:
            error = CancelRequested()
        if error is None:
            if outcome is None:  # most handlers return nothing: no walk, no encoding
                return Outcome(Ending.COMPLETED, duration, result=_NONE)
            try:
                check_json_compatible(outcome, "result")
                result = encode(outcome)
                check_size(len(result), self._max_payload_bytes, "the handler's result")
                return Outcome(Ending.COMPLETED, duration, result=result)
            except PayloadError as exc:
                error = exc
        ended = ending_of(claimed, options, error, duration)
        ended.job = job
        return ended


def ending_of(claimed: ClaimedJob, options: JobOptions, error: BaseException, duration: float
              ) -> Outcome:
    """How an attempt whose handler raised ``error`` ends: snoozed or rate limited when it
    raised a usable signal for that, else failed (retried or not, by ``options``)."""
    # Signals that are not failures (checked off the completed path).
    if isinstance(error, Snooze):
        seconds = _requested_delay("Snooze(seconds)", error.seconds)
        if not isinstance(seconds, str):  # an unusable value fails the attempt below
            return Outcome(Ending.SNOOZED, duration, unfinished=Snoozing(
                claimed.id, claimed.token, claimed.attempt, round(duration * 1000),
                int(seconds * 1000)))
    elif isinstance(error, RateLimited):
        seconds = _requested_delay("RateLimited(retry_after)", error.retry_after)
        if not isinstance(seconds, str):  # an unusable value fails the attempt below
            return Outcome(Ending.RATE_LIMITED, duration, unfinished=Throttled(
                claimed.id, claimed.token, claimed.attempt, round(duration * 1000),
                int(seconds * 1000)))
    return Outcome(Ending.FAILED, duration,
                   unfinished=failure_of(claimed, options, error, duration), error=error)


def failure_of(claimed: ClaimedJob, options: JobOptions, error: BaseException, duration: float
             ) -> Failure:
    """What a failed attempt records, and whether (and when) the job is tried again."""
    final = False
    reason = ""
    asked: float | None = None  # the delay a Retry asked for
    note = ""  # why a Retry's delay or a Snooze's seconds are unusable
    note_type = "InvalidRetry"
    if isinstance(error, JobTimeout):
        reason = "timeout"
    if isinstance(error, CancelRequested):
        final, reason = True, "cancelled"
    elif isinstance(error, Fail):
        final, reason = True, "explicit_fail"
    elif isinstance(error, Retry) and error.delay is not None:
        wanted = _requested_delay("Retry(delay=...)", error.delay)
        if isinstance(wanted, str):  # unusable: recorded, and the backoff applies instead
            note = wanted
        else:
            asked = wanted
    elif isinstance(error, Snooze):  # only an unusable one fails the attempt
        note, note_type = str(_requested_delay("Snooze(seconds)", error.seconds)), "InvalidSnooze"
    elif isinstance(error, RateLimited):  # only an unusable one fails the attempt
        note = str(_requested_delay("RateLimited(retry_after)", error.retry_after))
        note_type = "InvalidRateLimited"
    delay = 0.0
    if asked is not None:
        delay = asked
    elif not final and claimed.attempt < options.attempts:
        delay = options.backoff.delay_for(claimed.attempt)
    cause = error.__cause__
    if isinstance(error, Retry | Fail) and cause is not None:
        # `raise Retry(...) from exc`: the attempt failed because of `exc`, which is what it
        # records (with its traceback); the signal only says what happens next.
        info = _error_info(cause)
    else:
        info = _error_info(error)
    if note:
        info = ErrorInfo(note_type, note, info.traceback)
    return Failure(claimed.id, claimed.token, claimed.attempt, round(duration * 1000),
                   int(delay * 1000), error=info, max_attempts=options.attempts, final=final,
                   reason=reason)


def _error_info(error: BaseException) -> ErrorInfo:
    """What a failed attempt records for ``error``."""
    if isinstance(error, RemoteError):  # raised in a subprocess handler's child
        return ErrorInfo(error.type_name, str(error), error.traceback)
    if isinstance(error, HandlerAborted):  # a BaseException: SystemExit and the like
        return ErrorInfo.from_exception(error.original)
    return ErrorInfo.from_exception(error, with_traceback=not isinstance(
        error, (Fail, Retry, Snooze, RateLimited, JobTimeout, ChildCrashed)))


def split_raised(group: BaseExceptionGroup) -> tuple[bool, Exception | None]:
    """What the tasks of a handler's own task group raised together, sorted as if raised
    alone: whether a cancellation was among it (a trio nursery raises those in a group), and
    the rest as the attempt's error (a task's ``sys.exit()`` as :class:`HandlerAborted`). A
    group holding a ``KeyboardInterrupt`` is raised again: the interrupt of the process."""
    cancelled, rest = group.split(anyio.get_cancelled_exc_class())
    if rest is not None and rest.split(KeyboardInterrupt)[0] is not None:
        raise group
    if rest is None:
        return cancelled is not None, None
    return cancelled is not None, rest if isinstance(rest, Exception) else HandlerAborted(rest)


def _requested_delay(what: str, delay: object) -> float | str:
    """The delay in seconds a Retry or a Snooze asked for, or why it is unusable."""
    if not is_number(delay):
        return f"{what} must be a number of seconds, got {delay!r}"
    # Compared first: an int past a float's range is too large, and math.isfinite raises on it.
    if delay < 0 or delay > _MAX_RETRY_DELAY or not math.isfinite(delay):
        return f"{what} must be finite, >= 0 and at most {_MAX_RETRY_DELAY:g} s, got {delay!r}"
    return float(delay)
