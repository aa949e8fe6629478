"""Settings of the example project. The Tasks part is TASKS: panqueue's backend, the queues it
may use, and the Redis URL (None: $PANQUEUE_URL, else redis://localhost:6379/0)."""

import os

import django

SECRET_KEY = "example-only-not-secret"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_app.accounts",
]
if django.VERSION < (6, 0):
    # Django 5.2's Tasks framework is the django-tasks package, an app; Django 6 has it built in.
    INSTALLED_APPS.append("django_tasks")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DJANGO_APP_DB", "db.sqlite3"),
    },
}
TASKS = {
    "default": {
        "BACKEND": "panqueue.django.PanqueueBackend",
        "QUEUES": ["default", "emails"],
        # Tasks enqueued inside transaction.atomic() are added when it commits (the default).
        "ENQUEUE_ON_COMMIT": True,
        "OPTIONS": {"url": os.environ.get("PANQUEUE_URL")},
    },
}
