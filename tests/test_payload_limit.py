"""``max_payload_bytes``: a job whose encoded data (and options) is over the bound raises
PayloadError naming its size and the bound, and nothing is written, whatever the way it is
added; a handler's result over the bound fails the attempt, naming its size."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    Chunk,
    ConfigError,
    FlowJob,
    Job,
    JobState,
    PayloadError,
    QueueClient,
    Registry,
    SyncQueueClient,
    Worker,
)
from tests.helpers import async_wait_until

BIG = "x" * 2_000  # about 2 kB encoded
LIMIT = 1_000


def _one_line_naming_size(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text
    assert "1,000 bytes" in text and "max_payload_bytes" in text
    assert "2,00" in text  # its size: 2,003 bytes or so
    return text


@pytest.mark.anyio
async def test_a_job_over_the_bound_is_refused_and_nothing_is_written(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    async with QueueClient(redis_url, max_payload_bytes=LIMIT) as client:
        queue = client.queue(queue_name)
        with pytest.raises(PayloadError) as caught:
            await queue.add({"blob": BIG})
        assert "the job's data" in _one_line_naming_size(caught.value)
        with pytest.raises(PayloadError) as caught:
            await queue.add_bulk([{"n": 1}, {"n": 2}, {"blob": BIG}, {"n": 4}])
        assert "job 2's data" in _one_line_naming_size(caught.value)
        with pytest.raises(PayloadError):
            await queue.add_flow([FlowJob({"n": 1}), FlowJob({"blob": BIG}, depends_on=[0])])
        with pytest.raises(PayloadError):
            await queue.add_chain([{"n": 1}, {"blob": BIG}])
        assert redis_client.keys("*") == []  # not one key: not even the queue's meta

        batch = await client.batch(on_complete=(queue_name, None))
        written = set(redis_client.keys("*"))
        with pytest.raises(PayloadError):
            await batch.add(queue_name, {"blob": BIG})
        with pytest.raises(PayloadError):
            await batch.add_bulk(queue_name, [{"n": n} for n in range(1500)] + [{"blob": BIG}])
        assert set(redis_client.keys("*")) == written  # no job, no registration
        assert not await client.queue_exists(queue_name)

        # Under the bound: added as ever.
        handle = await queue.add({"blob": "y" * 900})
        assert (await handle.info()).state == JobState.WAITING


def test_the_default_bound_is_one_mebibyte_and_none_lifts_it(redis_url: str,
                                                            queue_name: str) -> None:
    with SyncQueueClient(redis_url) as client:
        client.queue(queue_name).add({"blob": "x" * 1_000_000})
        with pytest.raises(PayloadError, match="1,048,576 bytes"):
            client.queue(queue_name).add({"blob": "x" * 1_048_576})
    with SyncQueueClient(redis_url, max_payload_bytes=None) as client:
        client.queue(queue_name).add({"blob": "x" * 1_100_000})
        assert client.counts(queue_name)[JobState.WAITING] == 2


@pytest.mark.parametrize("limit", [0, -1, 1.5, "big", True])
def test_a_bad_bound_is_one_config_error(limit: Any) -> None:
    with pytest.raises(ConfigError, match="max_payload_bytes"):
        QueueClient(max_payload_bytes=limit)
    with pytest.raises(ConfigError, match="max_payload_bytes"):
        Worker(_registry(), "results", max_payload_bytes=limit)


def _registry() -> Registry:
    registry = Registry()

    @registry.handler("results", attempts=1)
    async def results(job: Job) -> Any:
        return {"blob": "z" * job.data["size"]}

    return registry


@pytest.mark.anyio
async def test_a_result_over_the_bound_fails_the_attempt_naming_its_size(
        redis_url: str) -> None:
    worker = Worker(_registry(), "results", url=redis_url, poll_interval=0.1,
                    max_payload_bytes=LIMIT)
    async with QueueClient(redis_url) as client, anyio.create_task_group() as tg:
        await tg.start(worker.run)
        small = await client.queue("results").add({"size": 10})
        big = await client.queue("results").add({"size": 2_000})

        async def ended() -> bool:
            counts = await client.counts("results")
            return counts[JobState.COMPLETED] + counts[JobState.FAILED] == 2

        await async_wait_until(ended, what="both jobs ended")
        await worker.shutdown()
    async with QueueClient(redis_url) as client:
        assert (await client.get_job("results", small.id)).state == JobState.COMPLETED
        failed = await client.get_job("results", big.id)
    assert failed.state == JobState.FAILED
    assert failed.error is not None and failed.error.type == "PayloadError"
    assert "the handler's result" in _one_line_naming_size(failed.error.message)


@pytest.mark.anyio
async def test_a_chunk_result_over_the_bound_fails_that_job_only(redis_url: str) -> None:
    registry = Registry()

    @registry.handler("chunk-results", chunk=Chunk(size=2, wait=0.5), attempts=1)
    async def results(jobs: list[Job]) -> list[Any]:
        return [{"blob": "z" * job.data["size"]} for job in jobs]

    worker = Worker(registry, "chunk-results", url=redis_url, poll_interval=0.1,
                    max_payload_bytes=LIMIT)
    async with QueueClient(redis_url) as client, anyio.create_task_group() as tg:
        small, big = await client.queue("chunk-results").add_bulk([{"size": 10},
                                                                   {"size": 2_000}])
        await tg.start(worker.run)

        async def ended() -> bool:
            counts = await client.counts("chunk-results")
            return counts[JobState.COMPLETED] + counts[JobState.FAILED] == 2

        await async_wait_until(ended, what="both jobs of the chunk ended")
        await worker.shutdown()
        assert (await small.info()).state == JobState.COMPLETED
        failed = await big.info()
    assert failed.state == JobState.FAILED
    assert failed.error is not None and failed.error.type == "PayloadError"
    assert "result[" in _one_line_naming_size(failed.error.message)  # its slot of the chunk
