"""One chunk: a chunk handler called once on its jobs, then each job's ending recorded.

Every job of a chunk ends on its own, through the recorder's calls a plain handler's job uses:
the completions in one call (which claims the slot's next chunk), each job that did not
complete (failed, snoozed, rate limited) in a call of its own under the job's own retry
policy. What ends the call ends it for every job: a raised exception (the handler's timeout
included, which bounds the whole call) fails each one; a forced shutdown releases each one. A
job cancelled, or whose lock is lost, while the chunk runs stops the call: that job ends
cancelled (or is left to the attempt that holds it now) and the others go back to waiting
without using an attempt.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from panqueue._codec import check_json_compatible, check_size, decode, encode
from panqueue._job import ChunkFailure, Job
from panqueue._options import JobOptions
from panqueue._runtime.attempt import (
    CancelRequested,
    Ending,
    Outcome,
    ending_of,
    split_raised,
)
from panqueue._runtime.chunks import Held
from panqueue._runtime.failures import FailureCallback, report_failure
from panqueue._runtime.locks import Attempts
from panqueue._runtime.recorder import Recorder
from panqueue._store.status import Status
from panqueue._store.transitions import ClaimedJob, Completion
from panqueue.errors import PayloadError
from panqueue.executors.base import Executor, HandlerAborted

__all__ = ["ChunkItemFailed", "ChunkRunner", "InvalidChunkResult"]


class ChunkItemFailed(Exception):
    """A job failed by a ``ChunkFailure`` whose error is a message."""


class InvalidChunkResult(Exception):
    """A chunk handler returned something other than one result per job, in order."""


# The worker's counters and metrics: (job, its recorded status, or "released" / "lock_lost",
# or None when Redis could not record it; seconds the chunk ran).
# A job's ending counted: (job, its status or what happened, its run's seconds, when the call
# ended (time.time()): its wait is counted to its start, whatever the recording takes after).
Count = Callable[[ClaimedJob, Status | str | None, float, float], None]


class ChunkRunner:
    """Runs the chunks of one chunk handler on its executor and records their jobs."""

    def __init__(self, executor: Executor, queue: str, options: JobOptions, attempts: Attempts,
                 recorder: Recorder, *, stopping: Callable[[], bool],
                 forced: Callable[[], bool], count: Count, log: Any,
                 max_payload_bytes: int | None = None,
                 on_failure: Callable[[], Sequence[FailureCallback]] = tuple) -> None:
        self._executor = executor
        self._max_payload_bytes = max_payload_bytes
        self._queue = queue
        self._options = options
        self._attempts = attempts
        self._recorder = recorder
        self._stopping = stopping
        self._forced = forced
        self._count = count
        self._log = log
        self._on_failure = on_failure

    async def run(self, chunk: list[Held]) -> list[ClaimedJob]:
        """Run one chunk and record how each of its jobs ended; returns the jobs claimed next
        for the slot."""
        for held in chunk:
            if held.previous is not None:
                await held.previous.wait_ended()
        if self._stopping() and self._forced():
            for held in chunk:
                self._attempts.end(held.attempt)
            await self._recorder.release([held.attempt.lock for held in chunk])
            return []
        outcomes = await self._execute(chunk)
        return await self._record(chunk, outcomes, time.time())

    async def _execute(self, chunk: list[Held]) -> list[Outcome]:
        """Call the handler once on the jobs that can run; one outcome per job of ``chunk``."""
        started = time.monotonic()
        scope = anyio.CancelScope()  # the chunk's: stopping any of its attempts stops the call
        outcomes: list[Outcome | None] = [None] * len(chunk)
        options: list[JobOptions] = [self._options] * len(chunk)
        running: list[int] = []  # positions in ``chunk`` of the jobs the handler gets
        jobs: list[Job] = []  # the handler's jobs, in the order of ``running``
        for i, held in enumerate(chunk):
            held.attempt.scope = scope
            outcomes[i] = _stopped_before(held, self._options)
            if outcomes[i] is not None:
                continue
            try:
                options[i] = self._job_options(held.job)
                jobs.append(self._job(held, options[i]))
            except Exception as exc:  # unreadable stored data or options: this job alone
                outcomes[i] = ending_of(held.job, options[i], exc, 0.0)
            else:
                running.append(i)
        result: Any = None
        error: BaseException | None = None
        grouped_cancel = False  # a cancellation in a group the handler's task group raised
        try:
            if jobs:
                with scope:
                    result = await self._executor.run_chunk(jobs, self._options.timeout)
        except Exception as exc:
            error = exc
        except anyio.get_cancelled_exc_class():
            await self._give_back_all(chunk)  # the whole worker is cancelled from outside
            raise
        except BaseExceptionGroup as group:  # the handler's own task group
            grouped_cancel, error = split_raised(group)
            if grouped_cancel and not scope.cancel_called:
                await self._give_back_all(chunk)
                raise
        except SystemExit as exc:  # sys.exit() in an inline handler ends the chunk only
            error = HandlerAborted(exc)
        finally:
            for held in chunk:
                self._attempts.end(held.attempt)
        duration = time.monotonic() - started
        # The call was stopped (a member's cancel, a forced stop) if its cancellation came
        # out of it, alone or in a group, or if an error did while it was being stopped: a
        # task's cleanup that raised turns the cancellation into that error on its way out.
        # That error is not the other members' doing.
        call_stopped = scope.cancelled_caught or grouped_cancel or (
            scope.cancel_called and error is not None)
        if call_stopped and error is not None:
            self._log.warning("a stopped chunk's handler raised while it stopped",
                              job_ids=[chunk[i].job.id for i in running],
                              error=f"{type(error).__name__}: {error}")
        if error is None and jobs:
            error = _misshapen(result, len(jobs))
        for position, i in enumerate(running):
            held = chunk[i]
            stopped = _stopped_during(held, call_stopped)
            if stopped is not None:
                outcomes[i] = stopped(held, options[i], duration)
            elif error is not None:
                outcomes[i] = ending_of(held.job, options[i], error, duration)
            else:
                outcomes[i] = _item_outcome(held, options[i], result[position], position,
                                            duration, self._max_payload_bytes)
            ended = outcomes[i]
            if ended is not None:
                ended.job = jobs[position]
        return [outcome for outcome in outcomes if outcome is not None]

    async def _give_back_all(self, chunk: list[Held]) -> None:
        """The whole worker is being cancelled from outside: give the chunk's jobs back at
        once."""
        for held in chunk:
            self._attempts.end(held.attempt)
        with anyio.CancelScope(shield=True):
            await self._recorder.release([held.attempt.lock for held in chunk])

    def _job_options(self, claimed: ClaimedJob) -> JobOptions:
        return claimed.job_options(self._options)

    def _job(self, held: Held, options: JobOptions) -> Job:
        claimed = held.job
        return Job(id=claimed.id, queue=self._queue, data=decode(claimed.data),
                   attempt=claimed.attempt, options=options,
                   enqueued_at_ms=claimed.enqueued_at_ms,
                   sink=functools.partial(self._recorder.report, held.attempt),
                   should_stop=held.attempt.should_stop)

    async def _record(self, chunk: list[Held], outcomes: list[Outcome], ended: float
                      ) -> list[ClaimedJob]:
        """Record every job's ending; returns the jobs claimed next for the slot."""
        following: list[ClaimedJob] = []
        released = [held for held, o in zip(chunk, outcomes, strict=True)
                    if o.ending == Ending.RELEASE]
        if released:
            await self._recorder.release([held.attempt.lock for held in released])
            # A forced shutdown, or a call stopped for another job of the chunk.
            self._log.warning("jobs of a stopped chunk released to waiting",
                              job_ids=[held.job.id for held in released])
        completed: list[tuple[ClaimedJob, Outcome]] = []
        # The application's failure callbacks hear of the failures once every ending of the
        # chunk is recorded: the members' locks are renewed by nobody from the call's end.
        # While there are some, no recording claims next jobs, which would wait unrenewed for
        # as long as they take: the claim loop refills the slot.
        callbacks = self._on_failure()
        reports: list[tuple[Outcome, bool, Any]] = []
        claim_next = not (callbacks and any(o.ending == Ending.FAILED for o in outcomes))
        # A handler's RateLimited pauses its job's key (keyed mode): every such pause is
        # recorded before any recording claims a next job, which must not be a job of a key
        # this same call paused. Their slots are refilled by the claim loop.
        order = sorted(zip(chunk, outcomes, strict=True),
                       key=lambda pair: pair[1].ending != Ending.RATE_LIMITED)
        for held, outcome in order:
            claimed = held.job
            if outcome.ending == Ending.COMPLETED:
                completed.append((claimed, outcome))
                continue
            if outcome.ending == Ending.RELEASE:
                self._count(claimed, "released", outcome.duration, ended)
                continue
            if outcome.ending == Ending.LOST:
                self._log.warning("attempt stopped: its lock was lost; outcome discarded",
                                  job_id=claimed.id, attempt=claimed.attempt)
                self._count(claimed, "lock_lost", outcome.duration, ended)
                continue
            assert outcome.unfinished is not None  # failed, snoozed or rate limited
            log = self._log.bind(job_id=claimed.id, attempt=claimed.attempt,
                                 duration_ms=round(outcome.duration * 1000, 3))
            status, next_job = await self._recorder.end_attempt(
                outcome.unfinished, log,
                claim_next=claim_next and outcome.ending != Ending.RATE_LIMITED)
            self._count(claimed, status, outcome.duration, ended)
            if status is not None and (status == Status.FAILED or status.retried):
                reports.append((outcome, status == Status.FAILED, log))
            if next_job is not None:
                following.append(next_job)
        if completed:
            statuses, claimed_next = await self._recorder.complete_chunk(
                [Completion(job.id, job.token, outcome.result) for job, outcome in completed],
                self._log, claim_next=claim_next)
            for (job, outcome), status in zip(completed, statuses, strict=True):
                self._count(job, status, outcome.duration, ended)
            following += claimed_next
        for outcome, final, log in reports:
            await report_failure(callbacks, outcome.job, outcome.error, final, log)
        return following


Stopped = Callable[[Held, JobOptions, float], Outcome]


def _lost(held: Held, options: JobOptions, duration: float) -> Outcome:
    return Outcome(Ending.LOST, duration)


def _released(held: Held, options: JobOptions, duration: float) -> Outcome:
    return Outcome(Ending.RELEASE, duration)


def _cancelled(held: Held, options: JobOptions, duration: float) -> Outcome:
    return ending_of(held.job, options, CancelRequested(), duration)


def _stopped_before(held: Held, options: JobOptions) -> Outcome | None:
    """The outcome of a job stopped while its chunk gathered (it does not run), or None."""
    attempt = held.attempt
    if attempt.lost:
        return _lost(held, options, 0.0)
    if attempt.cancel_requested:
        return _cancelled(held, options, 0.0)
    if attempt.forced:
        return _released(held, options, 0.0)
    return None


def _stopped_during(held: Held, call_stopped: bool) -> Stopped | None:
    """How a job of a chunk whose call was stopped (or whose attempt was) ends, or None when
    its own result decides. As for a plain job: a lost lock discards the outcome; a forced
    shutdown releases the job unless its cancellation was requested; a cancellation counts
    when it stopped the call. The other jobs of a stopped call are released (not their
    doing: no attempt used)."""
    attempt = held.attempt
    if attempt.lost:
        return _lost
    if attempt.forced and not attempt.cancel_requested:
        return _released
    if call_stopped:
        return _cancelled if attempt.cancel_requested else _released
    return None


def _misshapen(result: Any, count: int) -> InvalidChunkResult | None:
    """Why ``result`` is not one result per job of a chunk of ``count``, or None."""
    if isinstance(result, list) and len(result) == count:
        return None
    got = f"a list of {len(result)}" if isinstance(result, list) else type(result).__name__
    return InvalidChunkResult(f"a chunk handler must return a list of {count} results (one per "
                              f"job, in the order of the jobs), got {got}")


def _item_outcome(held: Held, options: JobOptions, value: Any, position: int, duration: float,
                  max_payload_bytes: int | None = None) -> Outcome:
    """How one job ends from its slot of the chunk's result."""
    if isinstance(value, ChunkFailure):
        if value.index != position:
            error: BaseException = InvalidChunkResult(
                f"ChunkFailure({value.index!r}, ...) was returned in slot {position}: return "
                "it in the slot of the job it fails")
        elif isinstance(value.error, BaseException):
            error = value.error
        else:
            error = ChunkItemFailed(str(value.error))
        return ending_of(held.job, options, error, duration)
    try:
        check_json_compatible(value, f"result[{position}]")
        result = encode(value)
        check_size(len(result), max_payload_bytes, f"result[{position}]")
        return Outcome(Ending.COMPLETED, duration, result=result)
    except PayloadError as exc:
        return ending_of(held.job, options, exc, duration)
