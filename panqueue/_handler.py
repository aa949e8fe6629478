"""A registered handler, as the registry makes it and the executors and clients read it.

Below both the registry (which checks at registration that an executor can run the function,
so it imports the executors) and the executors (which run a :class:`HandlerBase`): neither has to
import the other to name it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from panqueue._job import Job, PayloadT
from panqueue._options import Chunk, Isolation, JobOptions, RateLimit, Retention
from panqueue._permissions import Permissions
from panqueue.errors import ConfigError, Fail

__all__ = ["HandlerBase", "HandlerOptions", "check_chunk_payload"]

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class HandlerOptions:
    """How a worker runs one queue's jobs."""

    executor: Any
    concurrency: int | None
    job: JobOptions
    lock_ttl: float
    max_stalls: int
    retention: Retention
    isolation: Isolation | None = None
    mode: str = "global"
    key_concurrency: int = 1
    rate_limit: RateLimit | None = None
    max_snoozes: int | None = None
    partitions: int = 1
    chunk: Chunk | None = None
    permissions: Permissions | None = None


class HandlerBase(Generic[P, R, PayloadT]):
    """A registered handler: still callable like the decorated function. (The registry makes
    :class:`panqueue.Handler`, which adds the producer side: ``enqueue``, ``aenqueue``.)

    ``PayloadT`` is the type of its jobs' data, read by type checkers from the annotation of
    the function's first parameter (``job: Job[Email]``); ``client.queue(handler)`` passes it
    on to ``add()``. When it is a dataclass, :attr:`payload_type` holds it and :attr:`fn` (what
    the executors run) rebuilds the dataclass from the stored dict before each call.
    """

    def __init__(self, queue: str, fn: Callable[P, R], options: HandlerOptions,
                 job_defaults: dict[str, Any]) -> None:
        self.queue = queue
        self.options = options
        self.job_defaults = job_defaults
        self.is_async = inspect.iscoroutinefunction(fn)
        self.payload_type = _dataclass_payload(queue, fn)
        self._call = fn
        self.fn: Callable[P, R] = fn if self.payload_type is None \
            else _rebuilding(fn, self.payload_type)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._call(*args, **kwargs)

    @property
    def import_path(self) -> str:
        """``module:qualname`` of the function (how a child process finds it again)."""
        return f"{self._call.__module__}:{self._call.__qualname__}"

    def __repr__(self) -> str:
        return f"<Handler {self.queue!r} -> {self.import_path}>"


def _dataclass_payload(queue: str, fn: Callable[..., Any]) -> type[Any] | None:
    """The dataclass ``X`` of a first parameter annotated ``Job[X]``, or None.

    A TypedDict payload is a plain dict at run time: nothing to rebuild, so None too, as for
    any annotation that cannot be resolved where the function is defined (a name imported
    under ``if TYPE_CHECKING:``, for example).
    """
    hint = _first_parameter_hint(fn)
    if typing.get_origin(hint) is not Job:
        return None
    [payload] = typing.get_args(hint)
    if not (isinstance(payload, type) and dataclasses.is_dataclass(payload)):
        return None
    try:
        fields = typing.get_type_hints(payload)
    except Exception:
        fields = {}
    for field_name, field_type in fields.items():
        nested = _nested_dataclass(field_type)
        if nested is not None:
            raise ConfigError(
                f"handler for queue {queue!r}: field {field_name!r} of payload "
                f"{payload.__name__} is a dataclass ({nested.__name__}); a dataclass payload "
                "is rebuilt one level deep only: make that field a TypedDict or a dict, or "
                "make the payload a TypedDict")
    return payload


def _first_parameter_hint(fn: Callable[..., Any]) -> Any:
    """The resolved annotation of ``fn``'s first parameter, or None."""
    try:
        first = next(iter(inspect.signature(fn).parameters.values()), None)
        hints = typing.get_type_hints(fn) if first is not None else {}
    except Exception:  # unresolvable forward references, builtins without a signature
        return None
    return hints.get(first.name) if first is not None else None


def check_chunk_payload(queue: str, fn: Callable[..., Any]) -> None:
    """Refuse a chunk handler of ``list[Job[X]]`` with ``X`` a dataclass: its jobs' data
    reaches it as stored (a dict), which the annotation would misdescribe."""
    hint = _first_parameter_hint(fn)
    if typing.get_origin(hint) is not list:
        return
    [job_hint] = typing.get_args(hint) or [None]
    payload = typing.get_args(job_hint)[0] if typing.get_origin(job_hint) is Job else None
    if isinstance(payload, type) and dataclasses.is_dataclass(payload):
        raise ConfigError(f"chunk handler for queue {queue!r}: payload {payload.__name__} is a "
                          "dataclass, which a chunk handler does not rebuild (job.data stays "
                          "a dict): make it a TypedDict")


def _nested_dataclass(annotation: Any) -> type[Any] | None:
    """The first dataclass inside a field's annotation (``Size``, ``list[Size]``, ...)."""
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return annotation
    for argument in typing.get_args(annotation):
        found = _nested_dataclass(argument)
        if found is not None:
            return found
    return None


def _rebuilding(fn: Callable[..., Any], payload: type[Any]) -> Callable[..., Any]:
    """``fn`` behind a step that turns the job's stored dict back into ``payload``.

    Data that does not fit the dataclass fails the job at once (:class:`Fail`): another
    attempt would get the same data.
    """
    def rebuild(job: Job[Any]) -> None:
        data = job.data
        if isinstance(data, payload):
            return
        if not isinstance(data, dict):
            raise Fail(f"job data does not fit {payload.__name__}: expected an object with its "
                       f"fields, got {type(data).__name__}")
        try:
            job.data = payload(**data)
        except TypeError as exc:
            raise Fail(f"job data does not fit {payload.__name__}: {exc}") from None

    if inspect.iscoroutinefunction(fn):
        async def run_async(job: Job[Any]) -> Any:
            rebuild(job)
            return await fn(job)

        functools.update_wrapper(run_async, fn)
        return run_async

    def run(job: Job[Any]) -> Any:
        rebuild(job)
        return fn(job)

    functools.update_wrapper(run, fn)
    return run
