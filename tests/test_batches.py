"""Batches: a group of jobs, in any queues, whose callback job is added exactly once when the
batch is closed and every job in it has ended (completed, failed or cancelled). Counts are
checked at every step; the exactly-once guarantee against several worker processes finishing
the last jobs together, a worker killed mid-batch, retries, cancels and expiry; and nesting
(a flow inside a batch, a child batch opened by a batch job's handler)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from panqueue import (
    Batch,
    BatchInfo,
    ConfigError,
    Fail,
    Job,
    JobNotFound,
    JobState,
    PayloadError,
    QueueClient,
    Registry,
    SyncBatch,
    SyncQueueClient,
    WorkerPool,
)
from panqueue._keys import BatchKeys, QueueKeys, partition_keys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import batches as batches_ops
from panqueue._store.ops.batches import (
    _call,
    _fire,
    callback_id,
    open_batch,
    relay,
    sweep_batches,
)
from panqueue._store.transport import ScriptCall
from panqueue.embedded import find_server_binary
from panqueue.testing import FaultProxy, drain, run_worker
from tests.helpers import (
    APPS,
    WorkerProcess,
    async_wait_until,
    load_scripts,
    pausing_after_the_zadd,
    wait_until,
)
from tests.test_cluster import Cluster, _running_cluster, _spread_queues

sys.path.insert(0, str(APPS))
import batch_app

WORK, DONE, PARENT = "batch-work", "batch-done", "batch-parent"
# A callback queue that keeps no completed job, and a queue of four partitions.
UNKEPT, SPREAD = "batch-done-unkept", "batch-spread"
DAY_MS = 86_400_000


def complete_id(batch: Batch | SyncBatch) -> str:
    return callback_id(batch.id, "complete")


def success_id(batch: Batch | SyncBatch) -> str:
    return callback_id(batch.id, "success")


def info(batch_id: str, total: int, pending: int, completed: int, failed: int,
         closed: bool) -> BatchInfo:
    return BatchInfo(batch_id, total, pending, completed, failed, closed)


def grace_passed(r: redis.Redis, queue: str, batch_id: str) -> None:
    """The callback queue ``queue`` looks at the batch from now on, as it does once the open's
    grace passed (ops/batches.py OPEN_GRACE_MS, 30 s)."""
    assert r.zadd(QueueKeys(queue).batches, {batch_id: 0}, xx=True, ch=True) == 1


def callback_runs(r: redis.Redis, job_id: str) -> int:
    return int(r.get(f"runs:{job_id}") or 0)


# ----------------------------------------------------------------------------- counts


@pytest.mark.anyio
async def test_batch_info_counts_are_exact_at_every_step(redis_url: str,
                                                         redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {"url": redis_url}),
                                   on_success=(DONE, {"url": redis_url}))
        assert await batch.info() == info(batch.id, 0, 0, 0, 0, False)
        ok = await batch.add_bulk(WORK, [{"n": i} for i in range(3)])
        bad = await batch.add(WORK, {"fail": True})
        doomed = await batch.add(WORK, {"n": 9})
        assert await batch.info() == info(batch.id, 5, 5, 0, 0, False)
        # A cancel from the client (no worker relays it): info relays the queue's outbox.
        await client.cancel(WORK, doomed.id)
        assert await batch.info() == info(batch.id, 5, 4, 0, 1, False)
        async with run_worker(batch_app.queues, WORK, redis_url):
            await async_wait_until(lambda: _pending_is(batch, 0), 15, "every job ended")
            assert await batch.info() == info(batch.id, 5, 0, 3, 2, False)
            # Not closed: nothing is added, however long the jobs have been finished.
            assert not await client.queue_exists(DONE)
            assert await batch.close() == info(batch.id, 5, 0, 3, 2, True)
        callback = await client.get_job(DONE, complete_id(batch))
        assert callback.data == {"url": redis_url,
                                 "batch": info(batch.id, 5, 0, 3, 2, True).as_dict()}
        with pytest.raises(JobNotFound):
            await client.get_job(DONE, success_id(batch))  # two jobs failed
        assert {h.id for h in ok} | {bad.id, doomed.id} == {
            m.decode().split("\t")[1] for m in redis_client.smembers(BatchKeys(batch.id).jobs)}


async def _pending_is(batch: Batch, pending: int) -> bool:
    return (await batch.info()).pending == pending


@pytest.mark.anyio
async def test_an_empty_batch_fires_when_it_is_closed(redis_url: str) -> None:
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, None), on_success=(DONE, {"x": 1}))
        assert await batch.close() == info(batch.id, 0, 0, 0, 0, True)
        complete = await client.get_job(DONE, complete_id(batch))
        success = await client.get_job(DONE, success_id(batch))
    assert complete.data == {"batch": info(batch.id, 0, 0, 0, 0, True).as_dict()}
    assert success.data["x"] == 1 and success.state == JobState.WAITING
    # Closing again changes nothing and adds nothing more.
    async with QueueClient(redis_url) as client:
        assert await batch.close() == info(batch.id, 0, 0, 0, 0, True)
        assert (await client.counts(DONE))[JobState.WAITING] == 2


@pytest.mark.anyio
async def test_a_batch_is_taken_up_by_its_id_from_another_client(redis_url: str) -> None:
    async with QueueClient(redis_url) as opener:
        opened = await opener.batch(on_complete=(DONE, None))
        await opened.add(WORK, {"n": 1})
    async with QueueClient(redis_url) as client:
        batch = Batch(client, opened.id)
        # Its generated ids are its own: never one the opener's handle gave.
        job = await batch.add(WORK, {"n": 2})
        assert job.created and job.id != f"{opened.id}-0" and job.id.startswith(opened.id)
        assert (await job.info()).options["batch"] == opened.id
        child = await batch.batch(on_complete=(DONE, None))
        assert await child.close() == info(child.id, 0, 0, 0, 0, True)
        # The empty child fired: its callback is the batch's third job.
        assert await batch.info() == info(opened.id, 3, 3, 0, 0, False)
        assert await batch.close() == info(opened.id, 3, 3, 0, 0, True)
    with SyncQueueClient(redis_url) as sync_client:
        assert SyncBatch(sync_client, opened.id).info() == info(opened.id, 3, 3, 0, 0, True)


def test_handles_on_one_batch_never_give_the_same_generated_id(redis_url: str) -> None:
    """The opener and two more handles (async and blocking) each add to the same queue: every
    add makes a job of its own, and the batch counts them all."""
    with SyncQueueClient(redis_url) as opener:
        opened = opener.batch(on_complete=(DONE, None))
        ids = [opened.add(WORK, {"n": 0}).id, *(h.id for h in opened.add_bulk(WORK, [1, 2]))]
        assert ids == [f"{opened.id}-{n}" for n in range(3)]
        for _ in range(2):
            handles = SyncBatch(opener, opened.id).add_bulk(WORK, [3, 4])
            assert all(h.created for h in handles)
            ids += [h.id for h in handles]
    assert len(set(ids)) == 7
    with SyncQueueClient(redis_url) as client:
        assert SyncBatch(client, opened.id).info() == info(opened.id, 7, 7, 0, 0, False)


@pytest.mark.anyio
async def test_on_success_and_on_complete_when_every_job_completed_even_after_retries(
        redis_url: str, redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client, \
            run_worker(batch_app.queues, WORK, redis_url), \
            run_worker(batch_app.queues, DONE, redis_url):
        batch = await client.batch(on_complete=(DONE, {"url": redis_url}),
                                   on_success=(DONE, {"url": redis_url}))
        # Each fails twice and completes on its third (last) attempt: it ends once.
        handles = await batch.add_bulk(WORK, [{"n": i, "fail_first": 3} for i in range(4)])
        await batch.close()
        await async_wait_until(lambda: _ran(redis_client, success_id(batch)), 20,
                               "the success callback ran")
        await async_wait_until(lambda: _ran(redis_client, complete_id(batch)), 20,
                               "the completion callback ran")
        assert [(await h.info()).attempts for h in handles] == [3] * 4
        assert await batch.info() == info(batch.id, 4, 0, 4, 0, True)
    assert callback_runs(redis_client, complete_id(batch)) == 1
    assert callback_runs(redis_client, success_id(batch)) == 1


async def _ran(r: redis.Redis, job_id: str) -> bool:
    return callback_runs(r, job_id) >= 1


@pytest.mark.anyio
async def test_cancelled_and_expired_jobs_count_as_failed(redis_url: str) -> None:
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {}), on_success=(DONE, {}))
        # Past its deadline at the add: born cancelled; due later in a paused queue: expires.
        await batch.add(WORK, {}, expires=datetime.now(UTC) - timedelta(seconds=1))
        later = await batch.add(WORK, {}, expires=0.3)
        cancelled = await batch.add(WORK, {})
        await client.cancel(WORK, cancelled.id)
        await client.pause(WORK)
        async with run_worker(batch_app.queues, WORK, redis_url):
            await async_wait_until(lambda: _pending_is(batch, 0), 15, "the job expired")
        assert (await later.info()).state == JobState.CANCELLED
        assert await batch.close() == info(batch.id, 3, 0, 0, 3, True)
        await client.get_job(DONE, complete_id(batch))
        assert not [j for j in await client.list_jobs(DONE, JobState.WAITING)
                    if j.id == success_id(batch)]


@pytest.mark.anyio
async def test_a_running_job_cancelled_from_the_client_ends_the_batch(redis_url: str) -> None:
    async with QueueClient(redis_url) as client, \
            run_worker(batch_app.queues, WORK, redis_url, stalled_interval=0.2):
        batch = await client.batch(on_complete=(DONE, {}), on_success=(DONE, {}))
        running = await batch.add(WORK, {"sleep": 30})
        await batch.close()
        await async_wait_until(lambda: _state_is(running, JobState.ACTIVE), 10, "it runs")
        await client.cancel(WORK, running.id)
        callback = client.queue(DONE).job(complete_id(batch))
        await async_wait_until(lambda: _exists(callback), 10, "the callback was added")
        assert (await callback.info()).data["batch"] == info(batch.id, 1, 0, 0, 1,
                                                             True).as_dict()
        assert not await _exists(client.queue(DONE).job(success_id(batch)))


async def _state_is(handle: Any, state: JobState) -> bool:
    return (await handle.info()).state == state


@pytest.mark.anyio
async def test_a_job_deleted_before_it_ended_counts_as_failed(redis_url: str) -> None:
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {}))
        job = await batch.add(WORK, {})
        await batch.close()
        assert await client.remove(WORK, job.id)
        assert await batch.info() == info(batch.id, 1, 0, 0, 1, True)
        await client.get_job(DONE, complete_id(batch))


@pytest.mark.anyio
async def test_the_callback_follows_the_last_ending_without_waiting_for_an_upkeep_tick(
        redis_url: str) -> None:
    """The worker that ends a batch job relays the ending at once, also when jobs end while
    it is relaying earlier ones (the upkeep tick here is a minute away)."""
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {}))
        await batch.add_bulk(WORK, [{"n": i} for i in range(200)])
        await batch.close()
        async with run_worker(batch_app.queues, WORK, redis_url, stalled_interval=60.0):
            callback = client.queue(DONE).job(complete_id(batch))
            await async_wait_until(lambda: _exists(callback), 10, "the callback was added")


async def _exists(handle: Any) -> bool:
    try:
        await handle.info()
    except JobNotFound:
        return False
    return True


@pytest.mark.anyio
async def test_endings_nobody_relayed_reach_the_batch_through_a_workers_tick(
        redis_url: str) -> None:
    """Cancels from a client: no worker ended the jobs, nobody calls info() or close() again.
    A worker of the jobs' queue relays them on its upkeep tick."""
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {}))
        jobs = await batch.add_bulk(WORK, [{}, {}])
        await batch.close()
        await client.pause(WORK)  # the worker runs nothing: only its upkeep
        async with run_worker(batch_app.queues, WORK, redis_url, stalled_interval=0.2):
            for job in jobs:
                await client.cancel(WORK, job.id)
            callback = client.queue(DONE).job(complete_id(batch))
            await async_wait_until(lambda: _exists(callback), 10, "the callback was added")


@pytest.mark.anyio
async def test_a_worker_of_the_callback_queue_relays_for_an_open_batch(
        redis_url: str, redis_client: redis.Redis) -> None:
    """The jobs' queue has no worker at all: the callback queue's sweep relays the outboxes
    of the batch's queues."""
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {"url": redis_url}))
        job = await batch.add(WORK, {})
        await batch.close()
        await client.cancel(WORK, job.id)
        grace_passed(redis_client, DONE, batch.id)
        async with run_worker(batch_app.queues, DONE, redis_url, stalled_interval=0.2):
            callback = client.queue(DONE).job(complete_id(batch))
            await async_wait_until(lambda: _exists(callback), 10, "the callback was added")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.anyio
async def test_bad_arguments_are_one_clear_error_and_write_nothing(
        redis_url: str, redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client:
        for bad, message in [("done", "must be a \\(queue, data\\) tuple"),
                             ((DONE, [1]), "must be a dict"),
                             ((DONE, {"batch": 1}), "may not have the key 'batch'"),
                             (("a{b}", {}), "braces"),
                             ((DONE, {"x": object()}), "JSON")]:
            with pytest.raises(ConfigError, match=message):
                await client.batch(on_complete=bad)  # type: ignore[arg-type]
        assert redis_client.dbsize() == 0
        batch = await client.batch(on_complete=(DONE, {}))
        with pytest.raises(PayloadError):
            await batch.add_bulk(WORK, [{"ok": 1}, {"bad": object()}])
        with pytest.raises(ConfigError, match="unknown add"):
            await batch.add(WORK, {}, colour="red")
        with pytest.raises(ConfigError, match="dependency nope"):
            await batch.add(WORK, {}, depends_on=["nope"])
        assert await batch.info() == info(batch.id, 0, 0, 0, 0, False)
        pending = await batch.add(WORK, {})
        await batch.close()
        with pytest.raises(ConfigError, match="the batch is closed"):
            await batch.add(WORK, {}, job_id="late")
        await client.cancel(WORK, pending.id)
        assert (await batch.info()).pending == 0
        with pytest.raises(ConfigError, match="the batch has finished"):
            await batch.add(WORK, {}, job_id="late")
        assert not redis_client.exists(QueueKeys(WORK).job("late"))
        with pytest.raises(ConfigError, match="no such batch"):
            await client.batch(on_complete=("elsewhere", {}), parent="no-such-batch")
        assert not redis_client.exists(QueueKeys("elsewhere").batches)


def test_a_callback_its_queue_refuses_holds_up_no_other_batch(
        redis_url: str, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        client.queue("keyed-done", mode="keyed").add({}, key="k")
        with pytest.raises(ConfigError, match="queue 'keyed-done' is keyed"):
            client.batch(on_complete=("keyed-done", {}))
        # A queue that becomes keyed after the batch was opened refuses the callback's add.
        doomed = client.batch(on_complete=("later-keyed", {}))
        fine = client.batch(on_complete=(DONE, {}))
        jobs = [doomed.add(WORK, {}), fine.add(WORK, {})]
        doomed.close()
        fine.close()
        client.queue("later-keyed", mode="keyed").add({}, key="k")
        for job in jobs:
            client.cancel(WORK, job.id)
        with pytest.raises(ConfigError, match="keyed"):
            client._run(relay(QueueKeys(WORK)))
        assert client.get_job(DONE, complete_id(fine)).state == JobState.WAITING
        assert redis_client.zcard(QueueKeys(WORK).batch_outbox) == 0
        assert doomed.info().pending == 0
        grace_passed(redis_client, "later-keyed", doomed.id)
        with pytest.raises(ConfigError, match="keyed"):
            client._run(sweep_batches(QueueKeys("later-keyed")))
        # It stays due: the sweep looks at it again in 30 s.
        assert redis_client.zscore(QueueKeys("later-keyed").batches, doomed.id)


@pytest.mark.anyio
async def test_an_add_that_returns_a_job_outside_the_batch_leaves_it_out(
        redis_url: str) -> None:
    async with QueueClient(redis_url) as client:
        outside = await client.queue(WORK).add({}, job_id="outside")
        batch = await client.batch(on_complete=(DONE, {}))
        again = await batch.add(WORK, {}, job_id="outside")
        assert again.id == outside.id and not again.created
        mine = await batch.add(WORK, {}, job_id="mine")
        assert (await batch.add(WORK, {}, job_id="mine")).id == mine.id  # a repeated add
        assert await batch.info() == info(batch.id, 1, 1, 0, 0, False)
        await client.cancel(WORK, outside.id)
        assert (await batch.close()).pending == 1
        await client.cancel(WORK, mine.id)
        assert await batch.info() == info(batch.id, 1, 0, 0, 1, True)


@pytest.mark.anyio
@pytest.mark.parametrize("queue", [WORK, SPREAD])
async def test_an_id_that_ended_in_the_batch_and_was_removed_cannot_join_it_again(
        redis_url: str, redis_client: redis.Redis, queue: str) -> None:
    """The batch counts each id once: a job of it that ended and was removed, added to it
    again under the same id, would count as ended while it waits. That add is refused and
    writes nothing; while the ended job still exists, the add returns it, as before."""
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {}))
        job = await batch.add(queue, {}, job_id="once")
        await client.cancel(queue, job.id)
        again = await batch.add(queue, {}, job_id="once")
        assert again.id == job.id and not again.created
        assert await batch.info() == info(batch.id, 1, 0, 0, 1, False)
        assert await client.remove(queue, job.id)
        with pytest.raises(ConfigError, match="'once' already ended in batch") as refused:
            await batch.add(queue, {}, job_id="once")
        assert "\n" not in str(refused.value) and "another id" in str(refused.value)
        with pytest.raises(JobNotFound):
            await client.get_job(queue, "once")
        assert await batch.info() == info(batch.id, 1, 0, 0, 1, False)
        assert redis_client.smembers(BatchKeys(batch.id).jobs) == {f"{queue}\tonce".encode()}
        # Removed while it waited: its ending is in the outbox, not yet relayed to the batch.
        waiting = await batch.add(queue, {}, job_id="twice")
        assert await client.remove(queue, waiting.id)
        with pytest.raises(ConfigError, match="'twice' already ended in batch"):
            await batch.add(queue, {}, job_id="twice")
        assert await batch.info() == info(batch.id, 2, 0, 0, 2, False)
        assert (await batch.close()).pending == 0
        await client.get_job(DONE, complete_id(batch))


# ----------------------------------------------------------------------------- nesting


@pytest.mark.anyio
async def test_a_flow_inside_a_batch_counts_cascaded_failures(redis_url: str) -> None:
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {}), on_success=(DONE, {}))
        root = await batch.add(WORK, {"fail": True})
        child = await batch.add(WORK, {}, depends_on=[root])
        grandchild = await batch.add(WORK, {}, depends_on=[child.id])
        first = await batch.add(WORK, {"n": 1})
        then = await batch.add(WORK, {"n": 2}, depends_on=[first])
        await batch.close()
        async with run_worker(batch_app.queues, WORK, redis_url):
            await async_wait_until(lambda: _pending_is(batch, 0), 15, "the flow ended")
        assert (await grandchild.info()).state == JobState.FAILED
        assert (await then.info()).state == JobState.COMPLETED
        assert await batch.info() == info(batch.id, 5, 0, 2, 3, True)
        callback = await client.get_job(DONE, complete_id(batch))
        assert callback.data["batch"]["failed"] == 3


@pytest.mark.anyio
async def test_a_child_batch_opened_by_a_handler_ends_before_its_parent(
        redis_url: str, redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client, \
            run_worker(batch_app.queues, WORK, redis_url), \
            run_worker(batch_app.queues, PARENT, redis_url), \
            run_worker(batch_app.queues, DONE, redis_url):
        parent = await client.batch(on_complete=(DONE, {"url": redis_url, "parent": True}))
        opener = await parent.add(PARENT, {"url": redis_url, "batch": parent.id,
                                           "children": 5})
        await parent.close()
        await async_wait_until(lambda: _ran(redis_client, complete_id(parent)), 20,
                               "the parent's callback ran")
        child_id = await opener.result(timeout=5)
        child_callback = callback_id(child_id, "complete")
        # The child's callback was a job of the parent batch: the parent waited for it.
        assert await parent.info() == info(parent.id, 2, 0, 2, 0, True)
        order = [entry.decode().split()[0] for entry in redis_client.lrange("callbacks", 0, -1)]
        assert order == [child_callback, complete_id(parent)]
        child_data = await client.get_job(DONE, child_callback)
        assert child_data.data["batch"]["completed"] == 5
    assert callback_runs(redis_client, complete_id(parent)) == 1


# ----------------------------------------------------------------------------- the sync client


def test_the_sync_client_mirrors_the_async_one(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        batch = client.batch(on_complete=(DONE, {"k": "v"}), on_success=(DONE, {}))
        assert isinstance(batch, SyncBatch)
        one = batch.add(WORK, {"n": 1})
        more = batch.add_bulk(WORK, [{"n": 2}, {"n": 3}])
        assert batch.info() == info(batch.id, 3, 3, 0, 0, False)
        # A child batch: its callback is a job of this batch (so the total is 4).
        child = batch.batch(on_complete=(DONE, {}))
        assert isinstance(child, SyncBatch)
        assert child.close() == info(child.id, 0, 0, 0, 0, True)
        assert batch.info() == info(batch.id, 4, 4, 0, 0, False)
        for handle in [one, *more]:
            client.cancel(WORK, handle.id)
        client.cancel(DONE, callback_id(child.id, "complete"))
        assert batch.close() == info(batch.id, 4, 0, 0, 4, True)
        assert client.get_job(DONE, complete_id(batch)).data == {
            "k": "v", "batch": info(batch.id, 4, 0, 0, 4, True).as_dict()}
    public = {name for name in dir(Batch) if not name.startswith("_")}
    assert public == {name for name in dir(SyncBatch) if not name.startswith("_")}


# ----------------------------------------------------------------------------- recovery, TTLs


def test_a_batch_that_fired_without_its_callback_gets_it_from_the_sweep(
        redis_url: str, redis_client: redis.Redis) -> None:
    """The firer died between the batch firing and adding the callback: a worker of the
    callback queue adds it, once, however many times the sweep runs."""
    with SyncQueueClient(redis_url) as client:
        store = client.producer.connect()
        batch = client.batch(on_complete=(DONE, {}))
        # Closed by the script alone (nobody adds the callback), as a dying close would.
        store.run(_script(SCRIPTS.batch_close, batch.id))
        assert not redis_client.exists(QueueKeys(DONE).job(complete_id(batch)))
        client._run(sweep_batches(QueueKeys(DONE)))  # within the open's grace: not looked at
        assert not redis_client.exists(QueueKeys(DONE).job(complete_id(batch)))
        grace_passed(redis_client, DONE, batch.id)
        for _ in range(3):
            store.run(sweep_batches(QueueKeys(DONE)))
        assert client.counts(DONE)[JobState.WAITING] == 1
        assert not redis_client.zscore(QueueKeys(DONE).batches, batch.id)


def _script(script: Any, batch_id: str, *args: Any) -> Iterator[Any]:
    yield ScriptCall(script, (BatchKeys(batch_id).prefix,), args)


def test_a_sweep_between_the_two_steps_of_an_open_does_not_forget_the_batch(
        redis_url: str, redis_client: redis.Redis) -> None:
    """A batch's callback queue learns of it first, then the batch is made. A sweep of the
    callback queue that ran between the two saw no batch yet: it must not take that for a
    batch that is gone and forget it, since the callback queue would then owe the batch
    nothing, and the callback would never be added when it fired."""
    batch_id = "opened-slowly"
    with SyncQueueClient(redis_url) as client:
        store = client.producer.connect()
        sweeps: list[int] = []
        store.run(pausing_after_the_zadd(
            open_batch(batch_id, (DONE, {}), None, ""),
            lambda: sweeps.append(client._run(sweep_batches(QueueKeys(DONE))))))
        assert redis_client.exists(BatchKeys(batch_id).state)
        batch = SyncBatch(client, batch_id)
        assert batch.close() == info(batch_id, 0, 0, 0, 0, True)
        assert client.counts(DONE)[JobState.WAITING] == 1


def test_an_open_that_arrives_after_its_grace_is_refused_and_its_batch_forgotten(
        redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side of the race: a batch's open that reaches the server later than the
    callback queue waits before it looks at the batch is refused (nothing is made), so the
    sweep that then finds no batch may forget it."""
    monkeypatch.setattr(batches_ops, "OPEN_GRACE_MS", 200)
    batch_id = "opened-too-late"
    with SyncQueueClient(redis_url) as client:
        store = client.producer.connect()
        with pytest.raises(ConfigError, match="opened too late"):
            store.run(pausing_after_the_zadd(
                open_batch(batch_id, (DONE, {}), None, ""), lambda: time.sleep(0.3)))
        assert not redis_client.exists(BatchKeys(batch_id).state)
        assert redis_client.zscore(QueueKeys(DONE).batches, batch_id) is not None
        client._run(sweep_batches(QueueKeys(DONE)))
        assert redis_client.zscore(QueueKeys(DONE).batches, batch_id) is None


def test_a_relay_repeated_after_a_lost_reply_counts_each_job_once(
        redis_url: str, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        store = client.producer.connect()
        batch = client.batch(on_complete=(DONE, {}))
        job = batch.add(WORK, {})
        client.cancel(WORK, job.id)
        for _ in range(2):  # the first relayer died before removing the outbox entry
            store.run(_script(SCRIPTS.batch_record, batch.id, WORK, job.id, "cancelled"))
        store.run(_script(SCRIPTS.batch_record, batch.id, WORK, job.id, "completed"))
        assert batch.close() == info(batch.id, 1, 0, 0, 1, True)
        assert client.counts(DONE)[JobState.WAITING] == 1


def test_batch_keys_expire_after_inactivity_and_sooner_once_done(
        redis_url: str, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        batch = client.batch(on_complete=(DONE, {}))
        client.cancel(WORK, batch.add(WORK, {}).id)
        keys = BatchKeys(batch.id)
        for key in (keys.state, keys.jobs, keys.queues):
            assert 6 * DAY_MS < redis_client.pttl(key) <= 7 * DAY_MS
        batch.close()
        for key in (keys.state, keys.jobs, keys.ended, keys.queues):
            assert 0 < redis_client.pttl(key) <= DAY_MS
        assert redis_client.zcard(QueueKeys(WORK).batch_outbox) == 0


# ----------------------------------------------------------------------------- processes


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``panqueue worker batch_app:queues`` processes, each with its own output files."""
    started: list[WorkerProcess] = []

    def start(url: str, *queues: str) -> WorkerProcess:
        directory = tmp_path / f"worker-{len(started)}"
        directory.mkdir()
        args = [arg for queue in queues for arg in ("-q", queue)]
        started.append(WorkerProcess(directory, *args, "--url", url, "--poll-interval", "0.1",
                                     app="batch_app:queues"))
        return started[-1]

    yield start
    for worker in started:
        worker.kill()


def test_callback_added_once_when_the_last_jobs_end_together_on_several_workers(
        redis_url: str, redis_client: redis.Redis,
        workers: Callable[..., WorkerProcess]) -> None:
    running = [workers(redis_url, WORK, DONE) for _ in range(3)]
    rounds = 3
    with SyncQueueClient(redis_url) as client:
        batches = []
        for _ in range(rounds):
            batch = client.batch(on_complete=(DONE, {"url": redis_url}),
                                 on_success=(DONE, {"url": redis_url}))
            batch.add_bulk(WORK, [{"n": i} for i in range(2000)])
            batch.close()
            batches.append(batch)
        for batch in batches:
            wait_until(lambda b=batch: callback_runs(redis_client, complete_id(b)) >= 1
                       and callback_runs(redis_client, success_id(b)) >= 1, 120,
                       f"the callbacks of batch {batch.id} ran")
        # Stopped (gracefully: whatever a relay had begun, it finished): nothing can add a
        # callback after this, so the counts below are final.
        assert all(worker.stop() == 0 for worker in running)
        for batch in batches:
            assert batch.info() == info(batch.id, 2000, 0, 2000, 0, True)
            assert callback_runs(redis_client, complete_id(batch)) == 1
            assert callback_runs(redis_client, success_id(batch)) == 1
        assert client.counts(DONE)[JobState.COMPLETED] == 2 * rounds
        assert sum(client.counts(DONE).values()) == 2 * rounds


def test_callback_added_once_after_a_worker_is_killed_mid_batch(
        redis_url: str, redis_client: redis.Redis,
        workers: Callable[..., WorkerProcess]) -> None:
    doomed = workers(redis_url, WORK)
    with SyncQueueClient(redis_url) as client:
        batch = client.batch(on_complete=(DONE, {"url": redis_url}))
        handles = batch.add_bulk(WORK, [{"n": i, "sleep": 1.5} for i in range(12)])
        batch.close()
        wait_until(lambda: client.counts(WORK)[JobState.ACTIVE] >= 8, 20,
                   "the doomed worker runs 8 jobs")
        doomed.process.send_signal(signal.SIGKILL)
        doomed.process.wait()
        killed_at = time.time()
        rescuer = workers(redis_url, WORK, DONE)
        wait_until(lambda: callback_runs(redis_client, complete_id(batch)) >= 1, 60,
                   "the callback ran")
        ended = [client.get_job(WORK, h.id) for h in handles]
        assert all(j.state == JobState.COMPLETED for j in ended)
        callback = client.get_job(DONE, complete_id(batch))
        assert callback.enqueued_at is not None
        assert all(j.finished_at is not None and j.finished_at <= callback.enqueued_at
                   for j in ended)
        assert max(j.finished_at.timestamp() for j in ended if j.finished_at) > killed_at
        assert batch.info() == info(batch.id, 12, 0, 12, 0, True)
        assert callback.data["batch"] == info(batch.id, 12, 0, 12, 0, True).as_dict()
        assert rescuer.stop() == 0
        assert sum(client.counts(DONE).values()) == 1
    assert callback_runs(redis_client, complete_id(batch)) == 1


def test_a_callback_added_by_a_firer_killed_before_it_marked_the_batch_runs_once(
        redis_url: str, redis_client: redis.Redis,
        workers: Callable[..., WorkerProcess]) -> None:
    """The worker that fires the batch adds the callback and dies before it marks the batch;
    the callback runs and retention deletes it. Firing the batch again (a close, the callback
    queue's sweep) adds no second callback."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with SyncQueueClient(redis_url) as client, FaultProxy(port) as proxy:
        load_scripts(redis_client)  # every script call one request, one reply
        batch = client.batch(on_complete=(UNKEPT, {"url": redis_url}))
        batch.add(WORK, {})
        batch.close()
        callback = callback_id(batch.id, "complete")
        # Every request that names the callback runs, and its reply is lost: the firer never
        # learns that the callback was added, so it never gets as far as marking the batch.
        proxy.drop_next_reply(1000, match=callback.encode())
        firer = workers(proxy.url_for(redis_url), WORK)
        wait_until(lambda: redis_client.exists(QueueKeys(UNKEPT).job(callback)), 20,
                   "the firer added the callback")
        firer.process.send_signal(signal.SIGKILL)
        firer.process.wait()
        proxy.clear_drops()
        assert redis_client.hget(BatchKeys(batch.id).state, "fired") == b"1"
        assert redis_client.hget(BatchKeys(batch.id).state, "added") is None
        runner = workers(redis_url, UNKEPT)
        wait_until(lambda: callback_runs(redis_client, callback) == 1
                   and not redis_client.exists(QueueKeys(UNKEPT).job(callback)), 20,
                   "the callback ran and retention deleted it")
        assert batch.close() == info(batch.id, 1, 0, 1, 0, True)
        client._run(sweep_batches(QueueKeys(UNKEPT)))
        wait_until(lambda: not _unfinished(client, UNKEPT), 20, "nothing left to run")
        assert runner.stop() == 0
        assert batch.info() == info(batch.id, 1, 0, 1, 0, True)
    assert callback_runs(redis_client, callback) == 1


def _unfinished(client: SyncQueueClient, queue: str) -> int:
    counts = client.counts(queue)
    return sum(counts[state] for state in (JobState.WAITING, JobState.DELAYED,
                                            JobState.ACTIVE))


@pytest.mark.anyio
async def test_a_firer_that_stalled_after_the_batch_fired_adds_no_second_callback(
        redis_url: str, redis_client: redis.Redis) -> None:
    """One relayer sees the batch fire and stalls before it adds the callback. Meanwhile
    another adds it and marks the batch, the callback runs, and retention deletes it. Then
    the stalled one goes on: it adds nothing."""
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(UNKEPT, {"url": redis_url}))
        stalled = await client._run(_call(SCRIPTS.batch_close, batch.id))
        assert stalled.status == "fire"
        callback = complete_id(batch)
        async with run_worker(batch_app.queues, UNKEPT, redis_url):
            assert await batch.close() == info(batch.id, 0, 0, 0, 0, True)
            await async_wait_until(lambda: _ran_and_deleted(redis_client, callback), 10,
                                   "the callback ran and retention deleted it")
            await client._run(_fire(stalled))
            await drain(redis_url, UNKEPT)
    assert callback_runs(redis_client, callback) == 1


async def _ran_and_deleted(r: redis.Redis, job_id: str) -> bool:
    return callback_runs(r, job_id) == 1 and not r.exists(QueueKeys(UNKEPT).job(job_id))


# ----------------------------------------------------------------------------- partitions


def _partition_of(r: redis.Redis, queue: str, job_id: str) -> int:
    [index] = [keys.partition for keys in partition_keys(queue, 4)
               if r.exists(keys.job(job_id))]
    return index


@pytest.mark.anyio
async def test_a_batch_across_partitions_counts_the_endings_of_every_partition(
        redis_url: str, redis_client: redis.Redis) -> None:
    """Jobs of a queue of four partitions end completed, failed and cancelled in different
    partitions: info() counts every ending, and the batch, closed after all of them ended,
    fires at close(), once."""
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {}), on_success=(DONE, {}))
        jobs = await batch.add_bulk(batch_app.spread, [{"fail": n % 4 == 1} for n in range(40)])
        where = [_partition_of(redis_client, SPREAD, job.id) for job in jobs]
        cancelled = jobs[2::4]
        for job in cancelled:  # from the client: no worker relays these endings
            await client.cancel(SPREAD, job.id)
        assert await batch.info() == info(batch.id, 40, 30, 0, 10, False)
        async with run_worker(batch_app.queues, SPREAD, redis_url):
            await async_wait_until(lambda: _pending_is(batch, 0), 15, "every job ended")
        assert await batch.close() == info(batch.id, 40, 0, 20, 20, True)
        callback = await client.get_job(DONE, complete_id(batch))
        assert callback.data["batch"] == info(batch.id, 40, 0, 20, 20, True).as_dict()
        assert sum((await client.counts(DONE)).values()) == 1  # no on_success: jobs failed
        for ending in (0, 1, 2):  # completed, failed, cancelled: each in several partitions
            assert len({where[n] for n in range(ending, 40, 4)}) > 1


@pytest.mark.anyio
async def test_a_batch_across_partitions_closed_after_its_jobs_were_cancelled_fires_at_close(
        redis_url: str) -> None:
    """No worker at all: close() itself relays the outbox of every partition, finds every job
    ended, and adds the callback before it returns."""
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {}))
        jobs = await batch.add_bulk(batch_app.spread, [{} for _ in range(12)])
        for job in jobs:
            await client.cancel(SPREAD, job.id)
        assert await batch.close() == info(batch.id, 12, 0, 0, 12, True)
        callback = await client.get_job(DONE, complete_id(batch))
        assert callback.data["batch"] == info(batch.id, 12, 0, 0, 12, True).as_dict()
        assert await batch.close() == info(batch.id, 12, 0, 0, 12, True)
        assert sum((await client.counts(DONE)).values()) == 1


@pytest.mark.anyio
async def test_a_batch_across_partitions_fires_when_its_last_job_is_cancelled(
        redis_url: str, redis_client: redis.Redis) -> None:
    """Every job cancelled from the client after the close, no worker of their queue: the
    callback queue's worker relays the outbox of every partition, and the batch fires once."""
    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(DONE, {}))
        jobs = await batch.add_bulk(batch_app.spread, [{} for _ in range(12)])
        await batch.close()
        for job in jobs:
            await client.cancel(SPREAD, job.id)
        grace_passed(redis_client, DONE, batch.id)
        async with run_worker(batch_app.queues, DONE, redis_url, stalled_interval=0.2):
            callback = client.queue(DONE).job(complete_id(batch))
            await async_wait_until(lambda: _exists(callback), 10, "the callback was added")
        assert await batch.info() == info(batch.id, 12, 0, 0, 12, True)
        assert sum((await client.counts(DONE)).values()) == 1


# ----------------------------------------------------------------------------- Redis Cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Three masters (tests/test_cluster.py's cluster, started for this module)."""
    with _running_cluster(find_server_binary()) as running:
        yield running


async def _noop(job: Job) -> None:
    if job.data.get("fail"):
        raise Fail("asked to fail")


@pytest.mark.anyio
async def test_a_batch_spanning_queues_on_several_masters_fires_once(
        cluster: Cluster) -> None:
    """The batch's slot, its jobs' queues and its callback's queue live on different masters:
    every step is a single-slot call on Redis Cluster."""
    queues = list(_spread_queues(cluster, 3))
    callbacks = f"{queues[0]}-done"
    registry = Registry()
    for name in [*queues, callbacks]:
        registry.handler(name, concurrency=4)(_noop)
    async with QueueClient(cluster.url) as client:
        batch = await client.batch(on_complete=(callbacks, {}), on_success=(callbacks, {}))
        for index, name in enumerate(queues):
            await batch.add_bulk(name, [{"fail": index == 2 and n == 0} for n in range(20)])
        await batch.close()
        ports = {cluster.owner_port(QueueKeys(name).prefix) for name in queues}
        assert len(ports | {cluster.owner_port(BatchKeys(batch.id).prefix)}) >= 2
        async with WorkerPool(registry, url=cluster.url, queues=[*queues, callbacks],
                              grace=5.0):
            callback = client.queue(callbacks).job(complete_id(batch))
            await async_wait_until(lambda: _is_done(callback), 30, "the callback ran")
        assert await batch.info() == info(batch.id, 60, 0, 59, 1, True)
        counts = await client.counts(callbacks)
        assert sum(counts.values()) == counts[JobState.COMPLETED] == 1


async def _is_done(handle: Any) -> bool:
    try:
        return (await handle.info()).state == JobState.COMPLETED
    except JobNotFound:
        return False


def test_explain_names_the_batch_of_a_job(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        batch = client.batch(on_complete=(DONE, {}))
        job = batch.add(WORK, {})
        outside = client.queue(WORK).add({})
        assert f"a job of batch {batch.id}" in client.explain(WORK, job.id).detail
        assert "a job of batch" not in client.explain(WORK, outside.id).detail
