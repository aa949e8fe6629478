"""The Executor protocol: how a worker hands one job to whatever runs the handler."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from panqueue._job import Job
    from panqueue._registry import Handler

__all__ = ["Executor", "HandlerAborted", "JobTimeout"]


class JobTimeout(Exception):
    """Raised by :meth:`Executor.run` when an attempt exceeded its timeout."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"attempt exceeded its timeout of {timeout:g} s")
        self.timeout = timeout


class HandlerAborted(Exception):
    """The handler raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt`` in a thread or child, a custom ``BaseException``): the attempt
    failed like any other; the worker goes on. ``original`` is what was raised."""

    def __init__(self, original: BaseException) -> None:
        from panqueue._job import exception_message

        super().__init__(f"{type(original).__name__}: {exception_message(original)}")
        self.original = original


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

    def __init__(self, handler: Handler[Any, Any]) -> None:
        self.handler = handler

    @classmethod
    def check_handler(cls, fn: Any, queue: str) -> None:
        """Raise ConfigError at registration if this executor cannot run ``fn``."""

    async def start(self) -> None:
        """Prepare resources (pools, child processes). Default: nothing."""

    @abstractmethod
    async def run(self, job: Job, timeout: float | None) -> Any:
        """Run the handler for ``job`` and return its result.

        Raises what the handler raised, or :class:`JobTimeout` after ``timeout`` seconds.
        """

    def request_stop(self) -> None:
        """Phase one of shutdown: ask running jobs to finish. Default: nothing."""

    async def aclose(self) -> None:
        """Release resources once no job runs. Default: nothing."""
