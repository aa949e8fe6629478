"""``panqueue top``: the live terminal view, on textual (extra ``panqueue[tui]``).

The only module of the package that imports textual; ``cli/_top.py`` imports it only when the
command runs. Every refresh reads, per queue, the counts, whether it is paused, the oldest
waiting job (lag), the new entries of its event stream and the wait and run times of the jobs
it finished in the last minute; and the live workers.

Rates: the completed and failed sets are trimmed by retention, so their sizes cannot give
rates. The view counts the ``completed`` and ``failed`` events appended to each queue's event
stream since its last read instead (each read asks the queue to write those for the next hour,
as a queue nobody waits on does not; the stream is itself trimmed to about 10,000 entries, so a
queue that finishes more than that between two refreshes is undercounted).

Wait and run times: read back from the job hashes of the newest jobs (up to 1,000) that
completed or failed in the last minute (``client.timings``), so the view adds no write to
any job's path and shows the same numbers whenever it starts.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Static

from panqueue._client import SyncQueueClient
from panqueue._ends import ends_since, events_end
from panqueue._job import JobInfo, JobState
from panqueue._lag import lag_seconds
from panqueue._store.ops.timings import DEFAULT_SAMPLE, Timings
from panqueue._store.transport import redact_url

__all__ = ["QueueRow", "Snapshot", "TopApp", "sparkline"]

HISTORY = 180  # samples kept per queue (3 minutes at one a second)
_SPARK_WIDTH = 24  # samples shown in the queue table
_BARS = "▁▂▃▄▅▆▇█"
_FAILED_SHOWN = 50
TIMINGS_WINDOW = 60.0  # seconds of finished jobs behind the wait and run percentiles


def sparkline(values: list[float], width: int) -> str:
    """The last ``width`` values as block characters, scaled to their maximum."""
    shown = values[-width:]
    top = max(shown, default=0.0)
    if top <= 0:
        return _BARS[0] * len(shown)
    return "".join(_BARS[min(len(_BARS) - 1, int(v / top * (len(_BARS) - 1) + 0.5))]
                   for v in shown)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _duration(seconds: float | None) -> str:
    """A wait or run time: milliseconds below a second, else like :func:`_age`."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.2f}s"
    return _age(seconds)


def _pair(p50: float | None, p95: float | None) -> str:
    """``p50/p95``, or ``-`` when no job finished in the window."""
    if p50 is None or p95 is None:
        return "-"
    return f"{_duration(p50)}/{_duration(p95)}"


@dataclass
class QueueRow:
    name: str
    counts: dict[JobState, int]
    paused: bool
    lag: float | None
    workers: int
    completed_rate: list[float]
    failed_rate: list[float]
    timings: Timings


@dataclass
class WorkerRow:
    name: str
    host: str
    queues: list[str]
    running: int
    concurrency: int
    heartbeat_age: float


@dataclass
class Snapshot:
    queues: list[QueueRow]
    workers: list[WorkerRow]
    taken_at: datetime


@dataclass
class _Rates:
    """A queue's stream position and per-second samples of finished jobs."""

    position: str
    last: float
    completed: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    failed: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))


class Sampler:
    """Reads one snapshot of every queue and the workers (blocking; run off the UI loop)."""

    def __init__(self, client: SyncQueueClient) -> None:
        self.client = client
        self._rates: dict[str, _Rates] = {}

    def _finished_since_last(self, queue: str) -> tuple[float, float]:
        """Completed and failed jobs per second since the previous call for ``queue``."""
        rates = self._rates.get(queue)
        now = time.monotonic()
        if rates is None:
            self._rates[queue] = _Rates(events_end(self.client, queue), now)
            return 0.0, 0.0
        completed, failed, rates.position = ends_since(self.client, queue, rates.position)
        elapsed = max(now - rates.last, 1e-3)
        rates.last = now
        rates.completed.append(completed / elapsed)
        rates.failed.append(failed / elapsed)
        return completed / elapsed, failed / elapsed

    def snapshot(self) -> Snapshot:
        now = datetime.now(UTC)
        workers = self.client.worker_processes()  # one row per process, whatever it serves
        rows = []
        for queue in sorted(self.client.queues()):
            counts = self.client.counts(queue)
            lag = lag_seconds(self.client, queue)
            self._finished_since_last(queue)
            rates = self._rates[queue]
            timings = self.client.timings(queue, window=TIMINGS_WINDOW)
            rows.append(QueueRow(queue, counts, self.client.is_paused(queue), lag,
                                 sum(1 for w in workers if queue in w.queues),
                                 list(rates.completed), list(rates.failed), timings))
        worker_rows = [WorkerRow(w.name, w.host, list(w.queues), len(w.running), w.concurrency,
                                 max(0.0, (now - w.heartbeat_at).total_seconds()))
                       for w in workers]
        return Snapshot(rows, worker_rows, now)


class TopApp(App[None]):
    """Queues (counts, rates, lag, wait and run times, paused, workers), the live workers, and
    a queue's failed jobs on ``f``."""

    TITLE = "panqueue top"
    CSS = """
    #queues { height: auto; max-height: 50%; }
    #detail { height: 4; padding: 0 1; }
    #workers { height: auto; max-height: 30%; }
    #failed { height: 1fr; display: none; }
    #failed.shown { display: block; }
    .label { padding: 0 1; text-style: bold; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        # Ctrl-C quits, as it does every other command (textual's default only says how to).
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("j", "down", "down", show=False),
        Binding("k", "up", "up", show=False),
        Binding("f", "failed", "failed jobs"),
        Binding("escape", "close_failed", "close", show=False),
    ]

    def __init__(self, client: SyncQueueClient, interval: float = 1.0) -> None:
        super().__init__()
        self.client = client
        self.interval = interval
        self.sampler = Sampler(client)
        self.snapshot: Snapshot | None = None
        self.failed_queue: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(f"panqueue top  {redact_url(self.client.url)}", id="title",
                     classes="label")
        yield DataTable(id="queues", cursor_type="row", zebra_stripes=True)
        yield Static("", id="detail")
        yield Static("workers", classes="label")
        yield DataTable(id="workers", cursor_type="none", show_cursor=False)
        with Vertical(id="failed"):
            yield Static("", id="failed-title", classes="label")
            yield DataTable(id="failed-jobs", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        queues = self.query_one("#queues", DataTable)
        queues.add_columns("queue", "waiting", "delayed", "active", "failed", "done/s",
                           "fail/s", f"done/s (last {_SPARK_WIDTH}s)", "lag",
                           "wait p50/p95", "run p50/p95", "paused", "workers")
        self.query_one("#workers", DataTable).add_columns(
            "name", "host", "queues", "running", "heartbeat")
        self.query_one("#failed-jobs", DataTable).add_columns("id", "finished", "attempts",
                                                              "error")
        queues.focus()
        self.refresh_data()
        self.set_interval(self.interval, self.refresh_data)

    # ------------------------------------------------------------------ data

    @work(thread=True, exclusive=True, group="sample")
    def refresh_data(self) -> None:
        try:
            snap = self.sampler.snapshot()
        except Exception as exc:  # Redis away for a moment: say so and keep trying
            self.call_from_thread(self._show_error, str(exc))
            return
        self.call_from_thread(self._show, snap)

    def _show_error(self, message: str) -> None:
        self.query_one("#title", Static).update(
            f"panqueue top  {redact_url(self.client.url)}  (error: {message})")

    def _selected_queue(self) -> str | None:
        if self.snapshot is None or not self.snapshot.queues:
            return None
        table = self.query_one("#queues", DataTable)
        index = min(max(table.cursor_row, 0), len(self.snapshot.queues) - 1)
        return self.snapshot.queues[index].name

    def _show(self, snap: Snapshot) -> None:
        self.snapshot = snap
        self.query_one("#title", Static).update(
            f"panqueue top  {redact_url(self.client.url)}  "
            f"{snap.taken_at.strftime('%H:%M:%S')} UTC  {len(snap.queues)} queue(s)  "
            f"{len(snap.workers)} live worker process(es)")
        table = self.query_one("#queues", DataTable)
        cursor = table.cursor_row
        table.clear()
        for row in snap.queues:
            done = row.completed_rate[-1] if row.completed_rate else 0.0
            fail = row.failed_rate[-1] if row.failed_rate else 0.0
            table.add_row(
                row.name, *(str(row.counts[s]) for s in (JobState.WAITING, JobState.DELAYED,
                                                         JobState.ACTIVE, JobState.FAILED)),
                f"{done:.1f}", f"{fail:.1f}", sparkline(row.completed_rate, _SPARK_WIDTH),
                _age(row.lag), _pair(row.timings.wait_p50, row.timings.wait_p95),
                _pair(row.timings.run_p50, row.timings.run_p95),
                Text("paused", style="bold yellow") if row.paused else "no",
                str(row.workers), key=row.name)
        if snap.queues:
            table.move_cursor(row=min(max(cursor, 0), len(snap.queues) - 1))
        workers = self.query_one("#workers", DataTable)
        workers.clear()
        for w in snap.workers:
            workers.add_row(w.name, w.host, ",".join(w.queues), f"{w.running}/{w.concurrency}",
                            _age(w.heartbeat_age))
        self._show_detail()
        if self.failed_queue is not None:
            self.load_failed(self.failed_queue)

    def _show_detail(self) -> None:
        detail = self.query_one("#detail", Static)
        name = self._selected_queue()
        row = next((r for r in self.snapshot.queues if r.name == name), None) \
            if self.snapshot else None
        if row is None:
            detail.update("no queues")
            return
        done = f"{row.name}  completed/s, last {len(row.completed_rate)}s: "
        failed = f"{'failed/s, last ' + str(len(row.failed_rate)) + 's: ':>{len(done)}}"
        width = max(10, self.size.width - len(done) - 4)
        t = row.timings
        window = f"last {t.window:g}s"
        sampled = " (the newest)" if t.jobs >= DEFAULT_SAMPLE else ""
        timings = (f"{row.name}  {t.jobs}{sampled} job(s) finished in the {window}: wait p50 "
                   f"{_duration(t.wait_p50)} p95 {_duration(t.wait_p95)}, run p50 "
                   f"{_duration(t.run_p50)} p95 {_duration(t.run_p95)}")
        detail.update(f"{done}{sparkline(row.completed_rate, width)}\n"
                      f"{failed}{sparkline(row.failed_rate, width)}\n{timings}")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id != "queues":
            return
        self._show_detail()
        queue = self._selected_queue()
        if self.failed_queue is not None and queue is not None and queue != self.failed_queue:
            self._open_failed(queue)  # the pane follows the selected queue

    # ------------------------------------------------------------------ keys

    def action_down(self) -> None:
        self.query_one("#queues", DataTable).action_cursor_down()

    def action_up(self) -> None:
        self.query_one("#queues", DataTable).action_cursor_up()

    def action_failed(self) -> None:
        pane = self.query_one("#failed", Vertical)
        queue = self._selected_queue()
        if pane.has_class("shown") and self.failed_queue == queue:
            self.action_close_failed()
            return
        if queue is not None:
            self._open_failed(queue)

    def _open_failed(self, queue: str) -> None:
        pane = self.query_one("#failed", Vertical)
        self.failed_queue = queue
        pane.add_class("shown")
        self.query_one("#failed-title", Static).update(
            f"failed jobs of {queue} (newest first; f or escape closes)")
        self.load_failed(queue)

    def action_close_failed(self) -> None:
        self.failed_queue = None
        self.query_one("#failed", Vertical).remove_class("shown")
        self.query_one("#queues", DataTable).focus()

    @work(thread=True, exclusive=True, group="failed")
    def load_failed(self, queue: str) -> None:
        try:
            jobs = self.client.list_jobs(queue, JobState.FAILED, limit=_FAILED_SHOWN)
        except Exception as exc:
            self.call_from_thread(self._show_error, str(exc))
            return
        self.call_from_thread(self._show_failed, queue, jobs)

    def _show_failed(self, queue: str, jobs: list[JobInfo]) -> None:
        if self.failed_queue != queue:
            return
        table = self.query_one("#failed-jobs", DataTable)
        table.clear()
        for job in jobs:
            message = (job.error.message.splitlines() or [""])[0] if job.error else ""
            error = "-" if job.error is None else f"{job.error.type}: {message}"
            if job.failure_reason and job.error is None:
                error = job.failure_reason
            finished = "-" if job.finished_at is None else \
                job.finished_at.astimezone(UTC).strftime("%H:%M:%S")
            table.add_row(job.id, finished, str(job.attempts), error)
        if not jobs:
            table.add_row("-", "-", "-", "no failed jobs")
