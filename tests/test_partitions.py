"""Partitioned queues (``partitions=N``) on one server: routing, the claim rotation, and the
client's whole-queue views. The spread over a real cluster's masters is tests/test_cluster.py's."""

from __future__ import annotations

import contextlib
import json
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    Backoff,
    Chunk,
    ConfigError,
    Dedup,
    Event,
    FlowJob,
    Job,
    JobFailed,
    JobState,
    QueueClient,
    RateLimit,
    RateLimited,
    Registry,
    SyncQueueClient,
    Worker,
)
from panqueue._keys import partition_keys
from panqueue._runtime.claimer import ClaimLoop
from panqueue._store import transitions
from panqueue.testing import drain, run_worker
from tests.helpers import async_wait_until, run_cli

pytestmark = pytest.mark.anyio

N = 3


def _partition_of(redis_client: redis.Redis, queue: str, job_id: str) -> list[int]:
    """The partitions whose keyspace holds the job (exactly one, for a sound layout)."""
    return [keys.partition for keys in partition_keys(queue, N)
            if redis_client.exists(keys.job(job_id))]


def _salted_name_in(partition: int, prefix: str, salt: str = "") -> str:
    """A name ``prefix-i`` that routes to ``partition`` once ``salt`` is put before it (a dedup
    key routes as ``"dd:" + key``)."""
    return next(f"{prefix}-{i}" for i in range(1000)
                if zlib.crc32(f"{salt}{prefix}-{i}".encode()) % N == partition)


def _custom_id_in(partition: int, prefix: str, n: int = N) -> str:
    """A custom job id that routes to ``partition`` of ``n`` (by its CRC-32)."""
    for i in range(1000):
        job_id = f"{prefix}-{i}"
        if zlib.crc32(job_id.encode()) % n == partition:
            return job_id
    raise AssertionError("no id found")


async def test_jobs_spread_over_partitions_and_each_runs_once(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = Registry()
    ran: list[int] = []

    @registry.handler(queue_name, partitions=N, concurrency=4)
    async def work(job: Job[int]) -> int:
        ran.append(job.data)
        return job.data * 2

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        handles = await queue.add_bulk(range(30))
        single = await queue.add(100)
        where = Counter(_partition_of(redis_client, queue_name, h.id)[0] for h in handles)
        assert where == {0: 10, 1: 10, 2: 10}
        # A generated id names its partition.
        for handle in [*handles, single]:
            assert _partition_of(redis_client, queue_name, handle.id) == [int(handle.id) % N]
        counts = await client.counts(queue_name)
        assert counts[JobState.WAITING] == 31
        async with run_worker(registry, queue_name, redis_url):
            assert await single.result(timeout=10) == 200
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == 31
        assert sorted(ran) == [*range(30), 100]
        info = await client.get_job(queue_name, handles[4].id)
        assert info.state == JobState.COMPLETED and info.result == 8
        listed = await client.list_jobs(queue_name, JobState.COMPLETED, limit=100)
        assert sorted(job.id for job in listed) == sorted(h.id for h in [*handles, single])
        page = await client.list_jobs(queue_name, JobState.COMPLETED, limit=7, offset=5)
        assert [job.id for job in page] == [job.id for job in listed[5:12]]
        assert await client.queues() == [queue_name]


async def test_a_merged_list_keeps_each_states_order_and_its_pages_add_up(
        redis_url: str, queue_name: str) -> None:
    """A partitioned queue's list merges its partitions in the order of one partition's list:
    waiting jobs by priority then age, delayed ones by when they are due. A priority or a
    delay in one partition once hid an older job of it behind a newer one, and a page of one
    left out the job it should have held."""
    registry = Registry()

    @registry.handler(queue_name, partitions=2)
    async def work(job: Job[str]) -> None: ...

    async def listed(state: JobState) -> list[str]:
        whole = [job.id for job in await client.list_jobs(queue_name, state)]
        pages = [job.id for offset in range(len(whole))
                 for job in await client.list_jobs(queue_name, state, limit=1, offset=offset)]
        assert pages == whole
        return whole

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        # Oldest first, partitions 0, 1, 0; the newest with a priority.
        a = await queue.add("a", job_id=_custom_id_in(0, "a", 2))
        b = await queue.add("b", job_id=_custom_id_in(1, "b", 2))
        c = await queue.add("c", job_id=_custom_id_in(0, "c", 2), priority=10)
        assert await listed(JobState.WAITING) == [c.id, a.id, b.id]
        # Due last, in between, first.
        d = await queue.add("d", job_id=_custom_id_in(0, "d", 2), delay=600)
        e = await queue.add("e", job_id=_custom_id_in(1, "e", 2), delay=300)
        f = await queue.add("f", job_id=_custom_id_in(0, "f", 2), delay=60)
        assert await listed(JobState.DELAYED) == [f.id, e.id, d.id]


async def test_a_tags_merged_list_keeps_the_order_of_adds_over_the_partitions(
        redis_url: str, queue_name: str) -> None:
    """A tag's jobs are listed in the order they were added (each partition's index is); the
    merge sorted them by their state's order instead, so a priority in one partition put its
    list out of that order, and pages disagreed with the whole list."""
    registry = Registry()

    @registry.handler(queue_name, partitions=2)
    async def work(job: Job[str]) -> None: ...

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        # Added in three milliseconds (the server's clock orders them; adds of one
        # millisecond in different partitions have no order of their own).
        a = await queue.add("a", job_id=_custom_id_in(0, "a", 2), tags=["t"])
        await anyio.sleep(0.002)
        b = await queue.add("b", job_id=_custom_id_in(1, "b", 2), tags=["t"])
        await anyio.sleep(0.002)
        c = await queue.add("c", job_id=_custom_id_in(0, "c", 2), tags=["t"], priority=10)
        whole = [j.id for j in await client.list_jobs(queue_name, JobState.WAITING, tag="t")]
        pages = [j.id for offset in range(3) for j in await client.list_jobs(
            queue_name, JobState.WAITING, tag="t", limit=1, offset=offset)]
        assert whole == pages == [a.id, b.id, c.id]


async def test_a_queue_paused_before_its_layout_was_stored_is_paused_in_every_partition(
        redis_url: str, queue_name: str) -> None:
    """A pause by name before the layout was stored pauses the first partition only; the
    producer that stores the layout pauses the rest, so a job of another partition is
    explained as paused, not as waiting for a worker."""
    registry = Registry()

    @registry.handler(queue_name, partitions=3)
    async def work(job: Job[str]) -> None: ...

    async with QueueClient(redis_url) as client:
        await client.pause(queue_name)
        handle = await client.queue(work).add("x", job_id=_custom_id_in(2, "far", 3))
        explained = await client.explain(queue_name, handle.id)
        assert explained.reason == "paused", explained


async def test_the_claim_moves_past_empty_partitions(redis_url: str, queue_name: str) -> None:
    """Jobs only in the last partition: the first claim starts at an empty one and must go on
    (the poll interval is far longer than the test may take)."""
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[None]) -> str:
        return job.id

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        ids = [_custom_id_in(2, f"p2-{i}") for i in range(5)]
        for job_id in ids:
            await queue.add(None, job_id=job_id)
        with anyio.fail_after(20):
            async with run_worker(registry, queue_name, redis_url, poll_interval=60):
                for job_id in ids:
                    assert await queue.job(job_id).result(timeout=15) == job_id


async def test_custom_ids_stay_idempotent_and_keys_stay_in_one_partition(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = Registry()
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()

    @registry.handler(queue_name, partitions=N, mode="keyed", key_concurrency=1, concurrency=8)
    async def work(job: Job[str]) -> None:
        running[job.data] += 1
        most[job.data] = max(most[job.data], running[job.data])
        await anyio.sleep(0.01)
        running[job.data] -= 1

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        first = await queue.add("a", job_id="order-1", key="tenant-a")
        again = await queue.add("a", job_id="order-1", key="tenant-a")
        assert first.created and not again.created and again.id == first.id
        handles = []
        for i in range(40):
            tenant = f"tenant-{i % 4}"
            handles.append(await queue.add(tenant, key=tenant))
        for tenant in ("tenant-0", "tenant-1", "tenant-2", "tenant-3"):
            homes = {_partition_of(redis_client, queue_name, h.id)[0]
                     for h in handles if (await h.info()).data == tenant}
            assert len(homes) == 1
        async with run_worker(registry, queue_name, redis_url):
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == 41
        assert set(most.values()) == {1}  # key_concurrency=1 held in every partition


async def test_flows_pause_cancel_and_events_cover_every_partition(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()
    order: list[int] = []

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[int]) -> None:
        order.append(job.data)

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        await client.pause(queue_name)
        assert await client.is_paused(queue_name)
        chain = await queue.add_chain([1, 2, 3])
        spread = await queue.add_bulk([10, 11, 12])
        # Read once the queue is laid out: the read asks every partition for its events.
        _, position = await client.read_events(queue_name)
        doomed = await queue.add(99)
        assert await client.cancel(queue_name, doomed.id) == JobState.WAITING
        assert (await doomed.info()).state == JobState.CANCELLED
        async with run_worker(registry, queue_name, redis_url, poll_interval=0.2):
            await anyio.sleep(0.3)  # paused: nothing may start (no event to wait for)
            assert order == []
            await client.resume(queue_name)
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == 6 and counts[JobState.CANCELLED] == 1
        assert [n for n in order if n < 10] == [1, 2, 3]
        events, _ = await client.read_events(queue_name, position, limit=1000)
        completed = {e.job_id for e in events if e.type == "completed"}
        assert completed == {h.id for h in [*chain, *spread]}
        assert await client.retry_failed(queue_name) == 0
        assert await client.purge(queue_name) == 7


async def test_partition_count_is_validated(redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[Any]) -> None:
        return None

    with SyncQueueClient(redis_url) as client:
        client.queue(queue_name).add(1)  # by name, before any worker: one partition
        with pytest.raises(ConfigError, match="partition count mismatch"):
            client.queue(work).add(2)
    with pytest.raises(ConfigError, match="partition count mismatch: the queue has 1 "):
        await Worker(registry, queue_name, url=redis_url).run()
    with pytest.raises(ConfigError, match="partitions must be an int between 1 and 1024"):
        Registry().handler("other", partitions=0)
    with pytest.raises(ConfigError, match="may not contain"):
        Registry().handler("a#1")
    # A chunk handler's claim loop serves one partition (it never shares partitions out).
    with pytest.raises(ConfigError, match="chunk handlers do not run on partitioned queues"):
        Registry().handler("chunked", partitions=2, chunk=Chunk(size=5))


async def test_a_named_producer_follows_the_stored_count(redis_url: str,
                                                         queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[int]) -> int:
        return job.data

    async with run_worker(registry, queue_name, redis_url), QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk(range(9))
        assert {int(h.id) % N for h in handles} == {0, 1, 2}
        assert [await h.result(timeout=10) for h in handles] == list(range(9))


async def test_the_rate_limit_stays_global_across_partitions(redis_url: str,
                                                            queue_name: str) -> None:
    """Two workers, three partitions, one window: no 1-second span holds more than 10 starts
    (by the server's start times). Per-partition windows would allow 30."""
    registry = Registry()

    @registry.handler(queue_name, partitions=N, concurrency=10,
                      rate_limit=RateLimit(max=10, per=1.0))
    async def work(job: Job[int]) -> None:
        return None

    async with QueueClient(redis_url) as client:
        handles = await client.queue(work).add_bulk(range(25))
        async with run_worker(registry, queue_name, redis_url), \
                run_worker(registry, queue_name, redis_url):
            await drain(redis_url, queue_name, timeout=20)
        starts = sorted([(await h.info()).started_at for h in handles])  # type: ignore[type-var]
    assert len(starts) == 25 and None not in starts
    # A start is counted when its claim takes it, a moment before the claim stamps the job.
    for first, eleventh in zip(starts, starts[10:], strict=False):
        assert (eleventh - first).total_seconds() >= 0.95


async def test_events_schedules_and_dedup_on_a_partitioned_queue(redis_url: str,
                                                                 queue_name: str) -> None:
    registry = Registry()
    ticks: list[str] = []

    @registry.handler(queue_name, partitions=N, concurrency=4)
    async def work(job: Job[Any]) -> None:
        if job.id.startswith("schedule:"):
            ticks.append(job.id)

    registry.schedule("often", queue_name, every=0.1)
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        first = await queue.add("x", dedup=Dedup(key="same", ttl=60))
        second = await queue.add("y", dedup=Dedup(key="same", ttl=60))
        assert second.id == first.id and not second.created
        # The queue's layout is stored: a read asks every partition for every event.
        await client.read_events(queue_name)
        followed: list[Event] = []
        spread = await queue.add_bulk(range(6))
        expected = {h.id for h in spread}

        async def follow() -> None:
            async for event in client.events(queue_name, after="0-0"):
                followed.append(event)
                if expected <= {e.job_id for e in followed if e.type == "completed"}:
                    return

        with anyio.fail_after(15):
            async with run_worker(registry, queue_name, redis_url), \
                    run_worker(registry, queue_name, redis_url), anyio.create_task_group() as tg:
                tg.start_soon(follow)
                while len(ticks) < 4:
                    await anyio.sleep(0.05)
    # Every partition's events came through, in time order within each partition.
    assert {e.job_id for e in followed if e.type == "added"} >= expected
    # Two workers, one job per tick.
    assert len(ticks) == len(set(ticks)) >= 4


async def test_a_batch_over_a_partitioned_queue_fires_once(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """The batch's jobs spread over the partitions; their endings reach the batch from each
    partition's outbox, and the callback (on another partitioned queue) is added once."""
    registry = Registry()
    done = f"{queue_name}-done"
    called: list[dict[str, Any]] = []

    @registry.handler(queue_name, partitions=N, concurrency=8)
    async def work(job: Job[int]) -> None:
        return None

    @registry.handler(done, partitions=N)
    async def finished(job: Job[dict[str, Any]]) -> None:
        called.append(job.data["batch"])

    async with QueueClient(redis_url) as client:
        client.queue(finished)  # (the callback queue is declared by its worker below)
        batch = await client.batch(on_complete=(done, {}))
        handles = await batch.add_bulk(work, range(30))
        await batch.close()
        homes = {keys.partition for keys in partition_keys(queue_name, N)
                 for h in handles if redis_client.exists(keys.job(h.id))}
        assert homes == {0, 1, 2}
        with anyio.fail_after(20):
            async with run_worker(registry, queue_name, redis_url), \
                    run_worker(registry, done, redis_url):
                while not called:
                    await anyio.sleep(0.05)
        info = await batch.info()
    assert (info.total, info.completed, info.failed, info.pending) == (30, 30, 0, 0)
    assert len(called) == 1 and called[0]["completed"] == 30


def test_the_cli_shows_a_partitioned_queue_whole(redis_url: str, queue_name: str) -> None:
    """`info`, `jobs`, `dlq` and `explain` read every partition (through the client)."""
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[int]) -> None: ...

    with SyncQueueClient(redis_url) as client:
        handles = client.queue(work).add_bulk(range(9))
        failed = client.queue(work).add(-1, job_id=_custom_id_in(2, "doomed"))
        client.cancel(queue_name, failed.id)
    info = run_cli("info", "--json", "--url", redis_url)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["queues"][queue_name]["waiting"] == 9
    listed = run_cli("jobs", queue_name, "--json", "--url", redis_url)
    assert listed.returncode == 0, listed.stderr
    assert sorted(job["id"] for job in json.loads(listed.stdout)) == sorted(h.id for h in handles)
    cancelled = run_cli("jobs", queue_name, "--state", "cancelled", "--json", "--url", redis_url)
    assert [job["id"] for job in json.loads(cancelled.stdout)] == [failed.id]
    explained = run_cli("explain", queue_name, failed.id, "--json", "--url", redis_url)
    assert explained.returncode == 0 and "cancelled" in explained.stdout, explained.stderr


async def test_a_worker_shares_its_slots_among_the_partitions(redis_url: str,
                                                              queue_name: str) -> None:
    """Six slots, three partitions full of work: two slots each, not six in the partition the
    first claim asked (each slot's completion claims in its own partition, so the first
    spread is the one that lasts)."""
    registry = Registry()
    running: list[int] = []
    release = anyio.Event()

    @registry.handler(queue_name, partitions=N, concurrency=6)
    async def work(job: Job[int]) -> None:
        running.append(int(job.id) % N)
        await release.wait()

    async with QueueClient(redis_url) as client:
        await client.queue(work).add_bulk(range(30))
        with anyio.fail_after(10):
            async with run_worker(registry, queue_name, redis_url):
                while len(running) < 6:
                    await anyio.sleep(0.01)
                assert Counter(running) == {0: 2, 1: 2, 2: 2}
                release.set()


def _waiting(redis_client: redis.Redis, keys: Any) -> int:
    return int(redis_client.llen(keys.wait_list)) + int(redis_client.zcard(keys.wait))


@contextlib.asynccontextmanager
async def _sharing(client: QueueClient, queue_name: str, redis_url: str,
                   registries: list[Registry], names: list[str]) -> AsyncIterator[None]:
    """One worker of each registry, named by ``names``, on the paused queue ``queue_name`` of
    as many partitions: resumed once each has read the registry since all were in it (each
    knows its one partition)."""
    async with contextlib.AsyncExitStack() as stack:
        workers = [await stack.enter_async_context(run_worker(
            registry, queue_name, redis_url, name=name, poll_interval=0.1))
            for registry, name in zip(registries, names, strict=True)]
        for worker in workers:
            while worker._roles is None or len(worker._roles.claimer._shares.own) != 1:
                await anyio.sleep(0.01)
        await client.resume(queue_name)
        yield


async def test_workers_keep_to_their_partitions_while_those_have_work(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """Two workers, two partitions full of work: once each knows the other and has started a
    job of its own partition, it runs the other's jobs only when its own has none waiting.
    (Before: each worker's claims spread its slots over both partitions, so the completions of
    each partition batched half as many jobs per call.) Until its own partition's first job
    a worker may help in the other: the resume reaches the partitions one after the other."""
    parts = partition_keys(queue_name, 2)
    # Sorted by name, the first worker serves partition 0 first, the second partition 1.
    names = [f"a-{queue_name}", f"b-{queue_name}"]
    ran: Counter[tuple[str, int]] = Counter()
    strays: list[tuple[str, int]] = []  # (worker, waiting in its own partition then)

    def registry_of(own: int) -> tuple[Registry, Any]:
        registry = Registry()

        @registry.handler(queue_name, partitions=2, concurrency=5)
        async def work(job: Job[int]) -> None:
            part = int(job.id) % 2
            ran[names[own], part] += 1
            if part != own and ran[names[own], own] > 0:
                strays.append((names[own], _waiting(redis_client, parts[own])))
            await anyio.sleep(0.002)

        return registry, work

    (registry_a, work), (registry_b, _) = registry_of(0), registry_of(1)
    async with QueueClient(redis_url) as client:
        await client.pause(queue_name)
        await client.queue(work).add_bulk(range(600))
        with anyio.fail_after(30):
            async with _sharing(client, queue_name, redis_url, [registry_a, registry_b], names):
                counts = await drain(redis_url, queue_name, timeout=25)
    assert counts[JobState.COMPLETED] == 600
    assert [stray for stray in strays if stray[1] > 0] == []
    # Each partition's jobs ran mostly on its own worker (the rest: help at the end).
    assert ran[names[0], 0] > 150 and ran[names[1], 1] > 150, ran


async def test_a_helping_worker_comes_back_when_its_own_partition_gets_work(
        redis_url: str, queue_name: str) -> None:
    """Two workers, two partitions, work only in the first: the second worker helps there
    (its slots stay for a second, completing and claiming in one call). A job added to its own
    partition then wakes it, and its slots come back at their next completions instead of at
    the end of that second. (Before: it started about a second's worth of the other's jobs
    first.)"""
    names = [f"a-{queue_name}", f"b-{queue_name}"]
    started: list[tuple[int, str]] = []  # (the second worker's jobs: partition, id) in order
    helping = anyio.Event()  # the second worker started its first job (in partition 0)

    def registry_of(own: int) -> tuple[Registry, Any]:
        registry = Registry()

        @registry.handler(queue_name, partitions=2, concurrency=3)
        async def work(job: Job[int]) -> None:
            if own == 1:
                started.append((job.data, job.id))
                helping.set()
            await anyio.sleep(0.01)

        return registry, work

    (registry_a, work), (registry_b, _) = registry_of(0), registry_of(1)
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        await client.pause(queue_name)
        await queue.add_bulk([0] * 1000)  # ids from the queue's counter: both partitions
        for job in await client.list_jobs(queue_name, JobState.WAITING, limit=1000):
            if int(job.id) % 2 == 1:
                await client.remove(queue_name, job.id)
        with anyio.fail_after(30):
            async with _sharing(client, queue_name, redis_url, [registry_a, registry_b], names):
                await helping.wait()
                late = await queue.add(1, job_id=_custom_id_in(1, "late", 2))
                added_at = len(started)
                await late.result(timeout=10)
    helped_after = [i for i, (part, _) in enumerate(started) if part == 0 and i >= added_at]
    late_at = started.index((1, late.id))
    # Only what its slots claimed before the wake-up reached them (a round or two of 10 ms jobs;
    # before, 180 to 210: the rest of the second).
    assert len([i for i in helped_after if i < late_at]) <= 15, (late_at - added_at)


async def test_a_paused_or_dead_worker_leaves_its_share_to_the_others(
        redis_url: str, queue_name: str) -> None:
    """The share counts only workers that claim: one paused by a command, or one that died
    (its registry entry still live until it expires), gives its partitions back to the
    others, so none of them waits for a worker that will not come."""
    registry = Registry()

    @registry.handler(queue_name, partitions=2, concurrency=2)
    async def work(job: Job[int]) -> None:
        return None

    def share(worker: Worker) -> list[int]:
        assert worker._roles is not None
        return sorted(worker._roles.claimer._shares.own)

    async def until(worker: Worker, wanted: list[int]) -> None:
        while worker._roles is None or share(worker) != wanted:
            await anyio.sleep(0.02)

    names = [f"a-{queue_name}", f"b-{queue_name}"]
    async with QueueClient(redis_url) as client:
        with anyio.fail_after(30):
            async with run_worker(registry, queue_name, redis_url, name=names[0],
                                  poll_interval=0.1) as first, \
                    run_worker(registry, queue_name, redis_url, name=names[1],
                               poll_interval=0.1, heartbeat_interval=0.2) as second:
                await until(first, [0])
                await until(second, [1])
                await client.control(names[1], "pause")
                await until(first, [0, 1])  # the paused worker claims nothing
                await client.control(names[1], "resume")
                await until(first, [0])
            # A dead worker's entry (written as a beat would, live for 1.5 s): "a-" keeps
            # partition 0 until the entry expires, then serves both.
            parts = partition_keys(queue_name, 2)
            async with run_worker(registry, queue_name, redis_url, name=names[0],
                                  poll_interval=0.1) as alone:
                await client._run(transitions.heartbeat(
                    parts[0], names[1], 1500, host="gone", pid=1, queues=[queue_name],
                    concurrency=2, running=[]))
                await until(alone, [0])
                await until(alone, [0, 1])


async def test_a_partition_that_fills_while_the_slots_are_busy_elsewhere_is_served_soon(
        redis_url: str, queue_name: str) -> None:
    """One worker, its slots all busy in partition 1 (partition 0 was empty when they were
    claimed): a job added to partition 0 then starts within about a second (the slots are
    shared out again once a second), while partition 1 still has much of its work waiting.
    (Before: a slot's completion always claimed its next job in its own partition, so
    partition 0 waited until partition 1 was empty.)"""
    registry = Registry()
    started: list[int] = []  # each job's data (its partition), in the order they started

    @registry.handler(queue_name, partitions=2, concurrency=4)
    async def work(job: Job[int]) -> None:
        started.append(job.data)
        await anyio.sleep(0.02)

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        for i in range(400):  # 400 x 20 ms over 4 slots: 2 s of work in partition 1
            await queue.add(1, job_id=_custom_id_in(1, f"one-{i}", 2))
        with anyio.fail_after(30):
            async with run_worker(registry, queue_name, redis_url):
                while len(started) < 8:
                    await anyio.sleep(0.01)
                late = await queue.add(0, job_id=_custom_id_in(0, "zero", 2))
                await late.result(timeout=10)
                ones_before = started.index(0)
                counts = await drain(redis_url, queue_name, timeout=20)
    assert counts[JobState.COMPLETED] == 401
    assert ones_before < 300, ones_before  # partition 1 still had a quarter of its work


async def test_a_handlers_rate_limited_pauses_every_partition(redis_url: str,
                                                              queue_name: str) -> None:
    """Global mode: RateLimited pauses the whole queue, not only the partition of the job that
    raised it. One slot, jobs in every partition: nothing starts for retry_after."""
    registry = Registry()
    starts: list[float] = []

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[int]) -> None:
        starts.append(time.monotonic())
        if len(starts) == 1:
            raise RateLimited(retry_after=1.0)

    async with QueueClient(redis_url) as client:
        handles = await client.queue(work).add_bulk(range(9))
        with anyio.fail_after(20):
            async with run_worker(registry, queue_name, redis_url, poll_interval=0.1):
                for handle in handles:
                    await handle.result(timeout=15)
    assert len(starts) == 10
    assert min(starts[1:]) - starts[0] >= 0.9


async def test_a_rate_limited_job_cancelled_meanwhile_still_pauses_every_partition(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """The handler's job is cancelled while it runs, and the handler then raises RateLimited:
    the job ends CANCELLED, and the service's refusal pauses the whole queue all the same, as
    it does on a queue of one partition."""
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[int]) -> None:
        with SyncQueueClient(redis_url) as client:  # no await: the cancel is heard after
            client.cancel(queue_name, job.id)
        raise RateLimited(retry_after=60.0)

    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, redis_url):
        handle = await client.queue(work).add(1)
        with pytest.raises(JobFailed):
            await handle.result(timeout=10)
        assert (await handle.info()).state is JobState.CANCELLED

        async def all_paused() -> bool:  # the worker pauses the others after the script
            return all(redis_client.hget(keys.meta, "pu") is not None
                       for keys in partition_keys(queue_name, N))

        await async_wait_until(all_paused, what="every partition paused")


async def test_delayed_and_retried_jobs_on_every_partition(redis_url: str,
                                                          queue_name: str) -> None:
    """Delays and retries with backoff work in each partition (each worker promotes due jobs
    in every partition)."""
    registry = Registry()
    tries: Counter[str] = Counter()

    @registry.handler(queue_name, partitions=N, attempts=2,
                      backoff=Backoff(kind="fixed", delay=0.2))
    async def work(job: Job[int]) -> int:
        tries[job.id] += 1
        if tries[job.id] == 1:
            raise ValueError("first try fails")
        return job.data

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        delayed = [await queue.add(i, delay=0.3) for i in range(6)]
        assert {int(h.id) % N for h in delayed} == {0, 1, 2}
        assert (await client.counts(queue_name))[JobState.DELAYED] == 6
        async with run_worker(registry, queue_name, redis_url, stalled_interval=0.1):
            assert [await h.result(timeout=10) for h in delayed] == list(range(6))
    assert set(tries.values()) == {2}


async def test_dependencies_in_two_partitions_are_refused(redis_url: str,
                                                          queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[int]) -> None: ...

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        first = await queue.add(1, job_id=_custom_id_in(0, "first"))
        second = await queue.add(2, job_id=_custom_id_in(1, "second"))
        with pytest.raises(ConfigError, match="depends_on names jobs of two partitions"):
            await queue.add(3, depends_on=[first, second])
        after = await queue.add(4, depends_on=[second])
        assert int(after.id) % N == 1 and (await after.info()).state == JobState.BLOCKED
        assert (await client.counts(queue_name))[JobState.BLOCKED] == 1


async def test_the_rate_limit_holds_when_a_claim_comes_late_after_its_take(
        redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker stalls 0.3 s after every other take of starts, before the claim that uses
    them. The starts must count in the window in which the jobs actually start: no 1-second
    span of start times (the server's, on the jobs) holds more than 10."""
    takes = 0
    original = ClaimLoop._take_starts

    async def stalling_take(self: ClaimLoop, keys: Any, wanted: int, name: str
                            ) -> tuple[int, int] | None:
        nonlocal takes
        taken = await original(self, keys, wanted, name)
        takes += 1
        if taken is not None and taken[0] > 0 and takes % 2:
            await anyio.sleep(0.3)  # the stall under test: a late claim, not a synchronisation
        return taken

    monkeypatch.setattr(ClaimLoop, "_take_starts", stalling_take)
    registry = Registry()

    @registry.handler(queue_name, partitions=4, concurrency=20,
                      rate_limit=RateLimit(max=10, per=1.0))
    async def work(job: Job[int]) -> None:
        return None

    async with QueueClient(redis_url) as client:
        handles = await client.queue(work).add_bulk(range(40))
        async with run_worker(registry, queue_name, redis_url):
            await drain(redis_url, queue_name, timeout=30)
        starts = sorted([(await h.info()).started_at for h in handles])  # type: ignore[type-var]
    assert len(starts) == 40 and None not in starts
    crowded = [(first, eleventh) for first, eleventh in zip(starts, starts[10:], strict=False)
               if (eleventh - first).total_seconds() < 1.0]
    assert not crowded, f"11 starts within one second: {crowded[0]}"


async def test_a_flow_whose_keys_route_to_two_partitions_is_refused(redis_url: str,
                                                                   queue_name: str) -> None:
    """A flow lives in one partition, and a key in the partition it routes to (so that its
    limits hold): a keyed flow whose keys route apart is refused, with nothing written; one
    whose keys share a partition is added."""
    registry = Registry()

    @registry.handler(queue_name, partitions=N, mode="keyed", key_concurrency=1)
    async def work(job: Job[str]) -> None: ...

    def key_in(partition: int, prefix: str) -> str:
        return next(f"{prefix}-{i}" for i in range(1000)
                    if zlib.crc32(f"{prefix}-{i}".encode()) % N == partition)

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        apart = [FlowJob("x", options={"key": key_in(0, "a")}),
                 FlowJob("y", options={"key": key_in(1, "b")})]
        with pytest.raises(ConfigError, match="its keys must route to the same partition"):
            await queue.add_flow(apart)
        assert sum((await client.counts(queue_name)).values()) == 0
        together = [FlowJob("x", options={"key": key_in(1, "a")}),
                    FlowJob("y", options={"key": key_in(1, "b")})]
        added = await queue.add_flow(together)
        assert len(added) == 2 and all(h.created for h in added)


async def test_a_flow_refused_for_a_dedup_key_replaces_no_job_by_another(
        redis_url: str, queue_name: str) -> None:
    """As below, with the refusal coming from an item whose dedup key (keep) names a job of
    another partition that a later item waits for: the replace decided before it deleted the
    job it replaces, and the flow was then refused."""
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[str]) -> None: ...

    first = _salted_name_in(0, "x")
    kept, replaced = _salted_name_in(1, "k", "dd:"), _salted_name_in(1, "d", "dd:")
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        old = await queue.add("old", dedup=Dedup(replaced, ttl=600))
        other = await queue.add("other", job_id=_salted_name_in(1, "y"), dedup=Dedup(kept, ttl=600))
        with pytest.raises(ConfigError, match="nothing was added"):
            await queue.add_flow([
                FlowJob("first", job_id=first),
                FlowJob("new", options={"dedup": Dedup(replaced, ttl=600, strategy="replace")}),
                FlowJob("kept", options={"dedup": Dedup(kept, ttl=600)}),
                FlowJob("dep", depends_on=[2]),
            ])
        assert (await old.info()).state is JobState.WAITING
        assert (await other.info()).state is JobState.WAITING
        assert sum((await client.counts(queue_name)).values()) == 2


async def test_a_refused_flow_replaces_no_job_by_its_dedup_key(redis_url: str,
                                                               queue_name: str) -> None:
    """A flow one of whose items waits for an item whose custom id names a job of another
    partition is refused, and nothing is written: not even the dedup replace of another item,
    decided in its key's home partition, deletes the job it would replace."""
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[str]) -> None: ...

    first, named = _salted_name_in(0, "x"), _salted_name_in(1, "y")
    key = _salted_name_in(1, "d", "dd:")
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        old = await queue.add("old", dedup=Dedup(key, ttl=600))
        await queue.add("y", job_id=named)
        with pytest.raises(ConfigError, match="nothing was added"):
            await queue.add_flow([
                FlowJob("first", job_id=first),
                FlowJob("new", options={"dedup": Dedup(key, ttl=600, strategy="replace")}),
                FlowJob("y", job_id=named),
                FlowJob("dep", depends_on=[2]),
            ])
        assert (await old.info()).state is JobState.WAITING
        assert sum((await client.counts(queue_name)).values()) == 2


async def test_a_flow_of_ids_nobody_chose_is_not_looked_up_item_by_item(
        redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids a flow waits for are looked up before anything is decided, but only custom
    ones: a chain of generated ids looks none up."""
    from panqueue._store.ops import routing

    looked_up: list[str] = []
    real = routing.job_partition

    def counting(parts: Any, job_id: str) -> Any:
        looked_up.append(job_id)
        return (yield from real(parts, job_id))

    monkeypatch.setattr(routing, "job_partition", counting)
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[int]) -> None: ...

    async with QueueClient(redis_url) as client:
        added = await client.queue(work).add_chain([FlowJob(i) for i in range(50)])
        assert len(added) == 50 and looked_up == []
        await client.queue(work).add_flow([FlowJob(0, job_id="mine"),
                                           FlowJob(1, depends_on=[0])])
    assert looked_up == ["mine"]
