"""What a plain job asks of Redis: the commands the add and completion scripts make for each
job, counted with ``INFO commandstats`` (which counts the commands a script makes) on a server
of the test's own. The per-job share is the difference between a batch of 20 jobs and a batch
of 10, divided by 10: what every call makes once falls out. docs/performance.md lists them and
what each is for; a change that adds a command to every job shows here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from panqueue._codec import encode
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import NewJob, add_jobs, setup_queue
from panqueue._store.ops.events import watch
from panqueue.embedded import RedisServer
from tests.store_fixtures import ScriptStore, open_store


@pytest.fixture
def own(private_redis: RedisServer, queue_name: str) -> Iterator[ScriptStore]:
    """The store of a queue on a server no other test uses: its command counts are ours."""
    with open_store(private_redis.url, queue_name, ScriptStore) as opened:
        yield opened


def counts(r: redis.Redis) -> Counter[str]:
    return Counter({name.removeprefix("cmdstat_"): int(stat["calls"])
                    for name, stat in r.info("commandstats").items()})


def per_job(small: Counter[str], large: Counter[str]) -> dict[str, float]:
    """The commands of a call of 20 jobs less those of a call of 10, per job."""
    return {name: (large[name] - small[name]) / 10 for name in large | small
            if large[name] != small[name]}


def claimed(own: ScriptStore, ids: list[str]) -> list[object]:
    """Claim the waiting jobs ``ids`` (all there are); the completion script's arguments that
    complete them all."""
    token = f"w:1:{len(ids)}"
    assert own.claim(token, len(ids)) == ids
    args: list[object] = [len(ids)]
    for job_id in ids:
        args += [job_id, token, encode("ok"), 0]
    return args


def whole_jobs(own: ScriptStore) -> dict[str, float]:
    """The commands per job of adding, claiming and completing batches of 10 and 20 jobs."""
    writes = []
    for n in (10, 20):
        before = counts(own.redis)
        own.call(SCRIPTS.complete, -1, "", 1000, *claimed(own, own.add(n)))
        writes.append(counts(own.redis) - before)
    return per_job(*writes)


def test_a_bulk_add_reserves_its_generated_ids_with_one_write(own: ScriptStore) -> None:
    own.add(1)
    made = []
    for n in (10, 20):
        before = counts(own.redis)
        own.add(n)
        made.append(counts(own.redis) - before)
    # One increment of the id counter per batch; at most one more per job (its place in the
    # wait order).
    assert per_job(*made).get("hincrby", 0) <= 1
    # The ids are what one increment per job gives, and the counter is where they leave it.
    assert own.add(3) == ["32", "33", "34"]
    assert own.redis.hget(own.keys.meta, "id") == b"34"


def test_a_single_add_reads_the_queues_mode_once(own: ScriptStore) -> None:
    own.add(1)
    before = counts(own.redis)
    own.add(1)
    made = counts(own.redis) - before
    # The queue's mode, once; at most one more read for the job's place in the wait order.
    assert made["hget"] <= 2
    assert own.redis.hget(own.keys.meta, "mode") == b"global"


def test_a_batch_with_a_dedup_key_numbers_its_jobs_in_item_order(own: ScriptStore) -> None:
    items = [NewJob(None, encode(0)),
             NewJob(None, encode(1), dedup_key="d", dedup_ttl_ms=60_000,
                    dedup_strategy="keep"),
             NewJob("custom", encode(2)),
             NewJob(None, encode(3), dedup_key="d", dedup_ttl_ms=60_000,
                    dedup_strategy="keep"),  # the same job again
             NewJob(None, encode(4))]
    added = own.t.run(add_jobs(own.keys, items))
    assert [job_id for job_id, _ in added] == ["1", "2", "custom", "2", "3"]
    assert own.add(1) == ["4"]


@pytest.mark.parametrize("read", [False, True], ids=["unread", "read"])
def test_a_claim_makes_two_commands_per_job_and_its_event_while_read(
        own: ScriptStore, read: bool) -> None:
    if read:
        own.t.run(watch([own.keys]))
    made = []
    for n in (1, 10, 20):  # the first loads the script
        ids = own.add(n)
        before = counts(own.redis)
        assert own.claim(f"w:1:{n}", n) == ids
        made.append(counts(own.redis) - before)
    assert per_job(made[1], made[2]) == {
        "hmget": 1,    # what the worker is handed: data, options, attempts, enqueued at
        "hset": 1,     # state, start time, lock token, attempt, place in the wait order
        **({"xadd": 1} if read else {}),  # the active event, while somebody reads them
    }                  # (the active set: one ZADD for the whole claim)


def test_a_completion_makes_five_commands_per_job_its_retention_included(
        own: ScriptStore) -> None:
    keep = 5
    made = []
    for n in (keep, 10, 20):  # the first fills the completed set: then each completion trims one
        args = claimed(own, own.add(n))
        before = counts(own.redis)
        own.call(SCRIPTS.complete, keep, "", 1000, *args)
        made.append(counts(own.redis) - before)
    assert per_job(made[1], made[2]) == {
        "hmget": 2,    # the lock token and what the history record needs; retention's deleted
                       # job: its id's pointer and its tags
        "hdel": 1,     # the lock token
        "hset": 1,     # state, finish time, result
        "xadd": 1,     # the history record (no completed event: nobody waits or reads)
    }   # and one command for the whole call each: out of the active set (ZREM), into the
        # completed set (ZADD), dependents to release (EXISTS), retention's DEL
    assert made[2] - made[1] == Counter({"hmget": 20, "hdel": 10, "hset": 10, "xadd": 10})
    # Retention kept the newest `keep` of the 35 and deleted the others.
    assert own.redis.zcard(own.keys.completed) == keep
    assert len(own.redis.keys(own.keys.prefix + "job:*")) == keep
    assert own.redis.zcard(own.keys.active) == 0


@pytest.mark.parametrize("keep_events", [10_000, 0])
def test_a_queue_nobody_reads_nor_waits_on_writes_one_stream_entry_per_job(
        own: ScriptStore, keep_events: int) -> None:
    own.t.run(setup_queue(own.keys, "global", 1, 0, 0, False, keep_events=keep_events))
    # Its history record alone; no event (while somebody waits on a result: two entries per
    # job, and four while somebody reads the events).
    assert whole_jobs(own)["xadd"] == 1
    assert own.redis.xlen(own.keys.events) == 0
    assert own.redis.xlen(own.keys.history) == 30


@pytest.mark.parametrize(("keep_events", "every"), [(10_000, False), (0, False), (0, True)],
                         ids=["ends", "no-events-ends", "no-events-every"])
def test_a_queue_whose_results_are_awaited_writes_two_stream_entries_per_job(
        own: ScriptStore, keep_events: int, every: bool) -> None:
    own.t.run(setup_queue(own.keys, "global", 1, 0, 0, False, keep_events=keep_events))
    # Asked for the ends of jobs (what result() and a reader that counts them ask), or for every
    # event of a queue that keeps no events (which writes no more than the ends).
    own.t.run(watch([own.keys], every=every))
    # Its history record and its completed event (which result() waits on); no added or active
    # event.
    assert whole_jobs(own)["xadd"] == 2
    kinds = {fields[b"ev"] for _, fields in own.redis.xrange(own.keys.events)}
    assert (own.redis.xlen(own.keys.events), kinds) == (30, {b"completed"})
    assert own.redis.xlen(own.keys.history) == 30


def test_a_queue_whose_events_are_read_writes_four_stream_entries_per_job(
        own: ScriptStore) -> None:
    own.t.run(watch([own.keys]))
    made = whole_jobs(own)
    # added, active, completed and the history record; the add and the claim each ask once
    # per call whether the events are read.
    assert made["xadd"] == 4
    assert made.get("exists", 0) == 0


def test_a_clients_single_add_reads_the_queues_meta_once(private_redis: RedisServer,
                                                        queue_name: str) -> None:
    """A client's add declares the queue's layout (one partition), which the add script checks
    and stores (lib/partition.lua), and the queue's mode, which it resolves
    (lib/new_job_checks.lua): both from the settings it reads anyway, one HMGET of the meta
    hash and no other read of it. (The client reads the layout itself until the queue has
    one stored, which the first add does.)"""
    from panqueue import SyncQueueClient

    r = redis.Redis.from_url(private_redis.url)
    with SyncQueueClient(private_redis.url) as client:
        queue = client.queue(queue_name)
        queue.add(1)
        queue.add(2)  # reads the layout stored by the first, and remembers it
        before = counts(r)
        queue.add(3)
        made = counts(r) - before
    r.close()
    assert made["fcall"] == 1
    assert made["hmget"] == 1
    assert made["hget"] == 0
