"""The exceptions of panqueue, in one module and one hierarchy.

Every error a user can act on is a :class:`PanqueueError`; the message names what was wrong.
Errors of redis-py and of the network are translated in one place
(``translate_error`` in ``panqueue/_store/transport/errors.py``)::

    Exception
    ├── PanqueueError             raised by panqueue on purpose
    │   ├── ConfigError           a handler, option, queue name or URL is invalid
    │   ├── PayloadError          data or a result is not JSON-compatible
    │   ├── ConnectionError       Redis unreachable, or the connection broke (also builtins')
    │   │   └── ServerUnavailable Redis answered but cannot serve now (OOM, BUSY, LOADING, ...)
    │   ├── JobNotFound           no such job (also a LookupError)
    │   ├── JobFailed             the job ended failed or cancelled
    │   ├── LockLost              a worker no longer holds the job's lock
    │   ├── TimeoutError          waiting took too long (also builtins')
    │   └── SignalTimeout         a durable job's wait_for() passed its timeout
    │
    │   signals a handler raises (not errors: they say what to do with the job)
    ├── Retry                     retry the job, after a delay or the backoff
    ├── Fail                      fail the job now, without further attempts
    ├── Snooze                    run the job again after a while, without using an attempt
    ├── RateLimited               an outside service refuses for now: pause the key or queue
    │
    │   how an executor reports that an attempt failed (re-exported by executors.base)
    ├── JobTimeout                the attempt exceeded its timeout
    ├── HandlerAborted            the handler raised a BaseException that is not an Exception
    ├── ChildCrashed              the subprocess executor's child died mid-job
    └── RemoteError               the handler raised in a child; its type and traceback as text

:class:`ErrorInfo`, what an attempt that failed recorded (the ``error`` of a
:class:`JobFailed`), is defined here too, so that this module imports nothing else of panqueue.

A command the server refused for good (ACL permissions, a script error) is a plain
:class:`PanqueueError` whose message quotes the server.

The handler signals and the executor failures are plain ``Exception`` subclasses, on
purpose: they describe what happened to one job, so code that handles panqueue's own errors
(``except PanqueueError``) never swallows a handler's ``Retry`` or an attempt's timeout.
"""

from __future__ import annotations

import builtins
import traceback
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ChildCrashed",
    "ConfigError",
    "ConnectionError",
    "Fail",
    "HandlerAborted",
    "JobFailed",
    "JobNotFound",
    "JobTimeout",
    "LockLost",
    "PanqueueError",
    "PayloadError",
    "RateLimited",
    "RemoteError",
    "Retry",
    "ServerUnavailable",
    "SignalTimeout",
    "Snooze",
    "TimeoutError",
]


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder naming the type when that raises (a bad value from a
    handler must never stop a worker; ``HandlerAborted`` and ``ErrorInfo`` use this)."""
    try:
        return storable_text(str(exc))
    except Exception:
        return f"<{type(exc).__name__}: str() raised an exception>"


def storable_text(text: str) -> str:
    """``text`` as UTF-8 can store it: what it cannot encode (a lone surrogate, which JSON's
    ``\\ud800`` escapes make) written as its escape instead."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What a failed attempt recorded: exception type, message and formatted traceback.

    Defined here, below the job types that re-export it, because :class:`JobFailed` carries
    one: the exceptions import nothing else of panqueue.
    """

    type: str
    message: str
    traceback: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "traceback": self.traceback}

    @classmethod
    def from_exception(cls, exc: BaseException, with_traceback: bool = True) -> ErrorInfo:
        """Describe an exception, whatever it does: one whose ``__str__`` raises is described
        by its type alone (a bad value from a handler must never stop a worker)."""
        tb = None
        if with_traceback:
            try:
                tb = storable_text("".join(traceback.format_exception(exc)))
            except Exception:  # a broken __repr__ in a frame's locals, and the like
                tb = None
        return cls(storable_text(type(exc).__name__), exception_message(exc), tb)

    @classmethod
    def from_wire(cls, wire: Any) -> ErrorInfo | None:
        if not isinstance(wire, dict):
            return None
        return cls(str(wire.get("type", "")), str(wire.get("message", "")), wire.get("traceback"))


class PanqueueError(Exception):
    """Base class of every error panqueue raises on purpose."""


class ConfigError(PanqueueError):
    """A handler, option, queue name or URL is invalid."""


class PayloadError(PanqueueError):
    """Job data (or a result) is not JSON-compatible; the message names the offending path."""


class ConnectionError(PanqueueError, builtins.ConnectionError):
    """Redis could not be reached, or the connection broke mid-operation."""


class ServerUnavailable(ConnectionError):
    """Redis answered but cannot serve now: OOM under maxmemory, BUSY (a script is running),
    LOADING, READONLY (a replica after failover), MASTERDOWN, TRYAGAIN, CLUSTERDOWN; retried
    like a lost connection.

    The command was refused before it changed anything, so sending it again later is safe.
    """


class JobNotFound(PanqueueError, LookupError):
    """No job with that id exists in that queue (it may have been removed by retention)."""

    def __init__(self, queue: str, job_id: str) -> None:
        super().__init__(f"job {job_id!r} not found in queue {queue!r}")
        self.queue = queue
        self.job_id = job_id


class JobFailed(PanqueueError):
    """The job ended FAILED or CANCELLED; ``error`` holds what its last attempt recorded."""

    def __init__(self, queue: str, job_id: str, state: str, error: ErrorInfo | None) -> None:
        detail = f": {error.type}: {error.message}" if error is not None else ""
        super().__init__(f"job {job_id!r} in queue {queue!r} ended {state}{detail}")
        self.queue = queue
        self.job_id = job_id
        self.state = state
        self.error = error


class LockLost(PanqueueError):
    """A worker tried to finish or renew a job whose lock it no longer holds.

    The job's lock expired and the stalled sweep returned it to waiting (another worker may be
    running it now). Nothing was changed.
    """

    def __init__(self, queue: str, job_id: str) -> None:
        super().__init__(f"lock lost for job {job_id!r} in queue {queue!r}")
        self.queue = queue
        self.job_id = job_id


class TimeoutError(PanqueueError, builtins.TimeoutError):
    """Waiting (for example for a job's result) took longer than the given timeout."""


# -- signals a handler raises ---------------------------------------------------------------


class Retry(Exception):
    """Raise from a handler to retry the job (after ``delay`` seconds, else the backoff).

    The retry uses up an attempt: once ``attempts`` are used up the job fails.
    """

    def __init__(self, delay: float | None = None) -> None:
        super().__init__("retry requested" if delay is None else f"retry requested in {delay} s")
        self.delay = delay


class Fail(Exception):
    """Raise from a handler to fail the job now, without further attempts."""

    def __init__(self, reason: str = "failed by handler") -> None:
        super().__init__(reason)
        self.reason = reason


class SignalTimeout(PanqueueError):
    """``job.wait_for(name, timeout=...)`` in a durable handler: the signal did not come in
    time. Raised in the handler; the retry policy applies unless it catches it. A later run of
    the job raises it again at the same wait (the timeout is recorded, like a step)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no signal {name!r} came before the wait's timeout")
        self.name = name


class Snooze(Exception):
    """Raise from a handler to run the job again in ``seconds`` (for polling an outside
    state): the job goes back to DELAYED for that long and its attempt is not used up.

    Each snooze is recorded in the job's history (type ``Snoozed``). A handler registered with
    ``max_snoozes=N`` fails a job that snoozes more than N times (``max_snoozes_exceeded``).
    ``seconds`` must be finite, >= 0 and at most a year; any other value fails the attempt
    (error type ``InvalidSnooze``) like any error.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__(f"snoozed for {seconds} s")
        self.seconds = seconds


class RateLimited(Exception):
    """Raise from a handler when an outside service refuses for now (an HTTP 429, a quota):
    the job goes back to WAITING without using an attempt, and its key (keyed queues) or its
    whole queue starts no new job for ``retry_after`` seconds, across all workers.

    Each one is recorded in the job's history (type ``RateLimited``). ``retry_after`` must be
    finite, >= 0 and at most a year; any other value fails the attempt (error type
    ``InvalidRateLimited``) like any error.
    """

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited; retry after {retry_after} s")
        self.retry_after = retry_after


# -- how an executor reports a failed attempt (executors import these from executors.base) --


class JobTimeout(Exception):
    """Raised by ``Executor.run`` when an attempt exceeded its timeout."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"attempt exceeded its timeout of {timeout:g} s")
        self.timeout = timeout


class HandlerAborted(Exception):
    """The handler raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt`` in a thread or child, a custom ``BaseException``): the attempt
    failed like any other; the worker goes on. ``original`` is what was raised."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__}: {exception_message(original)}")
        self.original = original


class ChildCrashed(Exception):
    """The subprocess executor's child process died while running the job (or could not
    start); the message says how (signal, exit code, a resource limit)."""


class RemoteError(Exception):
    """An exception raised by the handler in a child process, as the child reported it:
    ``type_name`` and ``traceback`` are text, since no object crosses the process boundary."""

    def __init__(self, type_name: str, message: str, traceback: str | None) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.traceback = traceback
