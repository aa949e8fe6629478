"""``panqueue worker --health-port`` (GET /healthz), ``--log-jobs`` and the operator notices in
``--log-format json``, run as a user runs them: the worker as a child process."""

from __future__ import annotations

import json
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from panqueue import JobState, SyncQueueClient
from panqueue.embedded import RedisServer
from tests.helpers import WorkerProcess, free_port, run_cli, wait_until
from tests.test_cli import ECHO, FAIL, counts


def get(port: int, path: str = "/healthz", host: str = "127.0.0.1"
        ) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of GET http://host:port/path; (0, {}) if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=2) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError:
        return 0, {}


def test_healthz_is_200_while_the_worker_claims_and_503_once_redis_is_gone(
        private_redis: RedisServer, start_worker: Callable[..., WorkerProcess]) -> None:
    port = free_port()
    worker = start_worker("--url", private_redis.url, "--poll-interval", "0.1",
                            "--health-port", str(port))
    wait_until(lambda: get(port)[0] == 200, 20, "/healthz to answer 200")
    status, body = get(port)
    assert status == 200
    assert body["status"] == "ok"
    assert sorted(body["queues"]) == sorted([ECHO, FAIL])
    assert body["processed"] == 0 and body["failed"] == 0

    with SyncQueueClient(private_redis.url) as client:
        client.queue(ECHO).add({"n": 1})
        client.queue(FAIL).add("x")
    wait_until(lambda: get(port)[1].get("processed") == 1 and get(port)[1].get("failed") == 1,
               15, "the counts to show one completed and one failed job")

    assert get(port, "/")[0] == 404
    assert get(port, "/healthz/extra")[0] == 404

    private_redis.stop()
    wait_until(lambda: get(port)[0] == 503, 10, "/healthz to answer 503 without Redis")
    status, body = get(port)
    assert status == 503
    # The actual cause, with the error: not a stale PING, not "claiming fails" alone.
    assert body["status"] == "unavailable", body
    assert body["reason"].startswith("Redis unreachable: "), body
    assert str(private_redis.port) in body["reason"], body
    assert get(port, "/readyz")[0] == 503
    # The loop still turns: alive, not ready.
    assert get(port, "/livez")[0] == 200
    assert worker.alive(), worker.stderr
    # The failed job's traceback is logged; no other traceback (nothing from the endpoint).
    assert worker.stderr.count("Traceback") == 1, worker.stderr
    assert "RuntimeError: cli-fail refuses 'x'\n" in worker.stderr, worker.stderr


def test_healthz_listens_on_loopback_only_by_default(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    port = free_port()
    worker = start_worker("--url", redis_url, "--health-port", str(port))
    wait_until(lambda: get(port)[0] == 200, 20, "/healthz to answer 200")
    # Bound to 127.0.0.1 itself: another loopback address (Linux routes all of 127/8 to
    # lo) does not reach it, as it would a server bound to 0.0.0.0.
    assert get(port, host="127.0.0.2")[0] == 0
    assert worker.stop() == 0, worker.stderr
    assert get(port)[0] == 0  # closed with the worker

    exposed = start_worker("--url", redis_url, "--health-port", str(port),
                             "--health-host", "0.0.0.0")
    wait_until(lambda: get(port, host="127.0.0.2")[0] == 200, 20,
               "/healthz on every address with --health-host 0.0.0.0")
    assert exposed.stop() == 0, exposed.stderr


@pytest.mark.parametrize("port", ["0", "65536", "-1", "http"])
def test_a_bad_health_port_is_a_usage_error(redis_url: str, port: str) -> None:
    proc = run_cli("worker", "cli_app:queues", "--url", redis_url, "--health-port", port)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("panqueue: error: "), proc.stderr
    assert "--health-port" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_health_port_in_use_is_one_line_exit_1(redis_url: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("worker", "cli_app:queues", "--url", redis_url,
                       "--health-port", str(port))
    assert proc.returncode == 1, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("panqueue: error: "), proc.stderr
    assert f"127.0.0.1:{port}" in lines[0]


def test_json_worker_writes_only_json_on_stderr_including_the_signal_notice_and_job_lines(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    with SyncQueueClient(redis_url) as client:
        handles = client.queue(ECHO).add_bulk([{"n": n} for n in range(3)])
    worker = start_worker("--url", redis_url, "--poll-interval", "0.1", "--grace", "5",
                            "--log-format", "json", "--log-level", "warning", "--log-jobs")
    wait_until(lambda: counts(redis_url, ECHO)[JobState.COMPLETED] == 3, 15,
               "the worker to complete the jobs")
    assert worker.stop() == 0, worker.stderr

    lines = worker.stderr.splitlines()
    assert lines, "no output at all"
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line on stderr: {line!r}\n{worker.stderr}")
    events = [entry["event"] for entry in entries]
    notices = [e for e in entries if e["event"].startswith("SIGTERM received; finishing "
                                                           "running jobs")]
    assert len(notices) == 1, events
    assert notices[0]["signal"] == "SIGTERM" and notices[0]["grace"] == 5
    # --log-jobs: a line per completed job, even at --log-level warning.
    completed = sorted(e["job_id"] for e in entries if e["event"] == "job completed")
    assert completed == sorted(h.id for h in handles), events


def test_without_log_jobs_no_job_lines(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    with SyncQueueClient(redis_url) as client:
        client.queue(ECHO).add({"n": 1})
    worker = start_worker("--url", redis_url, "--poll-interval", "0.1",
                            "--log-format", "json")
    wait_until(lambda: counts(redis_url, ECHO)[JobState.COMPLETED] == 1, 15,
               "the worker to complete the job")
    assert worker.stop() == 0, worker.stderr
    events = [json.loads(line)["event"] for line in worker.stderr.splitlines()]
    assert "job completed" not in events
    assert any(e.startswith("SIGTERM received") for e in events)


def test_livez_and_readyz_name_the_handler_that_blocks_the_loop_not_redis(
        redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    """One process serving two queues: while one handler blocks the event loop (time.sleep)
    next to one that awaits, /livez and /readyz both say the loop is blocked and by which
    handler; neither blames Redis nor the awaiting handler. Both are 200 again after."""
    port = free_port()
    worker = WorkerProcess(tmp_path, "-q", "blocks", "-q", "awaits", "--url", redis_url,
                           "--poll-interval", "0.1", "--health-port", str(port),
                           app="blocking_app:queues", env={"PANQUEUE_URL": redis_url})
    try:
        wait_until(lambda: get(port, "/readyz")[0] == 200, 20, "/readyz to answer 200")
        assert get(port, "/livez")[0] == 200
        with SyncQueueClient(redis_url) as client:
            client.queue("awaits").add(30)
            wait_until(lambda: redis_client.get("started:awaits"), 20,
                       "the awaiting handler to start")
            blocking = client.queue("blocks").add(6)
            wait_until(lambda: get(port, "/livez")[0] == 503, 10, "/livez to answer 503")
            live_status, live = get(port, "/livez")
            ready_status, ready = get(port, "/readyz")
            health_status, health = get(port, "/healthz")
            assert (live_status, ready_status, health_status) == (503, 503, 503)
            for body in (live, ready, health):
                reason = body["reason"]
                assert reason.startswith("event loop blocked for "), body
                assert "by handler blocking_app:blocks at " in reason, body
                assert "blocking_app.py" in reason, body
                assert "awaits" not in reason and "PING" not in reason, body
                assert "Redis" not in reason, body
            assert blocking.result(timeout=20) == "blocked"
        wait_until(lambda: get(port, "/livez")[0] == 200, 10, "/livez to answer 200 again")
        wait_until(lambda: get(port, "/readyz")[0] == 200, 10, "/readyz to answer 200 again")
        assert worker.alive(), worker.stderr
    finally:
        worker.kill()


def test_readyz_says_the_worker_is_stopping_and_livez_stays_200_while_it_drains(
        redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    port = free_port()
    worker = WorkerProcess(tmp_path, "-q", "awaits", "--url", redis_url, "--grace", "30",
                           "--poll-interval", "0.1", "--health-port", str(port),
                           app="blocking_app:queues", env={"PANQUEUE_URL": redis_url})
    try:
        wait_until(lambda: get(port, "/readyz")[0] == 200, 20, "/readyz to answer 200")
        with SyncQueueClient(redis_url) as client:
            client.queue("awaits").add(30)
        wait_until(lambda: redis_client.get("started:awaits"), 20, "the handler to start")
        worker.process.send_signal(signal.SIGTERM)
        wait_until(lambda: get(port, "/readyz")[0] == 503, 10, "/readyz to answer 503")
        reason = get(port, "/readyz")[1]["reason"]
        assert reason.startswith("the worker is stopping (SIGTERM received"), reason
        assert get(port, "/livez")[0] == 200
    finally:
        worker.kill()


def test_readyz_says_every_served_queue_is_paused_with_the_command_that_resumes_it(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    port = free_port()
    start_worker("--url", redis_url, "-q", ECHO, "--health-port", str(port))
    wait_until(lambda: get(port, "/readyz")[0] == 200, 20, "/readyz to answer 200")
    with SyncQueueClient(redis_url) as client:
        client.pause(ECHO)
        wait_until(lambda: get(port, "/readyz")[0] == 503, 10, "/readyz to answer 503")
        body = get(port, "/readyz")[1]
        assert body["reason"] == (f"every queue it serves is paused: {ECHO} "
                                  f"(panqueue resume {ECHO})"), body
        assert body["paused"] == [ECHO]
        assert get(port, "/livez")[0] == 200
        client.resume(ECHO)
    wait_until(lambda: get(port, "/readyz")[0] == 200, 10, "/readyz to answer 200 again")


def test_readyz_is_503_while_an_operator_has_the_worker_paused(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    port = free_port()
    start_worker("--url", redis_url, "-q", ECHO, "--name", "held-worker",
                 "--health-port", str(port))
    wait_until(lambda: get(port, "/readyz")[0] == 200, 20, "/readyz to answer 200")
    with SyncQueueClient(redis_url) as client:
        wait_until(lambda: bool(client.workers(ECHO)), 20, "the worker's entry")
        client.control("held-worker", "pause")
        # Applied at its next heartbeat (every 5 s).
        wait_until(lambda: get(port, "/readyz")[0] == 503, 15, "/readyz to answer 503")
        body = get(port, "/readyz")[1]
        assert body["reason"].startswith(f"an operator paused this worker on {ECHO}"), body
        assert get(port, "/livez")[0] == 200
        client.control("held-worker", "resume")
    wait_until(lambda: get(port, "/readyz")[0] == 200, 15, "/readyz to answer 200 again")


def test_readyz_is_503_while_a_stop_command_drains_the_worker(
        redis_url: str, tmp_path: Path) -> None:
    """An operator's stop (client.control, panqueue workers --stop) stops the claims as a
    SIGTERM does; /readyz answered 200 all through the drain, so a load balancer kept the
    worker as serving."""
    from tests.helpers import APPS

    port = free_port()
    worker = WorkerProcess(tmp_path, "--url", redis_url, "-q", "outage-slow", "--name",
                           "drained-worker", "--grace", "60", "--health-port", str(port),
                           app="outage_app:queues", path=APPS)
    try:
        with SyncQueueClient(redis_url) as client:
            job = client.queue("outage-slow").add(60)
            wait_until(lambda: client.get_job("outage-slow", job.id).state is JobState.ACTIVE,
                       20, "the job to start")
            assert get(port, "/readyz")[0] == 200
            client.control("drained-worker", "stop")
            # Applied at its next heartbeat (every 5 s); the job runs on meanwhile.
            wait_until(lambda: get(port, "/readyz")[0] == 503, 15, "/readyz to answer 503")
            body = get(port, "/readyz")[1]
            assert body["reason"].startswith("the worker is stopping (outage-slow: a stop "
                                             "command)"), body
            assert client.get_job("outage-slow", job.id).state is JobState.ACTIVE
    finally:
        worker.kill()


def test_readyz_reads_the_paused_queues_under_the_workers_prefix(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    """Under --prefix, /readyz reads that application's queues: its own paused queue makes it
    503 (the hint names the prefix), the same name paused outside the prefix does not."""
    port = free_port()
    start_worker("--url", redis_url, "--prefix", "healthapp", "-q", ECHO,
                 "--health-port", str(port))
    wait_until(lambda: get(port, "/readyz")[0] == 200, 20, "/readyz to answer 200")
    with SyncQueueClient(redis_url, prefix="healthapp") as mine, \
            SyncQueueClient(redis_url) as bare:
        bare.pause(ECHO)
        mine.pause(ECHO)
        wait_until(lambda: get(port, "/readyz")[0] == 503, 10, "/readyz to answer 503")
        body = get(port, "/readyz")[1]
        assert body["reason"] == (f"every queue it serves is paused: {ECHO} "
                                  f"(panqueue resume --prefix healthapp {ECHO})"), body
        assert body["paused"] == [ECHO]
        mine.resume(ECHO)
        # The bare queue of the same name stays paused: not the worker's.
        wait_until(lambda: get(port, "/readyz")[0] == 200, 10, "/readyz to answer 200 again")
        assert "paused" not in get(port, "/readyz")[1]
        bare.resume(ECHO)


def test_the_resume_hint_of_a_paused_queue_is_a_command_a_shell_runs_as_written() -> None:
    """A queue's name may hold spaces and shell characters: the hint quotes it, as explain's
    do (it was pasted as words of its own, and ran whatever followed a ';')."""
    import time

    from panqueue._health import HealthState

    state = HealthState(["bulk mail; rm -x"], lambda: (0, 0), prefix="shop")
    state.claiming, state.last_pong = True, time.monotonic()
    state.paused = ["bulk mail; rm -x"]
    status, body = state.report()
    assert status == 503
    assert body["reason"].endswith("(panqueue resume --prefix shop 'bulk mail; rm -x')"), body
