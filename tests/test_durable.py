"""Durable jobs with real workers on a real server, on asyncio and trio: steps that run once
(job.step), sleeps and waits for signals that end the attempt and free the slot (job.sleep,
job.wait_for, client.signal), on the inline and thread executors. Crash tests (kill -9 inside
and after a step) are in tests/test_durable_processes.py."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import redis

from panqueue import ConfigError, JobFailed, JobState, QueueClient, SyncQueueClient
from panqueue._codec import encode
from panqueue._store.transitions import step_done, take_signal
from panqueue.testing import run_worker
from tests.helpers import APPS, async_wait_until
from tests.store_fixtures import ScriptStore

sys.path.insert(0, str(APPS))
import durable_app

pytestmark = pytest.mark.anyio


def runs(url: str, job_id: str, what: str) -> int:
    return int(redis.Redis.from_url(url).get(f"runs:{job_id}:{what}") or 0)


async def state_is(client: QueueClient, queue: str, job_id: str, state: JobState) -> None:
    async def reached() -> bool:
        return (await client.get_job(queue, job_id)).state is state

    await async_wait_until(reached, what=f"job {job_id} to be {state.value}")


# ----------------------------------------------------------------------------- steps


@pytest.mark.parametrize("queue", ["dur-steps", "dur-steps-thread"])
async def test_steps_run_once_across_retries_and_their_results_are_replayed(
        redis_url: str, queue: str) -> None:
    async with run_worker(durable_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue(queue).add({"url": redis_url, "fail_runs": 2})
        result = await job.result(timeout=20)
        info = await job.info()
    # Three attempts ran the handler; each step's side effect happened once, and the later
    # runs got the first run's results back.
    assert result == {"a": 1, "b": 1, "attempt": 3}
    assert runs(redis_url, job.id, "handler") == 3
    assert runs(redis_url, job.id, "a") == 1 and runs(redis_url, job.id, "b") == 1
    assert info.steps == {"a": 1, "b": 1}
    assert list(info.steps_at) == ["a", "b"]


async def test_a_step_that_raises_stores_nothing(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-misuse", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-misuse").add({"url": redis_url, "how": "raises"})
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=20)
        info = await job.info()
    assert failed.value.error is not None and failed.value.error.type == "ValueError"
    assert info.steps == {} and runs(redis_url, job.id, "boom") == 1


async def test_a_step_name_used_twice_in_one_run_is_a_config_error(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-misuse", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-misuse").add({"url": redis_url, "how": "twice"})
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=20)
    error = failed.value.error
    assert error is not None and error.type == "ConfigError"
    assert "step 'x' ran twice" in error.message
    assert runs(redis_url, job.id, "x") == 1


async def test_a_step_result_that_is_not_json_fails_the_attempt_naming_the_path(
        redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-misuse", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-misuse").add({"url": redis_url, "how": "not-json"})
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=20)
        info = await job.info()
    error = failed.value.error
    assert error is not None and error.type == "PayloadError"
    assert 'step \'bad\' result["when"]: datetime' in error.message
    assert info.steps == {}


async def test_a_handler_that_uses_no_durable_call_reads_no_durable_record(
        redis_url: str) -> None:
    """The no-op path: a plain job makes no durable read or write (nothing is stored)."""
    async with run_worker(durable_app.queues, "dur-mixed", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-mixed").add({})
        assert await job.result(timeout=20) == "done"
    assert not redis.Redis.from_url(redis_url).exists("{q:dur-mixed}:job:" + job.id + ":durable")


def test_a_step_outside_a_worker_run_is_a_config_error() -> None:
    from panqueue import Job
    from panqueue._options import JobOptions

    job: Job[Any] = Job(id="j", queue="q", data=None, attempt=1, options=JobOptions(),
                        sink=lambda kind, value: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigError, match="not chunk handlers"):
        job.step("a", print)


# ----------------------------------------------------------------------------- the scripts


def test_a_step_from_a_run_that_lost_its_lock_writes_nothing(store: ScriptStore) -> None:
    job_id = store.add_one()
    assert store.claim("w:1") == [job_id]
    assert store.t.run(step_done(store.keys, job_id, "stale", "a", encode(1))) is False
    assert not store.redis.exists(store.keys.durable(job_id))
    assert store.t.run(step_done(store.keys, job_id, "w:1", "a", encode(1))) is True
    # A stored step is never replaced (a second store of the name keeps the first result).
    assert store.t.run(step_done(store.keys, job_id, "w:1", "a", encode(2))) is True
    assert store.redis.hget(store.keys.durable(job_id), "s:a") == encode(1)


def test_a_take_from_a_run_that_lost_its_lock_takes_nothing(
        store: ScriptStore, redis_url: str) -> None:
    job_id = store.add_one()
    assert store.claim("w:1") == [job_id]
    with SyncQueueClient(redis_url) as client:
        assert client.signal(store.keys.name, job_id, "go", {"n": 1}) is True
    assert store.t.run(take_signal(store.keys, job_id, "stale", 0, "go")) == (-1, b"")
    assert store.t.run(take_signal(store.keys, job_id, "w:1", 0, "go")) == (1, encode({"n": 1}))
    assert store.t.run(take_signal(store.keys, job_id, "w:1", 1, "go")) == (0, b"")
