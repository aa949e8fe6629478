"""Durable waits and signals where they meet the other ways a job is delayed (a retry's
backoff, a snooze), lost replies, and the executors that call steps plainly; on asyncio and
trio, with real workers on a real server."""

from __future__ import annotations

import sys
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis

from panqueue import (
    Backoff,
    ConfigError,
    Job,
    JobFailed,
    JobState,
    QueueClient,
    Registry,
    SignalTimeout,
    Snooze,
)
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue.testing import FaultProxy, run_worker
from tests.helpers import APPS, async_wait_until, call_of, load_scripts

sys.path.insert(0, str(APPS))
import durable_app

pytestmark = pytest.mark.anyio

LONG = 60.0  # a backoff or snooze no test waits out


async def delayed_after(client: QueueClient, queue: str, job_id: str, runs: list[Any],
                        n: int) -> None:
    """Wait until the job's n-th run has ended and left it DELAYED."""
    async def reached() -> bool:
        info = await client.get_job(queue, job_id)
        return len(runs) == n and info.state is JobState.DELAYED and info.history != [] \
            and len(info.history) >= n

    await async_wait_until(reached, what=f"job {job_id} delayed after run {n}")


@pytest.mark.parametrize("then", ["fails", "snoozes"])
@pytest.mark.parametrize("partitions", [1, 2])
async def test_a_signal_after_its_wait_timed_out_does_not_wake_a_job_delayed_otherwise(
        redis_url: str, queue_name: str, then: str, partitions: int) -> None:
    """The first run waits for "go" with a short timeout; the wait times out and the job runs
    again, and that run fails (a retry's backoff) or snoozes before it reaches the wait. A "go"
    sent now is kept for a later wait: it neither wakes the job nor is what it waits for."""
    registry = Registry()
    runs: list[int] = []

    @registry.handler(queue_name, attempts=3, backoff=Backoff.fixed(LONG),
                      partitions=partitions)
    async def handler(job: Job[Any]) -> Any:
        runs.append(job.attempt)
        if len(runs) == 2:
            if then == "fails":
                raise RuntimeError("before the wait")
            raise Snooze(LONG)
        try:
            return await job.wait_for("go", timeout=0.2)
        except SignalTimeout:
            return "timed out"

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add({})
        await delayed_after(client, queue_name, handle.id, runs, 2)
        before = await handle.info()
        why = await client.explain(queue_name, handle.id)
        assert await client.signal(queue_name, handle.id, "go", {"n": 1}) is True
        after = await handle.info()
    assert (before.waiting_for, before.sleeping_until) == (None, None)
    assert why.reason == ("delayed" if then == "fails" else "snoozed"), why
    assert (why.retry_of is not None) == (then == "fails"), why
    # The signal went in with one script call: had it woken the job, the job would be
    # waiting (or running) when the call returned.
    assert after.state is JobState.DELAYED and after.run_at == before.run_at
    assert len(runs) == 2


async def test_a_job_that_waits_again_is_woken_by_its_signal_after_an_earlier_wait_timed_out(
        redis_url: str, queue_name: str) -> None:
    """The mark of the signal waited for holds for the wait that set it: a later wait in the
    same run (after a timeout) sets its own, and its signal wakes the job."""
    registry = Registry()

    @registry.handler(queue_name)
    async def handler(job: Job[Any]) -> Any:
        try:
            await job.wait_for("first", timeout=0.2)
        except SignalTimeout:
            pass
        return await job.wait_for("second")

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add({})

        async def waits_for_second() -> bool:
            return (await handle.info()).waiting_for == "second"

        await async_wait_until(waits_for_second, what="the second wait")
        assert await client.signal(queue_name, handle.id, "first", 1) is True
        assert (await handle.info()).state is JobState.DELAYED
        assert await client.signal(queue_name, handle.id, "second", {"ok": True}) is True
        assert await handle.result(timeout=10) == {"ok": True}


async def test_a_retry_after_a_sleep_is_not_shown_as_a_sleep(redis_url: str,
                                                             queue_name: str) -> None:
    """While the job sleeps, sleeping_until is its wake time (its run_at); once the run after
    the sleep failed and the job waits out its retry's backoff, it sleeps no more."""
    registry = Registry()
    runs: list[int] = []

    @registry.handler(queue_name, attempts=3, backoff=Backoff.fixed(LONG))
    async def handler(job: Job[Any]) -> None:
        runs.append(job.attempt)
        await job.sleep(0.3)
        raise RuntimeError("after the sleep")

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add({})
        await delayed_after(client, queue_name, handle.id, runs, 1)
        sleeping = await handle.info()
        await delayed_after(client, queue_name, handle.id, runs, 2)
        backoff = await handle.info()
    assert sleeping.sleeping_until is not None and sleeping.sleeping_until == sleeping.run_at
    assert backoff.error is not None and backoff.run_at is not None
    assert (backoff.sleeping_until, backoff.waiting_for) == (None, None)


async def test_a_lost_reply_to_taking_a_signal_still_gives_the_wait_its_signal(
        proxy: FaultProxy, redis_url: str, queue_name: str) -> None:
    """A signal kept before the job ran; the reply to the call that takes it is lost, and the
    worker sends the call again: the resent call answers with the signal it took."""
    registry = Registry()

    @registry.handler(queue_name)
    async def handler(job: Job[Any]) -> Any:
        return await job.wait_for("go")

    with redis.Redis.from_url(redis_url) as r:
        load_scripts(r, SCRIPTS.signal_take)  # its call is one request the proxy can match
    async with QueueClient(redis_url) as client:
        handle = await client.queue(queue_name).add({})
        assert await client.signal(queue_name, handle.id, "go", {"n": 1}) is True
        proxy.drop_next_reply(match=call_of(SCRIPTS.signal_take))
        async with run_worker(registry, queue_name, proxy.url):
            await anyio.to_thread.run_sync(proxy.wait_for_dropped_replies, 1)
            assert await handle.result(timeout=10) == {"n": 1}


async def test_a_lost_reply_to_a_signal_keeps_it_once(proxy: FaultProxy, redis_url: str,
                                                      queue_name: str) -> None:
    """The client's signal call is sent again after its reply was lost: one signal is kept,
    so a second wait for it has nothing to take and waits."""
    registry = Registry()

    @registry.handler(queue_name)
    async def handler(job: Job[Any]) -> Any:
        return [await job.wait_for("go"), await job.wait_for("go")]

    with redis.Redis.from_url(redis_url) as r:
        load_scripts(r, SCRIPTS.signal)
    async with QueueClient(redis_url) as direct:
        handle = await direct.queue(queue_name).add({})
        async with QueueClient(proxy.url) as through_proxy:
            proxy.drop_next_reply(match=call_of(SCRIPTS.signal))
            assert await through_proxy.signal(queue_name, handle.id, "go", {"n": 1}) is True
        assert proxy.replies_dropped == 1
        with redis.Redis.from_url(redis_url) as r:
            kept = r.hget(QueueKeys(queue_name).durable(handle.id), "q:go")
        assert kept is not None
        async with run_worker(registry, queue_name, redis_url):
            async def waits_again() -> bool:
                info = await handle.info()
                return info.waiting_for == "go"
            await async_wait_until(waits_again, what="the second wait")
            assert await direct.signal(queue_name, handle.id, "go", {"n": 2}) is True
            assert await handle.result(timeout=10) == [{"n": 1}, {"n": 2}]


@pytest.mark.parametrize("queue", ["dur-async-step-thread", "dur-async-step-subprocess"])
async def test_an_async_step_function_in_a_handler_that_calls_steps_plainly_is_a_config_error(
        redis_url: str, queue: str) -> None:
    async with QueueClient(redis_url) as client, \
            run_worker(durable_app.queues, queue, redis_url):
        handle = await client.queue(queue).add({})
        with pytest.raises(JobFailed) as failed:
            await handle.result(timeout=20)
        info = await handle.info()
    error = failed.value.error
    assert error is not None and error.type == ConfigError.__name__
    assert "job.step('double', fn): fn is async" in error.message
    assert info.steps == {}
