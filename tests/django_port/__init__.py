"""Django's own tests of its Tasks framework and the test suites of the django-tasks package's
RQ and database backends, ported to run against :class:`panqueue.django.PanqueueBackend` with
a real Redis and a real ``panqueue worker``.

Where each test came from (each test names its origin test in a comment):

- ``test_django_tasks.py``: Django, ``tests/tasks/test_tasks.py``,
  ``test_immediate_backend.py``, ``test_dummy_backend.py`` and ``test_custom_backend.py``
  (https://github.com/django/django; django-tasks carries the same tests for Django 5.2).
- ``test_rq_backend.py``: django-tasks, ``tests/tests/test_rq_backend.py``
  (https://github.com/RealOrangeOne/django-tasks, before the RQ backend moved to a package of
  its own).
- ``test_database_backend.py``: django-tasks, ``tests/tests/test_database_backend.py`` (same
  repository and time).

Only the tests about a backend's behaviour are ported (enqueueing, reading results back and
their states, priorities, ``run_after``, queue names, exceptions, argument round trips,
``takes_context``, transactions, system checks); tests of Django's own classes (``Task``'s
validation, pickling) or of another backend's storage (SQL queries, RQ's job metadata) are not.
A test that shows a real difference is marked ``xfail(strict=True)`` and the difference is
stated in docs/django.md, "Differences from Django's own backends".

Attribution: Django is Copyright (c) Django Software Foundation and individual contributors;
django-tasks is Copyright (c) Jake Howard. Both are distributed under the BSD 3-Clause
License; the ported tests are adaptations of theirs.
"""
