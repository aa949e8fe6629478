"""Prometheus metrics (extra ``panqueue[metrics]``).

Two sources, two scrape targets:

- :class:`WorkerMetrics`: counters and histograms a worker process updates as it runs jobs
  (``panqueue worker --metrics-port``). The runtime calls its hook methods
  (:meth:`~WorkerMetrics.attempt_finished`, :meth:`~WorkerMetrics.claim_finished`,
  :meth:`~WorkerMetrics.locks_renewed`, :meth:`~WorkerMetrics.lock_lost`,
  :meth:`~WorkerMetrics.executor_restarted`); a worker without a
  metrics object skips them at the cost of one ``is None`` check.
- :class:`QueueCollector`: gauges read from Redis at scrape time (``panqueue metrics``): jobs
  by state, lag, paused, live workers, and for autoscaling each queue's backlog (waiting plus
  due delayed jobs) and the age of its oldest ready job. One such exporter per Redis
  deployment is enough.

Only this module imports ``prometheus_client``; the rest of panqueue does not need it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError:  # pragma: no cover - exercised only without the extra
    raise ImportError("panqueue.metrics needs prometheus-client: "
                      "pip install 'panqueue[metrics]'") from None

from panqueue._client import SyncQueueClient
from panqueue._job import JobState
from panqueue._lag import waiting_seconds
from panqueue._store.ops.partitions import all_due_delayed

__all__ = ["OUTCOMES", "QueueCollector", "WorkerMetrics", "serve"]

#: The ``outcome`` an attempt ends with, as passed to :meth:`WorkerMetrics.attempt_finished`.
OUTCOMES = ("completed", "failed", "retried", "cancelled", "lock_lost", "released",
            "snoozed", "rate_limited", "suspended", "unrecorded")

# Seconds: from a millisecond job to a long batch.
_RUN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0, 300.0, 900.0, 3600.0)
_WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
                 21600.0, 86400.0)
_CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)

class WorkerMetrics:
    """A worker's counters and histograms, in a registry of their own (``self.registry``).

    Pass one to :class:`~panqueue.Worker` or :class:`~panqueue.WorkerPool` (``metrics=``) and
    serve ``self.registry`` with :func:`serve`, or with your own ``prometheus_client`` setup.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._outcomes = {
            outcome: Counter(f"panqueue_jobs_{outcome}_total",
                             f"Attempts that ended {outcome.replace('_', ' ')} on this worker.",
                             ["queue"], registry=r)
            for outcome in OUTCOMES}
        self._run = Histogram("panqueue_job_run_seconds",
                              "Run time of an attempt (handler start to end).", ["queue"],
                              buckets=_RUN_BUCKETS, registry=r)
        self._wait = Histogram("panqueue_job_wait_seconds",
                               "Time from the job's enqueue to the start of the attempt.",
                               ["queue"], buckets=_WAIT_BUCKETS, registry=r)
        self._claim = Histogram("panqueue_claim_seconds",
                                "Round trip of one claim call to Redis.", ["queue"],
                                buckets=_CLAIM_BUCKETS, registry=r)
        self._renewals = Counter("panqueue_lock_renewals_total",
                                 "Job locks renewed (one per running job per renewal call).",
                                 ["queue"], registry=r)
        self._losses = Counter("panqueue_lock_losses_total",
                               "Attempts stopped because their lock was lost.", ["queue"],
                               registry=r)
        self._restarts = Counter(
            "panqueue_executor_restarts_total",
            "Subprocess children replaced, or threads left running, because an attempt crashed, "
            "timed out or was stopped.", ["queue", "executor", "reason"], registry=r)

    # The runtime's hooks: called on the event loop, cheap, never raising.

    def attempt_finished(self, queue: str, outcome: str, run_s: float, wait_s: float) -> None:
        """One attempt ended with ``outcome`` (one of :data:`OUTCOMES`)."""
        counter = self._outcomes.get(outcome)
        if counter is not None:
            counter.labels(queue).inc()
        self._run.labels(queue).observe(max(run_s, 0.0))
        self._wait.labels(queue).observe(max(wait_s, 0.0))

    def claim_finished(self, queue: str, seconds: float) -> None:
        """One claim call was answered after ``seconds``."""
        self._claim.labels(queue).observe(seconds)

    def locks_renewed(self, queue: str, n: int) -> None:
        self._renewals.labels(queue).inc(n)

    def lock_lost(self, queue: str) -> None:
        self._losses.labels(queue).inc()

    def executor_restarted(self, queue: str, executor: str, reason: str) -> None:
        """The queue's executor replaced a child or thread (``reason``: crashed, timeout,
        stopped)."""
        self._restarts.labels(queue, executor, reason).inc()


class QueueCollector(Collector):
    """Gauges read from Redis at each scrape: every queue's jobs by state, lag, paused flag and
    live workers. Register it in a ``CollectorRegistry`` (as :func:`serve_queues` does).
    ``prefix``: the key namespace of the queues it reads (``QueueClient``'s)."""

    def __init__(self, url: str | None = None, *, prefix: str | None = None) -> None:
        self._client = SyncQueueClient(url, prefix=prefix)
        self._lock = threading.Lock()  # scrapes may come from several server threads

    def close(self) -> None:
        self._client.close()

    def collect(self) -> Iterator[Any]:
        jobs = GaugeMetricFamily("panqueue_jobs", "Jobs in each state.",
                                 labels=["queue", "state"])
        lag = GaugeMetricFamily("panqueue_queue_lag_seconds",
                                "Age of the oldest waiting job (0 when none waits).",
                                labels=["queue"])
        paused = GaugeMetricFamily("panqueue_queue_paused", "1 while the queue is paused.",
                                   labels=["queue"])
        workers = GaugeMetricFamily("panqueue_workers", "Live workers serving the queue.",
                                    labels=["queue"])
        backlog = GaugeMetricFamily(
            "panqueue_queue_backlog",
            "Jobs ready to run and not started: waiting, plus delayed ones already due (the "
            "figure to autoscale workers on).", labels=["queue"])
        oldest = GaugeMetricFamily(
            "panqueue_queue_oldest_waiting_seconds",
            "How long the job that has been ready longest has waited (since it was added, or "
            "since it came due; 0 when none is ready).", labels=["queue"])
        up = GaugeMetricFamily("panqueue_up", "1 if Redis answered this scrape, else 0.")
        try:
            with self._lock:
                rows = self._read()
        except Exception:
            up.add_metric([], 0)
            yield up
            return
        for queue, counts, age, ready, is_paused, live, (due, due_for) in rows:
            for state, n in counts.items():
                jobs.add_metric([queue, state.value], n)
            lag.add_metric([queue], age)
            paused.add_metric([queue], 1 if is_paused else 0)
            workers.add_metric([queue], live)
            backlog.add_metric([queue], counts[JobState.WAITING] + due)
            oldest.add_metric([queue], max(ready, due_for))
        up.add_metric([], 1)
        yield from (jobs, lag, paused, workers, backlog, oldest, up)

    def _read(self) -> list[tuple[str, dict[JobState, int], float, float, bool, int,
                                  tuple[int, float]]]:
        client = self._client
        live: dict[str, int] = {}
        for worker in client.workers():
            for queue in worker.queues:
                live[queue] = live.get(queue, 0) + 1
        rows = []
        for queue in client.queues():
            age, ready = waiting_seconds(client, queue)
            due = client.producer.run(client.producer.on_all(queue, all_due_delayed))
            rows.append((queue, client.counts(queue), age or 0.0, ready, client.is_paused(queue),
                         live.get(queue, 0), due))
        return rows


def serve(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> Any:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread; returns the
    server (``.shutdown()`` stops it). OSError if the address cannot be bound."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server


def serve_queues(url: str | None, port: int, host: str = "127.0.0.1", *,
                 prefix: str | None = None) -> tuple[Any, QueueCollector]:
    """The cluster exporter: a :class:`QueueCollector` on ``url`` (the queues of ``prefix``)
    served on ``host:port``."""
    registry = CollectorRegistry()
    collector = QueueCollector(url, prefix=prefix)
    registry.register(collector)
    try:
        return serve(registry, port, host), collector
    except BaseException:
        collector.close()
        raise
