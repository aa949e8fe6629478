"""What the runtime reports to an optional metrics object (``Worker(metrics=...)``).

:class:`panqueue.metrics.WorkerMetrics` implements it with Prometheus collectors; the runtime
only knows this protocol, so the core package needs no metrics library. Without a metrics
object every hook is skipped by one ``is None`` check."""

from __future__ import annotations

from typing import Protocol

__all__ = ["MetricsHook"]


class MetricsHook(Protocol):
    def attempt_finished(self, queue: str, outcome: str, run_s: float, wait_s: float) -> None:
        """An attempt ended: completed, failed, retried, cancelled, lock_lost or released."""

    def claim_finished(self, queue: str, seconds: float) -> None:
        """A claim call was answered after ``seconds``."""

    def locks_renewed(self, queue: str, n: int) -> None:
        """``n`` job locks were renewed."""

    def lock_lost(self, queue: str) -> None:
        """An attempt's lock was lost (the attempt is being stopped)."""

    def executor_restarted(self, queue: str, executor: str, reason: str) -> None:
        """The queue's executor replaced a child or thread: ``crashed``, ``timeout`` or
        ``stopped`` (see :attr:`panqueue.executors.Executor.on_restart`)."""
