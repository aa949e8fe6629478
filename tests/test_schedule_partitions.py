"""Schedules of partitioned queues. A schedule lives in the queue's first partition, and each
tick's job goes where a producer's add of it would go: its id's home, or on a keyed queue its
key's partition. So a tick's documented id (``schedule:<name>:<tick ms>``) and key
(``schedule:<name>``) mean there what they mean for any other job: adding the id again makes no
second job, and the key's limits hold. A tick taken whose job the worker did not get to add is
added by the next worker that looks. On asyncio and trio, with one partition as the control."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis

from panqueue import Job, QueueClient, Registry
from panqueue._codec import encode
from panqueue._keys import QueueKeys, partition_keys, route
from panqueue._store.ops.schedules import schedule_tick
from panqueue._store.transport import SyncTransport
from panqueue.testing import drain, run_worker
from tests.helpers import async_wait_until

pytestmark = pytest.mark.anyio

N = 4
# route(4, key="schedule:b") is 2: a keyed queue's ticks of "b" belong away from partition 0.
NAME = "b"


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def home(n: int, mode: str, job_id: str) -> int:
    """The partition a producer's add of a tick's job goes to."""
    found = route(n, key=f"schedule:{NAME}") if mode == "keyed" else route(n, job_id)
    assert found is not None
    return found


def far_tick(n: int, before_ms: int) -> int:
    """A whole second at or before ``before_ms`` whose tick's job belongs away from partition
    0 (any, with one partition)."""
    tick = before_ms // 1000 * 1000
    while n > 1 and route(n, f"schedule:{NAME}:{tick}") == 0:
        tick -= 1000
    return tick


def take(url: str, keys: QueueKeys, tick: int, now: int, data: bytes
         ) -> tuple[bool, list[str], list[int]]:
    """Take the schedule's due ``tick``, as a worker does, its job belonging elsewhere (so left
    pending), and add nothing: as a worker that stopped right after the take leaves it."""
    transport = SyncTransport(url)
    try:
        return transport.run(schedule_tick(keys, NAME, [tick], [True], now, tick + 3_600_000,
                                           "once", 60_000, data, 0, b""))
    finally:
        transport.close()


def stored_in(client: redis.Redis, queue: str, n: int, job_id: str) -> list[int]:
    """The partitions whose hash of ``job_id`` exists."""
    return [keys.partition for keys in partition_keys(queue, n)
            if client.exists(keys.job(job_id))]


@pytest.mark.parametrize("mode", ["global", "keyed"])
@pytest.mark.parametrize("partitions", [1, N])
async def test_a_ticks_job_goes_where_an_add_of_it_goes_and_adding_its_id_again_makes_none(
        redis_url: str, queue_name: str, redis_client: redis.Redis, partitions: int,
        mode: str) -> None:
    assert route(N, key=f"schedule:{NAME}") != 0
    registry = Registry()
    ran: Counter[str] = Counter()
    keyed = {"mode": "keyed", "key_concurrency": 1} if mode == "keyed" else {}

    @registry.handler(queue_name, partitions=partitions, concurrency=4,
                      **keyed)  # type: ignore[call-overload]
    async def work(job: Job[Any]) -> None:
        ran[job.id] += 1

    registry.schedule(NAME, queue_name, every=0.2)
    key = {"key": f"schedule:{NAME}"} if mode == "keyed" else {}
    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, redis_url):
        async def a_far_tick_ran() -> bool:
            return any(home(partitions, mode, i) != 0 or partitions == 1 for i in ran)

        await async_wait_until(a_far_tick_ran, what="a tick whose job belongs elsewhere")
        tick_id = next(i for i in ran if home(partitions, mode, i) != 0 or partitions == 1)
        again = await client.queue(work).add({"by": "hand"}, job_id=tick_id, **key)
        ticks = list(ran)
        await drain(redis_url, queue_name)
    assert not again.created and again.id == tick_id
    for job_id in ticks:
        assert stored_in(redis_client, queue_name, partitions, job_id) == \
            [home(partitions, mode, job_id)], job_id
        assert ran[job_id] == 1, (job_id, ran)


@pytest.mark.parametrize("partitions", [1, N])
async def test_a_missed_tick_run_by_hand_under_its_id_is_not_run_again_by_the_catch_up(
        redis_url: str, queue_name: str, redis_client: redis.Redis, partitions: int) -> None:
    """The workers were down; an operator ran the missed tick under its id. When a worker
    comes back, misfire="once" takes that tick: its add finds the job and makes none."""
    registry = Registry()
    ran: Counter[str] = Counter()

    @registry.handler(queue_name, partitions=partitions, concurrency=4)
    async def work(job: Job[Any]) -> None:
        ran[job.id] += 1

    schedule = registry.schedule(NAME, queue_name, every=1.0, misfire="once", grace=1.0)
    first = far_tick(partitions, server_ms(redis_client) - 60_000)
    keys = QueueKeys(queue_name)  # the schedules' partition, the first
    redis_client.hset(keys.schedule(NAME), "def", schedule.definition())
    redis_client.zadd(keys.schedules, {NAME: first})
    tick_id = f"schedule:{NAME}:{first}"
    async with QueueClient(redis_url) as client:
        manual = await client.queue(work).add({"by": "hand"}, job_id=tick_id)
        assert manual.created
        async with run_worker(registry, queue_name, redis_url):
            async def caught_up() -> bool:
                return any(i != tick_id for i in ran)

            await async_wait_until(caught_up, what="the schedule to catch up")
            await drain(redis_url, queue_name)
    assert ran[tick_id] == 1, ran


async def test_a_tick_taken_whose_job_was_not_added_is_added_by_the_next_worker(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """A worker took a due tick whose job belongs in another partition, and stopped before it
    added the job: the tick is pending. The next worker adds it there, once, and clears it."""
    registry = Registry()
    ran: Counter[str] = Counter()

    @registry.handler(queue_name, partitions=N, concurrency=4)
    async def work(job: Job[Any]) -> None:
        ran[job.id] += 1

    schedule = registry.schedule(NAME, queue_name, every=3600.0)
    async with run_worker(registry, queue_name, redis_url):
        pass  # the queue's layout and the schedule stored
    keys = partition_keys(queue_name, N)[0]
    now = server_ms(redis_client)
    tick = far_tick(N, now - 1000)
    redis_client.zadd(keys.schedules, {NAME: tick})
    taken, enqueued, left = take(redis_url, keys, tick, now, encode(schedule.data))
    tick_id = f"schedule:{NAME}:{tick}"
    assert (taken, enqueued, left) == (True, [], [tick])
    assert redis_client.hget(keys.schedule(NAME), "pending") == str(tick).encode()
    assert redis_client.zrange(keys.schedules_pending, 0, -1) == [NAME.encode()]
    assert stored_in(redis_client, queue_name, N, tick_id) == []
    # Taken a minute ago: other workers leave a pending tick to its taker for a few seconds.
    redis_client.zadd(keys.schedules_pending, {NAME: now - 60_000}, xx=True)
    async with run_worker(registry, queue_name, redis_url):
        async def ran_once() -> bool:
            return ran[tick_id] == 1

        await async_wait_until(ran_once, what=f"the pending tick's job {tick_id}")
        await drain(redis_url, queue_name)
    assert ran == Counter({tick_id: 1})
    assert stored_in(redis_client, queue_name, N, tick_id) == [route(N, tick_id)]
    assert redis_client.hget(keys.schedule(NAME), "pending") is None
    assert redis_client.zcard(keys.schedules_pending) == 0


async def test_removing_a_schedule_drops_its_pending_ticks(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[Any]) -> None:
        pass

    schedule = registry.schedule(NAME, queue_name, every=3600.0)
    async with run_worker(registry, queue_name, redis_url):
        pass
    keys = partition_keys(queue_name, N)[0]
    now = server_ms(redis_client)
    tick = far_tick(N, now - 1000)
    redis_client.zadd(keys.schedules, {NAME: tick})
    assert take(redis_url, keys, tick, now, encode(schedule.data))[2] == [tick]
    async with QueueClient(redis_url) as client:
        assert await client.remove_schedule(queue_name, NAME) is True
    assert redis_client.zcard(keys.schedules_pending) == 0
    assert not redis_client.exists(keys.schedule(NAME))
