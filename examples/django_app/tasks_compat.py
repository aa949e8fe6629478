"""Django's Tasks framework: built into Django 6 as ``django.tasks``; on Django 5.2 it is the
``django-tasks`` package (module ``django_tasks``, also listed in INSTALLED_APPS). A project on
one Django version imports from there directly; this example runs on both."""

import django

if django.VERSION >= (6, 0):
    from django.tasks import task
    from django.tasks.exceptions import TaskResultDoesNotExist
else:
    from django_tasks import task
    from django_tasks.exceptions import TaskResultDoesNotExist

__all__ = ["TaskResultDoesNotExist", "task"]
