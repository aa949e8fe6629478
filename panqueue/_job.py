"""Jobs as users see them: ``Job`` inside a handler, ``JobInfo`` when reading one back."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgpack

from panqueue._codec import decode
from panqueue._options import JobOptions

__all__ = ["ErrorInfo", "Fail", "Job", "JobInfo", "JobState", "Retry", "from_ms"]


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


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What a failed attempt recorded: exception type, message and formatted traceback."""

    type: str
    message: str
    traceback: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "traceback": self.traceback}

    @classmethod
    def from_wire(cls, wire: Any) -> ErrorInfo | None:
        if not isinstance(wire, dict):
            return None
        return cls(str(wire.get("type", "")), str(wire.get("message", "")), wire.get("traceback"))


def from_ms(value: bytes | str | int | None) -> datetime | None:
    if value is None or value == b"" or value == "":
        return None
    return datetime.fromtimestamp(int(value) / 1000, tz=UTC)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A snapshot of one job as stored in Redis."""

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

    @classmethod
    def from_hash(cls, queue: str, job_id: str, h: dict[bytes, bytes],
                  logs: list[bytes]) -> JobInfo:
        def text(name: bytes) -> str | None:
            raw = h.get(name)
            return None if raw is None else raw.decode()

        history: list[dict[str, Any]] = []
        if h.get(b"h"):
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=_no_ext)
            unpacker.feed(h[b"h"])
            history = [entry for entry in unpacker if isinstance(entry, dict)]
        return cls(
            id=job_id,
            queue=queue,
            state=JobState(text(b"s") or "waiting"),
            data=decode(h.get(b"d")),
            attempts=int(h.get(b"a") or 0),
            progress=decode(h.get(b"pg")),
            logs=[line.decode(errors="replace") for line in logs],
            result=decode(h.get(b"r")),
            error=ErrorInfo.from_wire(decode(h.get(b"e"))),
            enqueued_at=from_ms(h.get(b"et")),
            started_at=from_ms(h.get(b"st")),
            finished_at=from_ms(h.get(b"ft")),
            priority=int(h.get(b"p") or 0),
            failure_reason=text(b"fr"),
            history=history,
            options=decode(h.get(b"o")) or {},
        )

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
        }


def _no_ext(code: int, data: bytes) -> Any:
    return None


Reporter = Callable[[str, str, Any], Awaitable[None]]


class Job:
    """The job a handler runs: its data and a way to report progress and log lines."""

    __slots__ = ("_report", "attempt", "data", "enqueued_at", "id", "options", "queue", "token")

    def __init__(self, *, id: str, queue: str, data: Any, attempt: int, options: JobOptions,
                 enqueued_at: datetime | None, token: str, report: Reporter) -> None:
        self.id = id
        self.queue = queue
        self.data = data
        self.attempt = attempt
        self.options = options
        self.enqueued_at = enqueued_at
        self.token = token
        self._report = report

    async def progress(self, value: Any) -> None:
        """Record progress (0..100 or any JSON-compatible value); visible in ``info()``."""
        await self._report(self.id, "p", value)

    async def log(self, message: str) -> None:
        """Append a line to the job's log (the newest lines are kept, up to a cap)."""
        await self._report(self.id, "l", str(message))

    def __repr__(self) -> str:
        return f"<Job {self.queue}/{self.id} attempt={self.attempt}>"


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
