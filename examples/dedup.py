"""Deduplication: Dedup(key, ttl, strategy) with "keep", "extend" and "replace".

``add(..., dedup=Dedup("report:42", ttl=60.0))`` remembers the job under the dedup key for
``ttl`` seconds. While the key is live and its job still exists, another add with the same key:

- ``keep`` (default): returns the existing job unchanged (``created`` is False);
- ``extend``: the same, and restarts the key's TTL;
- ``replace``: deletes the existing job if it has not started (waiting, delayed or blocked)
  and adds the new one; if it already started or finished, adds the new one beside it.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/dedup.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import uuid

import anyio

from panqueue import Dedup, Job, JobNotFound, QueueClient, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

# A fresh queue name per run, so that re-running against the same server starts clean.
QUEUE = f"reports-{uuid.uuid4().hex[:6]}"

queues = Registry()
gate: dict[str, anyio.Event] = {}


@queues.handler(QUEUE, concurrency=2)
async def build_report(job: Job) -> str:
    if job.data.get("wait"):
        await gate["release"].wait()  # stays active until the example lets it finish
    return f"report {job.data['report']} v{job.data['version']}"


async def main(url: str) -> None:
    async with QueueClient(url) as client:
        queue = client.queue(QUEUE)

        # keep: the second add returns the first job.
        first = await queue.add({"report": 1, "version": 1}, dedup=Dedup("report:1", ttl=60.0))
        again = await queue.add({"report": 1, "version": 2}, dedup=Dedup("report:1", ttl=60.0))
        print(f"keep: second add returned job {again.id} (same as {first.id}: "
              f"{again.id == first.id}), created={again.created}, data "
              f"{(await again.info()).data}")

        # extend: every duplicate restarts the TTL, so a steady stream of duplicates keeps
        # collapsing into one job; keep would have let the key expire after 1 s.
        ext = await queue.add({"report": 2, "version": 1},
                              dedup=Dedup("report:2", ttl=1.0, strategy="extend"))
        for _ in range(3):
            await anyio.sleep(0.5)
            dup = await queue.add({"report": 2, "version": 1},
                                  dedup=Dedup("report:2", ttl=1.0, strategy="extend"))
        print(f"extend: after 1.5 s of duplicates every 0.5 s, still job {dup.id} "
              f"(same: {dup.id == ext.id})")
        await anyio.sleep(1.1)
        fresh = await queue.add({"report": 2, "version": 2}, dedup=Dedup("report:2", ttl=1.0))
        print(f"extend: 1.1 s after the last duplicate the key expired: new job "
              f"{fresh.id}, created={fresh.created}")

        # replace, original not started yet: it is deleted (with any job that depended on it
        # failing) and the new one is added.
        old = await queue.add({"report": 3, "version": 1}, delay=30.0,
                              dedup=Dedup("report:3", strategy="replace"))
        follow_up = await queue.add({"report": 3, "version": 1, "step": "mail"},
                                    depends_on=[old.id])
        new = await queue.add({"report": 3, "version": 2},
                              dedup=Dedup("report:3", strategy="replace"))
        try:
            await old.info()
        except JobNotFound:
            print(f"replace: delayed job {old.id} was deleted, job {new.id} replaces it "
                  f"(created={new.created})")
        info = await follow_up.info()
        print(f"replace: job {follow_up.id}, which depended on the replaced job: "
              f"{info.state.value}, {info.failure_reason}")

        # When the job behind a live key no longer exists, the key counts as free.
        await client.remove(QUEUE, new.id)
        after_remove = await queue.add({"report": 3, "version": 3},
                                       dedup=Dedup("report:3", strategy="keep"))
        print(f"keep after the job was removed: new job {after_remove.id}, "
              f"created={after_remove.created}")

        # replace, original already running: the new job is added beside it.
        gate["release"] = anyio.Event()
        worker = Worker(queues, QUEUE, url=url)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            running = await queue.add({"report": 4, "version": 1, "wait": True},
                                      dedup=Dedup("report:4", strategy="replace"))
            while (await running.info()).state.value != "active":
                await anyio.sleep(0.02)
            beside = await queue.add({"report": 4, "version": 2},
                                     dedup=Dedup("report:4", strategy="replace"))
            print(f"replace while job {running.id} is active: job {beside.id} added beside it "
                  f"(created={beside.created})")
            gate["release"].set()
            results = [await h.result(timeout=10.0) for h in (running, beside)]
            print(f"both ran: {results}")
            await worker.shutdown(grace=5.0)

        # Dedup versus job_id: a job_id is idempotent for as long as the job exists (no TTL);
        # a dedup key only for its TTL, and it does not fix the id.
        a = await queue.add({"report": 5, "version": 1}, job_id="report-5")
        b = await queue.add({"report": 5, "version": 2}, job_id="report-5")
        print(f"job_id: second add returned {b.id!r}, created={b.created}")
        print(f"job_id data unchanged: {(await a.info()).data}")


if __name__ == "__main__":
    configure_logging(level="warning")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
