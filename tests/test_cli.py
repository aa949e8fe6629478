"""The ``panqueue`` command line against the session server: the worker, server and demo as real
child processes, the commands that only talk to Redis in the test's process (``run_cli``).

Every user mistake (bad MODULE:ATTR, unreachable Redis, unknown queue or job, invalid JSON) must
end with one ``panqueue: error: ...`` line on stderr, no traceback and a non-zero exit code.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from panqueue import JobFailed, JobState, SyncQueueClient
from tests.helpers import (
    ROOT,
    WorkerProcess,
    free_port,
    panqueue_command,
    run_cli,
    script_calls,
    subprocess_env,
    wait_until,
)

ECHO = "cli-echo"
FAIL = "cli-fail"


def assert_user_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """One clear line on stderr, no traceback, nothing on stdout, a non-zero exit."""
    assert proc.returncode != 0, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("panqueue: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert proc.stdout == ""


def counts(url: str, queue: str) -> dict[JobState, int]:
    with SyncQueueClient(url) as client:
        return client.counts(queue)


# --------------------------------------------------------------------------- enqueue


def test_enqueue_prints_the_job_id_and_stores_the_job(redis_url: str) -> None:
    first = run_cli("enqueue", ECHO, '{"to": "a@example.com", "n": [1, 2]}', "--url", redis_url)
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.strip()
    assert job_id and first.stdout == job_id + "\n"

    delayed = run_cli("enqueue", ECHO, "7", "--url", redis_url, "--delay", "60",
                      "--priority", "5", "--job-id", "welcome-b")
    assert delayed.returncode == 0, delayed.stderr
    assert delayed.stdout.strip() == "welcome-b"
    again = run_cli("enqueue", ECHO, '"other"', "--url", redis_url, "--job-id", "welcome-b")
    assert again.returncode == 0 and again.stdout.strip() == "welcome-b"

    with SyncQueueClient(redis_url) as client:
        info = client.get_job(ECHO, job_id)
        assert info.state is JobState.WAITING
        assert info.data == {"to": "a@example.com", "n": [1, 2]}
        custom = client.get_job(ECHO, "welcome-b")
        assert custom.state is JobState.DELAYED
        assert custom.data == 7  # the second add with the same id changed nothing
        assert client.counts(ECHO)[JobState.WAITING] == 1


def test_enqueue_with_invalid_json_writes_nothing(redis_url: str,
                                                  redis_client: redis.Redis) -> None:
    proc = run_cli("enqueue", ECHO, "{'not': json}", "--url", redis_url)
    assert_user_error(proc, "invalid JSON")
    assert redis_client.dbsize() == 0


def test_panqueue_url_environment_variable_is_used(redis_url: str) -> None:
    added = run_cli("enqueue", ECHO, "1", PANQUEUE_URL=redis_url)
    assert added.returncode == 0, added.stderr
    assert counts(redis_url, ECHO)[JobState.WAITING] == 1


# --------------------------------------------------------------------------- stats / job


def test_stats_lists_every_queue_or_one(redis_url: str) -> None:
    empty = run_cli("stats", "--url", redis_url)
    assert empty.returncode == 0 and empty.stdout.strip() == "no queues"

    with SyncQueueClient(redis_url) as client:
        client.queue(ECHO).add_bulk([1, 2, 3])
        client.queue("cli-other").add(1, delay=60)

    table = run_cli("stats", "--url", redis_url)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.strip().splitlines()
    assert header.split() == ["queue", "waiting", "delayed", "blocked", "active", "completed",
                              "failed", "cancelled"]
    assert [row.split() for row in rows] == [  # sorted by queue name
        [ECHO, "3", "0", "0", "0", "0", "0", "0"],
        ["cli-other", "0", "1", "0", "0", "0", "0", "0"],
    ]

    everything = run_cli("stats", "--json", "--url", redis_url)
    assert everything.returncode == 0, everything.stderr
    parsed = json.loads(everything.stdout)
    assert set(parsed) == {ECHO, "cli-other"}
    assert parsed[ECHO]["waiting"] == 3 and parsed["cli-other"]["delayed"] == 1
    assert parsed[ECHO]["paused"] is False

    one = run_cli("stats", ECHO, "--json", "--url", redis_url)
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout) == {ECHO: {
        "waiting": 3, "delayed": 0, "active": 0, "completed": 0, "failed": 0, "cancelled": 0,
        "blocked": 0, "paused": False}}

    one_table = run_cli("stats", "cli-other", "--url", redis_url)
    assert one_table.returncode == 0
    assert [row.split()[0] for row in one_table.stdout.strip().splitlines()[1:]] == ["cli-other"]


def test_stats_of_an_unknown_queue_is_an_error(redis_url: str) -> None:
    assert_user_error(run_cli("stats", "no-such-queue", "--url", redis_url),
                      "unknown queue", "no-such-queue")


def test_job_prints_one_job_as_json(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue(ECHO).add({"x": 1}, priority=3)
    proc = run_cli("job", ECHO, handle.id, "--url", redis_url, "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["id"] == handle.id
    assert info["queue"] == ECHO
    assert info["state"] == "waiting"
    assert info["data"] == {"x": 1}
    assert info["attempts"] == 0
    assert info["error"] is None and info["result"] is None
    assert info["enqueued_at"] is not None and info["finished_at"] is None


def test_job_prints_a_view_for_people_with_the_traceback_and_timed_log_lines(
        redis_url: str, tmp_path: Path) -> None:
    worker = WorkerProcess(tmp_path, "--url", redis_url, "--poll-interval", "0.1",
                           app="job_view_app:queues")
    try:
        with SyncQueueClient(redis_url) as client:
            handle = client.queue("job-view").add({"to": "ada"})
            with pytest.raises(JobFailed):
                handle.result(timeout=20)
    finally:
        worker.kill()
    proc = run_cli("job", "job-view", handle.id, "--url", redis_url)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    lines = text.splitlines()
    assert lines[0] == f"job:       {handle.id} in job-view"
    assert "state:     failed (max_attempts_exceeded)" in lines
    assert "attempts:  2" in lines
    assert 'data:      {"to": "ada"}' in lines
    # The error as Python prints it: real line breaks, not a JSON string with \n in it.
    assert "error: ConnectionError: mail server refused" in lines
    assert "Traceback (most recent call last):" in lines
    assert "second line of the reply" in lines
    assert "Traceback (most recent call last):\n  File " in text
    assert "  attempt 1  ConnectionError: mail server refused" in text
    # Each log line with its time (UTC) and the attempt that wrote it.
    logged = [line for line in lines[lines.index("logs:") + 1:] if line.strip()]
    assert len(logged) == 2, text
    for number, line in enumerate(logged, 1):
        assert re.fullmatch(rf"  \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{{3}} UTC  "
                            rf"attempt {number}  sending to ada", line), line
    # --json has them too.
    data = json.loads(run_cli("job", "job-view", handle.id, "--url", redis_url,
                              "--json").stdout)
    assert data["logs"] == ["sending to ada", "sending to ada"]
    assert [line["attempt"] for line in data["log_lines"]] == [1, 2]
    assert all(line["at"].endswith("+00:00") for line in data["log_lines"])


def test_job_that_does_not_exist_is_an_error(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        client.queue(ECHO).add(1)
    assert_user_error(run_cli("job", ECHO, "missing-job", "--url", redis_url),
                      "missing-job", ECHO)


# --------------------------------------------------------------------------- worker / dlq


def test_worker_processes_jobs_and_dlq_retry_moves_failed_jobs_back(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    with SyncQueueClient(redis_url) as client:
        echoes = client.queue(ECHO).add_bulk([{"n": n} for n in range(3)])
        failures = client.queue(FAIL).add_bulk(["a", "b", "c"])

    worker = start_worker("--url", redis_url, "--poll-interval", "0.1", "--grace", "5")
    wait_until(lambda: counts(redis_url, FAIL)[JobState.FAILED] == 3
               and counts(redis_url, ECHO)[JobState.COMPLETED] == 3, 15,
               "the worker to complete the echoes and fail the failures")
    assert worker.stop() == 0, worker.stderr
    assert "SIGTERM received" in worker.stderr
    # Each failed job is logged (at error) with its traceback; no other traceback appears.
    assert (worker.stderr.count("Traceback")
            == worker.stderr.count("[error    ] job failed on attempt 1 of 1") > 0), (
        worker.stderr)
    with SyncQueueClient(redis_url) as client:
        assert [h.result(timeout=1) for h in echoes] == [{"echo": {"n": n}} for n in range(3)]

    listing = run_cli("dlq", FAIL, "--url", redis_url)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.strip().splitlines()
    assert sorted(line.split("\t")[0] for line in lines) == sorted(h.id for h in failures)
    assert all("RuntimeError: cli-fail refuses" in line for line in lines)

    as_json = run_cli("dlq", FAIL, "--json", "--url", redis_url)
    assert as_json.returncode == 0, as_json.stderr
    entries = json.loads(as_json.stdout)
    assert sorted(e["id"] for e in entries) == sorted(h.id for h in failures)
    for entry in entries:
        assert entry["attempts"] == 1
        assert entry["error"].startswith("RuntimeError: cli-fail refuses")
        assert entry["finished_at"] is not None

    empty = run_cli("dlq", ECHO, "--url", redis_url)
    assert empty.returncode == 0 and "is empty" in empty.stdout

    retried = run_cli("dlq", FAIL, "--retry", "--url", redis_url)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == "3 job(s) moved back to waiting"
    after = counts(redis_url, FAIL)
    assert after[JobState.FAILED] == 0 and after[JobState.WAITING] == 3
    assert json.loads(run_cli("dlq", FAIL, "--json", "--url", redis_url).stdout) == []


def test_dlq_of_an_unknown_queue_is_an_error(redis_url: str) -> None:
    assert_user_error(run_cli("dlq", "no-such-queue", "--url", redis_url), "unknown queue")
    assert_user_error(run_cli("dlq", "no-such-queue", "--retry", "--url", redis_url),
                      "unknown queue")


def test_paused_queue_is_not_claimed_until_resumed(
        redis_url: str, redis_client: redis.Redis,
        start_worker: Callable[..., WorkerProcess]) -> None:
    job_id = run_cli("enqueue", ECHO, '"wait for me"', "--url", redis_url).stdout.strip()
    paused = run_cli("pause", ECHO, "--url", redis_url)
    assert paused.returncode == 0 and paused.stdout.strip() == f"{ECHO}: paused"
    stats = run_cli("stats", "--url", redis_url)
    assert "(paused)" in stats.stdout
    assert json.loads(run_cli("stats", ECHO, "--json", "--url", redis_url).stdout)[ECHO][
        "paused"] is True

    before = script_calls(redis_client)
    worker = start_worker("-q", ECHO, "--url", redis_url, "--poll-interval", "0.05")
    # Only this worker runs scripts on the server now: let it claim at least five times.
    wait_until(lambda: script_calls(redis_client) >= before + 5 or not worker.alive(), 15,
               "the worker to try to claim from the paused queue")
    assert worker.alive(), worker.stderr
    with SyncQueueClient(redis_url) as client:
        assert client.get_job(ECHO, job_id).state is JobState.WAITING

    resumed = run_cli("resume", ECHO, "--url", redis_url)
    assert resumed.returncode == 0 and resumed.stdout.strip() == f"{ECHO}: resumed"
    with SyncQueueClient(redis_url) as client:
        assert client.queue(ECHO).job(job_id).result(timeout=10) == {"echo": "wait for me"}
    assert json.loads(run_cli("stats", ECHO, "--json", "--url", redis_url).stdout)[ECHO][
        "paused"] is False
    assert worker.stop() == 0, worker.stderr


def test_pause_and_resume_of_an_unknown_queue_are_errors(redis_url: str) -> None:
    assert_user_error(run_cli("pause", "no-such-queue", "--url", redis_url), "unknown queue")
    assert_user_error(run_cli("resume", "no-such-queue", "--url", redis_url), "unknown queue")


@pytest.mark.parametrize(("app", "fragments"), [
    ("cli_app", ("MODULE:ATTR", "cli_app")),
    ("cli_app:", ("MODULE:ATTR",)),
    ("no_such_module_xyz:queues", ("cannot import", "no_such_module_xyz")),
    ("cli_app:missing", ("no attribute", "missing")),
    ("cli_app:not_a_registry", ("not a panqueue.Registry",)),
])
def test_worker_with_a_bad_app_is_a_one_line_error(redis_url: str, app: str,
                                                   fragments: tuple[str, ...]) -> None:
    assert_user_error(run_cli("worker", app, "--url", redis_url), *fragments)


def test_worker_for_an_unknown_queue_is_a_one_line_error(redis_url: str) -> None:
    assert_user_error(run_cli("worker", "cli_app:queues", "-q", "no-such-queue", "--url",
                              redis_url), "unknown queue", "no-such-queue")


def test_commands_against_an_unreachable_redis_are_one_line_errors() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert_user_error(run_cli("worker", "cli_app:queues", "--url", url, timeout=30),
                      "cannot reach Redis", url)
    # In a process of its own (python -m panqueue, as a shell runs it): its exit status too.
    assert_user_error(run_cli("stats", "--url", url, process=True), "cannot reach Redis")
    assert_user_error(run_cli("enqueue", ECHO, "{}", "--url", url), "cannot reach Redis")


# --------------------------------------------------------------------------- server / demo


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
        return True


def _answers_ping(port: int) -> bool:
    """One PING over a raw socket (redis-py would retry a refused connection with backoff)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_server_runs_a_private_persistent_redis_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    proc = subprocess.Popen(panqueue_command("server", "--port", str(port), "--dir", str(data)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=subprocess_env(), cwd=ROOT)
    try:
        wait_until(lambda: proc.poll() is not None or _answers_ping(port), 15,
                   "panqueue server to answer PING")
        assert proc.poll() is None, proc.communicate()
        client = redis.Redis(host="127.0.0.1", port=port)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        client.set("kept", "1")
        client.close()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert f"127.0.0.1:{port}" in stdout
    assert "server stopped" in stderr
    aof = list(data.glob("appendonly*"))
    assert aof, list(data.iterdir())
    assert any((path.is_dir() and any(path.iterdir())) or path.is_file() for path in aof)
    assert not _answers_ping(port)
    assert _port_is_free(port)


def test_demo_against_a_given_server_prints_a_summary_and_removes_its_jobs(
        redis_url: str) -> None:
    proc = run_cli("demo", "--url", redis_url, "--jobs", "50", "--workers", "1", timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "summary" in proc.stdout
    assert re.search(r"jobs completed\s+50/50\n", proc.stdout), proc.stdout
    assert "started a private" not in proc.stdout  # --url: no server of its own
    assert f"using the server at {redis_url}" in proc.stdout
    assert "removed the demo's 50 jobs" in proc.stdout
    assert sum(counts(redis_url, "demo").values()) == 0
    # The workers' start is reported as such, before the jobs are added; the latency the
    # summary shows is the queue's, with every worker serving: far below a process start.
    ready = re.search(r"started 1 worker processes \(concurrency 20 each\), ready in "
                      r"([\d.]+) s\n", proc.stdout)
    assert ready is not None, proc.stdout
    assert proc.stdout.index("ready in") < proc.stdout.index("enqueued 50 jobs")
    latency = re.search(r"queue latency\s+p50 (\d+) ms, max (\d+) ms", proc.stdout)
    assert latency is not None, proc.stdout
    assert int(latency.group(1)) < float(ready.group(1)) * 1000, proc.stdout


def test_python_dash_m_panqueue_help_lists_every_command() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("worker", "enqueue", "stats", "job", "dlq", "pause", "resume", "server",
                    "demo"):
        assert command in proc.stdout
    missing = run_cli()
    assert missing.returncode == 2 and "usage:" in missing.stderr.lower()
