"""Queue handles: ``client.queue(...)`` returns a :class:`Queue` (async) or :class:`SyncQueue`,
which adds jobs with the queue's producer defaults through its client's producer
(``_producer.py``)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Generic

from panqueue import _tracing
from panqueue._job import PayloadT
from panqueue._options import Backoff, Dedup
from panqueue._producer import (
    DURABLE_TIMEOUT_MS,
    Dependency,
    FlowJob,
    JobHandle,
    Producer,
    SyncJobHandle,
    SyncProducer,
    Target,
    chain,
    dependency_ids,
    flow_jobs,
    new_jobs,
    stored_form,
)
from panqueue._store import NewJob, ops

__all__ = ["Queue", "SyncQueue"]


# Whether a value is None, without a Python frame per option (``add`` checks twelve).
_is_none = functools.partial(operator.is_, None)


class _Handle:
    """What both queue handles are: a target, and the one job of an ``add``."""

    def __init__(self, to: Target) -> None:
        self._target = to
        self.keys = to.keys
        self.name = to.name
        self.defaults = to.defaults
        self.mode = to.mode
        self.partitions = to.partitions
        # The job of an add that gives no option, validated once (see _job).
        self._plain: NewJob | None = None

    def _job(self, data: Any, options: dict[str, Any]) -> NewJob:
        # add(data): the defaults' job, validated at the first such add, with this data
        # (ops.job_alike, as add_bulk's items after the first); not while a span is current,
        # whose context the job carries (new_job).
        if all(map(_is_none, options.values())) and _tracing.current_carrier() is None:
            if self._plain is None:
                self._plain = ops.new_job(self.defaults, None, {})
            return ops.job_alike(self._plain, stored_form(data))
        options["depends_on"] = dependency_ids(self.name, options["depends_on"])
        return ops.new_job(self.defaults, stored_form(data), options)


class Queue(_Handle, Generic[PayloadT]):
    """A queue handle with per-queue defaults; ``add`` arguments override them.

    ``client.queue(handler)`` of a handler typed ``Job[Email]`` is a ``Queue[Email]``: type
    checkers then check the data given to ``add``, ``add_bulk`` and ``add_chain``. A queue
    named by a string is a ``Queue[Any]``. A dataclass instance is stored as its
    ``dataclasses.asdict``.
    """

    def __init__(self, producer: Producer, to: Target) -> None:
        super().__init__(to)
        self._producer = producer

    async def add(self, data: PayloadT = None, *,  # type: ignore[assignment]
                  job_id: str | None = None, delay: float | None = None,
                  run_at: datetime | None = None, priority: int | None = None,
                  attempts: int | None = None,
                  backoff: Backoff | None = None, timeout: float | None = None,
                  key: str | None = None, dedup: Dedup | None = None,
                  depends_on: Sequence[Dependency] | None = None,
                  durable: bool = False,
                  expires: float | datetime | None = None,
                  tags: Sequence[str] | None = None) -> JobHandle:
        """Add one job. With ``job_id``, adding an existing id returns that job unchanged.

        ``key``: the concurrency key (keyed queues). ``dedup``: see :class:`Dedup`.
        ``depends_on``: jobs of this queue that must complete first, as ids or handles (the
        job is BLOCKED until then). ``durable``: return only once the server has fsynced the
        write. ``expires``: seconds from now (on the server's clock) or an aware datetime: a job
        not started by then ends CANCELLED with failure reason ``expired`` and never runs.
        ``tags``: up to 16 labels (``"tenant:42"``) to find the job by (``client.list_jobs``,
        ``cancel_jobs``, ``retry_failed``, ``remove_jobs``).
        """
        job = self._job(data, dict(
            job_id=job_id, delay=delay, run_at=run_at, priority=priority, attempts=attempts,
            backoff=backoff, timeout=timeout, key=key, dedup=dedup, depends_on=depends_on,
            expires=expires, tags=tags))
        [(job_id_, created)] = await self._producer.run(self._producer.add(
            self._target, [job], DURABLE_TIMEOUT_MS if durable else None))
        return JobHandle(self._producer, self.name, job_id_, created)

    async def add_bulk(self, items: Iterable[PayloadT]) -> list[JobHandle]:
        """Add many jobs (each item is one job's data) in one round trip. Every item is
        validated first: one bad item raises PayloadError and nothing is written."""
        jobs = new_jobs(self.defaults, items)
        added = await self._producer.run(self._producer.add(self._target, jobs))
        return [JobHandle(self._producer, self.name, i, c) for i, c in added]

    async def add_flow(self, flow: Sequence[FlowJob]) -> list[JobHandle]:
        """Add a tree (or any DAG) of jobs with their dependencies in one atomic call."""
        jobs = flow_jobs(self.name, self.defaults, flow)
        added = await self._producer.run(self._producer.add(self._target, jobs, together=True))
        return [JobHandle(self._producer, self.name, i, c) for i, c in added]

    async def add_chain(self, items: Iterable[PayloadT]) -> list[JobHandle]:
        """Add jobs that run one after another: each depends on the one before."""
        return await self.add_flow(chain(items))

    def job(self, job_id: str) -> JobHandle:
        """A handle on an existing job, by id."""
        return JobHandle(self._producer, self.name, job_id, False)


class SyncQueue(_Handle, Generic[PayloadT]):
    """:class:`Queue` for :class:`SyncQueueClient` (typed the same way)."""

    def __init__(self, producer: SyncProducer, to: Target) -> None:
        super().__init__(to)
        self._producer = producer

    def add(self, data: PayloadT = None, *,  # type: ignore[assignment]
            job_id: str | None = None, delay: float | None = None,
            run_at: datetime | None = None, priority: int | None = None,
            attempts: int | None = None, backoff: Backoff | None = None,
            timeout: float | None = None, key: str | None = None, dedup: Dedup | None = None,
            depends_on: Sequence[Dependency] | None = None,
            durable: bool = False,
            expires: float | datetime | None = None,
            tags: Sequence[str] | None = None) -> SyncJobHandle:
        job = self._job(data, dict(
            job_id=job_id, delay=delay, run_at=run_at, priority=priority, attempts=attempts,
            backoff=backoff, timeout=timeout, key=key, dedup=dedup, depends_on=depends_on,
            expires=expires, tags=tags))
        [(job_id_, created)] = self._producer.run(self._producer.add(
            self._target, [job], DURABLE_TIMEOUT_MS if durable else None))
        return SyncJobHandle(self._producer, self.name, job_id_, created)

    def add_bulk(self, items: Iterable[PayloadT]) -> list[SyncJobHandle]:
        jobs = new_jobs(self.defaults, items)
        added = self._producer.run(self._producer.add(self._target, jobs))
        return [SyncJobHandle(self._producer, self.name, i, c) for i, c in added]

    def add_flow(self, flow: Sequence[FlowJob]) -> list[SyncJobHandle]:
        jobs = flow_jobs(self.name, self.defaults, flow)
        added = self._producer.run(self._producer.add(self._target, jobs, together=True))
        return [SyncJobHandle(self._producer, self.name, i, c) for i, c in added]

    def add_chain(self, items: Iterable[PayloadT]) -> list[SyncJobHandle]:
        return self.add_flow(chain(items))

    def job(self, job_id: str) -> SyncJobHandle:
        return SyncJobHandle(self._producer, self.name, job_id, False)
