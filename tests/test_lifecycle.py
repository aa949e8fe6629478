"""The core job lifecycle, end to end through a real server, on asyncio and trio."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    Backoff,
    Chunk,
    ConfigError,
    Fail,
    Job,
    JobFailed,
    JobNotFound,
    JobState,
    PanqueueError,
    PayloadError,
    QueueClient,
    Registry,
    Retention,
    Retry,
    SyncQueueClient,
    TimeoutError,
    Worker,
)
from panqueue._codec import encode
from panqueue._durable import sleep_spec
from panqueue._keys import QueueKeys
from panqueue.embedded import RedisServer
from panqueue.testing import run_worker
from tests.helpers import async_wait_until, free_port

pytestmark = pytest.mark.anyio



async def test_job_runs_and_its_result_is_returned(redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name)
    async def double(job: Job) -> dict[str, int]:
        await job.progress(50)
        await job.log("doubling")
        return {"value": job.data["n"] * 2}

    async with QueueClient(redis_url) as client:
        handle = await client.queue(queue_name).add({"n": 21})
        assert (await handle.info()).state is JobState.WAITING
        async with run_worker(registry, queue_name, redis_url):
            assert await handle.result(timeout=10) == {"value": 42}
        info = await handle.info()
        assert info.state is JobState.COMPLETED
        assert info.attempts == 1
        assert info.progress == 50
        assert info.logs == ["doubling"]
        assert info.data == {"n": 21}
        assert info.enqueued_at is not None and info.started_at is not None
        assert info.finished_at is not None
        assert info.enqueued_at <= info.started_at <= info.finished_at
        assert info.finished_at.tzinfo is UTC


async def test_sync_client_adds_and_reads_like_the_async_one(redis_url: str,
                                                             queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, concurrency=4)
    async def echo(job: Job) -> Any:
        return job.data

    def produce() -> list[Any]:
        with SyncQueueClient(redis_url) as client:
            queue = client.queue(queue_name)
            handles = [queue.add({"i": 0}), *queue.add_bulk([{"i": i} for i in range(1, 10)])]
            return [h.result(timeout=10) for h in handles]

    async with run_worker(registry, queue_name, redis_url):
        results = await anyio.to_thread.run_sync(produce)
    assert results == [{"i": i} for i in range(10)]


async def test_higher_priority_runs_first_and_fifo_within_a_priority(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = Registry()
    order_key = f"{queue_name}:order"

    @registry.handler(queue_name, concurrency=1)
    async def record(job: Job) -> None:
        redis_client.rpush(order_key, job.data)

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        handles = []
        for name, priority in [("low-1", -5), ("mid-1", 0), ("high-1", 10), ("mid-2", 0),
                               ("high-2", 10), ("low-2", -5), ("top", 1_000_000)]:
            handles.append(await queue.add(name, priority=priority))
        handles.append(await queue.add("mid-3"))
        async with run_worker(registry, queue_name, redis_url):
            for handle in handles:
                await handle.result(timeout=10)
    order = [v.decode() for v in redis_client.lrange(order_key, 0, -1)]
    assert order == ["top", "high-1", "high-2", "mid-1", "mid-2", "mid-3", "low-1", "low-2"]


async def test_delayed_job_waits_until_due(redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name)
    async def noop(job: Job) -> str:
        return "done"

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url,
                                                         poll_interval=30):
        queue = client.queue(queue_name)
        handle = await queue.add(None, delay=0.5)
        assert (await handle.info()).state is JobState.DELAYED
        assert await handle.result(timeout=10) == "done"
        info = await handle.info()
        assert info.started_at is not None and info.enqueued_at is not None
        # The server clock decides: the job may not start before its delay has passed.
        assert info.started_at - info.enqueued_at >= timedelta(milliseconds=500)
        at = await queue.add("at", run_at=datetime.now(UTC) + timedelta(seconds=0.3))
        assert (await at.info()).state is JobState.DELAYED
        assert await at.result(timeout=10) == "done"


async def test_a_time_inside_a_millisecond_is_due_at_the_next_one(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """The server's clock counts whole ms, and a job is due (or past its deadline) once that
    count reaches the stored one: a ``run_at`` (``expires``, a durable ``sleep(until=)``) of
    .394660 is stored as .395.
    Stored as .394, the job could start 0.66 ms before its time (the Django port's run_after
    test caught one doing so), and one expiring then could be dropped before it."""
    at = datetime.now(UTC).replace(microsecond=394_660) + timedelta(seconds=30)
    due = int(at.replace(microsecond=0).timestamp()) * 1000 + 395
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        later = await queue.add(1, run_at=at)
        expiring = await queue.add(2, expires=at)
    keys = QueueKeys(queue_name)
    assert redis_client.zscore(keys.delayed, later.id) == due
    assert int(redis_client.hget(keys.job(expiring.id), "x")) == due
    assert sleep_spec(None, at) == (due, 0)  # a durable job's sleep until then: the same


async def test_custom_job_id_is_idempotent(redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = await queue.add({"v": 1}, job_id="welcome-1")
        again = await queue.add({"v": 2}, job_id="welcome-1")
        assert first.id == again.id == "welcome-1"
        assert first.created and not again.created
        assert (await again.info()).data == {"v": 1}
        counts = await client.counts(queue_name)
        assert counts[JobState.WAITING] == 1
        with pytest.raises(ConfigError, match="all digits"):
            await queue.add(None, job_id="123")


async def test_invalid_payload_writes_nothing(redis_url: str, queue_name: str,
                                              redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        with pytest.raises(PayloadError, match=r'data\["items"\]\[3\]: set is not JSON'):
            await queue.add({"items": [1, 2, 3, {4}]})
        with pytest.raises(PayloadError, match=r"item 2: data: bytes is not JSON-compatible"):
            await queue.add_bulk([{"ok": 1}, {"ok": 2}, b"raw", {"ok": 4}])
        with pytest.raises(PayloadError, match="not a finite number"):
            await queue.add({"x": float("nan")})
        with pytest.raises(PayloadError, match="only str keys"):
            await queue.add({1: "int key"})
        with pytest.raises(ConfigError, match="priority"):
            await queue.add({}, priority=10**9)
    assert redis_client.dbsize() == 0


async def test_failed_attempts_retry_with_backoff_then_fail_with_history(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, attempts=3, backoff=Backoff.fixed(0.05))
    async def always_fails(job: Job) -> None:
        raise ValueError(f"boom {job.attempt}")

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add({})
        with pytest.raises(JobFailed) as failed:
            await handle.result(timeout=10)
    assert failed.value.error is not None
    assert failed.value.error.type == "ValueError"
    assert failed.value.error.message == "boom 3"
    info = await QueueClient(redis_url).get_job(queue_name, handle.id)
    assert info.state is JobState.FAILED
    assert info.failure_reason == "max_attempts_exceeded"
    assert info.attempts == 3
    assert [(h["attempt"], h["message"]) for h in info.history] == [
        (1, "boom 1"), (2, "boom 2"), (3, "boom 3")]
    assert info.error is not None and "ValueError: boom 3" in (info.error.traceback or "")


async def test_retry_and_fail_exceptions(redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, attempts=5)
    async def control(job: Job) -> int:
        if job.data == "fail":
            raise Fail("not worth retrying")
        if job.attempt < 3:
            raise Retry(delay=0.01)
        return job.attempt

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        retried = await queue.add("retry")
        failed = await queue.add("fail")
        assert await retried.result(timeout=10) == 3
        with pytest.raises(JobFailed, match="not worth retrying"):
            await failed.result(timeout=10)
        info = await failed.info()
        assert info.failure_reason == "explicit_fail"
        assert info.attempts == 1


async def test_retry_and_fail_raised_from_an_error_record_that_error(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, attempts=5)
    async def control(job: Job) -> None:
        try:
            {}["missing"]
        except KeyError as exc:
            if job.attempt == 1:
                raise Retry(delay=0.01) from exc
            raise Fail("giving up") from ValueError(f"bad input on attempt {job.attempt}")

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add({})
        with pytest.raises(JobFailed):
            await handle.result(timeout=10)
        info = await handle.info()
    # Each attempt's record is the error the signal was raised from, not the signal itself.
    assert [(h["attempt"], h["type"], h["message"]) for h in info.history] == [
        (1, "KeyError", "'missing'"), (2, "ValueError", "bad input on attempt 2")]
    assert (info.failure_reason, info.attempts) == ("explicit_fail", 2)  # Fail still ends it
    assert info.error is not None
    assert (info.error.type, info.error.message) == ("ValueError", "bad input on attempt 2")
    assert "ValueError: bad input on attempt 2" in (info.error.traceback or "")


async def test_per_job_options_override_handler_defaults(redis_url: str,
                                                         queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, attempts=1, timeout=30)
    async def slow_first(job: Job) -> int:
        if job.attempt == 1:
            await anyio.sleep(5)
        return job.attempt

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add(
            {}, attempts=2, timeout=0.2, backoff=Backoff.fixed(0))
        assert await handle.result(timeout=10) == 2
        info = await handle.info()
        assert info.history[0]["type"] == "JobTimeout"


@pytest.mark.parametrize("chunked", [False, True])
async def test_unreadable_stored_options_fail_that_attempt_alone_with_a_clear_error(
        redis_url: str, queue_name: str, redis_client: redis.Redis, chunked: bool) -> None:
    """Stored options the claim cannot read (not msgpack, or not a map) fail the attempts of
    their job, under the handler's own policy, with an error that says so; the other jobs run
    and the worker carries on."""
    registry = Registry()
    ran: list[Any] = []

    if chunked:
        @registry.handler(queue_name, attempts=2, backoff=Backoff.fixed(0), chunk=Chunk(3, 0.1))
        async def echo_all(jobs: list[Job]) -> list[Any]:
            ran.extend(job.data for job in jobs)
            return [job.data for job in jobs]
    else:
        @registry.handler(queue_name, attempts=2, backoff=Backoff.fixed(0))
        async def echo(job: Job) -> Any:
            ran.append(job.data)
            return job.data

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        garbled = await queue.add("garbled", attempts=5)
        not_a_map = await queue.add("not a map", attempts=5)
        fine = await queue.add("fine", attempts=5)
        redis_client.hset(QueueKeys(queue_name).job(garbled.id), "o", b"\xc1")
        redis_client.hset(QueueKeys(queue_name).job(not_a_map.id), "o", encode([1, 2]))
        async with run_worker(registry, queue_name, redis_url):
            assert await fine.result(timeout=10) == "fine"
            for handle, problem in ((garbled, "not msgpack"), (not_a_map, "not a map")):
                with pytest.raises(JobFailed) as failed:
                    await handle.result(timeout=10)
                error = failed.value.error
                assert error is not None and error.type == "PayloadError"
                assert error.message.startswith("the job's stored options cannot be read")
                assert problem in error.message
                # The handler's attempts, not the 5 of the options it could not read (read raw:
                # get_job cannot read such options either).
                assert redis_client.hmget(QueueKeys(queue_name).job(handle.id), "a", "fr") == [
                    b"2", b"max_attempts_exceeded"]
    assert ran == ["fine"]


async def test_timeout_fails_the_attempt_with_reason_timeout(redis_url: str,
                                                             queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, timeout=0.1)
    async def hangs(job: Job) -> None:
        await anyio.sleep(30)

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add({})
        with pytest.raises(JobFailed):
            await handle.result(timeout=10)
        assert (await handle.info()).failure_reason == "timeout"


async def test_result_timeout_and_missing_job(redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        handle = await client.queue(queue_name).add({})
        with anyio.fail_after(5):
            with pytest.raises(TimeoutError):
                await handle.result(timeout=0.2)
        with pytest.raises(JobNotFound):
            await client.get_job(queue_name, "nope")
        with pytest.raises(JobNotFound):
            await client.queue(queue_name).job("nope").result(timeout=1)


async def test_concurrency_bound_is_never_exceeded(redis_url: str, queue_name: str,
                                                   redis_client: redis.Redis) -> None:
    """Measured in Redis: each handler increments a gauge and records the maximum."""
    registry = Registry()
    gauge, peak = f"{queue_name}:running", f"{queue_name}:peak"
    enter = redis_client.register_script(
        "local n = redis.call('INCR', KEYS[1]) "
        "if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end"
        " return n")

    # Every slot is held until both workers have filled theirs (the second may start late on
    # a busy machine, after the first ran a dozen jobs), or until 10 s have passed: the peak
    # must reach 8, and a ninth job at once would show as 9.
    filled_by = time.monotonic() + 10

    @registry.handler(queue_name, concurrency=4)
    async def busy(job: Job) -> None:
        enter(keys=[gauge, peak])
        while int(redis_client.get(peak) or 0) < 8 and time.monotonic() < filled_by:
            await anyio.sleep(0.01)
        await anyio.sleep(0.02)
        redis_client.decr(gauge)

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk([{"i": i} for i in range(60)])
        # Two workers of concurrency 4 each: at most 8 at once across them.
        async with run_worker(registry, queue_name, redis_url), \
                run_worker(registry, queue_name, redis_url):
            for h in handles:
                await h.result(timeout=20)
    assert int(redis_client.get(peak) or 0) == 8
    assert int(redis_client.get(gauge) or 0) == 0


async def test_the_jobs_claimed_by_completions_start_at_once_when_each_handler_awaits(
        redis_url: str, queue_name: str) -> None:
    """Round after round, every slot runs a job at the same time: a handler returns only once
    all six slots hold one. From the second round on, the jobs were claimed by the batched
    completions of the round before: each must start while the others await, not only once a
    job ends (a worker that ran the jobs one call claimed one after another on one task would
    hold the rest back behind a handler that awaits). A job that waits 10 s for its round is
    stuck, and fails the test."""
    registry = Registry()
    slots, rounds = 6, 5
    state: dict[str, Any] = {"arrived": 0, "full": anyio.Event(), "stuck": 0}

    @registry.handler(queue_name, concurrency=slots)
    async def in_round(job: Job) -> None:
        full = state["full"]
        state["arrived"] += 1
        if state["arrived"] == slots:  # the round is full: the next one starts empty
            state["arrived"], state["full"] = 0, anyio.Event()
            full.set()
        with anyio.move_on_after(10):
            await full.wait()
        if not full.is_set():
            state["stuck"] += 1

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk(list(range(slots * rounds)))
        async with run_worker(registry, queue_name, redis_url):
            for handle in handles:
                await handle.result(timeout=30)
    assert state["stuck"] == 0


async def test_pause_stops_claiming_and_resume_wakes_workers(redis_url: str,
                                                             queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name)
    async def noop(job: Job) -> str:
        return "ran"

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url,
                                                         poll_interval=30):
        await client.pause(queue_name)
        handle = await client.queue(queue_name).add({})
        with pytest.raises(TimeoutError):
            await handle.result(timeout=0.5)
        assert (await handle.info()).state is JobState.WAITING
        await client.resume(queue_name)
        # poll_interval is 30 s: only the resume's wake-up can explain a prompt start.
        assert await handle.result(timeout=5) == "ran"


async def test_cancel_waiting_delayed_and_active_jobs(redis_url: str, queue_name: str) -> None:
    registry = Registry()
    started = anyio.Event()

    @registry.handler(queue_name)
    async def long_job(job: Job) -> None:
        if job.data == "long":
            started.set()
            await anyio.sleep(30)

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        delayed = await queue.add("d", delay=60)
        assert await client.cancel(queue_name, delayed.id) is JobState.DELAYED
        assert (await delayed.info()).state is JobState.CANCELLED
        async with run_worker(registry, queue_name, redis_url):
            active = await queue.add("long")
            with anyio.fail_after(10):
                await started.wait()
            assert await client.cancel(queue_name, active.id) is JobState.ACTIVE
            with pytest.raises(JobFailed, match="cancelled"):
                await active.result(timeout=10)
            info = await active.info()
            assert info.state is JobState.CANCELLED
            assert info.failure_reason == "cancelled"
        waiting = await queue.add("w")
        await client.pause(queue_name)
        assert await client.cancel(queue_name, waiting.id) is JobState.WAITING
        counts = await client.counts(queue_name)
        assert counts[JobState.CANCELLED] == 3
        assert counts[JobState.WAITING] == 0
        with pytest.raises(JobNotFound):
            await client.cancel(queue_name, "missing")


async def test_retry_failed_and_remove(redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name)
    async def flaky(job: Job) -> str:
        if job.data["fail"]:
            raise RuntimeError("first time")
        return "ok"

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        handle = await queue.add({"fail": True})
        async with run_worker(registry, queue_name, redis_url):
            with pytest.raises(JobFailed):
                await handle.result(timeout=10)
        assert await client.retry_failed(queue_name) == 1
        info = await handle.info()
        assert info.state is JobState.WAITING and info.attempts == 0
        assert len(info.history) == 1  # the history survives the retry
        assert await client.remove(queue_name, handle.id) is True
        assert await client.remove(queue_name, handle.id) is False
        counts = await client.counts(queue_name)
        assert sum(counts.values()) == 0


@pytest.mark.parametrize("partitions", [1, 2])
async def test_retry_failed_with_an_empty_list_of_ids_moves_no_job(
        redis_url: str, queue_name: str, partitions: int) -> None:
    registry = Registry()

    @registry.handler(queue_name, partitions=partitions)
    async def fails(job: Job) -> None:
        raise RuntimeError("fails")

    async with QueueClient(redis_url) as client:
        handle = await client.queue(fails).add({})
        async with run_worker(registry, queue_name, redis_url):
            with pytest.raises(JobFailed):
                await handle.result(timeout=10)
        # An empty selection is not "every failed job" (ids=None is).
        assert await client.retry_failed(queue_name, []) == 0
        assert (await handle.info()).state is JobState.FAILED
        assert await client.retry_failed(queue_name, None) == 1


async def test_retention_keeps_only_the_newest_finished_jobs(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = Registry()

    @registry.handler(queue_name, concurrency=5, retention=Retention(completed=5))
    async def noop(job: Job) -> None:
        return None

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk(list(range(40)))
        async with run_worker(registry, queue_name, redis_url):
            await handles[-1].result(timeout=10)
            await async_wait_until(
                lambda: _completed_total(client, queue_name), what="all completions")
        assert (await client.counts(queue_name))[JobState.COMPLETED] == 5
    job_keys = list(redis_client.scan_iter(match=f"{{q:{queue_name}}}:job:*"))
    assert len(job_keys) == 5


async def _completed_total(client: QueueClient, queue: str) -> bool:
    counts = await client.counts(queue)
    return counts[JobState.WAITING] == 0 and counts[JobState.ACTIVE] == 0


async def test_graceful_shutdown_lets_running_jobs_finish(redis_url: str,
                                                          queue_name: str) -> None:
    registry = Registry()
    started = anyio.Event()

    @registry.handler(queue_name)
    async def short(job: Job) -> str:
        started.set()
        await anyio.sleep(0.3)
        return "finished"

    async with QueueClient(redis_url) as client:
        handle = await client.queue(queue_name).add({})
        worker = Worker(registry, queue_name, url=redis_url)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            with anyio.fail_after(10):
                await started.wait()
            await worker.shutdown(grace=10)
        assert (await handle.info()).state is JobState.COMPLETED


@pytest.mark.parametrize("stop", ["forced shutdown", "cancelled from outside",
                                  "shorter grace during a stop"])
async def test_a_stopped_worker_gives_its_running_job_back_to_waiting(
        redis_url: str, queue_name: str, stop: str) -> None:
    """A forced shutdown (grace over), the application cancelling the task group its worker
    runs in (no shutdown asked for), or a shutdown with a short grace while a stop with a long
    one is under way (a signal, a "stop" command): the running job goes back to waiting at
    once, not after its lock's 60 s or the first stop's grace, and the interrupted attempt does
    not count."""
    registry = Registry()
    started = anyio.Event()

    @registry.handler(queue_name, lock_ttl=60)
    async def stuck(job: Job) -> None:
        started.set()
        await anyio.sleep(60)

    async with QueueClient(redis_url) as client:
        handle = await client.queue(queue_name).add({})
        worker = Worker(registry, queue_name, url=redis_url)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            with anyio.fail_after(10):
                await started.wait()
            if stop == "shorter grace during a stop":
                tg.start_soon(worker.shutdown, 60.0)

                async def stopping() -> bool:
                    return worker._stopping

                await async_wait_until(stopping, what="the first stop to begin")
            with anyio.fail_after(5):
                if stop == "cancelled from outside":
                    tg.cancel_scope.cancel()
                else:
                    await worker.shutdown(grace=0.2)
        info = await handle.info()
        assert info.state is JobState.WAITING
        assert info.attempts == 0
        assert (await client.counts(queue_name))[JobState.ACTIVE] == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_worker_made_outside_any_event_loop_runs_and_is_forced_to_stop(
        redis_url: str, queue_name: str, backend: str) -> None:
    """A Worker is made before the event loop that runs it (its state exists from the
    constructor on): it runs a job, and a forced stop skips the grace period and releases it."""
    registry = Registry()
    started = anyio.Event()

    @registry.handler(queue_name, lock_ttl=60)
    async def stuck(job: Job) -> None:
        started.set()
        await anyio.sleep(60)

    worker = Worker(registry, queue_name, url=redis_url)

    async def main() -> None:
        async with QueueClient(redis_url) as client:
            handle = await client.queue(queue_name).add({})
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run)
                with anyio.fail_after(10):
                    await started.wait()
                with anyio.fail_after(5):  # well within the default 30 s grace
                    worker.force()
                    await worker.shutdown()
            info = await handle.info()
            assert info.state is JobState.WAITING and info.attempts == 0

    anyio.run(main, backend=backend)


async def test_idle_worker_recovers_when_its_connections_are_killed(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = Registry()

    @registry.handler(queue_name)
    async def noop(job: Job) -> str:
        return "picked up"

    async with QueueClient(redis_url) as client:
        # Polling every 30 s cannot explain a pickup within 5 s: the wake-up path must work.
        async with run_worker(registry, queue_name, redis_url, poll_interval=30,
                           health_interval=0.5):
            first = await client.queue(queue_name).add({})
            assert await first.result(timeout=5) == "picked up"
            own_id = redis_client.client_id()
            killed = 0
            for entry in redis_client.client_list():
                if int(entry["id"]) != own_id:
                    redis_client.client_kill_filter(_id=int(entry["id"]))
                    killed += 1
            assert killed >= 2  # at least the subscriber and a command connection
            handle = await client.queue(queue_name).add({})
            assert await handle.result(timeout=5) == "picked up"


async def test_registry_and_option_errors_are_clear() -> None:
    registry = Registry()

    @registry.handler("a")
    async def a(job: Job) -> None: ...

    with pytest.raises(ConfigError, match="already has a handler"):
        registry.handler("a")(a.fn)
    with pytest.raises(ConfigError, match="inline executor runs async functions only"):
        registry.handler("b", executor="inline")(lambda job: None)
    with pytest.raises(ConfigError, match="concurrency"):
        registry.handler("c", concurrency=0)
    with pytest.raises(ConfigError, match="queue name"):
        registry.handler("bad{name}")
    with pytest.raises(ConfigError, match="unknown queue 'zzz'"):
        Worker(registry, "zzz")
    with pytest.raises(ConfigError, match="scheme"):
        QueueClient("http://localhost")
    with pytest.raises(PanqueueError):
        registry.handler("d", attempts=0)
    assert a.queue == "a" and "a" in registry


async def test_unreachable_redis_raises_connection_error(queue_name: str) -> None:
    from panqueue import ConnectionError as PQConnectionError

    async with QueueClient(f"redis://127.0.0.1:{free_port()}/0") as client:
        with pytest.raises(PQConnectionError, match="cannot reach Redis"):
            await client.queue(queue_name).add({})


async def test_worker_carries_on_after_redis_restarts(tmp_path: Path) -> None:
    """Restart the server (append-only file kept) under an idle worker: it reconnects, its
    wake-up channel comes back, and jobs added after the restart run."""
    registry = Registry()

    @registry.handler("restart")
    async def echo(job: Job) -> Any:
        return job.data

    server = RedisServer(appendonly=True, directory=tmp_path / "data")
    server.start()
    try:
        async with QueueClient(server.url) as client, \
                run_worker(registry, "restart", server.url, poll_interval=30, health_interval=0.5):
            assert await (await client.queue("restart").add("before")).result(timeout=10) \
                == "before"
            waiting = await client.queue("restart").add("kept", delay=1.5)
            server.stop()  # SIGTERM: the server writes its append-only file and exits
            server.start()  # same port, same data directory
            after = await client.queue("restart").add("after")
            assert await after.result(timeout=15) == "after"
            assert await waiting.result(timeout=15) == "kept"  # survived the restart
    finally:
        server.cleanup()

