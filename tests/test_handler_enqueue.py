"""Enqueueing from a handler: ``handler.enqueue(data, **options)`` and ``await
handler.aenqueue(...)`` through the client its registry opens on first use (URL from
``Registry(url=...)``, else ``PANQUEUE_URL``), one blocking client for every thread and one
async client per event loop, each closed by the registry. Connections are counted on a server
of the test's own, with ``CLIENT LIST``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    ConfigError,
    Job,
    JobHandle,
    JobState,
    PayloadError,
    QueueClient,
    Registry,
    SyncJobHandle,
    SyncQueueClient,
)
from panqueue.embedded import RedisServer
from panqueue.testing import drain, run_worker


def _registry(url: str | None = None) -> Registry:
    queues = Registry(url=url)

    @queues.handler("mail", priority=3)
    async def send(job: Job[dict[str, Any]]) -> str:
        return f"sent to {job.data['to']}"

    return queues


def _connections(url: str) -> int:
    """Clients connected to the server now, this probe's own connection left out."""
    probe = redis.Redis.from_url(url)
    try:
        return len(probe.client_list()) - 1
    finally:
        probe.close()


@pytest.fixture
def own_redis() -> Iterator[str]:
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.cleanup()


def test_enqueue_adds_to_the_handlers_queue_with_its_defaults_and_add_options(
        redis_url: str) -> None:
    queues = _registry(redis_url)
    send = queues.get("mail")
    try:
        job = send.enqueue({"to": "a@example.com"}, job_id="welcome-a", delay=60.0)
        assert isinstance(job, SyncJobHandle)
        assert (job.id, job.queue, job.created) == ("welcome-a", "mail", True)
        info = job.info()
        assert info.state is JobState.DELAYED
        assert info.data == {"to": "a@example.com"}
        assert info.priority == 3  # the handler's producer default
        # The same options as Queue.add: an id that exists returns that job, unchanged.
        again = send.enqueue({"to": "other"}, job_id="welcome-a")
        assert not again.created
        assert again.info().data == {"to": "a@example.com"}
        assert send.enqueue({"to": "b"}, priority=9).info().priority == 9
        # Bad data: one clear error, nothing written.
        with pytest.raises(PayloadError, match="set"):
            send.enqueue({"to": {1, 2}})
        with SyncQueueClient(redis_url) as client:
            assert sum(client.counts("mail").values()) == 2
    finally:
        queues.close()


@pytest.mark.anyio
async def test_aenqueue_job_runs_in_a_worker_and_its_result_reads_back(redis_url: str) -> None:
    queues = _registry(redis_url)
    send = queues.get("mail")
    try:
        async with run_worker(queues, "mail", redis_url):
            job = await send.aenqueue({"to": "c@example.com"})
            assert isinstance(job, JobHandle)
            assert await job.result(timeout=10.0) == "sent to c@example.com"
    finally:
        await queues.aclose()


def test_without_a_registry_url_panqueue_url_is_read_at_first_use(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    queues = _registry()
    monkeypatch.setenv("PANQUEUE_URL", redis_url)  # after the registry was made
    try:
        job = queues.get("mail").enqueue({"to": "d"})
        with SyncQueueClient(redis_url) as client:
            assert client.get_job("mail", job.id).data == {"to": "d"}
    finally:
        queues.close()


@pytest.mark.anyio
async def test_a_registrys_prefix_namespaces_the_jobs_its_handlers_enqueue(
        redis_url: str) -> None:
    """``Registry(url, prefix=...)``: ``enqueue`` and ``aenqueue`` add under the registry's
    key prefix, where a client of that prefix finds the jobs and one without it does not."""
    queues = Registry(url=redis_url, prefix="app1")

    @queues.handler("mail")
    async def mail(job: Job[dict[str, Any]]) -> None:
        return None

    try:
        sync_job = await anyio.to_thread.run_sync(lambda: mail.enqueue({"to": "e"}))
        async_job = await mail.aenqueue({"to": "f"})
        async with QueueClient(redis_url, prefix="app1") as mine, \
                QueueClient(redis_url) as plain:
            for job in (sync_job, async_job):
                assert (await mine.get_job("mail", job.id)).state == JobState.WAITING
            assert sum((await plain.counts("mail")).values()) == 0
    finally:
        await anyio.to_thread.run_sync(queues.close)
        await queues.aclose()


def test_no_url_anywhere_is_one_config_error_naming_both_ways(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PANQUEUE_URL", raising=False)
    queues = _registry()
    with pytest.raises(ConfigError, match=r"Registry\(url=.*PANQUEUE_URL"):
        queues.get("mail").enqueue({"to": "e"})

    async def main() -> None:
        await queues.get("mail").aenqueue({"to": "e"})

    with pytest.raises(ConfigError, match="PANQUEUE_URL"):
        asyncio.run(main())


@pytest.mark.parametrize("url", ["localhost:6379", 6379])
def test_a_bad_registry_url_is_refused_when_the_registry_is_made(url: Any) -> None:
    with pytest.raises(ConfigError, match="URL"):
        Registry(url=url)


def test_threads_share_one_client_and_close_ends_its_connections(own_redis: str) -> None:
    queues = _registry(own_redis)
    send = queues.get("mail")
    start = threading.Barrier(8)
    ids: list[str] = []
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            start.wait()
            for i in range(20):
                ids.append(send.enqueue({"to": f"{n}-{i}"}).id)
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(ids)) == 160
    # One pool for the process: at most one connection per thread that used it at once.
    assert 1 <= _connections(own_redis) <= 8
    queues.close()
    assert _connections(own_redis) == 0
    # A later enqueue opens a fresh client; closing twice is harmless.
    send.enqueue({"to": "after close"})
    queues.close()
    queues.close()
    assert _connections(own_redis) == 0
    with SyncQueueClient(own_redis) as client:
        assert client.counts("mail")[JobState.WAITING] == 161


@pytest.mark.anyio
async def test_each_event_loop_gets_its_own_client_which_aclose_ends(own_redis: str) -> None:
    queues = _registry(own_redis)
    send = queues.get("mail")
    job = await send.aenqueue({"to": "this loop"})
    assert _connections(own_redis) == 1

    # Another loop, in another thread (as a sync web app running async code per request
    # does): a client of its own, not this loop's connection used from the wrong loop.
    def other_loop() -> str:
        async def main() -> str:
            try:
                return (await send.aenqueue({"to": "other loop"})).id
            finally:
                await queues.aclose()

        return asyncio.run(main())

    other = await anyio.to_thread.run_sync(other_loop)
    assert _connections(own_redis) == 1  # the other loop closed its own
    await queues.aclose()
    assert _connections(own_redis) == 0
    await queues.aclose()  # again: nothing to close
    async with QueueClient(own_redis) as client:
        assert {(await client.get_job("mail", i)).data["to"] for i in (job.id, other)} \
            == {"this loop", "other loop"}


@pytest.mark.anyio
async def test_aenqueue_from_inside_a_handler_adds_to_another_queue(redis_url: str) -> None:
    queues = Registry(url=redis_url)

    @queues.handler("receipts")
    async def receipt(job: Job[dict[str, Any]]) -> None: ...

    @queues.handler("orders")
    async def order(job: Job[dict[str, Any]]) -> str:
        handle = await receipt.aenqueue({"order": job.data["id"]}, job_id=f"r-{job.data['id']}")
        return handle.id

    try:
        async with run_worker(queues, "orders", redis_url):
            job = await order.aenqueue({"id": 7})
            assert await job.result(timeout=10.0) == "r-7"
        async with run_worker(queues, "receipts", redis_url):
            counts = await drain(redis_url, "receipts")
        assert counts[JobState.COMPLETED] == 1
    finally:
        await queues.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("executor", ["inline", "thread"])
async def test_a_handler_enqueues_where_its_worker_serves(
        redis_url: str, executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry with no URL nor prefix of its own, served by a worker given both (as
    ``panqueue worker --url ... --prefix ...`` gives them): its handlers' enqueues add under
    the worker's prefix, on its server. They went to the unprefixed keys, where no worker of
    the application looks (or were refused, by an ACL confined to the prefix)."""
    monkeypatch.delenv("PANQUEUE_URL", raising=False)
    monkeypatch.delenv("PANQUEUE_PREFIX", raising=False)
    queues = Registry()

    @queues.handler("receipts")
    async def receipt(job: Job[dict[str, Any]]) -> None: ...

    if executor == "inline":
        @queues.handler("orders")
        async def order(job: Job[dict[str, Any]]) -> str:
            return (await receipt.aenqueue({"order": job.data["id"]})).id
    else:
        @queues.handler("orders", executor="thread")
        def order(job: Job[dict[str, Any]]) -> str:
            return receipt.enqueue({"order": job.data["id"]}).id

    try:
        async with QueueClient(redis_url, prefix="shop") as shop, \
                QueueClient(redis_url) as plain:
            job = await shop.queue("orders").add({"id": 7})
            async with run_worker(queues, "orders", redis_url, prefix="shop"):
                added = await job.result(timeout=10.0)
            assert (await shop.get_job("receipts", added)).data == {"order": 7}
            assert sum((await plain.counts("receipts")).values()) == 0
        # Outside a worker: the registry's, else PANQUEUE_URL and PANQUEUE_PREFIX.
        monkeypatch.setenv("PANQUEUE_URL", redis_url)
        monkeypatch.setenv("PANQUEUE_PREFIX", "shop")
        outside = await receipt.aenqueue({"order": 8})
        async with QueueClient(redis_url, prefix="shop") as shop:
            assert (await shop.get_job("receipts", outside.id)).data == {"order": 8}
    finally:
        await anyio.to_thread.run_sync(queues.close)
        await queues.aclose()
