"""The example app's tasks: ordinary Django code, run by ``panqueue worker
panqueue.django:registry``."""

from __future__ import annotations

from django.contrib.auth.models import User

from django_app.tasks_compat import task


class CardDeclined(Exception):
    pass


@task(queue_name="emails", priority=10)
def send_welcome(user_id: int) -> str:
    user = User.objects.get(pk=user_id)  # committed before the task was enqueued
    return f"welcome mail sent to {user.email}"


@task
def charge(user_id: int, cents: int) -> None:
    raise CardDeclined(f"card of user {user_id} declined for {cents} cents")
