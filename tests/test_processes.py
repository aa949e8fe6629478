"""Real worker processes: crashes, shutdown signals, several workers sharing a queue."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from panqueue import JobState, SyncQueueClient
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue.errors import TimeoutError as PanqueueTimeoutError
from panqueue.testing import FaultProxy
from tests.helpers import call_of, panqueue_command, subprocess_env, wait_until


class Workers:
    """Worker child processes started by one test; every one is stopped by PID at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *queues: str, backend: str = "asyncio", extra: tuple[str, ...] = (),
              app: str = "proc_app:queues") -> subprocess.Popen[str]:
        args = ["worker", app, "--url", self.url, "--backend", backend,
                "--log-level", "warning", *extra]
        for queue in queues:
            args += ["-q", queue]
        proc = subprocess.Popen(panqueue_command(*args), env=subprocess_env(
            PANQUEUE_URL=self.url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


@pytest.fixture
def workers(redis_url: str) -> Iterator[Workers]:
    with Workers(redis_url) as group:
        yield group


def test_job_of_a_killed_worker_is_completed_by_another_after_its_lock_expires(
        redis_url: str, workers: Workers, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue("crashy").add({"n": 1})
        first = workers.start("crashy")
        wait_until(lambda: redis_client.llen(f"started:{handle.id}") == 1, timeout=20,
                   what="the first worker to start the job")
        assert handle.info().state is JobState.ACTIVE
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = workers.start("crashy", backend="trio")
        result = handle.result(timeout=30)
        assert result == {"pid": second.pid}
        info = handle.info()
        assert info.state is JobState.COMPLETED
        assert info.attempts == 1  # the stalled run does not count as an attempt
        assert [h["type"] for h in info.history] == ["Stalled"]
        started = [int(p) for p in redis_client.lrange(f"started:{handle.id}", 0, -1)]
        assert started == [first.pid, second.pid]


def test_three_worker_processes_complete_500_jobs_exactly_once(
        redis_url: str, workers: Workers, redis_client: redis.Redis) -> None:
    procs = [workers.start("shared"), workers.start("shared", backend="trio"),
             workers.start("shared")]
    # All three listen before the jobs arrive, so all three compete for them from the start.
    notify = QueueKeys("shared").notify
    wait_until(lambda: redis_client.pubsub_shardnumsub(notify)[0][1] == 3, timeout=30,
               what="three subscribed workers")
    with SyncQueueClient(redis_url) as client:
        handles = client.queue("shared").add_bulk([{"i": i} for i in range(500)])
        pids = [handle.result(timeout=60) for handle in handles]
        counts = client.counts("shared")
    executions = {k.decode(): int(v) for k, v in redis_client.hgetall("executions").items()}
    assert len(executions) == 500
    assert set(executions.values()) == {1}
    assert counts[JobState.COMPLETED] == 500
    assert counts[JobState.ACTIVE] == counts[JobState.WAITING] == 0
    # The work was shared: every process ran some of it.
    assert {p.pid for p in procs} == set(pids)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(30) for proc in procs] == [0, 0, 0]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sigterm_lets_the_running_job_finish_and_exits_0(
        redis_url: str, workers: Workers, redis_client: redis.Redis, backend: str) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue("graceful").add({"seconds": 1.0})
        proc = workers.start("graceful", backend=backend, extra=("--grace", "20"))
        wait_until(lambda: redis_client.llen(f"started:{handle.id}") == 1, timeout=20,
                   what="the job to start")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        info = handle.info()
        assert info.state is JobState.COMPLETED
        assert info.result == "finished"
        _, stderr = proc.communicate()
        assert "SIGTERM received" in stderr
        assert "Traceback" not in stderr


def test_second_signal_forces_shutdown_and_releases_the_job(
        redis_url: str, workers: Workers, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue("graceful").add({"seconds": 60})
        proc = workers.start("graceful", extra=("--grace", "60"))
        wait_until(lambda: redis_client.llen(f"started:{handle.id}") == 1, timeout=20,
                   what="the job to start")
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: b"SIGTERM received" in _peek_stderr(proc), timeout=10,
                   what="the first signal to be handled")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
        info = handle.info()
        assert info.state is JobState.WAITING  # released at once, not after lock expiry
        assert info.attempts == 0


def _peek_stderr(proc: subprocess.Popen[str]) -> bytes:
    """Read what the child has written to stderr so far (non-blocking)."""
    import os

    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    os.set_blocking(fd, False)
    chunk = os.read(fd, 65536) if _readable(fd) else b""
    proc._peeked = getattr(proc, "_peeked", b"") + chunk  # type: ignore[attr-defined]
    return proc._peeked  # type: ignore[attr-defined,no-any-return]


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


def test_a_stuck_thread_handler_does_not_keep_the_worker_process_alive(
        redis_url: str, workers: Workers, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue("stuck-thread").add({})
        proc = workers.start("stuck-thread", extra=("--grace", "0.3"))
        wait_until(lambda: redis_client.llen(f"started:{handle.id}") == 1, timeout=20,
                   what="the job to start")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0  # the sleeping daemon thread is abandoned, not waited for
        info = handle.info()
    assert info.state is JobState.WAITING and info.attempts == 0


def test_a_chain_completes_in_order_across_two_worker_processes(
        redis_url: str, workers: Workers, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        chain = client.queue("chained").add_chain([str(n) for n in range(12)])
        workers.start("chained")
        workers.start("chained", backend="trio")
        assert [h.result(timeout=60) for h in chain] == list(range(12))
    order = [int(v) for v in redis_client.lrange("chain-order", 0, -1)]
    assert order == list(range(12))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_shutdown_under_a_network_that_drops_everything_exits_within_its_bound(
        redis_url: str, redis_client: redis.Redis, backend: str) -> None:
    """The worker reaches Redis through a proxy that starts dropping every packet while a job
    runs and a claim for its free slot is on its way; SIGTERM must end the process within
    ``--grace`` + 9 s (docs/operations.md), however many Redis calls the shutdown makes."""
    grace = 1.0
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with SyncQueueClient(redis_url) as client, FaultProxy(port) as proxy:
        handle = client.queue("graceful").add({"seconds": 60})
        proc = subprocess.Popen(
            panqueue_command("worker", "proc_app:queues", "--url", proxy.url, "-q", "graceful",
                             "--backend", backend, "--grace", str(grace), "--concurrency", "2",
                             "--poll-interval", "0.2", "--log-level", "warning"),
            env=subprocess_env(PANQUEUE_URL=redis_url), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: redis_client.llen(f"started:{handle.id}") == 1, timeout=20,
                       what="the job to start")
            # A claim whose request passed just before the blackhole waits for its reply and
            # sends no other (slow replies on a busy machine make that likelier): let it
            # through and blackhole again until a claim request itself is held.
            for attempt in range(10):
                proxy.blackhole()
                try:
                    proxy.wait_for_held_requests(1, timeout=2, match=call_of(SCRIPTS.claim))
                    break
                except PanqueueTimeoutError:
                    if attempt == 9:
                        raise
                    proxy.restore()
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(grace + 30)
            took = time.monotonic() - signalled
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
    assert code == 0, stderr
    assert took < grace + 9, f"shutdown took {took:.1f} s\n{stderr}"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_cancel_acts_only_on_the_run_of_the_job_it_was_for(
        redis_url: str, workers: Workers, redis_client: redis.Redis, backend: str) -> None:
    """Every worker of a queue hears a cancel, and an idle one keeps it for a while in case
    its claim of that job is still on its way. That kept cancel is for the run it was made
    for: the job removed and added again under the same id, then handed to the idle worker,
    is a new job, and it runs."""
    keys = QueueKeys("cancellable")
    with SyncQueueClient(redis_url) as client:
        queue = client.queue("cancellable")
        first = queue.add({"hold": True}, job_id="nightly")
        busy = workers.start("cancellable", backend=backend)
        wait_until(lambda: redis_client.llen("started:nightly") == 1, timeout=20,
                   what="the first run to start")
        # The idle worker: a long poll interval keeps the registration it makes now (the
        # next add is handed to it) instead of claiming again meanwhile.
        workers.start("cancellable", backend=backend, extra=("--poll-interval", "60"))
        wait_until(lambda: redis_client.zcard(keys.idle) == 1, timeout=20,
                   what="the second worker to wait idle")
        assert client.cancel("cancellable", "nightly") is JobState.ACTIVE
        wait_until(lambda: first.info().state is JobState.CANCELLED, timeout=10,
                   what="the first run to end cancelled")
        busy.send_signal(signal.SIGTERM)
        assert busy.wait(30) == 0
        assert client.remove("cancellable", "nightly")
        again = queue.add({"hold": False}, job_id="nightly")
        idle_pid = again.result(timeout=20)
        assert redis_client.lrange("started:nightly", 0, -1) == [
            str(busy.pid).encode(), str(idle_pid).encode()]


# A worker whose inline handler blocks its event loop (time.sleep) for the job's data in
# seconds; its registry entry lives 3 x 0.3 s after a beat.
_BLOCKING_WORKER = """
import sys, time
import anyio, redis
from panqueue import Job, Registry, Worker

url, queue, backend = sys.argv[1], sys.argv[2], sys.argv[3]
marks = redis.Redis.from_url(url)
registry = Registry()

@registry.handler(queue)
async def blocks(job: Job) -> str:
    marks.set("blocking", 1)
    time.sleep(job.data)
    marks.set("unblocked", 1)
    return "done"

anyio.run(Worker(registry, queue, url=url, name="blocker", heartbeat_interval=0.3).run,
          backend=backend)
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_worker_whose_handler_blocks_its_loop_stays_listed_and_explained(
        redis_url: str, redis_client: redis.Redis, queue_name: str, backend: str) -> None:
    """While a handler blocks the worker's event loop, the watchdog thread that keeps the
    job's lock alive keeps the worker's registry entry alive too, marked as blocked: the
    worker is not dead, and explain says where the job runs and why nothing moves."""
    entry_ttl = 3 * 0.3
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKING_WORKER, redis_url, queue_name, backend],
        env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with SyncQueueClient(redis_url) as client:
            handle = client.queue(queue_name).add(4 * entry_ttl)
            wait_until(lambda: redis_client.get("blocking"), timeout=20,
                       what="the handler to block the loop")
            blocked_at = time.monotonic()
            waiting = client.queue(queue_name).add(0)  # no claim takes it while blocked
            samples_past_the_ttl = 0
            while True:
                sampled_at = time.monotonic()
                listed = client.workers(queue_name)
                why = client.explain(queue_name, handle.id)
                why_waiting = client.explain(queue_name, waiting.id)
                if redis_client.get("unblocked"):
                    break  # these samples may be from after the loop came back
                assert [w.name for w in listed] == ["blocker"], why.detail
                assert why.reason == "running" and "on worker blocker" in why.detail, why
                if sampled_at - blocked_at > entry_ttl:
                    samples_past_the_ttl += 1
                    assert listed[0].running == [handle.id]
                    assert listed[0].loop_blocked_since is not None
                    assert "event loop has been blocked since" in why.detail, why.detail
                    assert why_waiting.reason == "queued", why_waiting
                    assert "event loop of its worker has been blocked since" in \
                        why_waiting.detail, why_waiting.detail
                time.sleep(0.05)  # the sampling period
            assert samples_past_the_ttl > 10
            assert handle.result(timeout=10) == "done"
            assert waiting.result(timeout=10) == "done"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_watchdog_of_a_process_serving_two_queues_names_only_the_blocking_handler(
        redis_url: str, redis_client: redis.Redis, backend: str) -> None:
    """One worker process, two queues on one event loop: a handler that blocks it
    (time.sleep) and one that awaits. Both workers' jobs are starved, but only the blocking
    handler is named, and a line says when the blockage ended and how long it lasted."""
    proc = subprocess.Popen(panqueue_command(
        "worker", "blocking_app:queues", "-q", "blocks", "-q", "awaits", "--url", redis_url,
        "--backend", backend, "--log-level", "warning", "--log-format", "json"),
        env=subprocess_env(PANQUEUE_URL=redis_url), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        lines.extend(proc.stderr)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def logged() -> list[dict[str, object]]:
        return [json.loads(line) for line in list(lines) if line.startswith("{")]

    def ended() -> bool:
        return any(str(e["event"]).startswith("handler no longer blocks the event loop")
                   for e in logged())

    try:
        with SyncQueueClient(redis_url) as client:
            client.queue("awaits").add(10)
            wait_until(lambda: redis_client.get("started:awaits"), timeout=20,
                       what="the awaiting handler to start")
            blocking = client.queue("blocks").add(3)
            assert blocking.result(timeout=20) == "blocked"
            wait_until(ended, timeout=10, what="the end of the blockage to be logged")
    finally:
        proc.kill()
        proc.wait(10)
        reader.join(10)
    events = logged()
    blamed = [e for e in events if str(e["event"]).startswith("handler is blocking")]
    assert [e["handler"] for e in blamed] == ["blocking_app:blocks"], events
    assert "blocking_app.py" in str(blamed[0]["at"]), blamed
    over = [e for e in events if str(e["event"]).startswith("handler no longer blocks")]
    assert [e["handler"] for e in over] == ["blocking_app:blocks"], events
    assert "ended after" in str(over[0]["event"])
    assert 2.5 <= float(str(over[0]["blocked_s"])) <= 3.5, over
