"""Adding jobs: a producer's arguments validated into a :class:`NewJob`, and the add script
that writes any number of them at once (optionally waiting for the server's fsync)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import msgpack

from panqueue._check import check_number
from panqueue._codec import encode, encode_checked
from panqueue._keys import QueueKeys, check_job_id
from panqueue._options import (
    MAX_SECONDS,
    Dedup,
    check_positive,
    check_priority,
    epoch_ms,
    options_to_wire,
)
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.base import check_refusal
from panqueue._store.transport import Batch, Command, Op, ScriptCall
from panqueue._tracing import current_carrier
from panqueue.errors import ConfigError, PanqueueError

__all__ = ["ADD_OPTIONS", "MAX_TAGS", "TRACE_OPTION", "IdentityElsewhere", "IdentityFenced",
           "NewJob", "add_call", "add_jobs", "check_tag", "check_tags", "job_alike", "new_job",
           "parse_added"]

# The keyword arguments of ``add()`` (and of the options of a flow's job).
ADD_OPTIONS = frozenset({"job_id", "delay", "run_at", "priority", "attempts", "backoff",
                         "timeout", "key", "dedup", "depends_on", "expires", "tags"})
# At most this many tags per job, each at most MAX_TAG_LENGTH characters.
MAX_TAGS = 16
MAX_TAG_LENGTH = 200
# The stored option that carries the producer's W3C trace context (traceparent, tracestate).
TRACE_OPTION = "trace"


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job to add, validated and encoded."""

    job_id: str | None
    data: bytes
    priority: int = 0
    delay_ms: int = 0
    run_at_ms: int = 0
    options: bytes = b""
    key: str = ""
    depends_on: tuple[str, ...] = ()
    dedup_key: str = ""
    dedup_ttl_ms: int = 0
    dedup_strategy: str = ""
    expires_in_ms: int = 0  # the deadline to start by, from the server's clock at the add
    expires_at_ms: int = 0  # or as an instant (ms since the epoch)
    batch: str = ""  # the batch the job belongs to (panqueue/_batch.py), registered there first
    # The client made job_id unique itself (a flow's job without one): no other add can name it,
    # so a partitioned queue need not decide it in its home (_store/ops/identity.py).
    unique_id: bool = False
    tags: tuple[str, ...] = ()  # indexed per tag in the queue's slot (lua/lib/new_job.lua)


def _expiry(expires: object) -> tuple[int, int]:
    """``expires=`` as (ms from the add, ms since the epoch); (0, 0) for none."""
    if expires is None:
        return 0, 0
    if isinstance(expires, datetime):
        if expires.tzinfo is None:
            raise ConfigError(
                f"expires must be a number of seconds or a timezone-aware datetime, got the "
                f"naive datetime {expires.isoformat()} (attach a timezone, for example "
                "datetime.now(UTC) + timedelta(minutes=5))")
        if expires.timestamp() - time.time() > MAX_SECONDS:
            raise ConfigError(f"expires must be at most {MAX_SECONDS} s (100 years) from now, "
                              f"got {expires.isoformat()}")
        return 0, epoch_ms(expires) or -1  # 0 means none: the epoch is past
    check_number(expires, "expires", expected="a number of seconds or a timezone-aware datetime")
    return max(1, int(check_positive(expires, "expires") * 1000)), 0


def check_tag(tag: object, what: str = "tag") -> str:
    """Return ``tag`` if it is a valid tag (a non-empty printable str of at most
    :data:`MAX_TAG_LENGTH` characters), else raise :class:`ConfigError`."""
    if not isinstance(tag, str) or not tag:
        raise ConfigError(f"{what} must be a non-empty str, got {tag!r}")
    if len(tag) > MAX_TAG_LENGTH:
        raise ConfigError(f"{what} {tag[:40]!r}... is longer than {MAX_TAG_LENGTH} characters")
    if not tag.isprintable():
        raise ConfigError(f"{what} {tag!r} contains control characters")
    return tag


def check_tags(tags: object) -> tuple[str, ...]:
    """``add(..., tags=)`` as a tuple of distinct valid tags, in the order given."""
    if tags is None:
        return ()
    if isinstance(tags, str | bytes) or not isinstance(tags, list | tuple | set | frozenset):
        raise ConfigError(f"tags must be a list of str, got {tags!r}")
    unique = tuple(dict.fromkeys(check_tag(tag) for tag in tags))
    if len(unique) > MAX_TAGS:
        raise ConfigError(f"a job has at most {MAX_TAGS} tags, got {len(unique)}")
    return unique


def new_job(defaults: dict[str, Any], data: Any, options: dict[str, Any]) -> NewJob:
    """Validate one add's arguments (``options``, over the queue's ``defaults``; ``None``
    means "not given") into what the add script takes. Raises :class:`ConfigError` or
    :class:`PayloadError` naming the bad argument."""
    unknown = set(options) - ADD_OPTIONS
    if unknown:
        raise ConfigError(f"unknown add() option(s): {', '.join(sorted(unknown))}")
    o = {**defaults, **{k: v for k, v in options.items() if v is not None}}
    job_id = o.get("job_id")
    if job_id is not None:
        check_job_id(job_id)
    priority = check_priority(o.get("priority", 0))
    delay_ms = 0
    run_at_ms = 0
    if o.get("run_at") is not None:
        run_at = o["run_at"]
        if not isinstance(run_at, datetime) or run_at.tzinfo is None:
            raise ConfigError(f"run_at must be a timezone-aware datetime, got {run_at!r}")
        if run_at.timestamp() - time.time() > MAX_SECONDS:
            raise ConfigError(f"run_at must be at most {MAX_SECONDS} s (100 years) from now, "
                              f"got {run_at.isoformat()}")
        run_at_ms = epoch_ms(run_at)
    elif o.get("delay") is not None:
        delay_ms = int(check_positive(o["delay"], "delay", allow_zero=True) * 1000)
    wire = options_to_wire(o.get("attempts"), o.get("backoff"), o.get("timeout"))
    trace = current_carrier()  # the producer's span, if any: the worker's spans are its children
    if trace:
        wire[TRACE_OPTION] = trace
    key = o.get("key") or ""
    if not isinstance(key, str) or (key and not key.isprintable()):
        raise ConfigError(f"key must be a printable str, got {key!r}")
    dedup = o.get("dedup")
    if dedup is not None and not isinstance(dedup, Dedup):
        raise ConfigError(f"dedup must be a panqueue.Dedup, got {dedup!r}")
    expires_in_ms, expires_at_ms = _expiry(o.get("expires"))
    depends_on = o.get("depends_on") or ()
    if not isinstance(depends_on, list | tuple | set | frozenset) or not all(
            isinstance(d, str) and d and d.isprintable() for d in depends_on):
        raise ConfigError(f"depends_on must be a list of job ids (printable str), got "
                          f"{depends_on!r}")
    return NewJob(
        job_id=job_id,
        data=encode_checked(data, "data"),
        priority=priority,
        delay_ms=delay_ms,
        run_at_ms=run_at_ms,
        options=encode(wire) if wire else b"",
        key=key,
        depends_on=tuple(depends_on),
        dedup_key="" if dedup is None else dedup.key,
        dedup_ttl_ms=0 if dedup is None else max(1, int(dedup.ttl * 1000)),
        dedup_strategy="" if dedup is None else dedup.strategy,
        expires_in_ms=expires_in_ms,
        expires_at_ms=expires_at_ms,
        tags=check_tags(o.get("tags")),
    )


# Each field's slot setter: job_alike copies a job's fields through them, several times faster
# than frozen=True's __init__ (one checked setattr per field).
_SETTERS = {f.name: getattr(NewJob, f.name).__set__ for f in fields(NewJob)}
_SET_DATA = _SETTERS.pop("data")


def job_alike(job: NewJob, data: Any) -> NewJob:
    """``new_job`` of the same defaults and options as ``job`` with another ``data``: the
    options were validated for ``job`` already, and their outcome does not depend on the data,
    so only the data is checked and encoded (an ``add_bulk``'s items after the first). Equal
    to what ``new_job`` returns for them (tests/test_bulk_fast_path.py)."""
    encoded = encode_checked(data, "data")
    alike: NewJob = object.__new__(NewJob)
    for name, copy in _SETTERS.items():
        copy(alike, getattr(job, name))
    _SET_DATA(alike, encoded)
    return alike


class IdentityElsewhere(ConfigError):
    """The add script found that an item's custom id (``kind`` 'id') or dedup key ('dd') has
    its home in this partition and a pointer to a job in another (lua/lib/identity.lua):
    nothing was written; the producer looks at that job first (``_store/ops/identity.py``
    does; an add that cannot, raises it)."""

    def __init__(self, keys: QueueKeys, index: int, kind: str, name: str, pointer: str
                 ) -> None:
        what = "job id" if kind == "id" else "dedup key"
        super().__init__(f"queue {keys.name!r}: item {index}: the {what} {name!r} names a job "
                         "of another partition; nothing was added")
        self.index, self.kind, self.name, self.pointer = index, kind, name, pointer


class IdentityFenced(ConfigError):
    """An item's identity token was fenced in its partition (another add took the identity
    over): nothing was written; the producer decides the identity again."""

    def __init__(self, keys: QueueKeys, index: int) -> None:
        super().__init__(f"queue {keys.name!r}: item {index}: its job id or dedup key was "
                         "taken over by another add; nothing was added")
        self.index = index


# A job's fields but its data as the add script takes them (lua/add.lua), all at their defaults:
# what an item's '' stands for when no item comes before it.
_DEFAULT_FIELDS = ("", 0, 0, 0, b"", "", "", "", 0, "", 0, 0, "", "")
# The fields go as msgpack's raw strings, bytes and str alike: the server's cmsgpack reads no
# bin type.
_pack_fields = msgpack.Packer(use_bin_type=False).pack


def add_call(keys: QueueKeys, jobs: Sequence[NewJob], mode: str = "",
             tokens: Sequence[str] = ()) -> ScriptCall:
    """The add script's call for ``jobs`` (``mode``: the mode the producer expects, '' for
    any; ``tokens``: each job's identity token, when a pointer in another partition names it,
    lua/lib/identity.lua)."""
    args: list[Any] = [len(jobs), mode, keys.declared]
    before: tuple[Any, ...] = _DEFAULT_FIELDS
    for job in jobs:
        fields = (job.job_id or "", job.priority, job.delay_ms, job.run_at_ms, job.options,
                  job.key, encode(list(job.depends_on)) if job.depends_on else "",
                  job.dedup_key, job.dedup_ttl_ms, job.dedup_strategy, job.expires_in_ms,
                  job.expires_at_ms, job.batch, "\n".join(job.tags))
        # An add_bulk's items share their fields: each after the first is its data and ''.
        args += [job.data, "" if fields == before else _pack_fields(fields)]
        before = fields
    if any(tokens):
        args += tokens
    return ScriptCall(SCRIPTS.add, (keys.prefix,), tuple(args))


def parse_added(keys: QueueKeys, reply: Any) -> list[tuple[str, bool]]:
    """The add script's reply: (job id, created) per job, in order."""
    check_refusal(keys, reply)
    # The markers hold a tab, which no job id does (ids are printable).
    if reply and reply[0] == b"\t?":
        kind, name, pointer = (part.decode() for part in reply[2:5])
        raise IdentityElsewhere(keys, int(reply[1]), kind, name, pointer)
    if reply and reply[0] == b"\t~":
        raise IdentityFenced(keys, int(reply[1]))
    return [(reply[i].decode(), bool(reply[i + 1])) for i in range(0, len(reply), 2)]


def add_jobs(keys: QueueKeys, jobs: Sequence[NewJob], mode: str = "",
             durable_timeout_ms: int | None = None, tokens: Sequence[str] = ()
             ) -> Op[list[tuple[str, bool]]]:
    """Add jobs in one script call. With ``durable_timeout_ms``, also wait (on the same
    connection) until the server reports the write fsynced to its append-only file and, when
    the server has replicas, until one replica has received it: a failover then promotes a
    replica that holds the job. ``tokens``: see :func:`add_call`."""
    call = add_call(keys, jobs, mode, tokens)
    if durable_timeout_ms is None:
        reply = yield call
        return parse_added(keys, reply)
    # Every request below goes to the server that holds the queue: on Redis Cluster, commands
    # without keys (INFO, WAITAOF, WAIT) would otherwise reach an arbitrary master.
    try:
        server, persistence, replication = yield Batch(
            (Command(("INFO", "server")), Command(("INFO", "persistence")),
             Command(("INFO", "replication"))), route=keys.prefix)
    except PanqueueError as exc:
        if "no permissions" not in str(exc).lower():
            raise
        raise ConfigError("durable=True reads the server's INFO (its version, persistence and "
                          "replicas), which this user may not run: grant it +info (see "
                          "docs/connections.md); nothing was added") from None
    version = tuple(int(part) for part in str(server.get("redis_version", "0.0")).split(".")[:2])
    if version < (7, 2):  # Valkey reports 7.2.x here too, and has WAITAOF
        raise ConfigError("durable=True needs a server with WAITAOF (Redis >= 7.2 or Valkey >= "
                          "8.0); this one has none, so nothing was added")
    if not int(persistence.get("aof_enabled", 0)):
        raise ConfigError("durable=True needs the server's append-only file (appendonly yes); "
                          "it is off, so nothing was added")
    # WAITAOF and WAIT wait for the writes of *this connection*: send them with the add in one
    # pipeline (the batch sends the script with EVAL, so a server without it cached cannot fail
    # the pipeline). The server runs them one after the other, so with a replica each gets half
    # the time, and the whole stays within the socket timeout. (The replicas are INFO's: a
    # connection's WAIT 0 0 counts those that acknowledged its own last write, none shortly
    # after it wrote.)
    replicas = int(replication.get("connected_slaves", 0))
    wait_ms = durable_timeout_ms // 2 if replicas else durable_timeout_ms
    waits: tuple[Command, ...] = (Command(("WAITAOF", 1, 0, wait_ms)),)
    if replicas:
        waits += (Command(("WAIT", 1, wait_ms)),)
    reply, persisted, *replicated = yield Batch((call, *waits), route=keys.prefix)
    added = parse_added(keys, reply)
    ids = ", ".join(i for i, _ in added)
    if int(persisted[0]) < 1:
        raise PanqueueError(
            f"queue {keys.name!r}: the job(s) {ids} were added, but the server did not confirm "
            f"an fsync within {wait_ms} ms")
    if replicated and int(replicated[0]) < 1:
        raise PanqueueError(
            f"queue {keys.name!r}: the job(s) {ids} were added and fsynced, but no replica "
            f"confirmed them within {wait_ms} ms (a failover now could lose them)")
    return added
