"""Idempotency across the partitions of a partitioned queue (``lua/lib/identity.lua``,
docs/scaling.md "Idempotency").

A custom job id and a dedup key each have a home partition, where their name routes
(:func:`panqueue._keys.route`). The job itself goes where its key, its dependencies or its flow
put it, which may be another partition, and no script can touch two. Such an add is two steps:

1. In the identity's home, ``identity_reserve.lua`` decides the identity as an add would (the id
   names a job, a live dedup key names one: the add returns it), and otherwise writes a pointer
   to the partition the job goes to, with a token naming this add.
2. In that partition, the add script adds the job, carrying the token (and its dedup key, so
   that the key's pointer can tell its job from a later one under the same id: tokens so
   written start with :data:`HELD_TOKEN_MARK`). It refuses a token that was fenced there.

A producer that meets a pointer whose job is missing asks that partition
(``identity_check.lua``): while the pointer is younger than :data:`GRACE_MS` the add it stands
for may still arrive, and the producer waits; after that the token is fenced, so that add can no
longer arrive, and the pointer is cleared and decided again. A producer that dies between the
steps therefore delays the next add of the same identity by the grace at most, a removed or
trimmed job leaves a pointer that the next add finds stale, and two racing producers never both
create a job: whichever pointer stands, the other add finds it.

Longer than 400 lines: the two steps, the look at another add's pointer and the clearing of
stale ones are one protocol, whose functions call each other and share its pointers' format.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

from panqueue._keys import QueueKeys, route
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import add as _add
from panqueue._store.ops.add import IdentityElsewhere, IdentityFenced, NewJob
from panqueue._store.ops.base import script_call
from panqueue._store.transport import Batch, Command, Op
from panqueue.errors import ConfigError, PanqueueError

__all__ = ["GRACE_MS", "add_placed", "forget_deleted", "is_far", "pointed_partition",
           "reserve_identity"]

# Deleted jobs whose pointers one call of :func:`forget_deleted` clears, at most.
_FORGET_BATCH = 100

# How long a pointer whose job is missing counts as an add on its way (ms): far longer than the
# two steps of a live producer take, short enough that a dead one delays the next add little.
GRACE_MS = 1000
# The first character of the identity token of an add that decided an identity in its home:
# its job carries its dedup key (field dd) wherever it is placed. Tokens of earlier versions
# are hex only, so a pointer with one names a job that may not carry it (identity_check.lua).
HELD_TOKEN_MARK = "k"
# How long a producer waits on the server before it looks at a pointer's job again (s).
_LOOK_AGAIN_S = 0.02
# Rounds of deciding identities before an add gives up: each round that fails saw another add
# settle an identity it shares, so a few are enough; many mean something is badly wrong.
_ROUNDS = 100


def reserve_identity(home: QueueKeys, what: str, name: str, pointer: str, ttl_ms: int = 0,
                     strategy: str = "") -> Op[list[str]]:
    """``identity_reserve.lua`` in ``home``: decide a custom id (``what`` 'id') or a dedup key
    ('dd') for an add whose job goes where ``pointer`` says. The reply as strings: ['won',
    pointer as stored], ['job', id] or ['ptr', another add's pointer]."""
    reply = yield script_call(SCRIPTS.identity_reserve, home, what, name, pointer, ttl_ms,
                              strategy)
    return [part.decode() for part in reply]


def pointed_partition(parts: Sequence[QueueKeys], home: QueueKeys, job_id: str
                      ) -> Op[QueueKeys | None]:
    """Where a custom id's job is, as its home knows: the home itself, the partition its
    pointer names, or None (no job and no pointer there)."""
    exists, pointer = yield Batch((Command(("EXISTS", home.job(job_id))),
                                   Command(("GET", home.id_pointer(job_id)))),
                                  route=home.prefix)
    if exists:
        return home
    if pointer is None:
        return None
    partition = int(pointer.split(b"\t", 1)[0])
    return parts[partition] if partition < len(parts) else None


@dataclass(frozen=True, slots=True)
class _Pointer:
    """A pointer this add wrote (to clear when its job is not the one created)."""

    home: QueueKeys
    kind: str  # 'id' | 'dd'
    name: str  # the custom id or the dedup key
    value: str  # as stored

    @property
    def job_id(self) -> str:
        return self.name if self.kind == "id" else self.value.split("\t", 1)[0]


def _fields(kind: str, name: str, value: str) -> tuple[str, int, str, str]:
    """A pointer's job id, partition, token and since."""
    if kind == "id":
        partition, token, since = value.split("\t")
        return name, int(partition), token, since
    job_id, partition, token, since = value.split("\t")
    return job_id, int(partition), token, since


def _clear(pointer: _Pointer) -> Op[bool]:
    """Clear ``pointer`` if it still stands (its token fenced, or its job not created)."""
    reply = yield script_call(SCRIPTS.identity_reserve, pointer.home, "clear", pointer.kind,
                              pointer.name, pointer.value)
    return bool(reply[0] == b"ok")


def _look(parts: Sequence[QueueKeys], pointer: _Pointer, replace_waiting: bool = False
          ) -> Op[str | None]:
    """Look at the job another add's ``pointer`` names: its id when it exists; None when it
    never will (its token is fenced now and the pointer cleared): decide again.
    ``replace_waiting``: a dedup replace, which deletes the job if it has not started."""
    job_id, partition, token, since = _fields(pointer.kind, pointer.name, pointer.value)
    if partition >= len(parts):
        # Written under a layout of more partitions (the count changes only while the queue
        # is empty): no add can arrive there any more, since every add names its layout.
        yield from _clear(pointer)
        return None
    where = parts[partition]
    while True:
        reply = yield script_call(SCRIPTS.identity_check, where, job_id, token, since, GRACE_MS,
                                  "1" if replace_waiting else "",
                                  pointer.name if pointer.kind == "dd" else "")
        if reply[0] == b"job":
            return job_id
        if reply[0] == b"gone":
            yield from _clear(pointer)
            return None
        # The add may still come: wait a little on the server (a pop of a list nobody pushes,
        # in the partition's slot), then look again.
        yield Command(("BLPOP", f"{where.prefix}idn-wait", f"{_LOOK_AGAIN_S:.3f}"))


@dataclass(slots=True)
class _Decided:
    """An add whose far identities were decided: ``job`` to add (its id fixed, a dedup key
    decided elsewhere taken off) and the pointers written for it; or ``answer``, the existing
    job the add returns instead."""

    job: NewJob
    written: list[_Pointer]
    answer: tuple[str, bool] | None = None


def is_far(parts: Sequence[QueueKeys], placed: QueueKeys, job: NewJob) -> bool:
    """Whether the job's custom id or dedup key has its home in another partition."""
    n = len(parts)
    if job.job_id and not job.unique_id and route(n, job.job_id) != placed.partition:
        return True
    return bool(job.dedup_key) and route(n, key="dd:" + job.dedup_key) != placed.partition


def _decide(parts: Sequence[QueueKeys], placed: QueueKeys, job: NewJob, token: str
            ) -> Op[_Decided | None]:
    """Step 1 for one job (see the module docstring): its custom id first, then its dedup key,
    each in its home when that is not ``placed``. None: another add settled an identity
    meanwhile; decide again."""
    n = len(parts)
    written: list[_Pointer] = []
    if job.job_id and not job.unique_id and (home := route(n, job.job_id)) != placed.partition:
        kind, state = "id", (yield from reserve_identity(
            parts[home or 0], "id", job.job_id, f"{placed.partition}\t{token}\t0"))
        if state[0] == "job":
            return _Decided(job, written, (job.job_id, False))
        pointer = _Pointer(parts[home or 0], kind, job.job_id, state[1])
        if state[0] == "ptr":
            found = yield from _look(parts, pointer)
            return None if found is None else _Decided(job, written, (found, False))
        written.append(pointer)
    if job.dedup_key and (home := route(n, key="dd:" + job.dedup_key)) != placed.partition:
        if job.job_id and not job.unique_id and not written:
            # The id's home is this partition, where the add script looks at it, but only
            # after the dedup key was decided: an id that names a job is returned first.
            named = yield from _id_here(parts, placed, job.job_id)
            if named != "":
                return None if named is None else _Decided(job, [], (named, False))
        job_id = job.job_id or (yield from _new_id(placed, n))
        state = yield from reserve_identity(
            parts[home or 0], "dd", job.dedup_key, f"{job_id}\t{placed.partition}\t{token}\t0",
            job.dedup_ttl_ms, job.dedup_strategy)
        if state[0] != "won":
            yield from _clear_all(written)
        if state[0] == "job":
            return _Decided(job, [], (state[1], False))
        pointer = _Pointer(parts[home or 0], "dd", job.dedup_key, state[1])
        if state[0] == "ptr":
            answer = yield from _settle_dedup(parts, pointer, job)
            return None if answer is None else _Decided(job, [], answer)
        written.append(pointer)
        # Decided here: the job carries its key (dd, so that the pointer's check can tell it
        # from a later job under its id), and its partition keeps no record of it.
        job = replace(job, job_id=job_id, dedup_ttl_ms=0, dedup_strategy="held")
    return _Decided(job, written)


def _id_here(parts: Sequence[QueueKeys], home: QueueKeys, job_id: str) -> Op[str | None]:
    """Whether custom id ``job_id``, whose home is ``home``, names a job: its id (the job is in
    ``home``, or where the pointer there names); '' when it names none; None when a stale
    pointer was just cleared (decide again)."""
    exists, pointer = yield Batch((Command(("EXISTS", home.job(job_id))),
                                   Command(("GET", home.id_pointer(job_id)))),
                                  route=home.prefix)
    if exists:
        return job_id
    if pointer is None:
        return ""
    return (yield from _look(parts, _Pointer(home, "id", job_id, pointer.decode())))


def _settle_dedup(parts: Sequence[QueueKeys], pointer: _Pointer, job: NewJob
                  ) -> Op[tuple[str, bool] | None]:
    """Another add's dedup ``pointer`` stands where ``job`` wants its dedup key: the job the
    add returns (keep, extend), or None to decide again (the pointer is gone; a replace took its
    job out of the way, or left a started one to run beside the new one)."""
    replacing = job.dedup_strategy == "replace"
    found = yield from _look(parts, pointer, replace_waiting=replacing)
    if found is None:
        return None
    if replacing:
        yield from _clear(pointer)
        return None
    if job.dedup_strategy == "extend":
        reply = yield script_call(SCRIPTS.identity_reserve, pointer.home, "extend", "dd",
                                  pointer.name, pointer.value, job.dedup_ttl_ms)
        if reply[0] != b"ok":
            return None
    return found, False


def _new_id(placed: QueueKeys, n: int) -> Op[str]:
    """A generated id for a job to add in ``placed``, made as the add script makes one (the
    partition's counter times the count, plus its index), ahead of the add: its dedup key's
    pointer names it."""
    counter = yield Command(("HINCRBY", placed.meta, "id", 1))
    return str(int(counter) * n + placed.partition)


def _clear_all(pointers: Sequence[_Pointer]) -> Op[None]:
    for pointer in pointers:
        yield from _clear(pointer)


def add_placed(parts: Sequence[QueueKeys], placed: QueueKeys, jobs: Sequence[NewJob],
               mode: str, durable_timeout_ms: int | None = None
               ) -> Op[list[tuple[str, bool]]]:
    """Add ``jobs`` to partition ``placed`` in one call of the add script, each custom id and
    dedup key deciding first in its home (step 1 of the module docstring) when that is another
    partition; (id, created) per job, in order. On a queue of one partition, the plain add."""
    if len(parts) == 1:
        return (yield from _add.add_jobs(placed, jobs, mode, durable_timeout_ms))
    # The add script checks dependencies before identities; a far identity is decided before
    # the add script sees the job, so its dependencies are checked here first: an add naming
    # an unknown one is refused even when its id or dedup key names a job.
    if any(is_far(parts, placed, job) for job in jobs):
        yield from _check_dependencies(placed, jobs)
        _check_keys(placed, jobs, mode)
    answered: dict[int, tuple[str, bool]] = {}
    for _ in range(_ROUNDS):
        chosen: dict[int, tuple[NewJob, str]] = {}  # each job to send, and its token
        written: dict[int, list[_Pointer]] = {}
        settled = True
        # A dedup replace deletes the job it replaces when it is decided: the far ones are
        # decided last, once what the others answered is known to be no refusal (an item
        # waiting for an answered job of another partition), so that a refused add deletes
        # nothing. A replace itself answers with no existing job.
        for replacing in (False, True):
            for index, job in enumerate(jobs):
                if index in answered or index in chosen:
                    continue
                token = ""
                if is_far(parts, placed, job):
                    if (job.dedup_strategy == "replace") != replacing:
                        continue
                    token = HELD_TOKEN_MARK + uuid.uuid4().hex
                    decided = yield from _decide(parts, placed, job, token)
                    if decided is None:
                        settled = False
                        break
                    if decided.answer is not None:
                        answered[index] = decided.answer
                        continue
                    job, written[index] = decided.job, decided.written
                    # The job keeps where its id's pointer is, to have it cleared when deleted.
                    token += "".join(f"\t{p.home.partition}" for p in decided.written
                                     if p.kind == "id")
                chosen[index] = (job, token)
            if not settled:
                break
            try:
                sending = [i for i in range(len(jobs)) if i not in answered]
                items = yield from _resolve_answered(
                    parts, placed, jobs, answered, sending,
                    [chosen[i][0] if i in chosen else jobs[i] for i in sending])
            except ConfigError:
                for pointers in written.values():
                    yield from _clear_all(pointers)
                raise
        if not settled:
            for pointers in written.values():
                yield from _clear_all(pointers)
            continue
        tokens = [chosen[i][1] for i in sending]
        if not items:
            return [answered[i] for i in range(len(jobs))]
        try:
            added = yield from _add.add_jobs(placed, items, mode, durable_timeout_ms, tokens)
        except ConfigError as exc:
            # Refused, so nothing was written: this round's pointers name jobs that will not
            # come. A refusal over identities is decided again, after looking at the job that
            # another add's pointer names (it may be the answer); any other is the caller's.
            for pointers in written.values():
                yield from _clear_all(pointers)
            if not isinstance(exc, IdentityElsewhere | IdentityFenced):
                raise
            if isinstance(exc, IdentityElsewhere):
                index = sending[exc.index]
                pointer = _Pointer(placed, exc.kind, exc.name, exc.pointer)
                if exc.kind == "dd":
                    answer = yield from _settle_dedup(parts, pointer, jobs[index])
                else:
                    found = yield from _look(parts, pointer)
                    answer = None if found is None else (found, False)
                if answer is not None:
                    answered[index] = answer
            continue
        for index, item in zip(sending, added, strict=True):
            answered[index] = item
            # A pointer stands only for the job it names: the id's while that job is the one
            # returned, the dedup key's only when the job was created (an existing id is
            # returned without touching the dedup key).
            for pointer in written.get(index, ()):
                if item[0] != pointer.job_id or (pointer.kind == "dd" and not item[1]):
                    yield from _clear(pointer)
        return [answered[i] for i in range(len(jobs))]
    raise PanqueueError(f"queue {placed.name!r}: the ids or dedup keys of the jobs to add did "
                        f"not settle in {_ROUNDS} rounds (other adds kept taking them over)")


def _check_keys(placed: QueueKeys, jobs: Sequence[NewJob], mode: str) -> None:
    """Refuse, with the add script's words, a key the mode the add names does not take: a far
    identity's decision can delete a job (a dedup replace), and the add script, which checks
    the same, runs after it."""
    for index, job in enumerate(jobs):
        if mode == "keyed" and not job.key:
            raise ConfigError(f"queue {placed.name!r}: item {index}: queue is keyed: "
                              "add(..., key=...) is required")
        if mode == "global" and job.key:
            raise ConfigError(f"queue {placed.name!r}: item {index}: key= needs a keyed queue "
                              "(mode='keyed'); this queue is global")


def _check_dependencies(placed: QueueKeys, jobs: Sequence[NewJob]) -> Op[None]:
    """Refuse (:class:`ConfigError`) a dependency that is neither a job of ``placed`` nor an
    earlier job of ``jobs``, with the add script's words."""
    earlier: set[str] = set()
    asked: list[tuple[int, str]] = []
    for index, job in enumerate(jobs):
        asked += [(index, dep) for dep in job.depends_on if dep not in earlier]
        if job.job_id:
            earlier.add(job.job_id)
    if not asked:
        return
    found = yield Batch(tuple(Command(("EXISTS", placed.job(dep))) for _, dep in asked),
                        route=placed.prefix)
    for (index, dep), exists in zip(asked, found, strict=True):
        if not int(exists):
            raise ConfigError(f"queue {placed.name!r}: item {index}: dependency {dep} is not a "
                              "job of this queue")


def _resolve_answered(parts: Sequence[QueueKeys], placed: QueueKeys, jobs: Sequence[NewJob],
                      answered: dict[int, tuple[str, bool]], sending: Sequence[int],
                      items: list[NewJob]) -> Op[list[NewJob]]:
    """``items`` (the jobs of ``sending``) with each dependency on an earlier job that was
    answered here (its identity named an existing job) turned into that job's id, as the add
    script does for the items it resolves itself. :class:`ConfigError` when that job is in
    another partition than ``placed``: its dependents go to ``placed`` and cannot wait for it."""
    requested = {jobs[index].job_id: index for index in answered if jobs[index].job_id}
    if not requested:
        return items
    resolved = []
    for index, job in zip(sending, items, strict=True):
        deps = []
        for dep in job.depends_on:
            earlier = requested.get(dep)
            if earlier is None or earlier > index:
                deps.append(dep)
                continue
            found = answered[earlier][0]
            if not (yield Command(("EXISTS", placed.job(found)))):
                where = yield from pointed_partition(parts, parts[route(len(parts), found) or 0],
                                                     found)
                elsewhere = "another partition" if where is None else \
                    f"partition {where.partition}"
                named = f"job_id {dep!r} names a job" if found == dep else \
                    f"dedup key names job {found!r}"
                raise ConfigError(
                    f"queue {placed.name!r}: item {earlier}: {named} of {elsewhere}, not of "
                    f"this flow's partition {placed.partition}, so item {index}, which depends "
                    "on it, cannot wait for it (a job waits only for jobs of its own "
                    "partition; see docs/scaling.md); nothing was added")
            deps.append(found)
        resolved.append(job if deps == list(job.depends_on) else
                        replace(job, depends_on=tuple(deps)))
    return resolved


def forget_deleted(parts: Sequence[QueueKeys], keys: QueueKeys) -> Op[int]:
    """Clear, in their custom ids' homes, the pointers to jobs deleted in partition ``keys``
    (removed, trimmed by retention, replaced: ``lib/finish.lua`` delete_job queues them in its
    ``id_outbox``); a pointer that another add has replaced since is left alone. Returns how
    many were handled. Any worker may run it at any time: each entry is cleared at most once
    in effect, and leaves the outbox only once its pointer is dealt with."""
    entries = yield Command(("ZRANGE", keys.id_outbox, 0, _FORGET_BATCH - 1))
    for entry in entries:
        job_id, home, token = entry.decode().rsplit("\t", 2)
        if int(home) < len(parts):
            yield script_call(SCRIPTS.identity_reserve, parts[int(home)], "forget", job_id,
                              f"{keys.partition}\t{token}")
    if entries:
        yield Command(("ZREM", keys.id_outbox, *entries))
    return len(entries)
