"""What the dashboard's pages show, read through the public client: the queues overview
(counts, rates, lag, paused, workers), a queue's recent events, and the text each value is
shown as (one formatting for the page and for its live updates).

Queue names: ``client.queues()`` scans the keyspace, which takes about 0.8 s on a Redis
holding 1,000,000 jobs, so :class:`QueueNames` keeps the list for :data:`QUEUE_LIST_TTL`
seconds and refreshes it in the background once it is older: a page never waits for a scan but
the very first one. The live workers are then read queue by queue, without a scan either, and
shown one row per process with every queue it serves.

Rates: the completed and failed sets are trimmed by retention, so their sizes cannot give
rates. :class:`Rates` counts the ``completed`` and ``failed`` events appended to each queue's
event stream between reads instead, over a sliding window of :data:`RATE_WINDOW` seconds (the
stream is capped at about 10,000 entries, so a queue that finishes more than that between two
reads is undercounted).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from panqueue import (
    ConfigError,
    ErrorInfo,
    Event,
    JobState,
    PanqueueError,
    SyncQueueClient,
    WorkerProcess,
)
from panqueue._ends import EVENT_BATCH, EVENT_READS, ends_since, events_end
from panqueue._lag import lag_seconds
from panqueue._listing import age, timestamp
from panqueue._store.ops import worker_processes
from panqueue._store.ops.events import watch as watch_events

__all__ = ["PREVIEW_CHARS", "QUEUE_LIST_TTL", "RATE_WINDOW", "Bounded", "Overview", "Progress",
           "QueueNames", "QueueRow", "Rates", "age", "bounded", "bounded_json", "bounded_steps",
           "event_dict", "live_workers", "overview", "pretty_json", "preview", "progress",
           "recent_events", "timestamp"]

QUEUE_LIST_TTL = 10.0
RATE_WINDOW = 10.0
_RATE_MIN_INTERVAL = 0.5  # reads closer together than this reuse the last figure
EVENTS_SHOWN = 200
_EVENTS_LOOKBACK_MS = 60_000


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


# The most characters of one value (data, result, progress, options, logs, traceback) a job's
# page shows; the whole is at its raw JSON link (``/api/job/raw``). A job's data may be many
# megabytes (``max_payload_bytes`` may be lifted): the page stays small whatever it holds.
PREVIEW_CHARS = 20_000


@dataclass(frozen=True)
class Bounded:
    """At most ``PREVIEW_CHARS`` of a value's text, and the length of the whole."""

    text: str
    total: int

    @property
    def cut(self) -> bool:
        return self.total > len(self.text)


def bounded(text: str, limit: int = PREVIEW_CHARS) -> Bounded:
    """The first ``limit`` characters of ``text``."""
    return Bounded(text[:limit], len(text))


def bounded_json(value: Any, limit: int = PREVIEW_CHARS) -> Bounded:
    """``value`` as indented JSON (:func:`pretty_json`), bounded."""
    return bounded(pretty_json(value), limit)


def bounded_steps(steps: dict[str, Any]) -> list[tuple[str, Bounded]]:
    """A durable job's step results (name -> result), each as bounded JSON: the page shows
    about ``PREVIEW_CHARS`` of them in all (at least 200 of each), the whole a link away."""
    limit = max(200, PREVIEW_CHARS // max(1, len(steps)))
    return [(name, bounded_json(result, limit)) for name, result in steps.items()]


@dataclass(frozen=True)
class Progress:
    """A job's progress as its pages show it: ``percent`` to draw as a bar (None: no bar) and
    the text beside it."""

    percent: float | None
    text: Bounded


def progress(value: Any, limit: int = PREVIEW_CHARS) -> Progress:
    """A progress that is a percentage, a number from 0 to 100 (``job.progress(50)``), is a bar
    with its number ("50%"); anything else (a dict, a string, a number out of that range) is
    its value as JSON, bounded; none reported yet is "-"."""
    if value is None:
        return Progress(None, bounded("-"))
    if isinstance(value, int | float) and not isinstance(value, bool) and \
            math.isfinite(value) and 0 <= value <= 100:
        return Progress(float(value), bounded(f"{round(value, 1):g}%"))
    return Progress(None, bounded_json(value, limit))


def preview(value: Any, width: int = 80) -> str:
    """``value`` as compact JSON on one line, cut at ``width`` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[:width - 1] + "…"


@dataclass
class QueueRow:
    name: str
    counts: dict[JobState, int]
    paused: bool
    lag: float | None
    completed_per_s: float | None
    failed_per_s: float | None
    workers: int

    def cells(self) -> dict[str, str]:
        """Each column's text, keyed as the page's ``data-field`` attributes."""
        shown = {state.value: str(n) for state, n in self.counts.items()}
        return {**shown, "lag": age(self.lag), "completed_per_s": rate(self.completed_per_s),
                "failed_per_s": rate(self.failed_per_s), "workers": str(self.workers),
                "paused": "paused" if self.paused else "running"}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "counts": {s.value: n for s, n in self.counts.items()},
                "paused": self.paused, "lag_seconds": self.lag,
                "completed_per_s": self.completed_per_s, "failed_per_s": self.failed_per_s,
                "workers": self.workers, "cells": self.cells()}


@dataclass
class Overview:
    queues: list[QueueRow]
    workers: int
    taken_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"queues": [q.to_dict() for q in self.queues], "workers": self.workers,
                "taken_at": self.taken_at.isoformat(), "updated": timestamp(self.taken_at)}


@dataclass
class _Window:
    position: str
    last_read: float
    # (when, completed, failed) per read; the first entry is where the window starts.
    samples: deque[tuple[float, int, int]]


class Rates:
    """Completed and failed jobs per second of each queue, from its event stream (thread-safe:
    the app serves requests from a thread pool)."""

    def __init__(self, client: SyncQueueClient) -> None:
        self.client = client
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def read(self, queue: str) -> tuple[float | None, float | None]:
        """Per second over the last :data:`RATE_WINDOW` s; None until two reads are apart."""
        with self._lock:
            now = time.monotonic()
            window = self._windows.get(queue)
            if window is None:
                self._windows[queue] = _Window(events_end(self.client, queue), now,
                                               deque([(now, 0, 0)]))
                return None, None
            if now - window.last_read >= _RATE_MIN_INTERVAL:
                completed, failed, window.position = ends_since(self.client, queue,
                                                                window.position)
                window.samples.append((now, completed, failed))
                window.last_read = now
                while len(window.samples) > 2 and window.samples[1][0] <= now - RATE_WINDOW:
                    window.samples.popleft()
            start = window.samples[0][0]
            elapsed = window.last_read - start
            if elapsed <= 0:
                return None, None
            counted = list(window.samples)[1:]
            return (sum(s[1] for s in counted) / elapsed, sum(s[2] for s in counted) / elapsed)


class QueueNames:
    """The names of the queues in Redis, scanned at most every :data:`QUEUE_LIST_TTL` seconds
    (thread-safe; a stale list is served while a background thread scans again)."""

    def __init__(self, client: SyncQueueClient, ttl: float = QUEUE_LIST_TTL) -> None:
        self.client = client
        self.ttl = ttl
        self._names: list[str] | None = None
        self._taken = 0.0
        self._refreshing = False
        self._refresher: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def get(self) -> list[str]:
        with self._lock:
            if self._names is None:
                self._names, self._taken = self.client.queues(), time.monotonic()
            elif time.monotonic() - self._taken > self.ttl and not self._refreshing and \
                    not self._closed:
                self._refreshing = True
                self._refresher = threading.Thread(
                    target=self._refresh, name="panqueue-dashboard-queues", daemon=True)
                self._refresher.start()
            return list(self._names)

    def close(self, timeout: float = 5.0) -> None:
        """Wait for a scan in progress (before the client it uses is closed); a request still
        being served starts no other one."""
        with self._lock:
            self._closed = True
            refresher = self._refresher
        if refresher is not None:
            refresher.join(timeout)

    def _refresh(self) -> None:
        try:
            names = self.client.queues()
        except PanqueueError:
            names = None  # Redis away: keep the old list; the pages say what is wrong
        with self._lock:
            if names is not None:
                self._names, self._taken = names, time.monotonic()
            self._refreshing = False


def live_workers(client: SyncQueueClient, queues: list[str]) -> list[WorkerProcess]:
    """The live worker processes of ``queues``, one row per process with all its queues."""
    return worker_processes([w for queue in queues for w in client.workers(queue)])


def overview(client: SyncQueueClient, names: QueueNames, rates: Rates) -> Overview:
    """Every queue's row, and how many workers are live."""
    queues = names.get()
    live = live_workers(client, queues)
    rows = []
    for queue in queues:
        completed, failed = rates.read(queue)
        rows.append(QueueRow(queue, client.counts(queue), client.is_paused(queue),
                             lag_seconds(client, queue), completed, failed,
                             sum(1 for w in live if queue in w.queues)))
    return Overview(rows, len(live), datetime.now(UTC))


def _field_value(key: str, value: Any) -> Any:
    if isinstance(value, ErrorInfo):
        return value.to_wire()
    if key == "until" and isinstance(value, str) and value.isascii() and value.isdigit():
        # A rate_limited event's end, stored in ms.
        return timestamp(datetime.fromtimestamp(int(value) / 1000, tz=UTC))
    return value


def event_dict(event: Event) -> dict[str, Any]:
    """An event as JSON-ready values (its time is the stream id's milliseconds)."""
    fields = {key: _field_value(key, value) for key, value in event.fields.items()}
    millis = int(event.id.split("-", 1)[0])
    return {"id": event.id, "type": event.type, "job_id": event.job_id,
            "time": timestamp(datetime.fromtimestamp(millis / 1000, tz=UTC)),
            "fields": json.dumps(fields, ensure_ascii=False, default=str) if fields else ""}


def recent_events(client: SyncQueueClient, queue: str, after: str | None
                  ) -> tuple[list[dict[str, Any]], str, bool]:
    """The events after stream id ``after`` (None: those of the minute before the stream's
    last event), at most the newest :data:`EVENTS_SHOWN`, the position to read on from, and
    whether the queue wrote every event until now. Asks the queue, once, to write every event
    for the next hour (ops/events.py watch), before it reads. A position the queue no longer
    takes (its partition count changed since) goes on from the end of its events, as
    :func:`~panqueue._ends.ends_since` does: a page open across the change keeps following."""
    producer = client.producer
    watched = producer.run(producer.on_all(queue, watch_events))
    if after is None:
        end = events_end(client, queue)
        millis = int(end.split("-", 1)[0])
        after = "0-0" if end == "0-0" else f"{max(0, millis - _EVENTS_LOOKBACK_MS)}-0"
    found: deque[Event] = deque(maxlen=EVENTS_SHOWN)
    for _ in range(EVENT_READS):
        try:
            events, after = client.read_events(queue, after, limit=EVENT_BATCH, watch=False)
        except ConfigError:
            return [event_dict(e) for e in found], events_end(client, queue), watched
        found.extend(events)
        if len(events) < EVENT_BATCH:
            break
    return [event_dict(e) for e in found], after, watched
