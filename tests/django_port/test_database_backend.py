"""Ported from django-tasks: tests/tests/test_database_backend.py (DatabaseBackendTestCase and
DatabaseBackendWorkerTestCase), against PanqueueBackend: panqueue's queue lists where the
origin reads its table (``DBTaskResult.objects.ready()``), a real ``panqueue worker`` where it
runs ``db_worker`` in-process."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from panqueue import JobState, SyncQueueClient
from tests.django_port.conftest import finished

pytestmark = pytest.mark.usefixtures("port_worker")


@pytest.fixture(scope="module", autouse=True)
def _module(port_django: Path) -> None:
    """The module's tests share its Django set-up and worker (tests/django_port/conftest.py)."""


def _waiting(client: SyncQueueClient, queue: str) -> list[str]:
    """The ids of the queue's waiting jobs, in the order workers claim them."""
    return [job.id for job in client.list_jobs(queue, JobState.WAITING)]


def test_run_enqueued_task() -> None:
    # DatabaseBackendWorkerTestCase.test_run_enqueued_task: the producer's result is unchanged
    # until refreshed, then SUCCESSFUL with its times and one attempt.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    result = tasks.noop_task.enqueue()
    assert result.status == TaskResultStatus.READY
    finished(result)
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at is not None
    assert (result.status, result.attempts) == (TaskResultStatus.SUCCESSFUL, 1)


def test_batch_processes_all_tasks(port_client: SyncQueueClient) -> None:
    # DatabaseBackendWorkerTestCase.test_batch_processes_all_tasks
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    results = [tasks.noop_task.enqueue() for _ in range(3)]
    results.append(tasks.failing_task_value_error.enqueue())
    for result in results:
        finished(result)
    assert [r.status for r in results] == [TaskResultStatus.SUCCESSFUL] * 3 + [
        TaskResultStatus.FAILED]
    assert _waiting(port_client, "port") == []


def test_doesnt_process_different_queue(port_client: SyncQueueClient) -> None:
    # DatabaseBackendWorkerTestCase.test_doesnt_process_different_queue: a worker serves its
    # queues only; the task in another queue waits until a worker serves that one.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    other = tasks.noop_task.using(queue_name="queue-1").enqueue()
    served = finished(tasks.noop_task.enqueue())  # the worker is there, and busy with "port"
    assert served.status == TaskResultStatus.SUCCESSFUL
    other.refresh()
    assert other.status == TaskResultStatus.READY
    assert _waiting(port_client, "queue-1") == [other.id]


def test_failing_task() -> None:
    # DatabaseBackendWorkerTestCase.test_failing_task
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    result = finished(tasks.failing_task_value_error.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert result.enqueued_at <= result.started_at <= result.finished_at
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.errors[0].exception_class is ValueError
    assert result.errors[0].traceback.endswith(
        "ValueError: This task failed due to ValueError\n")


def test_run_after(port_client: SyncQueueClient) -> None:
    # DatabaseBackendWorkerTestCase.test_run_after: a task whose run_after is ahead is not
    # run; once it is due, it is. (The origin moves run_after back in its table; here the
    # task is simply due soon.)
    from django.utils import timezone

    from tests.django_port import tasks
    from tests.django_project.tasks_compat import TaskResultStatus

    run_after = timezone.now() + timedelta(seconds=1.5)
    result = tasks.noop_task.using(run_after=run_after).enqueue()
    assert port_client.get_job("port", result.id).state is JobState.DELAYED
    plain = finished(tasks.noop_task.enqueue())  # the worker ran what was due
    assert plain.status == TaskResultStatus.SUCCESSFUL
    result.refresh()
    assert (result.status, result.started_at) == (TaskResultStatus.READY, None)
    assert finished(result).status == TaskResultStatus.SUCCESSFUL
    assert result.started_at >= run_after


def test_run_after_priority_by_priority(port_client: SyncQueueClient) -> None:
    # DatabaseBackendWorkerTestCase.test_run_after_priority, the
    # part that holds: due tasks run by priority, higher first, and tasks not yet due wait
    # whatever their priority.
    from django.utils import timezone

    from tests.django_port import tasks

    now = timezone.now()
    idle = tasks.noop_task.using(queue_name="order-1")
    old = idle.using(priority=20, run_after=now - timedelta(hours=2)).enqueue()
    far_future = idle.using(run_after=now + timedelta(hours=10)).enqueue()
    high_far_future = idle.using(priority=10, run_after=now + timedelta(hours=10)).enqueue()
    high = idle.using(priority=10).enqueue()
    low = idle.using(priority=2).enqueue()
    lower = idle.using(priority=-2).enqueue()
    assert _waiting(port_client, "order-1") == [old.id, high.id, low.id, lower.id]
    delayed = {job.id for job in port_client.list_jobs("order-1", JobState.DELAYED)}
    assert delayed == {far_future.id, high_far_future.id}


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "docs/django.md, 'Differences from Django's own backends': among equal priorities "
    "panqueue runs due tasks in the order they were enqueued, not by run_after"))
def test_run_after_priority_equal_priorities_by_run_after(
        port_client: SyncQueueClient) -> None:
    # DatabaseBackendWorkerTestCase.test_run_after_priority: of two due tasks with equal
    # priorities, the one with the earlier run_after first.
    from django.utils import timezone

    from tests.django_port import tasks

    now = timezone.now()
    idle = tasks.noop_task.using(queue_name="order-2", priority=20)
    old = idle.using(run_after=now - timedelta(hours=2)).enqueue()
    very_old = idle.using(run_after=now - timedelta(hours=10)).enqueue()
    assert _waiting(port_client, "order-2") == [very_old.id, old.id]


def test_priority_range_check() -> None:
    # DatabaseBackendTestCase.test_priority_range_check: Django's range, checked before
    # anything is written.
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import InvalidTask

    for priority in [-101, 101, 3.1]:
        with pytest.raises(InvalidTask, match="priority must be a whole number"):
            tasks.noop_task.using(priority=priority)
    for priority in [-100, 0, 100]:
        assert tasks.noop_task.using(priority=priority).priority == priority


def test_missing_and_invalid_task_path_read_as_missing(port_client: SyncQueueClient) -> None:
    # DatabaseBackendTestCase.test_invalid_task_path and test_missing_task_path: a stored job
    # naming no task, or a task that is not there, cannot be read back as a result.
    from tests.django_project.tasks_compat import TaskResultDoesNotExist, task_backends

    queue = port_client.queue("port-idle")
    for n, path in enumerate(["subprocess.check_output", "tests.django_port.tasks.missing"]):
        job_id = "port-idle:" + str(n) * 31 + "x"
        queue.add({"task": path, "args": [], "kwargs": {}}, job_id=job_id)
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["port"].get_result(job_id)


def test_doesnt_wait_until_transaction_commit(port_client: SyncQueueClient) -> None:
    # DatabaseBackendTestCase.test_doesnt_wait_until_transaction_commit: without
    # ENQUEUE_ON_COMMIT the task is there inside the transaction already.
    from django.db import transaction

    from tests.django_port import tasks

    with transaction.atomic():
        result = tasks.noop_task.using(queue_name="db-commit").enqueue()
        assert result.enqueued_at is not None
        assert _waiting(port_client, "db-commit") == [result.id]


def test_get_result_equals_enqueued_result() -> None:
    # DatabaseBackendTestCase.test_get_result
    from tests.django_port import tasks
    from tests.django_project.tasks_compat import task_backends

    result = tasks.noop_task.using(queue_name="port-idle").enqueue()
    assert task_backends["port"].get_result(result.id) == result


def test_worker_for_an_unknown_backend_is_refused() -> None:
    # DatabaseBackendWorkerTestCase.test_unknown_backend: a worker asked to serve a backend
    # TASKS does not have refuses to start, naming it.
    from panqueue import ConfigError
    from panqueue.django import registry_for

    with pytest.raises(ConfigError, match=r"TASKS: .*'unknown'"):
        registry_for("unknown")


def test_worker_doesnt_process_different_backend(port_client: SyncQueueClient) -> None:
    # DatabaseBackendWorkerTestCase.test_doesnt_process_different_backend: a task of another
    # backend ("direct", its own queue) is left for that backend's workers.
    from tests.django_port import tasks
    from tests.django_project.shop.tasks import add
    from tests.django_project.tasks_compat import TaskResultStatus

    other = add.using(backend="direct", queue_name="direct").enqueue(1, 2)
    finished(tasks.noop_task.enqueue())  # the port worker is running
    other.refresh()
    assert other.status == TaskResultStatus.READY
    assert _waiting(port_client, "direct") == [other.id]
