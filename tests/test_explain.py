"""``explain`` and the claim held together. For every state a job can wait in, the test arranges
it on a real server with the scripts a worker calls (tests/store_fixtures.py), asks
``client.explain`` through the public client, then claims with the claim's own script (on a
partitioned queue with a global rate limit, the way the claim loop does: starts from the shared
window first, lua/rate_take.lua): explain says the job can start now exactly when the claim
takes it, and its reason names the rule that holds it.

"Can start now" is the reason ``queued`` (or ``no_worker``: nothing but a worker is missing),
and the claim that must take such a job has as many free slots as the detail says jobs go
before it, plus one. Every other reason must leave the job where it is, whatever the slots."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from panqueue import Job, JobState, QueueClient, RateLimit, Registry, SyncQueueClient
from panqueue._keys import QueueKeys, partition_keys
from panqueue._listing import delayed_because
from panqueue._store import ops, transitions
from panqueue._store.transport import SyncTransport
from tests.store_fixtures import LOCK_TTL_MS, ScriptStore, open_store

pytestmark = pytest.mark.anyio

#: The reasons that say a claim takes the job now.
STARTS_NOW = {"queued", "no_worker"}
#: More slots than any arrangement holds jobs: a job such a claim leaves is held by a rule.
ALL_SLOTS = 100
MINUTE_MS = 60_000
KEY = "tenant-a"


def register_worker(t: SyncTransport, keys: QueueKeys) -> None:
    """A live entry in the worker registry, as a worker's heartbeat writes it."""
    t.run(transitions.heartbeat(keys, f"w-{uuid.uuid4().hex[:8]}", MINUTE_MS, host="here",
                                pid=1, queues=[keys.name], concurrency=4, running=[]))


def claim(s: ScriptStore, n: int) -> list[str]:
    """A worker's claim with ``n`` free slots (lua/claim.lua): the ids it took."""
    return s.claim(uuid.uuid4().hex, n)


def set_up(s: ScriptStore, mode: str = "global", kc: int = 1, rate: tuple[int, bool] | None = None
           ) -> None:
    """The queue's settings as a worker stores them: ``rate`` is (max per minute, per key)."""
    rate_max, per_key = rate or (0, False)
    s.t.run(ops.setup_queue(s.keys, mode, kc, rate_max, MINUTE_MS if rate_max else 0, per_key))


def make_due(s: ScriptStore, job_id: str) -> None:
    """A delayed job whose time has come (no upkeep ran since)."""
    s.redis.zadd(s.keys.delayed, {job_id: 0})


# Each arrangement builds one state and names the job to ask about and the reason explain must
# give. The ones marked in their docstring disagreed before explain asked the server.


def waiting(s: ScriptStore) -> tuple[str, str]:
    s.add(2)
    return s.add_one(), "queued"


def priorities(s: ScriptStore) -> tuple[str, str]:
    """The higher priority goes first: a claim of one slot takes it, not the older job."""
    older = s.add_one()
    urgent = s.add_one(priority=5)
    assert claim(s, 1) == [urgent]
    return older, "queued"


def behind_a_higher_priority(s: ScriptStore) -> tuple[str, str]:
    s.add_one(priority=5)
    return s.add_one(), "queued"


def paused(s: ScriptStore) -> tuple[str, str]:
    job = s.add_one()
    s.t.run(ops.pause(s.keys, True))
    return job, "paused"


def paused_when_due(s: ScriptStore) -> tuple[str, str]:
    """A due delayed job of a paused queue: the pause holds it, not its delay."""
    job = s.add_one(delay_ms=MINUTE_MS)
    make_due(s, job)
    s.t.run(ops.pause(s.keys, True))
    return job, "paused"


def delayed(s: ScriptStore) -> tuple[str, str]:
    return s.add_one(delay_ms=MINUTE_MS), "delayed"


def due(s: ScriptStore) -> tuple[str, str]:
    """Due, not promoted yet: the claim promotes it first and takes it (was: "delayed")."""
    job = s.add_one(delay_ms=MINUTE_MS)
    make_due(s, job)
    return job, "queued"


def handler_paused_the_queue(s: ScriptStore) -> tuple[str, str]:
    first, second = s.add(2)
    token = uuid.uuid4().hex
    assert s.claim(token, 1) == [first]
    s.rate_limited(first, token, retry_after_ms=MINUTE_MS)
    return second, "rate_limited"


def rate_window_used_up(s: ScriptStore) -> tuple[str, str]:
    set_up(s, rate=(1, False))
    first, second = s.add(2)
    assert claim(s, 1) == [first]
    return second, "rate_limited"


def rate_window_room_for_fewer(s: ScriptStore) -> tuple[str, str]:
    """Room for two more starts, and two jobs go first (was: "queued")."""
    set_up(s, rate=(2, False))
    s.add(2)
    return s.add_one(), "rate_limited"


def rate_window_room_for_it(s: ScriptStore) -> tuple[str, str]:
    set_up(s, rate=(2, False))
    s.add_one()
    job = s.add_one()
    s.add_one()
    return job, "queued"


def past_its_deadline(s: ScriptStore) -> tuple[str, str]:
    """Waiting past its deadline to start: the claim ends it instead (was: "queued")."""
    job = s.add_one(expires_in_ms=MINUTE_MS)
    s.redis.hset(s.keys.job(job), "x", 1)
    return job, "expired"


def delayed_past_its_deadline(s: ScriptStore) -> tuple[str, str]:
    """Due in a minute, its deadline to start passed: the expiry sweep ends it before it is
    due (was: "delayed")."""
    job = s.add_one(delay_ms=MINUTE_MS, expires_in_ms=MINUTE_MS)
    s.redis.hset(s.keys.job(job), "x", 1)
    return job, "expired"


def waiting_for_a_signal_past_its_deadline(s: ScriptStore) -> tuple[str, str]:
    """A durable job that waits for a signal, past its deadline to start: a signal would not
    run it (was: "signal")."""
    job = s.add_one(delay_ms=MINUTE_MS, expires_in_ms=MINUTE_MS)
    s.redis.hset(s.keys.durable(job), "ws", "go")
    s.redis.hset(s.keys.job(job), "x", 1)
    return job, "expired"


def blocked_past_its_deadline(s: ScriptStore) -> tuple[str, str]:
    first = s.add_one()
    job = s.add_one(depends_on=(first,), expires_in_ms=MINUTE_MS)
    s.redis.hset(s.keys.job(job), "x", 1)
    return job, "expired"


def dependency_waiting(s: ScriptStore) -> tuple[str, str]:
    first = s.add_one()
    return s.add_one(depends_on=(first,)), "blocked"


def running(s: ScriptStore) -> tuple[str, str]:
    job = s.add_one()
    assert claim(s, 1) == [job]
    return job, "running"


def cancelled(s: ScriptStore) -> tuple[str, str]:
    job = s.add_one()
    s.t.run(ops.cancel(s.keys, job))
    return job, "finished"


def expired(s: ScriptStore) -> tuple[str, str]:
    job = s.add_one(expires_in_ms=MINUTE_MS)
    s.redis.hset(s.keys.job(job), "x", 1)
    assert claim(s, ALL_SLOTS) == []  # the claim ends it
    return job, "expired"


def key_busy(s: ScriptStore) -> tuple[str, str]:
    set_up(s, "keyed", kc=1)
    first, second = s.add(2, key=KEY)
    assert claim(s, 1) == [first]
    return second, "key_busy"


def behind_in_its_key(s: ScriptStore) -> tuple[str, str]:
    """One at a time per key, none running: the job behind the first waits for it to run and
    finish; no claim takes both (was: "queued")."""
    set_up(s, "keyed", kc=1)
    s.add_one(key=KEY)
    return s.add_one(key=KEY), "key_busy"


def behind_in_its_key_with_room(s: ScriptStore) -> tuple[str, str]:
    set_up(s, "keyed", kc=2)
    s.add_one(key=KEY)
    return s.add_one(key=KEY), "queued"


def another_key(s: ScriptStore) -> tuple[str, str]:
    set_up(s, "keyed", kc=1)
    first, _ = s.add(2, key=KEY)
    assert claim(s, 1) == [first]
    return s.add_one(key="tenant-b"), "queued"


def key_rate_used_up(s: ScriptStore) -> tuple[str, str]:
    set_up(s, "keyed", kc=2, rate=(1, True))
    first, second = s.add(2, key=KEY)
    assert claim(s, 1) == [first]
    return second, "rate_limited"


def key_rate_room_for_fewer(s: ScriptStore) -> tuple[str, str]:
    """Two at a time per key, one start per minute per key, two jobs of the key and none
    started: the first takes the window's one start, and the claim then pauses the key (was:
    "queued")."""
    set_up(s, "keyed", kc=2, rate=(1, True))
    s.add_one(key=KEY)
    return s.add_one(key=KEY), "rate_limited"


def _key_paused_by_its_handler(s: ScriptStore) -> str:
    set_up(s, "keyed", kc=1)
    first, _ = s.add(2, key=KEY)
    token = uuid.uuid4().hex
    assert s.claim(token, 1) == [first]
    s.rate_limited(first, token, retry_after_ms=MINUTE_MS)
    return first


def key_paused_by_its_handler(s: ScriptStore) -> tuple[str, str]:
    return _key_paused_by_its_handler(s), "rate_limited"


def key_pause_over(s: ScriptStore) -> tuple[str, str]:
    """The key's pause has ended and no claim has released it yet: the next claim does, and
    takes the job (was: "rate_limited" until a time already past)."""
    job = _key_paused_by_its_handler(s)
    s.redis.zadd(s.keys.limited, {KEY: 0})
    return job, "queued"


ARRANGEMENTS: list[Callable[[ScriptStore], tuple[str, str]]] = [
    waiting, priorities, behind_a_higher_priority, paused, paused_when_due, delayed, due,
    handler_paused_the_queue, rate_window_used_up, rate_window_room_for_fewer,
    rate_window_room_for_it, past_its_deadline, delayed_past_its_deadline,
    waiting_for_a_signal_past_its_deadline, blocked_past_its_deadline, dependency_waiting,
    running, cancelled, expired,
    key_busy, behind_in_its_key, behind_in_its_key_with_room, another_key, key_rate_used_up,
    key_rate_room_for_fewer,
    key_paused_by_its_handler, key_pause_over,
]


async def agree(client: QueueClient, queue: str, job_id: str, reason: str,
                claim_now: Callable[[int], list[str]]) -> None:
    """explain gives ``reason``, and the claim takes the job exactly when that reason says it
    can start now: when it can, the jobs explain says go first are the ones a claim takes
    first, and the next slot takes the job."""
    said = await client.explain(queue, job_id)
    assert said.reason == reason, said
    if said.reason not in STARTS_NOW:
        taken = claim_now(ALL_SLOTS)
        assert job_id not in taken, (said, taken)
        return
    behind = re.search(r"behind (\d+) job", said.detail)
    ahead = int(behind[1]) if behind else 0
    if ahead:
        first = claim_now(ahead)
        assert len(first) == ahead and job_id not in first, (said, first)
    taken = claim_now(1)
    assert taken == [job_id], (said, taken)


@pytest.fixture
def store(redis_url: str, queue_name: str) -> Iterator[ScriptStore]:
    with open_store(redis_url, queue_name, ScriptStore) as opened:
        yield opened


@pytest.mark.parametrize("arrange", ARRANGEMENTS, ids=lambda f: f.__name__)
async def test_explain_and_the_claim_agree(redis_url: str, store: ScriptStore,
                                           arrange: Callable[[ScriptStore], tuple[str, str]]
                                           ) -> None:
    register_worker(store.t, store.keys)
    job_id, reason = arrange(store)
    async with QueueClient(redis_url) as client:
        await agree(client, store.keys.name, job_id, reason, lambda n: claim(store, n))


async def test_without_a_worker_explain_names_what_holds_the_job_first(
        redis_url: str, store: ScriptStore) -> None:
    """No worker serves the queue: a job the claim would take says so; one a rule holds names
    the rule (was: "no_worker" for both)."""
    set_up(store, rate=(1, False))
    first, second = store.add(2)
    async with QueueClient(redis_url) as client:
        await agree(client, store.keys.name, first, "no_worker", lambda n: claim(store, n))
        await agree(client, store.keys.name, second, "rate_limited", lambda n: claim(store, n))


async def test_all_slots_taken_is_said_and_a_free_slot_takes_the_job(
        redis_url: str, store: ScriptStore) -> None:
    """Every live worker's slots run jobs: nothing in the store holds the job, so it is
    "queued" (a claim from any free slot takes it), and the detail says the slots are taken."""
    first, second = store.add(2)
    assert claim(store, 1) == [first]
    store.t.run(transitions.heartbeat(store.keys, "w-full", MINUTE_MS, host="here", pid=1,
                                      queues=[store.keys.name], concurrency=1, running=[first]))
    async with QueueClient(redis_url) as client:
        said = await client.explain(store.keys.name, second)
        assert "1 slot in all serves the queue, all of them taken" in said.detail, said
        await agree(client, store.keys.name, second, "queued", lambda n: claim(store, n))


# ------------------------------------------------------------------------ partitioned queues

PARTITIONS = 2


def _partitioned(queue: str, rate_limit: RateLimit | None = None) -> Any:
    """The handler of a partitioned queue (no worker runs it: the test claims)."""
    registry = Registry()

    @registry.handler(queue, partitions=PARTITIONS, rate_limit=rate_limit)
    async def work(job: Job[int]) -> None:
        return None

    return work


def _partition_of(t: SyncTransport, queue: str, job_id: str) -> QueueKeys:
    [keys] = [k for k in partition_keys(queue, PARTITIONS) if t.client.exists(k.job(job_id))]
    return keys


def _claim_through_window(s: ScriptStore, n: int, limit: int, per_ms: int) -> list[str]:
    """A claim of a partitioned queue with a global rate limit, as the claim loop makes it
    (_runtime/claimer.py): starts from the shared window first, a claim of at most that many
    jobs, the unused starts given back."""
    name = uuid.uuid4().hex
    taken, _, start_by = s.t.run(transitions.take_starts(s.keys, n, limit, per_ms, name))
    if taken == 0:
        return []
    claimed = s.t.run(transitions.claim(s.keys, name, LOCK_TTL_MS, taken, start_by_ms=start_by))
    s.t.run(transitions.give_back_starts(s.keys, name, len(claimed.jobs) + 1, taken))
    return [job.id for job in claimed.jobs]


async def _add_to_each_partition(client: QueueClient, handler: Any, t: SyncTransport,
                                 queue: str) -> dict[int, str]:
    """Jobs added through the client until each partition holds one: partition -> its job."""
    held: dict[int, str] = {}
    for _ in range(64):
        handle = await client.queue(handler).add(1)
        held.setdefault(_partition_of(t, queue, handle.id).partition, handle.id)
        if len(held) == PARTITIONS:
            return held
    raise AssertionError(f"no job reached every partition: {held}")


async def test_a_job_in_another_partition(redis_url: str, queue_name: str) -> None:
    """explain reads the job's own partition: a claim there takes it, a claim of another
    partition does not."""
    handler = _partitioned(queue_name)
    async with QueueClient(redis_url) as client:
        transport = SyncTransport(redis_url)
        try:
            held = await _add_to_each_partition(client, handler, transport, queue_name)
            parts = partition_keys(queue_name, PARTITIONS)
            for keys in parts:
                register_worker(transport, keys)
            job_id = held[1]
            home, own = ScriptStore(transport, parts[0]), ScriptStore(transport, parts[1])
            said = await client.explain(queue_name, job_id)
            assert said.reason == "queued", said
            assert job_id not in claim(home, ALL_SLOTS)
            await agree(client, queue_name, job_id, "queued", lambda n: claim(own, n))
        finally:
            transport.close()


async def test_the_shared_rate_window_of_a_partitioned_queue(redis_url: str,
                                                             queue_name: str) -> None:
    """One window for every partition (lua/rate_take.lua), outside each partition's slot: a
    job whose partition would start it waits while the window is used up (was: "queued")."""
    limit = RateLimit(max=1, per=60)
    per_ms = MINUTE_MS
    handler = _partitioned(queue_name, limit)
    async with QueueClient(redis_url) as client:
        transport = SyncTransport(redis_url)
        try:
            held = await _add_to_each_partition(client, handler, transport, queue_name)
            parts = partition_keys(queue_name, PARTITIONS)
            for keys in parts:
                register_worker(transport, keys)
            stores = [ScriptStore(transport, keys) for keys in parts]
            # Before any start, the window has room: the job of partition 0 starts.
            await agree(client, queue_name, held[0], "queued",
                        lambda n: _claim_through_window(stores[0], n, 1, per_ms))
            # Its start used the window: partition 1's job waits, though its partition is free.
            await agree(client, queue_name, held[1], "rate_limited",
                        lambda n: _claim_through_window(stores[1], n, 1, per_ms))
            said = await client.explain(queue_name, held[1])
            assert "one window for its 2 partitions" in said.detail, said
            assert said.state is JobState.WAITING
        finally:
            transport.close()



async def test_the_shared_rate_window_with_room_for_fewer_starts_than_the_jobs_ahead(
        redis_url: str, queue_name: str) -> None:
    """Two starts a minute for the whole queue, one taken by a job of partition 1: the window
    has room for one more, so of partition 0's two jobs only the first starts (was: "queued"
    for the second)."""
    handler = _partitioned(queue_name, RateLimit(max=2, per=60))
    async with QueueClient(redis_url) as client:
        transport = SyncTransport(redis_url)
        try:
            by_partition: dict[int, list[str]] = {0: [], 1: []}
            while len(by_partition[0]) < 2 or not by_partition[1]:
                handle = await client.queue(handler).add(1)
                by_partition[_partition_of(transport, queue_name, handle.id).partition].append(
                    handle.id)
            parts = partition_keys(queue_name, PARTITIONS)
            for keys in parts:
                register_worker(transport, keys)
            stores = [ScriptStore(transport, keys) for keys in parts]
            assert _claim_through_window(stores[1], 1, 2, MINUTE_MS) == by_partition[1][:1]
            second = by_partition[0][1]
            said = await client.explain(queue_name, second)
            assert "has room for 1 more start now, and 1 job of its partition" in said.detail, \
                said
            await agree(client, queue_name, second, "rate_limited",
                        lambda n: _claim_through_window(stores[0], n, 2, MINUTE_MS))
        finally:
            transport.close()


async def test_a_blocked_job_added_with_a_delay_is_said_to_be_delayed_once_released(
        redis_url: str, store: ScriptStore) -> None:
    first = store.add_one()
    job = store.add_one(depends_on=(first,), delay_ms=MINUTE_MS)
    async with QueueClient(redis_url) as client:
        said = await client.explain(store.keys.name, job)
    assert said.reason == "blocked" and "it is delayed until" in said.detail, said


def test_a_stalled_attempt_after_a_failed_one_is_no_retry_after_that_error(
        redis_url: str, store: ScriptStore) -> None:
    """Attempt 1 fails (retried at once), attempt 2 stalls (its worker died): the job waits for
    its attempt 2, and is not "a retry after ValueError"."""
    job = store.add_one()
    first = uuid.uuid4().hex
    assert store.claim(first) == [job]
    store.fail(job, first, max_attempts=3)
    second = uuid.uuid4().hex
    assert store.claim(second) == [job]
    store.expire_locks()
    assert store.sweep(max_stalls=5) == (1, 0)
    with SyncQueueClient(redis_url) as client:
        info = client.get_job(store.keys.name, job)
        [listed] = client.list_jobs(store.keys.name, JobState.WAITING)
    assert (info.attempts, info.retry_of) == (1, None)
    assert delayed_because(listed) == ""


async def test_a_delayed_job_past_its_deadline_is_explained_as_delayed_and_left_to_the_sweep(
        redis_url: str, store: ScriptStore) -> None:
    job = store.add_one(delay_ms=MINUTE_MS, expires_in_ms=MINUTE_MS)
    store.redis.hset(store.keys.job(job), "x", 1)
    async with QueueClient(redis_url) as client:
        said = await client.explain(store.keys.name, job)
    assert (said.state, said.reason) == (JobState.DELAYED, "expired"), said
    assert "the expiry sweep ends it" in said.detail and "claim" not in said.detail, said


def test_a_hint_names_a_command_quoted_for_a_shell_and_under_the_clients_prefix() -> None:
    from panqueue._store.ops.explain import _Words

    for tool in ("cli", "dashboard"):
        words = _Words(tool, "sign ups", "1", "billing")  # type: ignore[arg-type]
        assert words("signal", name="go") == \
            "panqueue signal --prefix billing 'sign ups' 1 go [JSON]"
    assert _Words("cli", "q", "7")("retry") == "panqueue dlq q --retry 7"
    assert _Words("cli", "q", "7")("start_worker") == "panqueue worker"
    assert _Words("python", "q", "7", "billing")("resume") == "client.resume"
