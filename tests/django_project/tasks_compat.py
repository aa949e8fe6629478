"""The Tasks framework as this Django has it, for the test project and tests/test_django.py:
``django.tasks`` on Django 6 and later, the ``django-tasks`` package (module ``django_tasks``)
on Django 5.2. The project and the tests import the framework from this module only, so the
same tests run on both; ``InvalidTask`` is the package's ``InvalidTaskError``."""

import django

__all__ = ["BaseTaskBackend", "InvalidTask", "Task", "TaskContext",
           "TaskResultDoesNotExist", "TaskResultStatus", "task", "task_backends",
           "task_enqueued", "task_finished", "task_started"]

if django.VERSION >= (6, 0):
    from django.tasks import Task, TaskContext, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
else:
    try:
        from django_tasks import TaskContext, TaskResultStatus, task, task_backends
    except ImportError as exc:
        raise ImportError(
            f"Django {django.get_version()} has the Tasks framework from the django-tasks "
            f"package, which is not installed (Django 6 has it built in as django.tasks)"
        ) from exc
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
