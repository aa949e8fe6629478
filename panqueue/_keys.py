"""The Redis key layout of one queue.

Every key of queue ``X`` starts with ``{q:X}:`` so that Redis Cluster keeps them in one hash slot
and a Lua script can touch all of them atomically. Scripts receive the prefix as their only key
and derive the rest (``_store/lua/lib/layout.lua``; ``tests/test_lua_layout.py`` holds the two
layouts together).
"""

from __future__ import annotations

from panqueue.errors import ConfigError

__all__ = ["BatchKeys", "QueueKeys", "check_job_id", "check_queue_name"]

_MAX_NAME = 200
_MAX_JOB_ID = 256


def check_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue id, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"queue name must be a non-empty str, got {name!r}")
    if len(name) > _MAX_NAME:
        raise ConfigError(f"queue name {name[:40]!r}... is longer than {_MAX_NAME} characters")
    if any(c in name for c in "{}") or not name.isprintable() or name != name.strip():
        raise ConfigError(
            f"queue name {name!r} may not contain braces, control characters or "
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


class QueueKeys:
    """Names of the keys and the notify channel of one queue."""

    __slots__ = ("active", "batch_outbox", "batches", "blocked", "cancelled", "completed",
                 "delayed", "events", "expires", "failed", "history", "idle", "key_active",
                 "limited", "meta", "name", "notify", "prefix", "rate", "ready", "schedules",
                 "wait", "worker_info", "workers")

    def __init__(self, name: str) -> None:
        self.name = check_queue_name(name)
        self.prefix = f"{{q:{name}}}:"
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
