"""``PanqueueBackend``: Django's Tasks framework on panqueue. Enqueueing adds a job to the panqueue
queue named like the task's ``queue_name``; reading a result reads that job back.

One module over 400 lines: the backend's settings, its enqueue (inside or after a transaction)
and its reading back of results share one client per backend and one idea of which queue and
prefix a task lives in; Django sees them as one class."""

from __future__ import annotations

import builtins
import importlib
import os
import threading
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone
from django.utils.crypto import get_random_string

import panqueue.errors
from panqueue._check import check_flag
from panqueue._client import SyncQueueClient
from panqueue._codec import check_json_compatible
from panqueue._job import JobInfo, JobState
from panqueue._keys import check_prefix, check_queue_name
from panqueue._options import Retention, check_attempts, check_positive, check_priority
from panqueue.django._compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from panqueue.django._retry import check_backoff
from panqueue.errors import ConfigError, JobNotFound

__all__ = ["FAILED", "READY", "RUNNING", "SUCCESSFUL", "WORKER_LINE", "PanqueueBackend",
           "TaskRefused", "class_path", "task_call"]

T = TypeVar("T")

_ID_LENGTH = 32

# The job log line each attempt starts with; TaskResult.worker_ids is read back from these.
WORKER_LINE = "django task running on worker "

_OPTIONS = frozenset({"url", "prefix", "task_modules", "attempts", "backoff", "timeout",
                      "retention"})

# panqueue job states as Django sees them. Django has no cancelled state: a cancelled (or
# expired) job did not run to success, so it reads as FAILED.
READY = TaskResultStatus("READY")
RUNNING = TaskResultStatus("RUNNING")
SUCCESSFUL = TaskResultStatus("SUCCESSFUL")
FAILED = TaskResultStatus("FAILED")
_STATUS = {
    JobState.WAITING: READY,
    JobState.DELAYED: READY,
    JobState.BLOCKED: READY,
    JobState.ACTIVE: RUNNING,
    JobState.COMPLETED: SUCCESSFUL,
    JobState.FAILED: FAILED,
    JobState.CANCELLED: FAILED,
}

# One client per Redis URL and key prefix for the whole process: Django makes a backend object
# per thread, and they all share the client's (thread-safe) connection pool.
_clients: dict[tuple[str, str | None], SyncQueueClient] = {}
_clients_lock = threading.Lock()


def _client(url: str, prefix: str | None) -> SyncQueueClient:
    with _clients_lock:
        client = _clients.get((url, prefix))
        if client is None:  # connects on first use
            client = _clients[url, prefix] = SyncQueueClient(url, prefix=prefix)
        return client


class TaskRefused(Exception):
    """A job names something that is not a Django task this project may run."""


def class_path(type_name: str) -> str:
    """The dotted path Django's ``TaskError.exception_class_path`` wants, for a recorded error
    type: the worker records Django tasks' errors by full path already; panqueue's own
    (``JobTimeout``, ``Stalled``, ``Fail``...) and built-ins are recorded by name."""
    if "." in type_name:
        return type_name
    if isinstance(getattr(panqueue.errors, type_name, None), type):
        return f"panqueue.errors.{type_name}"
    if isinstance(getattr(builtins, type_name, None), type):
        return f"builtins.{type_name}"
    return "builtins.Exception"


class PanqueueBackend(BaseTaskBackend):
    """A backend for Django's Tasks framework that stores tasks as panqueue jobs.

    ``TASKS = {"default": {"BACKEND": "panqueue.django.PanqueueBackend", "QUEUES": [...],
    "OPTIONS": {"url": "redis://..."}}}``. ``ENQUEUE_ON_COMMIT`` (default False, as Django's
    own backends enqueue at once): True adds the job when the ``default`` database's
    transaction commits. ``OPTIONS``:
    ``url`` (default ``PANQUEUE_URL``, else ``redis://localhost:6379/0``), ``prefix`` (the key
    prefix of the queues, as ``QueueClient(prefix=...)``; default ``PANQUEUE_PREFIX``, else
    none), ``task_modules``
    (modules outside the installed apps whose tasks workers may run), and for the workers'
    handlers ``attempts`` (default 1), ``backoff`` (default panqueue's: see :func:`check_backoff`),
    ``timeout`` (seconds, default none) and ``retention`` (a :class:`panqueue.Retention`: how
    many finished tasks keep their results).

    Each of ``QUEUES`` is the panqueue queue of that name; ``QUEUES: []`` accepts any queue
    name, as Django's backends do (each result id then carries its queue). ``panqueue worker
    panqueue.django:registry`` runs the tasks.

    Every feature flag Django defines is True, each because panqueue does it: ``run_after``
    (a delayed job), coroutine tasks (run by the worker), results read from any process
    (they are in Redis), and priorities (-100..100 passed unchanged; higher runs first).
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        try:
            self._configure(params)
        except ConfigError as exc:
            where = f"TASKS[{alias!r}]"
            message = str(exc)
            raise ConfigError(message if message.startswith(where) else f"{where}: {message}"
                              ) from None

    def _configure(self, params: dict[str, Any]) -> None:
        where = f"TASKS[{self.alias!r}]"
        options = self.options
        if not isinstance(options, dict):
            raise ConfigError(f"{where}['OPTIONS'] must be a dict, got {options!r}")
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ConfigError(f"{where}['OPTIONS'] has unknown key(s) "
                              f"{', '.join(sorted(map(repr, unknown)))} "
                              f"(known: {', '.join(sorted(_OPTIONS))})")
        url = options.get("url")
        if url is not None and not isinstance(url, str):
            raise ConfigError(f"{where}['OPTIONS']['url'] must be a str, got {url!r}")
        self.url = SyncQueueClient(url).url
        try:
            self.prefix = check_prefix(
                options.get("prefix", os.environ.get("PANQUEUE_PREFIX") or None))
        except ConfigError as exc:
            raise ConfigError(f"{where}['OPTIONS']['prefix']: {exc}") from None
        modules = options.get("task_modules", ())
        if isinstance(modules, str) or not isinstance(modules, Sequence) \
                or not all(isinstance(m, str) and m for m in modules):
            raise ConfigError(f"{where}['OPTIONS']['task_modules'] must be a list of module "
                              f"names, got {modules!r}")
        self.task_modules: tuple[str, ...] = tuple(modules)
        self.attempts = check_attempts(options.get("attempts", 1))
        self.backoff = check_backoff(options.get("backoff"),
                                     f"{where}['OPTIONS']['backoff']")
        timeout = options.get("timeout")
        self.timeout = None if timeout is None else check_positive(timeout, "timeout")
        retention = options.get("retention")
        if retention is not None and not isinstance(retention, Retention):
            raise ConfigError(f"{where}['OPTIONS']['retention'] must be a panqueue.Retention, "
                              f"got {retention!r}")
        self.retention: Retention | None = retention
        self.enqueue_on_commit = check_flag(params.get("ENQUEUE_ON_COMMIT", False),
                                            f"{where}['ENQUEUE_ON_COMMIT']",
                                            expected="True or False")
        for queue in self.queues:
            try:
                check_queue_name(queue)
            except ConfigError as exc:
                raise ConfigError(f"{where}['QUEUES']: {exc}") from None

    @property
    def client(self) -> SyncQueueClient:
        """The process's client for this backend's URL and key prefix."""
        return _client(self.url, self.prefix)

    # -- checks ------------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """``manage.py check`` (and ``runserver``, ``migrate``...): ``ENQUEUE_ON_COMMIT`` needs
        a database whose transactions it can wait for."""
        if self.enqueue_on_commit and not _has_database():
            return [checks.Error(
                f"TASKS[{self.alias!r}]['ENQUEUE_ON_COMMIT'] is True, but no database is "
                "configured: there is no transaction to wait for, and every enqueue() fails",
                hint="Remove ENQUEUE_ON_COMMIT (the default is False: enqueue at once), or "
                     "configure DATABASES",
                id="panqueue.E001")]
        return []

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Django's checks, and with ``QUEUES: []`` (any queue) the queue name panqueue's."""
        super().validate_task(task)
        if not self.queues:
            try:
                check_queue_name(task.queue_name)
            except ConfigError as exc:
                raise InvalidTask(str(exc)) from None

    # -- producing ---------------------------------------------------------------------------

    def enqueue(self, task: Task[Any, T], args: Any, kwargs: Any) -> TaskResult[T]:
        """Add a job that runs ``task(*args, **kwargs)`` at once; with ``ENQUEUE_ON_COMMIT``,
        inside ``transaction.atomic()`` the job is added when the transaction commits, and
        never if it rolls back. The returned result's ``id`` is the job id, and its
        ``enqueued_at`` is the time the server recorded (None until the job is added)."""
        self.validate_task(task)
        if self.enqueue_on_commit and not _has_database():
            raise ConfigError(f"TASKS[{self.alias!r}]['ENQUEUE_ON_COMMIT'] is True, but no "
                              "database is configured (DATABASES): remove ENQUEUE_ON_COMMIT "
                              "to enqueue at once")
        result: TaskResult[T] = TaskResult(
            task=task, id=self._new_id(task.queue_name), status=READY, enqueued_at=None,
            started_at=None, finished_at=None, last_attempted_at=None, args=args,
            kwargs=kwargs, backend=self.alias, errors=[], worker_ids=[])
        # Checked now, so a bad argument fails the enqueue() call, not a later commit (when the
        # database has committed already): the data, and the add's options as panqueue takes
        # them. Django checked the priority is a whole number from -100 to 100 (5.0 too).
        check_json_compatible(result.args, "args")
        check_json_compatible(result.kwargs, "kwargs")
        priority = check_priority(int(task.priority))
        run_at = None
        if task.run_after is not None:
            run_at = task.run_after
            if timezone.is_naive(run_at):  # USE_TZ = False: the project's time zone
                run_at = timezone.make_aware(run_at)
        if self.enqueue_on_commit:
            transaction.on_commit(partial(self._add, result, priority, run_at),
                                  using=DEFAULT_DB_ALIAS)
        else:
            self._add(result, priority, run_at)
        return result

    def _new_id(self, queue: str) -> str:
        """A new result id: random; with ``QUEUES: []`` prefixed by its queue, which
        :meth:`get_result` has no list to find it in."""
        return _random_id() if self.queues else f"{queue}:{_random_id()}"

    def _add(self, result: TaskResult[Any], priority: int, run_at: datetime | None) -> None:
        task = result.task
        data = {
            "task": task.module_path,
            "args": result.args,
            "kwargs": result.kwargs,
            "backend": self.alias,
            "run_after": None if run_at is None else run_at.isoformat(),
        }
        # Django and panqueue agree on priorities: higher runs first, 0 by default.
        job = self.client.queue(task.queue_name).add(data, job_id=result.id,
                                                     priority=priority, run_at=run_at)
        # The server's time of the add, as get_result() reads it back (not this clock); but a
        # worker may have run the task and retention deleted it already: the add is done all
        # the same, and this clock says when.
        try:
            enqueued_at = job.info().enqueued_at
        except panqueue.errors.JobNotFound:
            enqueued_at = timezone.now()
        object.__setattr__(result, "enqueued_at", _django_time(enqueued_at))
        task_enqueued.send(type(self), task_result=result)

    # -- reading back ------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The task's result as stored now; :class:`TaskResultDoesNotExist` if no queue of
        this backend has a job ``result_id`` made by a Django task."""
        for queue in sorted(self.queues) if self.queues else _queue_of(result_id):
            try:
                info = self.client.get_job(queue, result_id)
            except (JobNotFound, ConfigError):
                continue
            return self.result_from_job(info)
        raise TaskResultDoesNotExist(result_id)

    def result_from_job(self, info: JobInfo) -> TaskResult[Any]:
        """A :class:`TaskResult` describing the job ``info``."""
        data = info.data
        try:
            path, args, kwargs = task_call(data)
            task = self.resolve_task(path)
            run_after = data.get("run_after")
            task = task.using(
                queue_name=info.queue, priority=info.priority, backend=self.alias,
                run_after=None if run_after is None else _django_time(
                    datetime.fromisoformat(run_after)))
        except (TaskRefused, ValueError, TypeError, AttributeError) as exc:
            raise TaskResultDoesNotExist(f"{info.id}: {exc}") from None
        except Exception as exc:  # the task's own validation, for one
            raise TaskResultDoesNotExist(f"{info.id}: {type(exc).__name__}: {exc}") from None
        result: TaskResult[Any] = TaskResult(
            task=task, id=info.id, status=_STATUS[info.state],
            enqueued_at=_django_time(info.enqueued_at),
            started_at=_django_time(info.started_at),
            finished_at=_django_time(info.finished_at),
            last_attempted_at=_django_time(info.started_at),
            args=args, kwargs=kwargs, backend=self.alias, errors=_errors(info),
            worker_ids=[line[len(WORKER_LINE):] for line in info.logs
                        if line.startswith(WORKER_LINE)])
        if info.state is JobState.COMPLETED:
            object.__setattr__(result, "_return_value", info.result)
        return result

    # -- which tasks may run -----------------------------------------------------------------

    def resolve_task(self, path: str) -> Task[Any, Any]:
        """The Django task at ``path`` (``module.function``), or :class:`TaskRefused`.

        ``path`` comes from Redis, so it is checked before anything is imported: its module
        must belong to an installed app or to ``OPTIONS['task_modules']``. Then the name must
        be a task object (a function decorated with ``@task``), not any other callable."""
        module_name, _, name = path.rpartition(".")
        if not module_name or not name.isidentifier() \
                or not all(part.isidentifier() for part in module_name.split(".")):
            raise TaskRefused(f"{path!r} is not a task path (module.function)")
        if not self._allowed(module_name):
            raise TaskRefused(
                f"{path!r} is not in an installed app nor in TASKS[{self.alias!r}]['OPTIONS']"
                f"['task_modules']; it was not imported or run")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise TaskRefused(f"{path!r}: cannot import {module_name!r}: {exc}") from None
        found = getattr(module, name, None)
        if not isinstance(found, Task):
            raise TaskRefused(f"{path!r} is not a Django task (a function decorated with "
                              f"@task); it was not run")
        return found

    def _allowed(self, module_name: str) -> bool:
        if any(module_name == m or module_name.startswith(m + ".") for m in self.task_modules):
            return True
        return apps.get_containing_app_config(module_name) is not None


def task_call(data: Any) -> tuple[str, list[Any], dict[str, Any]]:
    """The task path, args and kwargs of a job made by :class:`PanqueueBackend`."""
    if not isinstance(data, dict) or not isinstance(data.get("task"), str):
        raise TaskRefused("the job was not made by panqueue.django (its data has no 'task')")
    args, kwargs = data.get("args", []), data.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise TaskRefused("the job's 'args' must be a list and its 'kwargs' a dict")
    return data["task"], args, kwargs


def _errors(info: JobInfo) -> list[TaskError]:
    """One error per failed attempt. panqueue keeps the full traceback of the latest error
    only; earlier attempts get their type and message as a one-line traceback."""
    errors = [TaskError(exception_class_path=class_path(str(entry.get("type", ""))),
                        traceback=f"{entry.get('type', '')}: {entry.get('message', '')}\n")
              for entry in info.history]
    if info.error is not None:
        latest = TaskError(exception_class_path=class_path(info.error.type),
                           traceback=info.error.traceback
                           or f"{info.error.type}: {info.error.message}\n")
        if errors and info.history[-1].get("type") == info.error.type:
            errors[-1] = latest  # the last attempt's entry, now with its traceback
        else:
            errors.append(latest)
    return errors


def _django_time(value: datetime | None) -> datetime | None:
    """An aware UTC time as the project uses times: aware with ``USE_TZ``, else naive local."""
    if value is None or settings.USE_TZ or timezone.is_naive(value):
        return value
    naive: datetime = timezone.make_naive(value)
    return naive


def _random_id() -> str:
    """A random result id, which is also the job id (never all digits: panqueue keeps those
    for the ids it generates)."""
    while True:
        result_id: str = get_random_string(_ID_LENGTH)
        if not result_id.isdigit():
            return result_id


def _queue_of(result_id: str) -> list[str]:
    """The queue a result id of a ``QUEUES: []`` backend names (``<queue>:<random>``), as a
    list of at most one."""
    queue, separator = result_id[:-_ID_LENGTH - 1], result_id[-_ID_LENGTH - 1:-_ID_LENGTH]
    return [queue] if queue and separator == ":" else []


def _has_database() -> bool:
    """Whether the ``default`` database is a real one. Django puts its dummy engine there
    (in ``settings.DATABASES`` itself) when ``DATABASES`` is empty, the first time anything
    opens ``django.db.connections``."""
    engine = connections.settings.get(DEFAULT_DB_ALIAS, {}).get("ENGINE")
    return bool(engine) and engine != "django.db.backends.dummy"
