"""Operations over every partition of a queue (``partitions=N``, panqueue/_keys.py).

Each partition is a queue layout of its own in a hash slot of its own, so a question about the
whole queue asks each partition and merges the answers: counts add up, lists merge, a job is
looked up in the partition that holds it (``ops/routing.py``). With one partition every
operation here is the plain one.

A client remembers each queue's layout (``ops/layout.py``) in a :class:`PartitionCounts`, to
route adds without a read; an add that a partition refuses as routed by a stale layout is routed
again under the stored one.

It is one module over 400 lines because every whole-queue question has the same shape (ask
each partition, merge the answers) and shares the layout memory and the merge helpers here;
split by operation, each piece would import the others.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from panqueue._job import JobInfo, JobState
from panqueue._keys import Layout, QueueKeys
from panqueue._store.ops import batches as _batches
from panqueue._store.ops import events as _events
from panqueue._store.ops import jobs as _jobs
from panqueue._store.ops import queue as _queue
from panqueue._store.ops import select as _select
from panqueue._store.ops.add import NewJob
from panqueue._store.ops.base import LayoutChanged
from panqueue._store.ops.events import Event
from panqueue._store.ops.layout import declare, read_layout
from panqueue._store.ops.routing import PartlyAdded, add_routed, home_partition, job_partition
from panqueue._store.transport import Op
from panqueue.errors import ConfigError, JobNotFound

__all__ = ["PartitionCounts", "add_to_batch", "all_cancel_jobs", "all_count_matching",
           "all_counts", "all_due_delayed", "all_events", "all_list_jobs", "all_pause",
           "all_purge", "all_read_jobs", "all_remove_jobs", "all_retry_failed",
           "all_retry_matching", "event_positions", "next_events"]

T = TypeVar("T")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# How many times an add re-reads a changed layout and routes its refused jobs anew before it
# gives up: a change happens only on an empty queue and takes a few round trips, so a producer
# meets one rarely, and a second one right after rarely again.
_LAYOUT_RETRIES = 10


def _mismatch(name: str, stored: int, declared: int, who: str) -> ConfigError:
    return ConfigError(
        f"queue {name!r}: partition count mismatch: the queue has {stored} partition(s), "
        f"{who} says {declared} (a worker of the new count changes it once the queue holds no "
        "job; see docs/scaling.md)")


class PartitionCounts:
    """A client's memory of its queues' layouts, so that adds route without a read. Only a
    stored layout is remembered: a queue not declared yet may still become anything. A
    remembered layout can go stale (a worker changed the count of the emptied queue): an add
    routed by it is refused and re-routed (:meth:`add`), a job not found where it routes is
    looked for again under the stored layout (:meth:`on_job`), and whole-queue operations read
    the layout first (:meth:`on_all`)."""

    def __init__(self) -> None:
        self._known: dict[str, Layout] = {}

    def forget(self, name: str) -> None:
        self._known.pop(name, None)

    def layout(self, name: str, declared: int | None = None, fresh: bool = False,
               mode: str = "") -> Op[Layout]:
        """The layout of ``name``; ``declared``: the count the producer's handler says
        (:class:`ConfigError` when the stored one differs), and ``mode`` its mode, stored with
        a layout this stores; ``fresh``: read, not remembered."""
        layout = None if fresh else self._known.get(name)
        if layout is not None and declared is not None and declared != layout.count:
            layout = None  # remembered before a change, perhaps: the stored one decides
        if layout is None:
            stored = yield from read_layout(name)
            if stored is None and declared is not None and declared > 1:
                stored = yield from declare(name, declared, mode)
                # A pause by name before (the first partition's: its client knew no other)
                # holds for every partition from here on, workers or none.
                yield from _queue.pause_like_home(stored.keys(name))
            if stored is not None:
                self._known[name] = stored
            layout = stored or Layout(declared or 1)
        if declared is not None and declared != layout.count:
            raise _mismatch(name, layout.count, declared, "the handler")
        return layout

    def parts(self, name: str, declared: int | None = None, fresh: bool = False
              ) -> Op[list[QueueKeys]]:
        """Every partition of ``name`` (``declared``, ``fresh``: see :meth:`layout`)."""
        return (yield from self.layout(name, declared, fresh)).keys(name)

    def on_job(self, name: str, job_id: str, fn: Callable[..., Op[T]], *args: Any) -> Op[T]:
        """``fn(keys, job_id, *args)`` on the partition that holds the job. A job missing
        under a remembered layout is looked for again under the stored one, if it differs."""
        known = self._known.get(name)
        keys = yield from job_partition((yield from self.parts(name)), job_id)
        if known is None:  # just read
            return (yield from fn(keys, job_id, *args))
        try:
            result = yield from fn(keys, job_id, *args)
        except JobNotFound:
            stored = yield from self.layout(name, fresh=True)
            if stored == known:
                raise
        else:
            if result is not None and result is not False:
                return result
            stored = yield from self.layout(name, fresh=True)
            if stored == known:
                return result
        keys = yield from job_partition(stored.keys(name), job_id)
        return (yield from fn(keys, job_id, *args))

    def on_all(self, name: str, fn: Callable[..., Op[T]], *args: Any,
               declared: int | None = None) -> Op[T]:
        """``fn(partitions, *args)``: an operation over the whole queue, under the stored
        layout (``declared``: see :meth:`parts`)."""
        parts = yield from self.parts(name, declared, fresh=True)
        return (yield from fn(parts, *args))

    def add(self, name: str, declared: int | None, jobs: Sequence[NewJob], mode: str,
            spread: int, durable_timeout_ms: int | None = None, together: bool = False
            ) -> Op[list[tuple[str, bool]]]:
        """:func:`add_routed` under the layout of ``name``; the jobs a partition refused as
        routed by a stale layout are routed again under the stored one."""
        added: list[tuple[str, bool] | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))
        for _ in range(_LAYOUT_RETRIES):
            layout = yield from self.layout(name, declared, mode=mode)
            parts = layout.keys(name)
            # A producer that names no mode adds in the home's: a partition's first add would
            # otherwise store 'global' beside a partition that a keyed producer made keyed.
            adding = mode or (layout.mode if len(parts) > 1 else "")
            try:
                got: Sequence[tuple[str, bool] | None] = (yield from add_routed(
                    parts, [jobs[i] for i in pending], adding, spread, durable_timeout_ms,
                    together))
            except LayoutChanged as exc:
                got = exc.added if isinstance(exc, PartlyAdded) else [None] * len(pending)
                self.forget(name)
            for index, item in zip(pending, got, strict=True):
                added[index] = item
            pending = [index for index, item in zip(pending, got, strict=True) if item is None]
            if not pending:
                return [item for item in added if item is not None]
        raise LayoutChanged(
            f"queue {name!r}: {len(pending)} of {len(jobs)} job(s) not added: the partitions "
            f"refused the queue's stored layout {_LAYOUT_RETRIES} times (a change of its "
            "partition count is under way, or was interrupted: a worker of the queue finishes "
            "or undoes it when it starts)")


def all_counts(parts: Sequence[QueueKeys]) -> Op[dict[JobState, int]]:
    total: dict[JobState, int] = {}
    for part in parts:
        for state, n in (yield from _jobs.counts(part)).items():
            total[state] = total.get(state, 0) + n
    return total


def _order(state: JobState, by_tag: bool = False) -> Any:
    """How a merged list of jobs in ``state`` is sorted, by what each partition's list is
    sorted by (:func:`~panqueue._store.ops.jobs.list_ids`): finished jobs newest first, delayed
    ones by when they are due; waiting ones by priority, then when they were enqueued (a
    partition's claim order, but for jobs put back in their old place); the others by when they
    were enqueued, or started. ``by_tag``: a tag's jobs, each partition's in the order they were
    added (:func:`~panqueue._store.ops.select.filtered_list`; finished ones newest first)."""
    if by_tag:
        sign = -1 if state.is_final else 1
        return lambda job: sign * (job.enqueued_at or _EPOCH).timestamp()
    if state.is_final:
        return lambda job: -(job.finished_at or _EPOCH).timestamp()
    if state is JobState.DELAYED:
        return lambda job: (job.run_at or _EPOCH).timestamp()
    if state is JobState.WAITING:
        return lambda job: (-job.priority, (job.enqueued_at or _EPOCH).timestamp())
    if state is JobState.ACTIVE:
        return lambda job: (job.started_at or _EPOCH).timestamp()
    return lambda job: (job.enqueued_at or _EPOCH).timestamp()


def all_list_jobs(parts: Sequence[QueueKeys], state: JobState | str, limit: int, offset: int,
                  tag: str | None = None, error_type: str | None = None
                  ) -> Op[list[JobInfo]]:
    """One page of the merged list. A state kept in a sorted set by time (every one but
    waiting): each partition's first ``offset + limit`` ids with their scores, merged by score
    (the order of one partition's list), and only the page's jobs read. Waiting jobs, and
    lists filtered by ``tag`` or ``error_type`` (on the server, each partition with its own
    index of each tag): each partition's first ``offset + limit`` jobs, merged by
    :func:`_order`. O(partitions x (offset + limit))."""

    def one(part: QueueKeys, wanted: JobState | str, limit: int, offset: int
            ) -> Op[list[JobInfo]]:
        if tag is None and error_type is None:
            return (yield from _jobs.list_jobs(part, wanted, limit, offset))
        return (yield from _select.filtered_list(part, wanted, tag, error_type, limit, offset))

    if len(parts) == 1:
        return (yield from one(parts[0], state, limit, offset))
    try:
        wanted = JobState(state)
    except ValueError:
        raise ConfigError(f"unknown job state {state!r}") from None
    if wanted is not JobState.WAITING and tag is None and error_type is None:
        return (yield from _scored_page(parts, wanted, limit, offset))
    lists = []
    for part in parts:
        lists.append((yield from one(part, wanted, offset + limit, 0)))
    merged = list(heapq.merge(*lists, key=_order(wanted, by_tag=tag is not None)))
    return merged[offset:offset + limit]


def _scored_page(parts: Sequence[QueueKeys], state: JobState, limit: int, offset: int
                 ) -> Op[list[JobInfo]]:
    sign = -1 if state.is_final else 1  # finished: newest first
    lists = []
    for part in parts:
        scored = yield from _jobs.first_scored(part, state, offset + limit)
        lists.append([(sign * score, part.partition, member.decode())
                      for member, score in scored])
    page = list(heapq.merge(*lists))[offset:offset + limit]
    by_part: dict[int, list[str]] = {}
    for _, partition, job_id in page:
        by_part.setdefault(partition, []).append(job_id)
    found: dict[tuple[int, str], JobInfo] = {}
    for partition, ids in by_part.items():
        for job in (yield from _jobs.read_jobs(parts[partition], ids, states=(state,))):
            found[partition, job.id] = job
    return [found[p, job_id] for _, p, job_id in page if (p, job_id) in found]


def all_due_delayed(parts: Sequence[QueueKeys]) -> Op[tuple[int, float]]:
    """:func:`~panqueue._store.ops.jobs.due_delayed` over every partition: the count added up,
    the longest time due."""
    due, age = 0, 0.0
    for part in parts:
        n, seconds = yield from _jobs.due_delayed(part)
        due, age = due + n, max(age, seconds)
    return due, age


def all_pause(parts: Sequence[QueueKeys], paused: bool) -> Op[None]:
    for part in parts:
        yield from _queue.pause(part, paused)


def all_retry_failed(parts: Sequence[QueueKeys], ids: Sequence[str]) -> Op[int]:
    if len(parts) == 1:
        return (yield from _queue.retry_failed(parts[0], ids))
    by_part: dict[int, list[str]] = {}
    for job_id in ids:
        part = yield from job_partition(parts, job_id)
        by_part.setdefault(part.partition, []).append(job_id)
    done = 0
    for index, chosen in by_part.items():
        done += yield from _queue.retry_failed(parts[index], chosen)
    return done


def all_cancel_jobs(parts: Sequence[QueueKeys], tag: str | None,
                    state: JobState | str | None) -> Op[int]:
    changed = 0
    for part in parts:
        changed += yield from _select.cancel_jobs(part, tag, state)
    return changed


def all_remove_jobs(parts: Sequence[QueueKeys], tag: str | None,
                    state: JobState | str | None) -> Op[int]:
    removed = 0
    for part in parts:
        removed += yield from _select.remove_jobs(part, tag, state)
    return removed


def all_retry_matching(parts: Sequence[QueueKeys], ids: Sequence[str] | None, tag: str | None,
                       error_type: str | None) -> Op[int]:
    """``retry_failed`` by ids (:func:`all_retry_failed`), or every failed job that matches a
    filter (none: every failed job), in bounded script calls; never ids and a filter."""
    if ids is not None:
        if tag is not None or error_type is not None:
            raise ConfigError("retry_failed takes ids or a filter (tag=, error_type=), not both")
        # A str is a sequence of its characters: taken as ids, it retried other jobs.
        if isinstance(ids, str | bytes) or not all(isinstance(i, str) and i for i in ids):
            raise ConfigError(f"retry_failed ids must be a list of job ids, got {ids!r}")
        return (yield from all_retry_failed(parts, ids))
    moved = 0
    for part in parts:
        moved += yield from _select.retry_jobs(part, tag, error_type)
    return moved


def all_read_jobs(parts: Sequence[QueueKeys], ids: Sequence[str]) -> Op[list[JobInfo]]:
    """The jobs ``ids`` (those that exist), each read in the partition that holds it."""
    by_part: dict[int, list[str]] = {}
    for job_id in ids:
        part = yield from job_partition(parts, job_id)
        by_part.setdefault(part.partition, []).append(job_id)
    found: list[JobInfo] = []
    for index, chosen in by_part.items():
        found += yield from _jobs.read_jobs(parts[index], chosen, logs=False)
    return found


def all_count_matching(parts: Sequence[QueueKeys], states: Sequence[JobState | str],
                       tag: str | None, error_type: str | None) -> Op[int]:
    found = 0
    for part in parts:
        found += yield from _select.count_matching(part, states, tag, error_type)
    return found


def all_purge(parts: Sequence[QueueKeys], states: Collection[JobState | str] | None) -> Op[int]:
    deleted = 0
    for part in parts:
        deleted += yield from _queue.purge(part, states)
    return deleted


def _cursor(parts: Sequence[QueueKeys], after: str | None) -> list[str | None]:
    if after is None:
        return [None] * len(parts)
    positions: list[str | None] = list(after.split(","))
    if len(positions) == 1:  # one stream id (an Event.id, "0-0"): the same in every partition
        return positions * len(parts)
    if len(positions) != len(parts):
        raise ConfigError(f"event position {after!r} is not one of this queue's "
                          f"{len(parts)} partitions' positions")
    return positions


def all_events(parts: Sequence[QueueKeys], after: str | None, count: int, watch: bool = True
               ) -> Op[tuple[list[Event], str]]:
    """The events of every partition after ``after`` (the position an earlier call returned:
    one stream id per partition, comma-separated; or one stream id for all), merged in time
    order, without waiting; with ``after`` None, none and the end of every stream. First ask
    the queue to write every event for the next hour (``watch``), or else the ends of jobs
    (events.py watch)."""
    yield from _events.watch(parts, every=watch)
    if len(parts) == 1:
        # A position of several partitions (taken before the queue was laid out in one) is
        # refused here, as one of another count is below, not by the stream read.
        return (yield from _events.events_now(parts[0], _cursor(parts, after)[0], count))
    positions = yield from event_positions(parts, after)
    if after is None:
        return [], ",".join(positions)
    events, following = yield from _read_each(parts, positions, count, cut=True)
    return events, ",".join(following)


# How long a partitioned queue's event follower blocks on one partition's stream before it looks
# at the others again: the most an event of another partition waits to be delivered.
_FOLLOW_BLOCK_MS = 200
# Events read per partition per step when following (read_events' own default).
_FOLLOW_COUNT = 500


def event_positions(parts: Sequence[QueueKeys], after: str | None) -> Op[list[str]]:
    """Where following the events starts: after ``after`` (see :func:`all_events`), or at the
    end of every partition's stream."""
    if after is not None:
        return [position or "0-0" for position in _cursor(parts, after)]
    ends = []
    for part in parts:
        ends.append((yield from _events.last_event_id(part)))
    return ends


def _read_each(parts: Sequence[QueueKeys], positions: list[str], count: int,
               cut: bool = False) -> Op[tuple[list[Event], list[str]]]:
    """What each partition's stream holds after its position now (up to ``count`` each),
    merged in time order, and the positions after it. ``cut``: the first ``count`` of the
    merge only, each position moved past its own of them alone: a call returns at most
    ``count``, and a later call nothing older than what this one returned (a partition read
    past the others would run ahead of them)."""
    found: list[list[tuple[tuple[int, int], int, Event]]] = []
    following = list(positions)
    for index, part in enumerate(parts):
        events = yield from _events.read_events(part, positions[index], None, count)
        if events:
            found.append([(_stream_order(e.id), index, e) for e in events])
    merged = list(heapq.merge(*found, key=lambda item: item[:2]))
    if cut:
        merged = merged[:count]
    for _, index, event in merged:  # in order: the last of each partition's stays
        following[index] = event.id
    return [event for _, _, event in merged], following


def next_events(parts: Sequence[QueueKeys], positions: list[str], block_ms: int, turn: int
                ) -> Op[tuple[list[Event], list[str]]]:
    """The next events after ``positions`` (one per partition), waiting for the first up to
    ``block_ms``, and the positions after them. A partitioned queue's streams live in several
    slots, which one XREAD cannot wait on together: each is read without waiting, and when all
    are quiet the ``turn``-th is waited on, briefly."""
    if len(parts) == 1:
        events = yield from _events.read_events(parts[0], positions[0], block_ms)
        return events, [events[-1].id if events else positions[0]]
    events, following = yield from _read_each(parts, positions, _FOLLOW_COUNT)
    if not events:
        index = turn % len(parts)
        events = yield from _events.read_events(parts[index], positions[index],
                                                min(block_ms, _FOLLOW_BLOCK_MS))
        if events:
            following[index] = events[-1].id
    return events, following


def _stream_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def add_to_batch(parts: Sequence[QueueKeys], batch_id: str, jobs: Sequence[NewJob],
                 mode: str) -> Op[list[tuple[str, bool]]]:
    """:func:`batches.add_to_batch` for a queue of any number of partitions: each partition's
    share of ``jobs`` is registered in the batch and added there."""
    if len(parts) == 1:
        return (yield from _batches.add_to_batch(batch_id, parts[0], jobs, mode))
    groups: dict[int, list[int]] = {}
    for index, job in enumerate(jobs):
        home = yield from home_partition(parts, job, index)
        groups.setdefault(home.partition, []).append(index)
    added: list[tuple[str, bool]] = [("", False)] * len(jobs)
    for partition, members in groups.items():
        got = yield from _batches.add_to_batch(batch_id, parts[partition],
                                               [jobs[i] for i in members], mode, parts)
        for index, item in zip(members, got, strict=True):
            added[index] = item
    return added
