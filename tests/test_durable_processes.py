"""Durable steps across a crash: real worker processes killed with SIGKILL inside a step and
after it; another worker (on trio) recovers the job once its lock expires. A step whose run
was cut is at-least-once (it runs again: at most twice here); a stored step never runs again."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import redis

from panqueue import JobState, SyncQueueClient
from tests.helpers import panqueue_command, subprocess_env, wait_until


class Workers:
    """Worker child processes started by one test; every one is killed by PID at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, backend: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(panqueue_command(
            "worker", "durable_proc_app:queues", "-q", "dur-crash", "--url", self.url,
            "--backend", backend, "--log-level", "warning"),
            env=subprocess_env(PANQUEUE_URL=self.url), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, text=True)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def workers(redis_url: str) -> Iterator[Workers]:
    group = Workers(redis_url)
    try:
        yield group
    finally:
        group.stop_all()


@pytest.mark.parametrize("kill", ["inside", "after"])
def test_a_worker_killed_inside_or_after_a_step_runs_each_stored_step_once(
        redis_url: str, workers: Workers, redis_client: redis.Redis, kill: str) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue("dur-crash").add({"kill": kill})
        first = workers.start("asyncio")
        wait_until(lambda: redis_client.llen(f"there:{handle.id}") == 1, timeout=30,
                   what=f"the job to get {kill} the step")
        first.kill()
        first.wait(10)
        second = workers.start("trio")
        result = handle.result(timeout=30)
        info = handle.info()
    charged = int(redis_client.get(f"runs:{handle.id}:charge") or 0)
    shipped = int(redis_client.get(f"runs:{handle.id}:ship") or 0)
    assert info.state is JobState.COMPLETED and result["pid"] == second.pid
    if kill == "inside":
        # Cut inside "charge": nothing was stored, so the recovery ran it again.
        assert charged == 2 and result["charged"] == 2
    else:
        # Cut after "charge" was stored: the recovery got its result back without running it.
        assert charged == 1 and result["charged"] == 1
    assert shipped == 1 and info.steps == {"charge": result["charged"], "ship": 1}
