"""Global mode's wait order over its two structures (lua/lib/wait_order.lua): the jobs of the
default priority wait in a list, every other priority in the sorted set, and every reader and
writer of waiting jobs sees one order: priority first (higher first), FIFO within a priority,
a stalled or released job back at the front of its priority. Also the job data stored in
parts (lua/lib/job_data.lua), which keeps a waiting job's hash a listpack."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from panqueue import JobState, SyncQueueClient
from panqueue._codec import decode, encode
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import NewJob, add_jobs
from panqueue._store.ops.select import select_ids
from tests.store_fixtures import ScriptStore


@pytest.fixture
def client(redis_url: str) -> Iterator[SyncQueueClient]:
    with SyncQueueClient(redis_url) as opened:
        yield opened


def add(store: ScriptStore, name: str, priority: int = 0, data: object = None) -> str:
    [(job_id, _)] = store.t.run(add_jobs(store.keys, [NewJob(
        name, encode(name if data is None else data), priority=priority)]))
    return job_id


def waiting_ids(client: SyncQueueClient, queue: str, **page: int) -> list[str]:
    return [job.id for job in client.list_jobs(queue, JobState.WAITING, **page)]


def test_a_default_priority_job_waits_in_the_list_and_others_in_the_sorted_set(
        store: ScriptStore) -> None:
    plain, urgent, late = add(store, "plain"), add(store, "urgent", 5), add(store, "late", -2)
    assert store.redis.lrange(store.keys.wait_list, 0, -1) == [plain.encode()]
    assert store.redis.zrange(store.keys.wait, 0, -1) == [urgent.encode(), late.encode()]


def test_priorities_mixed_with_the_default_keep_one_order_for_every_reader(
        store: ScriptStore, client: SyncQueueClient, queue_name: str) -> None:
    """Higher priority first, FIFO within a priority: listing, paging, the bulk selection,
    explain and the claim all agree."""
    ids = [add(store, name, priority) for name, priority in [
        ("a0", 0), ("b5", 5), ("c-3", -3), ("d0", 0), ("e5", 5), ("f-3", -3), ("g0", 0)]]
    a0, b5, c_3, d0, e5, f_3, g0 = ids
    order = [b5, e5, a0, d0, g0, c_3, f_3]
    assert waiting_ids(client, queue_name) == order
    for offset in range(len(order)):  # every page of 2, however it falls across the parts
        assert waiting_ids(client, queue_name, limit=2, offset=offset) == order[offset:offset + 2]
    assert client.counts(queue_name)[JobState.WAITING] == 7
    for rank, job_id in enumerate(order):  # explain.lua: how many jobs a claim takes first
        assert store.call(SCRIPTS.explain, job_id)[:2] == [b"ready", rank]
    # A filter without a tag reads the same order on the server (select.lua), a few at a time.
    for newest_first, expected in ((False, order), (True, order[::-1])):
        picked: list[str] = []
        rank = 0
        while rank >= 0:
            reply = store.call(SCRIPTS.select, "set", "wait", "waiting", "", rank,
                               1 if newest_first else 0, 0, 100, 3)
            rank = int(reply[0])
            picked += [member.decode() for member in reply[2:]]
        assert picked == expected
    assert store.t.run(select_ids(store.keys, (JobState.WAITING,), None, None, None)) == order
    assert store.claim("t1", 3) == order[:3]
    assert store.claim("t2", 10) == order[3:]
    assert client.counts(queue_name)[JobState.WAITING] == 0


def test_a_bulk_cancel_of_waiting_jobs_takes_them_from_both_structures(
        store: ScriptStore, client: SyncQueueClient, queue_name: str) -> None:
    for i in range(5):
        store.t.run(add_jobs(store.keys, [NewJob(None, encode(i), priority=i % 2,
                                                  tags=("bulk",))]))
    kept = add(store, "kept")
    assert client.cancel_jobs(queue_name, tag="bulk", state=JobState.WAITING) == 5
    assert waiting_ids(client, queue_name) == [kept]
    assert store.redis.zcard(store.keys.wait) == 0
    assert client.remove_jobs(queue_name, state=JobState.WAITING) == 1
    assert not store.redis.exists(store.keys.wait_list, store.keys.wait)


def test_a_stalled_default_priority_job_goes_back_to_the_front_behind_higher_priorities(
        store: ScriptStore, client: SyncQueueClient, queue_name: str) -> None:
    first, second = add(store, "first"), add(store, "second")
    assert store.claim("t1") == [first]
    later, urgent = add(store, "later"), add(store, "urgent", 5)
    store.expire_locks()
    assert store.sweep(max_stalls=5) == (1, 0)
    assert waiting_ids(client, queue_name) == [urgent, first, second, later]
    assert store.claim("t2", 10) == [urgent, first, second, later]


def test_a_stalled_prioritised_job_goes_back_to_its_old_place(store: ScriptStore) -> None:
    one, two = add(store, "one", 3), add(store, "two", 3)
    assert store.claim("t1") == [one]
    three, plain = add(store, "three", 3), add(store, "plain")
    store.expire_locks()
    assert store.sweep(max_stalls=5) == (1, 0)
    assert store.claim("t2", 10) == [one, two, three, plain]


def test_released_jobs_go_back_to_the_front_in_the_order_they_are_given_back(
        store: ScriptStore) -> None:
    a, b, c = add(store, "a"), add(store, "b"), add(store, "c")
    assert store.claim("t1", 2) == [a, b]
    assert store.call(SCRIPTS.release, a, "t1", b, "t1") == 2
    assert store.claim("t2", 10) == [a, b, c]


def test_remove_and_cancel_of_waiting_jobs_leave_the_rest_in_order(
        store: ScriptStore, client: SyncQueueClient, queue_name: str) -> None:
    a, b, c, p, q = add(store, "a"), add(store, "b"), add(store, "c"), add(store, "p", 2), \
        add(store, "q", 2)
    assert client.remove(queue_name, b)
    client.cancel(queue_name, p)
    assert client.get_job(queue_name, p).state is JobState.CANCELLED
    assert waiting_ids(client, queue_name) == [q, a, c]
    assert store.redis.lrange(store.keys.wait_list, 0, -1) == [a.encode(), c.encode()]
    assert store.claim("t1", 10) == [q, a, c]


def test_purge_of_waiting_jobs_empties_the_list_in_bounded_calls(
        store: ScriptStore, client: SyncQueueClient, queue_name: str) -> None:
    for i in range(25):
        add(store, f"j{i}", 1 if i % 5 == 0 else 0)
    assert store.call(SCRIPTS.purge, 10, "waiting") == [10, 1]
    assert client.counts(queue_name)[JobState.WAITING] == 15
    assert client.purge(queue_name, [JobState.WAITING]) == 15
    assert client.counts(queue_name)[JobState.WAITING] == 0
    assert not store.redis.exists(store.keys.wait_list, store.keys.wait)


def test_a_default_priority_job_left_in_the_sorted_set_goes_before_the_list(
        store: ScriptStore) -> None:
    """A job of priority 0 scored in the sorted set (as every waiting job was before the list)
    is older than any job in the list: it is claimed first, and goes back to the list's front
    when it stalls."""
    old = add(store, "old", 1)
    store.redis.hdel(store.keys.job(old), "p")
    store.redis.zadd(store.keys.wait, {old: 1_000_000 * 2**32 + 1})
    new, urgent = add(store, "new"), add(store, "urgent", 1)
    assert store.claim("t1") == [urgent]
    assert store.claim("t2") == [old]
    store.expire_locks()
    assert store.sweep(max_stalls=5) == (2, 0)
    assert store.redis.lrange(store.keys.wait_list, 0, -1) == [old.encode(), new.encode()]
    assert store.claim("t3", 10) == [urgent, old, new]


# ----------------------------------------------------------------------------- data in parts


@pytest.mark.parametrize("size", [1, 64, 65, 100, 300, 512])
def test_data_up_to_512_bytes_keeps_the_job_hash_a_listpack_and_reads_back_whole(
        store: ScriptStore, client: SyncQueueClient, queue_name: str, size: int) -> None:
    data = next("x" * n for n in range(size, -1, -1) if len(encode("x" * n)) <= size)
    assert len(encode(data)) == size  # msgpack's header: 1 to 3 bytes
    job_id = add(store, "j", data=data)
    stored = store.redis.hgetall(store.keys.job(job_id))
    assert store.redis.object("encoding", store.keys.job(job_id)) == b"listpack"
    assert all(len(value) <= 64 for value in stored.values())
    assert client.get_job(queue_name, job_id).data == data
    assert [job.data for job in client.list_jobs(queue_name, JobState.WAITING)] == [data]
    reply = store.call(SCRIPTS.claim, "t1", 30_000, 1)
    assert decode(reply[3]) == data  # the claim hands the worker the whole data


def test_a_resent_claim_answers_the_whole_data(store: ScriptStore) -> None:
    data = {"p": "y" * 200}
    add(store, "j", data=data)
    first = store.call(SCRIPTS.claim, "t1", 30_000, 1)
    again = store.call(SCRIPTS.claim, "t1", 30_000, 1)  # lib/memo.lua recall
    # The same job, data, enqueue time and options; the attempt is the same number, answered as
    # text only by the claim that started the job's first run (lib/activate.lua).
    assert again[:4] == first[:4] and again[5:] == first[5:]
    assert (first[4], again[4]) == (b"1", 1)
    assert decode(again[3]) == data


@pytest.mark.parametrize("reason", ["large data", "large options"])
def test_data_stays_whole_where_parts_would_not_keep_a_listpack(
        store: ScriptStore, client: SyncQueueClient, queue_name: str, reason: str) -> None:
    data = {"p": "z" * (600 if reason == "large data" else 100)}
    options = encode({"note": "o" * 100}) if reason == "large options" else b""
    [(job_id, _)] = store.t.run(add_jobs(store.keys, [NewJob(None, encode(data),
                                                             options=options)]))
    assert store.redis.hexists(store.keys.job(job_id), "d1") is False
    assert decode(store.redis.hget(store.keys.job(job_id), "d")) == data
    assert client.get_job(queue_name, job_id).data == data


def test_a_waiting_job_of_100_bytes_takes_under_300_bytes(
        store: ScriptStore, redis_client: redis.Redis) -> None:
    """The figure of scripts/bench.py --memory, on a smaller scale: the job hash and its list
    entry (MEMORY USAGE counts the key and the hash; the list, per entry)."""
    ids = [add(store, f"j{i}", data={"p": "x" * 100}) for i in range(200)]
    hash_bytes = redis_client.memory_usage(store.keys.job(ids[100]), samples=0)
    list_bytes = redis_client.memory_usage(store.keys.wait_list, samples=0) / len(ids)
    assert hash_bytes is not None and hash_bytes + list_bytes < 300


def test_a_waiting_job_is_taken_out_of_the_list_from_either_end(
        store: ScriptStore, client: SyncQueueClient, queue_name: str) -> None:
    """remove scans the list from the end whose job was enqueued nearer in time (a speed-up
    only): jobs near the back, the front, the middle and either end all go, the rest stay."""
    ids = [add(store, f"j{i}") for i in range(8)]
    for i, job_id in enumerate(ids):  # enqueued a second apart
        store.redis.hset(store.keys.job(job_id), "et", 1_000_000 + 1000 * i)
    for gone in (ids[6], ids[1], ids[4], ids[7], ids[0]):
        assert client.remove(queue_name, gone)
    assert store.redis.lrange(store.keys.wait_list, 0, -1) == [
        ids[2].encode(), ids[3].encode(), ids[5].encode()]
    assert store.claim("t1", 10) == [ids[2], ids[3], ids[5]]
