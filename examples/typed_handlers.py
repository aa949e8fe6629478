"""Typed handlers: a handler's payload type (a TypedDict or a dataclass) types its queue.

``client.queue(send_welcome)`` below is a ``Queue[Welcome]``: ``mypy --strict`` (or any type
checker) rejects ``add({"user": "ada"})`` for the missing ``plan`` before the code runs. The
dataclass payload is stored as a dict and the handler gets a ``Thumbnail`` back.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/typed_handlers.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypedDict

import anyio

from panqueue import Job, QueueClient, Registry, WorkerPool
from panqueue.embedded import url_or_private_server

queues = Registry()


class Welcome(TypedDict):
    """A TypedDict payload: at run time the job's data is the plain dict."""

    user: str
    plan: str


@dataclass
class Thumbnail:
    """A dataclass payload: stored as ``dataclasses.asdict``, rebuilt for the handler."""

    path: str
    width: int = 128

    def target(self) -> str:
        stem, _, suffix = self.path.rpartition(".")
        return f"{stem}-{self.width}w.{suffix}"


@queues.handler("welcome")
async def send_welcome(job: Job[Welcome]) -> str:
    # job.data["plan"] is a str to the type checker; job.data["plna"] would be an error.
    return f"welcome {job.data['user']}, you are on the {job.data['plan']} plan"


@queues.handler("thumbnails", executor="thread")
def make_thumbnail(job: Job[Thumbnail]) -> str:
    # job.data is a Thumbnail here, methods included.
    return f"{job.data.path} -> {job.data.target()}"


async def main(url: str) -> None:
    async with WorkerPool(queues, url=url) as pool, QueueClient(url) as client:
        welcome = client.queue(send_welcome)  # Queue[Welcome]
        thumbnails = client.queue(make_thumbnail)  # Queue[Thumbnail]
        handles = [
            await welcome.add({"user": "ada", "plan": "team"}),
            await thumbnails.add(Thumbnail("photos/cat.png", width=256)),
            *await thumbnails.add_bulk([Thumbnail("photos/dog.jpg")]),
        ]
        stored = await handles[1].info()
        print(f"stored data of job {stored.id}: {stored.data}")
        for handle in handles:
            print(f"{handle.queue}: {await handle.result(timeout=10.0)}")
        await pool.shutdown(grace=5.0)


if __name__ == "__main__":
    with url_or_private_server(announce=False) as url:
        if not os.environ.get("PANQUEUE_URL"):
            print(f"started a private server on {url}")
        anyio.run(main, url)
    print("done")
