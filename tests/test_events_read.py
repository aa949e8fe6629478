"""Events written while somebody reads them: a queue whose events nobody has read within the
hour writes only the events of a job's end, and those only while somebody waits on a result or
counts them, or where the job's finished set keeps none; a read asks it for every event
(lua/lib/settings.lua watched and ends_watched, panqueue/_store/ops/events.py watch)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    Backoff,
    Chunk,
    ConfigError,
    Event,
    Job,
    JobFailed,
    JobNotFound,
    JobState,
    QueueClient,
    Registry,
    Retention,
    SyncQueueClient,
)
from panqueue._keys import QueueKeys, partition_keys
from panqueue._store.ops.events import WATCH_MS
from panqueue.embedded import RedisServer
from panqueue.testing import run_worker
from tests.helpers import async_wait_until

pytestmark = pytest.mark.anyio

ENDS = {"completed", "failed", "cancelled"}


def _registry(queue: str, partitions: int, mode: str, retention: Retention) -> Registry:
    registry = Registry()

    @registry.handler(queue, concurrency=5, attempts=2, backoff=Backoff.fixed(0.0),
                      partitions=partitions, mode=mode, retention=retention)
    async def work(job: Job) -> int:
        await job.progress(50)
        if job.data == "fail":
            raise ValueError("no")
        return int(job.data)

    return registry


def _parts(queue: str, partitions: int) -> list[QueueKeys]:
    return list(partition_keys(queue, partitions)) if partitions > 1 else [QueueKeys(queue)]


def _stream(r: redis.Redis, queue: str, partitions: int) -> list[tuple[str, str]]:
    """(event, job id) of every entry in the queue's streams, read as they are stored."""
    found = []
    for keys in _parts(queue, partitions):
        for _, fields in r.xrange(keys.events):
            found.append((fields[b"ev"].decode(), fields.get(b"id", b"").decode()))
    return found


async def _run_jobs(client: QueueClient, queue: str, mode: str,
                   wait: bool = True) -> dict[str, list[str]]:
    """Six jobs that complete, one that fails after a retry, one delayed then cancelled, and a
    pause: the ids of each kind. ``wait``: wait on their results; else on their states, read
    back (which asks for no event)."""
    handles = client.queue(queue)
    key: dict[str, Any] = {"key": "k"} if mode == "keyed" else {}
    done = [await handles.add(n, **key) for n in range(6)]
    failing = await handles.add("fail", **key)
    later = await handles.add(9, delay=3600, **key)
    if wait:
        assert [await handle.result(timeout=10) for handle in done] == list(range(6))
        with pytest.raises(JobFailed):
            await failing.result(timeout=10)
    else:
        await _until_in(client, queue, [h.id for h in done], JobState.COMPLETED)
        await _until_in(client, queue, [failing.id], JobState.FAILED)
    await client.cancel(queue, later.id)
    if wait:
        with pytest.raises(JobFailed):
            await later.result(timeout=10)
    await client.pause(queue)
    return {"completed": [h.id for h in done], "failed": [failing.id],
            "cancelled": [later.id]}


async def _until_in(client: QueueClient, queue: str, ids: list[str], state: JobState) -> None:
    async def there() -> bool:
        return [(await client.get_job(queue, job_id)).state for job_id in ids] == [state] * len(ids)

    await async_wait_until(there, what=f"jobs {ids} {state.value}")


@pytest.mark.parametrize("counted", [False, True], ids=["unasked", "counted"])
@pytest.mark.parametrize(("partitions", "mode"), [(1, "global"), (3, "global"), (1, "keyed")])
async def test_a_queue_writes_no_event_unasked_and_the_ends_alone_for_a_read_that_counts(
        redis_url: str, queue_name: str, redis_client: redis.Redis, partitions: int,
        mode: str, counted: bool) -> None:
    """Nobody reads the events nor waits on a result: no event. A read that counts ends of
    jobs (watch=False) asks every partition for those alone."""
    registry = _registry(queue_name, partitions, mode, Retention())
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        if counted:
            await client.read_events(queue_name, watch=False)
        ends = await _run_jobs(client, queue_name, mode, wait=False)
    # No added, active, progress, retried, paused: at most one event per job, its end.
    expected = [(kind, job_id) for kind, ids in ends.items() for job_id in ids] if counted else []
    assert sorted(_stream(redis_client, queue_name, partitions)) == sorted(expected)
    for keys in _parts(queue_name, partitions):
        assert not redis_client.exists(keys.events_read)
        if counted:
            assert 0 < redis_client.pttl(keys.ends_read) <= WATCH_MS
        else:
            assert not redis_client.exists(keys.ends_read)


async def test_a_wait_on_a_result_asks_its_partition_for_the_ends_of_jobs(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """The job runs only once its waiter has asked: its end is in the stream with its result,
    and nothing else is."""
    registry = _registry(queue_name, 3, "global", Retention())
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        await client.pause(queue_name)
        handle = await client.queue(queue_name).add(8)
        keys = next(k for k in _parts(queue_name, 3) if int(handle.id) % 3 == k.partition)
        results: list[int] = []
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                results.append(await handle.result(timeout=10))

            tg.start_soon(wait)

            async def asked() -> bool:
                return bool(redis_client.exists(keys.ends_read))

            await async_wait_until(asked, what="the waiter's ask")
            await client.resume(queue_name)
    assert results == [8]
    entries = [fields for k in _parts(queue_name, 3) for _, fields in redis_client.xrange(k.events)]
    assert [(f[b"ev"], f[b"id"], f[b"r"]) for f in entries] == [
        (b"completed", handle.id.encode(), b"\x08")]
    assert 0 < redis_client.pttl(keys.ends_read) <= WATCH_MS
    assert [k.partition for k in _parts(queue_name, 3) if redis_client.exists(k.ends_read)] == [
        keys.partition]


@pytest.mark.parametrize("state", ["completed", "failed"])
async def test_a_queue_that_keeps_none_of_its_finished_jobs_writes_their_ends_unasked(
        redis_url: str, queue_name: str, redis_client: redis.Redis, state: str) -> None:
    """Where the finished set keeps none, the end event is the only place the outcome is
    left: a waiter of an earlier version, which asks for nothing, still finds it there."""
    registry = _registry(queue_name, 1, "global", Retention(completed=0, failed=0))
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add("fail" if state == "failed" else 3)

        async def ended() -> bool:
            return any(of == handle.id for _, of in _stream(redis_client, queue_name, 1))

        await async_wait_until(ended, what="the job's end event")
    assert _stream(redis_client, queue_name, 1) == [(state, handle.id)]
    assert not redis_client.exists(QueueKeys(queue_name).ends_read)


def _blocks_on_xread(r: redis.Redis) -> bool:
    return any(entry.get("cmd") == "xread" and "b" in entry.get("flags", "")
               for entry in r.client_list())


@pytest.mark.parametrize("end", sorted(ENDS))
@pytest.mark.parametrize(("partitions", "mode"), [(1, "global"), (3, "global"), (1, "keyed")])
async def test_a_wait_takes_the_outcome_from_the_end_event_of_a_job_deleted_as_it_ends(
        redis_url: str, queue_name: str, redis_client: redis.Redis, partitions: int,
        mode: str, end: str) -> None:
    """Where the finished set keeps none, the job is gone by the time its end is written: a
    wait that began before it ended reads the outcome from the event alone (each kind of end,
    on any partition, in keyed mode too)."""
    registry = Registry()

    @registry.handler(queue_name, concurrency=2, partitions=partitions, mode=mode,
                      retention=Retention(completed=0, failed=0))
    async def work(job: Job) -> Any:
        if job.data == "hold":
            await anyio.sleep_forever()
        if job.data == "fail":
            raise ValueError("no")
        return job.data

    key: dict[str, Any] = {"key": "k"} if mode == "keyed" else {}
    data = {"completed": 7, "failed": "fail", "cancelled": "hold"}[end]
    outcome: list[Any] = []
    async with QueueClient(redis_url) as client:
        handle = await client.queue(work).add(data, **key)

        async def wait() -> None:
            try:
                outcome.append(await handle.result(timeout=15))
            except JobFailed as failed:
                outcome.append(failed)

        async def blocking() -> bool:
            return _blocks_on_xread(redis_client)

        async def ended() -> bool:
            return bool(outcome)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            # The wait has read the job (waiting: no worker yet) and blocks on the stream.
            await async_wait_until(blocking, what="the wait blocking on the event stream")
            async with run_worker(registry, queue_name, redis_url):
                if end == "cancelled":
                    await _until_in(client, queue_name, [handle.id], JobState.ACTIVE)
                    await client.cancel(queue_name, handle.id)
                await async_wait_until(ended, what="the outcome")
        with pytest.raises(JobNotFound):  # deleted as it ended
            await client.queue(work).job(handle.id).info()
    if end == "completed":
        assert outcome == [7]
    else:
        [failed] = outcome
        assert isinstance(failed, JobFailed) and failed.state == end
        if end == "failed":
            assert failed.error is not None and failed.error.type == "ValueError"


@pytest.mark.parametrize(("partitions", "mode"), [(1, "global"), (3, "global"), (1, "keyed")])
async def test_a_read_makes_the_queue_write_every_event(
        redis_url: str, queue_name: str, redis_client: redis.Redis, partitions: int,
        mode: str) -> None:
    registry = _registry(queue_name, partitions, mode, Retention())
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        assert await client.read_events(queue_name) == ([], await _end(client, queue_name))
        ends = await _run_jobs(client, queue_name, mode)
    written = _stream(redis_client, queue_name, partitions)
    for job_id in ends["completed"]:
        assert [kind for kind, of in written if of == job_id] == [
            "added", "active", "progress", "completed"]
    assert [kind for kind, of in written if of == ends["failed"][0]] == [
        "added", "active", "progress", "retried", "active", "progress", "failed"]
    assert [kind for kind, of in written if of == ends["cancelled"][0]] == [
        "added", "cancelled"]
    assert ("paused", "") in written
    for keys in _parts(queue_name, partitions):
        assert 0 < redis_client.pttl(keys.events_read) <= WATCH_MS


async def _end(client: QueueClient, queue: str) -> str:
    return (await client.read_events(queue))[1]


async def test_the_events_iterator_asks_for_every_event_before_its_first_read(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = _registry(queue_name, 1, "global", Retention())
    keys = QueueKeys(queue_name)
    seen: list[Event] = []
    async with QueueClient(redis_url) as client, QueueClient(redis_url) as reader:
        async with run_worker(registry, queue_name, redis_url), anyio.create_task_group() as tg:

            async def follow() -> None:
                async for event in reader.events(queue_name):
                    seen.append(event)
                    if event.type == "completed":
                        return

            tg.start_soon(follow)
            async def asked() -> bool:
                return bool(redis_client.exists(keys.events_read))

            async def reading() -> bool:
                """Whether some connection is blocked in XREAD: the iterator's read."""
                return any(entry.get("cmd") == "xread" for entry in redis_client.client_list())

            await async_wait_until(asked, timeout=10, what="the reader's ask")
            # The iterator starts at the stream's end as it was at its first read: a job added
            # once it reads is in what it yields.
            await async_wait_until(reading, timeout=10, what="the reader's blocking read")
            handle = await client.queue(queue_name).add(7)
            assert await handle.result(timeout=10) == 7
    assert [(e.type, e.job_id) for e in seen] == [
        ("added", handle.id), ("active", handle.id), ("progress", handle.id),
        ("completed", handle.id)]


async def test_once_nobody_has_read_for_the_hour_only_ends_are_written_until_a_read(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = _registry(queue_name, 1, "global", Retention())
    keys = QueueKeys(queue_name)
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        await client.read_events(queue_name)
        read = await queue.add(1)
        await read.result(timeout=10)
        redis_client.delete(keys.events_read)  # what the ask's expiry does an hour later
        unread = await queue.add(2)
        await unread.result(timeout=10)
        await client.read_events(queue_name, watch=False)  # counts ends: asks for nothing
        still = await queue.add(3)
        await still.result(timeout=10)
        await client.read_events(queue_name)
        again = await queue.add(4)
        await again.result(timeout=10)
    kinds = {job: [k for k, of in _stream(redis_client, queue_name, 1) if of == job]
             for job in (read.id, unread.id, still.id, again.id)}
    every = ["added", "active", "progress", "completed"]
    assert kinds == {read.id: every, unread.id: ["completed"], still.id: ["completed"],
                     again.id: every}


async def test_events_always_writes_every_event_without_a_reader(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = _registry(queue_name, 1, "global", Retention(events_always=True))
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add(5)
        assert await handle.result(timeout=10) == 5
        assert not redis_client.exists(QueueKeys(queue_name).events_read)
    assert [k for k, of in _stream(redis_client, queue_name, 1) if of == handle.id] == [
        "added", "active", "progress", "completed"]
    # A worker of the queue without it lets the queue go back to writing only while read.
    plain = _registry(queue_name, 1, "global", Retention())
    async with QueueClient(redis_url) as client, run_worker(plain, queue_name, redis_url):
        other = await client.queue(queue_name).add(6)
        assert await other.result(timeout=10) == 6
    assert [k for k, of in _stream(redis_client, queue_name, 1) if of == other.id] == [
        "completed"]


@pytest.mark.parametrize("read", [False, True], ids=["unread", "read"])
async def test_a_chunk_handlers_queue_writes_its_events_as_any_other(
        redis_url: str, queue_name: str, redis_client: redis.Redis, read: bool) -> None:
    """Chunk claims and their completions go through the same scripts' events."""
    registry = Registry()

    @registry.handler(queue_name, chunk=Chunk(size=3, wait=0.05))
    async def rows(jobs: list[Job]) -> list[int]:
        return [int(job.data) for job in jobs]

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        await client.read_events(queue_name, watch=read)
        handles = await client.queue(queue_name).add_bulk(list(range(3)))
        assert [await handle.result(timeout=10) for handle in handles] == [0, 1, 2]
    every = ["added", "active", "completed"] if read else ["completed"]
    written = _stream(redis_client, queue_name, 1)
    assert {h.id: [k for k, of in written if of == h.id] for h in handles} == {
        h.id: every for h in handles}


def test_events_always_contradicts_keeping_no_events() -> None:
    with pytest.raises(ConfigError, match="events_always=True writes every event, but "
                                          "events=0 keeps only the events of a job's end"):
        Retention(events=0, events_always=True)
    with pytest.raises(ConfigError, match=r"Retention\.events_always must be a bool, got 1"):
        Retention(events_always=1)  # type: ignore[arg-type]


def test_a_sync_read_asks_for_every_event_and_one_that_only_counts_for_the_ends(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    keys = QueueKeys(queue_name)
    with SyncQueueClient(redis_url) as client:
        _, start = client.read_events(queue_name, watch=False)
        client.queue(queue_name).add(1)
        assert not redis_client.exists(keys.events_read)
        assert 0 < redis_client.pttl(keys.ends_read) <= WATCH_MS
        assert client.read_events(queue_name, start) == ([], start)
        assert redis_client.exists(keys.events_read)
        handle = client.queue(queue_name).add(2)
        events, _ = client.read_events(queue_name, start)
    assert [(e.type, e.job_id) for e in events] == [("added", handle.id)]


async def test_an_iterator_begun_before_a_partitioned_queue_was_laid_out_follows_every_partition(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """The iterator's first read finds one partition (no layout stored yet); the first add lays
    the queue out over three. Its next read follows all three from where each stands, and asks
    the new ones for every event."""
    registry = Registry()

    @registry.handler(queue_name, partitions=3)
    async def work(job: Job) -> None: ...

    parts = list(partition_keys(queue_name, 3))
    seen: list[Event] = []
    async with QueueClient(redis_url) as client, QueueClient(redis_url) as reader:

        async def asked(count: int) -> bool:
            return sum(redis_client.exists(keys.events_read) for keys in parts) == count

        async def reading() -> bool:
            return any(entry.get("cmd") == "xread" for entry in redis_client.client_list())

        async with anyio.create_task_group() as tg:

            async def follow() -> None:
                async for event in reader.events(queue_name):
                    seen.append(event)

            tg.start_soon(follow)
            await async_wait_until(lambda: asked(1), what="the home partition's ask")
            await async_wait_until(reading, what="the iterator's first read")
            early = await client.queue(work).add_bulk(list(range(6)))
            await async_wait_until(lambda: asked(3), what="every partition's ask")
            late = await client.queue(work).add_bulk(list(range(6)))

            async def all_late() -> bool:
                return {h.id for h in late} <= {e.job_id for e in seen if e.type == "added"}

            await async_wait_until(all_late, what="the later adds' events")
            tg.cancel_scope.cancel()
    # The iterator saw every event the streams hold, each once: a new partition is read from
    # its start. Those hold the home partition's early adds (asked before them) and every later
    # one. An early add in another partition wrote its event only if the iterator asked that
    # partition first: the first add stores the layout before it adds the jobs, and the
    # iterator may see the layout in between, so either is right.
    added = [e.job_id for e in seen if e.type == "added"]
    assert sorted(added) == sorted(job for kind, job in _stream(redis_client, queue_name, 3)
                                   if kind == "added")
    home = {h.id for h in early if int(h.id) % 3 == 0}
    assert home | {h.id for h in late} <= set(added)


async def test_a_wait_on_a_result_that_the_server_refuses_the_ask_for_now_asks_again(
        private_redis: RedisServer) -> None:
    """Over ``maxmemory`` the ask (a write) is refused for now: the waiter reads without it and
    asks again at its next read, once the server takes writes again; the job's end, after
    that, is in the stream."""
    url, queue = private_redis.url, "refused-ask"
    registry = _registry(queue, 1, "global", Retention())
    admin = redis.Redis.from_url(url)
    try:
        async with QueueClient(url) as client, run_worker(registry, queue, url):
            await client.pause(queue)
            handle = await client.queue(queue).add(6)
            admin.config_set("maxmemory", "1")
            results: list[int] = []
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    results.append(await handle.result(timeout=20))

                tg.start_soon(wait)

                async def reading() -> bool:  # the wait's blocking read: its ask was refused
                    return any(c.get("cmd") == "xread" for c in admin.client_list())

                await async_wait_until(reading, what="the waiter's read")
                assert not admin.exists(QueueKeys(queue).ends_read)
                admin.config_set("maxmemory", "0")

                async def asked() -> bool:
                    return bool(admin.exists(QueueKeys(queue).ends_read))

                await async_wait_until(asked, what="the waiter's second ask")
                await client.resume(queue)
        assert results == [6]
        assert [kind for kind, of in _stream(admin, queue, 1) if of == handle.id] == [
            "completed"]
    finally:
        admin.close()
