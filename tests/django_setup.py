"""Django set up once per test process from tests/django_project, for every module that needs
it (tests/test_django.py and the ported suites in tests/django_port): Django's settings can be
configured only once in a process, and two modules may run in the same xdist worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import environment

SETTINGS = "tests.django_project.settings"

_configured: list[Path] = []


def configure_django(tmp_path_factory: pytest.TempPathFactory, url: str) -> Path:
    """Configure Django in this process (once) against the Redis at ``url`` and a SQLite file
    in a temporary directory; returns that file."""
    if _configured:
        return _configured[0]
    from django.conf import settings

    if settings.configured:
        pytest.fail("Django was configured outside tests/django_setup.py")
    db = tmp_path_factory.mktemp("django") / "db.sqlite3"
    # The settings module reads these once, when setup_django() imports it; they are
    # removed again so that they leak into no other test.
    env = {"DJANGO_SETTINGS_MODULE": SETTINGS, "PQ_DJANGO_DB": str(db),
           "PANQUEUE_URL": url, "PQ_DJANGO_ANY_QUEUE": "1"}
    with environment(env):
        from panqueue.django import setup_django

        setup_django()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE shop_order (id INTEGER PRIMARY KEY, item TEXT)")
    _configured.append(db)
    return db
