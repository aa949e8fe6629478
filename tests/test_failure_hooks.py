"""``Registry.on_failure``: every failed attempt reaches the application's callbacks, sync and
async, with the job, the exception and whether it is final; a callback that raises is logged
and changes nothing. Run as a user runs it: ``panqueue worker`` as a child process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from panqueue import ConfigError, JobFailed, JobState, Registry, SyncQueueClient
from tests.helpers import WorkerProcess, wait_until


def _calls(redis_client: redis.Redis, key: str) -> list[list[object]]:
    return [json.loads(item) for item in redis_client.lrange(key, 0, -1)]


def _logged(worker: WorkerProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in worker.stderr.splitlines() if line.startswith("{")]


def _raised(logged: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logged if e["event"].startswith("on_failure callback raised")]


def test_each_failed_attempt_reaches_every_callback_and_one_that_raises_is_only_logged(
        redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    worker = WorkerProcess(tmp_path, "--url", redis_url, "--poll-interval", "0.1",
                           "--log-format", "json", app="failure_hooks_app:queues",
                           env={"PANQUEUE_URL": redis_url})
    try:
        with SyncQueueClient(redis_url) as client:
            flaky = client.queue("hooks-flaky").add("a")
            threaded = client.queue("hooks-thread").add("k")
            for handle in (flaky, threaded):
                with pytest.raises(JobFailed):
                    handle.result(timeout=20)
            wait_until(lambda: len(_calls(redis_client, "hooks:async")) == 3, 10,
                       "the async callback's three calls")
            # The raising callback comes after the async one: its third line may still be on
            # its way.
            wait_until(lambda: len(_raised(_logged(worker))) >= 3, 10,
                       "the raising callback's three log lines")
            # The callback that raises changed nothing: retried, then failed, as without it.
            assert client.get_job("hooks-flaky", flaky.id).state == JobState.FAILED
            assert client.get_job("hooks-flaky", flaky.id).attempts == 2
        assert worker.alive(), worker.stderr
    finally:
        worker.kill()
    sync = _calls(redis_client, "hooks:sync")
    assert sorted(map(tuple, sync)) == sorted([
        ("hooks-flaky", flaky.id, 1, "ConnectionError", "upstream refused a", False),
        ("hooks-flaky", flaky.id, 2, "ConnectionError", "upstream refused a", True),
        ("hooks-thread", threaded.id, 1, "KeyError", "'k'", True),
    ]), sync
    assert sorted(map(tuple, _calls(redis_client, "hooks:async"))) == sorted([
        (flaky.id, 1, False), (flaky.id, 2, True), (threaded.id, 1, True)])
    logged = _logged(worker)
    raised = _raised(logged)
    assert len(raised) == 3, logged
    assert {e["callback"] for e in raised} == {"broken"}
    assert all("ValueError: the error tracker is down" in e["error"] for e in raised), raised
    assert all(e["level"] == "error" for e in raised), raised


def test_a_chunk_handlers_failed_item_reaches_the_callbacks_with_its_own_job(
        redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    worker = WorkerProcess(tmp_path, "--url", redis_url, "-q", "hooks-chunk",
                           "--poll-interval", "0.1", app="failure_hooks_app:queues",
                           env={"PANQUEUE_URL": redis_url})
    try:
        with SyncQueueClient(redis_url) as client:
            handles = client.queue("hooks-chunk").add_bulk([1, -2, 3])
            assert handles[0].result(timeout=20) == 1
            with pytest.raises(JobFailed):
                handles[1].result(timeout=20)
            assert handles[2].result(timeout=20) == 3
            wait_until(lambda: _calls(redis_client, "hooks:async"), 10, "the async callback")
    finally:
        worker.kill()
    assert _calls(redis_client, "hooks:sync") == [
        ["hooks-chunk", handles[1].id, 1, "ValueError", "negative: -2", True]]


def test_a_durable_jobs_sleep_and_wait_are_no_failure_and_reach_no_callback(
        redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    """job.sleep and job.wait_for end an attempt (Suspended) without failing it: on_failure
    hears of neither, and a job with attempts=1 still completes."""
    worker = WorkerProcess(tmp_path, "--url", redis_url, "-q", "hooks-durable",
                           "--poll-interval", "0.1", app="failure_hooks_app:queues",
                           env={"PANQUEUE_URL": redis_url})
    try:
        with SyncQueueClient(redis_url) as client:
            handle = client.queue("hooks-durable").add(None)
            wait_until(lambda: client.get_job("hooks-durable", handle.id).waiting_for == "go",
                       20, "the job to wait for its signal")
            assert client.signal("hooks-durable", handle.id, "go", "now") is True
            assert handle.result(timeout=20) == {"first": 1, "go": "now"}
            history = client.get_job("hooks-durable", handle.id).history
        assert worker.alive(), worker.stderr
    finally:
        worker.kill()
    assert [entry.get("type") for entry in history].count("Suspended") == 2, history
    assert _calls(redis_client, "hooks:sync") == [] and _calls(redis_client, "hooks:async") == []
    assert "on_failure" not in worker.stderr


def test_on_failure_refuses_what_it_cannot_call() -> None:
    with pytest.raises(ConfigError, match="on_failure needs a callable"):
        Registry().on_failure("sentry")  # type: ignore[arg-type]
