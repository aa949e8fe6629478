"""Durable steps across a crash: real worker processes killed with SIGKILL inside a step and
after it; another worker (on trio) recovers the job once its lock expires. A step whose run
was cut is at-least-once (it runs again: at most twice here); a stored step never runs again."""

from __future__ import annotations

import pytest
import redis

from panqueue import JobState, SyncQueueClient
from tests.helpers import wait_until
from tests.test_processes import Workers


@pytest.mark.parametrize("kill", ["inside", "after"])
def test_a_worker_killed_inside_or_after_a_step_runs_each_stored_step_once(
        redis_url: str, redis_client: redis.Redis, kill: str) -> None:
    with Workers(redis_url) as workers, SyncQueueClient(redis_url) as client:
        handle = client.queue("dur-crash").add({"kill": kill})
        first = workers.start("dur-crash", app="durable_proc_app:queues")
        wait_until(lambda: redis_client.llen(f"there:{handle.id}") == 1, timeout=30,
                   what=f"the job to get {kill} the step")
        first.kill()
        first.wait(10)
        second = workers.start("dur-crash", backend="trio", app="durable_proc_app:queues")
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
