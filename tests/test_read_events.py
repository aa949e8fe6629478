"""client.read_events: the events there now, without waiting, and where to read from next."""

from __future__ import annotations

import pytest

from panqueue import QueueClient, SyncQueueClient


@pytest.mark.anyio
async def test_read_events_returns_what_is_there_and_the_next_position(
        redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        events, start = await client.read_events(queue_name)
        assert events == []  # no after=: only the stream's end
        first = await client.queue(queue_name).add(1)
        second = await client.queue(queue_name).add(2)
        events, position = await client.read_events(queue_name, start, limit=1)
        assert [(e.type, e.job_id) for e in events] == [("added", first.id)]
        events, position = await client.read_events(queue_name, position)
        assert [(e.type, e.job_id) for e in events] == [("added", second.id)]
        assert await client.read_events(queue_name, position) == ([], position)  # no wait


def test_sync_read_events_mirrors_the_async_one(redis_url: str, queue_name: str) -> None:
    with SyncQueueClient(redis_url) as client:
        _, start = client.read_events(queue_name)
        handle = client.queue(queue_name).add(1)
        events, _ = client.read_events(queue_name, start)
        assert [(e.type, e.job_id) for e in events] == [("added", handle.id)]


@pytest.mark.anyio
async def test_a_partitioned_queues_events_come_at_most_limit_a_call_and_in_time_order(
        redis_url: str, queue_name: str) -> None:
    """Each partition was read up to ``limit`` and every one's position moved past all it
    gave: a call returned up to partitions x limit events, and a partition read ahead of the
    others made a later page hold events older than an earlier page's."""
    from panqueue import Job, Registry

    registry = Registry()

    @registry.handler(queue_name, partitions=3)
    async def work(job: Job[int]) -> None: ...

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        await queue.add(0)  # lays the queue out: a read asks every partition
        _, position = await client.read_events(queue_name)
        added = await queue.add_bulk(list(range(9)))  # three a partition
        for handle in added[:3]:
            await client.cancel(queue_name, handle.id)
        seen = []
        while True:
            events, position = await client.read_events(queue_name, position, limit=2)
            assert len(events) <= 2
            if not events:
                break
            seen += events
        order = [tuple(int(part) for part in e.id.split("-")) for e in seen]
        assert order == sorted(order) and len(seen) == 12
