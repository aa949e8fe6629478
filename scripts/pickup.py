"""How long a single add takes, and how soon an idle worker starts the job it adds.

    .venv/bin/python scripts/pickup.py [--jobs N] [--interval-ms MS] [--backend asyncio|trio]

Starts a private redis-server (appendonly off, RDB off) and one worker process (a no-op
handler, concurrency 50, like the peer benchmark's), waits until it has run a first job, then
adds N jobs one at a time, one every MS milliseconds, from a ``SyncQueueClient`` in this
process. Each job carries the wall-clock time taken just before its ``add()``; the handler
records how long after that it started (the peer benchmark's pickup latency). Prints the
median, 90th and 99th percentile of the pickup and of the ``add()`` calls themselves, and the
median of as many adds made back to back. Only public API is used, so the script measures any
version of panqueue (``PYTHONPATH=<checkout>``). The Redis on 6379 is never touched.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import anyio

import panqueue
from panqueue.embedded import RedisServer

QUEUE = "pickup"


def _worker(url: str, n: int, backend: str, out: Any) -> None:
    registry = panqueue.Registry()
    started: list[float] = []

    @registry.handler(QUEUE, concurrency=50)
    async def noop(job: panqueue.Job[Any]) -> None:
        started.append((time.time() - job.data["ts"]) * 1000)
        if len(started) == n + 1:  # the first is the warm-up job
            out.put(started[1:])

    async def main() -> None:
        async with panqueue.WorkerPool(registry, url=url, queues=[QUEUE]):
            await anyio.sleep_forever()

    anyio.run(main, backend=backend)


def paced(jobs: int, interval_ms: float) -> Iterator[int]:
    """0 to ``jobs - 1``, each at its time: one every ``interval_ms`` from the first."""
    start = time.perf_counter()
    for i in range(jobs):
        pause = start + i * interval_ms / 1000 - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        yield i


def _percentiles(values: list[float]) -> str:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return f"p50 {at(0.5):.3f}  p90 {at(0.9):.3f}  p99 {at(0.99):.3f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    results: Any = multiprocessing.Queue()
    with tempfile.TemporaryDirectory() as tmp, \
            RedisServer(directory=tmp, appendonly=False, extra_args=("--save", "")) as server:
        worker = multiprocessing.Process(
            target=_worker, args=(server.url, args.jobs, args.backend, results), daemon=True)
        worker.start()
        try:
            with panqueue.SyncQueueClient(server.url) as client:
                queue = client.queue(QUEUE)
                queue.add({"ts": time.time()}).result(timeout=30)  # the worker is up
                time.sleep(0.5)
                calls = []
                for _ in paced(args.jobs, args.interval_ms):
                    before = time.perf_counter()
                    queue.add({"ts": time.time()})
                    calls.append((time.perf_counter() - before) * 1000)
                pickups = results.get(timeout=60)
                back_to_back = []
                for _ in range(args.jobs):
                    before = time.perf_counter()
                    queue.add({"ts": time.time()})
                    back_to_back.append((time.perf_counter() - before) * 1000)
        finally:
            worker.kill()
            worker.join(10)
    print(f"panqueue {panqueue.__version__}, {args.backend} worker, {args.jobs} jobs "
          f"{args.interval_ms:g} ms apart")
    print(f"  pickup           {_percentiles(pickups)}")
    print(f"  add(), paced     {_percentiles(calls)}")
    print(f"  add(), back to back  median {statistics.median(back_to_back):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
