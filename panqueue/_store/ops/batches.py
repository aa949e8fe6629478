"""Batches: groups of jobs, in any queues, with a callback job added once all of them ended.

A batch's state lives in a hash slot of its own (``{b:<id>}``, lua/lib/batch_layout.lua); a
job's ending happens in its queue's slot, so it reaches the batch in two steps: ``end_job``
leaves it in the queue's batch outbox (lua/lib/finish.lua), and :func:`relay` hands the outbox
to ``batch_record.lua`` and then empties it; a queue of several partitions has an outbox per
partition, and the batch notes the partitions its jobs went to. Every step can be repeated: a
job counts once, a batch fires once (``fired``), and a callback queue adds a batch's callbacks
only while it owes them (``batch_callback.lua``: while the batch is in the queue's ``batches``
set, which the same step empties), so a second firer adds nothing, even once the callback ran
and retention deleted it. Whoever sees a batch fire adds its callbacks: the relayer,
``close()``, or the sweep of a callback queue's workers (:func:`sweep_batches`), which finds a
batch whose firer died before adding them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from panqueue._codec import decode, encode
from panqueue._keys import BatchKeys, QueueKeys, route
from panqueue._store.loader import SCRIPTS, Script
from panqueue._store.ops.add import NewJob
from panqueue._store.ops.base import check_refusal
from panqueue._store.ops.identity import add_placed, pointed_partition
from panqueue._store.ops.schedules import server_time_ms
from panqueue._store.transport import Batch, Command, Op, ScriptCall
from panqueue.errors import ConfigError, PanqueueError

__all__ = ["BATCH_OPTION", "BatchInfo", "add_to_batch", "batch_info", "batch_member",
           "batch_options", "callback_id", "close_batch", "open_batch", "relay", "sweep_batches"]

# The stored option that names a job's batch (batch_options).
BATCH_OPTION = "batch"

# Outbox entries relayed per read; batches a sweep looks at per run; how long the sweep waits
# before it looks again at a batch that is still open.
RELAY_CHUNK = 1000
SWEEP_CHUNK = 100
RECHECK_MS = 30_000
# How long after a callback queue learns of a batch (open_batch) it first looks at it: longer
# than an open's last step can take to reach the server (a request's socket timeout and its one
# resend), and batch_open.lua refuses to make the batch later, so that a sweep which finds no
# batch then knows that none will be made and forgets it. (A sweep that looked while the open
# was still under way would have taken the batch for one that is gone, and the queue would owe
# its callbacks nothing when it fired.)
OPEN_GRACE_MS = 30_000


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """A batch's counts: ``total`` jobs registered, of which ``pending`` have not ended,
    ``completed`` completed and ``failed`` did not (failed, cancelled, expired, or deleted
    before they ended). ``closed``: :meth:`Batch.close` was called. Always
    ``total == pending + completed + failed``."""

    id: str
    total: int
    pending: int
    completed: int
    failed: int
    closed: bool

    def as_dict(self) -> dict[str, Any]:
        """The form the callbacks' data carries under ``"batch"``."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class _Answer:
    """What a batch script answered (lua/lib/batch_layout.lua's answer())."""

    status: str  # open | fire | done | gone
    info: BatchInfo
    on_complete: bytes = b""
    on_success: bytes = b""
    parent: str = ""


def callback_id(batch_id: str, which: str) -> str:
    """The id of a batch's callback job (``which``: "complete" or "success"): derived from
    the batch id, so adding it twice adds it once."""
    return f"batch:{batch_id}:{which}"


def _parse(batch_id: str, reply: Any) -> _Answer:
    if reply[0] == b"!":
        raise ConfigError(f"batch {batch_id!r}: {reply[1].decode()}")
    status = reply[0].decode()
    if status == "gone":
        return _Answer(status, BatchInfo(batch_id, 0, 0, 0, 0, False))
    total, completed, failed = int(reply[1]), int(reply[2]), int(reply[3])
    info = BatchInfo(batch_id, total, total - completed - failed, completed, failed,
                     reply[4] == b"1")
    return _Answer(status, info, reply[5], reply[6], reply[7].decode())


def _call(script: Script, batch_id: str, *args: Any) -> Op[_Answer]:
    reply = yield ScriptCall(script, (BatchKeys(batch_id).prefix,), args)
    return _parse(batch_id, reply)


def _fire(answer: _Answer) -> Op[None]:
    """Add the callbacks of a batch that fired, then mark them added. on_success only when
    no job failed; when it is not added and the batch is a child, its parent stops waiting
    for it (first: that is safe to repeat). Each callback queue adds what it owes the batch
    at most once (batch_callback.lua), so whoever fires the batch again after a firer died
    or stalled here adds nothing, whether or not the callback job still exists."""
    info = answer.info
    owed: dict[str, list[Any]] = {}
    for which, blob in (("complete", answer.on_complete), ("success", answer.on_success)):
        if not blob:
            continue
        queue, data = decode(blob)
        callbacks = owed.setdefault(queue, [])
        job_id = callback_id(info.id, which)
        if which == "success" and info.failed:
            if answer.parent:
                yield from _unregister(answer.parent, queue, [job_id])
            continue
        callbacks += [job_id, encode({**(data or {}), "batch": info.as_dict()}),
                      batch_options(answer.parent), answer.parent]
    for queue, callbacks in owed.items():
        keys = QueueKeys(queue)
        check_refusal(keys, (yield ScriptCall(SCRIPTS.batch_callback, (keys.prefix,),
                                              (info.id, *callbacks))))
    yield from _call(SCRIPTS.batch_added, info.id)


def _settle(answer: _Answer) -> Op[None]:
    if answer.status == "fire":
        yield from _fire(answer)


def _unregister(batch_id: str, queue: str, ids: Sequence[str]) -> Op[None]:
    if ids:
        yield from _settle((yield from _call(SCRIPTS.batch_unregister, batch_id, queue, *ids)))


def batch_options(batch_id: str, options: bytes = b"") -> bytes:
    """A job's stored options with its batch (under :data:`BATCH_OPTION`, which the claim reads
    back as the claimed job's ``batch``: the worker that ends it relays the ending at once,
    panqueue/_runtime/upkeep.py); a job outside any batch keeps its options as they were."""
    if not batch_id:
        return options
    return encode({**(decode(options) if options else {}), BATCH_OPTION: batch_id})


def batch_member(job: NewJob, batch_id: str, job_id: str, plain_options: bytes) -> NewJob:
    """``job`` as a job of the batch, under ``job_id``. ``plain_options``: the stored options
    of a job that has none of its own (``batch_options(batch_id)``, encoded once per batch)."""
    options = batch_options(batch_id, job.options) if job.options else plain_options
    return dataclasses.replace(job, job_id=job_id, options=options, batch=batch_id,
                               unique_id=False)


def open_batch(batch_id: str, on_complete: tuple[str, Any],
               on_success: tuple[str, Any] | None, parent: str) -> Op[BatchInfo]:
    """Create a batch. A child batch's callbacks join its parent first (a parent that cannot
    take them refuses before anything is written), so the parent cannot fire without them;
    then the callbacks' queues learn of the batch (their workers' sweep adds the callbacks if
    whoever fires the batch dies first), from :data:`OPEN_GRACE_MS` on, and the batch is made,
    no later than that."""
    callbacks = [("complete", on_complete)] + ([("success", on_success)] if on_success else [])
    for which, (queue, _data) in callbacks:
        if (yield Command(("HGET", QueueKeys(queue).meta, "mode"))) == b"keyed":
            raise ConfigError(f"on_{which}: queue {queue!r} is keyed, and a batch's callback "
                              "is added without a key: send it to a global queue")
    if parent:
        # A callback is added to its queue's first partition (where the queue's "batches"
        # set guards the add).
        yield from _call(SCRIPTS.batch_register, parent, on_complete[0], "1",
                         _outbox(QueueKeys(on_complete[0])), callback_id(batch_id, "complete"))
        if on_success:
            yield from _call(SCRIPTS.batch_register, parent, on_success[0], "1",
                             _outbox(QueueKeys(on_success[0])), callback_id(batch_id, "success"))
    last_moment = (yield from server_time_ms()) + OPEN_GRACE_MS
    for _, (queue, _data) in callbacks:
        yield Command(("ZADD", QueueKeys(queue).batches, last_moment, batch_id))
    answer = yield from _call(SCRIPTS.batch_open, batch_id, encode(list(on_complete)),
                              encode(list(on_success)) if on_success else b"", parent,
                              last_moment)
    return answer.info


def add_to_batch(batch_id: str, keys: QueueKeys, jobs: Sequence[NewJob],
                 mode: str = "", parts: Sequence[QueueKeys] = ()) -> Op[list[tuple[str, bool]]]:
    """Register ``jobs`` (made by :func:`batch_member`) in the batch, then add them to ``keys``,
    a partition of ``parts`` (every partition of the queue; none: ``keys`` is the only one),
    each identity decided as a plain add decides it (:func:`identity.add_placed`). A job the
    add did not create (its id or dedup key named a job outside the batch), or an add that
    failed, is taken back out, so the batch never waits for a job that is not in it."""
    parts = parts or (keys,)
    ids = [job.job_id or "" for job in jobs]
    reply = yield ScriptCall(SCRIPTS.batch_register, (BatchKeys(batch_id).prefix,),
                             (keys.name, "0", _outbox(keys), *ids))
    _parse(batch_id, reply)
    # The batch counts each id once: an id whose ending it recorded may be returned as the job
    # it names, but the add refuses to create it again (a tab before the batch id says so). A
    # failed add takes back only the ids this call made members.
    known = {raw.decode()[1:]: raw[:1] == b"e" for raw in reply[8:]}
    ended = {job_id for job_id, has_ended in known.items() if has_ended}
    fresh = [i for i in ids if i not in known]
    if ended:
        jobs = [dataclasses.replace(job, batch="\t" + job.batch) if job.job_id in ended
                else job for job in jobs]
    try:
        added = yield from add_placed(parts, keys, jobs, mode)
    except ConfigError:  # refused: nothing was written
        yield from _unregister(batch_id, keys.name, fresh)
        raise
    except PanqueueError:  # the add may or may not have run: keep the jobs that exist
        yield from _unregister(batch_id, keys.name, (yield from _absent(keys, fresh)))
        raise
    existing = [(wanted, got) for wanted, (got, created) in zip(ids, added, strict=True)
                if not created]
    if existing:
        yield from _unregister(batch_id, keys.name,
                               (yield from _outsiders(batch_id, parts, keys, existing)))
    return added


def _absent(keys: QueueKeys, ids: Sequence[str]) -> Op[list[str]]:
    if not ids:
        return []
    found = yield Batch(tuple(Command(("EXISTS", keys.job(i))) for i in ids), route=keys.prefix)
    return [i for i, exists in zip(ids, found, strict=True) if not int(exists)]


def _outsiders(batch_id: str, parts: Sequence[QueueKeys], keys: QueueKeys,
               existing: Sequence[tuple[str, str]]) -> Op[list[str]]:
    """Of the registered ids whose add returned an existing job, those that are not that job
    in this batch (an add resent after a lost reply finds its own job: that one stays). On a
    partitioned queue the job returned may be in another partition, where its id's home
    points."""
    places = []
    for _, got in existing:
        where = keys
        if len(parts) > 1:
            home = parts[route(len(parts), got) or 0]
            where = (yield from pointed_partition(parts, home, got)) or keys
        places.append(where)
    owners = yield Batch(tuple(Command(("HGET", where.job(got), "b"))
                               for where, (_, got) in zip(places, existing, strict=True)))
    return [wanted for (wanted, got), owner in zip(existing, owners, strict=True)
            if wanted != got or owner != batch_id.encode()]


def relay(keys: QueueKeys) -> Op[int]:
    """Hand the endings in the queue's batch outbox to their batches, add the callbacks of the
    batches that fire, then remove the entries. Returns how many entries were relayed. Any
    number of relayers may run at once: each step is repeatable."""
    return (yield from _relay_outbox(keys.name, keys.batch_outbox))


def _relay_outbox(queue: str, outbox: str) -> Op[int]:
    """:func:`relay` of the outbox ``outbox`` (of a partition of ``queue``)."""
    relayed = 0
    refused: ConfigError | None = None
    while True:
        entries = yield Command(("ZRANGE", outbox, 0, RELAY_CHUNK - 1))
        by_batch: dict[str, list[str]] = {}
        for entry in entries:
            batch_id, job_id, state = entry.decode().split("\t")
            by_batch.setdefault(batch_id, []).extend((job_id, state))
        for batch_id, pairs in by_batch.items():
            answer = yield from _call(SCRIPTS.batch_record, batch_id, queue, *pairs)
            try:
                yield from _settle(answer)
            except ConfigError as exc:
                # A callback its queue refuses must not hold up the endings of other batches:
                # this one stays due, and the callback queue's sweep tries it again.
                refused = refused or exc
        if entries:
            yield Command(("ZREM", outbox, *entries))
            relayed += len(entries)
        if len(entries) < RELAY_CHUNK:
            if refused is not None:
                raise refused
            return relayed


def _relay_queues(batch_id: str) -> Op[None]:
    """Relay the outboxes of every queue partition the batch has jobs in (endings no worker
    relayed yet: a cancel from a client, a queue without a worker)."""
    members = yield Command(("SMEMBERS", BatchKeys(batch_id).queues))
    for member in sorted(members):
        # A batch opened before the batches named their outboxes names only the queue: its
        # jobs are in the queue's first partition.
        queue, _, outbox = member.decode().partition("\t")
        yield from _relay_outbox(queue, outbox or QueueKeys(queue).batch_outbox)


def _outbox(keys: QueueKeys) -> str:
    """How a batch names an outbox that its jobs' endings go to: ``"<queue>\t<outbox key>"``,
    the key of the jobs' own partition, whichever way the queue names its partitions."""
    return f"{keys.name}\t{keys.batch_outbox}"


def close_batch(batch_id: str) -> Op[BatchInfo]:
    """Close the batch; when every job already ended, it fires now and its callbacks are
    added before this returns."""
    yield from _relay_queues(batch_id)
    answer = yield from _call(SCRIPTS.batch_close, batch_id)
    yield from _settle(answer)
    return answer.info


def batch_info(batch_id: str) -> Op[BatchInfo]:
    """The batch's counts, with every ending that happened so far (the outboxes of its queues
    are relayed first). Raises :class:`ConfigError` when there is no such batch."""
    yield from _relay_queues(batch_id)
    answer = yield from _call(SCRIPTS.batch_info, batch_id)
    if answer.status == "gone":
        raise ConfigError(f"batch {batch_id!r}: no such batch (it was never opened, or it "
                          "expired)")
    return answer.info


def sweep_batches(keys: QueueKeys) -> Op[int]:
    """Look at the batches whose callbacks go to this queue and are due a look: add the
    callbacks of one that fired (its firer died before adding them), forget one that is done
    or gone, relay the outboxes of one still open and look again later. Returns how many
    batches were looked at."""
    now = yield from server_time_ms()
    due = yield Command(("ZRANGE", keys.batches, "-inf", now, "BYSCORE", "LIMIT", 0,
                         SWEEP_CHUNK))
    refused: ConfigError | None = None
    for raw in due:
        batch_id = raw.decode()
        try:
            answer = yield from _call(SCRIPTS.batch_info, batch_id)
            if answer.status == "open":
                yield from _relay_queues(batch_id)
                answer = yield from _call(SCRIPTS.batch_info, batch_id)
            if answer.status != "open":
                yield from _settle(answer)
                yield Command(("ZREM", keys.batches, batch_id))
                continue
        except ConfigError as exc:  # a refused callback: look again later, go on with others
            refused = refused or exc
        yield Command(("ZADD", keys.batches, "XX", now + RECHECK_MS, batch_id))
    if refused is not None:
        raise refused
    return len(due)
