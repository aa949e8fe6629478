"""Every operation on a URL that asks for RESP3 (``?protocol=3``).

redis-py answers some commands in other shapes on RESP3: a map of streams for XREAD and
XREADGROUP where RESP2 has a list of ``[stream, entries]`` pairs. Each operation must read
both, on each transport: redis-py's asyncio and sync clients, and trio's own connection with
either reply reader. The check: what the operations answer on RESP3 is what they answer on
RESP2 for the same data, and the calls that wait (``result()``, ``events()``) end as they
should.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis

from panqueue import Fail, Job, JobFailed, QueueClient, Registry, SyncQueueClient
from panqueue._keys import QueueKeys
from panqueue._store import ops
from panqueue._store.transport import SyncTransport, open_async_transport, resp
from panqueue.testing import run_worker

pytestmark = pytest.mark.anyio

WORK = "resp3-work"
IDLE = "resp3-idle"  # a queue no worker serves: its job stays waiting

registry = Registry()
registry.schedule("hourly", WORK, every=3600, data=1)


@registry.handler(WORK)
async def double(job: Job) -> Any:
    if job.data == "fail":
        raise Fail("as asked")
    return job.data * 2


def _resp3(url: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}protocol=3"


def _reads(ids: dict[str, str]) -> dict[str, tuple[str, tuple[Any, ...]]]:
    """The reading calls the tests compare, by what they show: (method, arguments)."""
    return {
        "counts": ("counts", (WORK,)),
        "done": ("get_job", (WORK, ids["done"])),
        "failed": ("get_job", (WORK, ids["failed"])),
        "completed list": ("list_jobs", (WORK, "completed")),
        "failed list": ("list_jobs", (WORK, "failed")),
        "waiting list": ("list_jobs", (IDLE, "waiting")),
        "done explained": ("explain", (WORK, ids["done"])),
        "failed explained": ("explain", (WORK, ids["failed"])),
        "waiting explained": ("explain", (IDLE, ids["idle"])),
        "events": ("read_events", (WORK, "0")),
        "schedules": ("schedules", (WORK,)),
        "queues": ("queues", ()),
    }


def _view(client: SyncQueueClient, ids: dict[str, str]) -> dict[str, Any]:
    """What the reading calls answer on the sync client."""
    view = {shown: getattr(client, method)(*args) for shown, (method, args) in _reads(ids).items()}
    return {**view, "queues": sorted(view["queues"])}


async def _async_view(client: QueueClient, ids: dict[str, str]) -> dict[str, Any]:
    """The same, on the async client."""
    view = {shown: await getattr(client, method)(*args)
            for shown, (method, args) in _reads(ids).items()}
    return {**view, "queues": sorted(view["queues"])}


def _history_twice(transport: Any) -> tuple[Any, Any]:
    """The history batch read new, then read again as the pending batch of an export that did
    not acknowledge it (XREADGROUP's two reads)."""
    keys = QueueKeys(WORK)
    transport.run(ops.open_history_export(keys))
    return (transport.run(ops.read_history(keys, 100)),
            transport.run(ops.read_history(keys, 100)))


@pytest.fixture(params=["redis-py", "hiredis", "python"])
def transport_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                   ) -> Iterator[str]:
    """On trio, the reply reader of its own connection: hiredis' (where installed) or ours."""
    if request.param == "python":
        monkeypatch.setattr(resp, "new_reader", resp.PyReader)
        monkeypatch.setattr(resp, "pack", resp.pack_py)
    yield str(request.param)


@pytest.mark.parametrize(("anyio_backend", "transport_kind"),
                         [("asyncio", "redis-py"), ("trio", "hiredis"), ("trio", "python")],
                         indirect=["transport_kind"])
async def test_every_async_operation_reads_resp3_replies(
        anyio_backend: str, transport_kind: str, redis_url: str,
        redis_client: redis.Redis) -> None:
    url = _resp3(redis_url)
    async with QueueClient(url) as client:
        async with run_worker(registry, WORK, url):
            # Asks for every event first: the jobs may end before their result() asks for that.
            await client.read_events(WORK)
            work = client.queue(WORK)
            done, failed = await work.add(21), await work.add("fail")
            assert await done.result(timeout=10) == 42
            with pytest.raises(JobFailed, match="as asked"):
                await failed.result(timeout=10)
            [worker] = await client.workers(WORK)
            assert worker.queues == [WORK]
            seen = []
            with anyio.fail_after(10):
                async for event in client.events(WORK, after="0"):
                    seen.append((event.type, event.job_id))
                    if (event.type, event.job_id) == ("failed", failed.id):
                        break
            assert ("completed", done.id) in seen
        idle = await client.queue(IDLE).add("later")
        (info,) = await client.list_jobs(IDLE, "waiting")
        assert info.id == idle.id and await idle.info() == info
        ids = {"done": done.id, "failed": failed.id, "idle": idle.id}
        resp3_view = await _async_view(client, ids)
        transport = open_async_transport(url)
        try:
            history = (await transport.run(ops.open_history_export(QueueKeys(WORK))),
                       await transport.run(ops.read_history(QueueKeys(WORK), 100)),
                       await transport.run(ops.read_history(QueueKeys(WORK), 100)))
        finally:
            await transport.aclose()
    _, new, pending = history
    assert {r.id for r in new.records} >= {done.id, failed.id}
    assert not new.pending and pending.pending and pending.records == new.records

    def on_resp2() -> dict[str, Any]:
        with SyncQueueClient(redis_url) as client:
            return _view(client, ids)

    assert resp3_view == await anyio.to_thread.run_sync(on_resp2)
    events, _ = resp3_view["events"]
    assert ("completed", done.id) in [(e.type, e.job_id) for e in events]


def test_every_sync_operation_reads_resp3_replies(redis_url: str) -> None:
    """The sync client, on redis-py's sync client: the same reads, and its waiting calls."""
    url = _resp3(redis_url)

    async def serve_two_jobs() -> dict[str, str]:
        with SyncQueueClient(url) as client:
            client.read_events(WORK)  # asks for every event: the adds' are read back below
            work = client.queue(WORK)
            done, failed = work.add(21), work.add("fail")
            idle = client.queue(IDLE).add("later")
        async with run_worker(registry, WORK, url):
            with SyncQueueClient(url) as client:
                assert await anyio.to_thread.run_sync(
                    lambda: client.queue(WORK).job(done.id).result(timeout=10)) == 42
        return {"done": done.id, "failed": failed.id, "idle": idle.id}

    ids = anyio.run(serve_two_jobs)
    with SyncQueueClient(url) as client:
        with pytest.raises(JobFailed, match="as asked"):
            client.queue(WORK).job(ids["failed"]).result(timeout=10)
        events = client.events(WORK, after="0")
        assert ("added", ids["done"]) == (lambda e: (e.type, e.job_id))(next(iter(events)))
        resp3_view = _view(client, ids)
    with SyncQueueClient(redis_url) as client:
        assert resp3_view == _view(client, ids)
    transport = SyncTransport(url)
    try:
        new, pending = _history_twice(transport)
    finally:
        transport.close()
    assert {r.id for r in new.records} >= {ids["done"], ids["failed"]}
    assert pending.pending and pending.records == new.records
