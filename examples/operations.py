"""Day-one operations: which workers are alive, why a job is not running (and which jobs hold
the slots it waits for), what a list of delayed jobs shows, purging a queue.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/operations.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import anyio

from panqueue import Job, JobState, QueueClient, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

queues = Registry()
release = anyio.Event()  # the example lets the running export finish when it is done looking


@queues.handler("exports", concurrency=1)
async def export(job: Job) -> str:
    await release.wait()
    return f"exported {job.data['table']}"


async def main(url: str) -> None:
    async with QueueClient(url) as client:
        exports = client.queue("exports")
        first = await exports.add({"table": "orders"})
        second = await exports.add({"table": "invoices"})
        nightly = await exports.add({"table": "audit"}, delay=8 * 3600)
        summary = await exports.add({"table": "summary"}, depends_on=[second.id])

        # Before any worker runs, explain says so.
        print("before a worker:", (await client.explain("exports", first.id)).detail)

        # A worker writes its registry entry every heartbeat_interval seconds (default 5).
        worker = Worker(queues, "exports", url=url, name="export-worker-1",
                        heartbeat_interval=0.5)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            while not any(w.running for w in await client.workers("exports")):
                await anyio.sleep(0.05)

            # The worker registry: every live worker, what it runs, when it last beat.
            for info in await client.workers("exports"):
                print(f"worker {info.name}: queues {info.queues}, concurrency "
                      f"{info.concurrency}, running {info.running}")

            # One row per worker process, whatever number of queues it serves.
            for process in await client.worker_processes():
                print(f"process {process.name}: queues {process.queues}, running "
                      f"{len(process.running)}/{process.concurrency}")

            for handle in (first, second, nightly, summary):
                why = await client.explain("exports", handle.id)
                print(f"job {handle.id} is {why.state.value} ({why.reason}): {why.detail}")
            # The facts behind the words: which jobs hold the slots, on which worker.
            why = await client.explain("exports", second.id)
            print("slots held by:", [(h.job_id, h.worker) for h in why.holders])
            [later] = await client.list_jobs("exports", JobState.DELAYED)
            print(f"delayed job {later.id} runs at {later.run_at:%H:%M} UTC "
                  f"(retry of attempt: {later.retry_of})")

            release.set()
            print("result:", await summary.result(timeout=10))
            await worker.shutdown(grace=5.0)
        print("after a clean stop, workers:", await client.workers("exports"))

        # purge: the delayed job goes; finished jobs stay unless their state is named.
        removed = await client.purge("exports", [JobState.DELAYED])
        print(f"purged {removed} delayed job; counts: "
              f"{ {s.value: n for s, n in (await client.counts('exports')).items() if n} }")
        removed = await client.purge("exports")  # everything, and the queue's settings
        print(f"purged {removed} more; queue still exists: "
              f"{await client.queue_exists('exports')}")


if __name__ == "__main__":
    configure_logging(level="warning")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
