"""Day-one operations: a result() that times out says what it saw, depends_on takes job
handles, and a schedule whose queue has no handler is refused."""

from __future__ import annotations

import anyio
import pytest

from panqueue import (
    ConfigError,
    Job,
    QueueClient,
    Registry,
    SyncQueueClient,
    TimeoutError,
    Worker,
    WorkerPool,
)
from panqueue._store.transport import redact_url
from panqueue.testing import run_worker
from tests.helpers import async_wait_until

pytestmark = pytest.mark.anyio


# --------------------------------------------------------------- result(timeout) explains


def test_sync_result_timeout_names_state_server_and_no_worker(redis_url: str,
                                                               queue_name: str) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue(queue_name).add({"n": 1}, job_id="email-7")
        with pytest.raises(TimeoutError) as caught:
            handle.result(timeout=0.2)
    assert str(caught.value) == (
        f"job 'email-7' in queue {queue_name!r} did not finish within 0.2 s: it is waiting at "
        f"{redact_url(redis_url)}, and no live worker serves {queue_name!r}")


async def test_result_timeout_names_state_server_and_no_worker(redis_url: str,
                                                               queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        handle = await client.queue(queue_name).add(delay=60, job_id="late")
        with pytest.raises(TimeoutError) as caught:
            await handle.result(timeout=0.2)
    assert str(caught.value) == (
        f"job 'late' in queue {queue_name!r} did not finish within 0.2 s: it is delayed at "
        f"{redact_url(redis_url)}, and no live worker serves {queue_name!r}")


async def test_result_timeout_names_the_busy_worker(redis_url: str, queue_name: str) -> None:
    registry = Registry()
    release = anyio.Event()

    @registry.handler(queue_name, concurrency=1)
    async def work(job: Job) -> str:
        if job.data == "long":
            await release.wait()
        return str(job.data)

    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        long = await queue.add("long", job_id="long")

        async def long_runs() -> bool:
            return (await long.info()).state == "active" and bool(
                await client.workers(queue_name))

        await async_wait_until(long_runs, what="the long job running")
        short = await queue.add("short", job_id="short")
        with pytest.raises(TimeoutError) as caught:
            await short.result(timeout=0.3)
        message = str(caught.value)
        assert message.startswith(
            f"job 'short' in queue {queue_name!r} did not finish within 0.3 s: it is waiting at "
            f"{redact_url(redis_url)}, and 1 live worker serves {queue_name!r}"), message
        assert "running 1 job (concurrency 1)" in message, message
        release.set()
        assert await short.result(timeout=10) == "short"


# --------------------------------------------------------------- depends_on takes handles


async def test_depends_on_takes_handles_and_runs_after_them(redis_url: str,
                                                            queue_name: str) -> None:
    registry = Registry()
    order: list[str] = []

    @registry.handler(queue_name, concurrency=4)
    async def work(job: Job) -> str:
        if job.data == "first":
            await anyio.sleep(0.2)
        order.append(str(job.data))
        return str(job.data)

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = await queue.add("first")
        other = await queue.add("other")
        then = await queue.add("then", depends_on=[first, other.id])  # a handle and an id
        assert (await then.info()).state == "blocked"
        async with run_worker(registry, queue_name, redis_url):
            assert await then.result(timeout=10) == "then"
        first_info, then_info = await first.info(), await then.info()
    assert order.index("then") > order.index("first")
    assert first_info.finished_at is not None and then_info.started_at is not None
    assert then_info.started_at >= first_info.finished_at


def test_sync_depends_on_takes_handles_of_its_own_queue_only(redis_url: str,
                                                            queue_name: str) -> None:
    with SyncQueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = queue.add("first")
        then = queue.add("then", depends_on=[first])
        assert then.info().state == "blocked"
        stranger = client.queue(f"{queue_name}-other").add("x", job_id="x")
        with pytest.raises(ConfigError) as caught:
            queue.add("bad", depends_on=[first, stranger])
    message = str(caught.value)
    assert f"job 'x' of queue '{queue_name}-other'" in message, message
    assert f"only on jobs of its own queue {queue_name!r}" in message, message


async def test_depends_on_refuses_a_handle_of_another_queue(redis_url: str,
                                                            queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        stranger = await client.queue(f"{queue_name}-other").add("x", job_id="x")
        with pytest.raises(ConfigError, match="depends_on: job 'x' of queue"):
            await client.queue(queue_name).add("bad", depends_on=[stranger])


# --------------------------------------------------------------- schedules need a handler


def test_schedule_on_a_queue_without_handler_is_refused_when_the_registry_is_used(
        redis_url: str) -> None:
    registry = Registry()
    # Handlers may come after schedules: declaring one is not an error yet.
    registry.schedule("nightly", "reports", cron="0 3 * * *")
    registry.schedule("swapped", "heartbeat", every=60.0)  # meant: ("heartbeat", "reports")

    @registry.handler("reports")
    async def build(job: Job) -> None: ...

    expected = "schedule 'swapped' sends its jobs to queue 'heartbeat', which has no handler"
    with pytest.raises(ConfigError, match=expected):
        Worker(registry, "reports", url=redis_url)
    with pytest.raises(ConfigError, match=expected):
        WorkerPool(registry, url=redis_url)
    with pytest.raises(ConfigError, match=expected):
        registry.get("reports")
    with pytest.raises(ConfigError, match=expected):
        registry.schedules_for("reports")


def test_schedule_whose_handler_comes_later_is_accepted(redis_url: str) -> None:
    registry = Registry()
    registry.schedule("nightly", "reports", cron="0 3 * * *")

    @registry.handler("reports")
    async def build(job: Job) -> None: ...

    worker = Worker(registry, "reports", url=redis_url)
    assert list(worker.schedules) == ["nightly"]
