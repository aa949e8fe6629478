"""Batches on the producer side: ``client.batch(on_complete=...)`` opens one; :class:`Batch`
(async) and :class:`SyncBatch` add jobs to it, close it and read its counts.

The storage side (how endings reach the batch, why each callback is added once) is
``panqueue/_store/ops/batches.py``; docs/workflows.md, section "Batches", is the user's view.
"""

from __future__ import annotations

import itertools
import secrets
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from panqueue._codec import check_size, encode_checked
from panqueue._handler import HandlerBase
from panqueue._keys import check_queue_name
from panqueue._producer import (
    JobHandle,
    Producer,
    SyncJobHandle,
    SyncProducer,
    Target,
    dependency_ids,
    new_jobs,
    stored_form,
    target,
)
from panqueue._store.ops import NewJob, new_job
from panqueue._store.ops.batches import (
    BatchInfo,
    batch_info,
    batch_member,
    batch_options,
    close_batch,
    open_batch,
)
from panqueue._store.transport import Op
from panqueue.errors import ConfigError, PayloadError

if TYPE_CHECKING:
    from panqueue._registry import Handler

__all__ = ["Batch", "BatchInfo", "SyncBatch", "new_batch", "new_sync_batch"]

# Jobs per register-and-add round of add_bulk (the benchmark's add_bulk batch size).
BULK_CHUNK = 1000

Callback = tuple[str, Any]


class _Client(Protocol):
    """What a batch needs of its client (:class:`QueueClient`): the producer it adds through."""

    @property
    def producer(self) -> Producer: ...


class _SyncClient(Protocol):
    """What a batch needs of its client (:class:`SyncQueueClient`)."""

    @property
    def producer(self) -> SyncProducer: ...


def _callback(value: object, what: str, limit: int | None) -> Callback:
    """A callback as ``("queue", data)``: data a dict (or None), which gets ``"batch"``; its
    encoding within ``limit`` bytes (the client's ``max_payload_bytes``) with room for that
    key's counts."""
    if not isinstance(value, tuple) or len(value) != 2:
        raise ConfigError(f"{what} must be a (queue, data) tuple, got {value!r}")
    queue, data = value
    if isinstance(queue, HandlerBase):
        queue = queue.queue
    check_queue_name(queue)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: the callback's data must be a dict (it gets the key "
                          f"'batch'), got {type(data).__name__}")
    if "batch" in data:
        raise ConfigError(f"{what}: the callback's data may not have the key 'batch' (the "
                          "batch's counts go there)")
    try:
        encoded = encode_checked(data, f"{what} data")
    except PayloadError as exc:
        raise ConfigError(str(exc)) from None
    if limit is not None:  # the counts it gets: a batch id and four numbers, at most 200 bytes
        check_size(len(encoded) + _CALLBACK_COUNTS, limit, f"{what}'s data")
    return queue, data


# What the "batch" key adds to a callback's data (its id, total, completed, failed, pending).
_CALLBACK_COUNTS = 200


def _opening(on_complete: object, on_success: object, parent: object, limit: int | None
             ) -> tuple[str, Op[BatchInfo]]:
    """Validate ``client.batch``'s arguments: the new batch's id and the operation that
    opens it."""
    complete = _callback(on_complete, "on_complete", limit)
    success = None if on_success is None else _callback(on_success, "on_success", limit)
    if isinstance(parent, Batch | SyncBatch):
        parent = parent.id
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise ConfigError(f"parent must be a batch or a batch id, got {parent!r}")
    batch_id = uuid.uuid4().hex
    return batch_id, open_batch(batch_id, complete, success, parent or "")


class _Opened(str):
    """The id of a batch this handle opened (new_batch): its generated job ids count from 0
    under the batch id itself."""


class _Jobs:
    """What both batch classes share: turning ``add`` arguments into jobs with ids."""

    def __init__(self, batch_id: str) -> None:
        self.id = str(batch_id)
        # A batch job needs its id before the add (it is registered first): generated ones are
        # "<batch id>-<n>" from the handle that opened the batch (given its id as _Opened),
        # and "<batch id>-<handle>-<n>" from any other handle on it, so that two handles never
        # name the same job. Never all digits.
        self._stem = (self.id if isinstance(batch_id, _Opened)
                      else f"{self.id}-{secrets.token_hex(4)}")
        self._numbers = itertools.count()
        self._plain_options = batch_options(self.id)

    def _member(self, job: NewJob) -> NewJob:
        job_id = job.job_id or f"{self._stem}-{next(self._numbers)}"
        return batch_member(job, self.id, job_id, self._plain_options)

    def _one(self, to: Target, data: Any, options: dict[str, Any]) -> list[NewJob]:
        if "depends_on" in options:
            options["depends_on"] = dependency_ids(to.name, options["depends_on"])
        return [self._member(new_job(to.defaults, stored_form(data), options))]

    def _rounds(self, producer: Producer | SyncProducer, to: Target, items: Iterable[Any]
                ) -> Iterable[Sequence[NewJob]]:
        """An ``add_bulk``'s jobs, all validated first (their size by ``producer``), in rounds
        of :data:`BULK_CHUNK`."""
        jobs = [self._member(job) for job in new_jobs(to.defaults, items)]
        producer.check_sizes(jobs)
        for start in range(0, len(jobs), BULK_CHUNK):
            yield jobs[start:start + BULK_CHUNK]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"


class Batch(_Jobs):
    """A batch opened by :meth:`QueueClient.batch` (``Batch(client, batch_id)``: a handle on
    one opened before). Its callbacks are added once, when it is closed and every job in it has
    ended."""

    def __init__(self, client: _Client, batch_id: str) -> None:
        super().__init__(batch_id)
        self._client = client
        self._producer = client.producer

    async def add(self, queue: str | Handler[Any, Any, Any], data: Any = None,
                  **options: Any) -> JobHandle:
        """Add one job to ``queue`` as a member of the batch (the options of
        :meth:`Queue.add`). Returns its :class:`JobHandle`."""
        to = target(queue, {}, self._producer.prefix)
        [(job_id, created)] = await self._producer.run(self._producer.add_to_batch(
            to, self.id, self._one(to, data, options)))
        return JobHandle(self._producer, to.name, job_id, created)

    async def add_bulk(self, queue: str | Handler[Any, Any, Any], items: Iterable[Any]
                       ) -> list[JobHandle]:
        """Add many jobs (each item one job's data) to ``queue``, 1000 per round. Every item
        is validated first: one bad item raises PayloadError and nothing is added."""
        to = target(queue, {}, self._producer.prefix)
        handles = []
        for jobs in self._rounds(self._producer, to, items):
            added = await self._producer.run(self._producer.add_to_batch(to, self.id, jobs))
            handles += [JobHandle(self._producer, to.name, i, c) for i, c in added]
        return handles

    async def close(self) -> BatchInfo:
        """No more jobs join the batch. If all of them already ended (or there are none), the
        callbacks are added before this returns."""
        return await self._producer.run(close_batch(self.id))

    async def info(self) -> BatchInfo:
        """The batch's counts now."""
        return await self._producer.run(batch_info(self.id))

    async def batch(self, on_complete: Callback, on_success: Callback | None = None
                    ) -> Batch:
        """Open a child batch: its callbacks are jobs of this batch, so this one ends only
        after them (the same as ``client.batch(..., parent=this)``)."""
        return await new_batch(self._client, on_complete, on_success, self.id)


class SyncBatch(_Jobs):
    """:class:`Batch` for :class:`SyncQueueClient` (blocking methods)."""

    def __init__(self, client: _SyncClient, batch_id: str) -> None:
        super().__init__(batch_id)
        self._client = client
        self._producer = client.producer

    def add(self, queue: str | Handler[Any, Any, Any], data: Any = None,
            **options: Any) -> SyncJobHandle:
        """Blocking :meth:`Batch.add`."""
        to = target(queue, {}, self._producer.prefix)
        [(job_id, created)] = self._producer.run(self._producer.add_to_batch(
            to, self.id, self._one(to, data, options)))
        return SyncJobHandle(self._producer, to.name, job_id, created)

    def add_bulk(self, queue: str | Handler[Any, Any, Any], items: Iterable[Any]
                 ) -> list[SyncJobHandle]:
        """Blocking :meth:`Batch.add_bulk`."""
        to = target(queue, {}, self._producer.prefix)
        handles = []
        for jobs in self._rounds(self._producer, to, items):
            added = self._producer.run(self._producer.add_to_batch(to, self.id, jobs))
            handles += [SyncJobHandle(self._producer, to.name, i, c) for i, c in added]
        return handles

    def close(self) -> BatchInfo:
        """Blocking :meth:`Batch.close`."""
        return self._producer.run(close_batch(self.id))

    def info(self) -> BatchInfo:
        """Blocking :meth:`Batch.info`."""
        return self._producer.run(batch_info(self.id))

    def batch(self, on_complete: Callback, on_success: Callback | None = None) -> SyncBatch:
        """Blocking :meth:`Batch.batch`."""
        return new_sync_batch(self._client, on_complete, on_success, self.id)


async def new_batch(client: _Client, on_complete: object, on_success: object,
                    parent: object) -> Batch:
    """Open a batch: ``client.batch``'s arguments, checked before anything is written."""
    batch_id, opening = _opening(on_complete, on_success, parent,
                                 client.producer.max_payload_bytes)
    await client.producer.run(opening)
    return Batch(client, _Opened(batch_id))


def new_sync_batch(client: _SyncClient, on_complete: object, on_success: object,
                   parent: object) -> SyncBatch:
    """Blocking :func:`new_batch`."""
    batch_id, opening = _opening(on_complete, on_success, parent,
                                 client.producer.max_payload_bytes)
    client.producer.run(opening)
    return SyncBatch(client, _Opened(batch_id))
