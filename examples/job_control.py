"""Job control: progress and logs, cancelling a running job, the event stream, and retention
(of jobs, and of events: a queue that keeps none but the ends of its jobs).

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/job_control.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

from typing import Any

import anyio

from panqueue import (
    Event,
    Job,
    JobFailed,
    JobNotFound,
    JobState,
    QueueClient,
    Registry,
    Retention,
    Worker,
    configure_logging,
)
from panqueue.embedded import url_or_private_server

queues = Registry()


# Keep the newest 3 completed jobs (a small number, to see trimming here), 100 failed or
# cancelled ones, and delete failed/cancelled jobs a day after they finished.
@queues.handler("reports", concurrency=2,
                retention=Retention(completed=3, failed=100, failed_for=24 * 3600.0))
async def build_report(job: Job) -> dict[str, Any]:
    pages = job.data["pages"]
    for page in range(1, pages + 1):
        await anyio.sleep(job.data.get("seconds_per_page", 0.05))  # cancel() interrupts here
        await job.progress(round(page * 100 / pages))  # any JSON value; here a percentage
        await job.log(f"rendered page {page} of {pages}")
    return {"report": job.data["name"], "pages": pages}


# A queue that keeps only the ends of its jobs (result() waits on them), even while somebody
# reads its events: two stream writes fewer per job.
@queues.handler("thumbnails", concurrency=4, retention=Retention(events=0))
async def thumbnail(job: Job) -> str:
    return f"thumb-{job.data}"


def describe(event: Event) -> str:
    details = {key: value for key, value in event.fields.items()
               if key in ("state", "attempt", "progress", "result", "reason")}
    return f"event {event.type:<9} job {event.job_id} {details if details else ''}".rstrip()


def summary(types: list[str]) -> str:
    """Event types in order, with repeats collapsed: 'progress (4x)'."""
    parts: list[list[Any]] = []
    for kind in types:
        if parts and parts[-1][0] == kind:
            parts[-1][1] += 1
        else:
            parts.append([kind, 1])
    return " > ".join(kind if n == 1 else f"{kind} ({n}x)" for kind, n in parts)


async def main(url: str) -> None:
    worker = Worker(queues, "reports", url=url)
    async with anyio.create_task_group() as tg, QueueClient(url) as client:
        reports = client.queue("reports")
        # A read asks the queue to write every event for the next hour (a queue whose events
        # nobody reads writes only the ends of jobs), and gives the stream's end to read from.
        _, start = await client.read_events("reports")
        report = await reports.add({"name": "quarterly", "pages": 4})
        archive = await reports.add({"name": "archive", "pages": 100, "seconds_per_page": 0.2})
        watched: dict[str, list[str]] = {report.id: [], archive.id: []}
        last_seen: list[str] = []
        listener_done = anyio.Event()

        async def listen() -> None:
            # after=start reads on from where the read above ended, so the two "added" events
            # written since are not missed; without after= the iterator yields only events
            # newer than its own first read.
            async for event in client.events("reports", after=start):
                if event.job_id not in watched:
                    continue
                print(f"  {describe(event)}")
                watched[event.job_id].append(event.type)
                last_seen[:] = [event.id]
                if all(types and types[-1] in ("completed", "failed", "cancelled")
                       for types in watched.values()):
                    listener_done.set()
                    return

        print("listening to the event stream of 'reports' in a task:")
        tg.start_soon(listen)
        await tg.start(worker.run)

        # Progress and logs: written by the handler, read back with info().
        result = await report.result(timeout=10.0)
        info = await report.info()
        print(f"job {report.id}: {info.state.value}, result {result}, progress {info.progress}")
        print(f"job {report.id} logs: {info.logs}")

        # Cancelling a running job: its worker is told over the queue's notify channel and
        # cancels the handler at its current await. The job ends CANCELLED and is not retried.
        while (await archive.info()).progress is None:  # running, and past its first page
            await anyio.sleep(0.02)
        state = await client.cancel("reports", archive.id)
        try:
            await archive.result(timeout=10.0)
        except JobFailed as exc:
            print(f"cancel() while the job was {state.value}: result() raised JobFailed, "
                  f"state {exc.state}")
        info = await archive.info()
        print(f"job {archive.id}: {info.state.value}, failure_reason={info.failure_reason}, "
              f"attempts={info.attempts}, stopped at {info.progress}% "
              f"({len(info.logs)} log lines)")

        with anyio.fail_after(10):
            await listener_done.wait()
        for job_id, types in watched.items():
            print(f"job {job_id} events: {summary(types)}")

        # Retention: with completed=3, each completion trims the completed set to the newest 3,
        # deleting the oldest jobs with their results and logs.
        pings = await reports.add_bulk([{"name": f"ping-{n}", "pages": 1} for n in range(5)])
        for ping in pings:
            await ping.result(timeout=10.0)
        counts = await client.counts("reports")
        print(f"after 5 more jobs: completed={counts[JobState.COMPLETED]}, "
              f"cancelled={counts[JobState.CANCELLED]}")
        try:
            await report.info()
        except JobNotFound:
            print(f"job {report.id} was trimmed by retention: info() raises JobNotFound")

        # Resuming the event stream: pass the id of the last event seen as after=.
        async for event in client.events("reports", after=last_seen[0]):
            print(f"resumed after {last_seen[0]}: next event is {event.type!r} "
                  f"for job {event.job_id} (the first ping: {event.job_id == pings[0].id})")
            break

        # Retention(events=0): the thumbnails queue writes only the events of a job's end.
        thumbs = Worker(queues, "thumbnails", url=url)
        await tg.start(thumbs.run)  # it has stored the queue's settings
        _, start = await client.read_events("thumbnails")
        for handle in await client.queue("thumbnails").add_bulk(["a.png", "b.png", "c.png"]):
            await handle.result(timeout=10.0)
        events, _ = await client.read_events("thumbnails", start)
        print(f"thumbnails events: {summary([event.type for event in events])}")

        await thumbs.shutdown(grace=5.0)
        await worker.shutdown(grace=5.0)


if __name__ == "__main__":
    configure_logging(level="warning")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
