"""The Executor protocol: how a worker hands one job to whatever runs the handler, the types
through which an executor reports a failed attempt, and those through which a handler that runs
elsewhere reports progress and log lines.

The failure types are defined in :mod:`panqueue.errors` (one hierarchy, drawn there) and
re-exported here: executors and the worker runtime import them from this module.

Reports: a handler that runs on the worker's event loop is given the :class:`Job` itself. One
that runs elsewhere is given a view of it, ``job.rebind(sink, should_stop)``: the view's
``progress()`` and ``log()`` call ``sink(kind, value)`` (:data:`Sink`, ``kind`` a
:data:`ReportKind`), which carries the report back to the event loop and makes it there with
the job's own ``job.progress(value)`` or ``job.log(value)``. A sink that reports synchronously
returns :data:`DONE`. An executor whose handler runs in another process sends the reports over
its own channel and makes them with ``job.progress`` / ``job.log`` as they arrive.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from panqueue._job import DONE, Job, ReportKind, Sink
from panqueue.errors import ChildCrashed, ConfigError, HandlerAborted, JobTimeout, RemoteError

if TYPE_CHECKING:
    from panqueue._handler import HandlerBase

__all__ = ["DONE", "ChildCrashed", "Executor", "HandlerAborted", "JobTimeout", "RemoteError",
           "ReportKind", "Sink"]


class Executor(ABC):
    """Runs one handler's jobs. A Worker owns one executor per queue.

    Lifecycle: :meth:`start` once; :meth:`run` for each job, concurrently up to the handler's
    concurrency; then shutdown in two phases: :meth:`request_stop` (cooperative: running jobs
    are asked to finish) and, for jobs still running after the grace period, cancellation of
    the task awaiting :meth:`run`, which must then stop the job by force (cancel, abandon the
    thread, kill the child) and return promptly; finally :meth:`aclose`.
    """

    name: ClassVar[str] = "executor"
    #: Whether the executor honours the subprocess isolation options (limits, env, cwd, ...).
    isolates: ClassVar[bool] = False
    #: Whether the executor can run chunk handlers (:meth:`run_chunk`).
    runs_chunks: ClassVar[bool] = False
    #: Told why, each time the executor replaces what runs handlers because an attempt went
    #: wrong: ``"crashed"`` (a child died), ``"timeout"`` or ``"stopped"`` (a child killed, or
    #: a thread left running, when its attempt timed out or was stopped). The worker sets it
    #: when it has a metrics object; ``None`` otherwise. Call :meth:`restarted`, not this.
    on_restart: Callable[[str], None] | None = None

    def __init__(self, handler: HandlerBase[Any, Any]) -> None:
        self.handler = handler

    @classmethod
    def check_handler(cls, fn: Any, queue: str) -> None:
        """Raise ConfigError at registration if this executor cannot run ``fn``."""

    async def start(self) -> None:
        """Prepare resources (pools, child processes). Default: nothing."""

    @abstractmethod
    async def run(self, job: Job, timeout: float | None) -> Any:
        """Run the handler for ``job`` and return its result.

        Raises what the handler raised, or :class:`JobTimeout` after ``timeout`` seconds; an
        executor that cannot report the handler's own exception raises :class:`HandlerAborted`,
        :class:`ChildCrashed` or :class:`RemoteError` instead.
        """

    async def run_chunk(self, jobs: list[Job], timeout: float | None) -> Any:
        """Run a chunk handler on ``jobs`` in one call and return what it returned; raises as
        :meth:`run` does, the timeout bounding the whole call. Only for executors whose
        :attr:`runs_chunks` is true (registration refuses the others)."""
        raise ConfigError(f"executor {self.name!r} does not run chunk handlers")

    def restarted(self, reason: str) -> None:
        """Report a replaced child, thread or pool (see :attr:`on_restart`)."""
        if self.on_restart is not None:
            self.on_restart(reason)

    def request_stop(self) -> None:
        """Phase one of shutdown: ask running jobs to finish. Default: nothing."""

    async def aclose(self) -> None:
        """Release resources once no job runs. Default: nothing."""
