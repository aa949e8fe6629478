"""Ported from django-tasks: tests/tests/test_rq_backend.py (RQBackendTestCase), against
PanqueueBackend: panqueue's jobs where RQ's were, a real ``panqueue worker`` where the origin
runs an RQ worker in-process."""

from __future__ import annotations

import asyncio
import uuid
from functools import partial
from pathlib import Path

import pytest

from panqueue import JobState, SyncQueueClient
from tests.django_port.conftest import finished
from tests.helpers import wait_until

pytestmark = pytest.mark.usefixtures("port_worker")


@pytest.fixture(scope="module", autouse=True)
def _module(port_django: Path) -> None:
    """The module's tests share its Django set-up and worker (tests/django_port/conftest.py)."""


def test_enqueue_task() -> None:
    # RQBackendTestCase.test_enqueue_task and test_enqueue_task_async: the result enqueue()
    # returns, before any worker ran it.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    for task in [tasks.noop_task, tasks.noop_task_async]:
        idle = task.using(queue_name="port-idle")
        for result, args, kwargs in [(idle.enqueue(1, two=3), [1], {"two": 3}),
                                     (asyncio.run(idle.aenqueue()), [], {})]:
            assert result.status == TaskResultStatus.READY
            assert not result.is_finished
            assert (result.started_at, result.last_attempted_at, result.finished_at) \
                == (None, None, None)
            with pytest.raises(ValueError, match="Task has not finished yet"):
                result.return_value  # noqa: B018
            assert (result.task, result.args, result.kwargs) == (idle, args, kwargs)
            assert result.attempts == 0


def test_refresh_result() -> None:
    # RQBackendTestCase.test_refresh_result and test_refresh_result_async: the producer's
    # result changes only when refreshed.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus, task_backends

    backend = task_backends["port"]
    for result, refresh in [
            (backend.enqueue(tasks.calculate_meaning_of_life, (), {}), "refresh"),
            (asyncio.run(backend.aenqueue(tasks.calculate_meaning_of_life, (), {})),
             "arefresh")]:
        wait_until(partial(_completed, backend.client, result.id), what="the task to run")
        assert result.status == TaskResultStatus.READY and result.attempts == 0
        assert (result.started_at, result.finished_at) == (None, None)
        if refresh == "refresh":
            result.refresh()
        else:
            asyncio.run(result.arefresh())
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.is_finished and result.return_value == 42 and result.attempts == 1
        assert result.started_at is not None and result.finished_at is not None


def _completed(client: SyncQueueClient, job_id: str) -> bool:
    return client.get_job("port", job_id).state is JobState.COMPLETED


def test_get_missing_and_invalid_result_ids() -> None:
    # RQBackendTestCase.test_get_missing_result, test_async_get_missing_result,
    # test_invalid_uuid and test_async_invalid_uuid
    from tests.django_project.tasks_compat import TaskResultDoesNotExist, task_backends

    for backend in [task_backends["port"], task_backends["default"]]:
        for result_id in [str(uuid.uuid4()), "123", "port:123", ""]:
            with pytest.raises(TaskResultDoesNotExist):
                backend.get_result(result_id)
            with pytest.raises(TaskResultDoesNotExist):
                asyncio.run(backend.aget_result(result_id))


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "docs/django.md, 'Differences from Django's own backends': a job that names no task "
    "reads as TaskResultDoesNotExist, not SuspiciousOperation"))
def test_invalid_task_path(port_client: SyncQueueClient) -> None:
    # RQBackendTestCase.test_invalid_task_path: a job put on the queue by other means, naming
    # a function that is not a task.
    from django.core.exceptions import SuspiciousOperation

    from tests.django_project.tasks_compat import task_backends

    job_id = "port-idle:" + "f" * 32  # an id of the port backend's shape
    port_client.queue("port-idle").add({"task": "subprocess.check_output",
                                        "args": ["exit", "1"]}, job_id=job_id)
    try:
        task_backends["port"].get_result(job_id)
    except SuspiciousOperation:
        return
    except Exception as exc:  # what panqueue raises instead
        raise AssertionError(f"{type(exc).__name__}: {exc}") from None
    raise AssertionError("no exception")


def test_check() -> None:
    # RQBackendTestCase.test_check
    from tests.django_project.tasks_compat import task_backends

    for alias in ["default", "direct", "port"]:
        assert list(task_backends[alias].check()) == []


def test_doesnt_wait_until_transaction_commit(port_client: SyncQueueClient) -> None:
    # RQBackendTestCase.test_doesnt_wait_until_transaction_commit: without ENQUEUE_ON_COMMIT
    # (the default) a task is added at once inside a transaction.
    from django.db import transaction

    from tests.django_port import tasks

    with transaction.atomic():
        result = tasks.noop_task.using(queue_name="port-commit").enqueue()
        assert result.enqueued_at is not None
        assert port_client.counts("port-commit")[JobState.WAITING] == 1
    assert port_client.counts("port-commit")[JobState.WAITING] == 1


def test_queue_isolation(port_client: SyncQueueClient) -> None:
    # RQBackendTestCase.test_queue_isolation: each task is in its own queue's list only, and
    # both read back through the one backend.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import task_backends

    one = tasks.noop_task.using(queue_name="iso-1").enqueue()
    two = tasks.noop_task.using(queue_name="iso-2").enqueue()
    backend = task_backends["port"]
    assert backend.get_result(one.id) == one and backend.get_result(two.id) == two
    assert [job.id for job in port_client.list_jobs("iso-1", JobState.WAITING)] == [one.id]
    assert [job.id for job in port_client.list_jobs("iso-2", JobState.WAITING)] == [two.id]


def test_validate_on_enqueue() -> None:
    # RQBackendTestCase.test_validate_on_enqueue and test_validate_on_aenqueue: a task made
    # valid under other settings is validated again by enqueue().
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import InvalidTask

    task = tasks.noop_task.using(queue_name="unknown_queue")  # valid for "port" (any queue)
    moved = task.using()
    object.__setattr__(moved, "backend", "default")  # as if TASKS changed since
    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        moved.enqueue()
    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        asyncio.run(moved.aenqueue())


def test_takes_context_and_context() -> None:
    # RQBackendTestCase.test_takes_context and test_context
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    result = finished(tasks.get_task_id.enqueue())
    assert result.return_value == result.id
    assert finished(tasks.check_context.enqueue(1)).status == TaskResultStatus.SUCCESSFUL


def test_catches_exception_and_records_its_class() -> None:
    # RQBackendTestCase.test_catches_exception and test_exception_classes_pop_empty_list_bug:
    # a failed task reads back with one error whose class is the raised one.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus, task_backends

    result = finished(tasks.failing_task_value_error.enqueue())
    back = task_backends["port"].get_result(result.id)
    assert back.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in back.errors] == [ValueError]
    assert back.errors[0].traceback.endswith("ValueError: This task failed due to ValueError\n")
    assert back.task == tasks.failing_task_value_error
