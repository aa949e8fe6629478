"""The command line as a new user meets it: bad options, wrong URLs, broken modules, a taken
port, the demo on a shared server; and the day-one operations commands (jobs, cancel, remove,
dlq --retry ID, worker --burst / --reload / --name), against the session's real server: the
worker, demo and server as child processes (``python -m panqueue``), the commands that only talk
to Redis through ``panqueue.cli.main`` in the test's process (tests/helpers.py ``run_cli``)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from panqueue import JobState, SyncQueueClient
from panqueue.testing import FaultProxy
from tests.helpers import ROOT, free_port, panqueue_command, run_cli, subprocess_env, wait_until
from tests.test_cli import ECHO, FAIL, assert_user_error, counts


def run_in(cwd: Path, *args: str, timeout: float = 60,
           **env: str) -> subprocess.CompletedProcess[str]:
    """``panqueue ARGS`` run from ``cwd``, as a user runs it from their project."""
    return subprocess.run(panqueue_command(*args), capture_output=True, text=True,
                          timeout=timeout, env=subprocess_env(**env), cwd=cwd)


def assert_usage_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert_user_error(proc, *fragments)
    assert proc.returncode == 2, proc


# --------------------------------------------------------------------------- bad input: exit 2


@pytest.mark.parametrize(("args", "fragment"), [
    (("worker", "cli_app:queues", "--poll-interval", "0"), "--poll-interval"),
    (("worker", "cli_app:queues", "--poll-interval", "-1"), "--poll-interval"),
    (("worker", "cli_app:queues", "--grace", "-1"), "--grace"),
    (("worker", "cli_app:queues", "--grace", "nan"), "--grace"),
    (("worker", "cli_app:queues", "--concurrency", "0"), "--concurrency"),
    (("server", "--port", "70000"), "--port"),
    (("stats", "--url", ""), "--url"),
    (("stats", "--url", "redis://127.0.0.1:6379/abc"), "'abc'"),
    (("stats", "--url", "http://127.0.0.1:6379/0"), "not a Redis URL"),
    (("stats", "--url", "redis://127.0.0.1:70000/0"), "port"),
    (("stats", "--no-such-option"), "--no-such-option"),
    (("no-such-command",), "no-such-command"),
    # An empty name (an unset shell variable) was taken for no option: exit 0, nothing sent.
    (("workers", "--stop", ""), "--stop needs a worker's NAME"),
    (("workers", "--pause", " "), "--pause needs a worker's NAME"),
    (("workers", "--concurrency", "w=\u00b2"), "--concurrency"),  # '²'.isdigit() is True
    # Python's JSON parser takes these; JSON does not (they were a PayloadError, exit 1).
    (("enqueue", "q", "NaN"), "invalid JSON for the job data: NaN is not JSON"),
    (("enqueue", "q", "[1, -Infinity]"), "-Infinity is not JSON"),
    (("signal", "q", "1", "go", "Infinity"), "invalid JSON for the signal's payload"),
])
def test_a_bad_option_is_one_line_and_exit_2_before_anything_is_written(
        redis_client: redis.Redis, args: tuple[str, ...], fragment: str) -> None:
    assert_usage_error(run_cli(*args), fragment)
    assert redis_client.dbsize() == 0


def test_an_unwritable_server_directory_is_refused_with_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    port = free_port()
    assert_usage_error(run_cli("server", "--port", str(port), "--dir", str(blocker / "data")),
                       "cannot create the directory")
    assert blocker.read_text() == "not a directory"


@pytest.fixture
def http_url() -> Iterator[str]:
    """A tiny HTTP server on loopback: a URL that answers, but not as Redis. It logs nothing
    (its log lines would go to this process's stderr, where a command run here writes)."""

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    finally:
        server.shutdown()
        server.server_close()


def test_a_url_that_is_not_redis_is_a_usage_error(http_url: str) -> None:
    assert_usage_error(run_cli("stats", "--url", http_url, timeout=30),
                       "does not answer as a Redis server")
    assert_usage_error(run_cli("worker", "cli_app:queues", "--url", http_url, timeout=30),
                       "does not answer as a Redis server")


def _listener(answer: bytes | None) -> tuple[socket.socket, threading.Thread]:
    """A loopback listener that, to each connection, sends ``answer`` after the first bytes
    it reads, or (None) closes it at once without a byte."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                if answer is not None:
                    try:
                        conn.recv(1024)
                        conn.sendall(answer)
                    except OSError:
                        pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


@pytest.mark.parametrize("answer", [None, b"\x00\x01\xff garbage\r\n"],
                         ids=["closes-without-answering", "answers-garbage"])
@pytest.mark.parametrize("command", [("stats",), ("info",), ("worker", "cli_app:queues")])
def test_a_server_that_does_not_speak_redis_is_one_line_exit_2(
        answer: bytes | None, command: tuple[str, ...]) -> None:
    listener, thread = _listener(answer)
    url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    try:
        proc = run_cli(*command, "--url", url, timeout=30)
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the serving thread
        listener.close()
        thread.join(5)
    assert_usage_error(proc, f"{url} does not answer as a Redis server", "check the host and port")


@pytest.mark.parametrize("command", [("stats",), ("worker", "cli_app:queues", "--burst")])
def test_a_redis_that_hangs_up_for_a_moment_is_waited_for_not_called_a_wrong_url(
        redis_url: str, command: tuple[str, ...]) -> None:
    """A Redis that closes every new connection for a moment (a restart, a CLIENT KILL, a
    proxy in between dropping its links) looks, for that moment, like a server that does not
    speak Redis. A command started then waits for it (as a worker's start does, up to 5 s),
    and runs once it answers: exit 0, not "does not answer as a Redis server"."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy(port) as proxy:
        proxy.cut()
        proc = subprocess.Popen(panqueue_command(*command, "--url", proxy.url_for(redis_url)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=subprocess_env(), cwd=ROOT)
        try:
            # Its first PING met the cut (the proxy took and closed its connection, and that of
            # the PING's one resend), and so did the probe after it, and a PING of its wait:
            # then the cut ends.
            wait_until(lambda: proxy.connections_refused >= 4 or proc.poll() is not None, 20,
                       "the command to meet the cut")
            proxy.restore()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, (out, err)
    assert "does not answer as a Redis server" not in err


@pytest.mark.parametrize(("source", "line", "fragment"), [
    ("import os\n\n\ndef broken(:\n    pass\n", 4, "SyntaxError"),
    ("import os\n\nraise RuntimeError('settings missing')\n", 3, "settings missing"),
    ("import os\nimport no_such_dependency_xyz\n", 2, "no_such_dependency_xyz"),
])
def test_a_module_that_fails_to_import_names_the_users_file_and_line(
        tmp_path: Path, redis_url: str, redis_client: redis.Redis, source: str, line: int,
        fragment: str) -> None:
    (tmp_path / "brokenapp.py").write_text(source)
    proc = run_in(tmp_path, "worker", "brokenapp:queues", "--url", redis_url)
    assert_usage_error(proc, f"{tmp_path / 'brokenapp.py'}:{line}", fragment)
    assert redis_client.dbsize() == 0


# --------------------------------------------------------------------------- server / demo


@pytest.mark.parametrize("reuse", [False, True], ids=["plain", "reuseaddr"])
def test_server_on_a_port_in_use_refuses_with_exit_1_and_writes_nothing(
        tmp_path: Path, reuse: bool) -> None:
    # A listener with SO_REUSEADDR (as redis-server's own) is refused as well.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        if reuse:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = tmp_path / "data"
        proc = run_cli("server", "--port", str(port), "--dir", str(data), timeout=30)
    assert_user_error(proc, f"port {port}", "already in use")
    assert proc.returncode == 1
    assert not data.exists()


def _start_server(port: int, data: Path) -> subprocess.Popen[str]:
    """``panqueue server --port PORT`` once it said it listens (its three lines read)."""
    proc = subprocess.Popen(
        panqueue_command("server", "--port", str(port), "--dir", str(data)),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=subprocess_env(), cwd=ROOT)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    if f"export PANQUEUE_URL=redis://127.0.0.1:{port}/0\n" not in lines:
        proc.kill()
        _, stderr = proc.communicate(timeout=20)
        raise AssertionError(f"the server did not start: {lines} {stderr}")
    return proc


def test_server_restarts_on_its_port_right_after_a_stop(tmp_path: Path) -> None:
    """A stopped server leaves the connections it closed in TIME_WAIT on its port: the next
    server on that port starts at once all the same."""
    port = free_port()
    proc = _start_server(port, tmp_path / "d")
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        assert client.ping()  # a connection the server closes first, when it stops
        proc.terminate()
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0, stderr
        client.close()
        proc = _start_server(port, tmp_path / "d")
        with redis.Redis(host="127.0.0.1", port=port) as again:
            assert again.ping()
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert proc.returncode == 0


def test_server_prints_a_ready_to_paste_export_line(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        panqueue_command("server", "--port", str(port), "--dir", str(tmp_path / "d")),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=subprocess_env(), cwd=ROOT)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert f"export PANQUEUE_URL=redis://127.0.0.1:{port}/0\n" in lines, lines
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert proc.returncode == 0


@pytest.mark.parametrize("prefix", [None, "billing"])
def test_demo_on_panqueue_url_says_so_and_removes_its_jobs(
        redis_url: str, redis_client: redis.Redis, prefix: str | None) -> None:
    """Under PANQUEUE_PREFIX too: the demo's workers served the prefix (they inherit the
    environment) while the demo added and watched without it, and waited for them in vain."""
    env = {"PANQUEUE_URL": redis_url, **({"PANQUEUE_PREFIX": prefix} if prefix else {})}
    proc = run_cli("demo", "--jobs", "20", "--workers", "1", timeout=90, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"using the server at {redis_url}" in proc.stdout
    assert "started a private" not in proc.stdout
    # The queue was the demo's: nothing of it is left but records that expire on their own
    # (the workers' dedup records of finished calls) and the bounded events and history
    # streams, which client.purge keeps for whoever reads them.
    tag = f"{prefix}:q:demo" if prefix else "q:demo"
    lasting = [key for key in redis_client.keys("*") if redis_client.ttl(key) < 0]
    assert set(lasting) <= {f"{{{tag}}}:events".encode(), f"{{{tag}}}:history".encode()}
    with SyncQueueClient(redis_url, prefix=prefix) as client:
        assert sum(client.counts("demo").values()) == 0
        assert not client.queue_exists("demo")


def test_demo_with_more_jobs_than_the_completed_set_keeps_finishes(redis_url: str) -> None:
    # Retention trims the completed set at 1000 jobs: the demo counts its own jobs instead.
    proc = run_cli("demo", "--url", redis_url, "--jobs", "1500", "--workers", "2", timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "jobs completed     1500/1500" in proc.stdout


# --------------------------------------------------------------------------- jobs / cancel / remove


def test_jobs_lists_one_state_as_text_or_json(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        handles = client.queue(ECHO).add_bulk([{"n": n} for n in range(3)])
        client.queue(ECHO).add("later", delay=60)
    waiting = run_cli("jobs", ECHO, "--url", redis_url)
    assert waiting.returncode == 0, waiting.stderr
    assert [line.split("\t")[0] for line in waiting.stdout.splitlines()] == [
        "id", *(h.id for h in handles)]
    delayed = run_cli("jobs", ECHO, "--state", "delayed", "--json", "--url", redis_url)
    assert delayed.returncode == 0, delayed.stderr
    assert [j["data"] for j in json.loads(delayed.stdout)] == ["later"]
    limited = run_cli("jobs", ECHO, "--limit", "1", "--json", "--url", redis_url)
    assert len(json.loads(limited.stdout)) == 1
    assert_usage_error(run_cli("jobs", ECHO, "--state", "sleeping", "--url", redis_url),
                       "--state")
    assert_usage_error(run_cli("jobs", "no-such-queue", "--url", redis_url), "unknown queue")


def test_cancel_and_remove_a_job(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        first, second = client.queue(ECHO).add_bulk(["a", "b"])
    cancelled = run_cli("cancel", ECHO, first.id, "--url", redis_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"{first.id}: cancelled (was waiting)"
    removed = run_cli("remove", ECHO, second.id, "--url", redis_url)
    assert removed.returncode == 0 and removed.stdout.strip() == f"{second.id}: removed"
    with SyncQueueClient(redis_url) as client:
        assert client.get_job(ECHO, first.id).state is JobState.CANCELLED
        assert client.counts(ECHO)[JobState.WAITING] == 0
    again = run_cli("remove", ECHO, second.id, "--url", redis_url)
    assert_user_error(again, second.id, "not found")
    assert again.returncode == 1


# --------------------------------------------------------------------------- worker


def test_burst_worker_exits_0_once_the_queues_are_empty(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        client.queue(ECHO).add_bulk(list(range(20)))
        failures = client.queue(FAIL).add_bulk(["x", "y"])
    proc = run_cli("worker", "cli_app:queues", "--burst", "--poll-interval", "0.1",
                   "--name", "burst-1", "--url", redis_url, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "queues empty" in proc.stderr
    assert counts(redis_url, ECHO)[JobState.COMPLETED] == 20
    assert counts(redis_url, FAIL)[JobState.FAILED] == 2

    # dlq --retry with ids moves only those back.
    retried = run_cli("dlq", FAIL, "--retry", failures[0].id, "--url", redis_url)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == "1 job(s) moved back to waiting"
    after = counts(redis_url, FAIL)
    assert after[JobState.WAITING] == 1 and after[JobState.FAILED] == 1
    assert_usage_error(run_cli("dlq", FAIL, failures[1].id, "--url", redis_url), "--retry")


def test_a_worker_given_no_url_serves_its_registrys_before_panqueue_url(
        redis_url: str, tmp_path: Path) -> None:
    """Registry(url=...) is the URL its workers use when given none, before $PANQUEUE_URL (as
    its docstring and the Django page say); the worker's --url option resolved
    $PANQUEUE_URL, else localhost, first, and served that."""
    app = tmp_path / "url_app.py"
    app.write_text(
        "from panqueue import Registry\n"
        f"queues = Registry(url={redis_url!r})\n"
        "@queues.handler('url-app')\n"
        "async def run(job):\n"
        "    return 'ran'\n")
    with SyncQueueClient(redis_url) as client:
        job = client.queue("url-app").add(None)
    done = run_cli("worker", "url_app:queues", "--burst", "--poll-interval", "0.1",
                   PANQUEUE_URL=f"redis://127.0.0.1:{free_port()}/0",
                   PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", process=True)
    assert done.returncode == 0, done.stderr
    with SyncQueueClient(redis_url) as client:
        assert client.get_job("url-app", job.id).result == "ran"


def test_a_burst_worker_rides_out_a_short_outage_and_exits_0_once_empty(
        redis_url: str, proxy: FaultProxy, tmp_path: Path) -> None:
    """Its check of whether the queues are empty failed with Redis away, and took the worker
    down with it: exit 1 within a fraction of a second, its running job left ACTIVE until
    its lock expired. A worker that loses Redis rides the outage out (docs/operations.md)."""
    from tests.helpers import APPS, WorkerProcess

    with SyncQueueClient(redis_url) as client:
        job = client.queue("outage-slow").add(3)
        worker = WorkerProcess(tmp_path, "--url", proxy.url_for(redis_url), "-q", "outage-slow",
                               "--burst", "--poll-interval", "0.2", app="outage_app:queues",
                               path=APPS)
        try:
            wait_until(lambda: client.get_job("outage-slow", job.id).state is JobState.ACTIVE,
                       20, "the job to start")
            proxy.cut()
            wait_until(lambda: "cannot reach" in worker.stderr or not worker.alive(), 10,
                       "the worker to notice the outage")
            time.sleep(1.5)  # the outage lasts several of the burst check's 0.2 s rounds
            proxy.restore()
            assert worker.process.wait(40) == 0, worker.stderr[-3000:]
        finally:
            worker.kill()
        assert client.get_job("outage-slow", job.id).state is JobState.COMPLETED


@contextlib.contextmanager
def _reloading(app_dir: Path, url: str, grace: float = 1.0
               ) -> Iterator[tuple[Path, Path, subprocess.Popen[bytes], SyncQueueClient]]:
    """``panqueue worker reloadapp:queues --reload --grace GRACE`` in ``app_dir`` serving
    ``reloadapp.py`` (answering 1, checked), its stderr in ``worker.err``; yields the app's
    file, that log, the process and a client, and stops the worker at the end."""
    app = app_dir / "reloadapp.py"
    app.write_text(_RELOAD_APP.format(answer=1))
    err = app_dir / "worker.err"
    with err.open("wb") as stderr:
        worker = subprocess.Popen(
            panqueue_command("worker", "reloadapp:queues", "--reload", "--grace", str(grace),
                             "--poll-interval", "0.1", "--url", url),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            env=subprocess_env(), cwd=app_dir)
    try:
        with SyncQueueClient(url) as client:
            assert client.queue("reload").add(None).result(timeout=20) == 1
            yield app, err, worker, client
    finally:
        worker.terminate()
        worker.wait(20)


def test_reload_restarts_the_worker_when_a_python_file_changes(tmp_path: Path,
                                                               redis_url: str) -> None:
    """The new code runs even when the save keeps the file's size and modification time (an
    edit within the second of the last import): Python would take the module from the
    bytecode cached at that import, which records only those two."""
    with _reloading(tmp_path, redis_url) as (app, err, _, client):
        before = app.stat()
        app.write_text(_RELOAD_APP.format(answer=2))
        os.utime(app, ns=(before.st_atime_ns, before.st_mtime_ns))
        # Until the old process has stopped, it may still take a job (and run the old code).
        wait_until(lambda: err.read_text().count("worker started") == 2, 20, "the restart")
        assert "changed; restarting" in err.read_text()
        assert client.queue("reload").add(None).result(timeout=20) == 2, err.read_text()
    assert "Traceback" not in err.read_text()


def test_a_signal_while_a_reload_drains_its_jobs_stops_the_worker(tmp_path: Path,
                                                                   redis_url: str) -> None:
    """SIGTERM that comes while the restart for changed code waits for a running job ends
    the command once that job is done: the new code is not started. (The grace outlasts the
    test: the held job alone keeps the restart draining until the signal has come.)"""
    hold = tmp_path / "hold"
    hold.touch()
    with _reloading(tmp_path, redis_url, grace=60) as (app, err, worker, client):
        held = client.queue("reload").add("hold")
        wait_until(lambda: held.info().state is JobState.ACTIVE, 20, "the held job's start")
        app.write_text(_RELOAD_APP.format(answer=2))
        wait_until(lambda: "changed; restarting" in err.read_text(), 20, "the restart")
        worker.send_signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM received" in err.read_text(), 20, "the signal's notice")
        hold.unlink()
        assert worker.wait(20) == 0, err.read_text()
        assert held.result(timeout=20) == 1
    assert err.read_text().count("worker started") == 1, err.read_text()


def test_reload_waits_for_the_next_save_after_a_syntax_error(tmp_path: Path,
                                                             redis_url: str) -> None:
    """A save that does not import (a syntax error mid-edit) prints the error and waits; the
    next save that imports restarts the worker, which serves the new code."""
    with _reloading(tmp_path, redis_url) as (app, err, worker, client):
        app.write_text(_RELOAD_APP.format(answer="(1 +"))
        wait_until(lambda: "waiting for a .py file to change" in err.read_text()
                   or worker.poll() is not None, 30, "the worker to wait for a save")
        assert worker.poll() is None, err.read_text()
        text = err.read_text()
        assert "panqueue: error: importing 'reloadapp' failed at " in text, text
        assert "reloadapp.py:" in text and "SyntaxError" in text, text
        app.write_text(_RELOAD_APP.format(answer=2))
        assert client.queue("reload").add(None).result(timeout=30) == 2
    assert "Traceback" not in err.read_text()


def test_reload_finds_a_save_made_before_it_started_watching(tmp_path: Path,
                                                              redis_url: str) -> None:
    """A save between the failed import and the watcher's start is not lost: here the failing
    module itself saves the fixed version before it raises, so only a look at the files (not
    the watcher, which starts after) can see it."""
    with _reloading(tmp_path, redis_url) as (app, err, worker, client):
        app.write_text(_SAVES_ITS_FIX.format(fixed=repr(_RELOAD_APP.format(answer=2))))
        wait_until(lambda: "RuntimeError: saved the fix" in err.read_text()
                   or worker.poll() is not None, 30, "the restart's import to fail")
        assert client.queue("reload").add(None).result(timeout=30) == 2
    text = err.read_text()
    assert "panqueue: error: importing 'reloadapp' failed at " in text, text
    assert "RuntimeError: saved the fix" in text, text


# A module that, imported, saves the next version of itself and then fails.
_SAVES_ITS_FIX = """
import pathlib

pathlib.Path(__file__).write_text({fixed})
raise RuntimeError("saved the fix")
"""

_CHAINED_APP = """
import json


def _settings():
    try:
        return json.loads("{not json")
    except ValueError as exc:
        raise RuntimeError("settings.json is not valid JSON") from exc


SETTINGS = _settings()
"""


def test_an_app_that_fails_to_import_is_one_line_and_its_whole_chain_with_traceback(
        tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "chainedapp.py").write_text(_CHAINED_APP)

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            panqueue_command("worker", "chainedapp:queues", "--url", redis_url, *extra),
            capture_output=True, text=True, timeout=30, env=subprocess_env(), cwd=tmp_path)

    short = run()
    assert short.returncode == 2, short
    assert short.stderr.count("\n") == 1, short.stderr
    assert short.stderr.startswith("panqueue: error: importing 'chainedapp' failed at "), short
    assert "chainedapp.py:9: RuntimeError: settings.json is not valid JSON" in short.stderr
    assert "--traceback" in short.stderr  # how to see the rest

    full = run("--traceback")
    assert full.returncode == 2, full
    lines = full.stderr.splitlines()
    assert lines[0].startswith("panqueue: error: importing 'chainedapp' failed at ")
    text = full.stderr
    # The cause first, then the exception it caused, each with its frames in the app.
    cause = text.index("json.decoder.JSONDecodeError: Expecting property name")
    link = text.index("The above exception was the direct cause of the following exception")
    assert cause < link < text.rindex("RuntimeError: settings.json is not valid JSON"), text
    assert 'chainedapp.py", line 7, in _settings' in text, text
    assert "importlib" not in text and "panqueue/cli" not in text, text
    assert full.stdout == ""


def test_reload_without_watchfiles_is_one_line_naming_the_extra(tmp_path: Path,
                                                                 redis_url: str) -> None:
    # A watchfiles that cannot be imported, first on the path: as if it were not installed.
    (tmp_path / "watchfiles.py").write_text("raise ImportError('not installed')\n")
    env = subprocess_env()
    proc = subprocess.run(
        panqueue_command("worker", "cli_app:queues", "--reload", "--url", redis_url),
        capture_output=True, text=True, timeout=30, cwd=ROOT,
        env={**env, "PYTHONPATH": f"{tmp_path}:{env['PYTHONPATH']}"})
    assert_usage_error(proc, "panqueue[reload]")


_RELOAD_APP = """
from pathlib import Path

import anyio

from panqueue import Registry

queues = Registry()


@queues.handler("reload")
async def answer(job):
    while job.data == "hold" and Path("hold").exists():  # until the test lets it go
        await anyio.sleep(0.02)
    return {answer}
"""


def test_python_dash_m_panqueue_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("panqueue ")


def test_shell_completion_is_generated_by_the_command_itself() -> None:
    proc = subprocess.run([str(Path(sys.executable).parent / "panqueue")],
                          capture_output=True, text=True, timeout=30,
                          env=subprocess_env(_PANQUEUE_COMPLETE="bash_source"), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "_PANQUEUE_COMPLETE" in proc.stdout


# ------------------------------------------------- info / workers / explain / purge / check


@pytest.fixture
def live_worker(tmp_path: Path, redis_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """``panqueue worker cli_app:queues --name cli-ops-1``, until the test ends."""
    with (tmp_path / "worker.err").open("wb") as err:
        worker = subprocess.Popen(
            panqueue_command("worker", "cli_app:queues", "--name", "cli-ops-1", "--url",
                             redis_url, "--poll-interval", "0.1", "--grace", "1"),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            env=subprocess_env(), cwd=ROOT)
    try:
        with SyncQueueClient(redis_url) as client:
            wait_until(lambda: client.queue_exists(ECHO) and client.workers(ECHO), 15,
                       "the worker's first heartbeat")
        yield worker
    finally:
        worker.terminate()
        worker.wait(20)


def test_check_exits_0_only_when_a_live_worker_serves_each_queue(
        redis_url: str, live_worker: subprocess.Popen[bytes]) -> None:
    served = run_cli("check", ECHO, FAIL, "--url", redis_url)
    assert served.returncode == 0 and served.stdout.strip() == "ok", served.stderr
    unserved = run_cli("check", ECHO, "nobody-serves-this", "--url", redis_url)
    assert_user_error(unserved, "no live worker", "nobody-serves-this")
    assert unserved.returncode == 1
    unreachable = run_cli("check", "--url", f"redis://127.0.0.1:{free_port()}/0")
    assert_user_error(unreachable, "cannot reach Redis")
    assert unreachable.returncode == 1


def test_workers_and_info_show_the_live_worker_and_the_queues(
        redis_url: str, live_worker: subprocess.Popen[bytes]) -> None:
    listed = run_cli("workers", ECHO, "--json", "--url", redis_url)
    assert listed.returncode == 0, listed.stderr
    [worker] = json.loads(listed.stdout)
    assert worker["name"] == "cli-ops-1" and ECHO in worker["queues"]
    assert worker["pid"] == live_worker.pid
    text = run_cli("workers", "--url", redis_url)
    assert text.returncode == 0 and text.stdout.startswith("cli-ops-1\t"), text.stdout

    run_cli("pause", ECHO, "--url", redis_url)
    with SyncQueueClient(redis_url) as client:
        client.queue(ECHO).add_bulk([1, 2])
    snapshot = run_cli("info", "--json", "--url", redis_url)
    assert snapshot.returncode == 0, snapshot.stderr
    parsed = json.loads(snapshot.stdout)
    assert parsed["queues"][ECHO]["waiting"] == 2 and parsed["queues"][ECHO]["paused"] is True
    assert parsed["queues"][ECHO]["lag_seconds"] >= 0
    assert [w["name"] for w in parsed["workers"]] == ["cli-ops-1"]
    table = run_cli("info", "--url", redis_url)
    assert table.returncode == 0 and "1 live worker process(es)" in table.stdout
    assert_usage_error(run_cli("info", "--interval", "0", "--url", redis_url), "--interval")


def test_explain_says_why_a_job_waits(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue(ECHO).add("x")
        client.pause(ECHO)
    proc = run_cli("explain", ECHO, handle.id, "--json", "--url", redis_url)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["state"] == "waiting" and found["reason"] == "paused" and found["detail"]
    text = run_cli("explain", ECHO, handle.id, "--url", redis_url)
    assert text.stdout.startswith(f"{handle.id}: waiting (paused): ")
    missing = run_cli("explain", ECHO, "no-such-job", "--url", redis_url)
    assert_user_error(missing, "no-such-job")
    assert missing.returncode == 1


def test_purge_needs_yes_and_deletes_the_named_states(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        client.queue(ECHO).add_bulk([1, 2, 3])
        client.queue(ECHO).add(4, delay=60)
    refused = run_cli("purge", ECHO, "--url", redis_url)
    assert_usage_error(refused, "--yes")
    assert counts(redis_url, ECHO)[JobState.WAITING] == 3
    waiting = run_cli("purge", ECHO, "--state", "waiting", "--yes", "--url", redis_url)
    assert waiting.returncode == 0 and waiting.stdout.strip() == f"{ECHO}: 3 job(s) deleted"
    after = counts(redis_url, ECHO)
    assert after[JobState.WAITING] == 0 and after[JobState.DELAYED] == 1
    everything = run_cli("purge", ECHO, "--yes", "--url", redis_url)
    assert everything.returncode == 0 and everything.stdout.strip() == f"{ECHO}: 1 job(s) deleted"
