"""Jobs as users see them: ``Job`` inside a handler, ``JobInfo`` when reading one back."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple

from panqueue._durable import DurableRun, sleep_spec, wait_timeout
from panqueue._options import JobOptions
from panqueue.errors import ConfigError, ErrorInfo, Fail, Retry  # the last three: kept here

__all__ = ["DONE", "Bridge", "ChunkFailure", "ErrorInfo", "Fail", "Job", "JobInfo", "JobState",
           "LogLine", "PayloadT", "ReportKind", "Retry", "Sink", "from_ms", "log_line",
           "parse_log_line"]

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    # The type of a job's data: ``Job[Email]`` in a handler's signature types ``job.data`` and,
    # through the registry, the ``add()`` of ``client.queue(handler)``. Unparametrized (``Job``,
    # a queue named by a string) it is Any. The default is for type checkers only.
    PayloadT = TypeVar("PayloadT", default=Any)
else:
    from typing import TypeVar

    PayloadT = TypeVar("PayloadT")


class JobState(enum.StrEnum):
    WAITING = "waiting"
    DELAYED = "delayed"
    BLOCKED = "blocked"
    ACTIVE = "active"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


class LogLine(NamedTuple):
    """One line of a job's log: when the worker took it (None for a line stored before the
    lines carried it), the attempt that wrote it (None likewise), and the text."""

    at: datetime | None
    attempt: int | None
    message: str


# A stored log line is its text behind a stamp: US, the time in ms, a space, the attempt
# number, US. The unit separator does not occur in a stamp, so the text may hold anything.
_STAMP = "\x1f"


def log_line(at: float, attempt: int, message: str) -> str:
    """A log line as stored: ``message`` stamped with ``at`` (epoch seconds) and the
    attempt number."""
    return f"{_STAMP}{round(at * 1000)} {attempt}{_STAMP}{message}"


def parse_log_line(stored: str) -> LogLine:
    """A stored log line back as a :class:`LogLine` (a line without a stamp is its text)."""
    if stored.startswith(_STAMP):
        stamp, sep, message = stored[1:].partition(_STAMP)
        ms, _, attempt = stamp.partition(" ")
        if sep and ms.isdigit() and attempt.isdigit():
            return LogLine(from_ms(int(ms)), int(attempt), message)
    return LogLine(None, None, stored)


def _async_step(name: str) -> ConfigError:
    return ConfigError(f"job.step({name!r}, fn): fn is async, and a handler that runs in a "
                       "thread or a subprocess calls its steps plainly; pass a plain "
                       "function, or make the handler async")


def from_ms(value: bytes | str | int | None) -> datetime | None:
    if value is None or value == b"" or value == "":
        return None
    return datetime.fromtimestamp(int(value) / 1000, tz=UTC)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A snapshot of one job as stored in Redis (``client.get_job``, ``handle.info()``,
    ``client.list_jobs``)."""

    id: str
    queue: str
    state: JobState
    data: Any
    attempts: int
    progress: Any
    logs: list[str]
    result: Any
    error: ErrorInfo | None
    enqueued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    priority: int = 0
    failure_reason: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    #: The deadline to start by (``add(..., expires=)``), or None.
    expires_at: datetime | None = None
    #: When a delayed job is due (its delay, its retry's backoff or its snooze ends), or None.
    run_at: datetime | None = None
    #: The worker running an active job (the one whose claim holds its lock), or None.
    worker: str | None = None
    #: For a retry that waits (out its backoff, or its turn): the attempt it follows, whose
    #: error is ``error``; None for a job that has not failed an attempt since it last ran.
    retry_of: int | None = None
    #: How many attempts the job has in all, as its last failed attempt was told (with
    #: ``retry_of``: "retry ``retry_of + 1`` of ``max_attempts``"), or None.
    max_attempts: int | None = None
    #: The lines of :attr:`logs` with when each was written and by which attempt.
    log_lines: list[LogLine] = field(default_factory=list)
    #: The job's tags (``add(..., tags=[...])``), in the order they were given.
    tags: list[str] = field(default_factory=list)
    #: A durable job's completed steps and their results (``job.step``), in the order they
    #: completed; and when each was stored.
    steps: dict[str, Any] = field(default_factory=dict)
    steps_at: dict[str, datetime | None] = field(default_factory=dict)
    #: The signal a DELAYED durable job waits for (``job.wait_for``), or None.
    waiting_for: str | None = None
    #: When a DELAYED durable job's sleep (``job.sleep``) ends, or None.
    sleeping_until: datetime | None = None
    #: When the job last became ready again after its add (out of a delay, a backoff, a
    #: snooze, a sleep, its dependencies, a retry), or None: a waiting job has waited since
    #: the later of this and ``enqueued_at``.
    ready_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the CLI's ``panqueue job`` prints this)."""
        def iso(value: datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        return {
            "id": self.id,
            "queue": self.queue,
            "state": self.state.value,
            "data": self.data,
            "attempts": self.attempts,
            "priority": self.priority,
            "progress": self.progress,
            "logs": self.logs,
            "result": self.result,
            "error": None if self.error is None else self.error.to_wire(),
            "failure_reason": self.failure_reason,
            "history": self.history,
            "options": self.options,
            "enqueued_at": iso(self.enqueued_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "expires_at": iso(self.expires_at),
            "run_at": iso(self.run_at),
            "worker": self.worker,
            "retry_of": self.retry_of,
            "max_attempts": self.max_attempts,
            "log_lines": [{"at": iso(line.at), "attempt": line.attempt,
                           "message": line.message} for line in self.log_lines],
            "tags": self.tags,
            "steps": [{"name": name, "result": result, "at": iso(self.steps_at.get(name))}
                      for name, result in self.steps.items()],
            "waiting_for": self.waiting_for,
            "sleeping_until": iso(self.sleeping_until),
            "ready_at": iso(self.ready_at),
        }


class _Done:
    """An awaitable that is already complete: what ``job.progress()`` returns in a thread or a
    child process, where the report was made synchronously (awaiting it is harmless)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover - makes this a generator


DONE = _Done()

#: What a job reports: ``"p"``, a progress value (``job.progress``), or ``"l"``, a log line
#: (``job.log``).
ReportKind = Literal["p", "l"]

#: Where a job's reports go: called with the kind of report and its value, it returns what
#: ``job.progress()`` / ``job.log()`` return (an awaitable: the report is written once it is
#: awaited, or at once when the sink reports synchronously and returns :data:`DONE`). Given to
#: a :class:`Job` when it is made, or by an executor to a view of it with :meth:`Job.rebind`.
Sink = Callable[[ReportKind, Any], Awaitable[None]]

#: How a view of a job that runs elsewhere (a thread, a child process) makes its durable calls:
#: ``bridge(op, *args)`` has :meth:`Job.relay_durable` run them on the job the worker holds and
#: returns the result (or raises).
Bridge = Callable[..., Any]

#: The durable run of a job's attempt (its steps, sleeps and waits), made by the first durable
#: call: a handler that makes none costs its attempt nothing for it.
DurableSource = Callable[[], DurableRun]

_DURABLE_OPS = frozenset({"begin_step", "end_step", "sleep", "wait_for"})


def _never() -> bool:
    return False


class Job(Generic[PayloadT]):
    """The job a handler runs: its data, and ways to report progress and ask whether to stop.

    Annotate a handler's parameter ``Job[Email]`` (a TypedDict or a dataclass) to type
    ``job.data`` and the ``add()`` of the queue made from the handler (see docs/typing.md).

    In async handlers ``await job.progress(50)``; in thread and subprocess handlers the same
    methods are plain calls (``job.progress(50)``): they report at once and return an awaitable
    that is already done.
    """

    __slots__ = ("_bridge", "_durable", "_enqueued_at", "_enqueued_ms", "_sink", "_stop",
                 "attempt", "data", "id", "options", "queue")

    def __init__(self, *, id: str, queue: str, data: PayloadT, attempt: int, options: JobOptions,
                 sink: Sink, should_stop: Callable[[], bool] = _never,
                 enqueued_at: datetime | None = None, enqueued_at_ms: int | None = None,
                 durable: DurableSource | None = None, bridge: Bridge | None = None) -> None:
        self.id = id
        self.queue = queue
        self.data = data
        self.attempt = attempt
        self.options = options
        self._enqueued_at = enqueued_at
        self._enqueued_ms = enqueued_at_ms
        self._sink = sink
        self._stop = should_stop
        self._durable = durable
        self._bridge = bridge

    @property
    def enqueued_at(self) -> datetime | None:
        """When the job was added (server clock, UTC)."""
        if self._enqueued_at is None and self._enqueued_ms:
            self._enqueued_at = from_ms(self._enqueued_ms)  # made on first use: hot path
        return self._enqueued_at

    @property
    def enqueued_at_ms(self) -> int | None:
        """:attr:`enqueued_at` in milliseconds since the epoch: how an executor hands it on
        (to a child process) without making the datetime."""
        if self._enqueued_ms is None and self._enqueued_at is not None:
            return int(self._enqueued_at.timestamp() * 1000)
        return self._enqueued_ms

    def progress(self, value: Any) -> Awaitable[None]:
        """Record progress (0..100 or any JSON-compatible value); visible in ``info()``."""
        return self._sink("p", value)

    def log(self, message: str) -> Awaitable[None]:
        """Append a line to the job's log (the newest lines are kept, up to a cap)."""
        return self._sink("l", str(message))

    def should_stop(self) -> bool:
        """True once the worker is shutting down or the job was cancelled: a long-running
        handler should return (or raise) soon. Always cheap; no I/O."""
        return self._stop()

    # ------------------------------------------------------------------ durable jobs

    def _run(self, what: str) -> DurableRun:
        if self._durable is None:
            raise ConfigError(f"job.{what}() is for handlers of single jobs on the inline, "
                              "thread and subprocess executors (not chunk handlers)")
        return self._durable()

    def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` once for this job: its JSON-compatible result is stored with the
        job, and every later run of the job (a retry, a resume after a sleep or a signal, a
        recovery after a crash) returns it without calling ``fn``. A step that raises stores
        nothing. Names are unique within a job. Async handlers ``await`` it, and their ``fn``
        may be sync or async; thread and subprocess handlers call it plainly (it returns the
        result), and their ``fn`` is a plain function."""
        if self._bridge is None:
            return self._run("step").step(name, fn, args)
        found, value = self._bridge("begin_step", name)
        if found:
            return value
        if inspect.iscoroutinefunction(fn):
            raise _async_step(name)
        value = fn(*args)
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never awaited: closed, so Python does not warn of it
            raise _async_step(name)
        self._bridge("end_step", name, value)
        return value

    def sleep(self, seconds: float | timedelta | None = None, *,
              until: datetime | None = None) -> Any:
        """End this run and resume the job after ``seconds`` (a number or a timedelta) or at
        ``until`` (an aware datetime): the job is DELAYED meanwhile, its slot free and no
        attempt used; the handler then runs from the top, its steps replayed, and this sleep
        returns at once. Awaited in async handlers, a plain call in thread and subprocess
        ones."""
        at_ms, delay_ms = sleep_spec(seconds, until)
        if self._bridge is None:
            return self._run("sleep").sleep(at_ms, delay_ms)
        return self._bridge("sleep", at_ms, delay_ms)

    def wait_for(self, name: str, timeout: float | timedelta | None = None) -> Any:
        """The payload of the signal ``name`` (``client.signal(queue, id, name, payload)``).
        A signal sent earlier is kept and returned at once; otherwise the run ends and the job
        is DELAYED, holding no slot, until the signal comes (then it runs again from the top)
        or ``timeout`` passes (then this raises :class:`~panqueue.SignalTimeout`). Awaited in
        async handlers, a plain call in thread and subprocess ones."""
        timeout_ms = wait_timeout(timeout)
        if self._bridge is None:
            return self._run("wait_for").wait_for(name, timeout_ms)
        return self._bridge("wait_for", name, timeout_ms)

    async def relay_durable(self, op: str, *args: Any) -> Any:
        """For executors whose handler runs elsewhere (a thread, a child process): run the
        durable operation ``op`` (``begin_step``, ``end_step``, ``sleep``, ``wait_for``) that
        the handler's view asked for, on this job, and return its result."""
        if op not in _DURABLE_OPS:
            raise ConfigError(f"no durable operation {op!r}")
        return await getattr(self._run(op), op)(*args)

    def rebind(self, sink: Sink, should_stop: Callable[[], bool],
               bridge: Bridge | None = None) -> Job[PayloadT]:
        """The same job with another way to report and to be told to stop: what an executor
        gives a handler that runs elsewhere (a thread). The view's ``progress()`` and ``log()``
        call ``sink``, which carries each report back and makes it through this job's own
        ``progress()`` / ``log()``; its ``should_stop()`` calls ``should_stop``. ``bridge``
        (:data:`Bridge`) makes the view's durable calls plain ones: it runs each on the loop
        that owns the job and returns its result."""
        return Job(id=self.id, queue=self.queue, data=self.data, attempt=self.attempt,
                   options=self.options, enqueued_at=self._enqueued_at,
                   enqueued_at_ms=self._enqueued_ms, sink=sink,
                   should_stop=should_stop, durable=self._durable, bridge=bridge)

    def __repr__(self) -> str:
        return f"<Job {self.queue}/{self.id} attempt={self.attempt}>"



@dataclass(frozen=True, slots=True)
class ChunkFailure:
    """What a chunk handler returns in the slot of a job that failed, instead of its result:
    that job alone fails (its own retry policy applies), the others complete.

    ``index``: the job's position in the chunk (the slot it is returned in). ``error``: an
    exception (``Retry``, ``Fail`` and ``Snooze`` work as if the job's own handler had raised
    them) or a message.
    """

    index: int
    error: BaseException | str
