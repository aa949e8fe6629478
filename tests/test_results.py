"""Waiting for a job's result (``JobHandle.result``) when the event stream moves fast."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest
import redis

from panqueue import QueueClient
from panqueue._codec import encode
from panqueue._keys import QueueKeys
from tests.helpers import wait_until

pytestmark = pytest.mark.anyio

# Marks the job completed (as complete.lua does: state, result, and the event carrying the
# result), then adds 12,000 other events: the stream is capped at ~10,000 entries, so the
# completion's own event is trimmed before any reader can get to it.
_COMPLETE_THEN_FLOOD = """
redis.call('HSET', KEYS[1], 's', 'completed', 'r', ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 10000, '*', 'ev', 'completed', 'id', ARGV[1],
           'r', ARGV[2])
for i = 1, 12000 do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 10000, '*', 'ev', 'progress', 'id', 'other')
end
return redis.call('XLEN', KEYS[2])
"""


def _someone_blocks_on_xread(client: redis.Redis) -> bool:
    return any(entry.get("cmd") == "xread" and "b" in entry.get("flags", "")
               for entry in client.client_list())


async def test_result_arrives_although_its_event_was_trimmed_under_a_steady_flow(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    outcome: list[Any] = []
    stop = threading.Event()

    def steady_flow() -> None:
        """Other jobs' events keep coming (one every 20 ms): the waiter is never idle."""
        client = redis.Redis.from_url(redis_url)
        try:
            while not stop.wait(0.02):
                client.xadd(keys.events, {"ev": "progress", "id": "other"}, maxlen=10000,
                            approximate=True)
        finally:
            client.close()

    async with QueueClient(redis_url) as client:
        handle = await client.queue(queue_name).add("x")

        async def wait_for_result() -> None:
            outcome.append(await handle.result(timeout=10))

        flow = threading.Thread(target=steady_flow)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for_result)
                await anyio.to_thread.run_sync(wait_until, lambda: _someone_blocks_on_xread(
                    redis_client), 5, "the waiter to block on the event stream")
                length = redis_client.eval(_COMPLETE_THEN_FLOOD, 2, keys.job(handle.id),
                                           keys.events, handle.id, encode("done"))
                assert int(length) < 12000  # the stream was trimmed past the completion
                flow.start()
                finished = time.monotonic()
                with anyio.fail_after(3):
                    while not outcome:
                        await anyio.sleep(0.01)
        finally:
            stop.set()
            if flow.is_alive():
                flow.join()
    assert outcome == ["done"]
    assert time.monotonic() - finished < 3
