"""Day-one operations on the library side: the worker registry (client.workers), why a job is
where it is (client.explain), and purging a queue (client.purge), against a real server and
real workers."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    Backoff,
    Explanation,
    Job,
    JobNotFound,
    JobState,
    QueueClient,
    RateLimit,
    Registry,
    Retention,
    SyncQueueClient,
    WorkerInfo,
)
from panqueue._keys import QueueKeys
from panqueue.testing import drain, run_worker
from tests.helpers import async_wait_until, run_cli, subprocess_env, wait_until

pytestmark = pytest.mark.anyio

# A short beat keeps the tests quick: an entry lives 3 x 0.2 s after its last beat.
BEAT = 0.2


def sleeper(queue: str, **options: object) -> tuple[Registry, anyio.Event, list[str]]:
    """A handler that holds each job until ``release`` is set; ``started`` lists job ids."""
    registry = Registry()
    release = anyio.Event()
    started: list[str] = []

    @registry.handler(queue, **options)  # type: ignore[arg-type]
    async def hold(job: Job) -> None:
        started.append(job.id)
        await release.wait()

    return registry, release, started


async def wait_started(started: list[str]) -> None:
    async def any_started() -> bool:
        return bool(started)

    await async_wait_until(any_started, timeout=10, what="a job to start")


# ----------------------------------------------------------------------------- the registry


async def test_a_running_worker_is_listed_with_its_host_pid_queue_and_running_jobs(
        redis_url: str, queue_name: str) -> None:
    registry, release, started = sleeper(queue_name, concurrency=3)
    async with QueueClient(redis_url) as client:
        handle = await client.queue(queue_name).add({})
        before = datetime.now(UTC) - timedelta(seconds=5)
        async with run_worker(registry, queue_name, redis_url, name="w-one",
                              heartbeat_interval=BEAT):
            await wait_started(started)

            async def lists_the_job() -> bool:
                found = await client.workers(queue_name)
                return bool(found) and found[0].running == [handle.id]

            await async_wait_until(lists_the_job, timeout=5, what="the beat with the job")
            [info] = await client.workers(queue_name)
            assert isinstance(info, WorkerInfo)
            assert info.name == "w-one"
            assert info.queues == [queue_name]
            assert info.concurrency == 3
            assert info.pid > 0 and info.host
            assert info.started_at.tzinfo is not None and info.heartbeat_at.tzinfo is not None
            assert before <= info.started_at <= info.heartbeat_at
            assert [w.name for w in await client.workers()] == ["w-one"]
            release.set()
            await handle.result(timeout=10)
            await async_wait_until(
                lambda: _running(client, queue_name, []), timeout=5, what="an idle beat")
        # A clean stop removes the entry at once.
        assert await client.workers(queue_name) == []


async def _running(client: QueueClient, queue: str, expected: list[str]) -> bool:
    found = await client.workers(queue)
    return bool(found) and found[0].running == expected


async def test_workers_of_every_queue_are_merged_by_name(redis_url: str, queue_name: str
                                                         ) -> None:
    other = queue_name + "-b"
    registry = Registry()

    @registry.handler(queue_name)
    async def one(job: Job) -> None: ...

    @registry.handler(other)
    async def two(job: Job) -> None: ...

    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, redis_url, name="shared", heartbeat_interval=BEAT), \
            run_worker(registry, other, redis_url, name="shared", heartbeat_interval=BEAT):
        merged = [w for w in await client.workers() if w.name == "shared"]
        assert len(merged) == 1
        assert merged[0].queues == sorted([queue_name, other])


WORKER_SCRIPT = textwrap.dedent("""
    import sys
    import anyio
    from panqueue import Registry, Worker

    url, queue = sys.argv[1], sys.argv[2]
    registry = Registry()

    @registry.handler(queue)
    async def work(job):
        return None

    anyio.run(Worker(registry, queue, url=url, name="doomed", heartbeat_interval=0.2).run)
""")


@pytest.fixture
def worker_process(redis_url: str, queue_name: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, redis_url, queue_name],
                            env=subprocess_env())
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_killed_worker_vanishes_from_the_registry_within_its_ttl(
        redis_url: str, queue_name: str, worker_process: subprocess.Popen[bytes],
        redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        wait_until(lambda: client.workers(queue_name), timeout=20, what="the worker's entry")
        [info] = client.workers(queue_name)
        assert info.name == "doomed" and info.pid == worker_process.pid
        worker_process.send_signal(signal.SIGKILL)
        worker_process.wait(10)
        killed = datetime.now(UTC)
        # Still listed until its TTL (3 beats) runs out, then gone and pruned.
        wait_until(lambda: not client.workers(queue_name), timeout=5, what="the entry to expire")
        assert datetime.now(UTC) - killed < timedelta(seconds=3 * 0.2 + 1.5)
        keys = QueueKeys(queue_name)
        assert redis_client.zcard(keys.workers) == 0
        assert redis_client.hlen(keys.worker_info) == 0


# ----------------------------------------------------------------------------- explain


async def test_explain_says_why_a_job_is_not_running(redis_url: str, queue_name: str) -> None:
    registry, release, _started = sleeper(queue_name, concurrency=1)
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = await queue.add({})
        second = await queue.add({})
        third = await queue.add({})
        # No worker has ever served the queue.
        assert (await client.explain(queue_name, second.id)).reason == "no_worker"
        later = await queue.add({}, delay=3600)
        delayed = await client.explain(queue_name, later.id)
        assert (delayed.state, delayed.reason) == (JobState.DELAYED, "delayed")
        assert "delayed until" in delayed.detail
        blocked_job = await queue.add({}, depends_on=[third.id])
        blocked = await client.explain(queue_name, blocked_job.id)
        assert (blocked.state, blocked.reason) == (JobState.BLOCKED, "blocked")
        assert third.id in blocked.detail and "waiting" in blocked.detail
        async with run_worker(registry, queue_name, redis_url, name="w-explain",
                              heartbeat_interval=BEAT):
            await async_wait_until(lambda: _running(client, queue_name, [first.id]), timeout=5,
                                   what="the first job to run")
            running = await client.explain(queue_name, first.id)
            assert (running.state, running.reason) == (JobState.ACTIVE, "running")
            assert "w-explain" in running.detail and "lock deadline" in running.detail
            queued = await client.explain(queue_name, third.id)
            assert (queued.state, queued.reason) == (JobState.WAITING, "queued")
            assert "behind 1 job;" in queued.detail
            await client.pause(queue_name)
            paused = await client.explain(queue_name, second.id)
            assert (paused.reason, paused.state) == ("paused", JobState.WAITING)
            await client.resume(queue_name)
            release.set()
            await third.result(timeout=10)
        done = await client.explain(queue_name, first.id)
        assert isinstance(done, Explanation)
        assert (done.state, done.reason) == (JobState.COMPLETED, "finished")
        assert done.detail.startswith("completed at ")


async def test_explain_names_the_jobs_that_hold_a_busy_key(redis_url: str, queue_name: str
                                                          ) -> None:
    registry, release, started = sleeper(queue_name, concurrency=4, mode="keyed",
                                         key_concurrency=1)
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name, mode="keyed")
        holder = await queue.add({}, key="tenant-a")
        waiting = await queue.add({}, key="tenant-a")
        async with run_worker(registry, queue_name, redis_url, heartbeat_interval=BEAT):
            await wait_started(started)
            busy = await client.explain(queue_name, waiting.id)
            assert (busy.state, busy.reason) == (JobState.WAITING, "key_busy")
            assert holder.id in busy.detail and "tenant-a" in busy.detail
            release.set()
            await waiting.result(timeout=10)


async def test_explain_says_until_when_the_rate_limit_holds_a_job(redis_url: str,
                                                                  queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, rate_limit=RateLimit(max=1, per=60))
    async def quick(job: Job) -> None: ...

    async with QueueClient(redis_url) as client:
        first = await client.queue(queue_name).add({})
        second = await client.queue(queue_name).add({})
        async with run_worker(registry, queue_name, redis_url, heartbeat_interval=BEAT):
            await first.result(timeout=10)
            limited = await client.explain(queue_name, second.id)
            assert (limited.state, limited.reason) == (JobState.WAITING, "rate_limited")
            assert "until" in limited.detail


async def test_explain_says_until_when_a_keys_rate_limit_holds_a_job(redis_url: str,
                                                                     queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, mode="keyed", rate_limit=RateLimit(max=1, per=60,
                                                                     per_key=True))
    async def quick(job: Job) -> None: ...

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name, mode="keyed")
        first = await queue.add({}, key="tenant-a")
        second = await queue.add({}, key="tenant-a")
        async with run_worker(registry, queue_name, redis_url, heartbeat_interval=BEAT):
            await first.result(timeout=10)

            async def limited() -> bool:
                why = await client.explain(queue_name, second.id)
                return why.reason == "rate_limited" and "'tenant-a'" in why.detail

            await async_wait_until(limited, timeout=5, what="the key's rate limit")


def test_explain_of_a_failed_job_says_how_and_an_unknown_job_raises(
        redis_url: str, queue_name: str) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue(queue_name).add({})
        client.cancel(queue_name, handle.id)
        cancelled = client.explain(queue_name, handle.id)
        assert (cancelled.state, cancelled.reason) == (JobState.CANCELLED, "finished")
        assert cancelled.detail.startswith("cancelled at ")
        with pytest.raises(JobNotFound):
            client.explain(queue_name, "no-such-job")


# ----------------------------------------------------------------------------- purge


def _keys_of(redis_client: redis.Redis, queue: str) -> set[str]:
    return {k.decode() for k in redis_client.scan_iter(match=f"{{q:{queue}}}:*")}


def test_purge_by_state_removes_only_those_jobs_and_their_edges(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        waiting = [queue.add({"n": n}) for n in range(5)]
        delayed = queue.add({}, delay=3600)
        dependent = queue.add({}, depends_on=[waiting[0].id])
        assert client.purge(queue_name, [JobState.DELAYED]) == 1
        assert client.counts(queue_name)[JobState.DELAYED] == 0
        assert client.counts(queue_name)[JobState.WAITING] == 5
        with pytest.raises(JobNotFound):
            client.get_job(queue_name, delayed.id)
        # Purging the waiting jobs fails the job blocked on one of them, edges gone.
        assert client.purge(queue_name, "waiting") == 5
        assert client.get_job(queue_name, dependent.id).state is JobState.FAILED
        assert client.get_job(queue_name, dependent.id).failure_reason == "dependency_failed"
        assert not any(":deps:" in k or ":needs:" in k for k in _keys_of(redis_client,
                                                                         queue_name)
                       if dependent.id not in k)
        assert client.purge(queue_name, ["failed"]) == 1
        assert sum(client.counts(queue_name).values()) == 0


def test_purge_of_a_chain_of_blocked_jobs_leaves_no_failed_entry_without_a_job(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """Deleting A fails B, blocked on it, into "failed"; B is in the same purge's page and is
    deleted from there, not left as a failed count with no job behind it."""
    with SyncQueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = queue.add({"n": "x"}, delay=3600)
        a = queue.add({"n": "a"}, depends_on=[first.id])
        b = queue.add({"n": "b"}, depends_on=[a.id])
        assert client.get_job(queue_name, b.id).state is JobState.BLOCKED
        assert client.purge(queue_name, [JobState.BLOCKED]) == 2
        counts = client.counts(queue_name)
        assert (counts[JobState.BLOCKED], counts[JobState.FAILED]) == (0, 0)
        assert client.list_jobs(queue_name, JobState.FAILED) == []
        assert redis_client.zcard(QueueKeys(queue_name).failed) == 0
        assert counts[JobState.DELAYED] == 1


def test_purge_of_a_keyed_queue_keeps_its_counters_consistent(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    keys = QueueKeys(queue_name)
    with SyncQueueClient(redis_url) as client:
        queue = client.queue(queue_name, mode="keyed")
        for n in range(7):
            queue.add({"n": n}, key=f"k{n % 3}")
        assert client.counts(queue_name)[JobState.WAITING] == 7
        assert client.purge(queue_name, [JobState.WAITING]) == 7
        assert client.counts(queue_name)[JobState.WAITING] == 0
        assert int(redis_client.hget(keys.meta, "kw") or 0) == 0
        assert redis_client.zcard(keys.ready) == 0
        assert not any(":k:wait:" in k for k in _keys_of(redis_client, queue_name))


def test_purge_in_batches_removes_every_job(redis_url: str, queue_name: str) -> None:
    from panqueue._store import ops
    from panqueue._store.transport import SyncTransport

    with SyncQueueClient(redis_url) as client:
        client.queue(queue_name).add_bulk([{"n": n} for n in range(25)])
    transport = SyncTransport(redis_url)
    try:
        assert transport.run(ops.purge(QueueKeys(queue_name), ["waiting"], batch=4)) == 25
    finally:
        transport.close()
    with SyncQueueClient(redis_url) as client:
        assert client.counts(queue_name)[JobState.WAITING] == 0


def test_one_purge_call_deletes_whole_jobs_only(redis_url: str, queue_name: str,
                                               redis_client: redis.Redis) -> None:
    """Interrupted between two batches, a purge leaves no half-deleted job: every job hash
    left is in its state's set, and every member of a set has its hash."""
    from panqueue._store import Op, ops
    from panqueue._store.transport import SyncTransport

    keys = QueueKeys(queue_name)
    with SyncQueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        ids = [h.id for h in queue.add_bulk([{"n": n} for n in range(10)])]
        queue.add({}, depends_on=[ids[0]])
    purge = ops.purge(keys, None, batch=4)
    first_call = next(purge)  # the first batch only, as if the caller stopped after it

    def once() -> Op[Any]:
        reply = yield first_call
        return reply

    transport = SyncTransport(redis_url)
    try:
        deleted, more = transport.run(once())
    finally:
        transport.close()
    assert (int(deleted), int(more)) == (4, 1)
    hashes = {k.decode().rsplit(":", 1)[1] for k in redis_client.scan_iter(keys.job("*"))
              if not k.endswith(b":logs")}
    members = {m.decode() for state in ("wait", "blocked", "failed")
               for m in redis_client.zrange(getattr(keys, state), 0, -1)}
    members |= {m.decode() for m in redis_client.lrange(keys.wait_list, 0, -1)}
    assert hashes == members and len(hashes) == 7


async def test_purge_never_touches_active_jobs_unless_asked(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry, release, started = sleeper(queue_name, concurrency=1)
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        running = await queue.add({})
        await queue.add({})
        async with run_worker(registry, queue_name, redis_url, heartbeat_interval=BEAT,
                              grace=0.5):
            await wait_started(started)
            # Everything but the running job, and the settings stay while it runs and while a
            # live worker serves the queue.
            assert await client.purge(queue_name) == 1
            counts = await client.counts(queue_name)
            assert counts[JobState.ACTIVE] == 1 and counts[JobState.WAITING] == 0
            assert await client.queue_exists(queue_name)
            assert await client.purge(queue_name, [JobState.ACTIVE]) == 1
            assert (await client.counts(queue_name))[JobState.ACTIVE] == 0
            assert await client.purge(queue_name) == 0
            assert await client.queue_exists(queue_name)
            release.set()
        # The worker's attempt found its lock gone: nothing came back.
        assert sum((await client.counts(queue_name)).values()) == 0
        with pytest.raises(JobNotFound):
            await client.get_job(queue_name, running.id)
        # The worker is gone: now the settings go too.
        assert await client.purge(queue_name) == 0
        assert not await client.queue_exists(queue_name)


def test_purge_of_everything_removes_the_jobs_and_the_settings(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = queue.add({})
        queue.add({}, delay=60)
        queue.add({}, depends_on=[first.id])
        client.cancel(queue_name, queue.add({}).id)
        client.pause(queue_name)
        assert client.purge(queue_name) == 4
        assert not client.queue_exists(queue_name)
        assert queue_name not in client.queues()
        # The events and history streams stay for their readers (the history: the next export).
        keys = QueueKeys(queue_name)
        assert _keys_of(redis_client, queue_name) - {keys.events, keys.history} == set()
        assert client.purge(queue_name) == 0


# ------------------------------------------------------------------------ across the queues


@pytest.mark.parametrize("how", ["job_id", "tag"])
def test_a_job_or_tag_named_like_a_queues_settings_makes_no_queue(
        redis_url: str, queue_name: str, how: str) -> None:
    """The queues are found by their settings' keys, "{q:X}:meta": a job id or a tag ending in
    "}:meta" makes a key of that shape too. It was listed as a queue "X}:job:...", whose name
    every command that lists the queues then refused: stats, info, workers, schedules, and a
    worker's stop exited 2 for the whole server."""
    with SyncQueueClient(redis_url) as client:
        if how == "job_id":
            client.queue(queue_name).add({"a": 1}, job_id="x}:meta")
        else:
            client.queue(queue_name).add({"a": 1}, tags=["a}:meta"])
        assert client.queues() == [queue_name]
    for command in ("stats", "info", "workers", "schedules"):
        done = run_cli(command, "--url", redis_url)
        assert done.returncode == 0, (command, done.stderr)


@pytest.mark.parametrize("mode", ["global", "keyed"])
async def test_waiting_jobs_filtered_by_their_error_in_either_mode(
        redis_url: str, queue_name: str, mode: str) -> None:
    """A retried job waits with its last error. A keyed queue's waiting jobs wait in a list per
    key, which the filter did not read: it found none."""
    registry = Registry()
    options: dict[str, Any] = {"mode": "keyed"} if mode == "keyed" else {}

    @registry.handler(queue_name, attempts=3, backoff=Backoff.fixed(0), **options)
    async def handler(job: Job) -> None:
        await client.pause(queue_name)  # its retry waits, unclaimed
        raise ValueError("boom")

    async with QueueClient(redis_url) as client:
        other = await client.queue(handler).add(2, **({"key": "k2"} if options else {}))
        await client.cancel(queue_name, other.id)  # no error: it must not match
        waiting = await client.queue(handler).add(1, **({"key": "k1"} if options else {}))
        async with run_worker(registry, queue_name, redis_url):
            async def retried() -> bool:
                return (await waiting.info()).error is not None

            await async_wait_until(retried, what="the job's retry to wait")
        found = await client.list_jobs(queue_name, "waiting", error_type="ValueError")
        assert [j.id for j in found] == [waiting.id]
    done = run_cli("jobs", queue_name, "--error-type", "ValueError", "--url", redis_url)
    assert done.returncode == 0 and waiting.id in done.stdout, done.stdout


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the server's work: one loop is enough
async def test_retrying_the_failed_jobs_with_no_ids_retries_every_one(
        redis_url: str, queue_name: str) -> None:
    """retry_failed(queue) (panqueue dlq --retry, the dashboard's "retry all") moved the
    oldest 10,000 and said nothing of the rest."""
    registry = Registry()

    @registry.handler(queue_name, attempts=1, concurrency=50, retention=Retention(failed=-1))
    async def handler(job: Job) -> None:
        raise ValueError("boom")

    total = 10_050
    async with QueueClient(redis_url) as client:
        await client.queue(handler).add_bulk(list(range(total)))
        async with run_worker(registry, queue_name, redis_url):
            assert (await drain(redis_url, queue_name, timeout=120))[JobState.FAILED] == total
    done = run_cli("dlq", queue_name, "--retry", "--url", redis_url)
    assert done.stdout.strip() == f"{total} job(s) moved back to waiting", done.stderr
    with SyncQueueClient(redis_url) as client:
        counts = client.counts(queue_name)
    assert (counts[JobState.FAILED], counts[JobState.WAITING]) == (0, total)
