"""Where a pickup's time goes: the producer, the server and the idle worker, per job.

    .venv/bin/python scripts/pickup_phases.py [--jobs N] [--interval-ms MS]

Like ``scripts/pickup.py`` (a private redis-server, one asyncio worker process with a no-op
handler at concurrency 50, N single adds from a ``SyncQueueClient``, MS milliseconds apart),
but each phase of each pickup is timed on the one clock both processes share
(``time.monotonic``): from ``add()`` to the request's send (redis-py's
``send_packed_command``), from the send to the wake-up message's bytes reaching the worker
(``data_received`` of its subscription's protocol: the server's part and both wake-ups), from
there to ``Claimer.handoff`` and to the handler's start. Prints the median of each, and of
the send to the add's reply. It wraps those internals, so it runs against versions whose
asyncio subscription has its own protocol (``PYTHONPATH=<checkout>`` to compare two). The
Redis on 6379 is never touched.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import redis.connection

import panqueue
from panqueue.embedded import RedisServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pickup import paced  # beside this script

QUEUE = "pickup"


def _worker(url: str, n: int, out: Any) -> None:
    from panqueue._runtime import claimer
    from panqueue._store.transport import aio_subscriber

    arrived: list[float] = []
    handed: list[float] = []
    started: list[float] = []
    received = aio_subscriber._Protocol.data_received
    handoff = claimer.ClaimLoop.handoff

    def data_received(self: Any, data: bytes) -> None:
        arrived.append(time.monotonic())
        received(self, data)

    def timed_handoff(self: Any, jobs: Any) -> None:
        handed.append(time.monotonic())
        handoff(self, jobs)

    aio_subscriber._Protocol.data_received = data_received  # type: ignore[method-assign]
    claimer.ClaimLoop.handoff = timed_handoff  # type: ignore[method-assign]
    registry = panqueue.Registry()

    @registry.handler(QUEUE, concurrency=50)
    async def noop(job: panqueue.Job[Any]) -> None:
        started.append(time.monotonic())
        if len(started) == n + 1:  # the first is the warm-up job
            out.put((arrived, handed, started[1:]))

    async def main() -> None:
        async with panqueue.WorkerPool(registry, url=url, queues=[QUEUE]):
            await anyio.sleep_forever()

    anyio.run(main)


def _first(times: list[float], after: float, before: float) -> float | None:
    return next((t for t in times if after <= t <= before), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    args = parser.parse_args()
    results: Any = multiprocessing.Queue()
    sends: list[float] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def timed_send(self: Any, command: Any, check_health: bool = True) -> None:
        sends.append(time.monotonic())
        send(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = timed_send  # type: ignore
    with tempfile.TemporaryDirectory() as tmp, \
            RedisServer(directory=tmp, appendonly=False, extra_args=("--save", "")) as server:
        worker = multiprocessing.Process(target=_worker, args=(server.url, args.jobs, results),
                                         daemon=True)
        worker.start()
        try:
            with panqueue.SyncQueueClient(server.url) as client:
                queue = client.queue(QUEUE)
                queue.add(None).result(timeout=30)  # the worker is up
                time.sleep(0.5)
                calls: list[tuple[float, float]] = []
                for _ in paced(args.jobs, args.interval_ms):
                    before = time.monotonic()
                    queue.add(None)
                    calls.append((before, time.monotonic()))
                arrived, handed, started = results.get(timeout=60)
        finally:
            worker.kill()
            worker.join(10)
    phases: dict[str, list[float]] = {name: [] for name in (
        "pickup", "add() to send", "send to message", "message to handoff",
        "message to handler", "send to reply")}
    for (before, after), begun in zip(calls, started, strict=True):
        sent = _first(sends, before, after)
        message = _first(arrived, sent or before, begun)
        handoff = _first(handed, message or before, begun)
        if sent is None or message is None or handoff is None:
            continue
        for name, value in (("pickup", begun - before), ("add() to send", sent - before),
                            ("send to message", message - sent),
                            ("message to handoff", handoff - message),
                            ("message to handler", begun - message),
                            ("send to reply", after - sent)):
            phases[name].append(value * 1e6)
    print(f"panqueue {panqueue.__version__}, asyncio worker, {args.jobs} jobs "
          f"{args.interval_ms:g} ms apart ({len(phases['pickup'])} timed whole); medians:")
    for name, values in phases.items():
        print(f"  {name:<20} {statistics.median(values):7.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
