"""Failures and retries: attempts, Backoff, Retry, Fail, timeouts, and reading what happened.

A handler fails by raising. While attempts remain, the job goes back to the queue after the
backoff delay; then it fails finally and lands in the queue's dead-letter set (state FAILED)
with the last error, a failure reason and the history of every attempt.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/retries.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import anyio

from panqueue import (
    Backoff,
    Fail,
    Job,
    JobFailed,
    JobHandle,
    JobInfo,
    QueueClient,
    Registry,
    Retry,
    Worker,
    configure_logging,
)
from panqueue.embedded import url_or_private_server

queues = Registry()
provider = {"up": False}  # the "outage" jobs fail until the provider is up


# Defaults for every job of the queue: 3 attempts, exponential backoff from 50 ms (with jitter).
@queues.handler("payments", concurrency=10, attempts=3,
                backoff=Backoff.exponential(0.05, max=1.0))
async def charge(job: Job) -> str:
    kind = job.data["kind"]
    if kind == "flaky" and job.attempt < 3:
        raise ConnectionResetError(f"gateway reset the connection (attempt {job.attempt})")
    if kind == "rate-limited" and job.attempt == 1:
        raise Retry(delay=0.2)  # retry in 0.2 s instead of the backoff; uses up an attempt
    if kind == "invalid":
        raise Fail("card number is missing")  # no further attempts, whatever `attempts` says
    if kind == "broken":
        raise ValueError("unexpected currency 'XXX'")
    if kind == "outage" and not provider["up"]:
        raise RuntimeError("payment provider is down")
    if kind == "slow":
        await anyio.sleep(5)  # longer than the job's timeout
    return f"charged on attempt {job.attempt}"


def describe(info: JobInfo) -> None:
    print(f"  state={info.state.value} attempts={info.attempts} "
          f"failure_reason={info.failure_reason}")
    if info.error is not None:  # the last failed attempt's error
        print(f"  last error: {info.error.type}: {info.error.message}")
    for entry in info.history:  # one entry per failed attempt
        print(f"  history: attempt {entry['attempt']} {entry['type']}: {entry['message']}")


async def main(url: str) -> None:
    worker = Worker(queues, "payments", url=url)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with QueueClient(url) as client:
            payments = client.queue("payments")
            jobs: dict[str, JobHandle] = {}
            for kind in ("flaky", "rate-limited", "invalid"):
                jobs[kind] = await payments.add({"kind": kind})
            # Per-job options override the handler's defaults.
            jobs["broken"] = await payments.add({"kind": "broken"}, attempts=2,
                                                backoff=Backoff.fixed(0.05))
            jobs["slow"] = await payments.add({"kind": "slow"}, timeout=0.2, attempts=1)

            for kind, handle in jobs.items():
                try:
                    result = await handle.result(timeout=20.0)
                    print(f"{kind}: completed: {result}")
                except JobFailed as exc:
                    # exc.error is what the last attempt recorded (type, message, traceback).
                    print(f"{kind}: {exc.state}: {exc.error.type if exc.error else None}")
                describe(await handle.info())

            failed = await client.get_job("payments", jobs["broken"].id)
            assert failed.error is not None and failed.error.traceback is not None
            print(f"broken: the traceback is kept ({len(failed.error.traceback.splitlines())} "
                  "lines)")

            # Failed jobs stay in the dead-letter set until retried or trimmed by retention.
            down = await payments.add({"kind": "outage"}, attempts=1)
            try:
                await down.result(timeout=10.0)
            except JobFailed as exc:
                print(f"outage: {exc.state} while the provider is down")
            provider["up"] = True
            moved = await client.retry_failed("payments", [down.id])
            print(f"outage: retry_failed moved {moved} job back to waiting")
            print(f"outage: completed: {await down.result(timeout=10.0)}")
            describe(await down.info())
        await worker.shutdown(grace=5.0)


if __name__ == "__main__":
    # Warnings and errors only: the worker logs each failed attempt as a warning.
    configure_logging(level="warning")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
