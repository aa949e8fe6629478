"""``compress_over_bytes``: a job's encoded data over it is stored compressed (zlib) when that
makes it smaller, and every reader gets the data back as it was added: the worker's handler,
``JobInfo.data`` (get_job, list_jobs), a batch's jobs; ``max_payload_bytes`` bounds the data
as encoded, before compression."""

from __future__ import annotations

import os
from typing import Any

import pytest
import redis

from panqueue import (
    ConfigError,
    Job,
    JobState,
    PayloadError,
    QueueClient,
    Registry,
    SyncQueueClient,
)
from panqueue._codec import compress, encode
from panqueue._keys import QueueKeys
from panqueue._store.ops.jobs import job_data
from panqueue.testing import drain, run_worker


def records(n: int) -> dict[str, Any]:
    """JSON-like data: n records of a few repeated fields."""
    return {"items": [{"id": i, "user": f"user-{i * 7919 % 100_000}", "active": i % 2 == 0,
                       "tags": ["news", "vip"][: i % 3], "note": "call back" if i % 5 else ""}
                      for i in range(n)]}


BIG = records(200)  # about 10 KB encoded


def stored_data(r: redis.Redis, queue: str, job_id: str) -> bytes:
    """The data as stored (its parts joined, lua/lib/job_data.lua)."""
    return job_data(r.hgetall(QueueKeys(queue).job(job_id))) or b""


@pytest.mark.anyio
async def test_data_over_the_threshold_is_stored_compressed_and_every_reader_gets_it_back(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    seen: list[Any] = []
    registry = Registry()

    @registry.handler(queue_name)
    async def work(job: Job[Any]) -> None:
        seen.append(job.data)

    async with QueueClient(redis_url) as client:
        handle = await client.queue(queue_name).add(BIG)
        raw = stored_data(redis_client, queue_name, handle.id)
        assert raw[:1] == b"\xc1" and len(raw) < len(encode(BIG)) / 2
        assert (await client.get_job(queue_name, handle.id)).data == BIG
        [listed] = await client.list_jobs(queue_name, JobState.WAITING)
        assert listed.data == BIG
        async with run_worker(registry, queue_name, redis_url):
            await drain(redis_url, queue_name)
    assert seen == [BIG]


def test_small_incompressible_or_unwanted_data_is_stored_as_encoded(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    small = records(5)
    with SyncQueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        assert stored_data(redis_client, queue_name, queue.add(small).id) == encode(small)
    # A JSON-compatible value always compresses a little (UTF-8 text): bytes that do not, do
    # not grow.
    noise = os.urandom(3000)
    assert compress(noise, 1024) is noise and compress(encode(BIG), None) == encode(BIG)
    with SyncQueueClient(redis_url, compress_over_bytes=None) as client:
        job_id = client.queue(queue_name).add(BIG).id
        assert stored_data(redis_client, queue_name, job_id) == encode(BIG)


@pytest.mark.anyio
async def test_a_batch_and_a_bulk_add_compress_each_job_and_read_back(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    async with QueueClient(redis_url, compress_over_bytes=100) as client:
        handles = await client.queue(queue_name).add_bulk([records(10), {"n": 1}])
        batch = await client.batch(on_complete=(queue_name, None))
        in_batch = await batch.add(queue_name, records(20))
        assert stored_data(redis_client, queue_name, handles[0].id)[:1] == b"\xc1"
        assert stored_data(redis_client, queue_name, handles[1].id) == encode({"n": 1})
        assert stored_data(redis_client, queue_name, in_batch.id)[:1] == b"\xc1"
        assert [(await client.get_job(queue_name, h.id)).data for h in
                (*handles, in_batch)] == [records(10), {"n": 1}, records(20)]


def test_the_payload_bound_applies_to_the_data_as_encoded_before_compression(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    limit = len(encode(BIG)) - 1  # compressed it would fit several times over
    with SyncQueueClient(redis_url, max_payload_bytes=limit) as client:
        with pytest.raises(PayloadError, match="max_payload_bytes"):
            client.queue(queue_name).add(BIG)
    assert redis_client.keys("*") == []


def test_a_negative_threshold_is_refused(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="compress_over_bytes"):
        SyncQueueClient(redis_url, compress_over_bytes=-1)
