"""Django's Tasks framework on panqueue (extra ``panqueue[django]``).

``PanqueueBackend`` is the backend to name in ``TASKS``; ``panqueue worker
panqueue.django:registry`` runs the tasks (``registry`` is made on first use, with Django set
up from ``DJANGO_SETTINGS_MODULE``); ``registry_for(*aliases)`` makes one for chosen backends.
The framework is ``django.tasks`` on Django 6 and the ``django-tasks`` package before it.
"""

from __future__ import annotations

from typing import Any

from panqueue.django._backend import PanqueueBackend
from panqueue.django._worker import registry_for, setup_django

__all__ = ["PanqueueBackend", "registry", "registry_for", "setup_django"]


def __getattr__(name: str) -> Any:
    # `registry` is made when first asked for: it needs Django's settings, which importing
    # this module (as TASKS's BACKEND does) must not.
    if name == "registry":
        registry = registry_for()
        globals()["registry"] = registry
        return registry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
