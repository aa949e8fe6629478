"""The application's failure callbacks (``Registry.on_failure``): called once per failed
attempt, with the job, the exception and whether the failure is final, after Redis recorded it.

A callback is the application's code running on the worker's event loop: whatever it raises is
logged on the worker's logger and goes no further (the attempt is already recorded; the worker
goes on). An async callback is awaited. A sync one runs on the loop, so it must be quick (an
error tracker's ``capture_exception`` queues the event for its own thread).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from panqueue._job import Job

__all__ = ["FailureCallback", "report_failure"]

FailureCallback = Callable[[Job[Any], BaseException, bool], Any]


async def report_failure(callbacks: Sequence[FailureCallback], job: Job[Any] | None,
                         error: BaseException | None, final: bool, log: Any) -> None:
    """Call each of ``callbacks`` with (job, error, final); log what one raises."""
    if job is None or error is None:
        return
    for callback in callbacks:
        try:
            returned = callback(job, error, final)
            if inspect.isawaitable(returned):
                await returned
        except Exception as exc:
            name = getattr(callback, "__qualname__", None) or repr(callback)
            log.exception("on_failure callback raised; the failure is recorded all the same",
                          callback=name, error=f"{type(exc).__name__}: {exc}")
