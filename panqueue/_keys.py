"""The Redis key layout of one queue.

Every key of queue ``X`` starts with ``{q:X}:`` so that Redis Cluster keeps them in one hash slot
and a Lua script can touch all of them atomically. Scripts receive the prefix as their only key
and derive the rest (``_store/lua/lib/layout.lua``; ``tests/test_lua_layout.py`` holds the two
layouts together).

A queue with ``partitions=N`` is N such layouts: partition 0 is ``{q:X}:`` (so a one-partition
queue is exactly the plain layout) and partition ``i`` is ``{q:X#i}:``. Each is a hash slot of its
own, so Redis Cluster spreads them over its masters. Which partition holds a job is a pure
function of the partition count (:func:`route`).
"""

from __future__ import annotations

import zlib

from panqueue.errors import ConfigError

__all__ = ["MAX_PARTITIONS", "BatchKeys", "QueueKeys", "check_job_id", "check_partitions",
           "check_queue_name", "partition_keys", "route"]

_MAX_NAME = 200
_MAX_JOB_ID = 256
MAX_PARTITIONS = 1024


def check_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue id, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"queue name must be a non-empty str, got {name!r}")
    if len(name) > _MAX_NAME:
        raise ConfigError(f"queue name {name[:40]!r}... is longer than {_MAX_NAME} characters")
    if any(c in name for c in "{}#") or not name.isprintable() or name != name.strip():
        raise ConfigError(
            f"queue name {name!r} may not contain braces, '#', control characters or "
            "leading/trailing spaces"
        )
    return name


def check_job_id(job_id: object) -> str:
    """Return a custom job id if valid. Purely numeric ids are reserved for generated ids."""
    if not isinstance(job_id, str) or not job_id:
        raise ConfigError(f"job_id must be a non-empty str, got {job_id!r}")
    if len(job_id) > _MAX_JOB_ID:
        raise ConfigError(f"job_id {job_id[:40]!r}... is longer than {_MAX_JOB_ID} characters")
    if job_id.isdigit():
        raise ConfigError(
            f"job_id {job_id!r} is all digits; those ids are reserved for generated ids "
            "(prefix it, for example 'order-" + job_id + "')"
        )
    if not job_id.isprintable():
        raise ConfigError(f"job_id {job_id!r} contains control characters")
    return job_id


def check_partitions(n: object) -> int:
    """Return a valid partition count, else raise :class:`ConfigError`."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTITIONS:
        raise ConfigError(f"partitions must be an int between 1 and {MAX_PARTITIONS}, got {n!r}")
    return n


def route(n: int, job_id: str | None = None, key: str | None = None) -> int | None:
    """The partition (of ``n``) that holds a job: by its concurrency ``key`` in keyed mode (a
    key lives in one partition, so per-key limits hold exactly), else by its id: a generated id
    (all digits) carries its partition as ``id % n`` (the add script makes it so), a custom id
    goes where its CRC-32 says, so adding it again finds it. None: the job has neither, any
    partition will do (the producer spreads such jobs)."""
    if n == 1:
        return 0
    if key:
        return zlib.crc32(key.encode()) % n
    if job_id:
        return int(job_id) % n if job_id.isdigit() else zlib.crc32(job_id.encode()) % n
    return None


def partition_keys(name: str, n: int) -> list[QueueKeys]:
    """The key layouts of every partition of queue ``name``."""
    return [QueueKeys(name, i, n) for i in range(n)]


class QueueKeys:
    """Names of the keys and the notify channel of one queue (of one partition of it)."""

    __slots__ = ("active", "batch_outbox", "batches", "blocked", "cancelled", "completed",
                 "delayed", "events", "expires", "failed", "history", "idle", "key_active",
                 "limited", "meta", "name", "notify", "partition", "partitions", "prefix", "rate",
                 "ready", "schedules", "shared_rate", "wait", "worker_info", "workers")

    def __init__(self, name: str, partition: int = 0, partitions: int | None = None) -> None:
        self.name = check_queue_name(name)
        self.partition = partition
        self.partitions = partitions
        self.prefix = f"{{q:{name}#{partition}}}:" if partition else f"{{q:{name}}}:"
        self.meta = self.prefix + "meta"
        self.wait = self.prefix + "wait"
        self.delayed = self.prefix + "delayed"
        self.blocked = self.prefix + "blocked"
        self.active = self.prefix + "active"
        self.completed = self.prefix + "completed"
        self.failed = self.prefix + "failed"
        self.cancelled = self.prefix + "cancelled"
        self.events = self.prefix + "events"
        self.notify = self.prefix + "notify"
        self.schedules = self.prefix + "schedules"
        # Keyed mode: keys with waiting jobs and free capacity (round-robin order), running
        # jobs per key, and keys paused by their per-key rate limit.
        self.ready = self.prefix + "k:ready"
        self.key_active = self.prefix + "k:active"
        self.limited = self.prefix + "k:limited"
        # The global rate limit's window of recent starts.
        self.rate = self.prefix + "rl"
        # The worker registry: worker name -> when its entry expires (ZSET), and -> its record.
        self.workers = self.prefix + "workers"
        self.worker_info = self.prefix + "worker_info"
        # Idle workers waiting for a job to be handed to them (lua/lib/handoff.lua).
        self.idle = self.prefix + "idle"
        # Jobs that must start by a deadline (add's expires=), scored by it (lua/lib/expiry.lua).
        self.expires = self.prefix + "expires"
        # One record per finished job, for exports (panqueue.spark.export_history).
        self.history = self.prefix + "history"
        # Batches (panqueue/_batch.py): the endings of this queue's batch jobs waiting to be
        # relayed to their batch (ZSET "<batch>\t<job>\t<state>" -> when, lib/finish.lua), and
        # the batches whose callbacks go to this queue (ZSET batch id -> when to look again).
        self.batch_outbox = self.prefix + "batch_outbox"
        self.batches = self.prefix + "batches"
        # A partitioned queue's global rate limit: one window for every partition, in a slot
        # of its own (lua/rate_take.lua).
        self.shared_rate = f"{{q:{name}#rate}}:rl"

    @property
    def declared(self) -> str:
        """How this partition declares itself to the scripts: "<count>:<index>", or '' when
        the count is not known here (the layout of queue X alone, the first partition of
        whatever X has): the scripts then neither check nor store it."""
        return "" if self.partitions is None else f"{self.partitions}:{self.partition}"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def schedule(self, name: str) -> str:
        return f"{self.prefix}sched:{name}"

    def needs(self, job_id: str) -> str:
        """The dependencies of ``job_id`` that have not completed yet (a SET)."""
        return f"{self.prefix}needs:{job_id}"

    def key_list(self, key: str) -> str:
        """Keyed mode: the list of the waiting jobs of concurrency key ``key``."""
        return f"{self.prefix}k:wait:{key}"

    def id_pointer(self, job_id: str) -> str:
        """In a custom id's home partition: where its job went when that is another partition
        (STRING, lua/lib/identity.lua)."""
        return f"{self.prefix}idn:{job_id}"


class BatchKeys:
    """Names of the keys of one batch. A batch's jobs may live in several queues, so its state
    has a hash slot of its own (``{b:<id>}``); lib/batch_layout.lua derives the same names."""

    __slots__ = ("ended", "id", "jobs", "prefix", "queues", "state")

    def __init__(self, batch_id: str) -> None:
        self.id = batch_id
        self.prefix = f"{{b:{batch_id}}}:"
        # HASH: the callbacks, closed, counts, fired/added marks (lib/batch_layout.lua).
        self.state = self.prefix + "state"
        # SET of "<queue>\t<job id>": every job registered in the batch, and those that ended.
        self.jobs = self.prefix + "jobs"
        self.ended = self.prefix + "ended"
        # SET of the queues the batch's jobs were added to (whose outboxes to relay).
        self.queues = self.prefix + "queues"
