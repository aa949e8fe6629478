"""Outages longer than every timeout of the runtime, and a server that drops idle clients.

A worker process on asyncio and one on trio (each serving a queue of its own) live through a
Redis that is stopped for longer than the connect timeout (5 s), the socket timeout (15 s), the
claim's bound (10 s), the queue's lock TTL (5 s here), the worker registry's entry (15 s) and
the wake-up subscription's health check (10 s). Once the server is back, each worker claims
again within 2 s, whatever the outage lasted (its retries back off to at most 1 s apart), and
its ``/healthz`` answers 200 only once it does. Every run has a 20 s outage; ``--long`` makes
it 5 minutes.

A server with ``timeout 1`` closes every connection idle for a second: an idle worker's pooled
connections and its wake-up subscription must survive that, and a job added after a long idle
spell is taken at once (through the hand-off or the wake-up, not the poll, which is 30 s here).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from panqueue import SyncQueueClient
from panqueue._log import get_logger
from panqueue._runtime.trouble import RETRY_CAP, Trouble
from panqueue.embedded import RedisServer
from tests.apps.outage_app import QUEUES
from tests.helpers import APPS, WorkerProcess, free_port, wait_until
from tests.test_cli_worker_health import get

BACKENDS = ("asyncio", "trio")
# The longest a worker may take to claim again once the server is back.
RESUME_WITHIN = 2.0


def _start_workers(tmp_path: Path, url: str, *extra: str) -> dict[str, tuple[WorkerProcess, int]]:
    """A worker process per backend, serving that backend's queue, each with /healthz."""
    workers = {}
    for backend, queue in zip(BACKENDS, QUEUES, strict=True):
        (tmp_path / backend).mkdir()
        port = free_port()
        workers[backend] = (WorkerProcess(
            tmp_path / backend, "--url", url, "-q", queue, "--backend", backend,
            "--health-port", str(port), "--log-format", "json", "--poll-interval", "30",
            *extra, app="outage_app:queues", path=APPS), port)
    return workers


def _log(worker: WorkerProcess) -> list[dict[str, Any]]:
    lines = []
    for line in worker.stderr.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            lines.append({"event": line})
    return lines


def _logged_at(worker: WorkerProcess, event: str) -> list[float]:
    """The wall-clock times of the worker's log lines ``event``."""
    return [datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()
            for line in _log(worker) if line.get("event") == event]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    running = RedisServer(directory=tmp_path / "redis").start()
    yield running
    running.cleanup()


def _each_worker_serves(workers: dict[str, tuple[WorkerProcess, int]], url: str,
                        data: str) -> None:
    """Every worker is ready (/healthz 200) and runs a job of its queue."""
    with SyncQueueClient(url) as client:
        for (_, port), queue in zip(workers.values(), QUEUES, strict=True):
            wait_until(lambda p=port: get(p)[0] == 200, 30, "/healthz to answer 200")
            assert client.queue(queue).add(data).result(timeout=10) == data


def _outage(server: RedisServer, tmp_path: Path, seconds: float) -> None:
    # Debug: each activity's recovery is a line of its own there (at info, the outage is one
    # line and its end another, for every activity of the process together).
    workers = _start_workers(tmp_path, server.url, "--log-level", "debug")
    try:
        _each_worker_serves(workers, server.url, "before")
        server.stop()
        down = time.monotonic()
        for _, port in workers.values():
            wait_until(lambda p=port: get(p)[0] == 503, 10, "/healthz to answer 503")
        # The outage lasts its time; the workers are checked as it does, not slept through.
        while time.monotonic() - down < seconds:
            for backend, (worker, port) in workers.items():
                assert worker.alive(), f"{backend}: {worker.stderr[-3000:]}"
                assert get(port)[0] == 503, backend
            time.sleep(0.5)
        server.start()
        back = time.monotonic()
        back_wall = time.time()
        ready: dict[str, float] = {}
        with SyncQueueClient(server.url) as client:
            handles = {backend: client.queue(queue).add("after")
                       for backend, queue in zip(BACKENDS, QUEUES, strict=True)}
            while len(ready) < len(workers) and time.monotonic() - back < 10:
                for backend, (_, port) in workers.items():
                    if backend not in ready and get(port)[0] == 200:
                        ready[backend] = time.time()
                time.sleep(0.02)
            for backend, handle in handles.items():
                worker = workers[backend][0]
                assert handle.result(timeout=10) == "after", worker.stderr[-3000:]
                claimed = time.monotonic() - back
                print(f"{backend}: the job added at the server's return ran after "
                      f"{claimed:.2f} s")
                assert claimed <= RESUME_WITHIN, (
                    f"{backend} took {claimed:.2f} s to run a job once Redis was back; "
                    f"{worker.stderr[-3000:]}")
        for backend, (worker, _) in workers.items():
            assert backend in ready, f"{backend} not ready 10 s after: {worker.stderr[-3000:]}"
            print(f"{backend}: /healthz 200 after {ready[backend] - back_wall:.2f} s")
            assert ready[backend] - back_wall <= RESUME_WITHIN, backend
            # Ready only once the claim loop claims again: its recovery is logged before.
            recovered = [t for t in _logged_at(worker, "claiming jobs works again")
                         if t >= back_wall - 0.1]
            assert recovered and recovered[0] <= ready[backend], (
                f"{backend} said ready before it claimed: {worker.stderr[-3000:]}")
            assert worker.alive(), worker.stderr[-3000:]
    finally:
        for worker, _ in workers.values():
            worker.kill()


@pytest.mark.timeout(480)
def test_workers_claim_again_within_2_s_of_redis_returning_from_an_outage(
        server: RedisServer, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """20 s in every run; with --long, 5 minutes."""
    _outage(server, tmp_path, 300.0 if request.config.getoption("--long") else 20.0)


def test_a_failing_call_is_retried_at_most_a_second_apart() -> None:
    """The back-off every retry loop of the runtime uses (claims, recordings, renewals, upkeep,
    the heartbeat, the start): short at first, then capped at 1 s however long the outage,
    so a worker tries within a second of Redis returning."""
    trouble = Trouble(get_logger("panqueue.worker"), "claiming jobs")
    schedule = []
    for _ in range(10_000):  # about 3 hours of retries
        trouble.failed(OSError("down"))
        schedule.append(trouble.backoff())
    assert schedule[0] <= 0.1
    assert schedule == sorted(schedule)
    assert max(schedule) == RETRY_CAP <= 1.0


def _clients(url: str) -> list[dict[str, Any]]:
    """CLIENT LIST, from a connection of its own."""
    with redis.Redis.from_url(url, decode_responses=True) as client:
        return list(client.client_list())


@pytest.mark.timeout(90)
def test_idle_workers_take_a_job_at_once_from_a_server_that_drops_idle_clients(
        tmp_path: Path) -> None:
    """``timeout 1``: the server closes the workers' idle pooled connections; the job added
    after that is still taken at once, by the worker idle longest (hand-off or wake-up: the
    poll interval is 30 s), on asyncio and on trio."""
    with RedisServer(directory=tmp_path / "redis", extra_args=("--timeout", "1")) as server:
        workers = _start_workers(tmp_path, server.url)
        try:
            _each_worker_serves(workers, server.url, "first")
            # The connections the workers' claims and completions used, idle now: wait until
            # the server has closed every one of them. (The health endpoint's connection
            # pings, and reads whether its queues are paused, every second.)
            idle = {c["id"] for c in _clients(server.url)
                    if "P" not in c["flags"]
                    and c["cmd"] not in ("ping", "hexists", "client|list")}
            assert idle
            wait_until(lambda: not idle & {c["id"] for c in _clients(server.url)}, 20,
                       "the server to close the idle connections")
            with SyncQueueClient(server.url) as client:
                for backend, queue in zip(BACKENDS, QUEUES, strict=True):
                    worker = workers[backend][0]
                    added = time.monotonic()
                    assert client.queue(queue).add("later").result(timeout=10) == "later", (
                        worker.stderr[-3000:])
                    took = time.monotonic() - added
                    print(f"{backend}: a job after the idle spell ran after {took:.2f} s")
                    assert took < 1.0, f"{backend} took {took:.2f} s: {worker.stderr[-3000:]}"
                    assert worker.alive(), worker.stderr[-3000:]
        finally:
            for worker, _ in workers.values():
                worker.kill()
