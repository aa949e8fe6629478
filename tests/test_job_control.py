"""Schedules, cancellation in every executor, retention, and the event stream."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    Backoff,
    ConfigError,
    Dedup,
    Job,
    JobFailed,
    JobState,
    PayloadError,
    QueueClient,
    Registry,
    Retention,
    SyncQueueClient,
)
from panqueue._keys import QueueKeys
from panqueue.testing import run_worker
from tests.helpers import (
    APPS,
    async_wait_until,
    panqueue_command,
    run_a_task_whose_cleanup_raises,
    run_cli,
    subprocess_env,
    wait_until,
)

sys.path.insert(0, str(APPS))
import itertools

import exec_app

pytestmark = pytest.mark.anyio



# ----------------------------------------------------------------------------- schedules


def test_every_second_schedule_with_two_workers_enqueues_one_job_per_tick(
        redis_url: str, redis_client: redis.Redis) -> None:
    env = subprocess_env(PANQUEUE_URL=redis_url)
    procs = [subprocess.Popen(panqueue_command("worker", "proc_app:queues", "-q", "ticks",
                                               "--url", redis_url, "--log-level", "warning",
                                               "--backend", backend), env=env)
             for backend in ("asyncio", "trio")]
    try:
        wait_until(lambda: redis_client.hlen("tick-runs") >= 5, timeout=30,
                   what="five ticks to run")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(30) for proc in procs]
    assert codes == [0, 0]
    runs = {k.decode(): int(v) for k, v in redis_client.hgetall("tick-runs").items()}
    assert set(runs.values()) == {1}  # no tick ran twice
    ticks = sorted(int(job_id.rsplit(":", 1)[1]) for job_id in runs)
    assert all(job_id.startswith("schedule:every-second:") for job_id in runs)
    # One job per tick: consecutive ticks, one second apart, none missing, none doubled.
    assert [b - a for a, b in itertools.pairwise(ticks)] == [1000] * (len(ticks) - 1)
    with SyncQueueClient(redis_url) as client:
        counts = client.counts("ticks")
        [info] = client.schedules("ticks")
    assert counts[JobState.COMPLETED] == len(runs)
    assert info.name == "every-second" and info.definition["every"] == 1.0


async def test_overdue_schedule_runs_once_on_catch_up(redis_url: str, queue_name: str,
                                                      redis_client: redis.Redis) -> None:
    # An hourly schedule whose minute is half an hour from now: no tick falls due on time
    # while the test runs (at minute 0, a run near the top of the hour also met the on-time
    # tick, within its grace, and counted two jobs).
    minute = (datetime.now(UTC).minute + 30) % 60
    registry = Registry()
    registry.schedule("hourly", queue_name, cron=f"{minute} * * * *", data={"n": 1})

    @registry.handler(queue_name)
    async def record(job: Job) -> str:
        return job.id

    keys = QueueKeys(queue_name)
    # Registered by an earlier worker; then no worker ran for three hours (and more).
    overdue = int((datetime.now(UTC) - timedelta(hours=4)).replace(
        minute=minute, second=0, microsecond=0).timestamp() * 1000)
    redis_client.hset(keys.schedule("hourly"), "def", registry.schedules_for(queue_name)[0]
                      .definition())
    redis_client.zadd(keys.schedules, {"hourly": overdue})
    async with QueueClient(redis_url) as client:
        async with run_worker(registry, queue_name, redis_url):
            handle = client.queue(queue_name).job(f"schedule:hourly:{overdue}")

            async def enqueued() -> bool:
                return bool(redis_client.exists(keys.job(handle.id)))

            await async_wait_until(enqueued, what="the overdue tick's job")
            assert await handle.result(timeout=10) == handle.id
            [info] = await client.schedules(queue_name)
        assert info.next_run > datetime.now(UTC)
        assert info.next_run.minute == minute
        counts = await client.counts(queue_name)
    assert counts[JobState.COMPLETED] == 1  # not one per missed hour


async def test_schedule_definitions_are_validated() -> None:
    registry = Registry()
    with pytest.raises(ConfigError, match="invalid cron expression '61 \\* \\* \\* \\*'"):
        registry.schedule("bad", "q", cron="61 * * * *")
    with pytest.raises(ConfigError, match="exactly one of cron= or every="):
        registry.schedule("both", "q", cron="* * * * *", every=5)
    with pytest.raises(ConfigError, match="unknown time zone 'Mars/Olympus'"):
        registry.schedule("tz", "q", every=5, tz="Mars/Olympus")
    with pytest.raises(PayloadError, match="schedule 'data': data: set is not JSON"):
        registry.schedule("data", "q", every=5, data={1, 2})
    schedule = registry.schedule("paris", "q", cron="30 9 * * *", tz="Europe/Paris")
    with pytest.raises(ConfigError, match="already defined"):
        registry.schedule("paris", "q", every=1)
    # 09:30 in Paris on a winter day is 08:30 UTC.
    start = int(datetime(2026, 1, 10, 12, 0, tzinfo=UTC).timestamp() * 1000)
    following = datetime.fromtimestamp(schedule.next_after(start) / 1000, UTC)
    assert following == datetime(2026, 1, 11, 8, 30, tzinfo=UTC)


def test_cli_lists_and_removes_schedules(redis_url: str, redis_client: redis.Redis) -> None:
    keys = QueueKeys("reports")
    redis_client.hset(keys.meta, "v", 1)
    redis_client.hset(keys.schedule("nightly"), "def",
                      Registry().schedule("nightly", "reports", cron="0 3 * * *").definition())
    redis_client.zadd(keys.schedules, {"nightly": 4_102_444_800_000})
    listed = run_cli("schedules", "--url", redis_url)
    assert listed.returncode == 0, listed.stderr
    assert "reports\tnightly\t0 3 * * * (UTC)" in listed.stdout
    removed = run_cli("schedules", "reports", "--remove", "nightly", "--url", redis_url)
    assert removed.returncode == 0 and "removed" in removed.stdout
    again = run_cli("schedules", "reports", "--remove", "nightly", "--url", redis_url)
    assert again.returncode == 2 and "no schedule 'nightly'" in again.stderr
    assert redis_client.zcard(keys.schedules) == 0


# ----------------------------------------------------------------------------- cancellation


async def test_a_cancelled_inline_handler_whose_task_raises_in_its_cleanup_ends_cancelled(
        redis_url: str, queue_name: str) -> None:
    """The handler's task group ends with the cancellation and the task's error in one group
    (on trio): the job ends CANCELLED, as cancel() asked, and the worker goes on. That group
    once went up through the worker and stopped it."""
    registry, started = Registry(), anyio.Event()

    @registry.handler(queue_name, attempts=1)
    async def handler(job: Job[str]) -> str:
        if job.data == "long":
            await run_a_task_whose_cleanup_raises(started)
        return job.data

    async with QueueClient(redis_url) as client:
        with anyio.fail_after(30):
            async with run_worker(registry, queue_name, redis_url):
                long = await client.queue(queue_name).add("long")
                await started.wait()
                assert await client.cancel(queue_name, long.id) is JobState.ACTIVE
                with pytest.raises(JobFailed):
                    await long.result(timeout=10)
                after = await client.queue(queue_name).add("after")
                assert await after.result(timeout=10) == "after"
        assert (await long.info()).state is JobState.CANCELLED


@pytest.mark.parametrize("queue", ["t-cancel", "s-cancel"])
async def test_cancelling_an_active_job_in_thread_and_subprocess_executors(
        redis_url: str, redis_client: redis.Redis, queue: str) -> None:
    os.environ["EXEC_APP_URL"] = redis_url
    async with QueueClient(redis_url) as client, run_worker(exec_app.queues, queue, redis_url):
        handle = await client.queue(queue).add({})

        async def started() -> bool:
            return bool(redis_client.llen(f"{queue}:started"))

        await async_wait_until(started, timeout=20, what="the job to start")
        assert await client.cancel(queue, handle.id) is JobState.ACTIVE
        with pytest.raises(JobFailed, match="cancelled"):
            await handle.result(timeout=10)
        info = await handle.info()
    assert info.state is JobState.CANCELLED
    assert info.attempts == 1  # not retried
    if queue == "s-cancel":
        child = int(redis_client.lindex("s-cancel:started", 0) or 0)
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)


async def test_a_slot_goes_on_with_its_next_jobs_after_one_is_cancelled(
        redis_url: str, queue_name: str) -> None:
    """A slot task's attempts share one cancel scope until one of them is stopped: the
    cancelled job's ending is recorded, and the jobs the slot runs next (one claimed with that
    recording, one after it) run to completion, none of them stopped by that cancel."""
    registry, started = Registry(), anyio.Event()

    @registry.handler(queue_name, concurrency=1)
    async def handler(job: Job) -> str:
        if job.data == "long":
            started.set()
            await anyio.sleep(30)
        await anyio.sleep(0)  # an await inside the slot's new scope
        return job.data

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        before = await queue.add("before")
        assert await before.result(timeout=10) == "before"  # the slot's first scope
        long = await queue.add("long")
        with anyio.fail_after(10):
            await started.wait()
        after = [await queue.add(f"after-{i}") for i in range(3)]
        assert await client.cancel(queue_name, long.id) is JobState.ACTIVE
        with pytest.raises(JobFailed, match="cancelled"):
            await long.result(timeout=10)
        assert [await job.result(timeout=10) for job in after] == ["after-0", "after-1",
                                                                 "after-2"]
        assert (await long.info()).state is JobState.CANCELLED


async def test_a_cancelled_handler_whose_own_task_group_was_running_is_cancelled(
        anyio_backend: str, redis_url: str, queue_name: str) -> None:
    """A handler that waits in a task group of the event loop's own (its children cancelled
    with it) ends as cancelled, whatever form the cancellation leaves the group in (a trio
    nursery raises it in an exception group), and the slot goes on with its next job."""
    registry, started = Registry(), anyio.Event()

    @registry.handler(queue_name, concurrency=1)
    async def handler(job: Job) -> str:
        if job.data == "long":
            if anyio_backend == "trio":
                import trio

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trio.sleep_forever)
                    started.set()
                    await trio.sleep_forever()
            async with asyncio.TaskGroup() as group:
                group.create_task(asyncio.sleep(60))
                started.set()
                await asyncio.sleep(60)
        return job.data

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        long = await queue.add("long")
        with anyio.fail_after(10):
            await started.wait()
        after = await queue.add("after")
        assert await client.cancel(queue_name, long.id) is JobState.ACTIVE
        with pytest.raises(JobFailed, match="cancelled"):
            await long.result(timeout=10)
        assert await after.result(timeout=10) == "after"
        assert (await long.info()).state is JobState.CANCELLED


async def test_stopping_an_attempt_that_ended_leaves_its_slots_next_attempt_running() -> None:
    """The attempts of one slot task share its scope: stopping one that has ended (a cancel
    request, a lost lock or a forced shutdown that comes late) must not cancel the scope, in
    which the slot's next attempt runs."""
    from panqueue._log import get_logger
    from panqueue._options import JobOptions
    from panqueue._runtime.attempt import AttemptRunner, Ending
    from panqueue._runtime.locks import Attempt, Attempts, Tokens
    from panqueue._store.transitions import ClaimedJob
    from panqueue.executors.inline import InlineExecutor

    registry = Registry()

    @registry.handler("late-stop")
    async def handler(job: Job) -> None:
        await anyio.sleep(0)

    tokens = Tokens("w")
    attempts = Attempts(get_logger("worker"), 30.0, tokens)
    started: list[Attempt] = []
    start = attempts.start

    def recorded_start(*args: Any) -> Attempt:
        started.append(start(*args))
        return started[-1]

    attempts.start = recorded_start  # type: ignore[method-assign]

    async def nothing(*args: Any) -> None:
        pass

    runner = AttemptRunner(InlineExecutor(registry.get("late-stop")), "late-stop",
                           JobOptions(), attempts, nothing, nothing)
    with anyio.CancelScope() as scope:
        first = await runner.run(ClaimedJob("1", b"\xc0", 1, 0, {}, tokens.new()), False, scope)
        attempts.cancel(started[0])  # late: it has ended
        attempts.lose(started[0], "late")
        second = await runner.run(ClaimedJob("2", b"\xc0", 1, 0, {}, tokens.new()), False,
                                  scope)
    assert (first.ending, second.ending) == (Ending.COMPLETED, Ending.COMPLETED)
    assert not scope.cancel_called


# ----------------------------------------------------------------------------- retention


async def test_retention_bounds_a_stream_of_10000_jobs(redis_url: str, queue_name: str,
                                                       redis_client: redis.Redis) -> None:
    registry = Registry()

    @registry.handler(queue_name, concurrency=50,
                      retention=Retention(completed=100, events=2000))
    async def noop(job: Job) -> int:
        return 1

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        async with run_worker(registry, queue_name, redis_url):
            await client.read_events(queue_name)  # every job's events are written
            for start in range(0, 10_000, 1000):
                handles = await queue.add_bulk(list(range(start, start + 1000)))
            await handles[-1].result(timeout=60)

            async def drained() -> bool:
                counts = await client.counts(queue_name)
                return counts[JobState.WAITING] + counts[JobState.ACTIVE] == 0

            await async_wait_until(drained, timeout=60, what="all 10,000 jobs")
        counts = await client.counts(queue_name)
    assert counts[JobState.COMPLETED] == 100
    jobs = sum(1 for _ in redis_client.scan_iter(match=f"{{q:{queue_name}}}:job:*", count=1000))
    assert jobs == 100
    # Capped (MAXLEN ~ on the first and every 16th entry a script appends, lib/calls.lua: whole
    # nodes of 100 entries go, and up to 15 more come before the next trim).
    assert 2000 <= redis_client.xlen(QueueKeys(queue_name).events) < 2000 + 100 + 16


async def test_finished_jobs_older_than_their_age_limit_are_deleted(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, retention=Retention(completed_for=0.3), lock_ttl=0.6)
    async def noop(job: Job) -> None:
        return None

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add({})
        await handle.result(timeout=10)

        async def gone() -> bool:
            return (await client.counts(queue_name))[JobState.COMPLETED] == 0

        await async_wait_until(gone, timeout=10, what="the completed job to be cleaned")


# ----------------------------------------------------------------------------- events


async def test_events_iterator_resumes_after_a_disconnect_without_loss(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = Registry()

    @registry.handler(queue_name, concurrency=5)
    async def work(job: Job) -> int:
        await job.progress(50)
        return int(job.data)

    seen: list[Any] = []
    async with QueueClient(redis_url) as client, QueueClient(redis_url) as reader:
        await reader.read_events(queue_name)  # asks for every event before the first add
        first = await client.queue(queue_name).add(-1)
        start = await reader.events(queue_name, after="0-0").__anext__()
        assert (start.type, start.job_id) == ("added", first.id)
        async with run_worker(registry, queue_name, redis_url):
            async with anyio.create_task_group() as tg:

                async def collect() -> None:
                    results = set()
                    async for event in reader.events(queue_name, after=start.id):
                        seen.append(event)
                        if event.type == "completed":
                            results.add(event.fields["result"])
                            if len(results) == 41:  # job -1 and jobs 0..39
                                return

                tg.start_soon(collect)
                for n in range(40):
                    await client.queue(queue_name).add(n)
                    if n in (10, 25):  # cut every connection, readers' included
                        own = redis_client.client_id()
                        for entry in redis_client.client_list():
                            if int(entry["id"]) != own:
                                redis_client.client_kill_filter(_id=int(entry["id"]))
    stream = redis_client.xrange(QueueKeys(queue_name).events, min=f"({start.id}")
    expected = [entry_id.decode() for entry_id, _ in stream]
    got = [event.id for event in seen]
    assert got == expected[: len(got)]  # every event, in order, none skipped or repeated
    completed = [e.fields["result"] for e in seen if e.type == "completed"]
    assert sorted(completed) == [-1, *range(40)]
    types = {e.type for e in seen}
    assert {"added", "active", "progress", "completed"} <= types


@pytest.mark.parametrize(("partitions", "mode"), [(1, "global"), (3, "global"), (1, "keyed")])
async def test_a_queue_that_keeps_no_events_writes_only_the_endings(
        redis_url: str, queue_name: str, partitions: int, mode: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, concurrency=5, attempts=2, backoff=Backoff.fixed(0.01),
                      partitions=partitions, mode=mode, retention=Retention(events=0))
    async def work(job: Job) -> int:
        await job.progress(50)
        if job.data == "fail":
            raise ValueError("no")
        return int(job.data)

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        key: dict[str, Any] = {"key": "k"} if mode == "keyed" else {}
        async with run_worker(registry, queue_name, redis_url):
            # Read once the worker laid the queue out: the read asks every partition.
            _, start = await client.read_events(queue_name)
            handles = [await queue.add(n, **key) for n in range(6)]
            failing = await queue.add("fail", **key)
            later = await queue.add(9, delay=3600, **key)
            assert [await handle.result(timeout=10) for handle in handles] == list(range(6))
            with pytest.raises(JobFailed):
                await failing.result(timeout=10)
            assert await client.cancel(queue_name, later.id) is JobState.DELAYED
            await client.pause(queue_name)
            with pytest.raises(JobFailed):
                await later.result(timeout=10)
        events, _ = await client.read_events(queue_name, start)
    # No added, active, progress, retried, paused: one event per job, its end.
    assert sorted((e.type, e.job_id) for e in events) == sorted(
        [*(("completed", h.id) for h in handles), ("failed", failing.id),
         ("cancelled", later.id)])


@pytest.mark.parametrize("how", ["cancelled", "added after it was cancelled", "removed",
                                 "replaced"])
async def test_jobs_ended_by_a_client_follow_the_handlers_retention(
        redis_url: str, queue_name: str, how: str) -> None:
    """Jobs cancelled by a client, and jobs failed because a job they depend on will not
    complete (by an add, a remove() or a dedup replace), are trimmed to Retention(failed=)
    like any other ending."""
    registry = Registry()

    @registry.handler(queue_name, retention=Retention(failed=2))
    async def noop(job: Job) -> None: ...

    async with QueueClient(redis_url) as client:
        async with run_worker(registry, queue_name, redis_url):
            await client.pause(queue_name)  # the worker declared the queue's retention
        queue = client.queue(queue_name)
        if how == "cancelled":
            for handle in await queue.add_bulk(list(range(5))):
                assert await client.cancel(queue_name, handle.id) is JobState.WAITING
            assert (await client.counts(queue_name))[JobState.CANCELLED] == 2
            return
        root = await queue.add("root", delay=3600, dedup=Dedup("root"))
        if how == "added after it was cancelled":
            await client.cancel(queue_name, root.id)
        for n in range(5):
            await queue.add(n, depends_on=[root.id])
        if how == "removed":
            assert await client.remove(queue_name, root.id)
        elif how == "replaced":
            await queue.add("root 2", delay=3600, dedup=Dedup("root", strategy="replace"))
        counts = await client.counts(queue_name)
        assert counts[JobState.FAILED] == 2, counts
        assert len(await client.list_jobs(queue_name, JobState.FAILED)) == 2


# ------------------------------------------------------------- a cancel that overtakes its claim


@pytest.mark.anyio
async def test_a_cancel_heard_before_its_claim_answered_stops_the_attempt_it_starts(
        anyio_backend: str) -> None:
    """The cancel message and the reply of the claim that made the job active come on
    different connections, so the message may arrive first, when this worker has no attempt
    of the job yet. The attempt that claim starts then begins cancelled and its handler never
    runs. The request names the run by its lock: another claim of the same id (a retry the
    user asked for since, the job added again) is another run and is not touched, and a
    request for another worker's run is not kept at all."""
    from panqueue._log import get_logger
    from panqueue._options import JobOptions
    from panqueue._runtime.attempt import AttemptRunner, Ending, Outcome
    from panqueue._runtime.locks import Attempts, Tokens
    from panqueue._store.notify import CancelRequest
    from panqueue._store.transitions import ClaimedJob
    from panqueue.executors.inline import InlineExecutor

    registry, ran = Registry(), []

    @registry.handler("early-cancel")
    async def handler(job: Job) -> None:
        ran.append(job.id)

    tokens = Tokens("w")
    attempts = Attempts(get_logger("worker"), 30.0, tokens)

    async def nothing(*args: Any) -> None:
        pass

    runner = AttemptRunner(InlineExecutor(registry.get("early-cancel")), "early-cancel",
                           JobOptions(), attempts, nothing, nothing)

    def claimed(job_id: str, token: str) -> ClaimedJob:
        return ClaimedJob(job_id, b"\xc0", 1, 0, {}, token)

    async def run(job: ClaimedJob) -> Outcome:
        with anyio.CancelScope() as scope:  # a slot task's, which stops its attempt
            return await runner.run(job, False, scope)

    in_flight = tokens.new()  # the claim is sent...
    attempts.request_cancel(CancelRequest("7", in_flight))  # ...the cancel overtakes its reply...
    outcome = await run(claimed("7", in_flight))  # ...which arrives
    assert outcome.ending is Ending.FAILED
    assert outcome.failure is not None and outcome.failure.final
    assert outcome.failure.reason == "cancelled"
    assert ran == []

    earlier = tokens.new()
    attempts.request_cancel(CancelRequest("8", earlier))  # for the run that claim locked
    later = tokens.new()
    outcome = await run(claimed("8", later))
    assert outcome.ending is Ending.COMPLETED
    assert ran == ["8"]

    elsewhere = Tokens("w").new()  # another worker's lock: its run is not this worker's
    attempts.request_cancel(CancelRequest("9", elsewhere))
    outcome = await run(claimed("9", elsewhere))
    assert outcome.ending is Ending.COMPLETED
    assert ran == ["8", "9"]
