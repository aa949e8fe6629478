"""Every job failure in Sentry: ``Registry.on_failure`` hands each failed attempt to
Sentry's SDK, with the queue, job id and attempt as tags.

    pip install panqueue sentry-sdk
    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/sentry_errors.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the
end. It needs no Sentry account and no network: the SDK is given a placeholder DSN and a
transport that keeps the events in memory, which the example then prints. In production, pass
your project's DSN and leave ``transport`` out.
"""

from __future__ import annotations

from typing import Any

import anyio
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from panqueue import Backoff, Job, JobFailed, QueueClient, Registry, Worker

queues = Registry()


@queues.handler("invoice-mail", attempts=2, backoff=Backoff.fixed(0.01))
async def send_invoice(job: Job) -> str:
    if job.data["customer"] == "acme":
        raise ConnectionError("mail server refused the connection")
    return f"sent to {job.data['customer']}"


@queues.on_failure
def report_to_sentry(job: Job, exc: BaseException, final: bool) -> None:
    """Called for every failed attempt: a retry as a warning, the final failure as an error
    (with the traceback of ``exc``). Grouped in Sentry by exception type and place, and
    searchable by queue and job id."""
    with sentry_sdk.new_scope() as scope:
        scope.set_tag("queue", job.queue)
        scope.set_tag("job_id", job.id)
        scope.set_tag("attempt", job.attempt)
        scope.set_tag("final", final)
        scope.set_context("job", {"data": job.data, "attempt": job.attempt,
                                  "max_attempts": job.options.attempts})
        scope.level = "error" if final else "warning"
        sentry_sdk.capture_exception(exc)


class InMemory(Transport):
    """A transport that keeps what the SDK would send (for this example only)."""

    events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            event = item.get_event()
            if event is not None:
                InMemory.events.append(event)


async def main(url: str) -> None:
    sentry_sdk.init(dsn="https://public@sentry.invalid/1", transport=InMemory,
                    default_integrations=False)
    worker = Worker(queues, "invoice-mail", url=url, summary_interval=None)
    async with anyio.create_task_group() as tg, QueueClient(url) as client:
        await tg.start(worker.run)
        invoices = client.queue("invoice-mail")
        ok = await invoices.add({"customer": "globex"})
        bad = await invoices.add({"customer": "acme"})
        print(f"globex: {await ok.result(timeout=10)}")
        try:
            await bad.result(timeout=10)
        except JobFailed as failed:
            print(f"acme: failed: {failed.error.type}")
        await worker.shutdown()
    sentry_sdk.flush()
    for event in InMemory.events:
        tags = event["tags"]
        error = event["exception"]["values"][-1]
        print(f"sentry {event['level']}: {error['type']}: {error['value']} "
              f"(queue={tags['queue']} attempt={tags['attempt']} final={tags['final']})")


if __name__ == "__main__":
    from panqueue.embedded import url_or_private_server

    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
