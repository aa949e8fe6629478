"""A project without DATABASES (a service that only enqueues): the Redis location comes from
PANQUEUE_URL; PQ_ON_COMMIT=1 asks for ENQUEUE_ON_COMMIT, which such a project cannot honour."""

import os

import django

SECRET_KEY = "panqueue-tests-only"
USE_TZ = True
INSTALLED_APPS = [*(["django_tasks"] if django.VERSION < (6, 0) else []),
                  "tests.django_project.shop"]
TASKS = {
    "default": {
        "BACKEND": "panqueue.django.PanqueueBackend",
        "QUEUES": ["default", "reports"],
        "OPTIONS": {"url": os.environ["PANQUEUE_URL"]},
        **({"ENQUEUE_ON_COMMIT": True} if os.environ.get("PQ_ON_COMMIT") else {}),
    },
}
