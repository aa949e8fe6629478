"""``panqueue top`` driven in a real terminal (tmux), against a private server and a real
worker process."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from panqueue import Job, JobState, QueueClient, Registry, SyncQueueClient
from panqueue.embedded import RedisServer
from panqueue.testing import drain, run_worker
from tests.helpers import ROOT, WorkerProcess, panqueue_command, run_cli, subprocess_env, wait_until

TMUX = shutil.which("tmux")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    server = RedisServer(appendonly=False).start()
    try:
        yield server
    finally:
        server.stop()


def _tmux(session: str, *args: str) -> list[str]:
    """A tmux command on the server of ``session`` alone (``-L``): a server shared by the tests
    exits when one of them ends its last session, and a ``new-session`` of another test that
    reaches it then fails."""
    return ["tmux", "-L", session, *args]


def _pane(session: str) -> str:
    done = subprocess.run(_tmux(session, "capture-pane", "-p", "-t", session), capture_output=True,
                          text=True, timeout=10)
    return done.stdout if done.returncode == 0 else ""


def _session_alive(session: str) -> bool:
    return subprocess.run(_tmux(session, "has-session", "-t", session), capture_output=True,
                          timeout=10).returncode == 0


def _wait_screen(session: str, predicate: Callable[[str], object], what: str) -> str:
    """Poll the pane until ``predicate(screen)``; the last screen is in the failure."""
    screens = [""]

    def check() -> object:
        screens[0] = _pane(session)
        return predicate(screens[0])

    try:
        wait_until(check, 30, what, interval=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen:\n{screens[0]}") from None
    return screens[0]


def _row(screen: str, queue: str) -> list[str]:
    for line in screen.splitlines():
        cells = line.replace("│", " ").split()
        if cells and cells[0] == queue:
            return cells
    return []


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
def test_top_shows_counts_rates_workers_and_failed_jobs(server: RedisServer,
                                                        tmp_path: Path) -> None:
    url = server.url
    with SyncQueueClient(url) as client:
        for n in range(3):
            client.queue("cli-fail").add({"n": n})
        for n in range(5):
            client.queue("cli-echo").add({"n": n})
        # A paused queue keeps its waiting jobs: they show as waiting, with a lag.
        client.pause("cli-held")
        for n in range(4):
            client.queue("cli-held").add({"n": n})
        worker = WorkerProcess(tmp_path, "--url", url)
        try:
            wait_until(lambda: client.counts("cli-fail")[JobState.FAILED] == 3
                       and client.counts("cli-echo")[JobState.COMPLETED] == 5, 30,
                       "the worker to finish the jobs")
            session = f"pq-top-{uuid.uuid4().hex[:10]}"
            env = subprocess_env()
            command = " ".join(shlex.quote(part) for part in
                               panqueue_command("top", "--url", url, "--interval", "0.5"))
            # The pane's own size, not one inherited through COLUMNS / LINES.
            exports = f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(env['PYTHONPATH'])} "
            try:
                subprocess.run(_tmux(session, "new-session", "-d", "-s", session, "-x", "160",
                                "-y", "48", "-c", str(ROOT), exports + command), check=True,
                               timeout=10)
                screen = _wait_screen(
                    session, lambda s: _row(s, "cli-fail")[1:5] == ["0", "0", "0", "3"]
                    and _row(s, "cli-held")[1:2] == ["4"] and "1 live worker process(es)" in s,
                    "the queue rows to show the counts")
                held = _row(screen, "cli-held")
                assert "paused" in held, screen
                assert _row(screen, "cli-echo")[1:5] == ["0", "0", "0", "0"], screen
                # The worker process runs one worker per queue: it is one row with both
                # queues, and each queue's row counts it.
                [process] = client.worker_processes()
                [row] = [line for line in screen.splitlines() if process.name in line]
                assert "cli-echo,cli-fail" in row and "0/2" in row, screen
                assert _row(screen, "cli-fail")[-1] == "1", screen
                assert _row(screen, "cli-held")[-1] == "0", screen

                # Finished jobs now show as a rate: add more and wait for done/s above zero.
                for n in range(20):
                    client.queue("cli-echo").add({"more": n})
                _wait_screen(session, lambda s: _rate(s, "cli-echo") > 0,
                             "a completed rate for cli-echo")

                # Pick cli-fail (rows are sorted: cli-echo, cli-fail, cli-held) with j, then f.
                subprocess.run(_tmux(session, "send-keys", "-t", session, "j"), check=True,
                               timeout=10)
                subprocess.run(_tmux(session, "send-keys", "-t", session, "f"), check=True,
                               timeout=10)
                _wait_screen(session, lambda s: "failed jobs of cli-fail" in s
                             and "RuntimeError: cli-fail refuses" in s,
                             "the failed jobs with their errors")

                # The pane follows the selected queue: k goes back up to cli-echo.
                subprocess.run(_tmux(session, "send-keys", "-t", session, "k"), check=True,
                               timeout=10)
                _wait_screen(session, lambda s: "failed jobs of cli-echo" in s
                             and "no failed jobs" in s, "the failed pane to follow the queue")

                subprocess.run(_tmux(session, "send-keys", "-t", session, "q"), check=True,
                               timeout=10)
                wait_until(lambda: not _session_alive(session), 30,
                           "top to quit on q", interval=0.1)
            finally:
                subprocess.run(_tmux(session, "kill-session", "-t", session), capture_output=True,
                               timeout=10)
        finally:
            assert worker.stop() == 0


# A handler that runs for the time its job asks (the worker process imports this module).
TIMED_APP = """
import anyio
from panqueue import Job, Registry

queues = Registry()


@queues.handler("top-timed", concurrency=2)
async def timed(job: Job) -> None:
    await anyio.sleep(job.data["run"])
"""


def _seconds(cell: str) -> float:
    """A duration as the view prints it (``210ms``, ``1.25s``, ``2.0m``), in seconds."""
    match = re.fullmatch(r"([\d.]+)(ms|s|m|h)", cell)
    assert match, cell
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match[2]]
    return float(match[1]) * scale


def _percentiles(screen: str, queue: str) -> list[tuple[float, float]]:
    """The (p50, p95) cells of ``queue``'s row: wait, then run."""
    return [tuple(_seconds(part) for part in cell.split("/"))  # type: ignore[misc]
            for cell in _row(screen, queue) if re.fullmatch(r"[\d.]+[mhs]+/[\d.]+[mhs]+", cell)]


def test_percentile_is_the_nearest_rank() -> None:
    from panqueue._store.ops.timings import percentile

    values = [float(n) for n in range(100, 0, -1)]
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.95) == 95
    assert percentile([3.0], 0.95) == 3
    assert percentile([], 0.5) is None


@pytest.mark.anyio
async def test_the_async_client_reads_the_timings_of_every_partition(redis_url: str,
                                                                      queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, partitions=2)
    async def quick(job: Job) -> None:
        pass

    async with QueueClient(redis_url) as client:
        empty = await client.timings(queue_name)
        assert (empty.jobs, empty.wait_p50, empty.run_p95) == (0, None, None)
        await client.queue(quick).add_bulk([{"n": n} for n in range(4)])
        async with run_worker(registry, queue_name, redis_url):
            assert (await drain(redis_url, queue_name))[JobState.COMPLETED] == 4
        timings = await client.timings(queue_name, window=3600)
    assert timings.jobs == 4, timings
    assert timings.window == 3600
    assert timings.run_p95 is not None and timings.wait_p95 is not None


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
def test_top_shows_wait_and_run_percentiles_of_the_last_minute(
        server: RedisServer, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = server.url
    queue = "top-timed"
    (tmp_path / "timed_app.py").write_text(TIMED_APP)
    worker = WorkerProcess(tmp_path, "--url", url, app="timed_app:queues", path=tmp_path)
    request.addfinalizer(worker.kill)
    with SyncQueueClient(url) as client:
        # Jobs wait at least a second in a paused queue, then each runs 0.2 s.
        client.pause(queue)
        for n in range(6):
            client.queue(queue).add({"run": 0.2, "n": n})
        [head] = client.list_jobs(queue, JobState.WAITING, limit=1)
        assert head.enqueued_at is not None
        wait_until(lambda: (datetime.now(UTC) - head.enqueued_at).total_seconds() > 1.0
                   and any(queue in w.queues for w in client.workers()), 30,
                   "a second of waiting, and the worker to be up")
        assert client.counts(queue)[JobState.COMPLETED] == 0
        client.resume(queue)
        wait_until(lambda: client.counts(queue)[JobState.COMPLETED] == 6, 30,
                   "the worker to run the six jobs")

        timings = client.timings(queue)
        assert timings.jobs == 6, timings
        assert timings.wait_p50 is not None and timings.wait_p95 is not None
        assert 1.0 <= timings.wait_p50 <= timings.wait_p95 < 30, timings
        assert timings.run_p50 is not None and timings.run_p95 is not None
        assert 0.2 <= timings.run_p50 <= timings.run_p95 < 5, timings
        # The window is by finish time: these jobs leave a half-second window once older.
        wait_until(lambda: client.timings(queue, window=0.5).jobs == 0, 10,
                   "the jobs to fall out of a 0.5 s window")
        assert client.timings(queue).jobs == 6

        session = f"pq-top-{uuid.uuid4().hex[:10]}"
        env = subprocess_env()
        command = " ".join(shlex.quote(part) for part in
                           panqueue_command("top", "--url", url, "--interval", "0.5"))
        exports = f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(env['PYTHONPATH'])} "
        try:
            subprocess.run(_tmux(session, "new-session", "-d", "-s", session, "-x", "200",
                            "-y", "40", "-c", str(ROOT), exports + command), check=True,
                           timeout=10)
            screen = _wait_screen(session, lambda s: len(_percentiles(s, queue)) == 2
                                  and "finished in the last 60s" in s,
                                  "the wait and run columns of top-timed")
            (wait50, wait95), (run50, run95) = _percentiles(screen, queue)
            assert 1.0 <= wait50 <= wait95 < 30, screen
            assert 0.2 <= run50 <= run95 < 5, screen
            assert "wait p50/p95" in screen and "run p50/p95" in screen, screen
            assert f"{queue}  6 job(s) finished in the last 60s" in screen, screen
            subprocess.run(_tmux(session, "send-keys", "-t", session, "q"), check=True, timeout=10)
            wait_until(lambda: not _session_alive(session), 30, "top to quit on q",
                       interval=0.1)
        finally:
            subprocess.run(_tmux(session, "kill-session", "-t", session), capture_output=True,
                           timeout=10)
        assert worker.stop() == 0, worker.stderr


def _rate(screen: str, queue: str) -> float:
    row = _row(screen, queue)
    try:
        return float(row[5])
    except (IndexError, ValueError):
        return 0.0


def test_top_without_textual_names_the_extra_and_exits_2(server: RedisServer) -> None:
    code = ("import sys; sys.modules['textual'] = None; from panqueue.cli import main; "
            f"sys.exit(main(['top', '--url', {server.url!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=subprocess_env(), cwd=ROOT)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "panqueue[tui]" in lines[0], done.stderr


def test_core_and_cli_do_not_import_textual() -> None:
    code = ("import sys, panqueue, panqueue.cli, panqueue.cli._top; "
            "sys.exit(1 if 'textual' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=subprocess_env(), cwd=ROOT)
    assert done.returncode == 0, done


def test_top_refuses_a_bad_interval() -> None:
    done = run_cli("top", "--interval", "0")
    assert done.returncode == 2
    assert "--interval" in done.stderr


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
def test_top_with_a_prefix_shows_that_applications_queues_only(server: RedisServer) -> None:
    url = server.url
    with SyncQueueClient(url, prefix="topapp") as mine, SyncQueueClient(url) as bare:
        mine.queue("top-mine").add_bulk([{"n": n} for n in range(3)])
        bare.queue("top-theirs").add({"n": 9})
    session = f"pq-top-{uuid.uuid4().hex[:10]}"
    env = subprocess_env()
    command = " ".join(shlex.quote(part) for part in
                       panqueue_command("top", "--url", url, "--prefix", "topapp",
                                        "--interval", "0.5"))
    exports = f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(env['PYTHONPATH'])} "
    try:
        subprocess.run(_tmux(session, "new-session", "-d", "-s", session, "-x", "160", "-y", "48",
                        "-c", str(ROOT), exports + command), check=True, timeout=10)
        screen = _wait_screen(session, lambda s: _row(s, "top-mine")[1:2] == ["3"],
                              "the prefix's queue with its 3 waiting jobs")
        assert "top-theirs" not in screen, screen
        subprocess.run(_tmux(session, "send-keys", "-t", session, "q"), check=True, timeout=10)
        wait_until(lambda: not _session_alive(session), 30, "top to quit on q", interval=0.1)
    finally:
        subprocess.run(_tmux(session, "kill-session", "-t", session), capture_output=True,
                       timeout=10)


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
def test_top_quits_on_ctrl_c(server: RedisServer, tmp_path: Path) -> None:
    """Ctrl-C in the terminal quits top at once (exit 0), as q does: not a hint to press
    another key."""
    session = f"pq-top-{uuid.uuid4().hex[:10]}"
    env = subprocess_env()
    status = tmp_path / "status"
    command = " ".join(shlex.quote(part) for part in
                       panqueue_command("top", "--url", server.url, "--interval", "0.5"))
    exports = f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(env['PYTHONPATH'])} "
    try:
        subprocess.run(_tmux(session, "new-session", "-d", "-s", session, "-x", "160", "-y", "40",
                        "-c", str(ROOT), f"{exports}{command}; echo $? > {status}"),
                       check=True, timeout=10)
        _wait_screen(session, lambda s: "panqueue top" in s, "top to draw its screen")
        subprocess.run(_tmux(session, "send-keys", "-t", session, "C-c"), check=True, timeout=10)
        wait_until(lambda: not _session_alive(session), 15, "top to quit on Ctrl-C",
                   interval=0.1)
    finally:
        subprocess.run(_tmux(session, "kill-session", "-t", session), capture_output=True,
                       timeout=10)
    assert status.read_text().strip() == "0"


@pytest.mark.parametrize("count_after", [2, 1])
def test_the_samplers_rates_start_again_after_the_queues_partition_count_changed(
        redis_url: str, queue_name: str, count_after: int) -> None:
    """As the dashboard's: a partition count changed while `panqueue top` ran (drained,
    purged, deployed anew) leaves its rates' old position behind; they count on from the
    change."""
    from panqueue._tui import Sampler

    before, after = Registry(), Registry()

    @before.handler(queue_name, partitions=3)
    def work(job: Job[int]) -> None: ...

    @after.handler(queue_name, partitions=count_after)
    def work_again(job: Job[int]) -> None: ...

    with SyncQueueClient(redis_url) as client:
        client.queue(work).add(1)
        sampler = Sampler(client)
        sampler.snapshot()
        client.purge(queue_name)

        async def redeploy() -> None:
            async with run_worker(after, queue_name, redis_url):
                pass

        anyio.run(redeploy)
        client.queue(work_again).add(2)
        sampler.snapshot()
        rows = {row.name: row for row in sampler.snapshot().queues}
    assert rows[queue_name].counts[JobState.WAITING] == 1
