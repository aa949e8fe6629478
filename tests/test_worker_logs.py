"""Logs an on-call team can afford, read from the worker process's stderr: a retried attempt
is one INFO line, the final failure one ERROR line with the traceback, idle queues write no
summary lines, and a Redis outage is one line per process (and one when it ends), however
many queues and activities the process has."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from panqueue import JobFailed, SyncQueueClient
from panqueue._runtime.trouble import Episode, Trouble
from panqueue.embedded import RedisServer
from tests.apps.outage_app import PARTITIONED, QUEUES
from tests.helpers import APPS, ROOT, WorkerProcess, free_port, subprocess_env, wait_until
from tests.test_cli_worker_health import get


def _records(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_a_retried_attempt_is_one_info_line_and_the_final_failure_an_error_with_traceback(
        redis_url: str, tmp_path: Path) -> None:
    worker = WorkerProcess(tmp_path, "--url", redis_url, "-q", "hooks-flaky", "--log-format",
                           "json", "--poll-interval", "0.1", app="failure_hooks_app:queues",
                           env={"PANQUEUE_URL": redis_url})
    try:
        with SyncQueueClient(redis_url) as client:
            handle = client.queue("hooks-flaky").add("x")
            with pytest.raises(JobFailed):
                handle.result(timeout=20)
        assert worker.stop() == 0, worker.stderr
    finally:
        worker.kill()
    mine = [r for r in _records(worker.stderr) if r.get("job_id") == handle.id
            and not r["event"].startswith("on_failure")]
    assert [r["level"] for r in mine] == ["info", "error"], mine
    retried, failed = mine
    assert retried["event"] == ("job attempt 1 of 2 failed: ConnectionError: upstream "
                                "refused x; retry in 0.05 s"), retried
    assert "exception" not in retried  # no traceback for a retry
    assert (retried["error_type"], retried["attempt"], retried["max_attempts"],
            retried["retry_in_s"]) == ("ConnectionError", 1, 2, 0.05)
    assert failed["event"] == ("job failed on attempt 2 of 2 (max_attempts_exceeded): "
                               "ConnectionError: upstream refused x"), failed
    assert failed["exception"].startswith("Traceback (most recent call last)"), failed
    assert "ConnectionError: upstream refused x" in failed["exception"]


def test_a_worker_serving_idle_queues_writes_no_summary_lines(redis_url: str) -> None:
    """tests/apps/log_app.py idle: a pool of three queues with a summary every 50 ms stays
    idle for a second (about 60 summaries' worth), then runs one job."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "apps" / "log_app.py"), "idle",
                           redis_url], capture_output=True, text=True, timeout=60,
                          env=subprocess_env())
    assert done.returncode == 0, done.stderr
    records = _records(done.stderr)
    events = [r["event"] for r in records]
    idle_end = events.index("idle second over")
    assert "worker summary" not in events[:idle_end], events
    summaries = [r for r in records[idle_end:] if r["event"] == "worker summary"]
    # The job's queue says it once; the queues that stayed idle say nothing.
    assert [(r["queue"], r["processed"]) for r in summaries] == [("logged", 1)], summaries


def test_a_redis_outage_is_one_line_per_process_and_one_when_it_ends(tmp_path: Path) -> None:
    """One worker process serving three queues (one of them with three partitions): when
    Redis goes away, its claims, renewals, upkeep, heartbeats and wake-up channels all fail,
    and all of that is one warning; its end is one line with how long it lasted."""
    server = RedisServer(directory=tmp_path / "redis").start()
    port = free_port()
    worker = WorkerProcess(tmp_path, "--url", server.url, "--log-format", "json",
                           "--poll-interval", "0.2", "--health-port", str(port),
                           app="outage_app:queues", path=APPS)
    try:
        wait_until(lambda: get(port, "/readyz")[0] == 200, 30, "/readyz to answer 200")
        with SyncQueueClient(server.url) as client:
            for queue in (*QUEUES, PARTITIONED):
                assert client.queue(queue).add("before").result(timeout=10) == "before"
        server.stop()
        wait_until(lambda: "retrying until Redis answers" in worker.stderr, 10,
                   "the outage to be logged")
        # The first activity that fails may log before /readyz hears of it (its next PING,
        # up to a second away, or the claim loop's next failed call).
        wait_until(lambda: get(port, "/readyz")[0] == 503, 10, "/readyz to answer 503")
        # Every activity of every queue meets the outage (each retries at least once a
        # second): 3 s of it.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert worker.alive(), worker.stderr
            assert get(port, "/readyz")[0] == 503
            time.sleep(0.2)
        server.start()
        wait_until(lambda: "works again" in worker.stderr, 15,
                   "the end of the outage to be logged")
        with SyncQueueClient(server.url) as client:
            assert client.queue(QUEUES[0]).add("after").result(timeout=10) == "after"
    finally:
        worker.kill()
        server.cleanup()
    records = _records(worker.stderr)
    began = [r for r in records if r["event"].endswith("failed; retrying until Redis answers")
             and r["level"] == "warning"]
    ended = [r for r in records if r["event"].startswith("every Redis call works again")]
    assert len(began) == 1, [r["event"] for r in records]
    assert len(ended) == 1, [r["event"] for r in records]
    assert ended[0]["level"] == "info" and ended[0]["outage_s"] >= 3, ended
    assert ended[0]["failed_calls"] > len(began), ended
    # Nothing else from the outage above info: no line per queue, per activity, per channel.
    loud = [r for r in records if r["level"] in ("warning", "error")]
    assert loud == began, [r["event"] for r in loud]


class _Lines:
    """A logger that keeps (level, event) pairs."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event))


def test_an_activity_that_is_not_retried_neither_holds_an_episode_open_nor_hides_the_next(
        ) -> None:
    """A dropped progress report fails once and is never retried: it must not keep the
    episode open after the retried activities work again, nor keep the next outage from
    being logged."""
    log = _Lines()
    episode = Episode(stale=0.2)
    claims = Trouble(log, "claiming jobs", episode)
    reports = Trouble(log, "progress reporting", episode)
    claims.failed(OSError("down"))
    reports.failed(OSError("down"))
    claims.failed(OSError("down"))
    assert [level for level, _ in log.lines] == ["warning", "debug"]
    # The report is not retried; the claims are, more often than the stale time, and then
    # work again.
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        claims.failed(OSError("down"))
        time.sleep(0.05)
    claims.ok()
    assert [level for level, _ in log.lines] == ["warning", "debug", "debug", "info"], log.lines
    assert log.lines[-1][1].startswith("every Redis call works again after"), log.lines
    # The next outage is logged, whatever the report's Trouble still counts.
    del log.lines[:]
    claims.failed(OSError("down again"))
    assert log.lines == [("warning", "claiming jobs failed; retrying until Redis answers")]
