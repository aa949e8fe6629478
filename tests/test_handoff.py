"""Hand-off: an add claims a job for an idle worker and hands it over in the wake-up message, so
the worker starts it without a claim of its own (lua/lib/handoff.lua).

The message is only the fast path: a worker's next claim withdraws its registration and takes
over whatever was handed to it, so a lost message delays a job but never strands it, and a
stopping worker gives back what it was handed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anyio
import msgpack
import pytest
import redis
import redis.asyncio

from panqueue import Job, JobFailed, JobState, QueueClient, Registry, WorkerPool
from panqueue._codec import encode
from panqueue._keys import QueueKeys
from panqueue._store import transitions
from panqueue._store.loader import SCRIPTS
from panqueue._store.notify import CancelRequest, Handoff, WakeUp, parse_message
from panqueue._store.ops import NewJob, add_jobs, cancel, pause
from panqueue._store.status import Status
from panqueue._store.transitions import Completion
from panqueue._store.transport import SyncTransport
from panqueue.testing import FaultProxy, run_worker
from tests.helpers import (
    as_in_an_application,
    async_wait_until,
    asyncio_run_portal,
    call_of,
    capture_panqueue_logs,
    load_scripts,
)

TTL = 30_000

pytestmark = pytest.mark.anyio


@pytest.fixture
def store(redis_url: str) -> Iterator[SyncTransport]:
    transport = SyncTransport(redis_url)
    yield transport
    transport.close()


@pytest.fixture
def notify(redis_url: str, queue_name: str) -> Iterator[Any]:
    """A subscription to the queue's notify channel, as a worker has one."""
    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    pubsub.ssubscribe(QueueKeys(queue_name).notify)
    assert pubsub.get_message(timeout=5)["type"] == "ssubscribe"
    yield pubsub
    pubsub.close()
    client.close()


def add(store: SyncTransport, keys: QueueKeys, n: int = 1) -> list[str]:
    jobs = [NewJob(None, encode(i)) for i in range(n)]
    return [job_id for job_id, _ in store.run(add_jobs(keys, jobs))]


def register(store: SyncTransport, keys: QueueKeys, token: str, idle_ms: int = 10_000) -> None:
    """An empty claim that registers ``token`` as an idle worker's."""
    claimed = store.run(transitions.claim(keys, token, TTL, 5, idle_ms=idle_ms))
    assert claimed.jobs == []


def messages(pubsub: Any) -> list[bytes]:
    found = []
    while (message := pubsub.get_message(timeout=0.2)) is not None:
        if message["type"] == "smessage":
            found.append(message["data"])
    return found


def test_an_add_hands_its_job_to_an_idle_worker_in_the_wake_up(
        store: SyncTransport, redis_client: redis.Redis, notify: Any, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    register(store, keys, "w:1")
    [job_id] = add(store, keys)
    [message] = messages(notify)
    handed = parse_message(message)
    assert isinstance(handed, Handoff)
    [job] = handed.jobs
    assert (handed.token, job.id, job.attempt, job.token) == ("w:1", job_id, 1, "w:1")
    # Claimed and locked in the add itself: active, with the registration's token.
    assert redis_client.hmget(keys.job(job_id), "s", "tk") == [b"active", b"w:1"]
    assert redis_client.llen(keys.wait_list) == 0 and redis_client.zcard(keys.idle) == 0
    done = store.run(transitions.complete_batch(
        keys, [Completion(job_id, "w:1", encode("ok"))], claim_next=False, keep=-1, token="",
        ttl_ms=TTL))
    assert done.statuses == [Status.COMPLETED]


def test_one_registration_takes_one_job_and_the_rest_wait_in_order(
        store: SyncTransport, redis_client: redis.Redis, notify: Any, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    register(store, keys, "w:1")
    first, second, third = add(store, keys, 3)
    handed, wake = messages(notify)
    heard = parse_message(handed)
    assert isinstance(heard, Handoff) and [job.id for job in heard.jobs] == [first]
    assert parse_message(wake) == WakeUp()  # other workers are woken for the rest
    # The default priority waits in the wait list, in order.
    assert [x.decode() for x in redis_client.lrange(keys.wait_list, 0, -1)] == [second, third]


def test_a_lost_message_costs_a_delay_not_the_job(
        store: SyncTransport, redis_client: redis.Redis, queue_name: str) -> None:
    """Nobody reads the hand-off message: the worker's next claim withdraws its registration
    and takes the job over, locked with that claim's token; the old token no longer holds it,
    and nothing was charged as a stall."""
    keys = QueueKeys(queue_name)
    register(store, keys, "w:1")
    [job_id] = add(store, keys)
    claimed = store.run(transitions.claim(keys, "w:2", TTL, 5, withdraw=["w:1"], idle_ms=10_000))
    assert [(job.id, job.token) for job in claimed.jobs] == [(job_id, "w:2")]
    assert redis_client.hmget(keys.job(job_id), "tk", "a", "sc") == [b"w:2", b"1", None]
    # The claim took a job, so it did not register: no registration is left.
    assert redis_client.zcard(keys.idle) == 0
    stale = store.run(transitions.complete_batch(
        keys, [Completion(job_id, "w:1", encode("ok"))], claim_next=False, keep=-1, token="",
        ttl_ms=TTL))
    assert stale.statuses == [Status.LOCK_LOST]
    # Withdrawing again finds nothing more: the job is handed out once.
    again = store.run(transitions.claim(keys, "w:3", TTL, 5, withdraw=["w:1"]))
    assert again.jobs == []


def test_a_cancel_of_a_handed_job_is_told_again_for_the_claim_that_takes_it_over(
        store: SyncTransport, notify: Any, queue_name: str) -> None:
    """A cancel names the run it is for by its lock (lua/lib/cancel_request.lua). A job
    cancelled while it waits, handed, for its worker is locked anew by the claim that takes it
    over: that claim tells the cancel again, for the new lock, so the attempt it starts is the
    one stopped."""
    keys = QueueKeys(queue_name)
    register(store, keys, "w:1")
    [job_id] = add(store, keys)
    assert store.run(cancel(keys, job_id)) is JobState.ACTIVE
    store.run(transitions.claim(keys, "w:2", TTL, 5, withdraw=["w:1"]))
    handed, for_the_registration, for_the_claim = messages(notify)
    assert isinstance(parse_message(handed), Handoff)
    assert parse_message(for_the_registration) == CancelRequest(job_id, "w:1")
    assert parse_message(for_the_claim) == CancelRequest(job_id, "w:2")


def test_a_stopping_worker_takes_back_what_it_was_handed(
        store: SyncTransport, redis_client: redis.Redis, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    register(store, keys, "w:1")
    [job_id] = add(store, keys)
    # A claim of nothing that withdraws: what a stopping worker sends.
    claimed = store.run(transitions.claim(keys, "w:2", TTL, 0, withdraw=["w:1"]))
    assert [job.id for job in claimed.jobs] == [job_id]
    assert store.run(transitions.release(keys, [(job_id, "w:2")])) == 1
    assert redis_client.hget(keys.job(job_id), "s") == b"waiting"
    assert redis_client.zcard(keys.idle) == 0


def test_an_expired_registration_gets_nothing(
        store: SyncTransport, redis_client: redis.Redis, notify: Any, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    register(store, keys, "w:1", idle_ms=1)
    redis_client.zadd(keys.idle, {f"{TTL}:w:1": 0})  # expired long ago
    [job_id] = add(store, keys)
    assert messages(notify) == [b"w"]  # a plain wake-up
    assert redis_client.hget(keys.job(job_id), "s") == b"waiting"
    assert redis_client.zcard(keys.idle) == 0


def test_a_registration_that_expired_below_a_live_one_is_never_handed_a_job(
        store: SyncTransport, redis_client: redis.Redis, notify: Any, queue_name: str) -> None:
    """The live registration takes the first job; the second finds only the expired one,
    which goes (with every other: they are scored by when they expire) and hands nothing."""
    keys = QueueKeys(queue_name)
    register(store, keys, "w:live")
    redis_client.zadd(keys.idle, {f"{TTL}:w:dead": 0})  # a dead worker's, expired long ago
    first, second = add(store, keys, 2)
    handed, wake = messages(notify)
    heard = parse_message(handed)
    assert isinstance(heard, Handoff) and heard.token == "w:live"
    assert [job.id for job in heard.jobs] == [first]
    assert parse_message(wake) == WakeUp()
    assert redis_client.hget(keys.job(second), "s") == b"waiting"
    assert redis_client.zcard(keys.idle) == 0
    third = add(store, keys)[0]  # nobody registered: a wake-up, the job waits
    assert messages(notify) == []  # work was there already: no wake-up either
    assert redis_client.hget(keys.job(third), "s") == b"waiting"


def test_a_paused_queue_hands_nothing_over(
        store: SyncTransport, redis_client: redis.Redis, notify: Any, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    register(store, keys, "w:1")
    store.run(pause(keys, True))
    [job_id] = add(store, keys)
    assert not [m for m in messages(notify) if m.startswith(b"h")]
    assert redis_client.hget(keys.job(job_id), "s") == b"waiting"
    # The registration stands for when the queue resumes; a paused claim makes none.
    assert redis_client.zcard(keys.idle) == 1
    register(store, keys, "w:2")
    assert redis_client.zscore(keys.idle, f"{TTL}:w:2") is None


def test_a_resent_registering_claim_answers_the_job_handed_to_it(
        store: SyncTransport, queue_name: str) -> None:
    """A registering claim's reply was lost and a job was handed to its token before the
    resend: the resend (same token, its request id) answers that job."""
    keys = QueueKeys(queue_name)
    register(store, keys, "w:1")
    [job_id] = add(store, keys)
    resent = store.run(transitions.claim(keys, "w:1", TTL, 5, idle_ms=10_000))
    assert [(job.id, job.token) for job in resent.jobs] == [(job_id, "w:1")]


# --------------------------------------------------------------------------- real workers


async def test_an_idle_worker_runs_an_added_job_it_was_handed(
        redis_url: str, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    registry = Registry()
    ran: list[str] = []

    @registry.handler(queue_name, concurrency=4)
    async def handler(job: Job) -> Any:
        ran.append(job.id)
        return job.data

    watcher = redis.Redis.from_url(redis_url)

    async def registered() -> bool:
        return watcher.zcard(keys.idle) == 1

    pubsub = watcher.pubsub()
    pubsub.ssubscribe(keys.notify)
    try:
        async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
            await async_wait_until(registered)
            for i in range(5):
                handle = await client.queue(queue_name).add(i)
                assert await handle.result(timeout=10) == i
                # Registered again after each job: the next add is handed over too.
                await async_wait_until(registered)
            handed = []
            while (message := pubsub.get_message(timeout=0.1)) is not None:
                heard = parse_message(message["data"]) if message["type"] == "smessage" \
                    else None
                if isinstance(heard, Handoff):
                    handed += [job.id for job in heard.jobs]
            assert handed == ran and len(ran) == 5
        # A stopped worker leaves no registration behind.
        assert watcher.zcard(keys.idle) == 0
    finally:
        pubsub.close()
        watcher.close()


async def test_a_slot_task_whose_attempt_was_stopped_runs_the_next_job_handed_to_it(
        redis_url: str, queue_name: str) -> None:
    """An idle worker starts a handed job on the slot task whose jobs ran out, which waits for
    it (``Claimer._park``), not on a new task. An attempt stopped on that task, by its timeout
    or by a cancel, leaves it able to run the next job: with one slot, every job below runs on
    the same task."""
    keys = QueueKeys(queue_name)
    registry = Registry()
    hanging = anyio.Event()

    @registry.handler(queue_name, concurrency=1)
    async def handler(job: Job) -> Any:
        if job.data == "hang":
            hanging.set()
            await anyio.sleep_forever()
        return job.data

    watcher = redis.Redis.from_url(redis_url)

    async def registered() -> bool:
        return watcher.zcard(keys.idle) == 1

    try:
        async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
            queue = client.queue(queue_name)
            await async_wait_until(registered)
            timed_out = await queue.add("hang", timeout=0.2)
            with pytest.raises(JobFailed, match="exceeded its timeout"):
                await timed_out.result(timeout=10)
            await async_wait_until(registered)
            hanging = anyio.Event()
            cancelled = await queue.add("hang")
            with anyio.fail_after(10):
                await hanging.wait()
            assert await client.cancel(queue_name, cancelled.id) is JobState.ACTIVE
            with pytest.raises(JobFailed, match="cancelled"):
                await cancelled.result(timeout=10)
            for i in range(3):
                await async_wait_until(registered)
                handle = await queue.add(i)
                assert await handle.result(timeout=10) == i
    finally:
        watcher.close()


async def _none_kept(worker: str, ids: set[str]) -> None:
    """Until no ``ClaimedJob`` of ``ids`` that ``worker`` claimed is left (ids repeat across
    tests: the worker's name in the lock token tells its claims apart)."""
    import gc

    from panqueue._store.transitions import ClaimedJob

    async def none_kept() -> bool:
        gc.collect()
        # type(), not isinstance(): that would ask lazy objects of other tests (Django's) for
        # their __class__, which sets them up.
        return not any(type(o) is ClaimedJob and o.id in ids
                       and o.token.startswith(worker + ":") for o in gc.get_objects())

    await async_wait_until(none_kept, timeout=5, what="no claimed job kept", interval=0.1)


async def test_a_parked_slot_task_keeps_no_job(redis_url: str, queue_name: str) -> None:
    """A slot task whose jobs ran out waits for the next one (``Claimer._park``) without
    holding the jobs it ran (their data may be large), nor does the wake-up channel keep the
    last hand-over: once the worker is idle again, no ``ClaimedJob`` of them is left."""
    keys = QueueKeys(queue_name)
    registry = Registry()

    @registry.handler(queue_name, concurrency=2)
    async def handler(job: Job) -> Any:
        return len(job.data)

    watcher = redis.Redis.from_url(redis_url)

    async def registered() -> bool:
        return watcher.zcard(keys.idle) == 1

    try:
        async with QueueClient(redis_url) as client, \
                run_worker(registry, queue_name, redis_url) as worker:
            await async_wait_until(registered)
            ids = set()
            for _ in range(3):
                handle = await client.queue(queue_name).add("x" * 100_000)
                assert await handle.result(timeout=10) == 100_000
                ids.add(handle.id)
                await async_wait_until(registered)

            # The last job's recording may still be on its way out: none is kept for good.
            await _none_kept(worker.name, ids)
    finally:
        watcher.close()


async def test_a_job_the_handler_keeps_keeps_no_claim_of_it(redis_url: str,
                                                           queue_name: str) -> None:
    """A handler may keep its ``Job`` (an error tracker holds it with the failure): the job
    keeps its decoded data, not the claim's stored form of it as well."""
    registry, kept = Registry(), []

    @registry.handler(queue_name)
    async def handler(job: Job) -> None:
        kept.append(job)

    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, redis_url) as worker:
        handle = await client.queue(queue_name).add("x")
        await handle.result(timeout=10)

        # The recording may still be on its way out: none is kept for good.
        await _none_kept(worker.name, {handle.id})
    assert [job.id for job in kept] == [handle.id]


async def test_jobs_added_one_at_a_time_to_idle_workers_run_once_each(
        redis_url: str, queue_name: str) -> None:
    """Three workers, each idle and registered, take jobs added one at a time: every job runs
    exactly once, on its first attempt, and none is charged a stall."""
    registry = Registry()
    runs: dict[int, int] = {}

    @registry.handler(queue_name, concurrency=2)
    async def handler(job: Job) -> Any:
        runs[job.data] = runs.get(job.data, 0) + 1
        await anyio.sleep(0.001)

    keys = QueueKeys(queue_name)
    check = redis.Redis.from_url(redis_url)
    try:
        async with QueueClient(redis_url) as client, \
                run_worker(registry, queue_name, redis_url), \
                run_worker(registry, queue_name, redis_url), \
                run_worker(registry, queue_name, redis_url):
            queue = client.queue(queue_name)
            handles = []
            for i in range(150):
                handles.append(await queue.add(i))
                if i % 10 == 0:
                    await anyio.sleep(0.002)  # let workers go idle and register in between
            for handle in handles:
                await handle.result(timeout=15)
        assert runs == {i: 1 for i in range(150)}
        for handle in handles:
            assert check.hmget(keys.job(handle.id), "a", "sc") == [b"1", None]
        assert check.zcard(keys.idle) == 0
    finally:
        check.close()


def test_the_hand_off_message_is_msgpack_of_token_and_claim(
        store: SyncTransport, notify: Any, queue_name: str) -> None:
    """The wire format workers parse (lua/lib/handoff.lua): "h" + msgpack [token, claim]."""
    keys = QueueKeys(queue_name)
    register(store, keys, "w:1")
    add(store, keys)
    [message] = messages(notify)
    token, reply = msgpack.unpackb(message[1:], raw=True)
    assert token == b"w:1" and reply[0] == 1


# --------------------------------------------------------------------------- lost replies


async def test_a_job_handed_to_a_claim_whose_reply_was_lost_runs_once(
        proxy: FaultProxy, redis_url: str, queue_name: str) -> None:
    """The worker's first claim finds nothing and registers, but its reply is lost; before the
    claim is sent again, an add hands a job to that registration and the message reaches the
    worker, which starts the job. The resent claim answers the same job (its token is its
    request id): the job still runs once."""
    registry = Registry()
    runs: list[int] = []
    release = anyio.Event()

    @registry.handler(queue_name, max_stalls=0, concurrency=2)
    async def handler(job: Job) -> Any:
        runs.append(job.data)
        await release.wait()  # still running when the resent claim's reply comes back
        return job.data

    loader = redis.Redis.from_url(redis_url)
    load_scripts(loader, SCRIPTS.claim)  # loaded: the first FCALL runs the script
    loader.close()
    # Three lost replies in a row: the resends come after 0.1, 0.2 and 0.4 s of backoff, so the
    # add below lands before the last one.
    proxy.drop_next_reply(3, match=call_of(SCRIPTS.claim))
    with capture_panqueue_logs() as logs:
        await _run_handed_job(client_url=redis_url, proxy=proxy, registry=registry,
                              queue_name=queue_name, runs=runs, release=release)
    # Started once: never stopped as "claimed again" by a second start of the same job.
    assert not [e for e in logs if "lock lost" in e["event"]], logs
    assert runs == [1]


async def _run_handed_job(*, client_url: str, proxy: FaultProxy, registry: Registry,
                          queue_name: str, runs: list[int], release: anyio.Event) -> None:
    redis_url = client_url
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, proxy.url):
        await anyio.to_thread.run_sync(proxy.wait_for_dropped_replies, 1)
        handle = await client.queue(queue_name).add(1)

        async def ran() -> bool:
            return bool(runs)
        await async_wait_until(ran)
        # The resend (after the claim loop's backoff) has answered by the time the worker
        # claims again: wait for the registration it makes after that, then let the job end.
        check = redis.Redis.from_url(redis_url)

        async def claimed_again() -> bool:
            return check.zcard(QueueKeys(queue_name).idle) == 1
        await async_wait_until(claimed_again)
        check.close()
        release.set()
        assert await handle.result(timeout=10) == 1


@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
def test_a_worker_under_asyncio_run_starts_the_first_job_handed_to_it(
        redis_url: str, queue_name: str, runner: str) -> None:
    """An application may run its workers under ``asyncio.run`` (an ASGI server does), or
    uvloop's, not ``anyio.run``: a job handed to a worker that has run none yet (no slot task
    waits for one) starts, whatever context the wake-up message is read in, and so does the
    next one, handed to the slot task that ran the first; a cancel request heard the same way
    stops a running job. Each is heard from the subscription: the worker polls only every
    minute."""
    import uvloop  # a dev dependency: uvicorn[standard] runs applications on it
    keys = QueueKeys(queue_name)
    registry = Registry()
    started = asyncio.Event()

    @registry.handler(queue_name, concurrency=4)
    async def handler(job: Job) -> Any:
        if job.data == "wait":
            started.set()
            await asyncio.sleep(30)
        return job.data

    async def main() -> list[Any]:
        outcome: list[Any] = []
        watcher = redis.asyncio.Redis.from_url(redis_url)

        async def idle() -> bool:  # registered idle: the next add is handed over
            return await watcher.zcard(keys.idle) == 1

        try:
            async with asyncio.timeout(40), QueueClient(redis_url) as client, \
                    as_in_an_application(WorkerPool(registry, url=redis_url, queues=[queue_name],
                                                    grace=2.0, poll_interval=60.0)):
                await async_wait_until(idle, what="the worker registered idle")
                for data in ("first", "second"):
                    handle = await client.queue(queue_name).add(data)
                    outcome.append(await handle.result(timeout=10))
                    await async_wait_until(idle, what="the worker registered idle again")
                waiting = await client.queue(queue_name).add("wait")
                await asyncio.wait_for(started.wait(), 10)
                await client.cancel(queue_name, waiting.id)
                with pytest.raises(JobFailed, match="cancel"):
                    await waiting.result(timeout=10)
                outcome.append((await client.get_job(queue_name, waiting.id)).state)
        finally:
            await watcher.aclose()
        return outcome

    with asyncio_run_portal(uvloop.run if runner == "uvloop" else asyncio.run) as portal:
        assert portal.call(main) == ["first", "second", JobState.CANCELLED]
