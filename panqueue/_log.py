"""structlog configuration: console output for humans, JSON lines for machines."""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

from panqueue.errors import ConfigError

__all__ = ["configure_logging", "get_logger"]


def configure_logging(fmt: Literal["console", "json"] = "console", level: str = "info") -> None:
    """Configure structlog: ``console`` (for humans) or ``json`` lines, on stderr, at ``level``.

    The CLI calls this; services embedding workers may too, before creating them."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ConfigError(f"unknown log level {level!r} (debug, info, warning or error)")
    if fmt not in ("console", "json"):
        raise ConfigError(f"unknown log format {fmt!r} (console or json)")
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
