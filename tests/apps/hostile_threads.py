"""A handler whose module starts a thread when the child imports it, before the child's rules
apply: rules that hold only for the thread applying them would leave this one free, and a job
could have it read for them. Used by tests/test_permissions_escapes.py through hostile_app."""

from __future__ import annotations

import queue
import sys
import threading
from typing import Any

from panqueue import Job

_requests: queue.SimpleQueue[tuple[str, queue.SimpleQueue[Any]]] = queue.SimpleQueue()


def _serve() -> None:
    while True:
        path, answer = _requests.get()
        try:
            with open(path, "rb") as f:
                answer.put(f.read(4096).decode(errors="replace"))
        except OSError as exc:
            answer.put(exc)


if sys.argv[:1] == ["-c"]:  # in the subprocess executor's child only, not in the worker
    threading.Thread(target=_serve, daemon=True, name="hostile-helper").start()


def read_through_thread(job: Job) -> str:
    answer: queue.SimpleQueue[Any] = queue.SimpleQueue()
    _requests.put((job.data["path"], answer))
    result = answer.get(timeout=10)
    if isinstance(result, BaseException):
        raise result
    return str(result)
