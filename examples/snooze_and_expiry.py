"""Snooze and expiry: run a job again later without using an attempt; or never, if too late.

Snooze: a report export takes a while on the provider's side. The handler looks at its status;
while the export is still running it raises Snooze(seconds): the job goes back to DELAYED for
that long, keeps its attempts, and each snooze is written to the job's history.

Expiry: a reminder is worth sending only soon. add(..., expires=seconds or datetime) gives a
job a deadline to start by; a job not started by then ends CANCELLED ("expired") and never runs.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/snooze_and_expiry.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import anyio

from panqueue import Job, JobFailed, QueueClient, Registry, Snooze, Worker, configure_logging
from panqueue.embedded import url_or_private_server

queues = Registry()
checks: dict[str, int] = {}  # the provider's side: an export is ready at its third check


# One attempt only: a snooze is not a failure, so it never uses it up. At most 5 snoozes.
@queues.handler("exports", attempts=1, max_snoozes=5)
async def wait_for_export(job: Job) -> str:
    name = job.data["export"]
    checks[name] = checks.get(name, 0) + 1
    if job.data.get("never_ready") or checks[name] < 3:
        raise Snooze(0.1)  # look again in 0.1 s
    return f"{name} ready after {checks[name]} checks (attempt {job.attempt})"


@queues.handler("reminders")
async def remind(job: Job) -> str:
    return f"reminded {job.data['to']}"


async def main(url: str) -> None:
    worker = Worker(queues, "exports", url=url)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with QueueClient(url) as client:
            exports = client.queue("exports")
            report = await exports.add({"export": "sales-q3"})
            print(await report.result(timeout=10.0))
            info = await report.info()
            for entry in info.history:
                print(f"history: {entry['type']} for {entry['delay_ms']} ms "
                      f"(attempt {entry['attempt']})")
            print(f"attempts used: {info.attempts}")

            stuck = await exports.add({"export": "stuck", "never_ready": True})
            try:
                await stuck.result(timeout=10.0)
            except JobFailed as exc:
                info = await stuck.info()
                print(f"stuck: {exc.state} ({info.failure_reason}) after "
                      f"{len(info.history)} snoozes")
        await worker.shutdown(grace=5.0)

        # The upkeep that ends expired jobs nobody claims runs every stalled_interval seconds.
        reminder_worker = Worker(queues, "reminders", url=url, stalled_interval=0.1)
        await tg.start(reminder_worker.run)
        async with QueueClient(url) as client:
            reminders = client.queue("reminders")
            on_time = await reminders.add({"to": "ada"}, expires=30)
            print(await on_time.result(timeout=10.0))
            # Due in a minute, but worth sending only within 0.3 s: it will never run.
            late = await reminders.add({"to": "bob"}, delay=60, expires=0.3)
            try:
                await late.result(timeout=10.0)
            except JobFailed as exc:
                info = await late.info()
                print(f"late reminder: {exc.state} ({info.failure_reason})")
        await reminder_worker.shutdown(grace=5.0)


if __name__ == "__main__":
    configure_logging(level="error")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
