"""The ends of jobs a queue's events tell since a position: the completed and failed counts
behind the rates `panqueue top` and the dashboard show."""

from __future__ import annotations

from panqueue._client import SyncQueueClient
from panqueue.errors import ConfigError

__all__ = ["EVENT_BATCH", "EVENT_READS", "ends_since", "events_end"]

EVENT_BATCH = 1000
EVENT_READS = 20  # at most this many batches per queue per read


def events_end(client: SyncQueueClient, queue: str) -> str:
    """The position of the end of ``queue``'s events now, where counting starts; the read asks
    the queue to write the ends of jobs alone (ops/events.py watch)."""
    return client.read_events(queue, watch=False)[1]


def ends_since(client: SyncQueueClient, queue: str, position: str) -> tuple[int, int, str]:
    """The jobs of ``queue`` that completed and that failed after ``position`` (at most
    ``EVENT_READS`` batches of events), and the position after them. A position the queue no
    longer takes (its partition count changed since: drained, purged and deployed anew)
    counts none, and the count starts again at the end of its events."""
    completed = failed = 0
    for _ in range(EVENT_READS):
        try:
            events, position = client.read_events(queue, position, limit=EVENT_BATCH,
                                                  watch=False)
        except ConfigError:
            return 0, 0, events_end(client, queue)
        completed += sum(1 for e in events if e.type == "completed")
        failed += sum(1 for e in events if e.type == "failed")
        if len(events) < EVENT_BATCH:
            break
    return completed, failed, position
