"""The columns of a list of jobs in one state: the one that matters for each state, written once
for every view that lists jobs (``panqueue jobs``, the dashboard's queue page).

Delayed jobs show when they are due and why they wait (a retry, attempt n of m, after which
error; a snooze of their handler; a durable handler's sleep or wait for a signal; a delay the
producer asked for); active ones when they
started, for how long they have run and on which worker; failed ones why they failed and their
error's type. Times are UTC, in one format (:func:`timestamp`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from panqueue._job import JobInfo, JobState

__all__ = ["Column", "age", "columns", "delayed_because", "timestamp"]


def timestamp(value: datetime | None) -> str:
    """A time as every view shows it: UTC, to the millisecond ("-" for none)."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def age(seconds: float | None) -> str:
    """A span of time in words ("-" for none)."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _since(start: datetime | None, now: datetime) -> str:
    return "-" if start is None else age(max(0.0, (now - start).total_seconds()))


def _took(info: JobInfo) -> str:
    if info.started_at is None or info.finished_at is None:
        return "-"
    return age(max(0.0, (info.finished_at - info.started_at).total_seconds()))


def delayed_because(info: JobInfo) -> str:
    """Why a delayed (or waiting) job waits: a retry (attempt n of m after which error), a
    snooze of its handler, a durable handler's sleep or wait for a signal (its last attempt
    suspended: the history entry names the signal), or the delay its producer asked for."""
    if info.retry_of is not None:
        of = "" if info.max_attempts is None else f" of {info.max_attempts}"
        error = "" if info.error is None else f" after {info.error.type}"
        return f"retry {info.retry_of + 1}{of}{error}"
    last = info.history[-1] if info.history else {}
    if info.state is JobState.DELAYED and last.get("type") == "Snoozed":
        return f"snoozed by its handler (attempt {last.get('attempt')})"
    if last.get("type") == "Suspended":
        return _suspended(info, last)
    if info.state is JobState.DELAYED:
        return "delayed by the producer"
    return ""


def _suspended(info: JobInfo, last: dict[str, object]) -> str:
    """A durable job's wait (job.sleep, job.wait_for) or, once waiting, what it resumes from."""
    signal = last.get("signal")
    if info.state is not JobState.DELAYED:
        return ("resuming after its sleep" if signal is None
                else f"resuming after its wait for signal {signal!r}")
    if signal is None:
        return f"sleeping until {timestamp(info.run_at)}"
    timeout = "no timeout" if info.run_at is None else f"timeout at {timestamp(info.run_at)}"
    return f"waiting for signal {signal!r} ({timeout})"


def _error(info: JobInfo) -> str:
    return "" if info.error is None else info.error.type


def _message(info: JobInfo) -> str:
    if info.error is None:
        return ""
    text = info.error.message
    return text if len(text) <= 120 else text[:119] + "…"


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a list of jobs: its heading and its cell for a job, ``now`` being when
    the list is shown."""

    heading: str
    cell: Callable[[JobInfo, datetime], str]


_ATTEMPTS = Column("attempts", lambda j, now: str(j.attempts))
_ENQUEUED = Column("enqueued", lambda j, now: timestamp(j.enqueued_at))
_FINISHED = Column("finished", lambda j, now: timestamp(j.finished_at))

_COLUMNS: dict[JobState, tuple[Column, ...]] = {
    JobState.WAITING: (_ENQUEUED, Column("waiting for", lambda j, now: _since(j.enqueued_at,
                                                                               now)),
                       _ATTEMPTS, Column("why", lambda j, now: delayed_because(j))),
    JobState.DELAYED: (Column("due", lambda j, now: timestamp(j.run_at)),
                       Column("why", lambda j, now: delayed_because(j)), _ATTEMPTS,
                       Column("error", lambda j, now: _message(j) and
                              f"{_error(j)}: {_message(j)}")),
    JobState.BLOCKED: (_ENQUEUED, _ATTEMPTS),
    JobState.ACTIVE: (Column("started", lambda j, now: timestamp(j.started_at)),
                      Column("running for", lambda j, now: _since(j.started_at, now)),
                      Column("worker", lambda j, now: j.worker or "-"), _ATTEMPTS),
    JobState.COMPLETED: (_FINISHED, Column("took", lambda j, now: _took(j)), _ATTEMPTS),
    JobState.FAILED: (_FINISHED, Column("reason", lambda j, now: j.failure_reason or "-"),
                      Column("error type", lambda j, now: _error(j) or "-"),
                      Column("message", lambda j, now: _message(j)), _ATTEMPTS),
    JobState.CANCELLED: (_FINISHED, Column("reason", lambda j, now: j.failure_reason
                                           or "cancelled"), _ATTEMPTS),
}


def columns(state: JobState) -> tuple[Column, ...]:
    """The columns (after the job's id) of a list of jobs in ``state``."""
    return _COLUMNS[state]
