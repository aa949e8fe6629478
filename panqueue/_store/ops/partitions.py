"""Operations over every partition of a queue (``partitions=N``, panqueue/_keys.py).

Each partition is a queue layout of its own in a hash slot of its own, so a question about the
whole queue asks each partition and merges the answers: counts add up, lists merge, a job is
looked up where its id routes it and then, failing that, in the other partitions. With one
partition every operation here is the plain one.

The queue's layout (partition count, placement, version: :class:`panqueue._keys.Layout`) lives
in its home meta. Clients remember it to route adds without a read; every add names the version
it routes by, and a partition that is not in that version refuses it (``lua/lib/layout.lua``
``partition_problem``): the client reads the layout again and routes the refused jobs anew. A
layout changes only through :func:`change_layout`, while the queue holds no job.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from panqueue._job import JobInfo, JobState
from panqueue._keys import LEGACY_PLACEMENT, SPREAD_PLACEMENT, Layout, QueueKeys, route
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import add as _add
from panqueue._store.ops import batches as _batches
from panqueue._store.ops import events as _events
from panqueue._store.ops import identity as _identity
from panqueue._store.ops import jobs as _jobs
from panqueue._store.ops import queue as _queue
from panqueue._store.ops.add import NewJob
from panqueue._store.ops.base import LayoutChanged, script_call
from panqueue._store.ops.events import Event
from panqueue._store.transport import Batch, Command, Op
from panqueue.errors import ConfigError, JobNotFound, PanqueueError

__all__ = ["LayoutBusy", "PartitionCounts", "add_routed", "add_to_batch", "all_counts",
           "all_events", "all_list_jobs", "all_pause", "all_purge", "all_retry_failed",
           "change_layout", "declare", "event_positions", "job_partition", "next_events",
           "partition_count", "read_layout", "repair_partition"]

T = TypeVar("T")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# How many times an add re-reads a changed layout and routes its refused jobs anew before it
# gives up: a change happens only on an empty queue and takes a few round trips, so a producer
# meets one rarely, and a second one right after rarely again.
_LAYOUT_RETRIES = 10


def read_layout(name: str) -> Op[Layout | None]:
    """The layout stored in queue ``name``'s home meta; None while it has none (no producer or
    worker has declared it yet, so it may still become anything). A queue stored without a
    placement was declared before partitions were placed by slot: its partitions keep their
    "#i" tags."""
    count, placement, version = yield Command(("HMGET", QueueKeys(name).meta, "np", "pl", "lv"))
    if count is None:
        return None
    return Layout(int(count), LEGACY_PLACEMENT if placement is None else int(placement),
                  int(version or 0))


def partition_count(name: str) -> Op[int | None]:
    """The partition count stored for queue ``name``; None while it has none."""
    layout = yield from read_layout(name)
    return None if layout is None else layout.count


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

    def layout(self, name: str, declared: int | None = None, fresh: bool = False
               ) -> Op[Layout]:
        """The layout of ``name``; ``declared``: the count the producer's handler says
        (:class:`ConfigError` when the stored one differs); ``fresh``: read, not remembered."""
        layout = None if fresh else self._known.get(name)
        if layout is not None and declared is not None and declared != layout.count:
            layout = None  # remembered before a change, perhaps: the stored one decides
        if layout is None:
            stored = yield from read_layout(name)
            if stored is None and declared is not None and declared > 1:
                stored = yield from declare(name, declared)
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
            parts = yield from self.parts(name, declared)
            try:
                got: Sequence[tuple[str, bool] | None] = (yield from add_routed(
                    parts, [jobs[i] for i in pending], mode, spread, durable_timeout_ms,
                    together))
            except LayoutChanged as exc:
                got = exc.added if isinstance(exc, _PartlyAdded) else [None] * len(pending)
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


def declare(name: str, n: int) -> Op[Layout]:
    """Store a producer's layout in the queue's home meta, where every client reads it (the
    add itself may go to another partition); the layout stored first wins."""
    home = QueueKeys(name)
    reply = yield script_call(SCRIPTS.declare, home, n, SPREAD_PLACEMENT)
    count, placement, version = reply
    return Layout(int(count), LEGACY_PLACEMENT if placement is None else int(placement),
                  int(version or 0))


class LayoutBusy(ConfigError):
    """Another client holds the queue's layout lock (a change is under way): try again."""


class LayoutServed(ConfigError):
    """Workers of the stored count are registered: the count can change once they have left
    (a stopped worker's entry goes at once, or, when its last call was lost, within three of
    its heartbeats, as a dead worker's)."""


# How long a layout change may hold the home's lock. The changer stops taking steps well before
# (_LEASE_MS / 2 after it took the lock), so that none lands after another may have taken it.
_LEASE_MS = 10_000


def _relayout(keys: QueueKeys, version: int | str, place: str, token: str = "",
              placement: int = SPREAD_PLACEMENT) -> Op[str | None]:
    """One step of a change (``lua/relayout.lua``): None, or why it was refused."""
    reply = yield script_call(SCRIPTS.relayout, keys, version, place, token, placement)
    return reply[1].decode() if reply[0] == b"!" else None


def change_layout(name: str, count: int, token: str) -> Op[Layout]:
    """Change queue ``name`` to ``count`` partitions placed by slot (a worker that declares
    another count than the stored one): :class:`ConfigError` naming the partition that holds
    jobs, or the workers that serve the old layout (nothing changed); :class:`LayoutBusy` when
    another change holds the lock. Under the home's lock, every partition of the old layout and
    every new one moves to the next version while it holds no job, one script each, then the
    home, where clients read the layout, moves last; a refusal moves the others back. From the
    first step on, a client that routes by the old layout is refused by the partitions already
    moved and reads the layout again, so no add lands in a partition that the new layout
    leaves out."""
    home = QueueKeys(name)
    if not (yield Command(("SET", home.relayout, token, "NX", "PX", _LEASE_MS))):
        raise LayoutBusy(f"queue {name!r}: another change of its layout is under way")
    return (yield from _released(home, token, _change(name, count, token)))


def _released(home: QueueKeys, token: str, op: Op[T]) -> Op[T]:
    """``op``, then the layout lock released, also when ``op`` fails with an error of ours.
    (Not in a ``finally``: an operation abandoned by a cancelled caller is closed, and can send
    nothing then; its lock expires with its lease.)"""
    try:
        result = yield from op
    except PanqueueError:
        yield from _relayout(home, "", "", token)
        raise
    yield from _relayout(home, "", "", token)
    return result


def _change(name: str, count: int, token: str) -> Op[Layout]:
    home = QueueKeys(name)
    deadline = time.monotonic() + _LEASE_MS / 2000
    current = (yield from read_layout(name)) or Layout(1)
    if current.count == count:
        return current  # another worker changed it meanwhile
    new = Layout(count, SPREAD_PLACEMENT, current.version + 1)
    old_parts, new_parts = current.keys(name), new.keys(name)
    new_index = {keys.prefix: keys.partition for keys in new_parts}
    old_prefixes = {keys.prefix for keys in old_parts}
    steps = [(keys, f"{count}:{new_index[keys.prefix]}" if keys.prefix in new_index
              else "0:0", f"{current.count}:{keys.partition}") for keys in old_parts[1:]]
    steps += [(keys, f"{count}:{keys.partition}", "0:0") for keys in new_parts[1:]
              if keys.prefix not in old_prefixes]
    moved: list[tuple[QueueKeys, str]] = []
    problem = None
    for keys, place, before in steps:
        if time.monotonic() > deadline:
            problem = ConfigError(f"queue {name!r}: the change of its partition count took "
                                  "too long and was stopped (the next worker undoes it)")
            break
        if (yield from _relayout(keys, new.version, place)):
            problem = _held(name, current, count, keys)
            break
        moved.append((keys, before))
    if problem is None:
        refused = yield from _relayout(home, new.version, f"{count}:0", token)
        if refused is None:
            return new
        problem = _held(name, current, count, home) if refused == "holds jobs" else \
            _served(name, current, count, refused)
    if time.monotonic() < deadline:
        # Back to the old layout: no client routed by the new one yet (the home never named
        # it), and the old one's clients were refused, so these hold no job. Past the deadline
        # the lock may be another's by now: the next worker gives them back (repair_partition).
        for keys, before in reversed(moved):
            yield from _relayout(keys, current.version, before)
    raise problem


def _held(name: str, current: Layout, count: int, keys: QueueKeys) -> ConfigError:
    return ConfigError(
        f"queue {name!r}: partition count mismatch: the queue has {current.count} "
        f"partition(s), this worker says {count}, and its partition {keys.partition} "
        f"({keys.prefix[:-1]}) holds jobs (the count changes only while the queue holds no "
        "job: drain and purge it first; see docs/scaling.md)")


def _served(name: str, current: Layout, count: int, refused: str) -> ConfigError:
    if not refused.startswith("live workers"):
        return ConfigError(f"queue {name!r}: the change of its partition count lost its lock "
                           "(it took too long) and was stopped (the next worker undoes it)")
    live = refused.rpartition(" ")[2]
    return LayoutServed(
        f"queue {name!r}: partition count mismatch: the queue has {current.count} "
        f"partition(s), this worker says {count}, and {live} live worker(s) serve it with "
        f"{current.count} (stop them first; a worker that died leaves the registry within three "
        "heartbeats; see docs/scaling.md)")


def repair_partition(keys: QueueKeys, token: str) -> Op[bool]:
    """Give ``keys`` (a partition of the queue's stored layout, refusing it) back to that
    layout: a change that was interrupted left it moved, empty, to a version the home never
    named. Under the home's lock, so that no change is under way. False: the stored layout is
    not the one ``keys`` belongs to any more (the caller reads it again)."""
    home = QueueKeys(keys.name)
    if not (yield Command(("SET", home.relayout, token, "NX", "PX", _LEASE_MS))):
        raise LayoutBusy(f"queue {keys.name!r}: a change of its layout is under way")
    return (yield from _released(home, token, _give_back(keys)))


def _give_back(keys: QueueKeys) -> Op[bool]:
    stored = yield from read_layout(keys.name)
    if stored is None or stored.version != keys.version or stored.count != keys.partitions:
        return False
    if (yield from _relayout(keys, keys.version, f"{keys.partitions}:{keys.partition}")):
        raise ConfigError(
            f"queue {keys.name!r}: partition {keys.partition} ({keys.prefix[:-1]}) holds jobs "
            f"under another layout than the queue's (version {keys.version})")
    return True


def job_partition(parts: Sequence[QueueKeys], job_id: str) -> Op[QueueKeys]:
    """The partition that holds ``job_id``: where its id routes it (generated ids always, custom
    ids unless the job was routed by its key or its dependencies), else the first that has it.
    A job found nowhere answers the routed partition, whose operations then report it
    missing."""
    if len(parts) == 1:
        return parts[0]
    guess = parts[route(len(parts), job_id) or 0]
    # A custom id's home knows where its job went when that is elsewhere (lib/identity.lua).
    pointed = yield from _identity.pointed_partition(parts, guess, job_id)
    if pointed is not None:
        return pointed
    others = [p for p in parts if p is not guess]
    found = yield Batch(tuple(Command(("EXISTS", p.job(job_id))) for p in others))
    for part, exists in zip(others, found, strict=True):
        if exists:
            return part
    return guess


def all_counts(parts: Sequence[QueueKeys]) -> Op[dict[JobState, int]]:
    total: dict[JobState, int] = {}
    for part in parts:
        for state, n in (yield from _jobs.counts(part)).items():
            total[state] = total.get(state, 0) + n
    return total


def _order(state: JobState) -> Any:
    """How a merged list of jobs in ``state`` is sorted: finished ones newest first, the rest
    by when they were enqueued (within a partition, each list keeps its own order)."""
    if state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
        return lambda job: -(job.finished_at or _EPOCH).timestamp()
    return lambda job: (job.enqueued_at or _EPOCH).timestamp()


def all_list_jobs(parts: Sequence[QueueKeys], state: JobState | str, limit: int, offset: int
                  ) -> Op[list[JobInfo]]:
    """One page of the merged list: each partition's first ``offset + limit`` jobs, merged.
    Exact for the order :func:`_order` names; O(partitions x (offset + limit))."""
    if len(parts) == 1:
        return (yield from _jobs.list_jobs(parts[0], state, limit, offset))
    try:
        wanted = JobState(state)
    except ValueError:
        raise ConfigError(f"unknown job state {state!r}") from None
    lists = []
    for part in parts:
        lists.append((yield from _jobs.list_jobs(part, wanted, offset + limit, 0)))
    merged = list(heapq.merge(*lists, key=_order(wanted)))
    return merged[offset:offset + limit]


def all_pause(parts: Sequence[QueueKeys], paused: bool) -> Op[None]:
    for part in parts:
        yield from _queue.pause(part, paused)


def all_retry_failed(parts: Sequence[QueueKeys], ids: Sequence[str] | None) -> Op[int]:
    if ids is None or len(parts) == 1:
        done = 0
        for part in parts:
            done += yield from _queue.retry_failed(part, ids)
        return done
    by_part: dict[int, list[str]] = {}
    for job_id in ids:
        part = yield from job_partition(parts, job_id)
        by_part.setdefault(part.partition, []).append(job_id)
    done = 0
    for index, chosen in by_part.items():
        done += yield from _queue.retry_failed(parts[index], chosen)
    return done


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


def all_events(parts: Sequence[QueueKeys], after: str | None, count: int
               ) -> Op[tuple[list[Event], str]]:
    """The events of every partition after ``after`` (the position an earlier call returned:
    one stream id per partition, comma-separated; or one stream id for all), merged in time
    order, without waiting; with ``after`` None, none and the end of every stream."""
    if len(parts) == 1:
        return (yield from _events.events_now(parts[0], after, count))
    positions = yield from event_positions(parts, after)
    if after is None:
        return [], ",".join(positions)
    events, following = yield from _read_each(parts, positions, count)
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


def _read_each(parts: Sequence[QueueKeys], positions: list[str], count: int
               ) -> Op[tuple[list[Event], list[str]]]:
    """What each partition's stream holds after its position now (up to ``count`` each),
    merged in time order, and the positions after it."""
    found: list[list[Event]] = []
    following = list(positions)
    for index, part in enumerate(parts):
        events = yield from _events.read_events(part, positions[index], None, count)
        if events:
            found.append(events)
            following[index] = events[-1].id
    return list(heapq.merge(*found, key=lambda e: _stream_order(e.id))), following


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


def _home(parts: Sequence[QueueKeys], job: NewJob, spread: int) -> Op[QueueKeys]:
    """The partition a new job goes to: its key's, its dependencies' (a job waits only for jobs
    of its own partition), its id's, its dedup key's (so that the same key meets itself), or,
    for a job with none of these, the ``spread``-th (the producer turns it)."""
    n = len(parts)
    if n == 1:
        return parts[0]
    if job.key:
        return parts[route(n, key=job.key) or 0]
    if job.depends_on:
        home = yield from job_partition(parts, job.depends_on[0])
        for dep in job.depends_on[1:]:
            other = yield from job_partition(parts, dep)
            if other is not home:
                raise ConfigError(
                    f"queue {home.name!r}: depends_on names jobs of two partitions "
                    f"({job.depends_on[0]!r} in {home.partition}, {dep!r} in "
                    f"{other.partition}); a job of a partitioned queue can wait only for jobs "
                    "of one partition (see docs/scaling.md)")
        return home
    if job.job_id:
        return parts[route(n, job.job_id) or 0]
    if job.dedup_key:
        return parts[route(n, key="dd:" + job.dedup_key) or 0]
    return parts[spread % n]


def add_to_batch(parts: Sequence[QueueKeys], batch_id: str, jobs: Sequence[NewJob],
                 mode: str) -> Op[list[tuple[str, bool]]]:
    """:func:`batches.add_to_batch` for a queue of any number of partitions: each partition's
    share of ``jobs`` is registered in the batch and added there."""
    if len(parts) == 1:
        return (yield from _batches.add_to_batch(batch_id, parts[0], jobs, mode))
    groups: dict[int, list[int]] = {}
    for index, job in enumerate(jobs):
        home = yield from _home(parts, job, index)
        groups.setdefault(home.partition, []).append(index)
    added: list[tuple[str, bool]] = [("", False)] * len(jobs)
    for partition, members in groups.items():
        got = yield from _batches.add_to_batch(batch_id, parts[partition],
                                               [jobs[i] for i in members], mode, parts)
        for index, item in zip(members, got, strict=True):
            added[index] = item
    return added


def add_routed(parts: Sequence[QueueKeys], jobs: Sequence[NewJob], mode: str, spread: int,
               durable_timeout_ms: int | None = None, together: bool = False
               ) -> Op[list[tuple[str, bool]]]:
    """Add ``jobs`` each to its partition (:func:`_home`), one script call per partition, all
    sent in one round trip (on a cluster, one pipeline per node); the reply in the order of
    ``jobs``. ``together``: the jobs depend on each other (a flow): all go where the first
    goes, in one atomic call. ``durable_timeout_ms`` applies to a single partition's add."""
    if len(parts) == 1 or (together and len(jobs) > 0):
        home = yield from _home(parts, jobs[0], spread)
        return (yield from _identity.add_placed(parts, home, jobs, mode, durable_timeout_ms))
    groups: dict[int, list[int]] = {}
    for index, job in enumerate(jobs):
        home = yield from _home(parts, job, spread + index)
        groups.setdefault(home.partition, []).append(index)
    if durable_timeout_ms is not None:
        [(partition, members)] = groups.items()  # a single add: one partition
        return (yield from _identity.add_placed(parts, parts[partition],
                                                [jobs[i] for i in members], mode,
                                                durable_timeout_ms))
    # Jobs whose custom id or dedup key has its home in another partition are decided there
    # first, one by one (_store/ops/identity.py); so are the jobs of a partition whose add met
    # a pointer to another partition. The rest go in one round trip.
    one_by_one: list[tuple[int, list[int]]] = []
    for partition, members in groups.items():
        far = [i for i in members if _identity.is_far(parts, parts[partition], jobs[i])]
        if far:
            one_by_one += [(partition, [i]) for i in far]
            members[:] = [i for i in members if i not in far]
    order = [(partition, members) for partition, members in groups.items() if members]
    calls = tuple(_add.add_call(parts[p], [jobs[i] for i in members], mode)
                  for p, members in order)
    replies = (yield Batch(calls)) if calls else []
    added: list[tuple[str, bool] | None] = [None] * len(jobs)
    stale = None
    for (partition, members), reply in zip(order, replies, strict=True):
        try:
            items = _add.parse_added(parts[partition], reply)
        except _add.IdentityElsewhere:
            one_by_one.append((partition, members))  # nothing of it was written
            continue
        except LayoutChanged as exc:
            stale = exc  # the others went ahead: the caller routes only these again
            continue
        for index, item in zip(members, items, strict=True):
            added[index] = item
    for partition, members in one_by_one:
        try:
            items = yield from _identity.add_placed(parts, parts[partition],
                                                    [jobs[i] for i in members], mode)
        except LayoutChanged as exc:
            stale = exc
            continue
        for index, item in zip(members, items, strict=True):
            added[index] = item
    if stale is not None:
        raise _PartlyAdded(str(stale), added)
    return [item for item in added if item is not None]


class _PartlyAdded(LayoutChanged):
    """Some partitions of an add refused a stale layout, the others added their jobs:
    ``added`` holds those (None for each refused job)."""

    def __init__(self, message: str, added: list[tuple[str, bool] | None]) -> None:
        super().__init__(message)
        self.added = added
