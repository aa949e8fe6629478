"""Executors run handlers: ``inline`` (event loop), plus plug-ins by name.

Third-party executors register a subclass of :class:`Executor` under the entry-point group
``panqueue.executors`` and are then selected with ``executor="<name>"``.
"""

from __future__ import annotations

import inspect
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from panqueue.errors import ConfigError
from panqueue.executors.base import Executor, JobTimeout
from panqueue.executors.inline import InlineExecutor

if TYPE_CHECKING:
    from panqueue._registry import Handler

__all__ = ["Executor", "InlineExecutor", "JobTimeout", "check_executor", "create_executor"]

_BUILTIN: dict[str, type[Executor]] = {"inline": InlineExecutor}


def _lookup(name: str) -> type[Executor]:
    if name in _BUILTIN:
        return _BUILTIN[name]
    for ep in entry_points(group="panqueue.executors"):
        if ep.name == name:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Executor)):
                raise ConfigError(f"entry point panqueue.executors:{name} is not an Executor")
            return cls
    known = sorted(set(_BUILTIN) | {ep.name for ep in entry_points(group="panqueue.executors")})
    raise ConfigError(f"unknown executor {name!r} (available: {', '.join(known)})")


def _resolve(spec: Any, fn: Any) -> type[Executor]:
    if spec is None:
        return InlineExecutor if inspect.iscoroutinefunction(fn) else _lookup("thread")
    if isinstance(spec, str):
        return _lookup(spec)
    if isinstance(spec, type) and issubclass(spec, Executor):
        return spec
    raise ConfigError(f"executor must be a name or an Executor subclass, got {spec!r}")


def check_executor(spec: Any, fn: Any, queue: str) -> None:
    """Validate at registration time that ``spec`` can run ``fn``."""
    cls = _resolve(spec, fn)
    if cls is InlineExecutor and not inspect.iscoroutinefunction(fn):
        raise ConfigError(
            f"handler for queue {queue!r} is a plain function; the inline executor runs "
            "async functions only (use executor='thread' for blocking code)"
        )


def create_executor(handler: Handler[Any, Any]) -> Executor:
    return _resolve(handler.options.executor, handler.fn)(handler)
