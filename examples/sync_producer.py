"""Producing from synchronous code: SyncQueueClient, as a script or a WSGI app would use it.

The workers run in the same script only to keep the example self-contained: a WorkerPool on an
event loop in a background thread (anyio's blocking portal). In production they are separate
processes (``panqueue worker sync_producer:queues``).

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/sync_producer.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import functools
import time

import anyio
from anyio.from_thread import start_blocking_portal

from panqueue import Job, JobState, Registry, SyncQueueClient, WorkerPool, configure_logging
from panqueue.embedded import url_or_private_server

queues = Registry()


@queues.handler("invoices", concurrency=10)
async def render_invoice(job: Job) -> dict[str, object]:
    await anyio.sleep(0.01)
    return {"invoice": job.data["order"], "total": round(job.data["amount"] * 1.2, 2)}


@queues.handler("reminders")
async def send_reminder(job: Job) -> str:
    return f"reminded {job.data['to']}"


def produce(url: str) -> None:
    with SyncQueueClient(url) as client:
        invoices = client.queue("invoices")

        # One job; add() returns once the job is stored in Redis.
        first = invoices.add({"order": "A-1", "amount": 10.0})
        print(f"added invoice job {first.id}")

        # Many jobs in one round trip: every item is validated before anything is written.
        batch = invoices.add_bulk({"order": f"B-{n}", "amount": float(n)} for n in range(1, 51))
        print(f"added {len(batch)} invoice jobs in one call")

        # A custom id makes add() idempotent: the second add returns the existing job.
        again = [invoices.add({"order": "C-7", "amount": 7.0}, job_id="order-C-7")
                 for _ in range(2)]
        print(f"job_id 'order-C-7' added twice: created={[h.created for h in again]}")

        # A delayed job stays 'delayed' until its time has come (server clock).
        reminder = client.queue("reminders").add({"to": "ada@example.com"}, delay=0.5)
        print(f"reminder job {reminder.id} is {reminder.info().state.value}")

        # Blocking waits for results.
        print(f"invoice {first.id} result: {first.result(timeout=10.0)}")
        totals = sum(h.result(timeout=10.0)["total"] for h in batch)
        print(f"batch results: total {totals:.2f}")
        started = time.monotonic()
        print(f"reminder result: {reminder.result(timeout=10.0)!r} "
              f"(waited {time.monotonic() - started:.1f} s)")

        counts = client.counts("invoices")
        print(f"invoices completed: {counts[JobState.COMPLETED]}, "
              f"waiting: {counts[JobState.WAITING]}")


def main() -> None:
    with url_or_private_server() as url:
        # The portal runs an event loop in a background thread. The pool is created on that
        # loop (workers hold anyio primitives), and its `async with` block spans the `with`
        # block below: the workers serve both queues while the blocking producer code runs
        # in this thread.
        with start_blocking_portal() as portal:
            pool = portal.call(functools.partial(WorkerPool, queues, url=url, grace=5.0))
            with portal.wrap_async_context_manager(pool):
                print("worker pool started for queues 'invoices' and 'reminders'")
                produce(url)
        print("worker pool stopped")


if __name__ == "__main__":
    configure_logging(level="info")
    main()
    print("done")
