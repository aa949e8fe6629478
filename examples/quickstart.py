"""Quick start: define a handler, add jobs from async code, run a Worker, read the results.

Everything runs in one process here; in production the worker runs on its own
(``panqueue worker quickstart:queues``) and any number of producers add jobs.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/quickstart.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import os

import anyio

from panqueue import Job, QueueClient, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

queues = Registry()


@queues.handler("greetings", concurrency=5)
async def greet(job: Job) -> dict[str, str]:
    """A handler is an async function of one Job; its return value is the job's result."""
    await job.log(f"greeting {job.data['name']}")
    await anyio.sleep(0.05)  # pretend to do some I/O
    await job.progress(100)
    return {"greeting": f"hello, {job.data['name']}"}


async def main(url: str) -> None:
    worker = Worker(queues, "greetings", url=url)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)  # returns once the worker is listening for work
        print(f"worker started on queue 'greetings' (concurrency {worker.concurrency})")

        async with QueueClient(url) as client:
            queue = client.queue("greetings")
            handles = [await queue.add({"name": name}) for name in ("ada", "grace", "linus")]
            print(f"added {len(handles)} jobs: ids {[h.id for h in handles]}")
            for handle in handles:
                result = await handle.result(timeout=10.0)  # waits for the job to finish
                print(f"job {handle.id}: {result['greeting']}")
            info = await handles[0].info()
            print(f"job {info.id} is {info.state.value}, progress {info.progress}, "
                  f"logs {info.logs}")

        await worker.shutdown(grace=5.0)  # finish running jobs, then stop
    print(f"worker stopped after {worker.processed} jobs")


if __name__ == "__main__":
    # panqueue prints nothing unless logging is set up: here, info and above, on stderr.
    configure_logging(level="info")
    with url_or_private_server(announce=False) as url:  # we say it on stdout instead
        if not os.environ.get("PANQUEUE_URL"):
            print(f"started a private server on {url}")
        anyio.run(main, url)
    print("done")
