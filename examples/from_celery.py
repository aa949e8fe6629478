"""Coming from Celery (or RQ): the same tasks, written for panqueue, enqueued the same way.

    Celery                                          panqueue
    app = Celery("shop", broker=...)                queues = Registry()   # URL: PANQUEUE_URL
    @app.task(autoretry_for=(SMTPError,),           @queues.handler("emails", attempts=3,
              max_retries=2, retry_backoff=True)        backoff=Backoff.exponential(...))
    send_welcome.delay(user)                        send_welcome.enqueue({"user": ...})
    send_welcome.apply_async(args, countdown=60)    send_welcome.enqueue(data, delay=60)
    AsyncResult(id).get(timeout=10)                 handle.result(timeout=10)
    app.control.revoke(id)                          client.cancel("emails", id)
    group(resize.s(p) for p in photos)()            resize.enqueue(...) per photo, or a batch
    celery -A shop worker                           panqueue worker from_celery:queues

The producer side below is plain blocking code, as in a Flask or Django view: no client is
opened by hand; the registry opens one on first use and ``queues.close()`` closes it. The
worker runs in the same process here to keep the example in one file; in production it is
``panqueue worker from_celery:queues`` on its own. docs/migrating.md has the whole table.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/from_celery.py
"""

from __future__ import annotations

import os

import anyio
import anyio.to_thread

from panqueue import Backoff, Job, JobFailed, JobState, Registry, SyncQueueClient, Worker
from panqueue.embedded import url_or_private_server

queues = Registry()  # no URL: PANQUEUE_URL, read when the first job is enqueued


class SMTPError(Exception):
    pass


# Celery's autoretry_for=(SMTPError,), max_retries=2: any exception retries, with the backoff,
# until the attempts are used up (raise panqueue.Fail to stop at once).
_outbox: list[str] = []


@queues.handler("emails", attempts=3, backoff=Backoff.fixed(0.05), executor="thread")
def send_welcome(job: Job[dict[str, str]]) -> str:
    if job.attempt == 1 and job.data["user"] == "ada":
        raise SMTPError("421 try again later")  # the first try fails, the second succeeds
    _outbox.append(job.data["user"])
    return f"welcome mail sent to {job.data['user']} on attempt {job.attempt}"


@queues.handler("thumbnails", executor="thread", concurrency=4)
def resize(job: Job[dict[str, str]]) -> str:
    return job.data["photo"].replace(".jpg", "-128.jpg")


def web_request() -> None:
    """What a view does: enqueue, sometimes wait for the result, sometimes revoke."""
    # send_welcome.delay(...)
    welcome = send_welcome.enqueue({"user": "ada"})
    print(f"send_welcome.enqueue -> job {welcome.id} in queue {welcome.queue!r}")
    print(welcome.result(timeout=10.0))

    # apply_async(..., countdown=3600, task_id="welcome-bob"): a delay and an idempotent id
    later = send_welcome.enqueue({"user": "bob"}, delay=3600.0, job_id="welcome-bob")
    again = send_welcome.enqueue({"user": "bob"}, delay=3600.0, job_id="welcome-bob")
    print(f"countdown: job {later.id} is {later.info().state.value}; "
          f"enqueued twice, created={[later.created, again.created]}")

    # app.control.revoke(task_id): cancelling needs no worker, the job never runs
    with SyncQueueClient() as client:
        state = client.cancel("emails", later.id)
        print(f"revoke: {later.id} was {state.value}, now {later.info().state.value}")
        try:
            later.result(timeout=1.0)
        except JobFailed as exc:
            print(f"its result raises JobFailed: ended {exc.state}")

    # group(resize.s(photo) for photo in photos)(): one job each, results in order
    photos = ["beach.jpg", "tower.jpg", "garden.jpg"]
    handles = [resize.enqueue({"photo": photo}) for photo in photos]
    print(f"group: {[h.result(timeout=10.0) for h in handles]}")


async def main(url: str) -> None:
    async with anyio.create_task_group() as tg:
        workers = [Worker(queues, queue, url=url) for queue in ("emails", "thumbnails")]
        for worker in workers:
            await tg.start(worker.run)
        try:
            await anyio.to_thread.run_sync(web_request)
        finally:
            for worker in workers:
                await worker.shutdown(grace=5.0)
    with SyncQueueClient(url) as client:
        counts = client.counts("emails")
        print(f"emails: completed={counts[JobState.COMPLETED]} "
              f"cancelled={counts[JobState.CANCELLED]}; outbox {_outbox}")


if __name__ == "__main__":
    with url_or_private_server(announce=False) as url:
        os.environ["PANQUEUE_URL"] = url  # as a deployment sets it for web and worker alike
        try:
            anyio.run(main, url)
        finally:
            queues.close()  # the client send_welcome.enqueue() opened
    print("done")
