"""Batches on the producer side: ``client.batch(on_complete=...)`` opens one; :class:`Batch`
(async) and :class:`SyncBatch` add jobs to it, close it and read its counts.

The storage side (how endings reach the batch, why each callback is added once) is
``panqueue/_store/ops/batches.py``; docs/workflows.md, section "Batches", is the user's view.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

# No import cycle: the clients import this module only inside client.batch().
from panqueue._client import (
    JobHandle,
    QueueClient,
    SyncJobHandle,
    SyncQueueClient,
    _dependency_ids,
    _new_jobs,
    _stored_form,
)
from panqueue._codec import encode_checked
from panqueue._keys import check_queue_name
from panqueue._registry import Handler
from panqueue._store.ops import NewJob, new_job
from panqueue._store.ops import partitions as parted
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

__all__ = ["Batch", "BatchInfo", "SyncBatch", "batch_opening"]

# Jobs per register-and-add round of add_bulk (the benchmark's add_bulk batch size).
BULK_CHUNK = 1000

Callback = tuple[str, Any]
H = TypeVar("H")


def _callback(value: object, what: str) -> Callback:
    """A callback as ``("queue", data)``: data a dict (or None), which gets ``"batch"``."""
    if not isinstance(value, tuple) or len(value) != 2:
        raise ConfigError(f"{what} must be a (queue, data) tuple, got {value!r}")
    queue, data = value
    if isinstance(queue, Handler):
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
        encode_checked(data, f"{what} data")
    except PayloadError as exc:
        raise ConfigError(str(exc)) from None
    return queue, data


def batch_opening(on_complete: object, on_success: object, parent: object
                  ) -> tuple[str, Op[BatchInfo]]:
    """Validate ``client.batch``'s arguments: the new batch's id and the operation that
    opens it."""
    complete = _callback(on_complete, "on_complete")
    success = None if on_success is None else _callback(on_success, "on_success")
    if isinstance(parent, Batch | SyncBatch):
        parent = parent.id
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise ConfigError(f"parent must be a batch or a batch id, got {parent!r}")
    batch_id = uuid.uuid4().hex
    return batch_id, open_batch(batch_id, complete, success, parent or "")


class _Jobs:
    """What both batch classes share: turning ``add`` arguments into jobs with ids."""

    def __init__(self, batch_id: str) -> None:
        self.id = batch_id
        self._numbers = itertools.count()
        self._plain_options = batch_options(batch_id)

    def _member(self, job: NewJob) -> NewJob:
        # A batch job needs its id before the add (it is registered first): generated ones
        # are the batch id and a counter, never all digits.
        job_id = job.job_id or f"{self.id}-{next(self._numbers)}"
        return batch_member(job, self.id, job_id, self._plain_options)

    def _one(self, target: Any, data: Any, options: dict[str, Any]) -> list[NewJob]:
        if "depends_on" in options:
            options["depends_on"] = _dependency_ids(target.name, options["depends_on"])
        return [self._member(new_job(target.defaults, _stored_form(data), options))]

    def _many(self, target: Any, items: Iterable[Any]) -> list[NewJob]:
        return [self._member(job) for job in _new_jobs(target.defaults, items)]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"


def _chunks(jobs: Sequence[NewJob]) -> Iterable[Sequence[NewJob]]:
    for start in range(0, len(jobs), BULK_CHUNK):
        yield jobs[start:start + BULK_CHUNK]


class Batch(_Jobs):
    """A batch opened by :meth:`QueueClient.batch`. Its callbacks are added once, when it is
    closed and every job in it has ended."""

    def __init__(self, client: QueueClient, batch_id: str) -> None:
        super().__init__(batch_id)
        self._client = client

    async def add(self, queue: str | Handler[Any, Any, Any], data: Any = None,
                  **options: Any) -> JobHandle:
        """Add one job to ``queue`` as a member of the batch (the options of
        :meth:`Queue.add`). Returns its :class:`JobHandle`."""
        target = self._client.queue(queue)
        [job] = self._one(target, data, options)
        [(job_id, created)] = await self._client._run(self._client._parts.on_all(
            target.name, parted.add_to_batch, self.id, [job], target.mode,
            declared=target.partitions))
        return _created(target.job(job_id), created)

    async def add_bulk(self, queue: str | Handler[Any, Any, Any], items: Iterable[Any]
                       ) -> list[JobHandle]:
        """Add many jobs (each item one job's data) to ``queue``, 1000 per round. Every item
        is validated first: one bad item raises PayloadError and nothing is added."""
        target = self._client.queue(queue)
        handles = []
        for chunk in _chunks(self._many(target, items)):
            added = await self._client._run(self._client._parts.on_all(
                target.name, parted.add_to_batch, self.id, chunk, target.mode,
                declared=target.partitions))
            handles += [_created(target.job(i), c) for i, c in added]
        return handles

    async def close(self) -> BatchInfo:
        """No more jobs join the batch. If all of them already ended (or there are none), the
        callbacks are added before this returns."""
        return await self._client._run(close_batch(self.id))

    async def info(self) -> BatchInfo:
        """The batch's counts now."""
        return await self._client._run(batch_info(self.id))

    async def batch(self, on_complete: Callback, on_success: Callback | None = None
                    ) -> Batch:
        """Open a child batch: its callbacks are jobs of this batch, so this one ends only
        after them (the same as ``client.batch(..., parent=this)``)."""
        return await self._client.batch(on_complete, on_success, parent=self.id)


class SyncBatch(_Jobs):
    """:class:`Batch` for :class:`SyncQueueClient` (blocking methods)."""

    def __init__(self, client: SyncQueueClient, batch_id: str) -> None:
        super().__init__(batch_id)
        self._client = client

    def add(self, queue: str | Handler[Any, Any, Any], data: Any = None,
            **options: Any) -> SyncJobHandle:
        """Blocking :meth:`Batch.add`."""
        target = self._client.queue(queue)
        [job] = self._one(target, data, options)
        [(job_id, created)] = self._client._run(self._client._parts.on_all(
            target.name, parted.add_to_batch, self.id, [job], target.mode,
            declared=target.partitions))
        return _created(target.job(job_id), created)

    def add_bulk(self, queue: str | Handler[Any, Any, Any], items: Iterable[Any]
                 ) -> list[SyncJobHandle]:
        """Blocking :meth:`Batch.add_bulk`."""
        target = self._client.queue(queue)
        handles = []
        for chunk in _chunks(self._many(target, items)):
            added = self._client._run(self._client._parts.on_all(
                target.name, parted.add_to_batch, self.id, chunk, target.mode,
                declared=target.partitions))
            handles += [_created(target.job(i), c) for i, c in added]
        return handles

    def close(self) -> BatchInfo:
        """Blocking :meth:`Batch.close`."""
        return self._client._run(close_batch(self.id))

    def info(self) -> BatchInfo:
        """Blocking :meth:`Batch.info`."""
        return self._client._run(batch_info(self.id))

    def batch(self, on_complete: Callback, on_success: Callback | None = None) -> SyncBatch:
        """Blocking :meth:`Batch.batch`."""
        return self._client.batch(on_complete, on_success, parent=self.id)


def _created(handle: H, created: bool) -> H:
    """A queue handle's job handle, saying whether the add created the job."""
    handle.created = created  # type: ignore[attr-defined]
    return handle
