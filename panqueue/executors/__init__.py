"""Executors run handlers: ``inline`` (the event loop), ``thread`` (a pool of threads for
blocking code), ``subprocess`` (isolated child processes), plus plug-ins by name.

Third-party executors register a subclass of :class:`Executor` under the entry-point group
``panqueue.executors`` and are then selected with ``executor="<name>"``.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from panqueue.errors import ConfigError
from panqueue.executors.base import (
    ChildCrashed,
    Executor,
    HandlerAborted,
    JobTimeout,
    RemoteError,
)
from panqueue.executors.inline import InlineExecutor
from panqueue.executors.subprocess import SubprocessExecutor
from panqueue.executors.thread import ThreadExecutor

if TYPE_CHECKING:
    from panqueue._handler import HandlerBase

__all__ = [
    "ChildCrashed",
    "Executor",
    "HandlerAborted",
    "InlineExecutor",
    "JobTimeout",
    "RemoteError",
    "SubprocessExecutor",
    "ThreadExecutor",
    "check_executor",
    "create_executor",
]

_BUILTIN: dict[str, type[Executor]] = {
    "inline": InlineExecutor,
    "thread": ThreadExecutor,
    "subprocess": SubprocessExecutor,
}


def _lookup(name: str) -> type[Executor]:
    if name in _BUILTIN:
        return _BUILTIN[name]
    from importlib.metadata import entry_points  # a plug-in's name: read the installed ones

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


def check_executor(spec: Any, fn: Any, queue: str, *, isolated: bool = False,
                   chunked: bool = False, sandboxed: bool = False) -> None:
    """Validate at registration time that ``spec`` can run ``fn`` (on chunks of jobs, when
    ``chunked``; under permissions, when ``sandboxed``)."""
    cls = _resolve(spec, fn)
    if sandboxed and cls is not SubprocessExecutor:
        raise ConfigError(
            f"permissions for queue {queue!r} apply to executor='subprocess' only (this handler "
            f"uses {cls.name!r}): only a child process can be confined by the kernel")
    if chunked and not cls.runs_chunks:
        raise ConfigError(
            f"chunk handler for queue {queue!r}: executor {cls.name!r} cannot run chunks of "
            "jobs; use executor='inline' (async) or 'thread' (plain function)")
    if isolated and not getattr(cls, "isolates", False):
        raise ConfigError(
            f"limits/env/cwd/max_jobs_per_child/new_session for queue {queue!r} apply to "
            f"executor='subprocess' only (this handler uses {cls.name!r})")
    cls.check_handler(fn, queue)


def create_executor(handler: HandlerBase[Any, Any]) -> Executor:
    return _resolve(handler.options.executor, handler.fn)(handler)
