"""Handlers for the dashboard's tests: ``panqueue worker dashboard_app:queues``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from panqueue import Job, Registry

queues = Registry()


@queues.handler("dash-flaky", attempts=1)
async def flaky(job: Job) -> dict[str, Any]:
    """Fails until the file named by the job's ``flag`` exists, then completes."""
    await job.log("checking the flag file")
    if not Path(job.data["flag"]).exists():
        raise RuntimeError("the flag file is missing")
    return {"ran": job.data["n"]}


@queues.handler("dash-echo")
async def echo(job: Job) -> Any:
    return job.data


@queues.handler("dash-fail", attempts=1)
async def fails(job: Job) -> None:
    raise ValueError(f"cannot parse {job.data!r}")


@queues.handler("dash-progress", concurrency=4)
async def steps(job: Job) -> str:
    """Reports each of the job's ``steps`` as its progress in turn, each one until the test
    creates the file ``go-N`` in the job's ``dir``."""
    for n, step in enumerate(job.data["steps"]):
        await job.progress(step)
        go = Path(job.data["dir"]) / f"go-{n}"
        while not go.exists():
            await anyio.sleep(0.02)
    return "done"


# Registered in Redis by the worker that serves dash-echo: the schedules page shows it.
queues.schedule("dash-nightly", "dash-echo", cron="0 3 * * *", data={"report": "nightly"})
