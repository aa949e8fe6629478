"""User code that ``mypy --strict`` must accept (tests/test_typing.py checks it).

Handlers typed by their payload (a TypedDict, a dataclass) give typed queues; untyped
handlers and queues named by a string stay ``Any``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypedDict, assert_type

import anyio.to_thread

from panqueue import (
    Job,
    JobHandle,
    Queue,
    QueueClient,
    Registry,
    SyncJobHandle,
    SyncQueue,
    SyncQueueClient,
)
from panqueue.executors.base import DONE, Executor, ReportKind, Sink

queues = Registry()


class Email(TypedDict):
    to: str
    subject: str


@dataclass
class Thumbnail:
    path: str
    width: int = 128


@queues.handler("emails")
async def send_email(job: Job[Email]) -> str:
    assert_type(job.data["to"], str)
    return job.data["subject"]


@queues.handler("thumbnails", executor="thread")
def thumbnail(job: Job[Thumbnail]) -> int:
    assert_type(job.data.width, int)
    return job.data.width


@queues.handler("legacy")
async def legacy(job: Job) -> None:  # an unparametrized Job: data is Any
    assert_type(job.data, Any)


async def produce(client: QueueClient) -> None:
    emails = client.queue(send_email, priority=5)
    assert_type(emails, Queue[Email])
    handle = await emails.add({"to": "a@example.com", "subject": "hi"}, delay=1.0)
    assert_type(handle, JobHandle)
    await emails.add_bulk([{"to": "b@example.com", "subject": "hello"}])
    await emails.add_chain([Email(to="c@example.com", subject="first")])

    thumbs = client.queue(thumbnail)
    assert_type(thumbs, Queue[Thumbnail])
    await thumbs.add(Thumbnail("a.png"))

    # Untyped usage keeps working: a queue named by a string takes any data.
    anything = client.queue("emails")
    assert_type(anything, Queue[Any])
    await anything.add({"whatever": [1, 2, 3]})
    await client.queue(legacy).add(42)


def produce_sync(client: SyncQueueClient) -> None:
    emails = client.queue(send_email)
    assert_type(emails, SyncQueue[Email])
    emails.add({"to": "d@example.com", "subject": "sync"})
    client.queue(thumbnail).add_bulk([Thumbnail("b.png", width=64)])
    client.queue("thumbnails").add("not checked")


def enqueue_from_handlers() -> None:
    """A handler enqueues to its own queue through its registry's client, typed the same."""
    handle = send_email.enqueue({"to": "e@example.com", "subject": "hi"}, delay=1.0,
                                priority=2, job_id="welcome-e")
    assert_type(handle, SyncJobHandle)
    thumbnail.enqueue(Thumbnail("c.png"))
    legacy.enqueue(["anything", 1])


async def aenqueue_from_handlers() -> None:
    handle = await send_email.aenqueue(Email(to="f@example.com", subject="async"))
    assert_type(handle, JobHandle)
    await thumbnail.aenqueue(Thumbnail("d.png"), attempts=3)
    await queues.aclose()
    queues.close()


def bare_annotations(queue: Queue, sync_queue: SyncQueue, job: Job) -> None:
    """Unparametrized Queue, SyncQueue and Job are accepted under --strict (data is Any)."""
    assert_type(queue, Queue[Any])
    assert_type(sync_queue, SyncQueue[Any])
    assert_type(job.data, Any)


class OwnThread(Executor):
    """A third-party executor: the handler runs in a thread, on a view of the job."""

    async def run(self, job: Job, timeout: float | None) -> Any:
        def sink(kind: ReportKind, value: Any) -> Awaitable[None]:
            return DONE

        reports: Sink = sink
        view = job.rebind(reports, job.should_stop)
        assert_type(view.enqueued_at_ms, int | None)
        return await anyio.to_thread.run_sync(self.handler.fn, view)
