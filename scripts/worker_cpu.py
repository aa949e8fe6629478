"""What a plain no-op job costs the worker: CPU per job of one Worker run in this process.

    .venv/bin/python scripts/worker_cpu.py [--jobs N] [--backend asyncio|trio]
                                           [--profile FILE] [--top K]

Starts a private redis-server (appendonly off, RDB off), adds N no-op jobs to ``bench-noop``
(``bench_app:queues``, concurrency 50) with ``add_bulk``, then runs a Worker in this process
until it has completed them all, logging at warning. The figure is the process's CPU time
(``time.process_time``: every thread, user and system) from the end of the worker's start to
the last completion, per job: the quantity of ``scripts/bench.py``'s "worker CPU per job",
without a second process or the benchmark's polling. With ``--profile`` the drain runs under
cProfile (which inflates the CPU figure) and the ``K`` entries of most own time are printed.
The Redis on 6379 is never touched.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import anyio

from panqueue import SyncQueueClient
from panqueue._log import configure_logging
from panqueue._runtime.worker import Worker
from panqueue.embedded import RedisServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_app

QUEUE = "bench-noop"
BATCH = 1000


def drain(url: str, n: int, backend: str, profile: str) -> tuple[float, float]:
    """CPU µs per job and jobs/s of one worker draining ``n`` jobs."""
    figures: list[float] = []

    async def main() -> None:
        worker = Worker(bench_app.queues, QUEUE, url=url, concurrency=50)
        profiler = cProfile.Profile() if profile else None
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            cpu0, t0 = time.process_time(), time.perf_counter()
            if profiler is not None:
                profiler.enable()
            while worker.processed < n:
                await anyio.sleep(0.005)
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(profile)
            cpu1, t1 = time.process_time(), time.perf_counter()
            figures.extend([(cpu1 - cpu0) / n * 1e6, n / (t1 - t0)])
            await worker.shutdown(1)

    anyio.run(main, backend=backend)
    return figures[0], figures[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--profile", metavar="FILE", default="",
                        help="run the drain under cProfile, its stats written to FILE")
    parser.add_argument("--top", type=int, default=40, help="profile entries to print")
    args = parser.parse_args()
    configure_logging("console", "warning")
    with tempfile.TemporaryDirectory() as tmp, \
            RedisServer(directory=tmp, appendonly=False, extra_args=("--save", "")) as server:
        with SyncQueueClient(server.url) as client:
            queue = client.queue(QUEUE)
            for b in range(0, args.jobs, BATCH):
                queue.add_bulk([{"i": i} for i in range(b, min(b + BATCH, args.jobs))])
        cpu, rate = drain(server.url, args.jobs, args.backend, args.profile)
    print(f"{args.backend}: worker CPU {cpu:.1f} µs/job, {rate:,.0f} jobs/s "
          f"({args.jobs:,} no-op jobs, concurrency 50)")
    if args.profile:
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
