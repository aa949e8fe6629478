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
