"""``panqueue demo``: a private server, jobs, worker processes, visible progress, a summary."""

from __future__ import annotations

import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio

from panqueue._client import SyncQueueClient
from panqueue._job import Job, JobInfo, JobState
from panqueue._options import Backoff
from panqueue._producer import SyncJobHandle
from panqueue._registry import Registry
from panqueue._store.transport import redact_url
from panqueue.errors import JobNotFound, PanqueueError

__all__ = ["queues", "run_demo"]

queues = Registry()
QUEUE = "demo"
_READY_WITHIN = 60.0  # seconds the worker processes get to start serving the queue


@queues.handler(QUEUE, concurrency=20, attempts=3, backoff=Backoff.fixed(0.2))
async def resize(job: Job) -> dict[str, int]:
    """Pretend to do 5-40 ms of I/O; about one job in ten fails its first attempt."""
    await anyio.sleep(random.uniform(0.005, 0.04))
    if job.attempt == 1 and random.random() < 0.1:
        raise RuntimeError("flaky upstream (the demo fails 10% of first attempts)")
    return {"n": job.data["n"], "doubled": job.data["n"] * 2}


_FINAL = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


def _newly_finished(client: SyncQueueClient, pending: set[str],
                    finished: dict[str, JobInfo | None]) -> None:
    """Move the ``pending`` ids whose job reached a final state into ``finished``, with the
    job's record; ``None`` when retention already trimmed the record (so it had finished)."""
    for job_id in list(pending):
        try:
            info: JobInfo | None = client.get_job(QUEUE, job_id)
        except JobNotFound:
            info = None
        if info is None or info.state in _FINAL:
            pending.discard(job_id)
            finished[job_id] = info


def _remove_jobs(url: str, prefix: str | None, ids: list[str], *, purge: bool) -> None:
    """Remove the demo's jobs from a server that is not its own (cancelling any still
    running after an early stop), and with ``purge`` the queue's settings too; say how many
    could not be removed."""
    left = 0
    with SyncQueueClient(url, prefix=prefix) as client:
        for job_id in ids:
            try:
                client.remove(QUEUE, job_id)
            except PanqueueError:
                try:
                    client.cancel(QUEUE, job_id)
                    client.remove(QUEUE, job_id)
                except PanqueueError:
                    left += 1
        if purge and not left:
            client.purge(QUEUE)
    print(f"removed the demo's {len(ids) - left} jobs from {redact_url(url)}"
          + (f"; {left} still running could not be removed" if left else ""))


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / max(total, 1))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def run_demo(url: str | None, jobs: int, workers: int, prefix: str | None = None) -> int:
    """Run the demo on ``url`` (else on a private server it starts and stops), under the key
    prefix ``prefix``. On the user's server every job it added is removed at the end, and the
    queue too if the demo made it."""
    server = None
    if url is not None:
        print(f"using the server at {redact_url(url)} (jobs added there are removed at the end)")
    else:
        from panqueue.embedded import RedisServer

        directory = Path(".panqueue/demo-redis")
        shutil.rmtree(directory, ignore_errors=True)
        server = RedisServer(directory=directory).start()
        url = server.url
        print(f"started a private {Path(server.binary).name} on {url} (data in {directory})")
    procs: list[subprocess.Popen[bytes]] = []
    handles: list[SyncJobHandle] = []
    created_queue = False
    try:
        with SyncQueueClient(url, prefix=prefix) as client:
            queue = client.queue(QUEUE)
            # On a server of the user's, a queue the demo made is purged at the end (jobs and
            # settings); one that was there before keeps everything but the demo's own jobs.
            created_queue = not client.queue_exists(QUEUE)
            # The workers start first, and the jobs are added once every one of them serves
            # the queue: the summary's wait is then the queue's latency, not the time a
            # process takes to start (which is reported apart).
            launched = time.monotonic()
            tag = uuid.uuid4().hex[:8]
            names = {f"demo-{tag}-{i}" for i in range(workers)}
            for name in sorted(names):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "panqueue", "worker", "panqueue._demo:queues",
                     "--url", url, *(("--prefix", prefix) if prefix else ()),
                     "--log-level", "error", "--grace", "5", "--name", name]))
            while not names <= {w.name for w in client.workers(QUEUE)}:
                if any(p.poll() is not None for p in procs):
                    print("a worker exited early", file=sys.stderr)
                    return 1
                if time.monotonic() - launched > _READY_WITHIN:
                    print(f"the workers did not start within {_READY_WITHIN:g} s",
                          file=sys.stderr)
                    return 1
                time.sleep(0.05)
            print(f"started {workers} worker processes (concurrency 20 each), ready in "
                  f"{time.monotonic() - launched:.2f} s")
            started = time.monotonic()
            handles = queue.add_bulk({"n": n} for n in range(jobs))
            print(f"enqueued {jobs} jobs on queue {QUEUE!r} in "
                  f"{(time.monotonic() - started) * 1000:.1f} ms")
            done = 0
            tty = sys.stdout.isatty()
            last_line = 0.0
            pending = {h.id for h in handles}
            finished: dict[str, JobInfo | None] = {}
            while done < jobs:
                # Count our own jobs as they finish: the completed set is trimmed by the
                # queue's retention, so its size stops growing long before a large demo ends.
                _newly_finished(client, pending, finished)
                done = len(finished)
                counts = client.counts(QUEUE)
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
            infos = [i for i in finished.values() if i is not None]
            trimmed = sum(1 for i in finished.values() if i is None)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(30) for p in procs]
        procs.clear()
        completed = [i for i in infos if i.state is JobState.COMPLETED]
        # A record retention trimmed before we read it was a finished job of a handler that
        # only fails first attempts: completed (the demo's retries always succeed).
        n_completed = len(completed) + trimmed
        retried = sum(1 for i in infos if i.attempts > 1)
        # First attempts only: a retry's start is after its backoff, not the queue's doing.
        waits = [(i.started_at - i.enqueued_at).total_seconds() * 1000 for i in completed
                 if i.started_at and i.enqueued_at and i.attempts == 1]
        print("summary")
        print(f"  jobs completed     {n_completed}/{jobs}")
        print(f"  jobs failed        {jobs - n_completed}")
        print(f"  jobs retried       {retried} (first attempt failed, a later one succeeded)")
        print(f"  elapsed            {elapsed:.2f} s from the first add to the last finish "
              f"({jobs / elapsed:.0f} jobs/s; workers already running)")
        if waits:
            print(f"  queue latency      p50 {statistics.median(waits):.0f} ms, "
                  f"max {max(waits):.0f} ms (from add to start, with every worker serving)")
        print(f"  workers exited     {codes} (SIGTERM: graceful shutdown)")
        return 0 if n_completed == jobs and all(c == 0 for c in codes) else 1
    finally:
        for p in procs:
            p.kill()
            p.wait()
        if server is None and handles:
            _remove_jobs(url, prefix, [h.id for h in handles], purge=created_queue)
        if server is not None:
            server.stop()
            print("stopped the private server")
