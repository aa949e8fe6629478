"""Job options: retry policy (attempts, backoff), timeout; validation and the stored form.

A job's options come from, lowest first: the handler's defaults (worker side), the queue
handle's defaults, and the arguments of ``add``. Only what the producer set explicitly is stored
with the job; the worker merges it over the handler's defaults when it runs the job.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import random
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from panqueue._check import check_flag, check_int, check_number, check_one_of
from panqueue.errors import ConfigError

__all__ = ["Backoff", "JobOptions", "Permissions", "check_positive", "check_priority"]

MAX_PRIORITY = 1_000_000
# The longest duration panqueue accepts anywhere (delays, run_at ahead of now, timeouts,
# backoffs, dedup TTLs, lock TTLs, retention ages, rate windows, schedule intervals): 100 years.
# Longer values are mistakes; refusing them here keeps every time a script computes within what
# Redis stores exactly (the add script's own limit is 2^52 ms).
MAX_SECONDS = 100 * 365 * 24 * 3600
MAX_ATTEMPTS = 1_000_000


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
                check_int(value, f"Limits.{name}", low=1)


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
    The defaults bound Redis memory under any stream of jobs.
    """

    completed: int = 1000
    failed: int = 10_000
    completed_for: float | None = None
    failed_for: float | None = 7 * 24 * 3600.0
    history: int = 100_000

    def __post_init__(self) -> None:
        for name in ("completed", "failed"):
            check_int(getattr(self, name), f"Retention.{name}", low=-1, note=" (-1 keeps all)")
        check_int(self.history, "Retention.history", low=0, note=" (0 keeps no history)")
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


ON_UNSUPPORTED = ("fail", "warn")
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def parse_net_grant(entry: object) -> tuple[str, int]:
    """``host:port``, ``ip:port``, ``[v6]:port``, ``cidr:port`` or ``*:port`` as (host, port);
    ConfigError naming the entry when it is none of these. The host part is kept as written
    (an address, a network, ``*`` or a lower-cased host name)."""
    if not isinstance(entry, str):
        raise ConfigError(f"Permissions.net entries must be 'host:port' strings, got {entry!r}")
    what = f"Permissions.net entry {entry!r}"
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ConfigError(f"{what}: an IPv6 grant is written '[address]:port'")
        port_text = rest[1:]
        try:
            network = ipaddress.ip_network(host, strict=False)
        except ValueError:
            raise ConfigError(f"{what}: {host!r} is not an IPv6 address or network") from None
        if network.version != 6:
            raise ConfigError(f"{what}: brackets are for IPv6 addresses only")
    else:
        host, colon, port_text = entry.rpartition(":")
        if not colon or not host:
            raise ConfigError(f"{what}: expected 'host:port' (the port is required)")
        if ":" in host:
            raise ConfigError(f"{what}: write an IPv6 address in brackets, '[{host}]:port'")
        if host != "*":
            try:
                ipaddress.ip_network(host, strict=False)
            except ValueError:
                labels = host.rstrip(".").split(".")
                if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
                    raise ConfigError(f"{what}: {host!r} is not a host name, an address or a "
                                      "network") from None
                host = host.lower()
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"{what}: the port must be a number from 1 to 65535, "
                          f"got {port_text!r}")
    return host, int(port_text)


def _paths(value: object, what: str, *, bare_names: bool = False) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(f"Permissions.{what} must be a list of paths, got {value!r}")
    paths = []
    for item in value:
        if isinstance(item, os.PathLike):
            item = os.fspath(item)
        if not isinstance(item, str) or not item or "\0" in item:
            raise ConfigError(f"Permissions.{what} entries must be paths, got {item!r}")
        if not os.path.isabs(item) and not (bare_names and "/" not in item):
            raise ConfigError(f"Permissions.{what} entries must be absolute paths"
                              f"{' or program names' if bare_names else ''}, got {item!r}")
        paths.append(os.path.normpath(item) if os.path.isabs(item) else item)
    return tuple(paths)


@dataclass(frozen=True, slots=True)
class Permissions:
    """What a subprocess handler's child may do; everything else the kernel denies there.

    ``read`` / ``write``: absolute path prefixes the child may read / read and change (what
    the interpreter, the standard library, installed packages and the handler's module need
    is readable without a grant). ``net``: outbound TCP, as ``host:port``, ``ip:port``,
    ``[v6]:port``, ``cidr:port`` or ``*:port`` (UDP goes to the resolver only). ``listen``:
    TCP ports the child may bind. ``env``: names or globs of the environment variables it
    inherits. ``run``: programs it may execute (absolute, or a name found on ``PATH`` at
    registration). ``processes``: how many processes it may start. ``on_unsupported``:
    ``"fail"`` (the worker refuses the queue where the kernel cannot enforce this) or
    ``"warn"`` (run unsandboxed, with one WARNING per child).
    """

    read: Sequence[str] = ()
    write: Sequence[str] = ()
    net: Sequence[str] = ()
    listen: Sequence[int] = ()
    env: Sequence[str] = ()
    run: Sequence[str] = ()
    processes: int = 0
    on_unsupported: str = "fail"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "read", _paths(self.read, "read"))
        set_(self, "write", _paths(self.write, "write"))
        set_(self, "run", _paths(self.run, "run", bare_names=True))
        if isinstance(self.net, (str, bytes)) or not isinstance(self.net, Iterable):
            raise ConfigError(f"Permissions.net must be a list of 'host:port' strings, "
                              f"got {self.net!r}")
        net = tuple(self.net)
        for entry in net:
            parse_net_grant(entry)
        set_(self, "net", net)
        if isinstance(self.listen, (str, bytes)) or not isinstance(self.listen, Iterable):
            raise ConfigError(f"Permissions.listen must be a list of TCP ports, "
                              f"got {self.listen!r}")
        listen = tuple(self.listen)
        for port in listen:
            check_int(port, "Permissions.listen entries", low=1, high=65535,
                      expected="ports (ints from 1 to 65535)")
        set_(self, "listen", listen)
        if isinstance(self.env, (str, bytes)) or not isinstance(self.env, Iterable):
            raise ConfigError(f"Permissions.env must be a list of variable names or globs, "
                              f"got {self.env!r}")
        env = tuple(self.env)
        for name in env:
            if not isinstance(name, str) or not name or "=" in name or "\0" in name:
                raise ConfigError(f"Permissions.env entries must be variable names or globs, "
                                  f"got {name!r}")
        set_(self, "env", env)
        check_int(self.processes, "Permissions.processes", low=0)
        if self.run and not self.processes:
            raise ConfigError("Permissions.run needs processes >= 1: a program runs in a process "
                              "of its own")
        check_one_of(self.on_unsupported, "Permissions.on_unsupported", ON_UNSUPPORTED)

    def net_ports(self) -> set[int]:
        """The TCP ports of the ``net`` grants (for the kernel's port rules)."""
        return {parse_net_grant(entry)[1] for entry in self.net}

    def resolved(self, queue: str) -> Permissions:
        """These permissions with each ``run`` program an absolute path that exists (a bare
        name looked up on ``PATH`` now); ConfigError naming the program otherwise."""
        programs = []
        for program in self.run:
            found = shutil.which(program) if "/" not in program else program
            if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
                why = "is not on PATH" if "/" not in program else "is not an executable file"
                raise ConfigError(f"permissions for queue {queue!r}: run program {program!r} "
                                  f"{why}")
            programs.append(os.path.abspath(found))
        return dataclasses.replace(self, run=tuple(programs))
