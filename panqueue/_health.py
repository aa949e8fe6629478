"""The worker's health endpoint: ``GET /healthz`` on a small HTTP server in a daemon thread.

The answer is 200 while the worker claims jobs and its event loop has had Redis answer a PING
within the last few seconds, 503 otherwise (starting, stopping, Redis unreachable, claims that
fail until one works again, or an event loop so blocked that it no longer pings). The body
is one JSON object: ``status``, ``queues``, ``processed``, ``failed`` (and ``reason`` when
unhealthy). Any other path is 404.

Standard library only: :mod:`http.server` serving one request at a time, which is plenty for
a liveness probe. The thread only reads the state the event loop writes; it never touches
Redis itself.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import anyio

from panqueue._client import QueueClient

__all__ = ["HealthServer", "HealthState"]

PING_INTERVAL = 1.0  # seconds between the event loop's PINGs
PING_TIMEOUT = 1.0  # a PING not answered within this counts as failed
STALE_AFTER = 3.0  # healthy only if the last answered PING is at most this old


class HealthState:
    """What ``/healthz`` reports: written by the event loop, read by the HTTP thread."""

    def __init__(self, queues: Sequence[str], counts: Callable[[], tuple[int, int]],
                 stale_after: float = STALE_AFTER,
                 claims_failing: Callable[[], bool] = lambda: False) -> None:
        self.queues = list(queues)
        # After an outage the PING may answer before the claim loop's next try (up to a second
        # later): ready means the claims work again, not only that Redis answers.
        self._claims_failing = claims_failing
        self.claiming = False  # every worker started, the pool still running
        self.stopping = False  # a shutdown has begun
        self.last_pong: float | None = None  # time.monotonic() of the last answered PING
        self._counts = counts
        self._stale_after = stale_after

    def report(self) -> tuple[int, dict[str, Any]]:
        """The HTTP status and the JSON body."""
        processed, failed = self._counts()
        body: dict[str, Any] = {"status": "ok", "queues": self.queues,
                                "processed": processed, "failed": failed}
        reason = None
        if not self.claiming or self.stopping:
            reason = "the worker is not claiming jobs (starting or stopping)"
        elif self.last_pong is None or time.monotonic() - self.last_pong > self._stale_after:
            reason = f"Redis has not answered a PING in the last {self._stale_after:g} s"
        elif self._claims_failing():
            reason = "claiming jobs fails; retrying until Redis answers"
        if reason is None:
            return 200, body
        body["status"] = "unavailable"
        body["reason"] = reason
        return 503, body

    async def keep_pinging(self, url: str, interval: float = PING_INTERVAL,
                           timeout: float = PING_TIMEOUT) -> None:
        """PING Redis every ``interval`` seconds from the event loop, until cancelled."""
        async with QueueClient(url) as client:
            while True:
                try:
                    with anyio.fail_after(timeout):
                        await client.ping()
                except Exception:  # unreachable, timed out: the answer gets stale
                    pass
                else:
                    self.last_pong = time.monotonic()
                await anyio.sleep(interval)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/healthz":
            self._answer(404, {"error": "not found; try /healthz"})
            return
        self._answer(*self.server.state.report())

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
    """``/healthz`` on ``host:port``; binds at construction (OSError if it cannot), serves
    from :meth:`start` in a daemon thread until :meth:`close`."""

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
