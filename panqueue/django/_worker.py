"""The worker side: a :class:`~panqueue.Registry` whose handlers run Django tasks, for
``panqueue worker panqueue.django:registry`` (or ``registry_for(...)`` in a module of your own).

Each queue of each :class:`PanqueueBackend` gets a handler on the thread executor: task code is
ordinary blocking Django code (the ORM above all), which must not run on the worker's event
loop. A job's data names the task; the handler runs it only if that name is a Django task of
the project (:meth:`PanqueueBackend.resolve_task`), and never imports or calls anything else.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

from panqueue._codec import check_json_compatible
from panqueue._job import ErrorInfo, Job
from panqueue._registry import Registry
from panqueue._store.transport import redact_url
from panqueue.django._backend import (
    FAILED,
    READY,
    RUNNING,
    SUCCESSFUL,
    WORKER_LINE,
    PanqueueBackend,
    TaskRefused,
    task_call,
)
from panqueue.django._compat import (
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from panqueue.django._retry import backoff_delay
from panqueue.errors import ConfigError, Fail, JobNotFound, Retry, exception_message
from panqueue.executors import RemoteError

__all__ = ["registry_for", "setup_django"]


def setup_django() -> None:
    """Configure Django from ``DJANGO_SETTINGS_MODULE`` and load the apps, unless done."""
    import django
    from django.apps import apps
    from django.conf import settings

    if not settings.configured:
        name = os.environ.get("DJANGO_SETTINGS_MODULE")
        if not name:
            raise ConfigError("panqueue.django needs the Django settings: set "
                              "DJANGO_SETTINGS_MODULE (for example mysite.settings)")
        try:
            settings.INSTALLED_APPS  # noqa: B018 - imports the settings module
        except ImportError as exc:
            raise ConfigError(f"cannot import the Django settings {name!r} "
                              f"(DJANGO_SETTINGS_MODULE): {exc}") from None
    if not apps.ready:
        django.setup()


def registry_for(*aliases: str, queues: Sequence[str] | None = None) -> Registry:
    """A registry that runs the tasks of the ``TASKS`` backends ``aliases`` (default: every
    backend that is a :class:`PanqueueBackend`): one handler per queue of each, on the thread
    executor, with the backend's ``attempts``, ``timeout`` and ``retention``. Sets Django up
    first. The registry's ``url`` is the backends' (when they share one) and its ``prefix``
    theirs: backends with different prefixes are refused, as a worker serves one.

    A backend with ``QUEUES: []`` takes any queue name, so its workers cannot list them:
    ``queues`` names the ones they serve (it applies to such backends only)."""
    setup_django()
    from django.core.exceptions import ImproperlyConfigured

    backends: list[PanqueueBackend] = []
    try:
        found = [task_backends[alias] for alias in aliases] if aliases else task_backends.all()
    except ImproperlyConfigured as exc:
        raise ConfigError(f"TASKS: {exc}") from None
    for backend in found:
        if isinstance(backend, PanqueueBackend):
            backends.append(backend)
        elif aliases:
            raise ConfigError(f"TASKS[{backend.alias!r}] is a {type(backend).__name__}, not "
                              "a panqueue.django.PanqueueBackend")
    if not backends:
        raise ConfigError("no backend in TASKS is a panqueue.django.PanqueueBackend "
                          "(set its 'BACKEND' to 'panqueue.django.PanqueueBackend')")
    if queues is not None and (isinstance(queues, str) or not all(
            isinstance(q, str) and q for q in queues)):
        raise ConfigError(f"registry_for(queues=...) must be a list of queue names, "
                          f"got {queues!r}")
    prefixes = {backend.prefix for backend in backends}
    if len(prefixes) > 1:
        raise ConfigError(
            "the backends " + ", ".join(f"TASKS[{b.alias!r}]" for b in backends)
            + " have different key prefixes (OPTIONS['prefix']), and a worker serves one: "
            "make a registry for each (registry_for(alias)) and run a worker for each")
    # The backends' URL and prefix are the worker's defaults (its --url, --prefix and
    # PANQUEUE_URL, PANQUEUE_PREFIX still come first).
    urls = {backend.url for backend in backends}
    registry = Registry(urls.pop() if len(urls) == 1 else None, prefix=prefixes.pop())
    for backend in backends:
        runner = _TaskRunner(backend)
        served = sorted(backend.queues or queues or ())
        if not served:
            raise ConfigError(
                f"TASKS[{backend.alias!r}]['QUEUES'] is [] (any queue name), so its workers "
                f"must be told which queues to serve: registry_for({backend.alias!r}, "
                f"queues=[...]) in a module of your own")
        for queue in served:
            registry.handler(queue, executor="thread", attempts=backend.attempts,
                             timeout=backend.timeout, retention=backend.retention
                             )(runner.handler())
    return registry


class _TaskRunner:
    """Runs the Django task a job names, in a worker thread."""

    def __init__(self, backend: PanqueueBackend) -> None:
        self.backend = backend
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"

    def handler(self) -> Any:
        def run_django_task(job: Job) -> Any:
            return self.run(job)

        return run_django_task

    def run(self, job: Job) -> Any:
        from django.db import close_old_connections

        backend = self.backend
        try:
            path, _, _ = task_call(job.data)
            backend.resolve_task(path)
        except TaskRefused as exc:  # a job not made by the backend, or a forged one
            raise Fail(f"refused: {exc}") from None
        job.log(WORKER_LINE + self.worker_id)
        # Like a request: connections that broke or outlived CONN_MAX_AGE are dropped first,
        # and the task's are given back after.
        close_old_connections()
        try:
            try:
                # Read through the backend, as Django would: RUNNING, with the attempts so far.
                info = backend.client.get_job(job.queue, job.id)
            except JobNotFound:
                where = redact_url(backend.url) + (
                    f", prefix {backend.prefix!r}" if backend.prefix else "")
                raise Fail(f"job {job.id} is not in the Redis of TASKS[{backend.alias!r}] "
                           f"({where}): run the worker with that URL and prefix") from None
            try:
                result = backend.result_from_job(info)
            except TaskResultDoesNotExist as exc:
                raise Fail(f"refused: {exc}") from None
            return self._call(job, result)
        finally:
            close_old_connections()

    def _call(self, job: Job, result: TaskResult[Any]) -> Any:
        sender = type(self.backend)
        task = result.task
        task_started.send(sender=sender, task_result=result)
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *result.args,
                                  **result.kwargs)
            else:
                value = task.call(*result.args, **result.kwargs)
            # As Django's own backends do, inside the task's run: a return value that is not
            # JSON fails the task with the framework's TypeError ("Unsupported type"), so
            # task_finished and the stored result agree (FAILED).
            value = normalize_json(value)
            check_json_compatible(value, "result")
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            if job.should_stop() and self._given_up(job, sender):
                raise
            # Recorded under the exception's full path, so Django's TaskError.exception_class
            # finds the class again; the traceback is the task's own.
            error = ErrorInfo.from_exception(exc)
            path = f"{type(exc).__module__}.{type(exc).__qualname__}"
            _finish(result, FAILED)
            result.errors.append(TaskError(exception_class_path=path,
                                           traceback=error.traceback or ""))
            failed = RemoteError(path, error.message, error.traceback)
            ending = self._ending(job, result, exc, failed)
            if isinstance(ending, Retry) or (ending is failed
                                             and job.attempt < job.options.attempts):
                # Retried: READY, "ready to be executed again", as get_result() reads it
                # now; FAILED (which Django's own receiver logs as an error) only at the end.
                object.__setattr__(result, "status", READY)
            task_finished.send(sender=sender, task_result=result)
            raise ending from ending.__cause__  # Retry or Fail: from the task's error
        if job.should_stop() and self._given_up(job, sender):
            return value  # the worker discards it
        _finish(result, SUCCESSFUL)
        object.__setattr__(result, "_return_value", value)
        task_finished.send(sender=sender, task_result=result)
        return value

    def _given_up(self, job: Job, sender: type) -> bool:
        """Whether the worker gave the attempt up while the task ran on in its thread (a
        timeout that abandoned it, a cancel, a lost lock): what it recorded then is the
        attempt's ending, not what the task returned or raised since, and ``task_finished``
        is sent with the result as ``get_result`` reads it (FAILED with ``JobTimeout``, READY
        for a retry). A job that still reads RUNNING is the attempt's (the worker is draining,
        which also makes ``should_stop`` true): False, and the task's own ending goes on."""
        try:
            now = self.backend.result_from_job(self.backend.client.get_job(job.queue, job.id))
        except (JobNotFound, TaskResultDoesNotExist):
            return True  # gone since: nothing to say of it
        if now.status == RUNNING:
            return False
        task_finished.send(sender=sender, task_result=now)
        return True

    def _ending(self, job: Job, result: TaskResult[Any], exc: BaseException,
                failed: RemoteError) -> BaseException:
        """What a failed attempt raises to the worker, which records the task's own error
        (``failed``) whatever it is. Without ``OPTIONS["backoff"]``, or on the last attempt,
        that error itself: panqueue's backoff and attempts decide.

        Otherwise ``OPTIONS["backoff"]`` is asked when to run the task again, as Django's
        proposed retry API has it: with the exception raised and the result updated by the
        attempt (FAILED, its error last, its attempt counted). A number of seconds or a
        timedelta is a Retry after that long; None, a bad answer or an exception of its own
        is a Fail: the task ends FAILED. Both are raised from ``failed``, which is what the
        attempt then records."""
        backoff = self.backend.backoff
        if backoff is None or job.attempt >= job.options.attempts:
            return failed
        where = f"TASKS[{self.backend.alias!r}]['OPTIONS']['backoff']"
        try:
            answer = backoff(exc, result)
        except Exception as problem:
            stopped = (f"not retried: {where} raised {type(problem).__name__}: "
                       f"{exception_message(problem)}")
            return _stop(job, failed, stopped, ErrorInfo.from_exception(problem).traceback)
        if answer is None:
            return _stop(job, failed, f"not retried: {where} returned None", note=False)
        delay = backoff_delay(answer)
        if delay is None:
            return _stop(job, failed, f"not retried: {where} returned {answer!r}, which is not "
                                      f"a number of seconds >= 0 and at most a year (an int, "
                                      f"a float or a timedelta), nor None")
        retry = Retry(delay)
        retry.__cause__ = failed
        return retry


def _stop(job: Job, failed: RemoteError, stopped: str, detail: str | None = None, *,
          note: bool = True) -> Fail:
    """A Fail that ends the task, saying why in the job's log. The attempt records the task's
    own error; with ``note``, its traceback followed by ``stopped`` and ``detail`` (the
    backoff's own traceback)."""
    job.log(stopped)
    cause = failed
    if note:
        traceback = f"{failed.traceback or ''}\n{stopped}\n"
        if detail:
            traceback += f"\n{detail}"
        cause = RemoteError(failed.type_name, str(failed), traceback)
    fail = Fail(stopped)
    fail.__cause__ = cause
    return fail


def _finish(result: TaskResult[Any], status: TaskResultStatus) -> None:
    from django.utils import timezone

    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())

