"""Check handlers against a real server with ``panqueue.testing``, outside pytest.

``run_worker`` runs a Worker in the background for the duration of an ``async with`` block and
``drain`` waits until a queue has nothing left to do. The same helpers back the pytest fixtures
(``pytest -p panqueue.testing``, see docs/testing.md); here a plain script uses them as a smoke
check, on asyncio and then on trio.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/testing_handlers.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import importlib.util
import os

import anyio

from panqueue import Fail, Job, JobFailed, QueueClient, Registry, configure_logging
from panqueue.embedded import url_or_private_server
from panqueue.testing import drain, run_worker

BACKENDS = ["asyncio"] + (["trio"] if importlib.util.find_spec("trio") else [])

queues = Registry()


async def total_invoice(job: Job) -> dict[str, float]:
    """The handler under test: sums the lines of an invoice, refuses negative amounts."""
    lines = job.data["lines"]
    if any(amount < 0 for amount in lines):
        raise Fail(f"negative amount in {lines}")
    await anyio.sleep(0.01)  # pretend to do some I/O
    return {"total": round(sum(lines), 2)}


# One queue per backend: both runs share one server, and drain() counts a whole queue. (In
# pytest, the panqueue_url fixture gives each test an empty database instead.)
for backend in BACKENDS:
    queues.handler(f"invoices-{backend}", concurrency=4, attempts=1)(total_invoice)


async def check(url: str, backend: str) -> None:
    name = f"invoices-{backend}"
    async with QueueClient(url) as client:
        queue = client.queue(name)
        async with run_worker(queues, name, url) as worker:
            print(f"[{backend}] worker running on {name!r} (concurrency {worker.concurrency})")

            # One job, checked through its result.
            job = await queue.add({"lines": [9.99, 0.01, 2.5]})
            print(f"[{backend}] result: {await job.result(timeout=10.0)}")

            # A job the handler refuses: result() raises JobFailed with the recorded error.
            bad = await queue.add({"lines": [5.0, -1.0]})
            try:
                await bad.result(timeout=10.0)
            except JobFailed as exc:
                assert exc.error is not None
                print(f"[{backend}] refused: {exc.state}, {exc.error.type}: {exc.error.message}")

            # Many jobs, without keeping their handles: drain() waits until none is waiting,
            # delayed, blocked or active, and returns the counts by state.
            await queue.add_bulk([{"lines": [float(n), 1.0]} for n in range(20)])
            counts = await drain(url, name, timeout=10.0)
            print(f"[{backend}] drained: completed={counts['completed']}, "
                  f"failed={counts['failed']}")
    # Leaving the block shut the worker down (running jobs get a grace period).
    print(f"[{backend}] worker stopped: {worker.processed} completed, {worker.failed} failed")


if __name__ == "__main__":
    configure_logging(level="warning")  # to stderr; the failed job is logged there
    with url_or_private_server(announce=False) as url:
        if not os.environ.get("PANQUEUE_URL"):
            print(f"started a private server on {url}")
        for backend in BACKENDS:
            anyio.run(check, url, backend, backend=backend)
    print("done")
