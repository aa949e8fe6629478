"""Where a job of a partitioned queue is, and where a new one goes (``partitions=N``,
panqueue/_keys.py): a job is looked up where its id routes it and then, failing that, in the other
partitions; a new job goes where its key, dependencies, id or dedup key route it, else where the
producer's turn puts it. With one partition every answer is that partition.
"""

from __future__ import annotations

from collections.abc import Sequence

from panqueue._keys import QueueKeys, route
from panqueue._store.ops import add as _add
from panqueue._store.ops import identity as _identity
from panqueue._store.ops.add import NewJob
from panqueue._store.ops.base import LayoutChanged
from panqueue._store.transport import Batch, Command, Op
from panqueue.errors import ConfigError

__all__ = ["PartlyAdded", "add_routed", "home_partition", "identity_home", "job_partition"]


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


def home_partition(parts: Sequence[QueueKeys], job: NewJob, spread: int) -> Op[QueueKeys]:
    """The partition a new job goes to: its key's, its dependencies' (a job waits only for jobs
    of its own partition), its id's, its dedup key's (so that the same key meets itself), or,
    for a job with none of these, the ``spread``-th (the producer turns it)."""
    n = len(parts)
    if n == 1:
        return parts[0]
    if job.depends_on and not job.key:
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
    routed = identity_home(n, job)
    return parts[spread % n if routed is None else routed]


def identity_home(n: int, job: NewJob) -> int | None:
    """The partition (of ``n``) a new job's key routes it to, else its custom id, else its
    dedup key; None when it has none of them. (A job with dependencies and no key goes where
    they are instead: :func:`home_partition`.)"""
    if job.key:
        return route(n, key=job.key)
    if job.job_id:
        return route(n, job.job_id)
    if job.dedup_key:
        return route(n, key="dd:" + job.dedup_key)
    return None


def add_routed(parts: Sequence[QueueKeys], jobs: Sequence[NewJob], mode: str, spread: int,
               durable_timeout_ms: int | None = None, together: bool = False
               ) -> Op[list[tuple[str, bool]]]:
    """Add ``jobs`` each to its partition (:func:`home_partition`), one script call per
    partition, all sent in one round trip (on a cluster, one pipeline per node); the reply in
    the order of ``jobs``. ``together``: the jobs depend on each other (a flow): all go where
    the first goes, in one atomic call. ``durable_timeout_ms`` applies to a single partition's
    add."""
    if len(parts) == 1 or (together and len(jobs) > 0):
        home = yield from home_partition(parts, jobs[0], spread)
        if together and len(parts) > 1:
            _check_keys_of_a_flow(parts, home, jobs)
            yield from _check_ids_a_flow_waits_for(parts, home, jobs)
        return (yield from _identity.add_placed(parts, home, jobs, mode, durable_timeout_ms))
    groups: dict[int, list[int]] = {}
    for index, job in enumerate(jobs):
        home = yield from home_partition(parts, job, spread + index)
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
        raise PartlyAdded(str(stale), added)
    return [item for item in added if item is not None]


def _check_keys_of_a_flow(parts: Sequence[QueueKeys], home: QueueKeys,
                          jobs: Sequence[NewJob]) -> None:
    """A flow lives in one partition, and a key in the one it routes to (so that its limits
    hold): refuse (:class:`ConfigError`, nothing written) a flow whose keys route elsewhere."""
    n = len(parts)
    for index, job in enumerate(jobs):
        where = route(n, key=job.key) if job.key else None
        if where is not None and where != home.partition:
            raise ConfigError(
                f"queue {home.name!r}: item {index}'s key {job.key!r} lives in partition "
                f"{where}, and this flow in partition {home.partition} (where its first item "
                "goes): a flow's jobs live in one partition, so its keys must route to the "
                "same partition (see docs/scaling.md)")


def _check_ids_a_flow_waits_for(parts: Sequence[QueueKeys], home: QueueKeys,
                                jobs: Sequence[NewJob]) -> Op[None]:
    """Refuse (:class:`ConfigError`) a flow of which a later item waits for an item whose
    custom id names a job of another partition, before any identity is decided: deciding one
    can change what exists (a dedup replace deletes the job it replaces), and a refused add
    writes nothing. (Identity decisions check the same again, for what changes meanwhile.)"""
    awaited = {dep for job in jobs for dep in job.depends_on}
    for index, job in enumerate(jobs):
        # An id the client made unique (a flow item given none) names no job yet.
        if not job.job_id or job.unique_id or job.job_id not in awaited:
            continue
        where = yield from job_partition(parts, job.job_id)
        if where.partition == home.partition or not (
                yield Command(("EXISTS", where.job(job.job_id)))):
            continue
        raise ConfigError(
            f"queue {home.name!r}: item {index}: job_id {job.job_id!r} names a job of "
            f"partition {where.partition}, not of this flow's partition {home.partition}, so "
            "the items that depend on it cannot wait for it (a job waits only for jobs of its "
            "own partition; see docs/scaling.md); nothing was added")


class PartlyAdded(LayoutChanged):
    """Some partitions of an add refused a stale layout, the others added their jobs:
    ``added`` holds those (None for each refused job)."""

    def __init__(self, message: str, added: list[tuple[str, bool] | None]) -> None:
        super().__init__(message)
        self.added = added
