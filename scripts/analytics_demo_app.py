"""Handlers for ``scripts/job_analytics.py --demo`` (``analytics_demo_app:queues``).

Two queues with a realistic mix of outcomes. Each job's data carries the outcome the producer
drew for it (``"outcome"``), so a run is reproducible for a given seed:

* ``emails``: short jobs (5 to 40 ms); some fail with ``ValueError`` (a bad address) or
  ``ConnectionRefusedError`` (the mail server said no).
* ``reports``: longer jobs (30 to 200 ms); some fail with ``KeyError`` (a missing column), some
  run past the handler's 0.3 s timeout (``JobTimeout``) and some hit ``ConnectionResetError``
  twice (2 attempts; the retry shows up in ``attempts``).

Every finished job is kept (``Retention(completed=-1, failed=-1)``) so the analytics see them all.
"""

from __future__ import annotations

import anyio

from panqueue import Job, Registry, Retention

KEEP_ALL = Retention(completed=-1, failed=-1, failed_for=None)

queues = Registry()


@queues.handler("emails", concurrency=20, retention=KEEP_ALL)
async def send_email(job: Job) -> str:
    await anyio.sleep(job.data["ms"] / 1000)
    outcome = job.data["outcome"]
    if outcome == "bad_address":
        raise ValueError(f"invalid address {job.data['to']!r}")
    if outcome == "refused":
        raise ConnectionRefusedError("smtp: 421 service not available")
    return f"sent to {job.data['to']}"


@queues.handler("reports", concurrency=8, timeout=0.3, attempts=2, retention=KEEP_ALL)
async def build_report(job: Job) -> dict[str, int]:
    outcome = job.data["outcome"]
    if outcome == "slow":
        await anyio.sleep(1.0)  # past the 0.3 s timeout: JobTimeout on every attempt
    await anyio.sleep(job.data["ms"] / 1000)
    if outcome == "missing_column":
        raise KeyError(job.data["column"])
    if outcome == "flaky" or (outcome == "flaky_once" and job.attempt == 1):
        raise ConnectionResetError("warehouse connection reset")
    return {"rows": job.data["ms"] * 10}
