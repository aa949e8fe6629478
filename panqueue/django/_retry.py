"""``OPTIONS["backoff"]``: the backend half of Django's proposed retry API
(django/new-features#142), where ``backoff(exception, task_result)`` answers, after a failed
attempt, how many seconds to wait before the next one, or None: do not retry. The setting is
checked here when the backend is made; the worker asks it (``_worker``)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils.module_loading import import_string

from panqueue._check import is_number
from panqueue.django._compat import TaskResult
from panqueue.errors import ConfigError

__all__ = ["Backoff", "backoff_delay", "check_backoff"]

Backoff = Callable[[BaseException, "TaskResult[Any]"], Any]

# The longest wait between attempts a backoff may ask for, as panqueue's Retry(delay) allows.
_MAX_DELAY = 365 * 24 * 3600.0


def check_backoff(value: Any, where: str) -> Backoff | None:
    """``OPTIONS["backoff"]`` checked: None (panqueue's backoff between attempts), or a
    callable ``(exception, task_result) -> seconds | timedelta | None`` given as itself or by
    its dotted path (imported here, from the settings: a worker never imports a name it read
    from Redis)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = import_string(value)
        except Exception as exc:  # ImportError, or whatever importing its module raised
            raise ConfigError(f"{where} {value!r} does not import: {type(exc).__name__}: "
                              f"{exc}") from None
    if not callable(value):
        raise ConfigError(f"{where} must be a callable (exception, task_result) -> seconds or "
                          f"None, or the dotted path of one, got {value!r}")
    try:
        inspect.signature(value).bind(None, None)
    except TypeError:
        raise ConfigError(f"{where} must take (exception, task_result), as Django's proposed "
                          f"BACKOFF does; {value!r} does not") from None
    except ValueError:  # no signature to read (some built-ins): it is called as it is
        pass
    backoff: Backoff = value
    return backoff


def backoff_delay(answer: object) -> float | None:
    """A backoff's answer in seconds, or None where it is not a usable delay."""
    seconds = answer.total_seconds() if isinstance(answer, timedelta) else answer
    if not is_number(seconds) or not math.isfinite(seconds) \
            or not 0 <= seconds <= _MAX_DELAY:
        return None
    return float(seconds)
