"""A module in no installed app. Importing it leaves a mark, so a test can tell that a worker
refused a job naming it without importing it."""

import os
from pathlib import Path

from tests.django_project.tasks_compat import task

if os.environ.get("PQ_OUTSIDE_MARK"):
    Path(os.environ["PQ_OUTSIDE_MARK"]).write_text("imported")


@task
def sneaky() -> str:
    return "should never run"
