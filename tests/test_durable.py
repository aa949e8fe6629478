"""Durable jobs with real workers on a real server, on asyncio and trio: steps that run once
(job.step), sleeps and waits for signals that end the attempt and free the slot (job.sleep,
job.wait_for, client.signal), on the inline and thread executors. Crash tests (kill -9 inside
and after a step) are in tests/test_durable_processes.py."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis

from panqueue import ConfigError, JobFailed, JobState, QueueClient, SyncQueueClient
from panqueue._codec import encode
from panqueue._listing import columns, timestamp
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.jobs import parse_job
from panqueue._store.status import Status
from panqueue._store.transitions import parse_claim, step_done, take_signal
from panqueue.testing import run_worker
from tests.helpers import APPS, async_wait_until, run_cli
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


@pytest.mark.parametrize("queue", ["dur-steps", "dur-steps-thread", "dur-steps-subprocess"])
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


@pytest.mark.parametrize(("how", "problem", "ran"), [
    ("twice", "step 'x' ran twice", 1),
    ("sleep-huge", "must be a number of seconds or a timedelta", 0),  # past a float's range
])
async def test_a_durable_call_misused_is_a_config_error_naming_it(
        redis_url: str, how: str, problem: str, ran: int) -> None:
    async with run_worker(durable_app.queues, "dur-misuse", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-misuse").add({"url": redis_url, "how": how})
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=20)
    error = failed.value.error
    assert error is not None and error.type == "ConfigError", error
    assert problem in error.message
    assert runs(redis_url, job.id, "x") == ran


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


async def test_a_step_result_over_the_size_cap_fails_the_attempt(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-misuse", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-misuse").add({"url": redis_url, "how": "big"})
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=20)
        info = await job.info()
    error = failed.value.error
    assert error is not None and error.type == "PayloadError"
    assert ("step 'big' result is 2,097,157 bytes encoded, over the limit of 1,048,576 bytes"
            in error.message and info.steps == {})


async def test_a_handler_that_uses_no_durable_call_reads_no_durable_record(
        redis_url: str) -> None:
    """The no-op path: a plain job makes no durable read or write (nothing is stored)."""
    async with run_worker(durable_app.queues, "dur-mixed", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-mixed").add({})
        assert await job.result(timeout=20) == "done"
    assert not redis.Redis.from_url(redis_url).exists("{q:dur-mixed}:job:" + job.id + ":durable")


async def test_an_attempt_makes_its_durable_state_only_for_a_durable_call(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's durable state (its steps seen, its record once read) is made by the handler's
    first durable call: the plain jobs of a handler that can make one cost their attempts
    nothing for it, and a job that sleeps still resumes."""
    from panqueue._runtime import attempt

    made: list[str] = []

    class Counted(attempt.DurableRun):
        def __init__(self, store: Any, run: Any, *args: Any, **kwargs: Any) -> None:
            made.append(run.job_id)
            super().__init__(store, run, *args, **kwargs)

    monkeypatch.setattr(attempt, "DurableRun", Counted)
    async with run_worker(durable_app.queues, "dur-mixed", redis_url), \
            QueueClient(redis_url) as client:
        plain = [await client.queue("dur-mixed").add({}) for _ in range(3)]
        for job in plain:
            assert await job.result(timeout=20) == "done"
        sleeper = await client.queue("dur-mixed").add({"sleep": 0.05})
        assert await sleeper.result(timeout=20) == "slept"
    # The sleeper's first run made it, and so did the run after its sleep.
    assert made == [sleeper.id, sleeper.id]


@pytest.mark.parametrize("queue", ["dur-count", "dur-count-thread", "dur-count-subprocess"])
async def test_the_first_step_of_a_job_that_never_ran_is_one_script_call_and_no_read(
        redis_url: str, queue: str) -> None:
    """A job's first run has no durable record to read (the claim says so): its first step is
    the one call that stores it. A retry reads the record once and replays the step."""
    async with run_worker(durable_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        warm = await client.queue(queue).add({"url": redis_url})  # the scripts are loaded
        await warm.result(timeout=20)
        first = await client.queue(queue).add({"url": redis_url})
        calls = await first.result(timeout=20)
        retried = await client.queue(queue).add({"url": redis_url, "fail": True})
        replayed = await retried.result(timeout=20)
        info = await first.info()
    assert calls == {"scripts": 1, "hgetall": 0}
    assert info.steps == {"a": 1}
    assert replayed == {"scripts": 0, "hgetall": 1}
    assert runs(redis_url, retried.id, "a") == 1


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


def test_the_claim_tells_a_job_s_first_run_from_a_later_one(store: ScriptStore) -> None:
    """Only a run writes a durable record, and every run starts with a claim: a job claimed
    for the first time has no record to read; once it ran (here: it failed and is retried),
    every claim says it may have one, and so does a resent claim (answered from its memo)."""
    job_id = store.add_one()

    def claimed(token: str) -> list[tuple[str, int, bool]]:
        jobs, _ = parse_claim(store.call(SCRIPTS.claim, token, 30_000, 1), 0, token)
        return [(job.id, job.attempt, job.first_run) for job in jobs]

    assert claimed("w:1") == [(job_id, 1, True)]
    assert claimed("w:1") == [(job_id, 1, False)]  # the resend: its record may be read
    assert store.fail(job_id, "w:1", max_attempts=2) is Status.RETRY_NOW
    assert claimed("w:2") == [(job_id, 2, False)]


def test_a_take_from_a_run_that_lost_its_lock_takes_nothing(
        store: ScriptStore, redis_url: str) -> None:
    job_id = store.add_one()
    assert store.claim("w:1") == [job_id]
    with SyncQueueClient(redis_url) as client:
        assert client.signal(store.keys.name, job_id, "go", {"n": 1}) is True
    assert store.t.run(take_signal(store.keys, job_id, "stale", 0, "go")) == (-1, b"")
    assert store.t.run(take_signal(store.keys, job_id, "w:1", 0, "go")) == (1, encode({"n": 1}))
    assert store.t.run(take_signal(store.keys, job_id, "w:1", 1, "go")) == (0, b"")


# ----------------------------------------------------------------------------- sleeps


def suspended(info: Any) -> list[dict[str, Any]]:
    return [entry for entry in info.history if entry.get("type") == "Suspended"]


@pytest.mark.parametrize("queue", ["dur-sleep", "dur-sleep-thread", "dur-sleep-subprocess"])
async def test_a_sleep_frees_the_slot_uses_no_attempt_and_resumes_with_steps_replayed(
        redis_url: str, queue: str) -> None:
    async with run_worker(durable_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue(queue).add({"url": redis_url, "sleep": 1.0})
        await state_is(client, queue, job.id, JobState.DELAYED)
        sleeping = await job.info()
        explanation = await client.explain(queue, job.id)
        assert not await client.list_jobs(queue, JobState.ACTIVE)  # no slot held
        result = await job.result(timeout=20)
        info = await job.info()
    assert sleeping.sleeping_until is not None and sleeping.waiting_for is None
    assert sleeping.steps == {"a": 1}
    assert explanation.reason == "delayed" and "sleeping (job.sleep) until" in explanation.detail
    # The handler ran twice (the sleep ended the first run); step "a" ran once.
    assert result == {"a": 1, "b": 1, "runs": 1}
    assert runs(redis_url, job.id, "a") == 1
    assert info.attempts == 1 and len(suspended(info)) == 1 and info.sleeping_until is None


async def test_a_sleep_until_a_time_resumes_then(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-sleep", redis_url), \
            QueueClient(redis_url) as client:
        started = time.monotonic()
        job = await client.queue("dur-sleep").add({"url": redis_url, "until_s": 0.8})
        result = await job.result(timeout=20)
    assert time.monotonic() - started >= 0.7
    assert result["a"] == 1 and result["b"] == 1


async def test_a_zero_sleep_returns_at_once_without_ending_the_run(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-sleep", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-sleep").add({"url": redis_url, "sleep": 0})
        await job.result(timeout=20)
        info = await job.info()
    assert not suspended(info)


async def test_a_thousand_sleeping_jobs_hold_no_slot_of_a_concurrency_2_queue(
        redis_url: str) -> None:
    queue = "dur-mixed"
    async with run_worker(durable_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        sleepers = await client.queue(queue).add_bulk([{"sleep": 3600}] * 1000)

        async def all_asleep() -> bool:
            return (await client.counts(queue))[JobState.DELAYED] == 1000

        await async_wait_until(all_asleep, timeout=60, what="1,000 jobs asleep")
        others = [await client.queue(queue).add({}) for _ in range(5)]
        results = [await other.result(timeout=20) for other in others]
        counts = await client.counts(queue)
        info = await sleepers[0].info()
        assert await client.purge(queue) >= 1000
    assert results == ["done"] * 5
    assert counts[JobState.DELAYED] == 1000 and counts[JobState.ACTIVE] == 0
    assert info.attempts == 0  # a sleep gives its attempt back


async def test_a_sleeping_job_can_be_cancelled(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-sleep", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-sleep").add({"url": redis_url, "sleep": 3600})
        await state_is(client, "dur-sleep", job.id, JobState.DELAYED)
        assert await client.cancel("dur-sleep", job.id) is JobState.DELAYED
        info = await job.info()
    assert info.state is JobState.CANCELLED and info.steps == {"a": 1}


# ----------------------------------------------------------------------------- signals


@pytest.mark.parametrize("queue", ["dur-signal", "dur-signal-thread",
                                   "dur-signal-subprocess"])
async def test_a_wait_for_a_signal_frees_the_slot_until_the_signal_comes(
        redis_url: str, queue: str) -> None:
    async with run_worker(durable_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue(queue).add({"url": redis_url})
        await state_is(client, queue, job.id, JobState.DELAYED)
        waiting = await job.info()
        explanation = await client.explain(queue, job.id)
        assert await client.signal(queue, job.id, "approved", {"by": "ann"}) is True
        result = await job.result(timeout=20)
        info = await job.info()
    assert waiting.waiting_for == "approved" and waiting.sleeping_until is None
    assert explanation.reason == "signal" and "'approved'" in explanation.detail
    assert "no timeout" in explanation.detail
    assert result["first"] == {"by": "ann"} and result["a"] == 1 and result["b"] == 1
    assert runs(redis_url, job.id, "a") == 1
    assert info.attempts == 1 and info.waiting_for is None


async def test_a_sandboxed_child_steps_sleeps_and_waits_with_no_grant(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-sandboxed", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-sandboxed").add({"n": 21})

        async def waits() -> bool:
            return (await job.info()).waiting_for == "approved"

        await async_wait_until(waits, what="the job to wait for its signal")
        assert await client.signal("dur-sandboxed", job.id, "approved", "ok")
        result = await job.result(timeout=30)
        info = await job.info()
    assert result == {"doubled": 42, "got": "ok"}
    assert info.steps == {"double": 42} and len(suspended(info)) == 2


async def test_a_signal_sent_before_the_wait_with_no_worker_up_is_kept_and_returned_at_once(
        redis_url: str) -> None:
    async with QueueClient(redis_url) as client:
        job = await client.queue("dur-signal").add({"url": redis_url})
        assert await client.signal("dur-signal", job.id, "approved", [1, 2]) is True
        async with run_worker(durable_app.queues, "dur-signal", redis_url):
            result = await job.result(timeout=20)
        info = await job.info()
    assert result["first"] == [1, 2]
    assert not suspended(info)  # it never had to wait


async def test_a_signal_sent_while_the_job_runs_another_step_is_returned_at_once(
        redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-signal-mid", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-signal-mid").add({"url": redis_url})

        async def in_step() -> bool:
            return runs(redis_url, job.id, "a") == 1

        await async_wait_until(in_step, what="the job to be inside its step")
        assert await client.signal("dur-signal-mid", job.id, "approved", "meanwhile") is True
        redis.Redis.from_url(redis_url).rpush(f"go:{job.id}", 1)
        result = await job.result(timeout=20)
        info = await job.info()
    assert result == "meanwhile" and not suspended(info)


async def test_two_signals_of_one_name_are_taken_oldest_first_by_two_waits(
        redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-signal", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-signal").add({"url": redis_url, "two": True})
        await state_is(client, "dur-signal", job.id, JobState.DELAYED)
        assert await client.signal("dur-signal", job.id, "approved", "first") is True
        assert await client.signal("dur-signal", job.id, "approved", "second") is True
        result = await job.result(timeout=20)
    assert (result["first"], result["second"]) == ("first", "second")


async def test_a_retry_after_the_wait_replays_the_payload_it_got(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-signal", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-signal").add({"url": redis_url, "fail_once": True})
        await state_is(client, "dur-signal", job.id, JobState.DELAYED)
        await client.signal("dur-signal", job.id, "approved", "yes")
        result = await job.result(timeout=20)
        info = await job.info()
    assert result["first"] == "yes" and info.attempts == 2
    assert runs(redis_url, job.id, "b") == 1  # step "b" ran before the failure, once


async def test_a_wait_that_times_out_raises_signal_timeout_and_the_retry_policy_applies(
        redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-signal", redis_url), \
            QueueClient(redis_url) as client:
        failing = await client.queue("dur-signal").add({"url": redis_url, "timeout": 0.3})
        caught = await client.queue("dur-signal").add(
            {"url": redis_url, "timeout": 0.3, "catch": True})
        with pytest.raises(JobFailed) as failed:
            await failing.result(timeout=20)
        result = await caught.result(timeout=20)
        info = await failing.info()
    error = failed.value.error
    assert error is not None and error.type == "SignalTimeout" and "'approved'" in error.message
    assert info.attempts == 2  # both attempts used: the second replays the timeout
    assert result["first"] == "timed out"
    assert await_late_signal_is_refused(redis_url, failing.id)


def await_late_signal_is_refused(url: str, job_id: str) -> bool:
    """A signal to a final job: False, and nothing kept."""
    with SyncQueueClient(url) as client:
        refused = client.signal("dur-signal", job_id, "approved", "late") is False
    record = redis.Redis.from_url(url).hgetall("{q:dur-signal}:job:" + job_id + ":durable")
    return refused and b"q:approved" not in record


async def test_a_job_waiting_for_a_signal_can_be_cancelled(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-signal", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-signal").add({"url": redis_url})
        await state_is(client, "dur-signal", job.id, JobState.DELAYED)
        assert await client.cancel("dur-signal", job.id) is JobState.DELAYED
        assert await client.signal("dur-signal", job.id, "approved") is False


def test_a_bad_signal_is_refused_before_anything_is_sent(redis_url: str) -> None:
    from panqueue import JobNotFound, PayloadError

    with SyncQueueClient(redis_url) as client:
        with pytest.raises(ConfigError, match="signal's name"):
            client.signal("dur-signal", "1", "")
        with pytest.raises(PayloadError, match="payload"):
            client.signal("dur-signal", "1", "go", {1, 2})
        with pytest.raises(PayloadError,
                           match=r"the signal's payload is .* over the limit of 1,048,576"):
            client.signal("dur-signal", "1", "go", "x" * (2 * 1024 * 1024))
        with pytest.raises(JobNotFound):
            client.signal("dur-signal", "no-such-job", "go")


# ----------------------------------------------------------------------------- the rest holds


async def test_a_signal_goes_to_the_partition_that_holds_the_job(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-parted", redis_url), \
            QueueClient(redis_url) as client:
        jobs = [await client.queue("dur-parted").add({"i": i}) for i in range(6)]
        for job in jobs:
            await state_is(client, "dur-parted", job.id, JobState.DELAYED)
            assert (await job.info()).waiting_for == "go"
        for job in jobs:
            assert await client.signal("dur-parted", job.id, "go", job.id) is True
        results = [await job.result(timeout=20) for job in jobs]
    assert results == [job.id for job in jobs]


async def test_a_sleeping_job_does_not_hold_its_concurrency_key(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-keyed", redis_url), \
            QueueClient(redis_url) as client:
        sleeper = await client.queue("dur-keyed").add({"sleep": 3600}, key="tenant")
        await state_is(client, "dur-keyed", sleeper.id, JobState.DELAYED)
        other = await client.queue("dur-keyed").add({}, key="tenant")
        assert await other.result(timeout=20) == "done"
        await client.cancel("dur-keyed", sleeper.id)


async def test_a_durable_job_leaves_one_history_record_when_it_ends(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-sleep", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-sleep").add({"url": redis_url, "sleep": 0.2})
        await job.result(timeout=20)
    entries = redis.Redis.from_url(redis_url).xrange("{q:dur-sleep}:history")
    mine = [fields for _, fields in entries if fields[b"id"] == job.id.encode()]
    assert len(mine) == 1 and mine[0][b"state"] == b"completed"


async def test_a_batch_counts_a_sleeping_job_as_pending(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-mixed", redis_url), \
            QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=("dur-mixed", {}))
        [job] = await batch.add_bulk("dur-mixed", [{"sleep": 3600}])
        await batch.close()
        await state_is(client, "dur-mixed", job.id, JobState.DELAYED)
        info = await batch.info()
        await client.cancel("dur-mixed", job.id)
    assert info.total == 1 and info.pending == 1


async def test_removing_a_durable_job_removes_its_record(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-sleep", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-sleep").add({"url": redis_url, "sleep": 0.1})
        await job.result(timeout=20)
        record = "{q:dur-sleep}:job:" + job.id + ":durable"
        assert redis.Redis.from_url(redis_url).exists(record)
        assert await client.remove("dur-sleep", job.id) is True
    assert not redis.Redis.from_url(redis_url).exists(record)


async def test_a_deadline_to_start_applies_again_while_a_durable_job_sleeps(
        redis_url: str) -> None:
    """expires= is a deadline to start by: as after a snooze, a job that waits again (asleep,
    or for a signal) and is not running by its deadline ends CANCELLED "expired"."""
    async with run_worker(durable_app.queues, "dur-sleep", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-sleep").add({"url": redis_url, "sleep": 1.0},
                                                  expires=0.5)
        with pytest.raises(JobFailed):
            await job.result(timeout=20)
        info = await job.info()
    assert info.state is JobState.CANCELLED and info.failure_reason == "expired"
    assert info.steps == {"a": 1}


# ----------------------------------------------------------------------------- the CLI


async def test_the_cli_shows_steps_and_the_wait_and_sends_a_signal(redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-signal", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-signal").add({"url": redis_url})
        await state_is(client, "dur-signal", job.id, JobState.DELAYED)
        shown = await anyio.to_thread.run_sync(
            run_cli, "job", "dur-signal", job.id, "--json", "--url", redis_url)
        human = await anyio.to_thread.run_sync(
            run_cli, "job", "dur-signal", job.id, "--url", redis_url)
        bad = await anyio.to_thread.run_sync(
            run_cli, "signal", "dur-signal", job.id, "approved", "{nope", "--url", redis_url)
        sent = await anyio.to_thread.run_sync(
            run_cli, "signal", "dur-signal", job.id, "approved", '{"by": "cli"}', "--url",
            redis_url)
        result = await job.result(timeout=20)
        late = await anyio.to_thread.run_sync(
            run_cli, "signal", "dur-signal", job.id, "approved", "--url", redis_url)
    printed = json.loads(shown.stdout)
    assert printed["waiting_for"] == "approved" and printed["sleeping_until"] is None
    assert [(s["name"], s["result"]) for s in printed["steps"]] == [("a", 1)]
    assert printed["steps"][0]["at"] is not None
    lines = human.stdout.splitlines()
    assert "waits for: signal approved" in lines and not any(
        line.startswith("sleeps:") for line in lines)
    steps = lines[lines.index("steps:") + 1]
    assert steps.endswith("  a  1") and steps.startswith("  20") and "UTC" in steps
    assert bad.returncode == 2 and "invalid JSON" in bad.stderr and bad.stderr.count("\n") == 1
    assert sent.returncode == 0 and sent.stdout == f"{job.id}: signal approved sent\n"
    assert result["first"] == {"by": "cli"}
    assert late.returncode == 1 and "already finished" in late.stderr


# ----------------------------------------------------------------------------- lists, explain


def why_column(info: Any) -> str:
    """The "why" cell of a delayed job in every list (``panqueue jobs``, the dashboard)."""
    [column] = [c for c in columns(info.state) if c.heading == "why"]
    return column.cell(info, info.enqueued_at)


async def test_lists_and_explain_say_what_a_durable_job_waits_for_and_until_when(
        redis_url: str) -> None:
    async with run_worker(durable_app.queues, "dur-sleep", redis_url), \
            run_worker(durable_app.queues, "dur-signal", redis_url), \
            QueueClient(redis_url) as client:
        sleeper = await client.queue("dur-sleep").add({"url": redis_url, "sleep": 3600},
                                                      job_id="sleeper")
        forever = await client.queue("dur-signal").add({"url": redis_url}, job_id="forever")
        bounded = await client.queue("dur-signal").add({"url": redis_url, "timeout": 3600},
                                                       job_id="bounded")
        for queue, job in (("dur-sleep", sleeper), ("dur-signal", forever),
                           ("dur-signal", bounded)):
            await state_is(client, queue, job.id, JobState.DELAYED)
        listed = {info.id: info for queue in ("dur-sleep", "dur-signal")
                  for info in await client.list_jobs(queue, JobState.DELAYED)}
        got = {job.id: await job.info() for job in (sleeper, forever, bounded)}
        said = {job.id: await client.explain(queue, job.id) for queue, job in (
            ("dur-sleep", sleeper), ("dur-signal", forever), ("dur-signal", bounded))}
        cli = await client.explain("dur-signal", forever.id, tool="cli")
        table = await anyio.to_thread.run_sync(
            run_cli, "jobs", "dur-signal", "--state", "delayed", "--url", redis_url)
        await client.signal("dur-signal", forever.id, "approved", 1)
        await state_is(client, "dur-signal", forever.id, JobState.COMPLETED)
        for queue, job in (("dur-sleep", sleeper), ("dur-signal", bounded)):
            await client.cancel(queue, job.id)

    # A wait with no timeout is due at no time: no run_at and no due_at (not a time past a
    # datetime's range); the others are due when their sleep or their timeout ends.
    assert got[forever.id].run_at is None and listed[forever.id].run_at is None
    assert said[forever.id].due_at is None
    for job in (sleeper, bounded):
        assert got[job.id].run_at is not None
        assert said[job.id].due_at == got[job.id].run_at == listed[job.id].run_at
    # A suspension is no failed attempt: no retry is shown.
    assert all(info.retry_of is None for info in [*got.values(), *listed.values()])
    assert said[sleeper.id].reason == "delayed" and said[forever.id].reason == "signal"
    assert said[bounded.id].reason == "signal"
    when = timestamp(got[sleeper.id].run_at)
    assert why_column(listed[sleeper.id]) == f"sleeping until {when}"
    assert why_column(listed[forever.id]) == "waiting for signal 'approved' (no timeout)"
    assert why_column(listed[bounded.id]) == (
        f"waiting for signal 'approved' (timeout at {timestamp(got[bounded.id].run_at)})")
    # Each tool's hint names its own way to send the signal.
    assert f"client.signal('dur-signal', '{forever.id}', 'approved', ...)" in (
        said[forever.id].detail)
    assert f"panqueue signal dur-signal {forever.id} approved [JSON]" in cli.detail
    heading, *lines = table.stdout.rstrip("\n").split("\n")
    rows = {row["id"]: row for row in (dict(zip(heading.split("\t"), line.split("\t"),
                                                 strict=True)) for line in lines)}
    assert rows[forever.id]["why"] == "waiting for signal 'approved' (no timeout)"
    assert rows[forever.id]["due"] == "-"


def test_a_suspension_after_a_failed_attempt_is_not_shown_as_a_retry() -> None:
    """The last entry of the history says why the job waits: a Suspended one after a failed
    attempt's (whose error the job keeps) is no retry."""
    failed = {"attempt": 1, "type": "ValueError", "message": "boom", "max_attempts": 3}
    asleep = {"attempt": 2, "type": "Suspended", "message": "waiting for 'go'", "signal": "go"}
    fields = {b"s": b"delayed", b"a": b"1", b"e": encode({"type": "ValueError",
                                                          "message": "boom"}),
              b"h": encode(failed) + encode(asleep)}
    info = parse_job("q", "j", fields, [], None, {b"ws": b"go"})
    assert info.retry_of is None and info.max_attempts is None and info.run_at is None
    assert info.waiting_for == "go"
    assert why_column(info) == "waiting for signal 'go' (no timeout)"


# ----------------------------------------------------------------------------- the dashboard


async def test_the_dashboard_job_page_shows_steps_and_the_wait_escaped(redis_url: str) -> None:
    from panqueue.dashboard import create_app
    from tests.test_dashboard import browser

    async with run_worker(durable_app.queues, "dur-markup", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-markup").add({})
        await state_is(client, "dur-markup", job.id, JobState.DELAYED)

        def page() -> str:
            with browser(create_app(redis_url)) as web:
                return str(web.get("/job", params={"q": "dur-markup", "id": job.id}).text)

        text = await anyio.to_thread.run_sync(page)
        await client.cancel("dur-markup", job.id)
    assert "<script>window" not in text
    escaped = "&lt;script&gt;window.__pwned = 1&lt;/script&gt;"
    assert 'id="job-steps"' in text and text.count(escaped) >= 2  # the step's name and result
    assert f'id="job-waiting-for">{escaped}</dd>' in text


async def test_the_dashboard_job_page_bounds_large_steps_and_links_them_whole(
        redis_url: str) -> None:
    from panqueue.dashboard import create_app
    from tests.test_dashboard import browser

    async with run_worker(durable_app.queues, "dur-big-steps", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("dur-big-steps").add({"steps": 3, "size": 900_000})
        await state_is(client, "dur-big-steps", job.id, JobState.DELAYED)

        def read() -> tuple[str, Any]:
            with browser(create_app(redis_url)) as web:
                page = web.get("/job", params={"q": "dur-big-steps", "id": job.id})
                raw = web.get("/api/job/raw", params={"q": "dur-big-steps", "id": job.id,
                                                      "part": "steps"})
                return str(page.text), raw.json()

        text, whole = await anyio.to_thread.run_sync(read)
        await client.cancel("dur-big-steps", job.id)
    assert len(text.encode()) < 200_000, len(text.encode())  # not 2.7 MB
    assert 'id="job-steps"' in text and 'id="job-steps-cut"' in text
    assert [(s["name"], s["result"]) for s in whole] == [
        (f"big-{n}", "s" * 900_000) for n in range(3)]


def test_a_woken_job_waits_again_at_its_own_priority(store: ScriptStore, redis_url: str) -> None:
    from panqueue._store.transitions import Suspended, end_attempt

    urgent = store.add_one(priority=9)
    assert store.claim("w:1") == [urgent]
    store.t.run(end_attempt(store.keys, Suspended(urgent, "w:1", 1, 5, 0, "signal", 0, name="go"),
                            max_snoozes=None, claim_next=False, keep=-1, token="w:2",
                            ttl_ms=30_000))
    later = store.add_one()  # priority 0, waiting before the urgent job is woken
    with SyncQueueClient(redis_url) as client:
        assert client.get_job(store.keys.name, urgent).waiting_for == "go"
        assert client.signal(store.keys.name, urgent, "go") is True
    assert store.claim("w:3") == [urgent]
    assert store.claim("w:4") == [later]
