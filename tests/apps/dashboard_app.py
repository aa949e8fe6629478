"""Handlers for the dashboard's tests: ``panqueue worker dashboard_app:queues``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


# Registered in Redis by the worker that serves dash-echo: the schedules page shows it.
queues.schedule("dash-nightly", "dash-echo", cron="0 3 * * *", data={"report": "nightly"})
