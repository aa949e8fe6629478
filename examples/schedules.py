"""Schedules: a job every second (and one nightly in a time zone), two workers, one job per tick.

A schedule is declared on the Registry next to the handlers. Every worker of the queue registers
it in Redis when it starts and watches for its ticks; however many workers run, each tick
enqueues exactly one job, whose id is ``schedule:<name>:<tick time in ms>``.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/schedules.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import anyio
import anyio.abc

from panqueue import Job, QueueClient, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

TICKS = 3

queues = Registry()
# Every second, aligned to whole seconds since the epoch.
queues.schedule("heartbeat", "maintenance", every=1.0, data={"check": "disk"})
# 03:00 Paris time every day: registered and listed here, but it will not fire during the example.
queues.schedule("nightly-report", "maintenance", cron="0 3 * * *", tz="Europe/Paris",
                data={"report": "daily"}, attempts=3)

ran: list[str] = []  # the ids of the jobs the handler ran, in order
ticked: anyio.abc.ObjectSendStream[str]  # set in main(): tells main about each run


@queues.handler("maintenance", concurrency=2)
async def maintenance(job: Job) -> str:
    ran.append(job.id)
    await ticked.send(job.id)
    return f"checked {job.data['check']}"


def clock(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]


async def main(url: str) -> None:
    global ticked
    ticked, tick_ids = anyio.create_memory_object_stream[str](10)
    # Two workers of the same queue (in production: two processes or hosts). Both register the
    # schedules and both look for due ticks; the tick script lets one of them enqueue each tick.
    workers = [Worker(queues, "maintenance", url=url, name=f"worker-{n}") for n in (1, 2)]
    async with anyio.create_task_group() as tg, QueueClient(url) as client:
        for worker in workers:
            await tg.start(worker.run)
        print(f"{len(workers)} workers started on queue 'maintenance'")

        for n in range(1, TICKS + 1):
            with anyio.fail_after(5):
                job_id = await tick_ids.receive()
            tick_ms = int(job_id.rsplit(":", 1)[1])
            tick = datetime.fromtimestamp(tick_ms / 1000, UTC)
            # The tick script moved the schedule to its next run when it enqueued this job.
            [heartbeat] = [s for s in await client.schedules("maintenance")
                           if s.name == "heartbeat"]
            print(f"tick {n}: job {job_id} (tick {clock(tick)} UTC), "
                  f"next run {clock(heartbeat.next_run)} UTC")
            print(f"  tick time is a whole second: {tick_ms % 1000 == 0}")

        for worker in workers:
            await worker.shutdown(grace=5.0)

        print(f"each tick ran once: {len(ran) == len(set(ran))} "
              f"({len(ran)} jobs, {len(set(ran))} distinct ticks)")

        # What is stored in Redis: one entry per schedule with its next run and definition.
        for info in await client.schedules("maintenance"):
            definition = info.definition
            if definition["cron"]:
                zone = ZoneInfo(definition["tz"])
                print(f"schedule {info.name!r}: cron {definition['cron']!r} ({definition['tz']}), "
                      f"next run at {info.next_run.astimezone(zone):%H:%M} {definition['tz']}")
            else:
                print(f"schedule {info.name!r}: every {definition['every']} s, "
                      f"data {definition['data']}")

        # Removing a schedule deletes it from Redis. A worker whose registry still defines it
        # registers it again when it starts, so remove it from the code too.
        for name in ("heartbeat", "nightly-report"):
            removed = await client.remove_schedule("maintenance", name)
            print(f"removed schedule {name!r}: {removed}")
        print(f"schedules left: {await client.schedules('maintenance')}")


if __name__ == "__main__":
    configure_logging(level="warning")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
