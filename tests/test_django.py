"""Django's Tasks framework on panqueue: a real Django project (tests/django_project, SQLite in a
temporary directory), the test session's Redis, and ``panqueue worker panqueue.django:registry``
as a real child process.

Django is set up once in this process (the producer side); each test that needs tasks to run
starts its own worker process with the same settings.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from panqueue import JobNotFound, JobState, PayloadError, SyncQueueClient
from panqueue.embedded import RedisServer
from tests.django_setup import SETTINGS, configure_django
from tests.helpers import ROOT, panqueue_command, run_cli, subprocess_env, wait_until


@pytest.fixture(scope="module", autouse=True)
def tasks_framework() -> None:
    """Every test here fails, none is skipped, where this Django has no Tasks framework (neither
    Django 6's django.tasks nor the django-tasks package): the tests of an extra that is
    installed but cannot run must not pass as skipped."""
    try:
        import tests.django_project.tasks_compat  # noqa: F401
    except ImportError as exc:
        problem = str(exc)
    else:
        return
    pytest.fail(f"tests/test_django.py needs Django and its Tasks framework (pip install -e "
                f"'.[django]'): {problem}", pytrace=False)


@pytest.fixture
def django_db(tmp_path_factory: pytest.TempPathFactory, panqueue_server: RedisServer) -> Path:
    """Django configured in this process from the test project; the SQLite file."""
    return configure_django(tmp_path_factory, panqueue_server.url)


@pytest.fixture
def client(django_db: Path, panqueue_url: str) -> Iterator[SyncQueueClient]:
    """A panqueue client on the (emptied) server the Django settings point at."""
    from django.conf import settings

    assert settings.TASKS["default"]["OPTIONS"]["url"] == panqueue_url
    with SyncQueueClient(panqueue_url) as client:
        yield client


def _env(django_db: Path, url: str, **extra: str) -> dict[str, str]:
    return subprocess_env(DJANGO_SETTINGS_MODULE=SETTINGS, PQ_DJANGO_DB=str(django_db),
                          PANQUEUE_URL=url, **extra)


@pytest.fixture
def django_worker(django_db: Path, client: SyncQueueClient, tmp_path: Path
                  ) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``panqueue worker panqueue.django:registry`` (or ``app``; killed at the end);
    returns once it serves the queue ``serves`` (under the key prefix ``prefix``)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(app: str = "panqueue.django:registry", serves: str = "default",
              prefix: str | None = None, **extra_env: str) -> subprocess.Popen[bytes]:
        with (tmp_path / "worker.err").open("wb") as err:
            process = subprocess.Popen(
                panqueue_command("worker", app, "--url", client.url),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                env=_env(django_db, client.url, **extra_env), cwd=ROOT)
        started.append(process)

        def serving() -> bool:
            if process.poll() is not None:
                raise AssertionError((tmp_path / "worker.err").read_text())
            with SyncQueueClient(client.url, prefix=prefix) as serving_client:
                return bool(serving_client.workers(serves))

        wait_until(serving, timeout=20, what="the Django worker to start")
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def _finished(result: Any) -> Callable[[], bool]:
    def check() -> bool:
        result.refresh()
        return bool(result.is_finished)

    return check


def test_backend_is_one_of_the_tasks_framework_this_django_version_has(
        django_db: Path) -> None:
    import django
    from django.core.checks import run_checks

    from panqueue.django import PanqueueBackend
    from tests.django_project.shop.tasks import add
    from tests.django_project.tasks_compat import BaseTaskBackend, Task, task_backends

    # Django 6's built-in framework, else the django-tasks package: the one TASKS is read by.
    framework = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert BaseTaskBackend.__module__ == f"{framework}.backends.base"
    backend = task_backends["default"]
    assert isinstance(backend, PanqueueBackend) and isinstance(backend, BaseTaskBackend)
    assert isinstance(add, Task) and add.get_backend() is backend
    assert run_checks() == []  # the framework's system checks, which ask every backend


def test_task_enqueued_from_django_runs_in_a_worker_and_its_result_reads_back(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]],
        tmp_path: Path) -> None:
    from tests.django_project.shop.tasks import add, report
    from tests.django_project.tasks_compat import TaskResultStatus

    signals = tmp_path / "signals.log"
    worker = django_worker(PQ_SIGNAL_LOG=str(signals))
    result = add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at is not None  # outside a transaction: added at once
    wait_until(_finished(result), what="add to finish")

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert result.worker_ids == [f"{socket.gethostname()}:{worker.pid}"]
    assert result.attempts == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.started_at == result.last_attempted_at
    # The result id is the panqueue job id, in the queue named like the task's queue_name.
    info = client.get_job("default", result.id)
    assert (info.state, info.result, info.data["args"]) == (JobState.COMPLETED, 5, [2, 3])

    # Read back from scratch, through the task and the backend, sync and async.
    again = add.get_result(result.id)
    assert (again.status, again.return_value, again.args) == (TaskResultStatus.SUCCESSFUL, 5,
                                                             [2, 3])
    assert asyncio.run(add.aget_result(result.id)).return_value == 5
    # Django's signals, sent in the worker around the task.
    assert signals.read_text().splitlines() == [f"started {result.id} RUNNING",
                                                f"finished {result.id} SUCCESSFUL"]

    other = report.enqueue("sales", rows=3)  # another queue, kwargs, a tuple in the result
    wait_until(_finished(other), what="report to finish")
    assert other.return_value == {"report": "sales", "rows": 3, "tags": ["a", "b"]}
    assert client.get_job("reports", other.id).state is JobState.COMPLETED


def test_failing_task_reads_back_failed_with_its_exception_class_and_traceback(
        django_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    from tests.django_project.shop.tasks import PaymentDeclined, charge
    from tests.django_project.tasks_compat import TaskResultStatus

    django_worker()
    result = charge.enqueue("4242")
    wait_until(_finished(result), what="charge to fail")

    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "tests.django_project.shop.tasks.PaymentDeclined"
    assert error.exception_class is PaymentDeclined
    assert "card 4242 declined" in error.traceback
    assert 'in charge\n    raise PaymentDeclined(f"card {card} declined")' in error.traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018


def test_return_value_django_cannot_normalise_fails_the_task_and_task_finished_says_so(
        django_worker: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    from tests.django_project.shop.tasks import unstorable
    from tests.django_project.tasks_compat import TaskResultStatus

    signals = tmp_path / "signals.log"
    django_worker(PQ_SIGNAL_LOG=str(signals))
    result = unstorable.enqueue()
    wait_until(_finished(result), what="unstorable to fail")
    # As Django's own backends: the framework's TypeError, as the task's own failure.
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class is TypeError
    assert "Unsupported type" in error.traceback
    assert signals.read_text().splitlines() == [f"started {result.id} RUNNING",
                                                f"finished {result.id} FAILED"]


def test_task_added_inside_atomic_is_enqueued_on_commit_and_sees_the_committed_row(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    from django.db import connection, transaction

    from tests.django_project.shop.tasks import read_order
    from tests.django_project.tasks_compat import TaskResultDoesNotExist, TaskResultStatus

    django_worker()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO shop_order (id, item) VALUES (1, 'teapot')")
        result = read_order.enqueue(1)
        # Not in Redis while the transaction is open: a worker could not see the row yet.
        with pytest.raises(JobNotFound):
            client.get_job("default", result.id)
        with pytest.raises(TaskResultDoesNotExist):
            read_order.get_result(result.id)
        assert result.enqueued_at is None
    assert result.enqueued_at is not None  # set when the commit added it
    wait_until(_finished(result), what="read_order to finish")
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "teapot"


def test_task_added_inside_a_rolled_back_transaction_is_never_enqueued(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    from django.db import transaction

    from tests.django_project.shop.tasks import add
    from tests.django_project.tasks_compat import TaskResultDoesNotExist

    django_worker()
    with pytest.raises(RuntimeError, match="abort"):
        with transaction.atomic():
            rolled_back = add.enqueue(1, 1)
            raise RuntimeError("abort")
    # A task enqueued after it runs to the end: the worker was there to run the first one.
    later = add.enqueue(2, 2)
    wait_until(_finished(later), what="the later task to finish")
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(rolled_back.id)
    counts = client.counts("default")
    assert counts[JobState.COMPLETED] == 1
    assert sum(counts.values()) == 1


def test_backend_without_enqueue_on_commit_adds_at_once_inside_a_transaction(
        client: SyncQueueClient) -> None:
    from django.db import transaction

    from tests.django_project.shop.tasks import add

    with transaction.atomic():
        result = add.using(backend="direct", queue_name="direct").enqueue(1, 2)
        assert client.get_job("direct", result.id).state is JobState.WAITING


def test_enqueue_returns_when_the_task_ran_and_was_deleted_before_its_read_back(
        client: SyncQueueClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """enqueue() reads enqueued_at back after the add. A fast worker can run the task, and the
    backend's retention delete it, in between: the task was enqueued, so enqueue() returns
    (with this process's clock), and does not raise JobNotFound for a task that ran."""
    from django.utils import timezone

    from panqueue._producer import SyncJobHandle
    from tests.django_project.shop.tasks import add

    real_info = SyncJobHandle.info

    def deleted_first(handle: SyncJobHandle) -> Any:
        client.remove("direct", handle.id)  # as retention deletes a finished job
        return real_info(handle)

    monkeypatch.setattr(SyncJobHandle, "info", deleted_first)
    before = timezone.now()
    result = add.using(backend="direct", queue_name="direct").enqueue(1, 2)
    assert result.enqueued_at is not None and result.enqueued_at >= before


def test_results_are_kept_as_the_backends_retention_says(
        django_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    from tests.django_project.shop.tasks import add
    from tests.django_project.tasks_compat import TaskResultDoesNotExist

    django_worker()
    direct = add.using(backend="direct", queue_name="direct")
    results = [direct.enqueue(n, 0) for n in range(3)]
    wait_until(_finished(results[2]), what="the last task to finish")  # one at a time, FIFO
    results[1].refresh()
    assert [r.return_value for r in results[1:]] == [1, 2]
    with pytest.raises(TaskResultDoesNotExist):  # Retention(completed=2) trimmed the oldest
        add.get_result(results[0].id)


def test_priority_and_run_after_map_onto_panqueue_priority_and_delay(
        client: SyncQueueClient) -> None:
    from tests.django_project.shop.tasks import add
    from tests.django_project.tasks_compat import InvalidTask, TaskResultStatus

    low = add.using(priority=-20).enqueue(1, 1)
    plain = add.enqueue(2, 2)
    high = add.using(priority=100).enqueue(3, 3)
    assert client.get_job("default", high.id).priority == 100
    # Higher runs first in both: the claim order of the waiting jobs.
    waiting = [job.id for job in client.list_jobs("default", JobState.WAITING)]
    assert waiting == [high.id, plain.id, low.id]

    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    deferred = add.using(run_after=later).enqueue(4, 4)
    assert client.get_job("default", deferred.id).state is JobState.DELAYED
    assert client.explain("default", deferred.id).reason == "delayed"
    back = add.get_result(deferred.id)
    assert (back.status, back.task.run_after) == (TaskResultStatus.READY, later)
    assert add.get_result(high.id).task.priority == 100

    with pytest.raises(InvalidTask, match="priority"):
        add.using(priority=101)
    with pytest.raises(InvalidTask, match="Queue 'nope'"):
        add.using(queue_name="nope")

    # A whole number as a float is a priority Django takes: panqueue's add refused it, at the
    # commit (the database committed, the task was never added).
    from django.db import transaction

    with transaction.atomic():
        whole = add.using(priority=5.0).enqueue(5, 5)
    assert client.get_job("default", whole.id).priority == 5


def test_bad_arguments_fail_enqueue_and_write_nothing(client: SyncQueueClient) -> None:
    from django.db import transaction

    from tests.django_project.shop.tasks import add

    with pytest.raises(TypeError, match="Unsupported type"):
        add.enqueue(object(), 1)
    with pytest.raises(PayloadError, match=r'kwargs\["b"\]: .*not a finite number'):
        add.enqueue(1, b=float("nan"))
    with transaction.atomic():  # refused at enqueue(), not at the commit
        with pytest.raises(PayloadError, match=r"args\[0\]: key 1 is int"):
            add.enqueue({1: "a"}, 1)
    assert client.queues() == []


def test_job_naming_anything_but_a_project_task_is_refused_without_running_it(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]],
        tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    imported = tmp_path / "imported"
    django_worker(PQ_OUTSIDE_MARK=str(imported))
    queue = client.queue("default")
    forged = {
        "plain": {"task": "tests.django_project.shop.tasks.not_a_task", "args": [str(ran)]},
        "outside": {"task": "tests.django_project.outside.sneaky", "args": []},
        "os": {"task": "os.system", "args": [f"touch {ran}"]},
        "builtin": {"task": "builtins.exec", "args": [f"open({str(ran)!r}, 'w')"]},
        "shape": {"task": ["not", "a", "path"]},
        "args": {"task": "tests.django_project.shop.tasks.add", "args": "12"},
    }
    for name, data in forged.items():
        queue.add(data, job_id=f"forged-{name}")
    wait_until(lambda: client.counts("default")[JobState.FAILED] == len(forged),
               what="every forged job to fail")
    reasons = {name: client.get_job("default", f"forged-{name}") for name in forged}
    for info in reasons.values():
        assert info.attempts == 1 and info.failure_reason == "explicit_fail"
        assert info.error is not None and info.error.message.startswith("refused: ")
    assert "is not a Django task" in reasons["plain"].error.message  # type: ignore[union-attr]
    assert "not in an installed app" in reasons["outside"].error.message  # type: ignore[union-attr]
    assert "not in an installed app" in reasons["os"].error.message  # type: ignore[union-attr]
    assert not ran.exists()
    assert not imported.exists()


def test_context_and_async_tasks_run_in_the_worker(
        django_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    from tests.django_project.shop.tasks import double, who_am_i

    django_worker()
    me = who_am_i.enqueue()
    twice = double.enqueue(21)
    wait_until(_finished(me), what="who_am_i to finish")
    wait_until(_finished(twice), what="double to finish")
    assert me.return_value == {"id": me.id, "attempt": 1, "status": "RUNNING"}
    assert twice.return_value == 42


def test_worker_without_django_settings_exits_2_with_one_line(django_db: Path) -> None:
    env = {"DJANGO_SETTINGS_MODULE": ""}
    done = run_cli("worker", "panqueue.django:registry", **env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "panqueue: error: panqueue.django needs the Django settings: set "
        "DJANGO_SETTINGS_MODULE (for example mysite.settings)"]
    done = run_cli("worker", "panqueue.django:registry", DJANGO_SETTINGS_MODULE="nowhere.settings")
    assert done.returncode == 2
    assert "cannot import the Django settings 'nowhere.settings'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_example_project_enqueues_on_commit_and_a_burst_worker_runs_its_tasks(
        redis_url: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "django_tasks_app.py")],
                          capture_output=True, text=True, timeout=90, cwd=ROOT,
                          env=subprocess_env(PANQUEUE_URL=redis_url))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "done"
    for expected in ["is not enqueued yet (enqueued_at=None)",
                     "after the commit it is: status READY, enqueued_at set: True",
                     "rolled back: the task for bob was never enqueued",
                     "send_welcome: SUCCESSFUL -> 'welcome mail sent to ada@example.com'",
                     "charge: FAILED, raised CardDeclined "
                     "(django_app.accounts.tasks.CardDeclined)"]:
        assert expected in done.stdout, done.stdout


@pytest.mark.parametrize(("params", "problem"), [
    ({"OPTIONS": {"host": "x"}}, "TASKS['bad']['OPTIONS'] has unknown key(s) 'host'"),
    ({"OPTIONS": {"url": "http://127.0.0.1:1/"}}, "TASKS['bad']: "),
    ({"OPTIONS": {"attempts": 0}}, "TASKS['bad']: attempts"),
    ({"OPTIONS": {"task_modules": "mysite"}}, "['task_modules'] must be a list"),
    ({"QUEUES": ["a{b}"]}, "TASKS['bad']['QUEUES']: queue name 'a{b}'"),
    ({"ENQUEUE_ON_COMMIT": "yes"}, "['ENQUEUE_ON_COMMIT'] must be True or False"),
    ({"OPTIONS": {"retention": 10}}, "['retention'] must be a panqueue.Retention"),
    ({"OPTIONS": {"prefix": "a:b"}}, "TASKS['bad']['OPTIONS']['prefix']: prefix 'a:b' may"),
    ({"OPTIONS": {"prefix": 5}}, "['prefix']: prefix must be a non-empty str"),
])
def test_bad_backend_settings_raise_one_config_error_naming_the_entry(
        django_db: Path, params: dict[str, Any], problem: str) -> None:
    from panqueue import ConfigError
    from panqueue.django import PanqueueBackend

    with pytest.raises(ConfigError) as caught:
        PanqueueBackend("bad", {"QUEUES": ["default"], **params})
    assert problem in str(caught.value)
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- Django's meanings

# A process of a project without DATABASES: `check` first (it opens django.db.connections,
# which is when Django fills DATABASES with its dummy engine), then an enqueue.
_NO_DATABASE = """
import io
import django
django.setup()
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from panqueue import ConfigError
from tests.django_project.shop.tasks import add
try:
    call_command("check", stdout=io.StringIO())
    print("check: ok")
except SystemCheckError as exc:
    print("check:", " | ".join(line.strip() for line in str(exc).splitlines()
                               if "panqueue." in line or "HINT" in line))
try:
    result = add.enqueue(1, 2)
    print("enqueued", result.id)
except ConfigError as exc:
    print("refused:", exc)
"""


def _no_database(url: str, **extra: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _NO_DATABASE], capture_output=True, text=True, timeout=60,
        cwd=ROOT, env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.django_project.settings_nodb",
                                     PANQUEUE_URL=url, **extra))
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_project_without_databases_enqueues_at_once_after_anything_touched_the_database(
        client: SyncQueueClient) -> None:
    check, enqueued = _no_database(client.url)
    assert check == "check: ok"
    assert enqueued.startswith("enqueued ")
    assert client.get_job("default", enqueued.split()[1]).state is JobState.WAITING


def test_enqueue_on_commit_without_a_database_is_a_system_check_error_and_a_clear_refusal(
        client: SyncQueueClient) -> None:
    check, refused = _no_database(client.url, PQ_ON_COMMIT="1")
    assert check.startswith("check: ?: (panqueue.E001) TASKS['default']['ENQUEUE_ON_COMMIT'] "
                            "is True, but no database is configured"), check
    assert "HINT: Remove ENQUEUE_ON_COMMIT" in check
    assert refused == ("refused: TASKS['default']['ENQUEUE_ON_COMMIT'] is True, but no "
                       "database is configured (DATABASES): remove ENQUEUE_ON_COMMIT to "
                       "enqueue at once")
    assert client.queues() == []


def test_enqueue_on_commit_is_off_unless_asked_for_as_in_djangos_own_backends(
        django_db: Path) -> None:
    from panqueue.django import PanqueueBackend

    assert PanqueueBackend("x", {}).enqueue_on_commit is False
    asked = PanqueueBackend("x", {"ENQUEUE_ON_COMMIT": True})
    assert asked.enqueue_on_commit is True
    assert asked.check() == []  # this project has a database


def test_enqueue_returns_the_result_get_result_reads_back_enqueued_at_on_the_servers_clock(
        client: SyncQueueClient) -> None:
    from django.db import transaction

    from tests.django_project.shop.tasks import add
    from tests.django_project.tasks_compat import task_backends

    at_once = add.using(backend="direct", queue_name="direct").enqueue(1, 2)
    with transaction.atomic():
        on_commit = add.enqueue(3, 4)
        assert on_commit.enqueued_at is None
    for result, queue in [(at_once, "direct"), (on_commit, "default")]:
        stored = client.get_job(queue, result.id).enqueued_at
        assert result.enqueued_at == stored  # the server's time of the add
        back = task_backends[result.backend].get_result(result.id)
        assert back.enqueued_at == result.enqueued_at
        assert (back.id, back.status, back.args, back.kwargs, back.backend, back.errors,
                back.worker_ids, back.started_at, back.finished_at) == (
            result.id, result.status, result.args, result.kwargs, result.backend,
            result.errors, result.worker_ids, result.started_at, result.finished_at)


def test_every_feature_flag_django_defines_is_declared_by_the_backend(django_db: Path) -> None:
    from panqueue.django import PanqueueBackend
    from tests.django_project.tasks_compat import BaseTaskBackend

    flags = {name for name in vars(BaseTaskBackend) if name.startswith("supports_")}
    assert flags >= {"supports_defer", "supports_async_task", "supports_get_result",
                     "supports_priority"}
    # Declared on the backend itself (not inherited as False), each True: run_after, async
    # tasks, results from any process and priorities are what the other tests here run.
    assert {name: vars(PanqueueBackend).get(name) for name in flags} \
        == dict.fromkeys(flags, True)


def test_queues_empty_takes_any_queue_name_as_django_means_and_its_workers_serve_named_ones(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    from panqueue import ConfigError
    from panqueue.django import registry_for
    from tests.django_project.shop.tasks import add
    from tests.django_project.tasks_compat import InvalidTask, TaskResultStatus

    anywhere = add.using(backend="anyqueue", queue_name="anything")
    result = anywhere.enqueue(2, 5)
    assert result.id.startswith("anything:")
    assert client.get_job("anything", result.id).data["task"] == add.module_path
    back = add.using(backend="anyqueue").get_result(result.id)
    assert (back.status, back.task.queue_name) == (TaskResultStatus.READY, "anything")
    with pytest.raises(InvalidTask, match="braces"):  # any name panqueue can store
        add.using(backend="anyqueue", queue_name="a{b}")

    # A worker must be told the queues (panqueue.django:registry cannot list "any").
    with pytest.raises(ConfigError, match=r"TASKS\['anyqueue'\]\['QUEUES'\] is \[\]"):
        registry_for("anyqueue")
    django_worker("tests.django_project.any_queue:registry", serves="anything",
                  PQ_DJANGO_ANY_QUEUE="1")
    wait_until(_finished(result), what="the any-queue task to finish")
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 7)


def test_a_backend_with_a_key_prefix_stores_its_tasks_under_it_and_its_workers_serve_it(
        client: SyncQueueClient, redis_url: str,
        django_worker: Callable[..., subprocess.Popen[bytes]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from panqueue import ConfigError
    from panqueue.django import PanqueueBackend, registry_for
    from tests.django_project.shop.tasks import add
    from tests.django_project.tasks_compat import TaskResultStatus

    billed = add.using(backend="billing", queue_name="billed")
    result = billed.enqueue(4, 5)
    # Under the prefix, as QueueClient(prefix="billing") names it, and nowhere else.
    with SyncQueueClient(redis_url, prefix="billing") as prefixed:
        assert prefixed.get_job("billed", result.id).data["task"] == add.module_path
    with pytest.raises(JobNotFound):
        client.get_job("billed", result.id)
    assert billed.get_result(result.id).status == TaskResultStatus.READY

    # Its registry carries the prefix (and the URL), so a worker given neither serves it.
    assert (registry_for("billing").prefix, registry_for("billing").url) == ("billing", redis_url)
    django_worker("tests.django_project.prefixed:registry", serves="billed", prefix="billing",
                  PQ_DJANGO_ANY_QUEUE="1")
    wait_until(_finished(result), what="the prefixed task to finish")
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 9)

    # One worker serves one prefix: a registry of backends with different ones is refused.
    with pytest.raises(ConfigError, match="different key prefixes"):
        registry_for("default", "billing")
    # The default is PANQUEUE_PREFIX, as the CLI's.
    monkeypatch.setenv("PANQUEUE_PREFIX", "ops")
    assert PanqueueBackend("x", {}).prefix == "ops"
    assert PanqueueBackend("x", {"OPTIONS": {"prefix": None}}).prefix is None


def test_an_attempt_that_timed_out_sends_task_finished_with_what_its_result_says(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]],
        tmp_path: Path) -> None:
    """OPTIONS["timeout"]: the attempt fails with JobTimeout, and its abandoned thread runs on.
    When the task returned, task_finished went out with SUCCESSFUL, while the result read
    FAILED: Django's receivers, error monitoring among them, saw a success."""
    from tests.django_project.slow import sleepy
    from tests.django_project.tasks_compat import TaskResultStatus

    signals = tmp_path / "signals.log"
    django_worker("tests.django_project.slow:registry", serves="slow",
                  PQ_DJANGO_ANY_QUEUE="1", PQ_SIGNAL_LOG=str(signals))
    result = sleepy.enqueue(2)
    wait_until(lambda: signals.exists() and len(signals.read_text().splitlines()) == 2,
               timeout=20, what="the attempt's task_finished")
    assert signals.read_text().splitlines() == [f"started {result.id} RUNNING",
                                                f"finished {result.id} FAILED"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["panqueue.errors.JobTimeout"]


def test_a_task_that_finishes_while_the_worker_drains_sends_task_finished(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]],
        tmp_path: Path) -> None:
    """A graceful stop (SIGTERM) lets a running task finish; job.should_stop() is true all
    through it. That was taken for an attempt the worker gave up: no task_finished at all."""
    import signal

    from tests.django_project.slow import sleepy

    signals = tmp_path / "signals.log"
    worker = django_worker("tests.django_project.slow:registry", serves="slow",
                           PQ_DJANGO_ANY_QUEUE="1", PQ_SIGNAL_LOG=str(signals))
    result = sleepy.enqueue(0.7)  # within the backend's 1 s timeout
    wait_until(lambda: signals.exists() and "started" in signals.read_text(), timeout=20,
               what="the task to start")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    assert client.get_job("slow", result.id).state is JobState.COMPLETED
    assert signals.read_text().splitlines() == [f"started {result.id} RUNNING",
                                                f"finished {result.id} SUCCESSFUL"]


# -- retries -------------------------------------------------------------------------------------


def _backoff_calls(log: Path, result_id: str) -> list[dict[str, Any]]:
    """The calls of the ``retrying`` backend's backoff for the task ``result_id``."""
    if not log.exists():
        return []
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return [call for call in calls if call["id"] == result_id]


def _attempts_seen(mark: Path) -> list[tuple[int, str, float]]:
    """What each attempt of a ``flaky`` task saw: its number, its status, when it started."""
    return [(int(n), status, float(at))
            for n, status, at in (line.split() for line in mark.read_text().splitlines())]


def test_task_retried_with_the_backends_backoff_records_every_attempt_as_django_says(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]],
        tmp_path: Path) -> None:
    from tests.django_project.shop.retrying import flaky
    from tests.django_project.tasks_compat import TaskResultStatus

    signals, log = tmp_path / "signals.log", tmp_path / "backoff.log"
    worker = django_worker(serves="retrying", PQ_SIGNAL_LOG=str(signals),
                           PQ_BACKOFF_LOG=str(log))
    me = f"{socket.gethostname()}:{worker.pid}"
    flaky_path = "tests.django_project.shop.retry.Flaky"

    # Fails twice, then succeeds on the last of its 3 attempts (OPTIONS["attempts"]).
    mark = tmp_path / "succeeds.mark"
    result = flaky.enqueue(fails=2, retry_in=0.1, mark=str(mark))
    wait_until(_finished(result), what="flaky to succeed on its third attempt")
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "ok on attempt 3"
    assert result.attempts == 3
    assert result.worker_ids == [me, me, me]
    # One error per failed attempt, in order, each the task's own exception (not a retry).
    assert [error.exception_class_path for error in result.errors] == [flaky_path] * 2
    assert "attempt 1 failed" in result.errors[0].traceback
    assert "attempt 2 failed" in result.errors[1].traceback
    # Every run saw itself RUNNING; each retry started once the backoff's 0.1 s had passed.
    seen = _attempts_seen(mark)
    assert [(n, status) for n, status, _ in seen] == [(1, "RUNNING"), (2, "RUNNING"),
                                                      (3, "RUNNING")]
    calls = _backoff_calls(log, result.id)
    assert len(calls) == 2
    for call, (_, _, next_start) in zip(calls, seen[1:], strict=True):
        assert next_start - call["at"] >= 0.1
    # The backoff got the raised exception itself and the result updated by its attempt.
    assert [(c["exception"], c["message"], c["status"], c["attempts"], c["worker_ids"],
             c["errors"], c["finished"]) for c in calls] == [
        (flaky_path, "attempt 1 failed", "FAILED", 1, [me], [flaky_path], True),
        (flaky_path, "attempt 2 failed", "FAILED", 2, [me, me], [flaky_path] * 2, True)]
    # Django's signals, around each attempt: an attempt that is retried finishes READY
    # ("ready to be executed again"), so Django's own receiver logs no error for it.
    assert signals.read_text().splitlines() == [
        f"started {result.id} RUNNING", f"finished {result.id} READY",
        f"started {result.id} RUNNING", f"finished {result.id} READY",
        f"started {result.id} RUNNING", f"finished {result.id} SUCCESSFUL"]

    # Fails every attempt: FAILED once the last has run; the backoff is not asked after it.
    mark = tmp_path / "fails.mark"
    failing = flaky.enqueue(fails=5, retry_in=0.1, mark=str(mark))
    wait_until(_finished(failing), what="flaky to fail its three attempts")
    assert failing.status == TaskResultStatus.FAILED
    assert [line for line in signals.read_text().splitlines() if failing.id in line] == [
        f"started {failing.id} RUNNING", f"finished {failing.id} READY",
        f"started {failing.id} RUNNING", f"finished {failing.id} READY",
        f"started {failing.id} RUNNING", f"finished {failing.id} FAILED"]
    assert (failing.attempts, len(failing.errors)) == (3, 3)
    assert len(_backoff_calls(log, failing.id)) == 2
    info = client.get_job("retrying", failing.id)
    assert info.failure_reason == "max_attempts_exceeded"
    assert [entry["type"] for entry in info.history] == [flaky_path] * 3


def test_task_retried_with_panqueues_backoff_records_every_attempt_as_django_says(
        django_worker: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    from tests.django_project.shop.retrying import flaky
    from tests.django_project.tasks_compat import TaskResultStatus

    signals = tmp_path / "signals.log"
    worker = django_worker(serves="retrying-default", PQ_SIGNAL_LOG=str(signals))
    me = f"{socket.gethostname()}:{worker.pid}"
    # No OPTIONS["backoff"]: OPTIONS["attempts"] and panqueue's backoff (about a second).
    retried = flaky.using(backend="retrying_default", queue_name="retrying-default")
    mark = tmp_path / "mark"
    result = retried.enqueue(fails=1, retry_in="ignored", mark=str(mark))
    failing = retried.enqueue(fails=5, retry_in="ignored", mark=str(tmp_path / "fails"))
    wait_until(_finished(result), what="flaky to succeed on its second attempt")
    wait_until(_finished(failing), what="flaky to fail its two attempts")
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL,
                                                    "ok on attempt 2")
    assert (result.attempts, result.worker_ids) == (2, [me, me])
    [error] = result.errors
    assert error.exception_class_path == "tests.django_project.shop.retry.Flaky"
    assert [(n, status) for n, status, _ in _attempts_seen(mark)] == [(1, "RUNNING"),
                                                                      (2, "RUNNING")]
    assert failing.status == TaskResultStatus.FAILED
    assert (failing.attempts, len(failing.errors)) == (2, 2)
    lines = signals.read_text().splitlines()
    assert [line for line in lines if result.id in line] == [
        f"started {result.id} RUNNING", f"finished {result.id} READY",
        f"started {result.id} RUNNING", f"finished {result.id} SUCCESSFUL"]
    assert [line for line in lines if failing.id in line] == [
        f"started {failing.id} RUNNING", f"finished {failing.id} READY",
        f"started {failing.id} RUNNING", f"finished {failing.id} FAILED"]


def test_task_waiting_out_its_backoff_reads_ready_with_its_failed_attempt(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]],
        tmp_path: Path) -> None:
    from tests.django_project.shop.retrying import flaky
    from tests.django_project.tasks_compat import TaskResultStatus

    log = tmp_path / "backoff.log"
    worker = django_worker(serves="retrying", PQ_BACKOFF_LOG=str(log))
    result = flaky.enqueue(fails=1, retry_in=3600, mark=str(tmp_path / "mark"))
    wait_until(lambda: client.get_job("retrying", result.id).state is JobState.DELAYED,
               what="flaky to wait out its backoff")
    result.refresh()
    # READY: "ready to be executed again", as Django's TaskResultStatus says.
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 1
    assert result.worker_ids == [f"{socket.gethostname()}:{worker.pid}"]
    [error] = result.errors
    assert error.exception_class_path == "tests.django_project.shop.retry.Flaky"
    assert 'raise Flaky(f"attempt {context.attempt} failed", retry_in)' in error.traceback
    explained = client.explain("retrying", result.id)
    assert explained.retry_of == 1
    assert explained.detail.startswith(
        "retry 2 of 3 after tests.django_project.shop.retry.Flaky: attempt 1 failed, due at ")


def test_backoff_returning_none_ends_the_task_failed_without_more_attempts(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]],
        tmp_path: Path) -> None:
    from tests.django_project.shop.retrying import flaky
    from tests.django_project.tasks_compat import TaskResultStatus

    log, signals = tmp_path / "backoff.log", tmp_path / "signals.log"
    django_worker(serves="retrying", PQ_BACKOFF_LOG=str(log), PQ_SIGNAL_LOG=str(signals))
    result = flaky.enqueue(fails=5, retry_in=None, mark=str(tmp_path / "mark"))
    wait_until(_finished(result), what="flaky to fail")
    assert signals.read_text().splitlines() == [f"started {result.id} RUNNING",
                                                f"finished {result.id} FAILED"]
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    [error] = result.errors
    assert error.exception_class_path == "tests.django_project.shop.retry.Flaky"
    assert "attempt 1 failed" in error.traceback
    assert len(_backoff_calls(log, result.id)) == 1
    info = client.get_job("retrying", result.id)
    assert info.failure_reason == "explicit_fail"
    assert info.logs[-1] == ("not retried: TASKS['retrying']['OPTIONS']['backoff'] "
                             "returned None")


@pytest.mark.parametrize(("retry_in", "problem"), [
    ("raise", "raised RuntimeError: the backoff broke"),
    (-1, "returned -1, which is not a number of seconds >= 0 and at most a year "
         "(an int, a float or a timedelta), nor None"),
    ("soon", "returned 'soon', which is not a number of seconds"),
])
def test_backoff_that_raises_or_returns_no_delay_fails_the_task_saying_why(
        client: SyncQueueClient, django_worker: Callable[..., subprocess.Popen[bytes]],
        tmp_path: Path, retry_in: Any, problem: str) -> None:
    from tests.django_project.shop.retrying import flaky
    from tests.django_project.tasks_compat import TaskResultStatus

    django_worker(serves="retrying")
    result = flaky.enqueue(fails=5, retry_in=retry_in, mark=str(tmp_path / "mark"))
    wait_until(_finished(result), what="flaky to fail")
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    # The attempt's error is the task's own, and its traceback ends saying why it stopped.
    [error] = result.errors
    assert error.exception_class_path == "tests.django_project.shop.retry.Flaky"
    assert "attempt 1 failed" in error.traceback
    stopped = f"not retried: TASKS['retrying']['OPTIONS']['backoff'] {problem}"
    assert stopped in error.traceback
    assert client.get_job("retrying", result.id).logs[-1].startswith(stopped)


def test_backoff_may_return_a_timedelta(
        django_worker: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    from tests.django_project.shop.retrying import flaky

    django_worker(serves="retrying")
    result = flaky.enqueue(fails=1, retry_in="timedelta", mark=str(tmp_path / "mark"))
    wait_until(_finished(result), what="flaky to succeed on its second attempt")
    assert (result.return_value, result.attempts) == ("ok on attempt 2", 2)


def _one_argument(task_result: Any) -> int:
    return 30


@pytest.mark.parametrize(("backoff", "problem"), [
    (42, "['backoff'] must be a callable (exception, task_result) -> seconds or None, or "
         "the dotted path of one, got 42"),
    ("tests.django_project.shop.retry.nope", "['backoff'] "
     "'tests.django_project.shop.retry.nope' does not import: "),
    ("no_such_module.backoff", "['backoff'] 'no_such_module.backoff' does not import: "),
    ("tests.django_project.shop.retry.Flaky.retry_in", "does not import"),
    (_one_argument, "['backoff'] must take (exception, task_result)"),
])
def test_bad_backoff_setting_is_refused_naming_the_entry(
        django_db: Path, backoff: Any, problem: str) -> None:
    from panqueue import ConfigError
    from panqueue.django import PanqueueBackend

    with pytest.raises(ConfigError) as caught:
        PanqueueBackend("bad", {"QUEUES": ["default"], "OPTIONS": {"backoff": backoff}})
    assert str(caught.value).startswith("TASKS['bad']['OPTIONS']")
    assert problem in str(caught.value)
    # A callable, or the path of one, is taken; None is panqueue's own backoff.
    for good in ["tests.django_project.shop.retry.backoff",
                 lambda exception, task_result: None, None]:
        assert PanqueueBackend("good", {"QUEUES": ["default"], "OPTIONS": {"backoff": good}})
