"""The thread and subprocess executors: parallelism, isolation, limits, crashes, timeouts,
reporting, and the two-phase shutdown, on asyncio and trio."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    ConfigError,
    Executor,
    Job,
    JobFailed,
    JobState,
    Limits,
    QueueClient,
    Registry,
    Worker,
)
from panqueue.executors._child import FrameIO
from panqueue.executors.base import DONE, ReportKind
from panqueue.executors.subprocess import _BOOTSTRAP
from panqueue.testing import run_worker
from tests.helpers import APPS, async_wait_until, capture_panqueue_logs

sys.path.insert(0, str(APPS))
import exec_app

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def app_url(redis_url: str) -> Iterator[None]:
    os.environ["EXEC_APP_URL"] = redis_url
    yield
    os.environ.pop("EXEC_APP_URL", None)


async def add_and_wait(url: str, queue: str, data: Any = None, timeout: float = 20) -> Any:
    async with QueueClient(url) as client:
        handle = await client.queue(queue).add(data)
        return await handle.result(timeout=timeout)


async def failure_of(url: str, queue: str, data: Any = None) -> tuple[JobFailed, Any]:
    async with QueueClient(url) as client:
        handle = await client.queue(queue).add(data)
        with pytest.raises(JobFailed) as failed:
            await handle.result(timeout=30)
        return failed.value, await handle.info()


# ----------------------------------------------------------------------------- thread


async def test_thread_pool_runs_handlers_in_parallel(redis_url: str,
                                                     redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client, \
            run_worker(exec_app.queues, "t-parallel", redis_url):
        handles = await client.queue("t-parallel").add_bulk(list(range(8)))
        for handle in handles:
            await handle.result(timeout=20)
    assert int(redis_client.get("t-parallel:peak") or 0) == 4


async def test_thread_handler_reports_progress_and_logs(redis_url: str) -> None:
    async with QueueClient(redis_url) as client, run_worker(exec_app.queues, "t-report", redis_url):
        handle = await client.queue("t-report").add({})
        assert await handle.result(timeout=10) == "ok"
        info = await handle.info()
    assert info.progress == 40
    assert info.logs == ["from a thread"]


async def test_a_thread_handler_may_run_an_event_loop_of_its_own(redis_url: str) -> None:
    """The handler's thread gets the attempt's context variables, but for the one that says
    an event loop runs: with it, anyio.run in the handler refused ("Already running asyncio in
    this thread"), and a client made there picked the transport of the worker's loop."""
    registry = Registry()

    @registry.handler("t-own-loop", executor="thread")
    def own_loop(job: Job) -> str:
        async def inner() -> str:
            await anyio.sleep(0)
            return "ran"

        return anyio.run(inner)

    async with QueueClient(redis_url) as client, \
            run_worker(registry, "t-own-loop", redis_url):
        assert await (await client.queue("t-own-loop").add(None)).result(timeout=10) == "ran"


async def test_thread_timeout_fails_the_attempt(redis_url: str) -> None:
    async with run_worker(exec_app.queues, "t-timeout", redis_url):
        failed, info = await failure_of(redis_url, "t-timeout")
    assert info.failure_reason == "timeout"
    assert failed.error is not None and failed.error.type == "JobTimeout"


async def test_thread_stuck_past_grace_is_abandoned_and_its_job_released(
        redis_url: str, redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client:
        handle = await client.queue("t-stuck").add({})
        worker = Worker(exec_app.queues, "t-stuck", url=redis_url)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            await async_wait_until(_started(redis_client, "t-stuck:started"), what="job start")
            started = time.monotonic()
            await worker.shutdown(grace=0.2)
            assert time.monotonic() - started < 3  # does not wait for the sleeping thread
        info = await handle.info()
    assert info.state is JobState.WAITING
    assert info.attempts == 0


async def test_thread_handler_checking_should_stop_finishes_in_phase_one(
        redis_url: str, redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client:
        handle = await client.queue("t-cooperative").add({})
        worker = Worker(exec_app.queues, "t-cooperative", url=redis_url)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            await async_wait_until(_started(redis_client, "t-cooperative:started"),
                                   what="job start")
            await worker.shutdown(grace=10)
        info = await handle.info()
    assert info.state is JobState.COMPLETED
    assert info.result == "stopped cleanly"


# ----------------------------------------------------------------------------- subprocess


async def test_child_sees_only_allowed_environment_variables(redis_url: str) -> None:
    os.environ["PANQUEUE_TEST_SECRET"] = "hunter2"
    os.environ["PANQUEUE_VISIBLE"] = "yes"
    try:
        async with run_worker(exec_app.queues, "s-env", redis_url):
            result = await add_and_wait(redis_url, "s-env")
    finally:
        del os.environ["PANQUEUE_TEST_SECRET"], os.environ["PANQUEUE_VISIBLE"]
    assert result["secret"] is None
    assert result["visible"] == "yes"
    assert int(result["pid"]) != os.getpid()


async def test_child_reports_progress_and_logs_and_prints_do_not_break_it(
        redis_url: str) -> None:
    async with QueueClient(redis_url) as client, run_worker(exec_app.queues, "s-report", redis_url):
        handle = await client.queue("s-report").add({})
        pid = await handle.result(timeout=20)
        info = await handle.info()
    assert pid != os.getpid()
    assert info.progress == {"step": 1}
    assert info.logs == ["from a child"]


async def test_child_retry_and_fail_raised_from_an_error_record_that_error(
        redis_url: str) -> None:
    async with run_worker(exec_app.queues, "s-retry-from", redis_url):
        failed, info = await failure_of(redis_url, "s-retry-from")
    # As in a handler of the worker's own process: the error each signal was raised from.
    assert [(h["attempt"], h["type"], h["message"]) for h in info.history] == [
        (1, "KeyError", "'missing'"), (2, "ValueError", "bad input on attempt 2")]
    assert info.failure_reason == "explicit_fail"
    assert failed.error is not None and failed.error.type == "ValueError"
    assert "ValueError: bad input on attempt 2" in (failed.error.traceback or "")


async def test_child_over_its_memory_limit_fails_with_a_clear_error(redis_url: str) -> None:
    async with run_worker(exec_app.queues, "s-memory", redis_url):
        failed, _ = await failure_of(redis_url, "s-memory")
    assert failed.error is not None
    assert failed.error.type == "MemoryError"
    assert failed.error.message == "child exceeded memory limit 256 MB"


async def test_child_over_its_cpu_limit_is_killed_with_a_clear_error(redis_url: str) -> None:
    async with run_worker(exec_app.queues, "s-cpu-limit", redis_url):
        failed, _ = await failure_of(redis_url, "s-cpu-limit")
    assert failed.error is not None
    assert failed.error.type == "ChildCrashed"
    assert failed.error.message == "child exceeded CPU limit 1 s (SIGXCPU)"


async def test_child_crashes_fail_the_job_and_the_worker_carries_on(redis_url: str) -> None:
    async with run_worker(exec_app.queues, "s-crash", redis_url):
        failed, _ = await failure_of(redis_url, "s-crash", {"how": "exit"})
        assert failed.error is not None and failed.error.message == "child exited with code 3"
        failed, _ = await failure_of(redis_url, "s-crash", {"how": "kill"})
        assert failed.error is not None and failed.error.message == "child killed by SIGKILL"
        pid = await add_and_wait(redis_url, "s-crash", {"how": "fine"})
    assert isinstance(pid, int) and pid != os.getpid()


async def test_child_ignoring_sigterm_is_killed_after_grace_and_job_released(
        redis_url: str, redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client:
        handle = await client.queue("s-ignore-term").add({})
        worker = Worker(exec_app.queues, "s-ignore-term", url=redis_url)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            await async_wait_until(_started(redis_client, "s-ignore-term:started"),
                                   timeout=20, what="job start")
            child_pid = int(redis_client.lindex("s-ignore-term:started", 0) or 0)
            started = time.monotonic()
            await worker.shutdown(grace=0.3)
            # grace + SIGTERM grace (1 s) + a small bound
            assert time.monotonic() - started < 4
        info = await handle.info()
    assert info.state is JobState.WAITING
    assert not _pid_alive(child_pid)


async def test_child_checking_should_stop_finishes_in_phase_one(
        redis_url: str, redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client:
        handle = await client.queue("s-cooperative").add({})
        worker = Worker(exec_app.queues, "s-cooperative", url=redis_url)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            await async_wait_until(_started(redis_client, "s-cooperative:started"),
                                   timeout=20, what="job start")
            await worker.shutdown(grace=10)
        info = await handle.info()
    assert info.state is JobState.COMPLETED
    assert info.result == "stopped cleanly"


async def test_child_timeout_kills_the_child_and_fails_the_attempt(redis_url: str) -> None:
    # The handler sleeps ten minutes: a failure within failure_of's 30 s wait means the
    # child was killed (a wall-clock bound would also count the child's spawn, seconds
    # on a loaded machine, which the timeout rightly leaves out).
    async with run_worker(exec_app.queues, "s-timeout", redis_url):
        failed, info = await failure_of(redis_url, "s-timeout")
    assert info.failure_reason == "timeout"
    assert "timeout of 0.3 s" in str(failed)


async def test_children_are_recycled_after_max_jobs(redis_url: str) -> None:
    async with run_worker(exec_app.queues, "s-recycle", redis_url):
        pids = [await add_and_wait(redis_url, "s-recycle") for _ in range(5)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]


async def test_child_job_carries_its_options_and_enqueue_time(redis_url: str) -> None:
    async with QueueClient(redis_url) as client, \
            run_worker(exec_app.queues, "s-options", redis_url):
        handle = await client.queue("s-options").add({}, attempts=3, timeout=7.0)
        seen = await handle.result(timeout=20)
        info = await handle.info()
    assert seen["attempts"] == 3 and seen["timeout"] == 7.0
    assert info.enqueued_at is not None and seen["enqueued_at"] == info.enqueued_at.isoformat()


async def test_a_child_enqueues_through_a_handler_of_its_registry(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A subprocess child that imports the handlers has loaded no client; its first enqueue
    loads one, reading PANQUEUE_URL, and the job is added."""
    monkeypatch.setenv("PANQUEUE_URL", redis_url)
    async with QueueClient(redis_url) as client, \
            run_worker(exec_app.queues, "s-enqueue", redis_url):
        handle = await client.queue("s-enqueue").add({})
        seen = await handle.result(timeout=20)
        added = await client.get_job("s-enqueued", seen["id"])
    assert seen["loaded_before"] is False
    assert added.data["from"] != os.getpid()


async def test_async_handler_runs_in_a_child_too(redis_url: str) -> None:
    async with run_worker(exec_app.queues, "s-async", redis_url):
        assert await add_and_wait(redis_url, "s-async", 7) == "async in child 7"


def test_a_child_whose_worker_stopped_reading_exits_without_a_traceback() -> None:
    """A child whose worker is gone (killed, say) finds its pipe broken when it reports its job:
    it exits quietly instead of printing a traceback into the worker's log."""
    child = subprocess.Popen([sys.executable, "-c", _BOOTSTRAP, json.dumps([str(APPS)])],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        assert child.stdin is not None and child.stdout is not None
        frames = FrameIO(child.stdout, child.stdin)
        frames.write({"handler": "exec_app:child_env", "limits": {}})
        assert frames.read() == {"t": "ready", "pid": child.pid}
        child.stdout.close()  # the worker stops reading, as a killed one does
        frames.write({"t": "run", "id": "1", "queue": "s-env", "data": None, "attempt": 1,
                      "options": None, "enqueued_at": 0})
        _, stderr = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert b"Traceback" not in stderr, stderr.decode(errors="replace")
    assert child.returncode == 0


# ----------------------------------------------------------------------------- no false stalls


@pytest.mark.parametrize("queue", ["t-cpu", "s-cpu"])
async def test_cpu_bound_job_longer_than_its_lock_ttl_runs_exactly_once(
        redis_url: str, redis_client: redis.Redis, queue: str, anyio_backend: str) -> None:
    # 5 s of CPU with lock_ttl=2, well past the lock TTL: renewal must not depend on the
    # handler yielding. (The suite runs this on three Pythons: 10 s each burned 30 s more.)
    seconds = 5.0
    async with QueueClient(redis_url) as client, run_worker(exec_app.queues, queue, redis_url):
        handle = await client.queue(queue).add({"seconds": seconds})
        await handle.result(timeout=60)
        info = await handle.info()
    assert info.state is JobState.COMPLETED
    assert info.history == []  # never stalled
    assert redis_client.hget("cpu-runs", handle.id) == b"1"


# ----------------------------------------------------------------------------- registration


async def test_registration_errors_name_the_problem() -> None:
    registry = Registry()
    with pytest.raises(ConfigError, match="subprocess' only"):
        registry.handler("a", limits=Limits(memory_mb=64))(_async_noop)
    with pytest.raises(ConfigError, match="module-level function"):
        def nested(job: Job) -> None: ...
        registry.handler("b", executor="subprocess")(nested)
    with pytest.raises(ConfigError, match="cannot be imported again"):
        def script_level(job: Job) -> None: ...
        script_level.__module__ = "__main__"
        script_level.__qualname__ = "script_level"
        registry.handler("b2", executor="subprocess")(script_level)
    with pytest.raises(ConfigError, match="async; the thread executor"):
        registry.handler("c", executor="thread")(_async_noop)
    with pytest.raises(ConfigError, match="unknown executor 'warp'"):
        registry.handler("d", executor="warp")(_async_noop)
    with pytest.raises(ConfigError, match="memory_mb"):
        Limits(memory_mb=0)
    # A plain function without executor= gets the thread executor.
    handler = registry.handler("e")(_sync_noop)
    assert handler.options.executor is None


async def _async_noop(job: Job) -> None: ...


def _sync_noop(job: Job) -> None: ...


async def test_third_party_executor_is_selected_by_entry_point_name(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pq_plugin.py").write_text(
        "from panqueue import Executor\n"
        "class Doubling(Executor):\n"
        "    name = 'doubling'\n"
        "    async def run(self, job, timeout):\n"
        "        return 2 * await self.handler.fn(job)\n")
    dist = tmp_path / "pq_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pq-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[panqueue.executors]\ndoubling = pq_plugin:Doubling\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry()

    @registry.handler("plugged", executor="doubling")
    async def answer(job: Job) -> int:
        return 21

    async with run_worker(registry, "plugged", redis_url):
        assert await add_and_wait(redis_url, "plugged") == 42
    assert issubclass(type(Executor), type)


class _OwnThreadExecutor(Executor):
    """An executor written against the public contract alone (``panqueue.executors.base`` and
    the ``Job``'s public methods): it runs a plain handler in a thread of its own, on a view of
    the job whose reports it carries back to the event loop."""

    name = "own-thread"

    async def run(self, job: Job, timeout: float | None) -> Any:
        def sink(kind: ReportKind, value: Any) -> Awaitable[None]:  # in the handler's thread
            anyio.from_thread.run(_make_report, job, kind, value)
            return DONE

        view: Job = job.rebind(sink, job.should_stop)
        return await anyio.to_thread.run_sync(self.handler.fn, view)


async def _make_report(job: Job, kind: ReportKind, value: Any) -> None:
    await (job.progress(value) if kind == "p" else job.log(value))


async def test_an_executor_gives_a_handler_elsewhere_a_view_whose_reports_reach_the_job(
        redis_url: str) -> None:
    """What an executor needs to run a handler away from the event loop is public: the view
    (``job.rebind``), the sink's types, and the job's own ``progress`` / ``log`` to make the
    reports it carries back."""
    registry = Registry()

    @registry.handler("elsewhere", executor=_OwnThreadExecutor)
    def report(job: Job) -> Any:
        job.progress(50)
        job.log("half way")
        job.progress({"parts": 2})
        return {"thread": threading.current_thread().name, "enqueued_ms": job.enqueued_at_ms}

    async with run_worker(registry, "elsewhere", redis_url), QueueClient(redis_url) as client:
        handle = await client.queue("elsewhere").add(None)
        result = await handle.result(timeout=20)
        info = await handle.info()
    assert result["thread"] != threading.current_thread().name
    assert info.progress == {"parts": 2}
    assert info.logs == ["half way"]
    assert datetime.fromtimestamp(result["enqueued_ms"] / 1000, tz=UTC) == info.enqueued_at


# ----------------------------------------------------------------------------- helpers


def _started(client: redis.Redis, key: str) -> Any:
    async def check() -> bool:
        return bool(client.llen(key))

    return check


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not running either.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_inline_handler_blocking_the_loop_is_reported_and_keeps_its_lock(
        redis_url: str, redis_client: redis.Redis) -> None:
    registry = Registry()

    @registry.handler("blocking", lock_ttl=1)
    async def blocking(job: Job) -> str:
        redis_client.hincrby("runs", job.id, 1)
        time.sleep(3)  # blocks the event loop: lock renewal on the loop cannot run
        return "done"

    # Another "worker" sweeps for stalled jobs all along, from its own thread.
    sweeping = threading.Event()
    sweeps = 0

    def sweep() -> None:
        nonlocal sweeps
        from panqueue._keys import QueueKeys
        from panqueue._store.loader import SCRIPTS

        prefix = QueueKeys("blocking").prefix
        script = redis_client.register_script(SCRIPTS.stalled.body)
        while not sweeping.wait(0.1):
            script(keys=[prefix], args=[1, 1000, -1, b""])
            sweeps += 1

    sweeper = threading.Thread(target=sweep, daemon=True)
    with capture_panqueue_logs() as logs:
        sweeper.start()
        try:
            async with QueueClient(redis_url) as client, \
                    run_worker(registry, "blocking", redis_url):
                handle = await client.queue("blocking").add({})
                assert await handle.result(timeout=20) == "done"
                info = await handle.info()
        finally:
            sweeping.set()
            sweeper.join()
    assert sweeps > 10
    assert info.history == []  # never stalled
    assert redis_client.hget("runs", handle.id) == b"1"
    warnings = [e for e in logs if e["event"].startswith("handler is blocking the event loop")]
    assert warnings and "executor='thread'" in warnings[0]["event"]
    assert warnings[0]["handler"].endswith("blocking")


# ----------------------------------------------------------------------------- thread pool


def _thread_executor(fn: Any) -> Any:
    from panqueue.executors.thread import ThreadExecutor

    registry = Registry()
    return ThreadExecutor(registry.handler("pool", executor="thread")(fn))


def _job(data: Any = None) -> Job[Any]:
    from panqueue._options import JobOptions

    async def sink(kind: str, value: Any) -> None:
        return None

    return Job(id=f"j{data}", queue="pool", data=data, attempt=1, options=JobOptions(),
               sink=sink)


async def test_thread_burst_of_quick_jobs_runs_in_the_thread_already_busy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that finishes a job takes the next waiting one: a burst of quick jobs does not
    wake (or start) one thread per job. (Patience raised so that no job is handed to another
    thread for waiting: the count is then exact.)"""
    from panqueue.executors import _threadpool

    monkeypatch.setattr(_threadpool, "PATIENCE", 60.0)
    names: list[str] = []

    def quick(job: Job[Any]) -> int:
        names.append(threading.current_thread().name)
        return int(job.data)

    executor = _thread_executor(quick)
    results: list[int] = []

    async def one(i: int) -> None:
        results.append(await executor.run(_job(i), None))

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(one, i)
    await executor.aclose()
    assert sorted(results) == list(range(50))
    assert len(set(names)) == 1


async def test_thread_job_waiting_behind_a_blocking_job_gets_its_own_thread() -> None:
    """A job does not wait behind another job's blocking handler: within the executor's
    patience (a millisecond), it gets a thread of its own."""
    second_ran = threading.Event()

    def handler(job: Job[Any]) -> bool:
        if job.data == "first":
            return second_ran.wait(10)  # blocks until the second job has run
        second_ran.set()
        return True

    executor = _thread_executor(handler)
    results: dict[str, Any] = {}

    async def one(data: str) -> None:
        results[data] = await executor.run(_job(data), None)

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "first")
        tg.start_soon(one, "second")
    await executor.aclose()
    assert results == {"first": True, "second": True}
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("second_timeout", [None, 0.3])
async def test_a_job_run_again_waits_for_the_thread_its_abandoned_run_left_in_the_handler(
        second_timeout: float | None) -> None:
    """A run abandoned while its thread is in the handler (here: its timeout; a lost lock or a
    cancel abandon it the same way) leaves that thread running. The same job run again on
    this executor (its retry, or a claim after the lock was lost) starts its handler only once
    that thread has returned: one worker never runs a job twice at once. The wait counts
    towards the new run's timeout."""
    from panqueue.errors import JobTimeout

    release = threading.Event()
    second_started = threading.Event()
    first_returned = threading.Event()
    order: list[str] = []

    def handler(job: Job[Any]) -> str:
        if job.attempt == 1:
            order.append("first started")
            release.wait(30)  # ignores should_stop(), as much blocking code does
            order.append("first returned")
            first_returned.set()
            return "first"
        order.append("second started")
        second_started.set()
        return "second"

    executor = _thread_executor(handler)
    first = _job("x")
    with pytest.raises(JobTimeout):
        await executor.run(first, 0.1)
    again = Job(id=first.id, queue="pool", data="x", attempt=2, options=first.options,
                sink=first._sink)
    result: list[Any] = []

    async def second() -> None:
        try:
            result.append(await executor.run(again, second_timeout))
        except JobTimeout as exc:
            result.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        # Today's thread is still in the first run's handler: the second must not start.
        assert not await anyio.to_thread.run_sync(second_started.wait, 1.0)
        release.set()
    await executor.aclose()
    assert await anyio.to_thread.run_sync(first_returned.wait, 10.0)
    if second_timeout is None:
        assert result == ["second"]
        assert order == ["first started", "first returned", "second started"]
    else:  # it timed out while waiting, and its handler never ran
        assert isinstance(result[0], JobTimeout)
        assert order == ["first started", "first returned"]


async def test_thread_job_abandoned_before_a_thread_took_it_never_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose attempt ends (here: its timeout) while it still waits for a thread is
    dropped: its handler does not run later, and no thread is reported left behind."""
    from panqueue.errors import JobTimeout
    from panqueue.executors import _threadpool

    monkeypatch.setattr(_threadpool, "PATIENCE", 60.0)
    release = threading.Event()
    blocking = threading.Event()
    ran: list[str] = []

    def handler(job: Job[Any]) -> None:
        ran.append(job.data)
        if job.data == "blocking":
            blocking.set()
            release.wait(10)

    executor = _thread_executor(handler)
    reasons: list[str] = []
    executor.on_restart = reasons.append

    async def run_blocking() -> None:
        await executor.run(_job("blocking"), None)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_blocking)
        await anyio.to_thread.run_sync(blocking.wait)  # its thread is busy with it
        with pytest.raises(JobTimeout):
            await executor.run(_job("dropped"), 0.05)
        release.set()
    await executor.run(_job("after"), None)  # runs after "dropped" would have, in FIFO order
    await executor.aclose()
    assert ran == ["blocking", "after"]
    assert reasons == []


async def test_thread_back_from_an_abandoned_job_holds_up_no_job_behind_it() -> None:
    """A thread whose job was abandoned (its timeout) while the handler ran on comes back when
    the handler returns, and may take a waiting job then. The jobs still waiting behind that
    one get threads of their own within the patience, as behind any busy thread: they do not
    wait for the whole of its handler.

    The two jobs are handed to the pool in one round of the event loop while no thread is awake
    (they wait for the round's end), and the abandoned job's thread comes back before the round
    ends. The pool's calls are made by hand so that the round's end is in the test's control."""
    from panqueue.errors import JobTimeout
    from panqueue.executors.thread import _Call

    release_abandoned = threading.Event()
    first_started = threading.Event()
    second_started = threading.Event()
    threads: dict[str, str] = {}

    def handler(job: Job[Any]) -> Any:
        threads[job.data] = threading.current_thread().name
        if job.data == "abandoned":
            return release_abandoned.wait(10)
        if job.data == "first":
            first_started.set()
            return second_started.wait(5)  # blocks until the job behind it has started
        second_started.set()
        return True

    executor = _thread_executor(handler)
    with pytest.raises(JobTimeout):
        await executor.run(_job("abandoned"), 0.05)
    loop = executor._current_loop()
    calls = {data: _Call(handler, loop, _job(data)) for data in ("first", "second")}
    results: dict[str, Any] = {}
    waiting = [anyio.Event() for _ in calls]

    async def wait(call: _Call, ready: anyio.Event) -> None:
        loop.prepare(call)
        ready.set()  # no checkpoint between this and the wait: the task waits once seen ready
        await loop.wait(call)
        results[call.job.data if call.job else ""] = call.result()

    async with anyio.create_task_group() as tg:
        for call, ready in zip(calls.values(), waiting, strict=True):
            tg.start_soon(wait, call, ready)
        for ready in waiting:
            await ready.wait()
        # One round of the loop, not left until the abandoned thread has taken the first job.
        for call in calls.values():
            executor._pool.submit(call)
        release_abandoned.set()
        assert first_started.wait(5)
        started = time.monotonic()
    await executor.aclose()
    assert threads["first"] == threads["abandoned"]
    assert results == {"first": True, "second": True}
    assert time.monotonic() - started < 1


async def test_thread_result_is_delivered_while_its_thread_runs_a_long_next_job() -> None:
    """A thread that goes on with the next waiting job tells the event loop of the jobs it
    finished once it runs out of jobs, or within the executor's patience if the next job takes
    long: a finished job's attempt is not held up by the job after it."""
    first_delivered = threading.Event()
    lock = threading.Lock()
    ran: list[str] = []

    def handler(job: Job[Any]) -> Any:
        with lock:
            ran.append(job.data)
            first = len(ran) == 1
        if first:
            return "first"
        return first_delivered.wait(10)  # typically in the same thread, right after the first

    executor = _thread_executor(handler)
    results: list[Any] = []

    async def one(data: str) -> None:
        result = await executor.run(_job(data), None)
        if result == "first":
            first_delivered.set()
        results.append(result)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "a")
        tg.start_soon(one, "b")
    await executor.aclose()
    assert sorted(results, key=str) == [True, "first"]


async def test_thread_blocking_jobs_all_run_at_once() -> None:
    """Blocking jobs submitted together each get a thread: the last of them does not wait for
    the others to end (they cannot: each waits for all to have started)."""
    together = threading.Barrier(20)

    def handler(job: Job[Any]) -> int:
        together.wait(10)
        return int(job.data)

    executor = _thread_executor(handler)
    results: list[int] = []

    async def one(i: int) -> None:
        results.append(await executor.run(_job(i), None))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    await executor.aclose()
    assert sorted(results) == list(range(20))


async def test_thread_a_thread_the_system_refuses_fails_its_job_instead_of_hanging(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of threads (``can't start new thread``): the job handed to the thread that could not
    start fails with that error, wherever the pool starts it (at submission, at the end of the
    loop's round, from the watcher); it never waits for ever. The next job, once threads can
    start again, runs."""
    from panqueue.executors import _threadpool

    class _Refusing(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    class _NoThreads:
        Lock = threading.Lock
        Thread = _Refusing

    def handler(job: Job[Any]) -> Any:
        return job.data

    executor = _thread_executor(handler)
    monkeypatch.setattr(_threadpool, "threading", _NoThreads)
    with anyio.fail_after(10):
        with pytest.raises(RuntimeError, match="can't start new thread"):
            await executor.run(_job("refused"), None)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            await executor.run(_job("refused with a timeout"), 5.0)
    monkeypatch.setattr(_threadpool, "threading", threading)
    with anyio.fail_after(10):
        assert await executor.run(_job("after"), None) == "after"
    await executor.aclose()


@pytest.mark.parametrize(("frame", "problem"), [
    (struct.pack(">I", 256 << 20), "announced a frame of 268,435,456 bytes"),
    (struct.pack(">I", 3) + b"\xc1\xc1\xc1", "not msgpack"),
])
async def test_a_child_that_breaks_the_frame_protocol_is_killed_and_fails_its_job(
        redis_url: str, tmp_path: Path, frame: bytes, problem: str) -> None:
    """A handler (hostile code, in a child) writes on the frame pipe itself: a header that
    announced 256 MiB made the worker buffer them all, whatever its memory; bytes that are
    not msgpack failed the job with the decoder's words. The child is killed, its job fails
    naming why, and the worker goes on."""
    import importlib
    import uuid

    name = f"frame_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "import gc, time\n"
        "def handler(job):\n"
        "    frames = next(o for o in gc.get_objects() if type(o).__name__ == 'FrameIO')\n"
        "    with frames._write_lock:\n"
        f"        frames._writer.write({frame!r})\n"
        "        frames._writer.flush()\n"
        "    time.sleep(30)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module(name)
        registry = Registry()
        registry.handler("frames", executor="subprocess", attempts=1)(module.handler)
        async with QueueClient(redis_url) as client, \
                run_worker(registry, "frames", redis_url):
            handle = await client.queue("frames").add(None)
            with pytest.raises(JobFailed) as failed:
                await handle.result(timeout=20)
    finally:
        sys.path.remove(str(tmp_path))
    error = failed.value.error
    assert error is not None and error.type == "ChildCrashed" and problem in error.message
