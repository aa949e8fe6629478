"""Batches: run a group of jobs, in any queues, and add one more job once all of them ended.

An album upload resizes every photo (one job each) and, once every resize has ended, publishes
the album. client.batch(on_complete=(queue, data), on_success=(queue, data)) opens a batch;
batch.add / add_bulk add its jobs; batch.close() says no more are coming. The on_complete job
is added exactly once, when the batch is closed and every job in it finished (completed,
failed or cancelled); on_success only when none failed. Each callback's data gets "batch":
the batch's counts.

A job of a batch may open a child batch (batch.batch(...), or client.batch(..., parent=id)):
the child's callback is a job of the parent, so the parent ends after it.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/batches.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from panqueue import Fail, Job, QueueClient, Registry, WorkerPool, configure_logging
from panqueue.embedded import url_or_private_server

queues = Registry()
# Where the callbacks report what they did (an in-process stream: the worker runs here).
reports: MemoryObjectSendStream[str]


@queues.handler("resize", concurrency=4)
async def resize(job: Job) -> str:
    if job.data["photo"].endswith(".broken"):
        raise Fail("not an image")
    return job.data["photo"].replace(".jpg", "-small.jpg")


@queues.handler("albums")
async def album_done(job: Job) -> None:
    counts = job.data["batch"]  # the batch's counts, added to the callback's data
    outcome = "publish" if job.data.get("publish") else "report"
    await reports.send(f"album {job.data['album']} {outcome}: {counts['completed']} of "
                       f"{counts['total']} photos resized, {counts['failed']} failed")


async def upload(client: QueueClient, received: MemoryObjectReceiveStream[str], album: str,
                 photos: list[str], callbacks: int) -> None:
    """One album: a batch of resizes; a report when it ends, publication if none failed."""
    batch = await client.batch(on_complete=("albums", {"album": album}),
                               on_success=("albums", {"album": album, "publish": True}))
    await batch.add_bulk("resize", [{"photo": photo} for photo in photos])
    info = await batch.close()
    print(f"album {album}: {info.total} photos in the batch, closed={info.closed}")
    with anyio.fail_after(10):
        lines = sorted([await received.receive() for _ in range(callbacks)])
    for line in lines:
        print(line)
    final = await batch.info()
    print(f"album {album}: pending={final.pending} completed={final.completed} "
          f"failed={final.failed}")


async def main(url: str) -> None:
    global reports
    reports, received = anyio.create_memory_object_stream[str](10)
    async with QueueClient(url) as client, \
            WorkerPool(queues, url=url, queues=["resize", "albums"], grace=5.0):
        # Every photo resized: both callbacks run.
        await upload(client, received, "holiday", ["beach.jpg", "dunes.jpg", "sunset.jpg"], 2)
        # One photo fails: only on_complete runs.
        await upload(client, received, "party", ["cake.jpg", "friends.broken"], 1)


if __name__ == "__main__":
    configure_logging(level="error")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
