"""Django's Tasks framework on panqueue, with the example project in examples/django_app/.

The project names ``panqueue.django.PanqueueBackend`` in TASKS; its tasks are plain ``@task``
functions enqueued with ``.enqueue()``. A task enqueued inside ``transaction.atomic()`` is added
when the transaction commits, and never if it rolls back. ``panqueue worker
panqueue.django:registry`` runs them (here with --burst: until the queues are empty), and the
results read back through Django's TaskResult.

    PANQUEUE_URL=redis://127.0.0.1:6379/0 python examples/django_tasks_app.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
The SQLite database lives in a temporary directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from panqueue.embedded import url_or_private_server

HERE = Path(__file__).resolve().parent  # examples/: django_app is imported from here


def main(url: str, workdir: str) -> None:
    os.environ.update(PANQUEUE_URL=url, DJANGO_SETTINGS_MODULE="django_app.settings",
                      DJANGO_APP_DB=str(Path(workdir) / "db.sqlite3"))
    from panqueue.django import setup_django

    setup_django()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import transaction
    from django_app.accounts.tasks import charge, send_welcome
    from django_app.tasks_compat import TaskResultDoesNotExist

    call_command("migrate", verbosity=0)

    with transaction.atomic():
        ada = User.objects.create_user("ada", email="ada@example.com")
        welcome = send_welcome.enqueue(ada.pk)
        print(f"inside the transaction, task {welcome.id[:8]}... is not enqueued yet "
              f"(enqueued_at={welcome.enqueued_at})")
    print(f"after the commit it is: status {welcome.status}, "
          f"enqueued_at set: {welcome.enqueued_at is not None}")

    try:
        with transaction.atomic():
            bob = User.objects.create_user("bob", email="bob@example.com")
            rolled_back = send_welcome.enqueue(bob.pk)
            raise RuntimeError("signup failed")
    except RuntimeError:
        pass
    try:
        send_welcome.get_result(rolled_back.id)
    except TaskResultDoesNotExist:
        print("rolled back: the task for bob was never enqueued")

    payment = charge.enqueue(ada.pk, 1999)

    # The worker: the same settings, the registry panqueue.django makes from TASKS.
    worker = subprocess.run(
        [sys.executable, "-m", "panqueue", "worker", "panqueue.django:registry", "--burst",
         "--url", url], cwd=HERE, env=os.environ.copy(), capture_output=True, text=True,
        timeout=60)
    if worker.returncode != 0:
        raise SystemExit(f"worker exited {worker.returncode}:\n{worker.stderr}")
    print("panqueue worker panqueue.django:registry --burst ran the queues and exited")

    welcome.refresh()
    print(f"send_welcome: {welcome.status} -> {welcome.return_value!r}")
    payment.refresh()
    [error] = payment.errors
    print(f"charge: {payment.status}, raised {error.exception_class.__name__} "
          f"({error.exception_class_path})")
    print(f"  traceback ends: {error.traceback.strip().splitlines()[-1]}")


if __name__ == "__main__":
    with url_or_private_server() as server_url, tempfile.TemporaryDirectory() as tmp:
        main(server_url, tmp)
    print("done")
