"""The Tasks framework's names, from ``django.tasks`` (Django 6 and later) or from the
``django-tasks`` package (module ``django_tasks``) on Django 5.2: the rest of
:mod:`panqueue.django` imports them from here only.

The two have the same API for what a backend does (``BaseTaskBackend`` and its ``supports_*``
flags, ``validate_task``, ``enqueue(task, args, kwargs)``, ``TaskResult``'s fields, the
signals); they differ in names (``InvalidTask`` is ``InvalidTaskError`` in the package: exported
here as ``InvalidTask``), in the package being an app for ``INSTALLED_APPS``, and in the package's
classes being generic for type checkers. The choice follows Django's version, not what happens
to be importable: on Django 6 the built-in framework is the one ``TASKS`` is read by, even where
the package is installed too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

if TYPE_CHECKING:
    # Type-checked against the package, whose classes carry type parameters (Django's own are
    # untyped); the names and their use are the same.
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

else:
    try:
        import django
    except ImportError as exc:
        raise ImportError("panqueue.django needs Django: pip install 'panqueue[django]'"
                          ) from exc

    if django.VERSION >= (6, 0):
        from django.tasks import task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import (
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json
    else:
        try:
            from django_tasks import task_backends
        except ImportError as exc:
            raise ImportError(
                f"panqueue.django needs Django's Tasks framework: Django "
                f"{django.get_version()} has it from the django-tasks package, which is not "
                f"installed (pip install 'panqueue[django]'; Django 6 has it built in)"
            ) from exc
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import (
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
