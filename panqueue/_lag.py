"""A queue's lag: how long its longest-waiting job has waited, the figure `panqueue info`, the
metrics exporter, `panqueue top` and the dashboard all show."""

from __future__ import annotations

from datetime import UTC, datetime

from panqueue._client import SyncQueueClient
from panqueue._job import JobState

__all__ = ["lag_seconds", "waiting_seconds"]

# Jobs read from the head of the claim order. With priorities, or keyed mode's one job per key
# in turn, the longest-waiting job need not come first: the oldest of the sample is taken.
_SAMPLE = 100


def lag_seconds(client: SyncQueueClient, queue: str) -> float | None:
    """Seconds since the oldest job at the head of the waiting list was added (None: none
    waiting)."""
    return waiting_seconds(client, queue)[0]


def waiting_seconds(client: SyncQueueClient, queue: str) -> tuple[float | None, float]:
    """From one read of the head of the waiting list: its lag (:func:`lag_seconds`), and the
    seconds the job there that has been ready longest has waited: since it was added, or since
    it last became ready again (out of a delay, a backoff, a snooze, a sleep, its
    dependencies: ``ready_at``); 0 when none waits."""
    head = client.list_jobs(queue, JobState.WAITING, limit=_SAMPLE)
    added = [job.enqueued_at for job in head if job.enqueued_at is not None]
    if not added:
        return None, 0.0
    now = datetime.now(UTC)
    ready = min(max(at for at in (job.enqueued_at, job.ready_at) if at is not None)
                for job in head if job.enqueued_at is not None)
    return (max(0.0, (now - min(added)).total_seconds()),
            max(0.0, (now - ready).total_seconds()))
