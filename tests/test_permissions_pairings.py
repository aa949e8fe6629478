"""Permissions where they meet the queue's other capabilities (issue 24): a sandboxed handler
under a job timeout, a cancel, retries, ``max_jobs_per_child``, progress and logs, the worker's
shutdown, ``Limits`` and a partitioned queue, through real workers and a real server, on asyncio
and trio.

What the confined child starts must end with it: a timeout, a cancel or a shutdown that ends the
child ends the processes it started too (the worker kills the child's process group), checked by
pid. Everything else checks that the capability still works for a confined handler, and that the
handler is still confined while it does (a read outside the grants is refused).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from panqueue import (
    Backoff,
    JobFailed,
    JobHandle,
    JobState,
    Limits,
    Permissions,
    QueueClient,
    Registry,
    SyncQueueClient,
)
from panqueue._keys import route
from panqueue._sandbox.probe import support
from panqueue.testing import run_worker
from tests.helpers import APPS, WorkerProcess, async_wait_until, wait_until

sys.path.insert(0, str(APPS))
import perm_pairs_app

pytestmark = pytest.mark.skipif(
    support().landlock_abi < 6, reason=f"this host cannot enforce permissions: "
                                       f"{'; '.join(support().missing())}")

FINAL = {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}


@pytest.fixture
def grants(tmp_path: Path) -> Iterator[Path]:
    """``in/`` holds the granted file; ``secret.txt`` is outside every grant."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "source.txt").write_text("granted\n")
    (tmp_path / "secret.txt").write_text("not granted\n")
    yield tmp_path


def read_grant(base: Path) -> Permissions:
    return Permissions(read=[str(base / "in")])


def paths(base: Path) -> dict[str, str]:
    return {"granted": str(base / "in" / "source.txt"), "denied": str(base / "secret.txt")}


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def assert_ended(pids: dict[str, int]) -> None:
    """The child and the process it started have ended (the worker ends both before it records
    the attempt's end, so a few seconds is ample)."""
    for role in ("child", "grandchild"):
        wait_until(functools.partial(gone, pids[role]), timeout=5,
                   what=f"the {role} ({pids[role]}) to end with the child {pids['child']}")


@contextlib.contextmanager
def killed_at_exit(pids: dict[str, int]) -> Iterator[None]:
    """A process the test fails to see end is killed, so no sleeper outlives the test."""
    try:
        yield
    finally:
        for pid in pids.values():
            if not gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


async def reported_pids(handle: JobHandle) -> dict[str, int]:
    """The pids ``perm_pairs_app.hold`` reports as progress once it runs."""
    async def reported() -> bool:
        info = await handle.info()
        if isinstance(info.progress, dict) and "child" in info.progress:
            return True
        assert info.state not in FINAL, f"the job ended before it reported its pids: {info}"
        return False

    await async_wait_until(reported, timeout=30, what="the handler to report its pids")
    progress: dict[str, int] = (await handle.info()).progress
    return progress


def holding_registry(queue: str, **options: Any) -> Registry:
    registry = Registry()
    registry.handler(queue, executor="subprocess", permissions=Permissions(processes=1),
                     **options)(perm_pairs_app.hold)
    return registry


# ----------------------------------------------------------------------------- ending the child


@pytest.mark.anyio
async def test_a_timed_out_sandboxed_job_ends_its_child_and_what_the_child_started(
        redis_url: str, queue_name: str) -> None:
    registry = holding_registry(queue_name, timeout=3)
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        held = await queue.add({"grandchild": True})
        pids = await reported_pids(held)
        with killed_at_exit(pids):
            with pytest.raises(JobFailed) as failed:
                await held.result(timeout=30)
            assert_ended(pids)
            # The worker goes on: the next job gets a fresh child and completes.
            assert await (await queue.add({"quick": True})).result(timeout=30) == "quick"
        info = await held.info()
    error = failed.value.error
    assert error is not None and error.type == "JobTimeout", error
    assert error.message == "attempt exceeded its timeout of 3 s"
    assert info.failure_reason == "timeout" and info.attempts == 1


@pytest.mark.anyio
async def test_a_cancelled_sandboxed_job_ends_its_child_and_what_the_child_started(
        redis_url: str, queue_name: str) -> None:
    registry = holding_registry(queue_name)
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        held = await queue.add({"grandchild": True})
        pids = await reported_pids(held)
        with killed_at_exit(pids):
            await client.cancel(queue_name, held.id)
            with pytest.raises(JobFailed):
                await held.result(timeout=30)
            assert_ended(pids)
            assert await (await queue.add({"quick": True})).result(timeout=30) == "quick"
        info = await held.info()
    assert info.state is JobState.CANCELLED and info.failure_reason == "cancelled", info


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sigterm_stops_a_sandboxed_job_that_polls_should_stop_and_leaves_no_process(
        tmp_path: Path, redis_url: str, backend: str) -> None:
    """``panqueue worker`` (a process of its own, so that the test can signal it): phase one of
    the shutdown makes ``job.should_stop()`` true in the confined child, the handler returns,
    and the worker exits 0 with neither the child nor the process it started left."""
    worker = WorkerProcess(tmp_path, "-q", "perm-pairs", "--url", redis_url,
                           "--backend", backend, app="perm_pairs_app:queues")
    pids: dict[str, int] = {}
    try:
        with SyncQueueClient(redis_url) as client:
            held = client.queue("perm-pairs").add({"grandchild": True, "poll": True})

            def reported() -> bool:
                info = held.info()
                assert info.state not in FINAL, info
                assert worker.alive(), worker.stderr
                return isinstance(info.progress, dict) and "child" in info.progress

            wait_until(reported, timeout=60, what="the handler to report its pids")
            pids.update(held.info().progress)
            with killed_at_exit(pids):
                assert worker.stop(timeout=30) == 0, worker.stderr
                info = held.info()
                assert_ended(pids)
    finally:
        worker.kill()
    assert info.state is JobState.COMPLETED and info.result == "stopped", info


# ----------------------------------------------------------------------------- still confined


@pytest.mark.anyio
async def test_a_denied_read_on_the_first_attempt_is_recorded_and_the_retry_completes(
        redis_url: str, queue_name: str, grants: Path) -> None:
    registry = Registry()
    registry.handler(queue_name, executor="subprocess", attempts=2, backoff=Backoff.fixed(0),
                     permissions=read_grant(grants))(perm_pairs_app.read_on_retry)
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add(paths(grants))
        assert await handle.result(timeout=30) == "granted\n"
        info = await handle.info()
    assert info.state is JobState.COMPLETED and info.attempts == 2, info
    [first] = info.history
    assert first["attempt"] == 1 and first["type"] == "PermissionError", first
    assert str(grants / "secret.txt") in first["message"], first


@pytest.mark.anyio
async def test_every_job_gets_a_fresh_confined_child_with_max_jobs_per_child_1(
        redis_url: str, queue_name: str, grants: Path) -> None:
    registry = Registry()
    registry.handler(queue_name, executor="subprocess", max_jobs_per_child=1,
                     permissions=read_grant(grants))(perm_pairs_app.try_denied)
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        results = [await (await queue.add(paths(grants))).result(timeout=30) for _ in range(3)]
    assert len({result["pid"] for result in results}) == 3, results
    assert all(result["raised"] == "PermissionError" for result in results), results
    assert os.getpid() not in {result["pid"] for result in results}


@pytest.mark.anyio
async def test_progress_and_logs_of_a_sandboxed_handler_reach_the_job(
        redis_url: str, queue_name: str, grants: Path) -> None:
    """The confined child holds no connection: its progress and log lines travel over its pipe
    to the worker, which records them."""
    registry = Registry()
    registry.handler(queue_name, executor="subprocess",
                     permissions=read_grant(grants))(perm_pairs_app.report)
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handle = await client.queue(queue_name).add(paths(grants))
        assert await handle.result(timeout=30) == "granted\n"
        info = await handle.info()
    assert info.progress == 100
    denied = str(grants / "secret.txt")
    assert info.logs == ["reading the granted file",
                         f"denied: [Errno 13] Permission denied: '{denied}'"], info.logs


@pytest.mark.anyio
async def test_limits_hold_a_sandboxed_child_memory_and_cpu_per_job(
        redis_url: str, queue_name: str) -> None:
    """Memory (the child's own setrlimit, before its rules) and CPU (set by the worker for each
    job with prlimit: the confined child may not) together with permissions."""
    registry = Registry()
    registry.handler(queue_name, executor="subprocess",
                     limits=Limits(memory_mb=256, cpu_seconds=1),
                     permissions=Permissions())(perm_pairs_app.consume)
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        assert await (await queue.add({"mb": 16})).result(timeout=30) == 16
        errors = []
        # The spin runs in the child of the job above (a budget from its start), the hog in the
        # fresh child that replaces it.
        for data in ({"spin": True}, {"mb": 512}):
            with pytest.raises(JobFailed) as failed:
                await (await queue.add(data)).result(timeout=30)
            errors.append(failed.value.error)
    cpu, memory = errors
    assert memory is not None and memory.message == "child exceeded memory limit 256 MB", memory
    assert cpu is not None and "child exceeded CPU limit 1 s (SIGXCPU)" in cpu.message, cpu


@pytest.mark.anyio
async def test_jobs_on_every_partition_run_confined(redis_url: str, queue_name: str,
                                                    grants: Path) -> None:
    registry = Registry()
    handler = registry.handler(queue_name, executor="subprocess", partitions=3, concurrency=2,
                               permissions=read_grant(grants))(perm_pairs_app.try_denied)
    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        handles = await client.queue(handler).add_bulk([paths(grants)] * 6)
        results = [await handle.result(timeout=30) for handle in handles]
    assert {route(3, handle.id) for handle in handles} == {0, 1, 2}
    assert all(result["raised"] == "PermissionError" for result in results), results
