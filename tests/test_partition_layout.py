"""A partitioned queue's layout (partition count, placement, version) across deploys: a worker of
another count changes it only while no partition holds a job, a producer that learned an older
layout is refused and routes its jobs again, and no sequence of deploys and producers leaves a
job where the queue does not look. On one real server; placement itself is test_placement.py's."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import redis

from panqueue import ConfigError, Job, JobState, QueueClient, Registry, Worker
from panqueue._keys import LEGACY_PLACEMENT, BatchKeys, Layout, partition_keys
from panqueue._store import transitions
from panqueue._store.ops import layout as ops_layout
from panqueue._store.ops.batches import callback_id
from panqueue.testing import drain, run_worker

pytestmark = pytest.mark.anyio


def _deploy(name: str, count: int, seen: list[Any] | None = None) -> tuple[Registry, Any]:
    """A registry whose handler serves ``name`` with ``count`` partitions (and the handler)."""
    registry = Registry()

    @registry.handler(name, partitions=count, concurrency=4)
    async def work(job: Job[Any]) -> Any:
        if seen is not None:
            seen.append(job.data)
        return job.data

    return registry, work


async def test_a_worker_of_another_count_is_refused_while_a_partition_holds_jobs(
        redis_url: str, queue_name: str) -> None:
    """Stored as 4, jobs only in partitions 2 and 3: a worker declaring 2 (whose partitions are
    empty) is refused with one line naming both counts and the partition that holds jobs, and
    nothing changes: every job stays visible and a worker of the stored count runs it."""
    registry4, work4 = _deploy(queue_name, 4)
    registry2, work2 = _deploy(queue_name, 2)
    async with QueueClient(redis_url) as client:
        handles = await client.queue(work4).add_bulk(range(8))  # generated ids: id % 4
        for handle in handles:
            if int(handle.id) % 4 < 2:
                assert await client.remove(queue_name, handle.id)
        kept = sorted(handle.id for handle in handles if int(handle.id) % 4 >= 2)
        assert len(kept) == 4
        with pytest.raises(ConfigError, match=r"partition count mismatch: the queue has 4 "
                           r"partition\(s\), this worker says 2, and its partition 2 .*holds "
                           r"jobs .*drain and purge"):
            with anyio.fail_after(10):
                await Worker(registry2, queue_name, url=redis_url).run()
        with pytest.raises(ConfigError, match="partition count mismatch: the queue has 4 "):
            await client.queue(work2).add(1)
        assert (await client.counts(queue_name))[JobState.WAITING] == 4
        for job_id in kept:
            assert (await client.get_job(queue_name, job_id)).state == JobState.WAITING
        async with run_worker(registry4, queue_name, redis_url, poll_interval=0.05):
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == 4


async def test_a_worker_of_another_count_is_refused_while_workers_of_the_old_one_run(
        redis_url: str, queue_name: str) -> None:
    """The queue is empty, but a worker of the stored count still serves it: a worker declaring
    another count waits the life of a registry entry (three of its heartbeats) for it to leave,
    then is refused with one line, and the layout stays as the running worker knows it (a job
    added now runs there)."""
    registry3, work3 = _deploy(queue_name, 3)
    registry2, _ = _deploy(queue_name, 2)
    async with QueueClient(redis_url) as client:
        async with run_worker(registry3, queue_name, redis_url, poll_interval=0.05):
            started = anyio.current_time()
            with pytest.raises(ConfigError, match=r"partition count mismatch: the queue has 3 "
                               r"partition\(s\), this worker says 2, and 1 live worker\(s\) "
                               r"serve it with 3 \(stop them first"):
                with anyio.fail_after(10):
                    await Worker(registry2, queue_name, url=redis_url,
                                 heartbeat_interval=1.0).run()
            assert anyio.current_time() - started >= 3.0
            handles = await client.queue(work3).add_bulk(range(6))
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == 6
        assert {int(h.id) % 3 for h in handles} == {0, 1, 2}


async def test_a_worker_of_another_count_waits_for_the_entry_of_one_that_could_not_leave(
        redis_url: str, queue_name: str) -> None:
    """A worker of the old count died, or stopped and lost its last call: its registry entry
    lives on until its TTL ends. A worker declaring another count waits for that (up to three
    of its own heartbeats) and changes the layout, rather than exit."""
    registry3, _ = _deploy(queue_name, 3)
    registry2, work2 = _deploy(queue_name, 2)
    async with QueueClient(redis_url) as client:
        async with run_worker(registry3, queue_name, redis_url, poll_interval=0.05):
            pass
        # The entry the old worker would have left, had its last call been lost: 1.5 s to live.
        layout = await client._run(ops_layout.read_layout(queue_name))
        assert layout is not None and layout.count == 3
        await client._run(transitions.heartbeat(
            layout.keys(queue_name)[0], "gone-worker", 1500, host="h", pid=1,
            queues=[queue_name], concurrency=1, running=[]))
        started = anyio.current_time()
        with anyio.fail_after(10):
            async with run_worker(registry2, queue_name, redis_url, poll_interval=0.05,
                                  heartbeat_interval=1.0):
                waited = anyio.current_time() - started
                handles = await client.queue(work2).add_bulk(range(4))
                counts = await drain(redis_url, queue_name)
        assert waited >= 1.0
        assert counts[JobState.COMPLETED] == 4
        assert {int(h.id) % 2 for h in handles} == {0, 1}


async def test_no_sequence_of_redeploys_loses_a_job_of_a_producer_that_learned_an_old_layout(
        redis_url: str, queue_name: str) -> None:
    """One producer names the queue by string for its whole life (it learns the stored layout
    once). Deploy after deploy the queue is drained, purged and redeployed with another count;
    every job the producer added, one by one and in bulk, runs exactly once."""
    seen: list[Any] = []
    expected: list[Any] = []
    async with QueueClient(redis_url) as producer, QueueClient(redis_url) as admin:
        for deploy, count in enumerate([4, 2, 3, 1, 4, 3]):
            registry, _ = _deploy(queue_name, count, seen)
            async with run_worker(registry, queue_name, redis_url, poll_interval=0.05):
                queue = producer.queue(queue_name)
                for i in range(5):
                    await queue.add([deploy, i])
                    await queue.add([deploy, "id", i], job_id=f"d{deploy}-{i}")
                await queue.add_bulk([[deploy, "bulk", i] for i in range(7)])
                expected += [[deploy, i] for i in range(5)]
                expected += [[deploy, "id", i] for i in range(5)]
                expected += [[deploy, "bulk", i] for i in range(7)]
                counts = await drain(redis_url, queue_name)
                assert counts.get(JobState.COMPLETED, 0) == 17, (count, counts)
            assert await admin.purge(queue_name) == 17
    assert sorted(map(repr, seen)) == sorted(map(repr, expected))


async def test_a_client_that_learned_an_old_layout_sees_every_job_of_the_new_one(
        redis_url: str, queue_name: str) -> None:
    """A client learned 2 partitions; the emptied queue is redeployed with 4 and another
    producer fills all four: the first client's counts, lists and lookups by id see every
    job (none hides in a partition its old layout did not have)."""
    registry2, work2 = _deploy(queue_name, 2)
    registry4, work4 = _deploy(queue_name, 4)
    async with QueueClient(redis_url) as stale, QueueClient(redis_url) as producer:
        await stale.queue(work2).add("learn")
        async with run_worker(registry2, queue_name, redis_url, poll_interval=0.05):
            await drain(redis_url, queue_name)
        await stale.purge(queue_name)
        async with run_worker(registry4, queue_name, redis_url, poll_interval=0.05):
            pass  # changes the layout, then stops: the jobs below wait
        handles = await producer.queue(work4).add_bulk(range(8))
        assert {int(h.id) % 4 for h in handles} == {0, 1, 2, 3}
        assert (await stale.counts(queue_name))[JobState.WAITING] == 8
        assert len(await stale.list_jobs(queue_name, JobState.WAITING)) == 8
        for handle in handles:
            assert (await stale.get_job(queue_name, handle.id)).state == JobState.WAITING


async def test_adds_racing_a_count_change_are_kept_where_the_queue_looks(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """A producer that learned 3 partitions adds job after job while a worker declaring 2
    starts: the change either goes ahead before the adds land or is refused because they did.
    Either way every acknowledged job is in a partition of the stored layout, counted, found,
    and run."""
    chooser = random.Random(7)
    changed: list[bool] = []
    for round_ in range(10):
        name = f"{queue_name}-{round_}"
        _, work3 = _deploy(name, 3)
        registry2, _ = _deploy(name, 2)
        added: list[str] = []
        async with QueueClient(redis_url) as producer, QueueClient(redis_url) as admin:
            await producer.queue(work3).add("first")
            await admin.purge(name)  # declared as 3 and empty: a change may go ahead

            async with anyio.create_task_group() as tg:
                started = anyio.Event()
                # Even rounds: the change is done before the first add, which is refused and
                # routed again. Odd rounds: adds and the change overlap at random.
                after = started.wait if round_ % 2 == 0 else lambda: anyio.sleep(
                    chooser.random() * 0.03)
                tg.start_soon(_add_one_by_one, producer, name, added, after)
                tg.start_soon(_start_and_stop, registry2, name, redis_url, started)
            layout = await producer._run(ops_layout.read_layout(name))
            assert layout is not None
            changed.append(layout.count == 2)
            parts = layout.keys(name)
            for job_id in added:
                holders = [keys.partition for keys in parts
                           if redis_client.exists(keys.job(job_id))]
                assert len(holders) == 1, (job_id, layout)
            total = sum((await admin.counts(name)).values())
            assert total == len(added)
            registry, _ = _deploy(name, layout.count)
            async with run_worker(registry, name, redis_url, poll_interval=0.05):
                counts = await drain(redis_url, name)
            assert counts.get(JobState.COMPLETED, 0) == len(added)
            await admin.purge(name)
    assert all(changed[::2]), changed  # the even rounds' change went ahead


async def _add_one_by_one(producer: QueueClient, name: str, added: list[str],
                          after: Callable[[], Awaitable[Any]]) -> None:
    await after()
    for i in range(30):
        try:
            added.append((await producer.queue(name).add(i)).id)
        except ConfigError as exc:  # a change under way, past every retry: not added
            assert "stored layout" in str(exc)


async def _start_and_stop(registry: Registry, name: str, url: str, started: anyio.Event
                         ) -> None:
    """Start a worker and stop it at once; a refusal of its count is fine."""
    try:
        async with run_worker(registry, name, url, poll_interval=0.05):
            started.set()
    except* ConfigError as group:
        assert all("holds jobs" in str(exc) for exc in group.exceptions), group
    started.set()


async def test_a_partition_left_moved_by_an_interrupted_change_is_given_back(
        redis_url: str, queue_name: str) -> None:
    """A change that stopped after moving one partition (and before the home) leaves that
    partition refusing the stored layout: adds routed there fail with one line and are not
    acknowledged; the next worker of the queue gives the partition back, and adds go on."""
    registry, work = _deploy(queue_name, 3)
    async with QueueClient(redis_url) as client:
        await client.queue(work).add(0)  # declared: 3 partitions, version 0; spread starts at 0
        moved = partition_keys(queue_name, 3)[2]
        assert await client._run(ops_layout._relayout(moved, 1, "2:1")) is None
        await client.queue(work).add(1)  # partition 1
        with pytest.raises(ConfigError, match="refused the queue's stored layout"):
            await client.queue(work).add(2)  # partition 2: refused, not added
        assert sum((await client.counts(queue_name)).values()) == 2
        async with run_worker(registry, queue_name, redis_url, poll_interval=0.05):
            await client.queue(work).add(3)
            await client.queue(work).add(4)
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == 4


async def test_a_queue_declared_before_placement_keeps_its_partitions(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """A partitioned queue stored before partitions were placed by slot (no placement in its
    meta) keeps its "#i" partitions: producers and workers of the same count use them."""
    legacy = partition_keys(queue_name, 3, LEGACY_PLACEMENT)
    for keys in legacy:
        redis_client.hset(keys.meta, mapping={"np": 3, "pi": keys.partition, "mode": "global"})
    registry, work = _deploy(queue_name, 3)
    async with QueueClient(redis_url) as client:
        assert await client._run(ops_layout.read_layout(queue_name)) == Layout(3, LEGACY_PLACEMENT)
        handles = await client.queue(work).add_bulk(range(6))
        for handle in handles:
            assert redis_client.exists(legacy[int(handle.id) % 3].job(handle.id))
        async with run_worker(registry, queue_name, redis_url, poll_interval=0.05):
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == 6
    spread = partition_keys(queue_name, 3)
    assert not redis_client.keys(spread[1].prefix + "*")
    assert not redis_client.keys(spread[2].prefix + "*")


async def test_a_count_change_relays_the_batch_endings_its_partitions_still_hold(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """A job of a batch that ended where no worker relayed it (a cancel from a client) leaves
    its ending in its partition's batch outbox. A count change that leaves that partition out
    of the layout relays the ending first: no worker of the new count looks at the old
    partition again, and the batch would learn of the ending only when its callback queue's
    sweep came back to it (30 s later), or never, had it stopped looking."""
    _, work3 = _deploy(queue_name, 3)
    registry4, _ = _deploy(queue_name, 4)
    old = partition_keys(queue_name, 3)
    new_prefixes = {keys.prefix for keys in partition_keys(queue_name, 4)}
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(f"{queue_name}-done", {}))
        handles = [await batch.add(work3, i) for i in range(6)]
        await batch.close()
        left_out = [keys for keys in old if keys.prefix not in new_prefixes]
        assert left_out, "the new layout keeps every old partition's keys"
        for handle in handles:
            assert await client.cancel(queue_name, handle.id)
        assert any(redis_client.zcard(keys.batch_outbox) for keys in left_out)
        await client.purge(queue_name)
        async with run_worker(registry4, queue_name, redis_url, poll_interval=0.05):
            pass
        layout = await client._run(ops_layout.read_layout(queue_name))
        assert layout is not None and layout.count == 4
        for keys in old:
            assert redis_client.zcard(keys.batch_outbox) == 0, keys.prefix
        batch_keys = BatchKeys(batch.id)
        assert redis_client.scard(batch_keys.ended) == len(handles)
        assert redis_client.hget(batch_keys.state, "fired") == b"1"
        assert (await client.get_job(f"{queue_name}-done",
                                     callback_id(batch.id, "complete"))).state == JobState.WAITING
