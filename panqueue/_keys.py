"""The Redis key layout of one queue.

Every key of queue ``X`` starts with ``{q:X}:`` so that Redis Cluster keeps them in one hash slot
and a Lua script can touch all of them atomically. Scripts receive the prefix as their only key
and derive the rest (``_store/lua/lib/layout.lua``; ``tests/test_lua_layout.py`` holds the two
layouts together).

An application with a key prefix (``QueueClient(url, prefix="app")``) has every tag start with
it: ``{app:q:X}:``, ``{app:b:<id>}:`` (:func:`check_prefix`). The keys built here take the
prefix in force where they are built (:func:`prefixed`, ``_PREFIX``).

A queue with ``partitions=N`` is N such layouts: partition 0 is ``{q:X}:`` (so a one-partition
queue is exactly the plain layout) and partition ``i`` is ``{q:X#<suffix>}:``, the suffix chosen
for the hash slot it lands in (:func:`partition_tags`), so that the partitions spread over the
slot space, and so over a cluster's masters, as evenly as their count allows. Queues declared
before that placement keep ``{q:X#i}:`` (:data:`LEGACY_PLACEMENT`). Which partition holds a job
is a pure function of the partition count (:func:`route`).

The layout (count, placement) is stored in the queue's home meta with a version
(:class:`Layout`); every add and every worker's setup names the version it routes by, so a
client that learned an older layout is refused and refreshes instead of writing where nobody
serves (``_store/ops/layout.py``, ``_store/ops/partitions.py``).

Longer than 400 lines: every key name of a queue and a batch (one property each, saying what
the key holds), the checks of the names that go into them, and the placement of partitions,
in one room, so that the one layout the Lua scripts mirror is read in one place.
"""

from __future__ import annotations

import binascii
import contextvars
import functools
import re
import zlib
from dataclasses import dataclass, field

from panqueue._check import check_int
from panqueue.errors import ConfigError

__all__ = ["CLUSTER_SLOTS", "LEGACY_PLACEMENT", "MAX_PARTITIONS", "SPREAD_PLACEMENT", "BatchKeys",
           "Layout", "QueueKeys", "check_job_id", "check_partitions", "check_prefix",
           "check_queue_name", "hash_slot", "key_pattern", "partition_keys", "partition_tags",
           "prefixed", "route"]

_MAX_NAME = 200
_MAX_JOB_ID = 256
MAX_PARTITIONS = 1024

# The namespace (``prefix=``) the keys built here belong to: "" for none, else "<prefix>:",
# which every hash tag starts with ("{<prefix>:q:<queue>}:", "{<prefix>:b:<id>}:"). A client
# or worker names its prefix explicitly where it builds keys itself; an operation (a generator
# that a transport drives) builds them under the prefix of the transport driving it, which
# sets this variable around each step (``transport.base``), so no operation takes it as an
# argument and none can build a key outside it.
_PREFIX: contextvars.ContextVar[str] = contextvars.ContextVar("panqueue_key_prefix", default="")

_MAX_PREFIX = 64
_PREFIX_SHAPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# "q" and "b" would make "{q:q:X}" and "{b:q:X}", the tags of an unprefixed queue "q:X" and
# batch "q:X": a prefix must never name keys that another namespace can name too.
_RESERVED_PREFIXES = frozenset({"q", "b"})


def check_prefix(prefix: object) -> str | None:
    """Return a valid key prefix (None: no prefix), else raise :class:`ConfigError`.

    A prefix is letters, digits, ``_``, ``.`` and ``-`` (it starts with a letter or a digit), at
    most 64 of them: no braces (it is inside the hash tag), no colon (``{a:b:q:X}`` would be
    both prefix ``a:b`` and queue ``b:q:X`` of prefix ``a``), no glob characters (it is part of
    a SCAN pattern and of the ACL pattern that confines it)."""
    if prefix is None:
        return None
    if not isinstance(prefix, str) or not prefix:
        raise ConfigError(f"prefix must be a non-empty str, got {prefix!r}")
    if len(prefix) > _MAX_PREFIX:
        raise ConfigError(f"prefix {prefix[:40]!r}... is longer than {_MAX_PREFIX} characters")
    if not _PREFIX_SHAPE.fullmatch(prefix):
        raise ConfigError(
            f"prefix {prefix!r} may contain only letters, digits, '_', '.' and '-' (starting "
            "with a letter or a digit): no braces, colons, spaces or glob characters")
    if prefix in _RESERVED_PREFIXES:
        raise ConfigError(f"prefix {prefix!r} is reserved (it would name the keys of queues "
                          "without a prefix); choose another")
    return prefix


class prefixed:  # a class, not a generator: entered around every step of every operation
    """Build keys under ``prefix`` inside the block (see ``_PREFIX``)."""

    __slots__ = ("_namespace", "_token")

    def __init__(self, prefix: str | None) -> None:
        self._namespace = f"{prefix}:" if prefix else ""

    def __enter__(self) -> None:
        self._token = _PREFIX.set(self._namespace)

    def __exit__(self, *exc: object) -> None:
        _PREFIX.reset(self._token)


def key_pattern(kind: str, rest: str) -> str:
    """A SCAN pattern over keys of ``kind`` ("q" or "b") under the current prefix: for
    example ``key_pattern("q", "*}:meta")``."""
    return "{" + _PREFIX.get() + kind + ":" + rest


def check_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue id, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"queue name must be a non-empty str, got {name!r}")
    if len(name) > _MAX_NAME:
        raise ConfigError(f"queue name {name[:40]!r}... is longer than {_MAX_NAME} characters")
    if "{" in name or "}" in name or "#" in name or not name.isprintable() or name != name.strip():
        raise ConfigError(f"queue name {name!r} may not contain braces, '#', control characters "
                          "or leading/trailing spaces")
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
    return check_int(n, "partitions", low=1, high=MAX_PARTITIONS)


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


# How a queue's partitions are named (meta "pl"): LEGACY_PLACEMENT appends the index ("{q:X#i}",
# what queues declared before placement have: CRC16 is linear, so those tags cluster on a few
# slots' neighbourhoods), SPREAD_PLACEMENT picks each tag for its slot (partition_tags).
LEGACY_PLACEMENT = 0
SPREAD_PLACEMENT = 1

CLUSTER_SLOTS = 16384
# Suffix characters 0x40..0x4F: the low four bits take every value and the high four are fixed,
# so the suffixes of one length form an affine space over GF(2), on which CRC16 is affine too:
# four of them reach every 14-bit slot value (tests/test_placement.py checks it).
_SUFFIX_ALPHABET = b"@ABCDEFGHIJKLMNO"
_SUFFIX_LENGTH = 4


def hash_slot(tag: str) -> int:
    """The Redis Cluster slot of a key whose hash tag is ``tag``: CRC16 (XMODEM) mod 16384."""
    return binascii.crc_hqx(tag.encode(), 0) % CLUSTER_SLOTS


@functools.cache
def _first_suffixes() -> tuple[int, ...]:
    """For each slot value v, the first suffix (by its rank in alphabet order) whose CRC16 is v
    mod 16384. Built once per process from the linearity: a suffix is "@@@@" XOR four digits
    (0..15), so its CRC is CRC16("@@@@") XOR one term per position."""
    width = _SUFFIX_LENGTH
    per_position = [[binascii.crc_hqx(bytes(digit if i == position else 0 for i in range(width)),
                                      0) for digit in range(16)] for position in range(width)]
    crcs = [binascii.crc_hqx(_SUFFIX_ALPHABET[:1] * width, 0)]
    for terms in per_position:  # in alphabet order: the last position varies fastest
        crcs = [crc ^ term for crc in crcs for term in terms]
    # A dict keeps the last value given for a key: fed backwards, it keeps each slot's first.
    first = dict(zip([crc % CLUSTER_SLOTS for crc in reversed(crcs)],
                     range(len(crcs) - 1, -1, -1), strict=True))
    return tuple(first[slot] for slot in range(CLUSTER_SLOTS))


def _suffix(slot: int) -> str:
    """The first suffix whose CRC16 is ``slot`` mod 16384."""
    rank = _first_suffixes()[slot]
    return "".join(chr(_SUFFIX_ALPHABET[rank >> 4 * (_SUFFIX_LENGTH - 1 - i) & 15])
                   for i in range(_SUFFIX_LENGTH))


def _range_start(j: int, n: int) -> int:
    """Where the j-th of n equal slot ranges starts: round(j * 16384 / n), the split
    `redis-cli --cluster create` gives n masters (never a tie: 16384 / n is not k + 1/2)."""
    return (2 * j * CLUSTER_SLOTS + n) // (2 * n)


def partition_tags(name: str, count: int, placement: int = SPREAD_PLACEMENT) -> tuple[str, ...]:
    """The hash tags of the ``count`` partitions of queue ``name``.

    Partition 0 is ``q:<name>`` whatever the count. Spread placement splits the slot space into
    ``count`` equal ranges (:func:`_range_start`); partition 0's slot lies in one of them, at
    some offset from its start, and partition ``i`` takes the ``i``-th range after it, at the
    same offset: the partitions' slots are evenly spaced around the slot space. On a cluster
    whose masters split the slots evenly, ``count`` a multiple of the masters puts exactly as
    many partitions on each, and any count puts floor or ceil(count / masters) on each.

    The tag of partition ``i`` is ``q:<name>#<suffix>`` with the four-character suffix whose
    slot is the target: CRC16 with a zero start is linear, so CRC16(prefix + suffix) is
    CRC16(prefix + four zero bytes) XOR CRC16(suffix), and a table of the suffixes' CRCs
    (:func:`_first_suffixes`) answers each target at once.

    Under a prefix (``_PREFIX``) every tag starts with it: ``<prefix>:q:<name>...``."""
    return _partition_tags(_PREFIX.get(), name, count, placement)


@functools.lru_cache(maxsize=4096)
def _partition_tags(namespace: str, name: str, count: int, placement: int
                    ) -> tuple[str, ...]:
    home = f"{namespace}q:{name}"
    if count == 1:
        return (home,)
    if placement == LEGACY_PLACEMENT:
        return (home, *(f"{home}#{i}" for i in range(1, count)))
    slot = hash_slot(home)
    first = next(j for j in range(count) if slot < _range_start(j + 1, count))
    offset = slot - _range_start(first, count)
    base = binascii.crc_hqx(f"{home}#".encode() + bytes(_SUFFIX_LENGTH), 0)
    tags = [home]
    for i in range(1, count):
        j = (first + i) % count
        start, end = _range_start(j, count), _range_start(j + 1, count)
        target = start + min(offset, end - start - 1)
        tags.append(f"{home}#{_suffix((target ^ base) % CLUSTER_SLOTS)}")
    return tuple(tags)


@dataclass(frozen=True, slots=True)
class Layout:
    """A queue's partitions as stored in its home meta: the count, how the partitions are
    named (``placement``), and the ``version`` that every change of either increments. A
    queue never declared has none (``None`` where a layout is read). ``mode``: the mode the
    home stores ('' while it has none), which a producer that names none adds in, so that the
    partitions of a queue never take different modes; not part of the layout's identity."""

    count: int = 1
    placement: int = SPREAD_PLACEMENT
    version: int = 0
    mode: str = field(default="", compare=False)

    def keys(self, name: str) -> list[QueueKeys]:
        """The key layouts of every partition of queue ``name`` under this layout."""
        return partition_keys(name, self.count, self.placement, self.version)


def partition_keys(name: str, n: int, placement: int = SPREAD_PLACEMENT, version: int = 0
                   ) -> list[QueueKeys]:
    """The key layouts of every partition of queue ``name`` (of a layout of ``n`` partitions
    placed by ``placement``, at ``version``). Made once per layout and namespace: every add
    routes through them, and a :class:`QueueKeys` is never changed once made."""
    return list(_partition_keys(_PREFIX.get(), check_queue_name(name), n, placement, version))


@functools.lru_cache(maxsize=1024)
def _partition_keys(namespace: str, name: str, n: int, placement: int, version: int
                    ) -> tuple[QueueKeys, ...]:
    tags = _partition_tags(namespace, name, n, placement)
    return tuple(QueueKeys(name, i, n, tag=tags[i], version=version) for i in range(n))


class QueueKeys:
    """Names of the keys and the notify channel of one queue (of one partition of it)."""

    __slots__ = ("active", "batch_outbox", "batches", "blocked", "cancelled", "completed",
                 "delayed", "ends_read", "events", "events_read", "expires", "failed", "history",
                 "id_outbox", "idle", "key_active",
                 "limited", "meta", "name", "notify", "partition", "partitions", "prefix", "rate",
                 "ready", "relayout", "schedules", "schedules_pending", "shared_rate", "version",
                 "wait",
                 "wait_list", "worker_info", "workers")

    def __init__(self, name: str, partition: int = 0, partitions: int | None = None, *,
                 tag: str | None = None, version: int = 0) -> None:
        self.name = check_queue_name(name)
        self.partition = partition
        self.partitions = partitions
        # The layout version this partition is addressed under (see ``declared``).
        self.version = version
        base = _PREFIX.get()
        if tag is None:
            tag = f"{base}q:{name}#{partition}" if partition else f"{base}q:{name}"
        self.prefix = f"{{{tag}}}:"
        self.meta = self.prefix + "meta"
        # Global mode's waiting jobs: the default priority's in a LIST (FIFO), the other
        # priorities' in a ZSET (lua/lib/wait_order.lua holds the one order over both).
        self.wait = self.prefix + "wait"
        self.wait_list = self.prefix + "wl"
        self.delayed = self.prefix + "delayed"
        self.blocked = self.prefix + "blocked"
        self.active = self.prefix + "active"
        self.completed = self.prefix + "completed"
        self.failed = self.prefix + "failed"
        self.cancelled = self.prefix + "cancelled"
        self.events = self.prefix + "events"
        # Set, with an expiry, while somebody reads the event stream; and ends_read while
        # somebody waits on a result or counts the ends of jobs (ops/events.py watch).
        self.events_read = self.prefix + "events:read"
        self.ends_read = self.prefix + "ends:read"
        self.notify = self.prefix + "notify"
        self.schedules = self.prefix + "schedules"
        # Schedules whose taken ticks still have jobs to add in other partitions (ZSET).
        self.schedules_pending = self.prefix + "schedules:pending"
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
        # Partitioned queues: the deleted jobs whose custom id's home still holds a pointer to
        # them (ZSET "<job id>\t<home partition>\t<token>" -> when, lua/lib/identity.lua).
        self.id_outbox = self.prefix + "id_outbox"
        # A partitioned queue's global rate limit: one window for every partition, in a slot
        # of its own (lua/rate_take.lua).
        self.shared_rate = f"{{{base}q:{name}#rate}}:rl"
        # The home's lock of a layout change (STRING: the changer's token, with a lease;
        # _store/ops/layout.py change_layout).
        self.relayout = self.prefix + "relayout"

    @property
    def declared(self) -> str:
        """How this partition declares itself to the scripts: "<count>:<index>:<version>" (the
        layout the caller routes by), or '' when the count is not known here (the layout of
        queue X alone, the first partition of whatever X has): the scripts then neither check
        nor store it."""
        if self.partitions is None:
            return ""
        return f"{self.partitions}:{self.partition}:{self.version}"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def schedule(self, name: str) -> str:
        return f"{self.prefix}sched:{name}"

    def durable(self, job_id: str) -> str:
        """A durable job's steps, sleeps and signals (a HASH, lua/lib/job_keys.lua)."""
        return f"{self.prefix}job:{job_id}:durable"

    def needs(self, job_id: str) -> str:
        """The dependencies of ``job_id`` that have not completed yet (a SET)."""
        return f"{self.prefix}needs:{job_id}"

    def flow(self, job_id: str) -> str:
        """Every job added depending on ``job_id``, kept while both exist (a SET,
        lua/lib/dependencies.lua; read by lua/flow.lua)."""
        return f"{self.prefix}flow:{job_id}"

    def key_list(self, key: str) -> str:
        """Keyed mode: the list of the waiting jobs of concurrency key ``key``."""
        return f"{self.prefix}k:wait:{key}"

    def control(self, name: str) -> str:
        """The commands waiting for worker ``name`` (a LIST, lua/control.lua)."""
        return f"{self.prefix}control:{name}"

    def tag(self, tag: str) -> str:
        """The jobs that carry ``tag``, in the order they were added (a ZSET, lua/select.lua)."""
        return f"{self.prefix}tag:{tag}"

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
        self.prefix = f"{{{_PREFIX.get()}b:{batch_id}}}:"
        # HASH: the callbacks, closed, counts, fired/added marks (lib/batch_layout.lua).
        self.state = self.prefix + "state"
        # SET of "<queue>\t<job id>": every job registered in the batch, and those that ended.
        self.jobs = self.prefix + "jobs"
        self.ended = self.prefix + "ended"
        # SET of the queues the batch's jobs were added to (whose outboxes to relay).
        self.queues = self.prefix + "queues"
