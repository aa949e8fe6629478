"""The ``slow`` backend's task and worker registry (its attempts time out after a second):
``panqueue worker tests.django_project.slow:registry``. Its own module, which the backend's
``task_modules`` names: the workers of the other backends know no ``slow`` backend."""

import time

from panqueue.django import registry_for
from tests.django_project.tasks_compat import task


@task(backend="slow", queue_name="slow")
def sleepy(seconds: float) -> str:
    """Outlasts the backend's timeout when given more than a second."""
    time.sleep(seconds)
    return "done"


registry = registry_for("slow")
