"""The inline executor: async handlers on the worker's event loop, with a timeout and a
cooperative stop.

``executor="inline"`` is the default for ``async def`` handlers and the fastest tier: no thread,
no process, just a task on the worker's event loop. ``timeout=`` cancels an attempt that runs
too long (failure reason ``timeout``; the retry policy applies). ``job.should_stop()`` turns true
when the worker begins to shut down, so a long job can return early and cleanly instead of being
cancelled when the grace period ends. See docs/executors.md.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/executor_inline.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import anyio

from panqueue import Backoff, Job, JobFailed, QueueClient, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

queues = Registry()
started = {"export": False}  # lets main() know when the long job is under way


@queues.handler("lookups", executor="inline", concurrency=10, timeout=0.5)
async def lookup(job: Job) -> str:
    """Each attempt may take 0.5 s; the slow one is cancelled at its first await past that."""
    await anyio.sleep(job.data["seconds"])  # stands for a call to another service
    return f"looked up {job.data['name']}"


@queues.handler("exports", executor="inline", timeout=60.0)
async def export(job: Job) -> dict[str, object]:
    """A long job that checks should_stop() between batches and returns what it has so far."""
    batches = 0
    started["export"] = True
    while batches < 1000:
        if job.should_stop():  # the worker is shutting down (or the job was cancelled)
            await job.log(f"stopping early after {batches} batches")
            return {"batches": batches, "complete": False}
        await anyio.sleep(0.02)  # one batch of async work
        batches += 1
        await job.progress(batches / 10)
    return {"batches": batches, "complete": True}


async def main(url: str) -> None:
    lookups = Worker(queues, "lookups", url=url)
    exports = Worker(queues, "exports", url=url)
    async with anyio.create_task_group() as tg:
        await tg.start(lookups.run)
        await tg.start(exports.run)
        print("workers started on 'lookups' and 'exports' (executor inline)")

        async with QueueClient(url) as client:
            fast = await client.queue("lookups").add({"name": "ada", "seconds": 0.05})
            # A timeout is a failed attempt like any other: with attempts=2 it is retried once.
            slow = await client.queue("lookups").add({"name": "bob", "seconds": 5}, attempts=2,
                                                     backoff=Backoff.fixed(0.05))
            print(f"fast: {await fast.result(timeout=10.0)}")
            try:
                await slow.result(timeout=10.0)
            except JobFailed as exc:
                info = await slow.info()
                print(f"slow: {info.state.value} after {info.attempts} attempts, "
                      f"failure_reason={info.failure_reason}, "
                      f"error {exc.error.type if exc.error else None}")

            long_job = await client.queue("exports").add({})
            while not started["export"]:
                await anyio.sleep(0.01)
            await anyio.sleep(0.2)  # let a few batches run
            # Phase one: claim nothing more; should_stop() is now true for running jobs, which
            # get up to `grace` seconds to finish. Phase two would cancel them.
            await exports.shutdown(grace=10.0)
            info = await long_job.info()
            print(f"export: {info.state.value} during shutdown with {info.result}, "
                  f"log {info.logs}")

        await lookups.shutdown(grace=5.0)
    print("workers stopped")


if __name__ == "__main__":
    configure_logging(level="error")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
