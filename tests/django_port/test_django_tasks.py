"""Ported from Django: tests/tasks/test_tasks.py (TaskTestCase), test_immediate_backend.py
(ImmediateBackendTestCase and its transaction tests), test_dummy_backend.py and
test_custom_backend.py, against PanqueueBackend: the task runs in a real worker instead of
inside enqueue(), so each test that reads a finished result first waits for the worker."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from panqueue import JobState, SyncQueueClient
from tests.django_port.conftest import finished

pytestmark = pytest.mark.usefixtures("port_worker")


@pytest.fixture(scope="module", autouse=True)
def _module(port_django: Path) -> None:
    """The module's tests share its Django set-up and worker (tests/django_port/conftest.py)."""


def test_enqueue_task() -> None:
    # test_tasks.TaskTestCase.test_enqueue_task (and test_enqueue_task_async)
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    for result in [tasks.noop_task.enqueue(), asyncio.run(tasks.noop_task.aenqueue())]:
        assert result.status == TaskResultStatus.READY
        assert result.task == tasks.noop_task
        assert (result.args, result.kwargs) == ([], {})


def test_enqueue_with_invalid_argument() -> None:
    # test_tasks.TaskTestCase.test_enqueue_with_invalid_argument (and the aenqueue variant)
    from tests.django_port import tasks

    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.noop_task.enqueue(datetime.now(UTC))
    with pytest.raises(TypeError, match="Unsupported type"):
        asyncio.run(tasks.noop_task.aenqueue(datetime.now(UTC)))


def test_refresh_result_of_a_waiting_task_changes_nothing(
        port_worker: subprocess.Popen[bytes]) -> None:
    # test_tasks.TaskTestCase.test_refresh_result: refresh() of a task not yet run leaves the
    # result as it was. Here the worker serves "port", so the task goes to a queue it does not
    # serve, where it stays waiting.
    import dataclasses

    from tests.django_port import tasks

    result = tasks.noop_task.using(queue_name="port-idle").enqueue()
    original = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == original
    asyncio.run(result.arefresh())
    assert dataclasses.asdict(result) == original


def test_get_result() -> None:
    # test_tasks.TaskTestCase.test_get_result (and test_get_result_async)
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import task_backends

    backend = task_backends["port"]
    result = backend.enqueue(tasks.noop_task.using(queue_name="port-idle"), (), {})
    assert tasks.noop_task.get_result(result.id) == result
    result = asyncio.run(backend.aenqueue(tasks.noop_task.using(queue_name="port-idle"),
                                          (), {}))
    assert asyncio.run(tasks.noop_task.aget_result(result.id)) == result


def test_get_missing_result() -> None:
    # test_tasks.TaskTestCase.test_get_missing_result
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultDoesNotExist

    with pytest.raises(TaskResultDoesNotExist):
        tasks.noop_task.get_result("123")
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(tasks.noop_task.aget_result("123"))


def test_unknown_queue_name() -> None:
    # test_tasks.TaskTestCase.test_unknown_queue_name: a backend with QUEUES refuses other
    # names, and QUEUES: [] takes any.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import InvalidTask

    with pytest.raises(InvalidTask, match="Queue 'queue-2' is not valid for backend"):
        tasks.noop_task.using(backend="default", queue_name="queue-2")
    assert tasks.noop_task.using(queue_name="queue-2").queue_name == "queue-2"


def test_get_backend() -> None:
    # test_tasks.TaskTestCase.test_get_backend
    from panqueue.django import PanqueueBackend
    from tests.django_port import tasks

    assert tasks.noop_task.backend == "port"
    assert isinstance(tasks.noop_task.get_backend(), PanqueueBackend)
    assert tasks.noop_task.using(backend="direct", queue_name="direct").get_backend().alias \
        == "direct"


def test_enqueue_and_run_task() -> None:
    # test_immediate_backend.ImmediateBackendTestCase.test_enqueue_task: args and kwargs round
    # trip, and the finished result's times and attempts.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    for task in [tasks.noop_task, tasks.noop_task_async]:
        result = finished(task.enqueue(1, two=3))
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.is_finished
        assert result.enqueued_at <= result.started_at <= result.finished_at
        assert result.last_attempted_at == result.started_at
        assert result.return_value is None
        assert (result.task, result.args, result.kwargs) == (task, [1], {"two": 3})
        assert result.attempts == 1


def test_args_and_kwargs_round_trip_as_json() -> None:
    # test_immediate_backend.ImmediateBackendTestCase.test_enqueue_task (args and kwargs),
    # with nested values: tuples come back as lists, as Django normalises them.
    from tests.django_port import tasks

    result = finished(tasks.echo.enqueue(1, "two", [3.5, None], {"k": (True, False)}, x={"y": 1}))
    assert result.return_value == {"args": [1, "two", [3.5, None], {"k": [True, False]}],
                                   "kwargs": {"x": {"y": 1}}}
    assert result.args == [1, "two", [3.5, None], {"k": [True, False]}]


@pytest.mark.parametrize(("task_name", "exception", "message"), [
    ("failing_task_value_error", ValueError, "This task failed due to ValueError"),
    ("failing_task_system_exit", SystemExit, "This task failed due to SystemExit"),
])
def test_catches_exception(task_name: str, exception: type[BaseException], message: str
                           ) -> None:
    # test_immediate_backend.ImmediateBackendTestCase.test_catches_exception
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    task = getattr(tasks, task_name)
    result = finished(task.enqueue())
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.is_finished
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.errors[0].exception_class is exception
    assert result.errors[0].traceback.endswith(f"{exception.__name__}: {message}\n")
    assert (result.task, result.args, result.kwargs, result.attempts) == (task, [], {}, 1)


def test_complex_exception() -> None:
    # test_immediate_backend.ImmediateBackendTestCase.test_complex_exception
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    result = finished(tasks.complex_exception.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback


def test_complex_return_value() -> None:
    # test_immediate_backend.ImmediateBackendTestCase.test_complex_return_value: a return
    # value that cannot be stored fails the task.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    result = finished(tasks.complex_return_value.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result._return_value is None
    [error] = result.errors
    assert error.exception_class is TypeError
    assert "Unsupported type" in error.traceback


def test_takes_context() -> None:
    # test_immediate_backend.ImmediateBackendTestCase.test_takes_context and test_context
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    result = finished(tasks.get_task_id.enqueue())
    assert result.return_value == result.id
    result = finished(tasks.check_context.enqueue(1))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 1, "status": "RUNNING"}


def test_get_result_of_a_finished_task_from_scratch() -> None:
    # test_immediate_backend.ImmediateBackendTestCase.test_get_result: read back by id, the
    # finished result equals the one the producer refreshed.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import task_backends

    result = finished(tasks.calculate_meaning_of_life.enqueue())
    back = task_backends["port"].get_result(result.id)
    assert back == result
    assert back.return_value == 42


def test_enqueue_logs(caplog: pytest.LogCaptureFixture) -> None:
    # test_dummy_backend.DummyBackendTestCase.test_enqueue_logs: one line, at enqueue, naming
    # the result (the framework logs it on the task_enqueued signal the backend sends).
    import logging

    import django

    from tests.django_port import tasks

    logger = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    with caplog.at_level(logging.DEBUG, logger=logger):
        result = tasks.noop_task.using(queue_name="port-idle").enqueue()
    [line] = [r.getMessage() for r in caplog.records if r.name.startswith(logger)]
    assert "enqueued" in line and result.id in line


def test_wait_until_transaction_commit(port_client: SyncQueueClient) -> None:
    # test_dummy_backend.DummyBackendTransactionTestCase.test_wait_until_transaction_commit:
    # a backend with ENQUEUE_ON_COMMIT (the test project's "default") adds the task when the
    # transaction commits; enqueued_at is set then.
    from django.db import transaction

    from tests.django_project.shop.tasks import add
    from tests.django_project.tasks_compat import task_backends

    assert task_backends["default"].enqueue_on_commit is True
    on_commit = add.using(queue_name="reports")  # the project's task, on "default"
    with transaction.atomic():
        result = on_commit.enqueue(1, 2)
        assert result.enqueued_at is None
        assert port_client.list_jobs("reports", JobState.WAITING) == []
    assert [job.id for job in port_client.list_jobs("reports", JobState.WAITING)] == [result.id]
    assert result.enqueued_at is not None
    result.refresh()
    assert result.enqueued_at is not None


def test_doesnt_wait_until_transaction_commit_by_default(port_client: SyncQueueClient) -> None:
    # test_immediate_backend.ImmediateBackendTransactionTestCase
    # .test_doesnt_wait_until_transaction_commit_by_default (and the dummy backend's
    # test_doesnt_wait_until_transaction_commit): ENQUEUE_ON_COMMIT is off unless asked for.
    from django.db import transaction

    from tests.django_port import tasks
    from tests.django_project.tasks_compat import task_backends

    assert task_backends["port"].enqueue_on_commit is False
    with transaction.atomic():
        result = tasks.noop_task.using(queue_name="port-idle-2").enqueue()
        assert result.enqueued_at is not None
        assert [job.id for job in port_client.list_jobs("port-idle-2", JobState.WAITING)] \
            == [result.id]


def test_validate_on_enqueue() -> None:
    # test_immediate_backend.ImmediateBackendTestCase.test_validate_on_enqueue and
    # test_validate_on_aenqueue: enqueue() validates the task against the backend again.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import InvalidTask

    task = tasks.noop_task.using(queue_name="unknown_queue")  # valid for "port" (any queue)
    moved = task.using()
    object.__setattr__(moved, "backend", "default")  # as if TASKS had changed since
    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        moved.enqueue()
    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        asyncio.run(moved.aenqueue())


def test_using_correct_backend() -> None:
    # test_custom_backend.CustomBackendTestCase.test_using_correct_backend: alias and options
    # as TASKS gives them.
    from django.conf import settings

    from panqueue.django import PanqueueBackend
    from tests.django_project.tasks_compat import task_backends

    backend = task_backends["port"]
    assert isinstance(backend, PanqueueBackend)
    assert backend.alias == "port"
    assert backend.options == settings.TASKS["port"]["OPTIONS"]
