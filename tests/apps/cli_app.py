"""A small app for the CLI tests: ``panqueue worker cli_app:queues``."""

from __future__ import annotations

from typing import Any

from panqueue import Job, Registry

queues = Registry()

# Not a Registry: `panqueue worker cli_app:not_a_registry` must refuse it.
not_a_registry = {"cli-echo": "echo"}


@queues.handler("cli-echo")
async def echo(job: Job) -> dict[str, Any]:
    return {"echo": job.data}


@queues.handler("cli-fail", attempts=1)
async def always_fails(job: Job) -> None:
    raise RuntimeError(f"cli-fail refuses {job.data!r}")
