"""Chunk handlers (``chunk=Chunk(size, wait)``): one call on up to ``size`` jobs, each job
recorded on its own; with real workers on asyncio and trio, and a worker process killed
mid-chunk."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    Backoff,
    Chunk,
    ChunkFailure,
    ConfigError,
    Fail,
    Job,
    JobFailed,
    JobNotFound,
    JobState,
    QueueClient,
    RateLimited,
    Registry,
    Snooze,
    SyncQueueClient,
)
from panqueue._store.ops.batches import callback_id
from panqueue.testing import run_worker
from tests.helpers import (
    async_wait_until,
    panqueue_command,
    run_a_task_whose_cleanup_raises,
    subprocess_env,
    wait_until,
)

pytestmark = pytest.mark.anyio


class Calls:
    """What a test's chunk handler saw: the job ids of each call, and the most calls that ran
    at once."""

    def __init__(self) -> None:
        self.ids: list[list[str]] = []
        self.attempts: list[list[int]] = []
        self.running = 0
        self.most_running = 0
        self.started = anyio.Event()

    def enter(self, jobs: list[Job]) -> None:
        self.ids.append([job.id for job in jobs])
        self.attempts.append([job.attempt for job in jobs])
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        self.started.set()

    def leave(self) -> None:
        self.running -= 1


async def state_of(client: QueueClient, queue: str, job_id: str) -> JobState:
    return (await client.get_job(queue, job_id)).state


# ----------------------------------------------------------------------------- size and wait


async def test_a_chunk_runs_once_size_jobs_are_there_without_waiting_for_wait(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=5, wait=30.0))
    async def rows(jobs: list[Job]) -> list[int]:
        calls.enter(jobs)
        calls.leave()
        return [job.data["n"] * 10 for job in jobs]

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk([{"n": n} for n in range(10)])
        started = time.monotonic()
        async with run_worker(registry, queue_name, redis_url):
            results = [await handle.result(timeout=10) for handle in handles]
        elapsed = time.monotonic() - started
    assert results == [n * 10 for n in range(10)]
    assert [len(ids) for ids in calls.ids] == [5, 5]
    assert [i for ids in calls.ids for i in ids] == [h.id for h in handles]  # in FIFO order
    assert elapsed < 10  # far below the 30 s wait: full chunks do not wait


async def test_a_lone_job_runs_once_wait_has_passed_since_it_was_claimed(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=100, wait=0.6))
    async def rows(jobs: list[Job]) -> list[None]:
        calls.enter(jobs)
        calls.leave()
        return [None] * len(jobs)

    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add({"n": 1})
        added = time.monotonic()
        await calls.started.wait()
        waited = time.monotonic() - added
        await handle.result(timeout=10)
    assert calls.ids == [[handle.id]]
    assert 0.55 <= waited < 2.0


async def test_jobs_arriving_while_a_chunk_gathers_join_it(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=3, wait=30.0))
    async def rows(jobs: list[Job]) -> list[str]:
        calls.enter(jobs)
        calls.leave()
        return [job.id for job in jobs]

    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        first = await queue.add(None)
        # Claimed and waiting for company (its lock taken), before the others are added.
        await async_wait_until(
            lambda: _is(client, queue_name, first.id, JobState.ACTIVE), what="the claim")
        second = await queue.add(None)
        third = await queue.add(None)
        assert await third.result(timeout=10) == third.id
    assert calls.ids == [[first.id, second.id, third.id]]


async def _is(client: QueueClient, queue: str, job_id: str, state: JobState) -> bool:
    return await state_of(client, queue, job_id) is state


async def test_the_locks_of_a_gathering_chunk_are_renewed_past_their_ttl(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=2, wait=1.5), lock_ttl=0.5)
    async def rows(jobs: list[Job]) -> list[int]:
        calls.enter(jobs)
        calls.leave()
        return [job.attempt for job in jobs]

    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, redis_url, stalled_interval=0.1):
        handle = await client.queue(queue_name).add(None)
        assert await handle.result(timeout=10) == 1
        info = await handle.info()
    # It waited three lock TTLs for company; the sweep never took it away.
    assert calls.ids == [[handle.id]] and info.history == []


# ----------------------------------------------------------------------------- results


async def test_each_job_of_a_chunk_keeps_its_own_result_and_progress(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, chunk=Chunk(size=4, wait=0))
    async def rows(jobs: list[Job]) -> list[dict[str, int]]:
        for job in jobs:
            await job.progress(job.data["n"])
            await job.log(f"row {job.data['n']}")
        return [{"square": job.data["n"] ** 2} for job in jobs]

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk([{"n": n} for n in (2, 3, 4, 5)])
        async with run_worker(registry, queue_name, redis_url):
            results = [await handle.result(timeout=10) for handle in handles]
            infos = [await handle.info() for handle in handles]
    assert results == [{"square": n * n} for n in (2, 3, 4, 5)]
    assert [(i.state, i.progress, i.logs, i.attempts) for i in infos] == [
        (JobState.COMPLETED, n, [f"row {n}"], 1) for n in (2, 3, 4, 5)]


async def test_a_chunk_failure_fails_only_its_job_which_is_retried_alone(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=3, wait=0), attempts=2,
                      backoff=Backoff.fixed(0))
    async def rows(jobs: list[Job]) -> list[Any]:
        calls.enter(jobs)
        calls.leave()
        return [ChunkFailure(i, ValueError(f"bad row {job.data}")) if job.data == "bad"
                and job.attempt == 1 else f"ok {job.data}" for i, job in enumerate(jobs)]

    async with QueueClient(redis_url) as client:
        a, bad, c = await client.queue(queue_name).add_bulk(["a", "bad", "c"])
        async with run_worker(registry, queue_name, redis_url):
            assert await bad.result(timeout=10) == "ok bad"
            infos = [await handle.info() for handle in (a, bad, c)]
    assert calls.ids == [[a.id, bad.id, c.id], [bad.id]]
    assert calls.attempts == [[1, 1, 1], [2]]
    assert [(i.result, i.attempts) for i in infos] == [("ok a", 1), ("ok bad", 2), ("ok c", 1)]
    assert [(h["type"], h["message"]) for h in infos[1].history] == [
        ("ValueError", "bad row bad")]


async def test_a_chunk_failure_with_a_message_or_fail_follows_the_jobs_policy(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, chunk=Chunk(size=3, wait=0), attempts=3)
    async def rows(jobs: list[Job]) -> list[Any]:
        return [ChunkFailure(0, "no such customer"),
                ChunkFailure(1, Fail("cannot be processed")), "fine"][:len(jobs)]

    async with QueueClient(redis_url) as client:
        message, final, fine = await client.queue(queue_name).add_bulk([1, 2, 3])
        async with run_worker(registry, queue_name, redis_url):
            assert await fine.result(timeout=10) == "fine"
            with pytest.raises(JobFailed):
                await final.result(timeout=10)
            first = await message.info()
            final_info = await final.info()
    # A message: a failed attempt under the job's policy (attempts=3: retried later).
    assert first.error is not None and (first.error.type, first.error.message) == (
        "ChunkItemFailed", "no such customer")
    assert first.state in (JobState.DELAYED, JobState.WAITING, JobState.ACTIVE)
    assert final_info.failure_reason == "explicit_fail" and final_info.attempts == 1


async def test_a_bad_slot_fails_only_its_job(redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, chunk=Chunk(size=3, wait=0))
    async def rows(jobs: list[Job]) -> list[Any]:
        return ["fine", {1, 2}, ChunkFailure(0, "wrong slot")]

    async with QueueClient(redis_url) as client:
        fine, unencodable, misplaced = await client.queue(queue_name).add_bulk([1, 2, 3])
        async with run_worker(registry, queue_name, redis_url):
            assert await fine.result(timeout=10) == "fine"
            errors = []
            for handle in (unencodable, misplaced):
                with pytest.raises(JobFailed) as failed:
                    await handle.result(timeout=10)
                errors.append(failed.value.error)
    assert [(e.type if e else None) for e in errors] == ["PayloadError", "InvalidChunkResult"]
    assert errors[0] is not None and "result[1]" in errors[0].message
    assert errors[1] is not None and errors[1].message == (
        "ChunkFailure(0, ...) was returned in slot 2: return it in the slot of the job it fails")


async def test_a_snooze_raised_by_a_chunk_handler_snoozes_every_job_of_the_chunk(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    # Each job of the chunk is snoozed by a call of its own, so their due times may be apart
    # (by more than a millisecond on a busy machine) and the first may come back alone: the
    # chunk waits for its second job rather than run without it.
    @registry.handler(queue_name, chunk=Chunk(size=2, wait=5))
    async def rows(jobs: list[Job]) -> list[int]:
        calls.enter(jobs)
        calls.leave()
        if len(calls.ids) == 1:
            raise Snooze(0.2)
        return [job.attempt for job in jobs]

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk([1, 2])
        async with run_worker(registry, queue_name, redis_url):
            results = [await handle.result(timeout=10) for handle in handles]
            infos = [await handle.info() for handle in handles]
    ids = [h.id for h in handles]
    assert calls.ids == [ids, ids] and results == [1, 1]  # no attempt used
    for info in infos:
        assert [(e["type"], e["delay_ms"]) for e in info.history] == [("Snoozed", 200)]


async def test_raising_fails_every_job_of_the_chunk_each_by_its_own_policy(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=2, wait=0), backoff=Backoff.fixed(0))
    async def rows(jobs: list[Job]) -> list[None]:
        calls.enter(jobs)
        calls.leave()
        raise RuntimeError("database down")

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        once = await queue.add("once")  # the handler's default: one attempt
        twice = await queue.add("twice", attempts=2)
        async with run_worker(registry, queue_name, redis_url):
            for handle in (once, twice):
                with pytest.raises(JobFailed, match="database down"):
                    await handle.result(timeout=10)
            infos = [await once.info(), await twice.info()]
    assert calls.ids == [[once.id, twice.id], [twice.id]]
    assert [(i.state, i.attempts, i.failure_reason) for i in infos] == [
        (JobState.FAILED, 1, "max_attempts_exceeded"), (JobState.FAILED, 2,
                                                        "max_attempts_exceeded")]
    assert infos[0].error is not None and infos[0].error.type == "RuntimeError"
    assert infos[0].error.traceback and "database down" in infos[0].error.traceback


@pytest.mark.parametrize("returned", [["only one"], {"a": 1}, None])
async def test_a_result_that_is_not_one_value_per_job_fails_every_job(
        redis_url: str, queue_name: str, returned: Any) -> None:
    registry = Registry()

    @registry.handler(queue_name, chunk=Chunk(size=2, wait=0))
    async def rows(jobs: list[Job]) -> Any:
        return returned

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk([1, 2])
        async with run_worker(registry, queue_name, redis_url):
            errors = []
            for handle in handles:
                with pytest.raises(JobFailed) as failed:
                    await handle.result(timeout=10)
                errors.append(failed.value.error)
    got = {"only one": "a list of 1", "a": "dict"}.get(
        next(iter(returned)) if returned else "", "NoneType")
    for error in errors:
        assert error is not None and error.type == "InvalidChunkResult"
        assert error.message == ("a chunk handler must return a list of 2 results (one per "
                                 f"job, in the order of the jobs), got {got}")


async def test_the_timeout_bounds_the_whole_chunk_call(redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, chunk=Chunk(size=2, wait=0), timeout=0.3)
    async def rows(jobs: list[Job]) -> list[None]:
        await anyio.sleep(30)
        return [None] * len(jobs)

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk([1, 2])
        started = time.monotonic()
        async with run_worker(registry, queue_name, redis_url):
            infos = []
            for handle in handles:
                with pytest.raises(JobFailed):
                    await handle.result(timeout=10)
                infos.append(await handle.info())
    assert time.monotonic() - started < 10
    assert [(i.failure_reason, i.error.type if i.error else None) for i in infos] == [
        ("timeout", "JobTimeout"), ("timeout", "JobTimeout")]


# ----------------------------------------------------------------------------- cancel, slots


async def test_cancelling_one_job_stops_the_chunk_and_the_others_run_again_unharmed(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=3, wait=0))
    async def rows(jobs: list[Job]) -> list[str]:
        calls.enter(jobs)
        try:
            if len(calls.ids) == 1:
                await anyio.sleep(30)  # stopped by the cancellation
            return ["done"] * len(jobs)
        finally:
            calls.leave()

    async with QueueClient(redis_url) as client:
        a, b, c = await client.queue(queue_name).add_bulk(["a", "b", "c"])
        async with run_worker(registry, queue_name, redis_url):
            await calls.started.wait()
            await client.cancel(queue_name, b.id)
            assert [await a.result(timeout=10), await c.result(timeout=10)] == ["done"] * 2
            infos = [await handle.info() for handle in (a, b, c)]
    assert calls.ids == [[a.id, b.id, c.id], [a.id, c.id]]
    assert [(i.state, i.attempts) for i in infos] == [
        (JobState.COMPLETED, 1), (JobState.CANCELLED, 1), (JobState.COMPLETED, 1)]


async def test_a_job_cancelled_while_its_chunk_gathers_ends_cancelled_without_running(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=2, wait=30.0))
    async def rows(jobs: list[Job]) -> list[str]:
        calls.enter(jobs)
        calls.leave()
        return ["done"] * len(jobs)

    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        first = await queue.add(None)
        await async_wait_until(
            lambda: _is(client, queue_name, first.id, JobState.ACTIVE), what="the claim")
        await client.cancel(queue_name, first.id)
        second = await queue.add(None)
        assert await second.result(timeout=10) == "done"
        info = await first.info()
    assert calls.ids == [[second.id]]
    assert info.state is JobState.CANCELLED and info.failure_reason == "cancelled"


async def test_shutdown_past_the_grace_period_releases_every_job_of_a_running_chunk(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=3, wait=0))
    async def rows(jobs: list[Job]) -> list[None]:
        calls.enter(jobs)
        await anyio.sleep(30)
        return [None] * len(jobs)

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk([1, 2, 3])
        started = time.monotonic()
        async with run_worker(registry, queue_name, redis_url, grace=0.2):
            await calls.started.wait()
        infos = [await handle.info() for handle in handles]
    assert time.monotonic() - started < 10
    assert calls.ids == [[h.id for h in handles]]
    # Back to waiting at once, and the interrupted attempt does not count.
    assert [(i.state, i.attempts) for i in infos] == [(JobState.WAITING, 0)] * 3


async def test_a_chunk_still_gathering_when_the_worker_stops_is_released(
        redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=5, wait=30.0))
    async def rows(jobs: list[Job]) -> list[None]:
        calls.enter(jobs)
        return [None] * len(jobs)

    async with QueueClient(redis_url) as client:
        async with run_worker(registry, queue_name, redis_url):
            handle = await client.queue(queue_name).add(None)
            await async_wait_until(
                lambda: _is(client, queue_name, handle.id, JobState.ACTIVE), what="the claim")
        info = await handle.info()
    assert calls.ids == []
    assert (info.state, info.attempts) == (JobState.WAITING, 0)


async def test_concurrency_counts_chunks(redis_url: str, queue_name: str) -> None:
    registry, calls = Registry(), Calls()

    @registry.handler(queue_name, chunk=Chunk(size=3, wait=0), concurrency=2)
    async def rows(jobs: list[Job]) -> list[None]:
        calls.enter(jobs)
        await anyio.sleep(0.1)  # the work itself: long enough for chunks to overlap
        calls.leave()
        return [None] * len(jobs)

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk(list(range(18)))
        async with run_worker(registry, queue_name, redis_url):
            for handle in handles:
                await handle.result(timeout=10)
    assert calls.most_running == 2
    assert all(1 <= len(ids) <= 3 for ids in calls.ids)
    assert sorted(i for ids in calls.ids for i in ids) == sorted(h.id for h in handles)


async def test_a_thread_chunk_handler_reports_and_returns_per_job(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, chunk=Chunk(size=3, wait=0), executor="thread")
    def rows(jobs: list[Job]) -> list[int]:
        for job in jobs:
            job.progress(100)
        return [job.data * 2 for job in jobs]

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk([1, 2, 3])
        async with run_worker(registry, queue_name, redis_url):
            results = [await handle.result(timeout=10) for handle in handles]
            progress = [(await handle.info()).progress for handle in handles]
    assert results == [2, 4, 6] and progress == [100, 100, 100]


async def test_the_jobs_of_a_batch_ended_by_a_chunk_reach_the_batch_at_once(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, chunk=Chunk(size=10, wait=0))
    async def rows(jobs: list[Job]) -> list[None]:
        return [None] * len(jobs)

    async with QueueClient(redis_url) as client:
        batch = await client.batch(on_complete=(f"{queue_name}-done", None))
        await batch.add_bulk(queue_name, [{"n": n} for n in range(25)])
        await batch.close()
        callback = client.queue(f"{queue_name}-done").job(callback_id(batch.id, "complete"))

        async def added() -> bool:
            try:
                await callback.info()
            except JobNotFound:
                return False
            return True

        # The upkeep's own relay is a minute away: the chunk's endings are relayed as they end.
        async with run_worker(registry, queue_name, redis_url, stalled_interval=60.0):
            await async_wait_until(added, 10, "the batch's callback")


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(("chunk", "message"), [
    (lambda: Chunk(size=0), "Chunk.size must be an int >= 1, got 0"),
    (lambda: Chunk(size=2.5), "Chunk.size must be an int >= 1, got 2.5"),  # type: ignore
    (lambda: Chunk(size=True), "Chunk.size must be an int >= 1, got True"),
    (lambda: Chunk(size=10, wait=-1), "Chunk.wait must be >= 0, got -1"),
    (lambda: Chunk(size=10, wait=float("nan")), "Chunk.wait must be >= 0, got nan"),
    (lambda: Chunk(size=10, wait=float("inf")), "Chunk.wait must be at most"),
    (lambda: Chunk(size=10, wait="1"), "Chunk.wait must be a number of seconds"),  # type: ignore
])
def test_a_bad_chunk_is_refused_in_one_line(chunk: Any, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        chunk()
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_chunk_handler_on_the_subprocess_executor_is_refused_at_registration() -> None:
    registry = Registry()
    with pytest.raises(ConfigError, match="executor 'subprocess' cannot run chunks of jobs"):
        registry.handler("rows", chunk=Chunk(size=10), executor="subprocess")(
            lambda jobs: [None] * len(jobs))
    with pytest.raises(ConfigError, match=r"chunk must be a panqueue\.Chunk, got 10"):
        registry.handler("rows", chunk=10)  # type: ignore[arg-type]
    assert "rows" not in registry


@dataclass
class Point:
    x: int


def test_a_chunk_handler_of_dataclass_payloads_is_refused_at_registration() -> None:
    registry = Registry()

    async def rows(jobs: list[Job[Point]]) -> list[int]:
        return [job.data.x for job in jobs]

    with pytest.raises(ConfigError, match="payload Point is a dataclass, which a chunk handler "
                                          "does not rebuild"):
        registry.handler("points", chunk=Chunk(size=10))(rows)
    assert "points" not in registry


# ----------------------------------------------------------------------------- a crash


@pytest.fixture
def worker_processes(redis_url: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_chunk_of_a_killed_worker_is_recovered_and_each_job_completed_once(
        redis_url: str, redis_client: redis.Redis,
        worker_processes: list[subprocess.Popen[bytes]]) -> None:
    def start(backend: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            panqueue_command("worker", "chunk_app:queues", "-q", "chunk-crashy", "--url",
                             redis_url, "--backend", backend, "--log-level", "warning"),
            env=subprocess_env(PANQUEUE_URL=redis_url), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        worker_processes.append(proc)
        return proc

    with SyncQueueClient(redis_url) as client:
        handles = client.queue("chunk-crashy").add_bulk(["a", "b", "c"])
        first = start("asyncio")
        wait_until(lambda: redis_client.llen("chunk-started") == 1, timeout=20,
                   what="the first worker to start the chunk")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = start("trio")
        results = [handle.result(timeout=30) for handle in handles]
        infos = [handle.info() for handle in handles]
    ids = ",".join(handle.id for handle in handles)
    started = [entry.decode() for entry in redis_client.lrange("chunk-started", 0, -1)]
    assert started[0] == f"{first.pid}:{ids}"
    assert results == [second.pid] * 3
    completions = redis_client.hgetall("chunk-completions")
    assert {key.decode(): int(n) for key, n in completions.items()} == {
        handle.id: 1 for handle in handles}
    for info in infos:
        assert info.state is JobState.COMPLETED and info.attempts == 1
        assert [entry["type"] for entry in info.history] == ["Stalled"]


async def test_a_keyed_chunk_that_raises_rate_limited_claims_no_job_of_a_key_it_paused(
        redis_url: str, queue_name: str) -> None:
    """A chunk of two jobs of two keys raises RateLimited: both keys are paused. No recording
    of the chunk's endings may claim the third job, of the second key, before that key's pause
    is written (each ending used to claim a next job as soon as its own key was paused)."""
    registry = Registry()
    calls: list[list[str]] = []

    @registry.handler(queue_name, chunk=Chunk(size=2, wait=0.2), mode="keyed",
                      key_concurrency=2, concurrency=1)
    async def work(jobs: list[Job[str]]) -> list[None]:
        calls.append([job.data for job in jobs])
        if len(calls) == 1:
            raise RateLimited(retry_after=60)
        return [None] * len(jobs)

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        first, second = await queue.add("a", key="k1"), await queue.add("b", key="k2")
        third = await queue.add("d", key="k2")
        async with run_worker(registry, queue_name, redis_url, poll_interval=0.1):
            async def both_back() -> bool:
                history = [(await h.info()).history for h in (first, second)]
                return all(h and h[-1].get("type") == "RateLimited" for h in history)

            await async_wait_until(both_back, what="both jobs of the chunk rate limited")
            assert (await third.info()).state is JobState.WAITING
        assert calls == [["a", "b"]]


async def test_a_job_handed_over_while_a_chunk_outlasts_its_lock_is_renewed_and_runs_once(
        redis_url: str, queue_name: str) -> None:
    """The only slot runs a chunk longer than the lock TTL; the chunk's gathering ended at its
    wait after a claim that registered the worker as idle, so a job added meanwhile is handed
    to it and waits for the slot. Its lock is renewed while it waits: no stall is charged, it
    is not claimed a second time, and it runs once when the slot frees."""
    registry = Registry()
    calls: list[list[str]] = []
    first_started = anyio.Event()

    @registry.handler(queue_name, chunk=Chunk(size=2, wait=0.3), concurrency=1, lock_ttl=1.0)
    async def rows(jobs: list[Job[int]]) -> list[None]:
        calls.append([job.id for job in jobs])
        if len(calls) == 1:
            first_started.set()
            await anyio.sleep(3.0)  # three lock TTLs
        return [None] * len(jobs)

    async with QueueClient(redis_url) as client:
        queue = client.queue(rows)
        async with run_worker(registry, queue_name, redis_url, poll_interval=10.0,
                              stalled_interval=0.2) as worker:
            async def idle() -> bool:
                return worker._roles is not None and worker._roles.claimer.registered

            await async_wait_until(idle, what="the worker to wait as idle")
            first = await queue.add(1)
            with anyio.fail_after(10):
                await first_started.wait()
            second = await queue.add(2)
            assert await second.result(timeout=15) is None
            assert (await first.info()).state is JobState.COMPLETED
        info = await second.info()
    assert info.history == [] and info.attempts == 1, info.history  # no stall charged
    assert calls.count([second.id]) == 1 and len(calls) == 2, calls


# ----------------------------------------------------------------- a handler's own task group


# asyncio raises a SystemExit of its own tasks out of its event loop (docs/executors.md).
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_sys_exit_in_a_task_of_a_chunk_handlers_task_group_fails_only_the_chunk(
        redis_url: str, queue_name: str) -> None:
    """As for a plain handler: the group (a nursery's, holding the SystemExit) fails the
    chunk's jobs. It went up through the worker and stopped it."""
    registry = Registry()

    @registry.handler(queue_name, chunk=Chunk(size=2, wait=0), attempts=1)
    async def rows(jobs: list[Job[str]]) -> list[str]:
        if jobs[0].data == "exit":
            async def exits() -> None:
                sys.exit(3)

            async with anyio.create_task_group() as group:
                group.start_soon(exits)
        return [job.data for job in jobs]

    async with QueueClient(redis_url) as client:
        with anyio.fail_after(30):
            async with run_worker(registry, queue_name, redis_url):
                bad = await client.queue(queue_name).add("exit")
                with pytest.raises(JobFailed):
                    await bad.result(timeout=10)
                fine = await client.queue(queue_name).add("fine")
                assert await fine.result(timeout=10) == "fine"
        info = await bad.info()
    assert info.error is not None and "SystemExit: 3" in (info.error.traceback or "")


async def test_a_cancelled_member_of_a_chunk_whose_task_raises_in_its_cleanup(
        redis_url: str, queue_name: str) -> None:
    """cancel() of one job of a running chunk whose handler's task raises in its cleanup: the
    cancellation comes out as that error (asyncio) or with it in a group (trio). The job asked
    for is cancelled, the other goes back without using an attempt and runs again; the error
    was charged to the other (FAILED), or went up through the worker and stopped it."""
    registry, started = Registry(), anyio.Event()
    calls: list[list[str]] = []

    @registry.handler(queue_name, chunk=Chunk(size=2, wait=5.0), attempts=1)
    async def rows(jobs: list[Job[str]]) -> list[str]:
        calls.append([job.data for job in jobs])
        if len(calls) == 1:
            await run_a_task_whose_cleanup_raises(started)
        return [job.data for job in jobs]

    async with QueueClient(redis_url) as client:
        with anyio.fail_after(30):
            async with run_worker(registry, queue_name, redis_url):
                a, b = await client.queue(queue_name).add_bulk(["a", "b"])
                await started.wait()
                assert await client.cancel(queue_name, b.id) is JobState.ACTIVE
                assert await a.result(timeout=10) == "a"
        infos = [await h.info() for h in (a, b)]
    assert [(i.state, i.attempts) for i in infos] == [
        (JobState.COMPLETED, 1), (JobState.CANCELLED, 1)]
    assert calls == [["a", "b"], ["a"]]


@pytest.mark.parametrize("chunked", [True, False])
async def test_a_slow_failure_callback_lets_no_job_of_the_slot_stall(
        redis_url: str, queue_name: str, chunked: bool) -> None:
    """An async on_failure callback that awaits (an error tracker's HTTP call) longer than the
    lock TTL. The chunk's completed member waited for it unrecorded, and the jobs claimed next
    for the slot waited unrenewed: the stalled sweep took them back and they ran twice. Every
    job here runs once."""
    registry = Registry()
    runs: dict[str, int] = {}

    @registry.on_failure
    async def report(job: Job[Any], exc: BaseException, final: bool) -> None:
        await anyio.sleep(2.5)  # awaits: the event loop and the lock renewal go on

    def ran(data: str) -> Any:
        runs[data] = runs.get(data, 0) + 1
        return "ok"

    if chunked:
        @registry.handler(queue_name, chunk=Chunk(size=2, wait=5.0), concurrency=1,
                          lock_ttl=1.0, attempts=1)
        async def rows(jobs: list[Job[str]]) -> list[Any]:
            return [ChunkFailure(i, "rejected") if ran(job.data) and job.data == "bad"
                    else "ok" for i, job in enumerate(jobs)]
    else:
        @registry.handler(queue_name, concurrency=1, lock_ttl=1.0, attempts=1)
        async def one(job: Job[str]) -> str:
            ran(job.data)
            if job.data == "bad":
                raise ValueError("rejected")
            return "ok"

    async with QueueClient(redis_url) as client:
        with anyio.fail_after(40):
            async with run_worker(registry, queue_name, redis_url, stalled_interval=0.2):
                first = ["bad", "good"] if chunked else ["bad"]
                handles = await client.queue(queue_name).add_bulk(first)
                later = await client.queue(queue_name).add_bulk(["next-1", "next-2"])
                for handle in [*handles[1:], *later]:
                    assert await handle.result(timeout=20) == "ok"
        infos = [await h.info() for h in [*handles[1:], *later]]
    assert runs == dict.fromkeys([*first, "next-1", "next-2"], 1), runs
    assert all(info.attempts == 1 and info.history == [] for info in infos)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_job_cancelled_while_handed_over_and_waiting_for_the_slot_never_runs(
        redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The only slot runs a long chunk [x], its gathering having left the worker waiting as
    idle: y, added meanwhile, is handed to it and waits for the slot, ACTIVE under its lock.
    cancel(y) is heard while y has no attempt. The request was kept for 30 s only (shortened
    here, with the chunk's run): y then started with z, and ran though cancelled before it
    began. It is kept until y's attempt starts."""
    from panqueue._runtime import locks

    # The window the request was kept for, shortened here (none is left: the job's chunk runs
    # longer than a window of 0.2 s would keep it).
    monkeypatch.setattr(locks, "_EARLY_CANCEL_SECONDS", 0.2, raising=False)
    registry = Registry()
    calls: list[list[str]] = []
    first_started = anyio.Event()

    @registry.handler(queue_name, chunk=Chunk(size=2, wait=0.3), concurrency=1)
    async def rows(jobs: list[Job[str]]) -> list[str]:
        calls.append([job.data for job in jobs])
        if len(calls) == 1:
            first_started.set()
            await anyio.sleep(1.0)  # past the window above
        return [job.data for job in jobs]

    async with QueueClient(redis_url) as client:
        queue = client.queue(rows)
        with anyio.fail_after(30):
            async with run_worker(registry, queue_name, redis_url, poll_interval=10.0):
                x = await queue.add("x")
                await first_started.wait()
                y = await queue.add("y")

                async def handed() -> bool:
                    return (await y.info()).state is JobState.ACTIVE

                await async_wait_until(handed, what="y handed over")
                assert await client.cancel(queue_name, y.id) is JobState.ACTIVE
                z = await queue.add("z")
                assert await x.result(timeout=10) == "x"
                assert await z.result(timeout=10) == "z"
                with pytest.raises(JobFailed):
                    await y.result(timeout=10)
        assert (await y.info()).state is JobState.CANCELLED
    assert all("y" not in call for call in calls), calls
