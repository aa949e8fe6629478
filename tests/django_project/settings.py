"""Settings of the test project: SQLite and Redis locations come from the environment, which
the tests set (PQ_DJANGO_DB, PANQUEUE_URL)."""

import os

import django

from panqueue import Retention

SECRET_KEY = "panqueue-tests-only"
USE_TZ = True
# Django 6 has the Tasks framework built in (django.tasks); Django 5.2 has it from the
# django-tasks package, which is an app of its own.
INSTALLED_APPS = [*(["django_tasks"] if django.VERSION < (6, 0) else []),
                  "tests.django_project.shop"]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["PQ_DJANGO_DB"]},
}
TASKS = {
    # Tasks sent inside a transaction are added when it commits (not the default).
    "default": {
        "BACKEND": "panqueue.django.PanqueueBackend",
        "QUEUES": ["default", "reports"],
        "ENQUEUE_ON_COMMIT": True,
        "OPTIONS": {"url": os.environ["PANQUEUE_URL"]},
    },
    # Tasks sent through this one are added at once, even inside a transaction.
    "direct": {
        "BACKEND": "panqueue.django.PanqueueBackend",
        "QUEUES": ["direct"],
        "ENQUEUE_ON_COMMIT": False,
        # Its workers keep the results of the newest two completed tasks only.
        "OPTIONS": {"url": os.environ["PANQUEUE_URL"], "retention": Retention(completed=2)},
    },
    # Three attempts, with the project's own backoff between them.
    "retrying": {
        "BACKEND": "panqueue.django.PanqueueBackend",
        "QUEUES": ["retrying"],
        "OPTIONS": {"url": os.environ["PANQUEUE_URL"], "attempts": 3,
                    "backoff": "tests.django_project.shop.retry.backoff"},
    },
    # Two attempts, with panqueue's backoff between them.
    "retrying_default": {
        "BACKEND": "panqueue.django.PanqueueBackend",
        "QUEUES": ["retrying-default"],
        "OPTIONS": {"url": os.environ["PANQUEUE_URL"], "attempts": 2},
    },
}

# Any queue name (QUEUES: []), where the process asks for it: the tests' own process and the
# workers of tests.django_project.any_queue, not those of panqueue.django:registry, which
# cannot serve a backend whose queues it is not told.
if os.environ.get("PQ_DJANGO_ANY_QUEUE"):
    TASKS["anyqueue"] = {
        "BACKEND": "panqueue.django.PanqueueBackend",
        "QUEUES": [],
        "OPTIONS": {"url": os.environ["PANQUEUE_URL"]},
    }
    # A second application's tasks, under the key prefix "billing" (its workers:
    # tests.django_project.prefixed, which serves this backend only).
    TASKS["billing"] = {
        "BACKEND": "panqueue.django.PanqueueBackend",
        "QUEUES": ["billed"],
        "OPTIONS": {"url": os.environ["PANQUEUE_URL"], "prefix": "billing"},
    }
    # Attempts limited to a second (its workers: tests.django_project.slow).
    TASKS["slow"] = {
        "BACKEND": "panqueue.django.PanqueueBackend",
        "QUEUES": ["slow"],
        "OPTIONS": {"url": os.environ["PANQUEUE_URL"], "timeout": 1,
                    "task_modules": ["tests.django_project.slow"]},
    }
    # The backend the ported suites of tests/django_port run against: any queue name, and
    # workers (tests.django_port.worker) serving the queue "port" only.
    TASKS["port"] = {
        "BACKEND": "panqueue.django.PanqueueBackend",
        "QUEUES": [],
        "OPTIONS": {"url": os.environ["PANQUEUE_URL"], "task_modules": ["tests.django_port"]},
    }
