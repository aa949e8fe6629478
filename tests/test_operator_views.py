"""What an operator sees of workers and jobs must be right, and must scale to many queues: a
killed worker is shown holding the job it held, one process is one row whatever number of
queues it serves, explain names the jobs that hold every slot and the retry a job waits for,
and each state's list shows the column that matters for it. Real worker processes
(``panqueue worker ops_app:queues``) on the test's server; the CLI runs as a child process."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from panqueue import ConfigError, JobState, SyncQueueClient
from tests.helpers import WorkerProcess, run_cli, wait_until

APP = "ops_app:queues"


@pytest.fixture
def start_ops_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``panqueue worker ops_app:queues ARGS`` processes, each killed at the end."""
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        home = tmp_path / f"worker-{len(started)}"
        home.mkdir()
        worker = WorkerProcess(home, *args, app=APP)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


def running(client: SyncQueueClient, queue: str, job_id: str) -> bool:
    return client.get_job(queue, job_id).state is JobState.ACTIVE


def cli_json(*args: str) -> object:
    proc = run_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# --------------------------------------------------------------------------- workers


def test_a_worker_killed_mid_job_is_shown_holding_its_job_until_its_entry_expires(
        redis_url: str, start_ops_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_ops_worker("-q", "ops-hold", "--url", redis_url)
    with SyncQueueClient(redis_url) as client:
        wait_until(lambda: client.workers("ops-hold"), timeout=30)
        job_id = client.queue("ops-hold").add("held").id
        wait_until(lambda: running(client, "ops-hold", job_id))
        # Killed at once: its last beat (at its start) was before the claim.
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()
        [info] = client.workers("ops-hold")
        assert info.running == [job_id]
    proc = run_cli("workers", "ops-hold", "--url", redis_url)
    assert proc.returncode == 0, proc.stderr
    assert "running 1/3" in proc.stdout, proc.stdout
    assert job_id in proc.stdout


def test_one_process_serving_many_queues_is_one_row(
        redis_url: str, start_ops_worker: Callable[..., WorkerProcess]) -> None:
    queues = [f"ops-many-{i}" for i in range(4)]
    serve = [arg for q in queues for arg in ("-q", q)]
    first = start_ops_worker(*serve, "--url", redis_url)
    second = start_ops_worker(*serve, "--url", redis_url)
    with SyncQueueClient(redis_url) as client:
        wait_until(lambda: len(client.workers()) == 8, timeout=30)
        # Per queue, as before: one WorkerInfo per Worker.
        assert len(client.workers("ops-many-0")) == 2
        processes = client.worker_processes()
    assert [p.pid for p in processes] == sorted(p.pid for p in processes)
    assert {p.pid for p in processes} == {first.process.pid, second.process.pid}
    for process in processes:
        assert process.queues == queues
        assert process.concurrency == 8  # two slots on each of four queues
        assert len(process.workers) == 4

    shown = cli_json("workers", "--url", redis_url)
    assert isinstance(shown, list) and len(shown) == 2, shown
    assert all(row["queues"] == queues for row in shown)
    proc = run_cli("workers", "--url", redis_url)
    assert len(proc.stdout.strip().splitlines()) == 2, proc.stdout
    info = cli_json("info", "--url", redis_url)
    assert isinstance(info, dict) and len(info["workers"]) == 2, info
    proc = run_cli("info", "--url", redis_url)
    assert "2 live worker process(es)" in proc.stdout, proc.stdout


# --------------------------------------------------------------------------- explain


def explain_cli(redis_url: str, queue: str, job_id: str) -> tuple[str, dict[str, object]]:
    """``panqueue explain`` as text, and as JSON."""
    proc = run_cli("explain", queue, job_id, "--url", redis_url)
    assert proc.returncode == 0, proc.stderr
    shown = cli_json("explain", queue, job_id, "--url", redis_url)
    assert isinstance(shown, dict)
    return proc.stdout, shown


def test_explain_of_a_job_waiting_for_a_slot_names_the_jobs_that_hold_them(
        redis_url: str, start_ops_worker: Callable[..., WorkerProcess]) -> None:
    start_ops_worker("-q", "ops-one", "--url", redis_url)
    with SyncQueueClient(redis_url) as client:
        wait_until(lambda: client.workers("ops-one"), timeout=30)
        holder = client.queue("ops-one").add("first").id
        wait_until(lambda: running(client, "ops-one", holder))
        waiting = client.queue("ops-one").add("second").id
        [worker] = client.workers("ops-one")
    text, shown = explain_cli(redis_url, "ops-one", waiting)
    assert "1 slot in all serves the queue, all of them taken, by " \
           f"job {holder} (running for " in text, text
    assert f"on {worker.name})" in text, text
    assert shown["reason"] == "queued"
    [held] = shown["holders"]  # type: ignore[misc]
    assert held["job_id"] == holder and held["worker"] == worker.name
    assert held["running_for"] >= 0


def test_explain_of_a_keyed_job_names_the_jobs_of_its_key_and_for_how_long(
        redis_url: str, start_ops_worker: Callable[..., WorkerProcess]) -> None:
    start_ops_worker("-q", "ops-keyed", "--url", redis_url)
    with SyncQueueClient(redis_url) as client:
        wait_until(lambda: client.workers("ops-keyed"), timeout=30)
        holder = client.queue("ops-keyed").add("first", key="tenant-a").id
        wait_until(lambda: running(client, "ops-keyed", holder))
        waiting = client.queue("ops-keyed").add("second", key="tenant-a").id
        [worker] = client.workers("ops-keyed")
    text, shown = explain_cli(redis_url, "ops-keyed", waiting)
    assert "key 'tenant-a' is at its concurrency limit (1): held by " \
           f"job {holder} (running for " in text, text
    assert f"on {worker.name})" in text, text
    assert [h["job_id"] for h in shown["holders"]] == [holder]  # type: ignore[attr-defined]


def test_explain_of_a_retry_waiting_out_its_backoff_names_the_attempt_and_the_error(
        redis_url: str, start_ops_worker: Callable[..., WorkerProcess]) -> None:
    start_ops_worker("-q", "ops-flaky", "--url", redis_url)
    with SyncQueueClient(redis_url) as client:
        job_id = client.queue("ops-flaky").add("x").id
        wait_until(lambda: client.get_job("ops-flaky", job_id).state is JobState.DELAYED,
                   timeout=30)
        info = client.get_job("ops-flaky", job_id)
    text, shown = explain_cli(redis_url, "ops-flaky", job_id)
    assert ("retry 2 of 3 after ConnectionError: db at 127.0.0.1:5432 refused 'x', "
            "due at ") in text, text
    assert shown["retry_of"] == 1 and shown["max_attempts"] == 3
    assert shown["due_at"] is not None and info.run_at is not None
    assert shown["due_at"] == info.run_at.isoformat()
    assert info.retry_of == 1 and info.max_attempts == 3
    assert info.error is not None and info.error.type == "ConnectionError"


# --------------------------------------------------------------------------- lists by state


def jobs_table(redis_url: str, queue: str, state: str) -> list[dict[str, str]]:
    """``panqueue jobs QUEUE --state STATE``: its heading and lines, as one dict per job."""
    proc = run_cli("jobs", queue, "--state", state, "--url", redis_url)
    assert proc.returncode == 0, proc.stderr
    heading, *lines = proc.stdout.rstrip("\n").split("\n")
    names = heading.split("\t")
    return [dict(zip(names, line.split("\t"), strict=True)) for line in lines]


def test_each_states_list_shows_the_column_that_matters_for_it(
        redis_url: str, start_ops_worker: Callable[..., WorkerProcess]) -> None:
    start_ops_worker("-q", "ops-flaky", "-q", "ops-one", "-q", "ops-fail", "--url", redis_url)
    with SyncQueueClient(redis_url) as client:
        retried = client.queue("ops-flaky").add("x").id
        later = client.queue("ops-flaky").add("later", delay=3600).id
        held = client.queue("ops-one").add("held").id
        failed = client.queue("ops-fail").add("bad").id
        wait_until(lambda: client.get_job("ops-flaky", retried).state is JobState.DELAYED
                   and running(client, "ops-one", held)
                   and client.get_job("ops-fail", failed).state is JobState.FAILED, timeout=30)
        due = {j.id: j.run_at for j in client.list_jobs("ops-flaky", "delayed")}
        [worker] = client.workers("ops-one")
        [active] = client.list_jobs("ops-one", "active")
    assert active.worker == worker.name and active.started_at is not None

    delayed = {row["id"]: row for row in jobs_table(redis_url, "ops-flaky", "delayed")}
    assert delayed[retried]["why"] == "retry 2 of 3 after ConnectionError"
    assert delayed[retried]["error"].startswith("ConnectionError: db at 127.0.0.1:5432")
    assert delayed[later]["why"] == "delayed by the producer"
    for job_id, row in delayed.items():
        when = due[job_id]
        assert when is not None and row["due"].startswith(when.strftime("%Y-%m-%d %H:%M:%S"))

    [row] = jobs_table(redis_url, "ops-one", "active")
    assert row["id"] == held and row["worker"] == worker.name
    assert row["started"] != "-" and row["running for"].endswith(" s")

    [row] = jobs_table(redis_url, "ops-fail", "failed")
    assert row["id"] == failed and row["error type"] == "ValueError"
    assert row["reason"] == "max_attempts_exceeded"
    assert row["message"] == "cannot parse 'bad'"


def test_explain_for_an_unknown_tool_is_one_clear_error(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        job_id = client.queue("ops-one").add("x").id
        with pytest.raises(ConfigError, match="tool must be 'python', 'cli' or 'dashboard', "
                                              "got 'web'"):
            client.explain("ops-one", job_id, tool="web")  # type: ignore[arg-type]
        # The words of each tool: the dashboard's never name a Python call.
        client.pause("ops-one")
        assert "client.resume" in client.explain("ops-one", job_id).detail
        assert "panqueue resume ops-one" in client.explain("ops-one", job_id, tool="cli").detail
        shown = client.explain("ops-one", job_id, tool="dashboard")
        assert "the Resume button below" in shown.detail and "client." not in shown.detail
        assert shown.action == "resume"
