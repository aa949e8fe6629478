"""The task of the ``retrying`` backend (a module of its own: projects whose settings have no
such backend, as tests.django_project.settings_nodb, import the app's other tasks)."""

from __future__ import annotations

import time
from typing import Any

from tests.django_project.shop.retry import Flaky
from tests.django_project.tasks_compat import TaskContext, task


@task(takes_context=True, backend="retrying", queue_name="retrying")
def flaky(context: TaskContext, fails: int, retry_in: Any, mark: str) -> str:
    """Fails its first ``fails`` attempts with :class:`Flaky`; each attempt appends a line to
    ``mark`` (its attempt, the status it sees, the time it started)."""
    with open(mark, "a") as out:
        out.write(f"{context.attempt} {context.task_result.status} {time.time()}\n")
    if context.attempt <= fails:
        raise Flaky(f"attempt {context.attempt} failed", retry_in)
    return f"ok on attempt {context.attempt}"
