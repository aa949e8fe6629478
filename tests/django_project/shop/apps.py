"""The test app: records Django's task signals in $PQ_SIGNAL_LOG, when it is set."""

from __future__ import annotations

import os
from typing import Any

from django.apps import AppConfig


def _record(signal_name: str) -> Any:
    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        path = os.environ.get("PQ_SIGNAL_LOG")
        if path:
            with open(path, "a") as log:
                log.write(f"{signal_name} {task_result.id} {task_result.status}\n")

    return receiver


class ShopConfig(AppConfig):
    name = "tests.django_project.shop"

    def ready(self) -> None:
        from tests.django_project.tasks_compat import task_enqueued, task_finished, task_started

        for signal_name, signal in [("enqueued", task_enqueued), ("started", task_started),
                                    ("finished", task_finished)]:
            signal.connect(_record(signal_name), weak=False)
