"""User code that ``mypy --strict`` must reject, exactly on the lines marked ``# error: CODE``
(tests/test_typing.py checks the line numbers and error codes)."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypedDict

from panqueue import Job, QueueClient, Registry, SyncQueueClient
from panqueue.executors.base import DONE

queues = Registry()


class Email(TypedDict):
    to: str
    subject: str


@dataclass
class Thumbnail:
    path: str
    width: int = 128


@queues.handler("emails")
async def send_email(job: Job[Email]) -> None:
    assert job.data["body"]  # error: typeddict-item

@queues.handler("thumbnails", executor="thread")
def thumbnail(job: Job[Thumbnail]) -> None:
    assert job.data.height  # error: attr-defined

async def produce(client: QueueClient) -> None:
    emails = client.queue(send_email)
    await emails.add({"to": "a@example.com", "subjet": "typo"})  # error: typeddict-item
    await emails.add({"to": 42, "subject": "hi"})  # error: typeddict-item
    await emails.add(Thumbnail("a.png"))  # error: arg-type
    await emails.add_bulk([{"to": "b@example.com"}])  # error: typeddict-item
    await client.queue(thumbnail).add({"path": "a.png", "width": 10})  # error: arg-type


def produce_sync(client: SyncQueueClient) -> None:
    client.queue(send_email).add({"to": "c@example.com"})  # error: typeddict-item
    client.queue(thumbnail).add_bulk(["a.png"])  # error: list-item


def enqueue_from_handlers() -> None:
    send_email.enqueue({"to": "g@example.com"})  # error: typeddict-item
    thumbnail.enqueue({"path": "e.png"})  # error: arg-type
    send_email.enqueue({"to": "h", "subject": "x"}, delay="soon")  # error: arg-type


async def aenqueue_from_handlers() -> None:
    await thumbnail.aenqueue(Thumbnail("f.png"), prio=1)  # error: call-arg


def a_view_with_a_sink_of_other_reports(job: Job) -> Job:
    def sink(kind: int, value: Any) -> Awaitable[None]:  # a report's kind is "p" or "l"
        return DONE

    return job.rebind(sink, job.should_stop)  # error: arg-type
