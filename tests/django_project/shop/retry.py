"""The backoff of the ``retrying`` backend (``OPTIONS["backoff"]`` names it by path): it waits
what the :class:`Flaky` it gets asks for, and records each call (what it received, and when)
as a JSON line in $PQ_BACKOFF_LOG, when that is set."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any


class Flaky(Exception):
    """A failure that says how long to wait before the next attempt (``retry_in``): an
    attribute of the exception object only, which the backoff receives as raised."""

    def __init__(self, message: str, retry_in: Any) -> None:
        super().__init__(message)
        self.retry_in = retry_in


def backoff(exception: BaseException, task_result: Any) -> Any:
    path = os.environ.get("PQ_BACKOFF_LOG")
    if path:
        with open(path, "a") as log:
            log.write(json.dumps({
                "at": time.time(), "id": task_result.id,
                "exception": f"{type(exception).__module__}.{type(exception).__qualname__}",
                "message": str(exception), "status": str(task_result.status),
                "attempts": task_result.attempts, "worker_ids": task_result.worker_ids,
                "errors": [error.exception_class_path for error in task_result.errors],
                "finished": task_result.finished_at is not None}) + "\n")
    retry_in = exception.retry_in if isinstance(exception, Flaky) else None
    if retry_in == "raise":
        raise RuntimeError("the backoff broke")
    if retry_in == "timedelta":
        return timedelta(milliseconds=100)
    return retry_in
