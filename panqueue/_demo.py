"""``panqueue demo``: a private server, jobs, worker processes, visible progress, a summary."""

from __future__ import annotations

import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio

from panqueue._client import SyncQueueClient
from panqueue._job import Job, JobState
from panqueue._options import Backoff
from panqueue._registry import Registry

__all__ = ["queues", "run_demo"]

queues = Registry()
QUEUE = "demo"


@queues.handler(QUEUE, concurrency=20, attempts=3, backoff=Backoff.fixed(0.2))
async def resize(job: Job) -> dict[str, int]:
    """Pretend to do 5-40 ms of I/O; about one job in ten fails its first attempt."""
    await anyio.sleep(random.uniform(0.005, 0.04))
    if job.attempt == 1 and random.random() < 0.1:
        raise RuntimeError("flaky upstream (the demo fails 10% of first attempts)")
    return {"n": job.data["n"], "doubled": job.data["n"] * 2}


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / max(total, 1))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def run_demo(url: str | None, jobs: int, workers: int) -> int:
    server = None
    if url is None:
        from panqueue.embedded import RedisServer

        directory = Path(".panqueue/demo-redis")
        shutil.rmtree(directory, ignore_errors=True)
        server = RedisServer(directory=directory).start()
        url = server.url
        print(f"started a private {Path(server.binary).name} on {url} (data in {directory})")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with SyncQueueClient(url) as client:
            queue = client.queue(QUEUE)
            baseline = client.counts(QUEUE)
            started = time.monotonic()
            handles = queue.add_bulk({"n": n} for n in range(jobs))
            print(f"enqueued {jobs} jobs on queue {QUEUE!r} in "
                  f"{(time.monotonic() - started) * 1000:.1f} ms")
            for _ in range(workers):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "panqueue", "worker", "panqueue._demo:queues",
                     "--url", url, "--log-level", "error", "--grace", "5"]))
            print(f"started {workers} worker processes (concurrency 20 each)")
            done = 0
            tty = sys.stdout.isatty()
            last_line = 0.0
            while done < jobs:
                counts = client.counts(QUEUE)
                finished = {s: counts[s] - baseline[s] for s in (JobState.COMPLETED,
                                                                 JobState.FAILED)}
                done = sum(finished.values())
                line = (f"{_bar(done, jobs)} {done}/{jobs} done  "
                        f"active={counts[JobState.ACTIVE]}  waiting={counts[JobState.WAITING]}"
                        f"  retrying={counts[JobState.DELAYED]}")
                if tty:  # redraw one line; in a log, one line every half second
                    print(f"\r{line}", end="", flush=True)
                elif time.monotonic() - last_line >= 0.5 or done >= jobs:
                    print(line, flush=True)
                    last_line = time.monotonic()
                if any(p.poll() is not None for p in procs):
                    print("\na worker exited early", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            elapsed = time.monotonic() - started
            if tty:
                print()
            infos = [h.info() for h in handles]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(30) for p in procs]
        procs.clear()
        completed = [i for i in infos if i.state is JobState.COMPLETED]
        retried = sum(1 for i in infos if i.attempts > 1)
        waits = [(i.started_at - i.enqueued_at).total_seconds() * 1000 for i in completed
                 if i.started_at and i.enqueued_at]
        print("summary")
        print(f"  jobs completed     {len(completed)}/{jobs}")
        print(f"  jobs failed        {jobs - len(completed)}")
        print(f"  jobs retried       {retried} (first attempt failed, a later one succeeded)")
        print(f"  elapsed            {elapsed:.2f} s ({jobs / elapsed:.0f} jobs/s)")
        if waits:
            print(f"  wait before start  p50 {statistics.median(waits):.0f} ms, "
                  f"max {max(waits):.0f} ms")
        print(f"  workers exited     {codes} (SIGTERM: graceful shutdown)")
        return 0 if len(completed) == jobs and all(c == 0 for c in codes) else 1
    finally:
        for p in procs:
            p.kill()
            p.wait()
        if server is not None:
            server.stop()
            print("stopped the private server")
