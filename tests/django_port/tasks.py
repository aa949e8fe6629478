"""The tasks the ported suites enqueue, the counterparts of the origin suites' ``tasks.py``
(Django's tests/tasks/tasks.py, django-tasks' tests/tasks.py), on the ``port`` backend and its
queue ``port``, which the suites' worker serves."""

from __future__ import annotations

from typing import Any

from tests.django_project.tasks_compat import TaskContext, task

PORT = {"backend": "port", "queue_name": "port"}


@task(**PORT)
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task(**PORT)
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task(**PORT)
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": args, "kwargs": kwargs}


@task(**PORT)
def calculate_meaning_of_life() -> int:
    return 42


@task(**PORT)
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task(**PORT)
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task(**PORT)
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task(**PORT)
def complex_return_value() -> Any:
    # Neither JSON nor anything else a result store can keep.
    return lambda: True


@task(**PORT, takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return str(context.task_result.id)


@task(**PORT, takes_context=True)
def check_context(context: TaskContext, attempt: int) -> dict[str, Any]:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
    return {"attempt": context.attempt, "status": str(context.task_result.status)}
