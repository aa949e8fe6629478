"""Helpers for tests that run panqueue in child processes."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import itertools
import logging
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import redis
import sniffio
from anyio.from_thread import BlockingPortal

from panqueue import Job, Registry
from panqueue._store.loader import SCRIPTS, Script

ROOT = Path(__file__).resolve().parent.parent
APPS = ROOT / "tests" / "apps"


# The ports free_port hands out: below the kernel's ephemeral range (32768-60999 here), from
# which every bind to port 0 and every outgoing connection takes its port, and low enough that
# a cluster node's bus (port + 10000) stays below it too. Each process starts at a port of its
# own and goes round from there.
_PORTS = range(10_000, 20_000)
_PORT_LOCKS = Path(tempfile.gettempdir()) / "panqueue-test-ports"
_port_turn = itertools.count(random.randrange(len(_PORTS)))
_held_ports: list[int] = []  # the lock files' descriptors, held while this process lives


def free_port() -> int:
    """A TCP port on 127.0.0.1 for a test's own listener (a worker's health or metrics
    endpoint, a server, a port where nothing listens), that no other test process is handed:
    each port's lock file is held by the process it was handed to for as long as it lives,
    whichever run or leg of the suite that process belongs to. A port from the kernel's
    ephemeral range could be taken, between the pick and the bind, by another test's listener
    or by any outgoing connection."""
    _PORT_LOCKS.mkdir(exist_ok=True)
    for _ in _PORTS:
        port = _PORTS[next(_port_turn) % len(_PORTS)]
        lock = os.open(_PORT_LOCKS / str(port), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind(("127.0.0.1", port))  # nothing else on the machine holds it
        except OSError:
            os.close(lock)
            continue
        _held_ports.append(lock)
        return port
    raise RuntimeError(f"no free port in {_PORTS.start}-{_PORTS.stop - 1}")


def panqueue_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "panqueue", *args]


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: the tests directory importable, no inherited URL."""
    env = {k: v for k, v in os.environ.items() if k != "PANQUEUE_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "apps"), str(ROOT)])
    env.update(extra)
    return env


# The commands that only talk to Redis (no application module, no server, no signal handling,
# no logging setup): run_cli runs them in the test's own process, through the same entry point
# (panqueue.cli.main, its exit codes and one-line errors), with its own stdin, stdout, stderr
# and environment. A child process would cost about 0.2 s of CPU to start;
# the suite runs a few hundred such commands. The commands' process side (python -m panqueue,
# its exit status) is covered by the worker, demo, server and dashboard tests, which stay
# child processes, and by run_cli(..., process=True).
IN_PROCESS = frozenset({
    "cancel", "dlq", "enqueue", "explain", "info", "job", "jobs", "pause", "purge", "remove",
    "resume", "schedules", "signal", "stats", "workers",
})


def run_cli(*args: str, timeout: float = 60, process: bool = False,
            **env: str) -> subprocess.CompletedProcess[str]:
    """``panqueue ARGS`` with ``env`` added to its environment (PANQUEUE_URL removed): its exit
    status, stdout and stderr. A command of :data:`IN_PROCESS` runs in this process, unless
    ``process`` or an event loop runs here (the command runs one of its own)."""
    if not process and args and args[0] in IN_PROCESS and not _in_event_loop():
        return _run_cli_here(list(args), env)
    return subprocess.run(panqueue_command(*args), capture_output=True, text=True,
                          timeout=timeout, env=subprocess_env(**env), cwd=ROOT)


def _in_event_loop() -> bool:
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return False
    return True


def _run_cli_here(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    from panqueue.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with environment({"PANQUEUE_URL": None, **env}), \
            contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        saved_stdin, sys.stdin = sys.stdin, io.StringIO()
        try:
            code = main(args)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        finally:
            sys.stdin = saved_stdin
    return subprocess.CompletedProcess(["panqueue", *args], code, stdout.getvalue(),
                                       stderr.getvalue())


@contextlib.contextmanager
def environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """``os.environ`` with ``changes`` (None: removed) for the block, as it was after it."""
    saved = {name: os.environ.get(name) for name in changes}
    try:
        _set_environ(changes)
        yield
    finally:
        _set_environ(saved)


def _set_environ(values: Mapping[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def echo_registry(prefix: str, count: int) -> tuple[Registry, list[str]]:
    """``count`` queues of names of their own (``<prefix>-<tag>-<i>``), each with a handler
    that answers ``"<queue>:<data>"``."""
    tag = uuid.uuid4().hex[:8]
    queues = [f"{prefix}-{tag}-{i}" for i in range(count)]
    registry = Registry()
    for name in queues:
        @registry.handler(name)
        async def echo(job: Job) -> str:
            return f"{job.queue}:{job.data}"
    return registry, queues


def wait_until(predicate: Callable[[], object], timeout: float = 10.0,
               what: str = "condition", interval: float = 0.01) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


async def async_wait_until(predicate: Callable[[], Awaitable[object]], timeout: float = 10.0,
                           what: str = "condition", interval: float = 0.01) -> None:
    """Async :func:`wait_until` (the predicate is awaited)."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await anyio.sleep(interval)


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.entries: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.msg  # panqueue's records carry the event and its fields
        self.entries.append({"event": getattr(message, "event", record.getMessage()),
                             "log_level": record.levelname.lower(),
                             **getattr(message, "fields", {})})


@contextlib.contextmanager
def capture_panqueue_logs() -> Iterator[list[dict[str, Any]]]:
    """Every record of the ``panqueue`` loggers (DEBUG included) while the block runs, each as
    a dict: ``event``, ``log_level`` and the line's fields."""
    collector = _Collector()
    panqueue_logger = logging.getLogger("panqueue")
    level = panqueue_logger.level
    panqueue_logger.addHandler(collector)
    panqueue_logger.setLevel(logging.DEBUG)
    try:
        yield collector.entries
    finally:
        panqueue_logger.removeHandler(collector)
        panqueue_logger.setLevel(level)


class WorkerProcess:
    """``panqueue worker`` as a child process; its output goes to files, not pipes.
    ``app``: the registry to serve; ``path``: a directory put first on its PYTHONPATH (for an
    app module a test writes); ``env``: more environment variables."""

    def __init__(self, tmp_path: Path, *args: str, app: str = "cli_app:queues",
                 path: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.stdout_path = tmp_path / "worker.out"
        self.stderr_path = tmp_path / "worker.err"
        env = subprocess_env(**(env or {}))
        if path is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(path), env["PYTHONPATH"]])
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.process = subprocess.Popen(
                panqueue_command("worker", app, *args), stdin=subprocess.DEVNULL,
                stdout=out, stderr=err, env=env, cwd=ROOT)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (the graceful shutdown), and the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()


def ask_node(port: int, *command: Any) -> Any:
    """One command to the server on loopback ``port``, decoded; None if it cannot answer (a
    node killed or failing over)."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, decode_responses=True)
    try:
        return client.execute_command(*command)
    except redis.exceptions.RedisError:
        return None
    finally:
        client.close()


def pausing_after_the_zadd(op: Iterator[Any], meanwhile: Callable[[], Any]) -> Iterator[Any]:
    """``op`` (a batch's open), with ``meanwhile()`` run once its callback queue learned of the
    batch (the ZADD to that queue's "batches" set was answered), before the batch is made: a
    client slowed between the two steps of the open while another ran."""
    request = next(op)
    while True:
        try:
            reply = yield request
        except Exception as exc:
            request = op.throw(exc)
            continue
        if getattr(request, "args", ("",))[0] == "ZADD":
            meanwhile()
        try:
            request = op.send(reply)
        except StopIteration as done:
            return done.value


def load_scripts(client: redis.Redis, *scripts: Script) -> None:
    """``scripts`` (all of them by default) in the server's caches, their library loaded and
    their body in the script cache: each call of one is then one request and one reply (no
    first call refused for a missing library or script, then sent again)."""
    for script in scripts or tuple(SCRIPTS):
        client.script_load(script.body)
        if script.library is not None:
            client.execute_command("FUNCTION", "LOAD", "REPLACE", script.library)


def call_of(script: Script) -> bytes:
    """What a request that calls ``script`` contains: the name of its library's function."""
    assert script.function is not None, script.name
    return script.function.encode()


def command_calls(client: redis.Redis, *commands: str) -> int:
    """How many times the server has executed ``commands`` (``INFO commandstats`` names, such
    as ``fcall`` or ``function|load``), together."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in commands)


def script_calls(client: redis.Redis) -> int:
    """How many script calls (FCALL and EVALSHA) the server has executed."""
    return command_calls(client, "fcall", "evalsha")


@contextlib.contextmanager
def asyncio_run_portal(run_loop: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
                       ) -> Iterator[BlockingPortal]:
    """A blocking portal into an event loop that ``run_loop`` (``asyncio.run``, or ``uvloop.run``)
    started in a thread of its own, as an ASGI server starts its loop. Under ``anyio.run``
    (anyio's pytest plugin, its ``start_blocking_portal``) a context variable tells anyio which
    loop runs, even where no task does (an asyncio protocol's callback); in an application's
    loop only a running task tells it. The portal's own calls set that variable: enter what is
    to run as an application's would in :func:`as_in_an_application`."""
    handed: queue.Queue[BlockingPortal | BaseException] = queue.Queue()

    def run() -> None:
        async def main() -> None:
            async with BlockingPortal() as portal:
                handed.put(portal)
                await portal.sleep_until_stopped()

        try:
            run_loop(main())
        except BaseException as exc:
            handed.put(exc)
            raise

    thread = threading.Thread(target=run, name="asyncio-run-portal", daemon=True)
    thread.start()
    portal = handed.get(timeout=30)
    if isinstance(portal, BaseException):
        raise portal
    try:
        yield portal
    finally:
        with contextlib.suppress(RuntimeError):  # the loop ended already (its error below)
            portal.call(portal.stop)
        thread.join(30)
        if not handed.empty():
            raise handed.get()  # what ended the loop: a task of the portal's that failed


@contextlib.asynccontextmanager
async def as_in_an_application(manager: contextlib.AbstractAsyncContextManager[Any]
                               ) -> AsyncIterator[Any]:
    """``manager`` entered without the context variable by which anyio's runner (and a
    blocking portal's calls) tell sniffio which event loop runs: what the tasks it starts,
    and the callbacks of the connections they open, see is what they see under an
    application's ``asyncio.run``."""
    sniffio.current_async_library_cvar.set(None)
    async with manager as value:
        yield value


async def run_a_task_whose_cleanup_raises(started: anyio.Event) -> None:
    """What a handler under test does: start a task of its own, in its own task group, whose
    cleanup raises (``ValueError("cleanup failed")``) when the handler is cancelled; set
    ``started``; then wait (for a cancel)."""
    async def child() -> None:
        try:
            await anyio.sleep(60)
        finally:
            raise ValueError("cleanup failed")

    async with anyio.create_task_group() as group:
        group.start_soon(child)
        started.set()
        await anyio.sleep(60)
