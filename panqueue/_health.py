"""The worker's health endpoints, on a small HTTP server in a daemon thread.

``GET /livez`` answers whether the event loop turns: 200 while it does, 503 once it has not
turned for :data:`LOOP_STALE` seconds, naming how long and the handler that blocks it (a
restart is what helps then). ``GET /readyz`` answers whether the worker serves its queues: 200
while it claims jobs and Redis answers, 503 otherwise, naming the actual cause: the worker
starting or stopping, the event loop blocked, Redis unreachable (with the error), claims that
fail, every queue it serves paused. ``GET /healthz`` is ``/readyz``. The body is one JSON
object: ``status``, ``queues``, ``processed``, ``failed`` (and ``reason`` when unavailable);
any other path is 404.

The causes are checked from the most specific: while the loop is blocked nothing it does can
happen (no PING, no claim), so a blocked loop is reported as such, never as Redis not
answering. Standard library only: :mod:`http.server` serving one request at a time, which is
plenty for a probe. The thread only reads the state the event loop writes (and, while the loop
is blocked, which handler's code is on the loop's stack); it never touches Redis itself.
"""

from __future__ import annotations

import builtins
import json
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import anyio

from panqueue._client import QueueClient
from panqueue.errors import ConnectionError as PanqueueConnectionError
from panqueue.errors import ServerUnavailable

__all__ = ["HealthServer", "HealthState"]

PING_INTERVAL = 1.0  # seconds between the event loop's PINGs
PING_TIMEOUT = 1.0  # a PING not answered within this counts as failed
STALE_AFTER = 3.0  # ready only if the last answered PING is at most this old
TURN_INTERVAL = 0.1  # seconds between the event loop's turns recorded for /livez
LOOP_STALE = 1.0  # the loop counts as blocked once it has not turned for this long

_PATHS = ("/livez", "/readyz", "/healthz")


class HealthState:
    """What the endpoints report: written by the event loop, read by the HTTP thread.

    ``blocked_by``: called from the HTTP thread while the loop is blocked, the handler whose
    code the loop is executing (``module:function at file:line``), or None if no handler is
    (see :meth:`panqueue._runtime.watchdog.LoopWatchdog.blocking`). ``prefix``: the key
    prefix of the worker's queues, under which :meth:`keep_pinging` reads which are paused.
    ``held``: called from the HTTP thread, the served queues whose worker an operator paused
    (``client.control(name, "pause")``)."""

    def __init__(self, queues: Sequence[str], counts: Callable[[], tuple[int, int]],
                 stale_after: float = STALE_AFTER,
                 claims_failing: Callable[[], BaseException | None] = lambda: None,
                 blocked_by: Callable[[], str | None] = lambda: None,
                 loop_stale: float = LOOP_STALE, prefix: str | None = None,
                 held: Callable[[], list[str]] = list,
                 stopped: Callable[[], list[str]] = list) -> None:
        self.queues = list(queues)
        self.prefix = prefix
        self._stopped = stopped  # the served queues whose worker is stopping (a stop command)
        # After an outage the PING may answer before the claim loop's next try (up to a second
        # later): ready means the claims work again, not only that Redis answers.
        self._claims_failing = claims_failing
        self._blocked_by = blocked_by
        self._held = held
        self.claiming = False  # every worker started, the pool still running
        self.stopping = False  # a shutdown has begun
        self.stop_reason = ""  # what started it (a signal, --burst, --reload)
        self.last_pong: float | None = None  # time.monotonic() of the last answered PING
        # Why the last PING failed (see _redis_failure); None once one answers.
        self.ping_error: str | None = None
        self.paused: list[str] = []  # the served queues found paused by the last check
        self.last_turn = time.monotonic()  # when the event loop last turned
        self.turned_after_block = 0.0  # when the loop turned again after a blockage
        self._counts = counts
        self._stale_after = stale_after
        self._loop_stale = loop_stale

    def turned(self) -> None:
        """Called by the event loop each time it turns."""
        now = time.monotonic()
        if now - self.last_turn >= self._loop_stale:
            self.turned_after_block = now
        self.last_turn = now

    def _blocked(self) -> str | None:
        blocked = time.monotonic() - self.last_turn
        if blocked < self._loop_stale:
            return None
        handler = self._blocked_by()
        if handler is None:
            return (f"event loop blocked for {blocked:.1f} s (no handler of this worker is "
                    f"running on it: other code blocks it)")
        return f"event loop blocked for {blocked:.1f} s by handler {handler}"

    def report(self, path: str = "/readyz") -> tuple[int, dict[str, Any]]:
        """The HTTP status and the JSON body for ``/livez`` or ``/readyz``."""
        processed, failed = self._counts()
        body: dict[str, Any] = {"status": "ok", "queues": self.queues,
                                "processed": processed, "failed": failed}
        if self.paused:
            body["paused"] = list(self.paused)
        reason = self._blocked() if path == "/livez" else self._not_ready()
        if reason is None:
            return 200, body
        body["status"] = "unavailable"
        body["reason"] = reason
        return 503, body

    def _not_ready(self) -> str | None:
        now = time.monotonic()
        if self.stopping:
            return "the worker is stopping" + (f" ({self.stop_reason})" if self.stop_reason
                                               else "") + ": it claims no more jobs"
        blocked = self._blocked()
        if blocked is not None:
            return blocked
        if self.ping_error is not None:
            return self.ping_error
        if not self.claiming:
            return "the worker is starting: it does not claim jobs yet"
        if self.last_pong is None or now - self.last_pong > self._stale_after:
            if now - self.turned_after_block <= self._stale_after:
                # The loop turns again; its next PING has not been answered yet.
                return (f"the event loop was blocked until {now - self.turned_after_block:.1f}"
                        f" s ago; Redis has not been checked since")
            return f"Redis has not answered a PING in the last {self._stale_after:g} s"
        claims = self._claims_failing()
        if claims is not None:
            return _redis_failure(claims) + " (claiming jobs fails; retrying)"
        if self.paused and set(self.paused) >= set(self.queues):
            resume = ("panqueue resume" if self.prefix is None
                      else f"panqueue resume --prefix {self.prefix}")
            hint = "; ".join(f"{resume} {shlex.quote(queue)}" for queue in self.paused)
            return f"every queue it serves is paused: {', '.join(self.paused)} ({hint})"
        stopped = self._stopped()
        if stopped and set(stopped) >= set(self.queues):
            return (f"the worker is stopping ({', '.join(stopped)}: a stop command): it claims "
                    "no more jobs")
        held = self._held()
        if held and set(held) | set(self.paused) >= set(self.queues):
            resume = ("panqueue workers --resume NAME" if self.prefix is None
                      else f"panqueue workers --prefix {self.prefix} --resume NAME")
            return (f"an operator paused this worker on {', '.join(held)} ({resume}): it "
                    "claims nothing there until resumed")
        return None

    async def keep_turning(self, interval: float = TURN_INTERVAL) -> None:
        """Record the loop's turns every ``interval`` seconds, until cancelled."""
        while True:
            self.turned()
            await anyio.sleep(interval)

    async def keep_pinging(self, url: str, interval: float = PING_INTERVAL,
                           timeout: float = PING_TIMEOUT) -> None:
        """PING Redis every ``interval`` seconds from the event loop, and read which served
        queues are paused (under :attr:`prefix`), until cancelled."""
        async with QueueClient(url, prefix=self.prefix) as client:
            while True:
                try:
                    with anyio.fail_after(timeout):
                        await client.ping()
                except Exception as exc:  # unreachable, refused, closed, timed out
                    self.ping_error = _redis_failure(exc, timeout)
                else:
                    self.last_pong = time.monotonic()
                    self.ping_error = None
                    try:
                        with anyio.fail_after(timeout):
                            self.paused = [queue for queue in self.queues
                                           if await client.is_paused(queue)]
                    except Exception:  # the PING's next round says why
                        pass
                await anyio.sleep(interval)


def _redis_failure(exc: BaseException, timeout: float = PING_TIMEOUT) -> str:
    """The cause a failed call to Redis gives, in words, with the error."""
    if isinstance(exc, ServerUnavailable):
        return f"Redis cannot serve now: {exc}"
    if isinstance(exc, PanqueueConnectionError):
        return f"Redis unreachable: {exc}"
    if isinstance(exc, builtins.TimeoutError):
        return f"Redis did not answer a PING within {timeout:g} s"
    return f"Redis call failed: {type(exc).__name__}: {exc}"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in _PATHS:
            self._answer(404, {"error": "not found; try /livez or /readyz"})
            return
        self._answer(*self.server.state.report(path))

    def do_HEAD(self) -> None:
        self.do_GET()

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = (json.dumps(body) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: stderr carries the worker's log lines only."""


class _Server(HTTPServer):
    def __init__(self, address: tuple[str, int], state: HealthState) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.state = state
        super().__init__(address, _Handler)


class HealthServer:
    """``/livez``, ``/readyz`` and ``/healthz`` on ``host:port``; binds at construction
    (OSError if it cannot), serves from :meth:`start` in a daemon thread until :meth:`close`.
    """

    def __init__(self, host: str, port: int, state: HealthState) -> None:
        self.state = state
        self._server = _Server((host, port), state)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="panqueue-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
