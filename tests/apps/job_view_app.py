"""A handler for ``panqueue job``'s text view (tests/test_cli.py): it logs a line in each
attempt and fails twice, with a traceback whose message spans two lines."""

from __future__ import annotations

from panqueue import Backoff, Job, Registry

queues = Registry()


@queues.handler("job-view", attempts=2, backoff=Backoff.fixed(0.01))
async def send(job: Job) -> None:
    await job.log(f"sending to {job.data['to']}")
    raise ConnectionError("mail server refused\nsecond line of the reply")
