"""Job options: retry policy (attempts, backoff), timeout; validation and the stored form.

A job's options come from, lowest first: the handler's defaults (worker side), the queue
handle's defaults, and the arguments of ``add``. Only what the producer set explicitly is stored
with the job; the worker merges it over the handler's defaults when it runs the job.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from panqueue._check import check_flag, check_int, check_number, check_one_of
from panqueue.errors import ConfigError

__all__ = ["Backoff", "JobOptions", "check_positive", "check_priority"]

MAX_PRIORITY = 1_000_000
# The longest duration panqueue accepts anywhere (delays, run_at ahead of now, timeouts,
# backoffs, dedup TTLs, lock TTLs, retention ages, rate windows, schedule intervals): 100 years.
# Longer values are mistakes; refusing them here keeps every time a script computes within what
# Redis stores exactly (the add script's own limit is 2^52 ms).
MAX_SECONDS = 100 * 365 * 24 * 3600
MAX_ATTEMPTS = 1_000_000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(moment: datetime) -> int:
    """An aware ``moment`` in ms since the epoch, rounded up. The server's clock counts whole
    ms, and a job is due (or past its deadline) once that count reaches the stored one: rounded
    down, a job asked to run at 10:00:00.000600 could start at 10:00:00.000, before its time."""
    return -(-((moment - _EPOCH) // timedelta(microseconds=1)) // 1000)


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before retrying a failed attempt.

    ``Backoff.exponential(1.0, max=60.0)`` waits 1, 2, 4, ... seconds, at most 60; with
    ``jitter`` (the default for exponential) each delay is drawn uniformly from its upper half,
    so that jobs failing together do not retry together.
    """

    kind: Literal["fixed", "exponential"]
    delay: float
    max: float | None = None
    jitter: bool = False

    def __post_init__(self) -> None:
        check_one_of(self.kind, "backoff kind", ("fixed", "exponential"))
        check_positive(self.delay, "backoff delay", allow_zero=True)
        if self.max is not None:
            check_positive(self.max, "backoff max")
        check_flag(self.jitter, "backoff jitter")

    @classmethod
    def exponential(cls, base: float = 1.0, *, max: float | None = 60.0,
                    jitter: bool = True) -> Backoff:
        return cls("exponential", base, max, jitter)

    @classmethod
    def fixed(cls, delay: float, *, jitter: bool = False) -> Backoff:
        return cls("fixed", delay, None, jitter)

    def delay_for(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        exponent = 0 if self.kind == "fixed" else min(attempt - 1, 62)
        delay = self.delay * 2.0**exponent
        if self.max is not None:
            delay = min(delay, self.max)
        if self.jitter:
            delay = random.uniform(delay / 2, delay)
        return delay

    def to_wire(self) -> list[Any]:
        return [self.kind, self.delay, self.max, self.jitter]

    @classmethod
    def from_wire(cls, wire: Any) -> Backoff:
        kind, delay, maximum, jitter = wire
        return cls(kind, float(delay), None if maximum is None else float(maximum), bool(jitter))


@dataclass(frozen=True, slots=True)
class JobOptions:
    """The retry and timeout policy of one job, as the worker applies it.

    ``attempts``: how many times the job may run before it fails finally (1 = no retry).
    ``backoff``: delay between attempts. ``timeout``: seconds one attempt may take.
    """

    attempts: int = 1
    backoff: Backoff = field(default_factory=lambda: Backoff.exponential(1.0, max=60.0))
    timeout: float | None = None

    def merged(self, wire: dict[str, Any] | None) -> JobOptions:
        """These options (a handler's defaults) overridden by a job's stored options."""
        if not wire:
            return self
        return JobOptions(
            attempts=int(wire.get("attempts", self.attempts)),
            backoff=Backoff.from_wire(wire["backoff"]) if "backoff" in wire else self.backoff,
            timeout=float(wire["timeout"]) if wire.get("timeout") is not None else self.timeout,
        )


def check_positive(value: object, what: str, *, allow_zero: bool = False) -> float:
    """A duration in seconds: a finite number, > 0 (or >= 0), at most :data:`MAX_SECONDS`."""
    seconds = check_number(value, what)
    if seconds < 0 or (seconds == 0 and not allow_zero) or seconds != seconds:
        raise ConfigError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {seconds!r}")
    if seconds > MAX_SECONDS:
        raise ConfigError(f"{what} must be at most {MAX_SECONDS} s (100 years), got {seconds!r}")
    return float(seconds)


def check_attempts(value: object) -> int:
    return check_int(value, "attempts", low=1, high=MAX_ATTEMPTS)


def check_priority(value: object) -> int:
    return check_int(value, "priority", low=-MAX_PRIORITY, high=MAX_PRIORITY)


def options_to_wire(attempts: int | None, backoff: Backoff | None,
                    timeout: float | None) -> dict[str, Any]:
    """The explicitly set options of one job, validated, in their stored form."""
    wire: dict[str, Any] = {}
    if attempts is not None:
        wire["attempts"] = check_attempts(attempts)
    if backoff is not None:
        if not isinstance(backoff, Backoff):
            raise ConfigError(f"backoff must be a panqueue.Backoff, got {backoff!r}")
        wire["backoff"] = backoff.to_wire()
    if timeout is not None:
        wire["timeout"] = check_positive(timeout, "timeout")
    return wire



@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of a subprocess handler's child process (``resource.setrlimit``).

    ``memory_mb``: address-space limit (RLIMIT_AS); allocations beyond it fail with MemoryError.
    ``cpu_seconds``: CPU time of the child (RLIMIT_CPU); the kernel kills it past the limit.
    ``open_files``: file descriptors (RLIMIT_NOFILE).
    """

    memory_mb: int | None = None
    cpu_seconds: int | None = None
    open_files: int | None = None

    def __post_init__(self) -> None:
        for name in ("memory_mb", "cpu_seconds", "open_files"):
            value = getattr(self, name)
            if value is not None:
                # memory_mb becomes bytes for setrlimit, which takes at most 2**63 - 1.
                check_int(value, f"Limits.{name}", low=1,
                          high=(2**63 - 1) >> 20 if name == "memory_mb" else None)


# What a subprocess handler's child inherits from the worker's environment when env= is not
# given: enough to find programs and decode text, nothing that could hold a secret.
DEFAULT_CHILD_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


@dataclass(frozen=True, slots=True)
class Isolation:
    """How the subprocess executor isolates a handler (see docs/executors.md)."""

    env: tuple[str, ...] = DEFAULT_CHILD_ENV
    cwd: str | None = None
    limits: Limits | None = None
    max_jobs_per_child: int | None = None
    new_session: bool = True


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a queue keeps finished jobs (with their results, errors and logs).

    ``completed`` / ``failed``: keep at most this many (the newest); ``-1`` keeps all.
    Failed jobs are the dead-letter set; cancelled jobs follow the ``failed`` limits.
    ``completed_for`` / ``failed_for``: also delete them this many seconds after they finished.
    ``history``: the queue's history stream (one record per finished job, for
    ``panqueue.spark.export_history``) keeps about this many records; ``0`` writes none.
    ``events``: the queue's event stream (``client.events``) keeps about this many events.
    Events are written while somebody reads the stream (``client.events()``,
    ``read_events()``, the dashboard's events page: each read asks for them for the next hour);
    the events of a job's end (``completed``, ``failed``, ``cancelled``) also while somebody
    waits on a result or counts them (``result()``, ``read_events(..., watch=False)``: the same
    ask, for the ends alone), and always where the job's finished set keeps none. So a queue
    nobody reads nor waits on writes no event: three stream writes per job fewer.
    ``events_always=True`` writes every event even then; ``events=0`` never writes the events
    other than the ends, and keeps about 1,000 ends of jobs.
    The defaults bound Redis memory under any stream of jobs.
    """

    completed: int = 1000
    failed: int = 10_000
    completed_for: float | None = None
    failed_for: float | None = 7 * 24 * 3600.0
    history: int = 100_000
    events: int = 10_000
    events_always: bool = False

    def __post_init__(self) -> None:
        for name in ("completed", "failed"):
            check_int(getattr(self, name), f"Retention.{name}", low=-1, note=" (-1 keeps all)")
        check_int(self.history, "Retention.history", low=0, note=" (0 keeps no history)")
        check_int(self.events, "Retention.events", low=0,
                  note=" (0 keeps only the events of a job's end)")
        check_flag(self.events_always, "Retention.events_always")
        if self.events_always and self.events == 0:
            raise ConfigError("Retention.events_always=True writes every event, but events=0 "
                              "keeps only the events of a job's end: choose one")
        for name in ("completed_for", "failed_for"):
            value = getattr(self, name)
            if value is not None:
                check_positive(value, f"Retention.{name}")

    @staticmethod
    def age_ms(seconds: float | None) -> int:
        return -1 if seconds is None else int(seconds * 1000)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``max`` jobs of the queue start in any window of ``per`` seconds, across all
    workers and hosts (a sliding window, so no burst of 2 x max across a window boundary).
    With ``per_key=True`` (keyed queues) the limit applies to each key separately.

    With ``adaptive=True`` the limit in force (the effective limit) follows what an outside
    service accepts: a handler's ``RateLimited`` halves it (down to 1), and every
    ``recover_every`` seconds without one raise it by one again, up to ``max``. It is kept per
    key with ``per_key=True``, else for the whole queue, in Redis (shared by every worker)."""

    max: int
    per: float = 1.0
    per_key: bool = False
    adaptive: bool = False
    recover_every: float = 60.0

    def __post_init__(self) -> None:
        check_int(self.max, "RateLimit.max", low=1)
        check_positive(self.per, "RateLimit.per")
        if self.per < 0.001:
            raise ConfigError(f"RateLimit.per must be at least 0.001 s, got {self.per!r}")
        check_flag(self.per_key, "RateLimit.per_key")
        check_flag(self.adaptive, "RateLimit.adaptive")
        check_positive(self.recover_every, "RateLimit.recover_every")
        if self.recover_every < 0.001:
            raise ConfigError("RateLimit.recover_every must be at least 0.001 s, "
                              f"got {self.recover_every!r}")

    @property
    def recover_every_ms(self) -> int:
        """The recovery step as stored in queue meta: 0 when the limit is not adaptive."""
        return int(self.recover_every * 1000) if self.adaptive else 0


DEDUP_STRATEGIES = ("keep", "replace", "extend")


@dataclass(frozen=True, slots=True)
class Dedup:
    """Deduplicate adds by ``key`` for ``ttl`` seconds.

    While a job added under the same key exists and the key is live: ``keep`` returns the
    existing job unchanged; ``extend`` does too and restarts the TTL; ``replace`` deletes the
    existing job if it has not started yet (waiting, delayed or blocked) and adds the new one,
    and adds the new one beside it if it has already started or finished.
    """

    key: str
    ttl: float = 60.0
    strategy: str = "keep"

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key or not self.key.isprintable():
            raise ConfigError(f"Dedup.key must be a non-empty printable str, got {self.key!r}")
        check_positive(self.ttl, "Dedup.ttl")
        check_one_of(self.strategy, "Dedup.strategy", DEDUP_STRATEGIES)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Run a handler on chunks of jobs: it gets up to ``size`` jobs in one call, or fewer once
    ``wait`` seconds have passed since the first of them was claimed (see docs/job-control.md,
    "Chunk handlers")."""

    size: int
    wait: float = 1.0

    def __post_init__(self) -> None:
        check_int(self.size, "Chunk.size", low=1)
        check_positive(self.wait, "Chunk.wait", allow_zero=True)
