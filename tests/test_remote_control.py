"""Remote control (``client.control``, ``panqueue workers --stop/--pause/--resume/
--concurrency``): a real worker process applies a command at its next heartbeat: it changes
how many jobs it runs at once, stops claiming and claims again, and stops as on SIGTERM."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from panqueue import ConfigError, JobState, PanqueueError, SyncQueueClient
from panqueue._store import transitions
from tests.helpers import ROOT, WorkerProcess, run_cli, subprocess_env, wait_until
from tests.store_fixtures import ScriptStore
from tests.test_cli import ECHO, FAIL, assert_user_error

BEAT = 0.5  # the worker's heartbeat interval in these tests
JOB_SECONDS = 0.4
# A command is applied at the worker's next beat: within one interval, plus the time to claim.
WITHIN = BEAT + 1.0

WORKER = textwrap.dedent("""
    import sys

    import anyio

    from panqueue import Job, Registry, Worker

    url, queue, name = sys.argv[1:4]
    registry = Registry()


    @registry.handler(queue)
    async def slow(job: Job[float]) -> None:
        await anyio.sleep(job.data)


    async def main() -> None:
        worker = Worker(registry, queue, url=url, name=name, concurrency=1,
                        heartbeat_interval={beat})
        await worker.run()
        print("worker returned", flush=True)


    anyio.run(main)
""").format(beat=BEAT)


@pytest.fixture
def worker_process(tmp_path: Path, redis_url: str, queue_name: str
                   ) -> Iterator[tuple[subprocess.Popen[str], str]]:
    script = tmp_path / "control_worker.py"
    script.write_text(WORKER)
    name = f"ctl-{queue_name}"
    process = subprocess.Popen([sys.executable, str(script), redis_url, queue_name, name],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=subprocess_env(), cwd=ROOT)
    try:
        with SyncQueueClient(redis_url) as client:
            wait_until(lambda: any(w.name == name for w in client.workers(queue_name)),
                       timeout=20, what="the worker's first heartbeat")
        yield process, name
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        process.stderr.close()


def _active(client: SyncQueueClient, queue: str) -> int:
    return client.counts(queue)[JobState.ACTIVE]


def _within(predicate: object, seconds: float, what: str) -> None:
    assert callable(predicate)
    wait_until(predicate, timeout=seconds, what=what)


def test_a_worker_applies_concurrency_pause_resume_and_stop_within_a_heartbeat(
        redis_url: str, queue_name: str,
        worker_process: tuple[subprocess.Popen[str], str]) -> None:
    process, name = worker_process
    with SyncQueueClient(redis_url) as client:
        client.queue(queue_name).add_bulk([JOB_SECONDS] * 200)
        _within(lambda: _active(client, queue_name) == 1, 5, "one job running")
        peak = 0
        deadline = time.monotonic() + 3 * JOB_SECONDS
        while time.monotonic() < deadline:  # concurrency 1: never more than one at a time
            peak = max(peak, _active(client, queue_name))
        assert peak == 1

        client.control(name, concurrency=4)
        _within(lambda: _active(client, queue_name) == 4, WITHIN, "four jobs running")
        _within(lambda: [w.concurrency for w in client.workers(queue_name)] == [4], WITHIN,
                "the entry to report concurrency 4")

        client.control(name, "pause")
        # The jobs it holds finish; it claims nothing more.
        _within(lambda: _active(client, queue_name) == 0, WITHIN + JOB_SECONDS,
                "the paused worker to run nothing")
        waiting = client.counts(queue_name)[JobState.WAITING]
        time.sleep(3 * BEAT)  # a paused worker must stay idle for a while: nothing to await
        assert _active(client, queue_name) == 0
        assert client.counts(queue_name)[JobState.WAITING] == waiting
        [entry] = client.workers(queue_name)
        assert entry.paused and entry.concurrency == 4

        client.control(name, concurrency=2)  # kept for the resume
        client.control(name, "resume")
        _within(lambda: _active(client, queue_name) == 2, WITHIN, "two jobs running again")

        client.control(name, "stop")
        process.wait(timeout=WITHIN + JOB_SECONDS + 10)
        assert process.returncode == 0
        assert process.stdout is not None and "worker returned" in process.stdout.read()
        assert client.workers(queue_name) == []
        assert _active(client, queue_name) == 0  # the running jobs finished first
        with pytest.raises(PanqueueError, match=f"no live worker named '{name}'"):
            client.control(name, "resume")


def test_a_queue_whose_only_worker_is_paused_is_not_served_says_explain_and_check(
        redis_url: str, queue_name: str,
        worker_process: tuple[subprocess.Popen[str], str]) -> None:
    """A worker an operator paused claims nothing: explain says so (not "queued" behind its
    free slots), and `panqueue check` fails for its queue until it is resumed."""
    _, name = worker_process
    with SyncQueueClient(redis_url) as client:
        client.control(name, "pause")
        _within(lambda: [w.paused for w in client.workers(queue_name)] == [True], WITHIN,
                "the entry to say paused")
        job = client.queue(queue_name).add(0.0)
        why = client.explain(queue_name, job.id)
        assert why.reason == "no_worker" and "paused by an operator" in why.detail, why
        assert name in why.detail
        held = run_cli("check", queue_name, "--url", redis_url)
        assert_user_error(held, "paused by an operator", queue_name)
        assert held.returncode == 1
        client.control(name, "resume")
        _within(lambda: client.counts(queue_name)[JobState.COMPLETED] == 1, WITHIN,
                "the resumed worker to run the job")
        _within(lambda: [w.paused for w in client.workers(queue_name)] == [False], WITHIN,
                "the entry to say resumed")
        served = run_cli("check", queue_name, "--url", redis_url)
        assert served.returncode == 0 and served.stdout.strip() == "ok", served.stderr


def test_control_refuses_bad_commands_before_writing(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        with pytest.raises(ConfigError, match="unknown control command 'halt'"):
            client.control("w", "halt")
        with pytest.raises(ConfigError, match="one command"):
            client.control("w", "stop", concurrency=2)
        with pytest.raises(ConfigError, match="concurrency"):
            client.control("w", concurrency=0)


def test_cli_workers_stop_and_concurrency(
        redis_url: str, queue_name: str,
        worker_process: tuple[subprocess.Popen[str], str]) -> None:
    process, name = worker_process
    with SyncQueueClient(redis_url) as client:
        client.queue(queue_name).add_bulk([JOB_SECONDS] * 100)
        sent = run_cli("workers", "--concurrency", f"{name}=3", "--url", redis_url)
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout == f"{name}: concurrency 3 sent (applied at its next heartbeat)\n"
        _within(lambda: _active(client, queue_name) == 3, WITHIN, "three jobs running")
        stopped = run_cli("workers", "--stop", name, "--url", redis_url)
        assert stopped.returncode == 0, stopped.stderr
        process.wait(timeout=WITHIN + JOB_SECONDS + 10)
        assert process.returncode == 0
    unknown = run_cli("workers", "--stop", "nobody", "--url", redis_url)
    assert_user_error(unknown, "no live worker named 'nobody'")
    assert unknown.returncode == 1
    bad = run_cli("workers", "--concurrency", "w=zero", "--url", redis_url)
    assert_user_error(bad, "--concurrency takes NAME=N")
    assert bad.returncode == 2


def test_a_panqueue_worker_process_serving_two_queues_stops_on_workers_stop(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    """`panqueue worker` with --name serves each queue under that name: one command reaches
    every queue it serves, and the process exits 0 as after SIGTERM."""
    name = f"cli-{uuid.uuid4().hex[:8]}"
    worker = start_worker("--url", redis_url, "--name", name)
    with SyncQueueClient(redis_url) as client:
        wait_until(lambda: [w.queues for w in client.workers() if w.name == name]
                   == [sorted([ECHO, FAIL])], 20, "the worker to serve both queues")
    stopped = run_cli("workers", "--stop", name, "--url", redis_url)
    assert stopped.returncode == 0, stopped.stderr
    # The default heartbeat is 5 s: the command is applied within one.
    assert worker.process.wait(timeout=5 + 10) == 0
    assert "worker stopped" in worker.stderr


def test_a_command_goes_only_to_the_process_it_was_queued_for(store: ScriptStore) -> None:
    """A process that starts under the name of one that died (its entry still live) drops
    the commands queued for that one; later commands reach it."""
    def beat(pid: int) -> list[str]:
        _, commands = store.t.run(transitions.heartbeat(
            store.keys, "reused-name", 30_000, host="h", pid=pid, queues=[store.keys.name],
            concurrency=1, running=[], take_commands=uuid.uuid4().hex))
        return commands

    store.add_one()  # the queue exists (a worker's setup makes it so)
    assert beat(pid=1) == []
    with SyncQueueClient(store.t.url) as client:
        client.control("reused-name", "stop")
        assert beat(pid=2) == []  # a new process: the stop was for pid 1
        client.control("reused-name", concurrency=3)
        client.control("reused-name", "pause")
        assert beat(pid=2) == ["concurrency:3", "pause"]
        assert beat(pid=2) == []  # each once


def test_a_beat_sent_again_gets_the_commands_its_first_send_took(store: ScriptStore) -> None:
    """The beat that takes a worker's commands may lose its reply, or a later write of the
    same beat may fail: the worker sends it again under the same request id and gets the
    same commands; the next beat's new id takes what came since."""
    def beat(take: str) -> list[str]:
        _, commands = store.t.run(transitions.heartbeat(
            store.keys, "w", 30_000, host="h", pid=1, queues=[store.keys.name],
            concurrency=1, running=[], take_commands=take))
        return commands

    store.add_one()
    assert beat("first") == []
    with SyncQueueClient(store.t.url) as client:
        client.control("w", "pause")
        assert beat("second") == ["pause"]
        assert beat("second") == ["pause"]  # the same call again: its reply was lost
        client.control("w", "resume")
        assert beat("third") == ["resume"]
        assert beat("fourth") == []


@pytest.mark.anyio
@pytest.mark.parametrize("lost", ["the reply", "the call"])
async def test_a_command_is_applied_though_the_beat_that_took_it_failed(
        redis_url: str, queue_name: str, lost: str) -> None:
    """The beat that took the command ran on the server, and its reply was lost (the call is
    sent again at once), or its call failed for good (the next beat tries again): the command
    was gone with it, and the worker ran on. It is taken again, once."""
    from panqueue._keys import QueueKeys
    from panqueue._log import get_logger
    from panqueue._runtime.heartbeat import Heartbeat
    from panqueue._store.transport import open_async_transport
    from panqueue.testing import FaultProxy

    applied: list[list[str]] = []

    async def on_commands(commands: list[str]) -> None:
        applied.append(commands)

    with FaultProxy(int(redis_url.rsplit(":", 1)[1].split("/")[0])) as proxy, \
            SyncQueueClient(redis_url) as client:
        client.queue(queue_name).add(1)  # the queue exists
        transport = open_async_transport(proxy.url_for(redis_url))
        try:
            beats = Heartbeat(transport, [QueueKeys(queue_name)], name="w",
                              concurrency=lambda: (1, False), running=list, interval=5.0,
                              log=get_logger("test"), on_commands=on_commands)
            await beats.beat()
            client.control("w", "stop")
            # Its record names its concurrency: no other call does.
            proxy.drop_next_reply(2 if lost == "the call" else 1, match=b"concurrency")
            if lost == "the call":  # the send and its one resend: the beat fails
                with pytest.raises(PanqueueError):
                    await beats.beat()
                assert applied == [[]]
            await beats.beat()
            await beats.beat()
        finally:
            await transport.aclose()
    assert applied == [[], ["stop"], []]
