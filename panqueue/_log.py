"""panqueue's logging: structlog loggers that write through the standard :mod:`logging` module.

A library must not decide where its logs go. Every panqueue logger is a
:class:`structlog.stdlib.BoundLogger` over ``logging.getLogger("panqueue.<part>")``, and the
``panqueue`` logger carries a :class:`logging.NullHandler`: without any setup nothing is
printed, and an application's own ``logging`` configuration (levels, handlers, formatters)
decides what is shown. :func:`configure_logging` is the ready-made setup for the command line
and scripts: console or JSON lines on stderr.

Names: ``panqueue.worker`` (worker lifecycle, failed attempts, Redis trouble, the periodic
summary) and ``panqueue.worker.jobs`` (one DEBUG line per completed job; off unless that logger
is enabled for DEBUG, which ``configure_logging(log_jobs=True)`` does).
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Literal

from panqueue.errors import ConfigError

__all__ = ["JOBS_LOGGER", "configure_logging", "get_logger", "notice"]

ROOT_LOGGER = "panqueue"
JOBS_LOGGER = "panqueue.worker.jobs"

logging.getLogger(ROOT_LOGGER).addHandler(logging.NullHandler())


class _Message:
    """A record's message: the event and its fields, rendered as text only if a handler asks.

    Plain ``logging`` formatters see ``event key=value ...`` (and the traceback of a failed job
    on the lines after it); :func:`configure_logging`'s formatter reads the fields themselves.
    """

    __slots__ = ("event", "fields")

    def __init__(self, event: str, fields: dict[str, Any]) -> None:
        self.event = event
        self.fields = fields

    def __str__(self) -> str:
        fields = dict(self.fields)
        exception = fields.pop("exception", None)
        text = " ".join([self.event, *(f"{key}={value!r}" for key, value in fields.items())])
        return f"{text}\n{str(exception).rstrip()}" if exception else text


def _to_stdlib(logger: Any, method_name: str, event_dict: Any) -> tuple[tuple[Any, ...],
                                                                         dict[str, Any]]:
    """Last processor of panqueue's loggers: hands the event to ``logging`` as one record."""
    event = str(event_dict.pop("event", ""))
    return (_Message(event, event_dict),), {}


@functools.cache
def _processors() -> list[Any]:
    """The processors of panqueue's loggers. structlog is imported with the first logger, not
    with this module: a process that logs nothing (a subprocess executor's child, a command
    that only reads) does not load it."""
    import structlog

    # filter_by_level first: a line whose level the stdlib logger does not want costs one
    # isEnabledFor call and nothing else.
    return [structlog.stdlib.filter_by_level, structlog.contextvars.merge_contextvars,
            _to_stdlib]


def get_logger(name: str) -> Any:
    """A structlog logger writing to ``logging.getLogger(name)``; ``name`` is ``panqueue.*``.

    It does not depend on structlog's global configuration, so an application's own
    ``structlog.configure`` neither changes panqueue's lines nor is changed by them."""
    import structlog.stdlib

    return structlog.stdlib.BoundLogger(logging.getLogger(name), _processors(), {})


def _fields_of_record(logger: Any, method_name: str, event_dict: Any) -> Any:
    """Formatter pre-chain: a panqueue record's event and fields, instead of its text."""
    message = event_dict["_record"].msg
    if isinstance(message, _Message):
        event_dict["event"] = message.event
        event_dict.update(message.fields)
    return event_dict


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (as :data:`logging.lastResort`)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr


def configure_logging(fmt: Literal["console", "json"] = "console", level: str = "info", *,
                      log_jobs: bool = False) -> None:
    """Print panqueue's logs on stderr: ``console`` lines (for humans) or ``json`` lines.

    Sets up the ``panqueue`` logger (level ``level``, one stderr handler, no propagation to the
    root logger, so nothing is printed twice); calling it again replaces that setup. With
    ``log_jobs``, each completed job is logged too (``panqueue.worker.jobs`` at DEBUG). Every
    line written through :func:`notice` follows the same format.

    The CLI calls this; scripts and services embedding workers may too. An application with
    its own ``logging`` setup does not need it: panqueue's records reach its handlers."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ConfigError(f"unknown log level {level!r} (debug, info, warning or error)")
    if fmt not in ("console", "json"):
        raise ConfigError(f"unknown log format {fmt!r} (console or json)")
    import structlog

    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    pre_chain: list[Any] = [
        _fields_of_record,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        pre_chain.append(structlog.processors.format_exc_info)  # exc_info -> "exception"
    handler = _StderrHandler()
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=pre_chain))
    handler.set_name("panqueue.configure_logging")
    root = logging.getLogger(ROOT_LOGGER)
    for old in [h for h in root.handlers if h.get_name() == handler.get_name()]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    root.propagate = False
    logging.getLogger(JOBS_LOGGER).setLevel(logging.DEBUG if log_jobs else logging.NOTSET)


def notice(message: str, **fields: Any) -> None:
    """One operator-facing line (a signal received, a server stopped) in the configured format:
    a JSON line after ``configure_logging("json")``, so that stderr stays all JSON."""
    get_logger("panqueue.cli").warning(message, **fields)
