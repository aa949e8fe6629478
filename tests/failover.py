"""What the failover tests (test_sentinel.py, test_cluster_failover.py) check after the fault:
each job's handler runs (from the journals of ``tests/apps/failover_app.py``) and each job's
``completed`` events (from a live tail of the queue's event stream)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from panqueue import QueueClient


def journal_runs(directory: Path) -> Counter[tuple[str, str]]:
    """How many times each (queue, job id) ran, over every worker process's journal."""
    runs: Counter[tuple[str, str]] = Counter()
    for journal in directory.glob("journal-*.log"):
        for line in journal.read_text().splitlines():
            queue, job_id, _attempt = line.split(" ")
            runs[(queue, job_id)] += 1
    return runs


async def tail_completions(url: str, queue: str, completed: Counter[str]) -> None:
    """Count each job's ``completed`` events as they are written, from the stream's start, until
    cancelled. The tail reconnects after a failure and resumes after the last event it read, so
    it sees a completion even if a failover loses it afterwards: a job completed on the old
    master and again on the new one counts twice here."""
    async with QueueClient(url) as client:
        async for event in client.events(queue, after="0-0"):
            if event.type == "completed":
                completed[event.job_id] += 1
