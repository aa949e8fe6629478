"""What the command line tells an operator must never point the wrong way: `cancel` of a
finished job says it changed nothing, `dlq --retry` names each job it did not move and why,
and every hint names the command to type, not the Python call. The jobs are arranged on the
test's real server with the scripts a worker calls (tests/store_fixtures.py); each command
runs through ``panqueue.cli.main`` (tests/helpers.py ``run_cli``)."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from panqueue import JobState, SyncQueueClient
from tests.helpers import run_cli
from tests.store_fixtures import ScriptStore
from tests.test_cli import assert_user_error

MINUTE_MS = 60_000


def finished(store: ScriptStore, state: JobState) -> str:
    """A job of the store's queue that ended in ``state``, as a worker (or a cancel) ends it."""
    job_id = store.add_one()
    if state is JobState.CANCELLED:
        with SyncQueueClient(store.t.url) as client:
            client.cancel(store.keys.name, job_id)
        return job_id
    token = uuid.uuid4().hex
    assert store.claim(token) == [job_id]
    if state is JobState.COMPLETED:
        store.complete(job_id, token)
    else:
        store.fail(job_id, token)
    return job_id


def job_fields(store: ScriptStore, job_id: str) -> dict[bytes, bytes]:
    return store.redis.hgetall(store.keys.job(job_id))


def assert_exit_1(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert_user_error(proc, *fragments)
    assert proc.returncode == 1, proc


# --------------------------------------------------------------------------- cancel


@pytest.mark.parametrize("state", [JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED])
def test_cancel_of_a_finished_job_says_it_changed_nothing(
        redis_url: str, store: ScriptStore, state: JobState) -> None:
    job_id = finished(store, state)
    before = job_fields(store, job_id)
    proc = run_cli("cancel", store.keys.name, job_id, "--url", redis_url)
    assert_exit_1(proc, repr(job_id), f"already {state.value}", "nothing was cancelled")
    assert "cancelled (was" not in proc.stderr
    assert job_fields(store, job_id) == before


def test_cancel_of_an_unknown_job_is_one_line_exit_1(redis_url: str, store: ScriptStore) -> None:
    store.add_one()  # the queue exists; the job does not
    assert_exit_1(run_cli("cancel", store.keys.name, "no-such-job", "--url", redis_url),
                  "'no-such-job'", "not found")


# --------------------------------------------------------------------------- dlq --retry


def test_dlq_retry_of_an_unknown_id_names_it_and_moves_nothing(
        redis_url: str, store: ScriptStore) -> None:
    failed = finished(store, JobState.FAILED)
    proc = run_cli("dlq", store.keys.name, "--retry", "no-such-job", "--url", redis_url)
    assert_exit_1(proc, "'no-such-job'", "not retried", "not found")
    with SyncQueueClient(redis_url) as client:
        assert client.get_job(store.keys.name, failed).state is JobState.FAILED


@pytest.mark.parametrize("state", [JobState.WAITING, JobState.COMPLETED, JobState.CANCELLED])
def test_dlq_retry_of_a_job_that_did_not_fail_names_its_state(
        redis_url: str, store: ScriptStore, state: JobState) -> None:
    job_id = store.add_one() if state is JobState.WAITING else finished(store, state)
    before = job_fields(store, job_id)
    proc = run_cli("dlq", store.keys.name, "--retry", job_id, "--url", redis_url)
    assert_exit_1(proc, repr(job_id), "not retried", f"it is {state.value}, not failed")
    assert job_fields(store, job_id) == before


def test_dlq_retry_of_a_mix_moves_the_failed_and_names_each_other(
        redis_url: str, store: ScriptStore) -> None:
    failed = finished(store, JobState.FAILED)
    done = finished(store, JobState.COMPLETED)
    proc = run_cli("dlq", store.keys.name, "--retry", "no-such-job", failed, done,
                   "--url", redis_url)
    assert proc.returncode == 1, proc
    assert proc.stdout.strip() == "1 job(s) moved back to waiting"
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert len(lines) == 2, proc.stderr
    assert all(line.startswith("panqueue: error: ") for line in lines), lines
    assert "'no-such-job'" in lines[0] and "not found" in lines[0]
    assert repr(done) in lines[1] and "it is completed, not failed" in lines[1]
    with SyncQueueClient(redis_url) as client:
        assert client.get_job(store.keys.name, failed).state is JobState.WAITING
        assert client.get_job(store.keys.name, done).state is JobState.COMPLETED


def test_dlq_retry_of_a_job_whose_dependency_cannot_complete_says_why_it_stayed(
        redis_url: str, queue_name: str) -> None:
    """A failed job whose dependency was cancelled stays failed when retried (it would wait
    forever): "0 job(s) moved", exit 0, and nothing said of it. Now its line says why."""
    with SyncQueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        root = queue.add("root", delay=3600)
        dependent = queue.add("dependent", depends_on=[root.id])
        client.cancel(queue_name, root.id)
        assert client.get_job(queue_name, dependent.id).state is JobState.FAILED
    proc = run_cli("dlq", queue_name, "--retry", dependent.id, "--url", redis_url)
    assert proc.returncode == 1, proc
    assert proc.stdout.strip() == "0 job(s) moved back to waiting"
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"panqueue: error: job {dependent.id!r} not retried: ") and \
        f"dependency {root.id}" in line, line


# --------------------------------------------------------------------------- hints


def explain_cli(redis_url: str, queue: str, job_id: str) -> str:
    proc = run_cli("explain", queue, job_id, "--url", redis_url)
    assert proc.returncode == 0, proc.stderr
    assert "client." not in proc.stdout, proc.stdout
    return proc.stdout


def explain_api(redis_url: str, queue: str, job_id: str) -> str:
    with SyncQueueClient(redis_url) as client:
        return client.explain(queue, job_id).detail


def test_explain_of_a_paused_queue_names_panqueue_resume(redis_url: str,
                                                           store: ScriptStore) -> None:
    job_id = store.add_one()
    with SyncQueueClient(redis_url) as client:
        client.pause(store.keys.name)
    assert f"panqueue resume {store.keys.name}" in explain_cli(redis_url, store.keys.name, job_id)
    # The Python API's own words keep naming the Python call.
    assert "client.resume" in explain_api(redis_url, store.keys.name, job_id)


def test_explain_of_a_queue_paused_by_rate_limited_names_panqueue_resume(
        redis_url: str, store: ScriptStore) -> None:
    first, second = store.add(2)
    token = uuid.uuid4().hex
    assert store.claim(token) == [first]
    store.rate_limited(first, token, retry_after_ms=MINUTE_MS)
    shown = explain_cli(redis_url, store.keys.name, second)
    assert "RateLimited" in shown
    assert f"panqueue resume {store.keys.name} ends the pause now" in shown
    assert "client.resume" in explain_api(redis_url, store.keys.name, second)


def test_explain_of_a_failed_job_names_panqueue_dlq_retry(redis_url: str,
                                                            store: ScriptStore) -> None:
    job_id = finished(store, JobState.FAILED)
    shown = explain_cli(redis_url, store.keys.name, job_id)
    assert f"panqueue dlq {store.keys.name} --retry {job_id}" in shown
    assert "client.retry_failed" in explain_api(redis_url, store.keys.name, job_id)


def test_explain_of_a_batch_job_names_no_python_call(redis_url: str,
                                                     store: ScriptStore) -> None:
    with SyncQueueClient(redis_url) as client:
        batch = client.batch(on_complete=(store.keys.name, None))
        job_id = batch.add(store.keys.name, "in a batch").id
    shown = explain_cli(redis_url, store.keys.name, job_id)
    assert f"(a job of batch {batch.id})" in shown
    assert "client.batch" in explain_api(redis_url, store.keys.name, job_id)
