"""Logs: silent in library mode, standard `logging` records, JSON lines on stderr."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT, subprocess_env


def run_app(mode: str, url: str) -> subprocess.CompletedProcess[str]:
    """tests/apps/log_app.py: an application embedding a WorkerPool (one job completes, one
    fails both attempts)."""
    return subprocess.run([sys.executable, str(ROOT / "tests" / "apps" / "log_app.py"), mode, url],
                          capture_output=True, text=True, timeout=60, env=subprocess_env())


def test_an_application_that_does_not_configure_logging_sees_nothing(redis_url: str) -> None:
    done = run_app("none", redis_url)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")


@pytest.mark.parametrize("mode", ["handlers", "handlers-trio"])
def test_a_worker_adds_no_handler_to_any_logger(mode: str, redis_url: str) -> None:
    """A library configures no logging of the application's: a worker (its wake-up channel
    included: redis-py's pub/sub, by default, gives a logger of its own a handler that writes to
    stderr) leaves every logger without a handler, as the application left them. On trio the
    channel is redis-py's sync pub/sub, in a thread."""
    done = run_app(mode, redis_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_an_application_with_logging_basic_config_gets_the_worker_records(redis_url: str
                                                                           ) -> None:
    done = run_app("basic", redis_url)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any(line.startswith("panqueue.worker INFO worker started") for line in lines)
    assert any(line.startswith("panqueue.worker INFO job attempt 1 of 2 failed: ValueError: "
                               "the payment service said no; retry in 0.01 s")
               for line in lines)
    failed = [line for line in lines if line.startswith("panqueue.worker ERROR job failed")]
    assert len(failed) == 1 and "job_id=" in failed[0]
    assert "ValueError: the payment service said no" in done.stderr  # the traceback follows
    assert any(line.startswith("panqueue.worker INFO worker summary") for line in lines)
    assert "job completed" not in done.stderr  # per-job lines are DEBUG
    assert done.stdout == ""


def test_json_logging_writes_only_json_lines_with_the_failure_traceback(redis_url: str) -> None:
    done = run_app("json", redis_url)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    events = [r["event"] for r in records]
    assert "SIGTERM received; finishing running jobs" in events  # the operator notice too
    assert events.count("job completed") == 1  # log_jobs=True
    retried = next(r for r in records if r["event"].startswith("job attempt 1 of 2 failed"))
    failed = next(r for r in records if r["event"].startswith("job failed"))
    for record in (retried, failed):
        assert record["error"] == "the payment service said no"
        assert record["logger"] == "panqueue.worker" and record["queue"] == "logged"
    # The traceback goes with the final failure only: a retry is one line.
    assert "exception" not in retried
    assert failed["exception"].startswith("Traceback (most recent call last)")
    assert "ValueError: the payment service said no" in failed["exception"]
    assert (retried["level"], failed["level"]) == ("info", "error")
    assert failed["attempt"] == 2 and failed["error_type"] == "ValueError"
    summaries = [r for r in records if r["event"] == "worker summary"]
    assert summaries and sum(r["processed"] for r in summaries) == 1
    assert sum(r["failed"] for r in summaries) == 1
    assert all({"processed", "failed", "rate", "timestamp"} <= r.keys() for r in summaries)
    assert done.stdout == ""
