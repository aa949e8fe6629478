"""The app registry: which handler serves which queue, with what options.

``Registry.handler`` checks every option of a handler in one place, each refusal one line
naming the option, before anything reaches a worker. What it makes, a :class:`Handler`, is
defined in ``_handler.py``, below both this module and the executors it checks with.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Concatenate, Literal, ParamSpec, Protocol, TypeVar, overload

from panqueue._check import MAX_CONCURRENCY, check_int, check_one_of
from panqueue._handler import HandlerOptions, check_chunk_payload
from panqueue._home import Handler, RegistryClients, check_registry_url
from panqueue._job import Job
from panqueue._keys import check_partitions, check_prefix, check_queue_name
from panqueue._options import (
    DEFAULT_CHILD_ENV,
    Backoff,
    Chunk,
    Isolation,
    JobOptions,
    Limits,
    RateLimit,
    Retention,
    check_attempts,
    check_positive,
    check_priority,
)
from panqueue._permissions import Permissions
from panqueue._schedule import DEFAULT_GRACE, Schedule
from panqueue.errors import ConfigError
from panqueue.executors import check_executor

__all__ = ["Handler", "HandlerOptions", "Registry"]

P = ParamSpec("P")
R = TypeVar("R")
D = TypeVar("D")
F = TypeVar("F", bound=Callable[..., Any])

_PRODUCER_DEFAULTS = frozenset({"priority", "delay"})


class _HandlerDecorator(Protocol):
    """What ``Registry.handler(...)`` returns. A function whose first parameter is annotated
    ``Job[X]`` (or ``list[Job[X]]``, a chunk handler) becomes a ``Handler`` whose payload type
    is ``X``; any other, ``Any``."""

    @overload
    def __call__(self, fn: Callable[Concatenate[Job[D], P], R]
                 ) -> Handler[Concatenate[Job[D], P], R, D]: ...

    @overload
    def __call__(self, fn: Callable[Concatenate[list[Job[D]], P], R]
                 ) -> Handler[Concatenate[list[Job[D]], P], R, D]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Handler[P, R, Any]: ...


class Registry:
    """Maps queue ids to handlers. ``panqueue worker app:queues`` loads one of these.

    ``url``: the Redis URL its workers use when they are given none (else ``PANQUEUE_URL``),
    and where its handlers' :meth:`Handler.enqueue` and :meth:`Handler.aenqueue` add jobs
    (default: ``PANQUEUE_URL`` when they are first used). The clients they open are the
    registry's: :meth:`close` closes the blocking one, :meth:`aclose` the current event
    loop's. ``prefix``: the key namespace of its queues (``{<prefix>:q:<queue>}``): the default
    of its workers, pools and clients, and of ``panqueue worker`` when neither ``--prefix`` nor
    ``PANQUEUE_PREFIX`` is given."""

    def __init__(self, url: str | None = None, *, prefix: str | None = None) -> None:
        self._handlers: dict[str, Handler[Any, Any]] = {}
        self._schedules: dict[str, Schedule] = {}
        self.url = check_registry_url(url)
        self.prefix = check_prefix(prefix)
        self._clients = RegistryClients(self.url, self.prefix)
        self._on_failure: list[Callable[[Job[Any], BaseException, bool], Any]] = []

    def close(self) -> None:
        """Close the blocking client ``handler.enqueue`` opened (if any); the next
        ``enqueue`` opens a new one."""
        self._clients.close()

    async def aclose(self) -> None:
        """Close the client ``handler.aenqueue`` opened in the running event loop (if any).
        Call it before the loop ends, in each loop that enqueued."""
        await self._clients.aclose()

    def on_failure(self, callback: F) -> F:
        """Call ``callback(job, exception, final)`` after every failed attempt of every queue
        of this registry, once Redis has recorded it: ``final`` is False when the job will be
        retried, True when it ended FAILED (attempts used up, ``Fail``, a timeout on the last
        attempt). The exception is what the handler raised (a
        :class:`~panqueue.executors.RemoteError` for a subprocess handler's). A sync or async
        callable; it runs on the worker's event loop, so keep it quick. What it raises is
        logged and goes no further. Returns ``callback``, so it works as a decorator too::

            @queues.on_failure
            def report(job: Job, exc: BaseException, final: bool) -> None:
                sentry_sdk.capture_exception(exc)
        """
        if not callable(callback):
            raise ConfigError(f"on_failure needs a callable, got {callback!r}")
        self._on_failure.append(callback)
        return callback

    @property
    def failure_callbacks(self) -> tuple[Callable[[Job[Any], BaseException, bool], Any], ...]:
        """The callbacks :meth:`on_failure` registered, in order."""
        return tuple(self._on_failure)

    def schedule(self, name: str, queue: str, *, cron: str | None = None,
                 every: float | None = None, tz: str = "UTC", data: Any = None,
                 priority: int = 0, attempts: int | None = None, backoff: Backoff | None = None,
                 timeout: float | None = None, misfire: Literal["skip", "once", "all"] = "once",
                 grace: float = DEFAULT_GRACE) -> Schedule:
        """Enqueue a job on ``queue`` on a schedule: ``cron="0 3 * * *"`` (in ``tz``) or
        ``every=60.0`` seconds. Workers of the queue register it in Redis when they start; each
        tick enqueues exactly one job (id ``schedule:<name>:<tick ms>``), however many workers
        run. A tick more than ``grace`` seconds late (no worker ran) is missed: ``misfire``
        says whether the missed ticks are skipped, run once, or all run (at most 1,000)."""
        if name in self._schedules:
            raise ConfigError(f"schedule {name!r} is already defined")
        schedule = Schedule.create(name, queue, cron=cron, every=every, tz=tz, data=data,
                                   priority=priority, attempts=attempts, backoff=backoff,
                                   timeout=timeout, misfire=misfire, grace=grace)
        self._schedules[name] = schedule
        return schedule

    def schedules_for(self, queue: str) -> list[Schedule]:
        self.check_schedules()
        return [s for s in self._schedules.values() if s.queue == queue]

    def check_schedules(self) -> None:
        """Raise :class:`ConfigError` if a schedule sends its jobs to a queue without a
        handler in this registry: only that queue's workers would run it, so it would never
        run. Handlers may be registered after the schedules that use them, so this is checked
        when the registry is used (``get``, ``schedules_for``, ``queues``: a worker or pool
        being made), not when ``schedule()`` is called."""
        orphans = [s for s in self._schedules.values() if s.queue not in self._handlers]
        if not orphans:
            return
        known = ", ".join(sorted(self._handlers)) or "none"
        problems = "; ".join(f"schedule {s.name!r} sends its jobs to queue {s.queue!r}, which "
                             f"has no handler" for s in orphans)
        raise ConfigError(f"{problems} (queues with handlers: {known}). A schedule runs only "
                          "in the workers of its queue: register a handler for the queue, or "
                          "check the schedule's arguments (schedule(name, queue, ...))")

    def handler(
        self,
        queue_id: str,
        *,
        executor: Any = None,
        concurrency: int | None = None,
        attempts: int = 1,
        backoff: Backoff | None = None,
        timeout: float | None = None,
        lock_ttl: float = 30.0,
        max_stalls: int = 1,
        retention: Retention | None = None,
        limits: Limits | None = None,
        env: Sequence[str] | None = None,
        cwd: str | None = None,
        max_jobs_per_child: int | None = None,
        new_session: bool = True,
        mode: str = "global",
        key_concurrency: int = 1,
        rate_limit: RateLimit | None = None,
        max_snoozes: int | None = None,
        partitions: int = 1,
        chunk: Chunk | None = None,
        permissions: Permissions | None = None,
        **job_defaults: Any,
    ) -> _HandlerDecorator:
        """Register the decorated function as the handler of ``queue_id``.

        ``concurrency``: at most this many of its jobs run at once in one worker (default: the
        worker's ``--concurrency``, else 1).
        ``attempts``/``backoff``/``timeout``: the retry policy for jobs that set none.
        ``lock_ttl``: seconds a worker's claim stays valid without renewal (renewed every third
        of it while the job runs); a worker that dies loses its jobs to the stalled sweep after
        this long. ``max_stalls``: how often a job may stall before it fails with "stalled".
        ``retention``: how many finished jobs the queue keeps, and for how long.
        ``limits``, ``env`` (the environment variables a child may inherit), ``cwd``,
        ``max_jobs_per_child`` and ``new_session`` configure ``executor="subprocess"``.
        ``mode="keyed"`` with ``key_concurrency=M``: at most M running jobs per concurrency key
        (``add(..., key=...)``), keys served round-robin. ``rate_limit``: at most
        ``RateLimit.max`` starts per ``RateLimit.per`` seconds across all workers.
        ``max_snoozes``: a job whose handler raises ``Snooze`` more than this many times fails
        with reason ``max_snoozes_exceeded`` (default ``None``: no limit).
        ``partitions=N``: store the queue under N hash tags, so that Redis Cluster spreads it
        over several masters (docs/scaling.md); jobs go to a partition by key (keyed mode) or
        id, and a worker claims across them in rotation.
        ``chunk=Chunk(size, wait)``: the function takes a list of jobs and returns their
        results in the same order (see docs/job-control.md, "Chunk handlers"); inline and
        thread executors only.
        ``permissions=Permissions(...)``: what the handler's child may read, write, connect
        to and run, enforced by the kernel (``executor="subprocess"`` only; its ``env``
        replaces this function's ``env``).
        Other keyword arguments (``priority``, ``delay``) are producer defaults, used by
        ``client.queue(handler)``.

        Annotating the function's first parameter ``job: Job[Email]`` (a TypedDict or a
        dataclass) types ``job.data`` and the ``add()`` of ``client.queue(handler)`` for type
        checkers; a dataclass is rebuilt from the stored data before each call.
        """
        name = check_queue_name(queue_id)
        if name in self._handlers:
            raise ConfigError(f"queue {name!r} already has a handler "
                              f"({self._handlers[name].import_path})")
        unknown = set(job_defaults) - _PRODUCER_DEFAULTS
        if unknown:
            raise ConfigError(f"unknown handler option(s) for queue {name!r}: "
                              f"{', '.join(sorted(unknown))}")
        if "priority" in job_defaults:
            check_priority(job_defaults["priority"])
        if "delay" in job_defaults:
            check_positive(job_defaults["delay"], "delay", allow_zero=True)
        if concurrency is not None:
            check_int(concurrency, "concurrency", low=1, high=MAX_CONCURRENCY)
        check_int(max_stalls, "max_stalls", low=0)
        if max_snoozes is not None:
            check_int(max_snoozes, "max_snoozes", low=0, note=" or None (no limit)")
        if retention is not None and not isinstance(retention, Retention):
            raise ConfigError(f"retention must be a panqueue.Retention, got {retention!r}")
        if backoff is not None and not isinstance(backoff, Backoff):
            raise ConfigError(f"backoff must be a panqueue.Backoff, got {backoff!r}")
        if chunk is not None and not isinstance(chunk, Chunk):
            raise ConfigError(f"chunk must be a panqueue.Chunk, got {chunk!r}")
        job_options = JobOptions(
            attempts=check_attempts(attempts),
            backoff=backoff if backoff is not None else JobOptions().backoff,
            timeout=None if timeout is None else check_positive(timeout, "timeout"),
        )
        isolation = _isolation(name, limits, env, cwd, max_jobs_per_child, new_session)
        if permissions is not None:
            if not isinstance(permissions, Permissions):
                raise ConfigError(f"permissions for queue {name!r} must be a "
                                  f"panqueue.Permissions, got {permissions!r}")
            if env is not None:
                raise ConfigError(f"queue {name!r}: with permissions=, put the environment "
                                  "variables the child inherits in Permissions(env=...), not "
                                  "in env=")
            if not new_session:
                raise ConfigError(f"queue {name!r}: new_session=False cannot go with "
                                  "permissions= (a confined child leads a process group of its "
                                  "own, ended whole with it)")
            permissions = permissions.resolved(name)
        check_one_of(mode, f"mode for queue {name!r}", ("global", "keyed"))
        check_int(key_concurrency, "key_concurrency", low=1)
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise ConfigError(f"rate_limit must be a panqueue.RateLimit, got {rate_limit!r}")
        if rate_limit is not None and rate_limit.per_key and mode != "keyed":
            raise ConfigError(f"RateLimit(per_key=True) for queue {name!r} needs mode='keyed'")
        if partitions != 1 and chunk is not None:
            raise ConfigError(f"queue {name!r}: chunk handlers do not run on partitioned queues "
                              "(partitions > 1); use one or the other")
        if partitions != 1 and rate_limit is not None and rate_limit.adaptive \
                and not rate_limit.per_key:
            raise ConfigError(f"queue {name!r}: an adaptive rate limit of a partitioned queue "
                              "must be per key (RateLimit(per_key=True), keyed mode)")
        options = HandlerOptions(
            executor=executor,
            concurrency=concurrency,
            job=job_options,
            lock_ttl=check_positive(lock_ttl, "lock_ttl"),
            max_stalls=max_stalls,
            retention=retention or Retention(),
            isolation=isolation,
            mode=mode,
            key_concurrency=key_concurrency,
            rate_limit=rate_limit,
            max_snoozes=max_snoozes,
            partitions=check_partitions(partitions),
            chunk=chunk,
            permissions=permissions,
        )

        def register(fn: Callable[..., Any]) -> Handler[..., Any, Any]:
            if not callable(fn):
                raise ConfigError(f"handler for queue {name!r} must be callable, got {fn!r}")
            check_executor(options.executor, fn, name, isolated=isolation is not None,
                           chunked=chunk is not None, sandboxed=permissions is not None)
            if chunk is not None:
                check_chunk_payload(name, fn)
            handler = Handler(name, fn, options, dict(job_defaults), self._clients)
            self._handlers[name] = handler
            return handler

        return typing.cast(_HandlerDecorator, register)

    def get(self, queue_id: str) -> Handler[Any, Any]:
        try:
            handler = self._handlers[queue_id]
        except KeyError:
            known = ", ".join(sorted(self._handlers)) or "none"
            raise ConfigError(f"unknown queue {queue_id!r} (registered: {known})") from None
        self.check_schedules()
        return handler

    @property
    def queues(self) -> list[str]:
        self.check_schedules()
        return list(self._handlers)

    def __iter__(self) -> Iterator[Handler[Any, Any]]:
        return iter(self._handlers.values())

    def __contains__(self, queue_id: object) -> bool:
        return queue_id in self._handlers

    def __len__(self) -> int:
        return len(self._handlers)


def _isolation(queue: str, limits: Limits | None, env: Sequence[str] | None, cwd: str | None,
               max_jobs_per_child: int | None, new_session: bool) -> Isolation | None:
    """The subprocess options, validated; None when none was given."""
    if limits is None and env is None and cwd is None and max_jobs_per_child is None \
            and new_session:
        return None
    if limits is not None and not isinstance(limits, Limits):
        raise ConfigError(f"limits for queue {queue!r} must be a panqueue.Limits, got {limits!r}")
    if env is not None and (isinstance(env, str) or not all(isinstance(v, str) for v in env)):
        raise ConfigError(f"env for queue {queue!r} must be a list of variable names, "
                          f"got {env!r}")
    if max_jobs_per_child is not None:
        check_int(max_jobs_per_child, "max_jobs_per_child", low=1)
    return Isolation(env=DEFAULT_CHILD_ENV if env is None else tuple(env), cwd=cwd,
                     limits=limits, max_jobs_per_child=max_jobs_per_child,
                     new_session=new_session)
