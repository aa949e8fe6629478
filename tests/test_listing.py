"""Reading a database back through the clients: which queues exist, a state's jobs in a
useful order, whether a queue is known or paused, and whether Redis answers."""

from __future__ import annotations

import anyio
import pytest

from panqueue import (
    ConfigError,
    ConnectionError,
    Job,
    JobState,
    QueueClient,
    Registry,
    SyncQueueClient,
)
from panqueue.testing import run_worker
from tests.helpers import async_wait_until

pytestmark = pytest.mark.anyio


async def test_queues_lists_every_queue_with_state_in_redis(redis_url: str) -> None:
    async with QueueClient(redis_url) as client:
        assert await client.queues() == []
        assert not await client.queue_exists("beta")
        await client.queue("beta").add({})
        await client.queue("alpha").add({}, delay=60)
        assert await client.queues() == ["alpha", "beta"]
        assert await client.queue_exists("beta")
        assert not await client.queue_exists("gamma")


async def test_is_paused_follows_pause_and_resume(redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        await client.queue(queue_name).add({})
        assert not await client.is_paused(queue_name)
        await client.pause(queue_name)
        assert await client.is_paused(queue_name)
        await client.resume(queue_name)
        assert not await client.is_paused(queue_name)


async def test_ping_answers_or_raises_a_connection_error(redis_url: str) -> None:
    async with QueueClient(redis_url) as client:
        assert await client.ping() is None
    async with QueueClient("redis://127.0.0.1:1/0") as unreachable:
        with pytest.raises(ConnectionError, match="cannot reach Redis"):
            await unreachable.ping()


async def test_waiting_jobs_are_listed_in_claim_order(redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = await queue.add("first")
        urgent = await queue.add("urgent", priority=5)
        last = await queue.add("last")
        jobs = await client.list_jobs(queue_name, JobState.WAITING)
        assert [j.id for j in jobs] == [urgent.id, first.id, last.id]
        assert [j.data for j in jobs] == ["urgent", "first", "last"]
        assert all(j.state is JobState.WAITING and j.queue == queue_name for j in jobs)
        assert [j.id for j in await client.list_jobs(queue_name, "waiting", limit=2)] == [
            urgent.id, first.id]


async def test_finished_jobs_are_listed_newest_first(redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk(["a", "b", "c"])
        for handle in handles:
            await client.cancel(queue_name, handle.id)
            await anyio.sleep(0.005)  # distinct finish times (ms)
        newest_first = [h.id for h in reversed(handles)]
        cancelled = await client.list_jobs(queue_name, JobState.CANCELLED)
        assert [j.id for j in cancelled] == newest_first
        assert all(j.finished_at is not None for j in cancelled)
        limited = await client.list_jobs(queue_name, JobState.CANCELLED, limit=2)
        assert [j.id for j in limited] == newest_first[:2]
        assert await client.list_jobs(queue_name, JobState.FAILED) == []


async def test_delayed_jobs_are_listed_by_when_they_are_due(redis_url: str,
                                                            queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        later = await queue.add("later", delay=300)
        soon = await queue.add("soon", delay=100)
        between = await queue.add("between", delay=200)
        delayed = await client.list_jobs(queue_name, JobState.DELAYED)
        assert [j.id for j in delayed] == [soon.id, between.id, later.id]


async def test_keyed_waiting_jobs_are_listed_one_per_key_in_turn(
        redis_url: str, queue_name: str) -> None:
    """Ready keys in the order the claim visits them; a key at its concurrency limit after."""
    registry = Registry()
    release = anyio.Event()

    @registry.handler(queue_name, mode="keyed", key_concurrency=1, concurrency=1)
    async def hold(job: Job) -> None:
        await release.wait()

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name, mode="keyed")
        a1 = await queue.add("a1", key="a")
        async with run_worker(registry, queue_name, redis_url, grace=5.0):
            async def a1_runs() -> bool:
                return [j.id for j in await client.list_jobs(queue_name, "active")] == [a1.id]

            await async_wait_until(a1_runs, 10, "the worker to claim a1")
            a2 = await queue.add("a2", key="a")  # key a is at its limit (a1 runs)
            b1 = await queue.add("b1", key="b")
            b2 = await queue.add("b2", key="b")
            c1 = await queue.add("c1", key="c")
            waiting = await client.list_jobs(queue_name, JobState.WAITING)
            assert [j.id for j in waiting] == [b1.id, c1.id, a2.id, b2.id]
            limited = await client.list_jobs(queue_name, JobState.WAITING, limit=3)
            assert [j.id for j in limited] == [b1.id, c1.id, a2.id]
            first_turn = await client.list_jobs(queue_name, JobState.WAITING, limit=2)
            assert [j.id for j in first_turn] == [b1.id, c1.id]
            release.set()


async def test_list_jobs_refuses_an_unknown_state_or_a_bad_limit(redis_url: str,
                                                                 queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        with pytest.raises(ConfigError, match="unknown job state 'dead'"):
            await client.list_jobs(queue_name, "dead")
        for limit in (0, -1, 1.5, True):
            with pytest.raises(ConfigError, match="limit must be an int >= 1"):
                await client.list_jobs(queue_name, JobState.FAILED, limit=limit)  # type: ignore[arg-type]


def test_the_sync_client_mirrors_the_listings(redis_url: str, queue_name: str) -> None:
    with SyncQueueClient(redis_url) as client:
        client.ping()
        assert client.queues() == []
        assert not client.queue_exists(queue_name)
        handles = client.queue(queue_name).add_bulk(["x", "y"])
        assert client.queues() == [queue_name]
        assert client.queue_exists(queue_name)
        assert [j.id for j in client.list_jobs(queue_name, JobState.WAITING)] == [
            h.id for h in handles]
        client.pause(queue_name)
        assert client.is_paused(queue_name)
