"""The test app's tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db import connection

from tests.django_project.tasks_compat import TaskContext, task


class PaymentDeclined(Exception):
    pass


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="reports")
def report(name: str, *, rows: int = 0) -> dict[str, Any]:
    return {"report": name, "rows": rows, "tags": ("a", "b")}


@task
def charge(card: str) -> None:
    raise PaymentDeclined(f"card {card} declined")


@task
def read_order(order_id: int) -> str | None:
    """The order as the worker's own database connection sees it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT item FROM shop_order WHERE id = %s", [order_id])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


@task(takes_context=True)
def who_am_i(context: TaskContext) -> dict[str, Any]:
    return {"id": context.task_result.id, "attempt": context.attempt,
            "status": str(context.task_result.status)}


@task
async def double(x: int) -> int:
    return 2 * x


def not_a_task(mark: str) -> None:
    """A plain function: a job naming it must be refused, so the mark never appears."""
    Path(mark).write_text("ran")


@task
def unstorable() -> Any:
    """A return value Django's normalisation refuses (a set is not JSON)."""
    return {1, 2}
