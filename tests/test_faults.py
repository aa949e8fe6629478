"""The worker under faults: lost locks, lost replies, bad values, Redis refusing commands,
networks that drop everything. Every test runs a real worker against a real server and causes a
real fault (a loopback proxy, a server setting, a script the sweep really runs)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from panqueue import Job, JobState, QueueClient, Registry
from panqueue._keys import QueueKeys
from panqueue._store import transitions
from panqueue._store.loader import SCRIPTS
from panqueue._store.transport import SyncTransport
from panqueue.embedded import RedisServer
from panqueue.testing import FaultProxy, drain, run_worker
from tests.apps import fault_app
from tests.helpers import async_wait_until, call_of, capture_panqueue_logs, load_scripts

pytestmark = pytest.mark.anyio


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, for faults that would disturb other tests' server."""
    server = RedisServer(appendonly=False, directory=tmp_path / "own")
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def sweep_now(url: str, queue: str, job_id: str) -> None:
    """Expire the job's lock and run the stalled sweep, as another worker would after a cut
    longer than the lock TTL."""
    keys = QueueKeys(queue)
    client = redis.Redis.from_url(url)
    client.zadd(keys.active, {job_id: 0})
    client.close()
    transport = SyncTransport(url)
    try:
        transport.run(transitions.sweep_stalled(keys, max_stalls=5, keep_failed=-1))
    finally:
        transport.close()


def job_hash(url: str, queue: str, job_id: str) -> dict[bytes, bytes]:
    client = redis.Redis.from_url(url)
    try:
        return client.hgetall(QueueKeys(queue).job(job_id))  # type: ignore[return-value]
    finally:
        client.close()


# --------------------------------------------------------------------------- lock loss


async def test_a_job_claimed_again_while_its_first_attempt_runs_stops_that_attempt(
        redis_url: str, queue_name: str) -> None:
    """The lock of a running attempt expires unseen and the sweep requeues the job; the same
    worker claims it again. The first attempt is stopped before the second starts (never two at
    once on one worker), its outcome is discarded, and the worker goes on serving."""
    registry = Registry()
    timeline: list[tuple[str, int]] = []
    first_running = anyio.Event()

    @registry.handler(queue_name, concurrency=2)
    async def handler(job: Job) -> Any:
        run = sum(1 for event, _ in timeline if event == "start") + 1
        timeline.append(("start", run))
        try:
            if job.data == "long" and run == 1:
                first_running.set()
                await anyio.sleep(30)  # until stopped
            return run
        finally:
            timeline.append(("end", run))

    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, redis_url) as worker:
        handle = await client.queue(queue_name).add("long")
        await first_running.wait()
        sweep_now(redis_url, queue_name, handle.id)
        assert await handle.result(timeout=10) == 2  # the second run's outcome
        # The first run ended before the second started.
        assert timeline == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
        # The worker still serves.
        assert await (await client.queue(queue_name).add("next")).result(timeout=10) == 3
        info = await client.get_job(queue_name, handle.id)
        # A stalled attempt does not count: the job completed on its first counted attempt.
        assert info.state == JobState.COMPLETED and info.attempts == 1
    assert worker.processed == 2


async def test_lock_tokens_differ_between_workers_that_share_a_name(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()
    holding = anyio.Event()
    started = 0

    @registry.handler(queue_name)
    async def handler(job: Job) -> None:
        nonlocal started
        started += 1
        await holding.wait()

    async with QueueClient(redis_url) as client:
        # Added first, so that each worker's very first claim takes one.
        handles = [await client.queue(queue_name).add(i) for i in range(2)]
    async with run_worker(registry, queue_name, redis_url, name="same"), \
            run_worker(registry, queue_name, redis_url, name="same"):

        async def both_started() -> bool:
            return started == 2

        await async_wait_until(both_started, what="both jobs running")
        tokens = {job_hash(redis_url, queue_name, h.id)[b"tk"] for h in handles}
        holding.set()
        assert len(tokens) == 2


# --------------------------------------------------------------------------- lost replies


@pytest.mark.parametrize("script", ["claim", "complete", "fail"])
async def test_a_lost_reply_strands_nothing_and_charges_no_stall(
        proxy: FaultProxy, redis_url: str, queue_name: str, script: str) -> None:
    """The server ran the claim (or complete-and-claim-next, or fail-and-claim-next) but the
    reply was lost on the way back. The call is sent again; it answers as the first one did, so
    the jobs the first call claimed run now, nothing is reported as "lock lost", and no job is
    charged a stall (with max_stalls=0 a charged stall would fail the job)."""
    registry = Registry()

    @registry.handler(queue_name, lock_ttl=1.0, max_stalls=0, attempts=2)
    async def handler(job: Job) -> Any:
        if script == "fail" and job.attempt == 1:
            raise ValueError("first attempt fails")
        return job.data

    loader = redis.Redis.from_url(redis_url)
    load_scripts(loader, getattr(SCRIPTS, script))  # loaded: the first FCALL runs the script
    loader.close()
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        handles = [await queue.add(i) for i in range(3)]
        proxy.drop_next_reply(match=call_of(getattr(SCRIPTS, script)))
        with capture_panqueue_logs() as logs:
            async with run_worker(registry, queue_name, proxy.url):
                await anyio.to_thread.run_sync(proxy.wait_for_dropped_replies, 1)
                for i, handle in enumerate(handles):
                    assert await handle.result(timeout=10) == i
        for handle in handles:
            h = job_hash(redis_url, queue_name, handle.id)
            # One attempt (two when the first fails on purpose), no stall.
            assert h[b"a"] == (b"2" if script == "fail" else b"1") and b"sc" not in h
    assert not [e for e in logs if "lock lost" in e["event"]]


# --------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(("queue", "what", "error_type"), [
    ("f-thread", "system-exit", "SystemExit"),
    ("f-thread", "keyboard-interrupt", "KeyboardInterrupt"),
    ("f-thread", "base-exception", "Custom"),
    ("f-thread", "unprintable", "Unprintable"),
    ("f-subprocess", "system-exit", "SystemExit"),
    ("f-subprocess", "keyboard-interrupt", "KeyboardInterrupt"),
    ("f-subprocess", "unprintable", "Unprintable"),
    ("f-inline", "system-exit", "SystemExit"),
    ("f-inline", "unprintable", "Unprintable"),
    ("f-inline", "surrogate-result", "PayloadError"),
    ("f-thread", "surrogate-result", "PayloadError"),
    ("f-subprocess", "surrogate-result", "PayloadError"),
    ("f-inline", "surrogate-error", "ValueError"),
    ("f-subprocess", "surrogate-error", "ValueError"),
])
async def test_no_exception_from_a_handler_stops_the_worker(
        redis_url: str, queue: str, what: str, error_type: str) -> None:
    async with QueueClient(redis_url) as client, \
            run_worker(fault_app.queues, queue, redis_url):
        bad = await client.queue(queue).add(what)
        with pytest.raises(Exception, match="ended failed"):
            await bad.result(timeout=20)
        info = await client.get_job(queue, bad.id)
        assert info.error is not None and info.error.type == error_type
        # The same worker goes on serving.
        assert await (await client.queue(queue).add("fine")).result(timeout=20) == "ok"


# asyncio re-raises a SystemExit out of its event loop when a task of its own raises it, so
# there it ends the worker process (docs/executors.md); a trio nursery raises it in a group.
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_sys_exit_in_a_task_of_an_inline_handlers_task_group_fails_only_the_attempt(
        redis_url: str) -> None:
    async with QueueClient(redis_url) as client, \
            run_worker(fault_app.queues, "f-inline", redis_url):
        bad = await client.queue("f-inline").add("task-group-exit")
        with pytest.raises(Exception, match="ended failed"):
            await bad.result(timeout=20)
        info = await client.get_job("f-inline", bad.id)
        assert info.error is not None and info.error.type == "BaseExceptionGroup"
        assert "SystemExit: 3" in (info.error.traceback or "")
        assert await (await client.queue("f-inline").add("fine")).result(timeout=20) == "ok"


@pytest.mark.parametrize("executor", ["inline", "thread", "subprocess"])
async def test_an_unusable_retry_delay_is_recorded_and_the_backoff_applies(
        redis_url: str, executor: str) -> None:
    """In every executor. A subprocess child sent a delay past msgpack's integers as it was,
    and died of it: the attempt was recorded as the child's crash."""
    queue = f"f-retry-{executor}"
    async with QueueClient(redis_url) as client, \
            run_worker(fault_app.queues, queue, redis_url):
        for what, problem in [("retry-inf", "must be finite"), ("retry-nan", "must be finite"),
                              ("retry-huge", "at most"), ("retry-huger", "Retry(delay=...)")]:
            handle = await client.queue(queue).add(what)
            assert await handle.result(timeout=20) == "second"
            info = await client.get_job(queue, handle.id)
            assert info.history[0]["type"] == "InvalidRetry", (what, info.history[0])
            assert problem in info.history[0]["message"], (what, info.history[0])


# --------------------------------------------------------------------------- Redis refusing


def _busy_for(url: str, seconds: float) -> threading.Thread:
    """Keep the server inside one script for ``seconds`` (everyone else gets BUSY)."""
    def run() -> None:
        client = redis.Redis.from_url(url)
        client.eval("local t = redis.call('TIME') local stop = t[1] * 1e6 + t[2] + ARGV[1] "
                    "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] >= stop", 0,
                    int(seconds * 1e6))
        client.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("fault", ["oom", "readonly", "busy", "noscript", "nofunction"])
async def test_redis_refusing_commands_never_stops_a_worker(
        own_server: RedisServer, queue_name: str, fault: str) -> None:
    """While Redis refuses commands (full under maxmemory, a read-only replica, busy in a long
    script, its script cache or its functions flushed) the worker backs off, logs the trouble
    once, and resumes: every job completes once."""
    url = own_server.url
    registry = Registry()

    @registry.handler(queue_name, concurrency=4)
    async def handler(job: Job) -> Any:
        await anyio.sleep(0.02)
        return job.data

    admin = redis.Redis.from_url(url)
    admin.config_set("busy-reply-threshold", 100)
    try:
        async with QueueClient(url) as client:
            queue = client.queue(queue_name)
            with capture_panqueue_logs() as logs:
                async with run_worker(registry, queue_name, url):
                    handles = [await queue.add(i) for i in range(40)]
                    await handles[5].result(timeout=10)
                    if fault == "oom":
                        used = int(admin.info("memory")["used_memory"])
                        admin.config_set("maxmemory-policy", "noeviction")
                        admin.config_set("maxmemory", used)
                        await anyio.sleep(1.5)
                        admin.config_set("maxmemory", 0)
                    elif fault == "readonly":
                        # A replica of a master that never answers: writes refused, data kept.
                        admin.execute_command("REPLICAOF", "127.0.0.1", "1")
                        await anyio.sleep(1.5)
                        admin.execute_command("REPLICAOF", "NO", "ONE")
                    elif fault == "busy":
                        await anyio.to_thread.run_sync(_busy_for(url, 1.5).join)
                    elif fault == "noscript":
                        admin.script_flush()
                    else:  # a restart without persistence, or a failover to a new server
                        admin.execute_command("FUNCTION", "FLUSH")
                    for i, handle in enumerate(handles):
                        assert await handle.result(timeout=20) == i
            counts = await client.counts(queue_name)
        assert counts[JobState.COMPLETED] == 40 and counts[JobState.FAILED] == 0
        warnings = [e for e in logs if e["log_level"] == "warning" and "failed;" in e["event"]]
        # Once per episode and activity, not once per call.
        assert len(warnings) <= 4, warnings
    finally:
        admin.close()


async def test_a_worker_started_while_redis_refuses_writes_waits_and_then_serves(
        own_server: RedisServer, queue_name: str) -> None:
    """A worker (re)started while the server is full under maxmemory does not die of the
    refused start: it logs the trouble once, waits, and serves once writes are taken again."""
    url = own_server.url
    registry = Registry()

    @registry.handler(queue_name)
    async def handler(job: Job) -> Any:
        return job.data

    admin = redis.Redis.from_url(url)
    try:
        async with QueueClient(url) as client:
            handle = await client.queue(queue_name).add(7)
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]))
            with capture_panqueue_logs() as logs:
                async def lift_when_refused() -> None:
                    async def refused() -> bool:
                        return any("starting the worker failed" in e["event"] for e in logs)
                    await async_wait_until(refused)
                    admin.config_set("maxmemory", 0)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(lift_when_refused)
                    async with run_worker(registry, queue_name, url):
                        assert await handle.result(timeout=10) == 7
            assert [e["event"] for e in logs if "starting the worker" in e["event"]] == [
                "starting the worker failed; retrying until Redis answers",
                "starting the worker works again"]
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()


async def test_a_start_that_reached_the_server_waits_out_a_lost_connection(
        proxy: FaultProxy, redis_url: str, queue_name: str) -> None:
    """The worker's start reaches a server that cannot serve (full under maxmemory), and then
    the connection breaks: the server was there a moment ago, so the start waits that out too
    and the worker serves once both are over."""
    registry = Registry()

    @registry.handler(queue_name)
    async def handler(job: Job) -> Any:
        return job.data

    admin = redis.Redis.from_url(redis_url)
    try:
        async with QueueClient(redis_url) as client:
            handle = await client.queue(queue_name).add(5)
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]))
            with capture_panqueue_logs() as logs:
                async def faults() -> None:
                    async def refused() -> bool:
                        return any("starting the worker failed" in e["event"] for e in logs)
                    await async_wait_until(refused)
                    proxy.cut()  # every connection through the proxy breaks, new ones fail
                    await anyio.sleep(0.3)  # some retries of the start meet the cut
                    proxy.restore()
                    admin.config_set("maxmemory", 0)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(faults)
                    async with run_worker(registry, queue_name, proxy.url):
                        assert await handle.result(timeout=15) == 5
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()


async def test_a_start_whose_first_connections_are_closed_waits_for_the_server(
        proxy: FaultProxy, redis_url: str, queue_name: str) -> None:
    """A worker (re)started while the server closes every new connection (a restart, a
    CLIENT KILL, a proxy in between that drops its links): its first step never gets an
    answer, yet the server is not unreachable for good. The start waits it out (one warning)
    and the worker serves once connections hold again."""
    registry = Registry()

    @registry.handler(queue_name)
    async def handler(job: Job) -> Any:
        return job.data

    async with QueueClient(redis_url) as client:
        handle = await client.queue(queue_name).add(9)
        proxy.cut()
        with capture_panqueue_logs() as logs:
            async def lift() -> None:
                async def refused() -> bool:
                    return any("starting the worker failed" in e["event"] for e in logs)
                await async_wait_until(refused)
                proxy.restore()

            async with anyio.create_task_group() as tg:
                tg.start_soon(lift)
                async with run_worker(registry, queue_name, proxy.url):
                    assert await handle.result(timeout=15) == 9


async def test_a_worker_stopped_while_its_start_waits_stops_cleanly(
        own_server: RedisServer, queue_name: str) -> None:
    """Stopped while its start waits for a full server: the worker returns without an error
    (the stop was asked for; the refusal is not a failure of it)."""
    from panqueue import Worker

    registry = Registry()

    @registry.handler(queue_name)
    async def handler(job: Job) -> Any:
        return job.data

    admin = redis.Redis.from_url(own_server.url)
    try:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]))
        worker = Worker(registry, queue_name, url=own_server.url)
        with capture_panqueue_logs() as logs:
            async def refused() -> bool:
                return any("starting the worker failed" in e["event"] for e in logs)

            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                await async_wait_until(refused)
                with anyio.fail_after(10):
                    await worker.shutdown()
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()


# --------------------------------------------------------------------------- reports, shutdown


async def test_progress_during_an_outage_does_not_fail_the_job(
        proxy: FaultProxy, redis_url: str, queue_name: str) -> None:
    registry = Registry()
    running = anyio.Event()
    cut = anyio.Event()
    reported = anyio.Event()

    @registry.handler(queue_name)
    async def handler(job: Job) -> str:
        running.set()
        await cut.wait()
        await job.progress(50)
        await job.log("half way")
        reported.set()
        return "done"

    async with QueueClient(redis_url) as client, \
            run_worker(registry, queue_name, proxy.url):
        handle = await client.queue(queue_name).add(None)
        await running.wait()
        proxy.cut()
        cut.set()
        await reported.wait()
        proxy.restore()
        assert await handle.result(timeout=10) == "done"


async def test_shutdown_is_bounded_when_the_network_drops_everything(
        proxy: FaultProxy, redis_url: str, queue_name: str) -> None:
    registry = Registry()
    running = anyio.Event()

    @registry.handler(queue_name)
    async def handler(job: Job) -> None:
        running.set()
        await anyio.sleep(60)

    async with QueueClient(redis_url) as client:
        await client.queue(queue_name).add(None)
    started = time.monotonic()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            from panqueue import Worker

            worker = Worker(registry, queue_name, url=proxy.url)
            await tg.start(worker.run)
            await running.wait()
            proxy.blackhole()
            started = time.monotonic()
            await worker.shutdown(grace=0.5)
    assert time.monotonic() - started < 0.5 + 9 + 1
    proxy.restore()


# The window between a completion and its batch being sent is one scheduler checkpoint; only
# asyncio's FIFO scheduling lets a test place the shutdown exactly there (trio randomises).
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_batch_gathered_before_shutdown_claims_nothing_after_it(
        redis_url: str, queue_name: str) -> None:
    """The shutdown begins while a completion waits to be sent with "claim the next job": the
    call that goes out after that claims nothing."""
    registry = Registry()
    worker_box: list[Any] = []

    @registry.handler(queue_name)
    async def handler(job: Job) -> str:
        if job.data == "first":
            async def stop() -> None:
                await worker_box[0].shutdown(grace=5)

            worker_box[1].start_soon(stop)  # runs while the completion gathers its batch
        return str(job.data)

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = await queue.add("first")
        second = await queue.add("second")
        async with anyio.create_task_group() as tg:
            from panqueue import Worker

            worker = Worker(registry, queue_name, url=redis_url)
            worker_box[:] = [worker, tg]
            await tg.start(worker.run)
        assert await first.result(timeout=5) == "first"
        info = await client.get_job(queue_name, second.id)
        assert info.state == JobState.WAITING and info.attempts == 0


def test_a_loop_blocked_for_good_stops_renewing_its_locks(redis_url: str, queue_name: str
                                                          ) -> None:
    """An inline handler blocks the event loop. The watchdog keeps the lock alive for a while
    (a slow handler is not a dead worker), then, past 10 lock TTLs, lets it go and says so, so
    that other workers can recover the job."""
    registry = Registry()
    lock_ttl = 0.2

    @registry.handler(queue_name, lock_ttl=lock_ttl)
    async def handler(job: Job) -> None:
        time.sleep(lock_ttl * 10 + 2.0)  # blocks the loop, past the bound

    keys = QueueKeys(queue_name)
    client = redis.Redis.from_url(redis_url)
    deadlines: list[tuple[float, float]] = []
    sampling = threading.Event()

    def sample() -> None:
        # From a thread: the test's event loop is the one being blocked.
        while not sampling.is_set():
            score = client.zscore(keys.active, "1")
            if score is not None:
                deadlines.append((time.monotonic(), score))
            time.sleep(0.05)

    async def main() -> None:
        async with QueueClient(redis_url) as producer, \
                run_worker(registry, queue_name, redis_url):
            await producer.queue(queue_name).add(None)  # the handler blocks the loop for 4 s
            await drain(redis_url, queue_name)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    with capture_panqueue_logs() as logs:
        anyio.run(main)
    sampling.set()
    thread.join()
    client.close()
    assert any("no longer renewing locks" in e["event"] for e in logs)
    start = deadlines[0][0]
    renewed_early = {score for t, score in deadlines if t - start < lock_ttl * 10 - 0.5}
    renewed_late = {score for t, score in deadlines if t - start > lock_ttl * 10 + 0.5}
    assert len(renewed_early) > 3  # renewed while blocked, within the bound
    assert len(renewed_late) <= 1  # then no more


async def test_jobs_taken_by_one_claim_all_keep_their_locks_while_they_run(
        redis_url: str, queue_name: str) -> None:
    """The jobs one claim takes share its token: renewal must keep every one of their locks
    (a lock is the job id with the token), so none is swept as stalled while it runs."""
    registry = Registry()

    @registry.handler(queue_name, concurrency=5, lock_ttl=0.6, max_stalls=0)
    async def handler(job: Job) -> Any:
        await anyio.sleep(1.5)  # well past the lock TTL: only renewals keep the locks
        return job.data

    async with QueueClient(redis_url) as client:
        handles = await client.queue(queue_name).add_bulk(list(range(5)))
        with capture_panqueue_logs() as logs:
            async with run_worker(registry, queue_name, redis_url):
                assert [await h.result(timeout=10) for h in handles] == list(range(5))
    for handle in handles:
        assert b"sc" not in job_hash(redis_url, queue_name, handle.id)  # never seen stalled
    assert not [e for e in logs if "lock lost" in e["event"]]
