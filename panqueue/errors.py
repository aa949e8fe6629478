"""The exceptions panqueue raises, in one hierarchy.

Every error a user can act on is a :class:`PanqueueError`; the message names what was wrong.
Errors of redis-py and of the network are translated in one place (the transport)::

    PanqueueError
    ├── ConfigError           a handler, option, queue name or URL is invalid
    ├── PayloadError          data or a result is not JSON-compatible
    ├── ConnectionError       Redis unreachable, or the connection broke (also builtins')
    │   └── ServerUnavailable Redis answered but cannot serve now (OOM, BUSY, LOADING, ...)
    ├── JobNotFound           no such job (also a LookupError)
    ├── JobFailed             the job ended failed or cancelled
    ├── LockLost              a worker no longer holds the job's lock
    └── TimeoutError          waiting took too long (also builtins')

A command the server refused for good (ACL permissions, a script error) is a plain
:class:`PanqueueError` whose message quotes the server.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from panqueue._job import ErrorInfo

__all__ = [
    "ConfigError",
    "ConnectionError",
    "JobFailed",
    "JobNotFound",
    "LockLost",
    "PanqueueError",
    "PayloadError",
    "ServerUnavailable",
    "TimeoutError",
]


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
