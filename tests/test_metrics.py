"""Prometheus metrics: ``panqueue worker --metrics-port`` (the worker's counters and histograms)
and ``panqueue metrics`` (queue gauges read from Redis at scrape time), both run as a user runs
them, as child processes, and scraped over HTTP."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from panqueue import JobState, SyncQueueClient
from panqueue.embedded import RedisServer
from tests.helpers import (
    ROOT,
    WorkerProcess,
    free_port,
    panqueue_command,
    subprocess_env,
    wait_until,
)
from tests.test_cli import ECHO, FAIL, counts

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples | None:
    """Every sample of http://127.0.0.1:port/metrics by (name, labels); None if no answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_worker_metrics_count_what_ran(private_redis: RedisServer,
                                       start_worker: Callable[..., WorkerProcess]) -> None:
    port = free_port()
    worker = start_worker("--url", private_redis.url, "--poll-interval", "0.1",
                            "--metrics-port", str(port))
    wait_until(lambda: scrape(port) is not None, 20, "/metrics to answer")
    with SyncQueueClient(private_redis.url) as client:
        for n in range(5):
            client.queue(ECHO).add({"n": n})
        for n in range(2):
            client.queue(FAIL).add(n)
    wait_until(lambda: counts(private_redis.url, ECHO)[JobState.COMPLETED] == 5
               and counts(private_redis.url, FAIL)[JobState.FAILED] == 2, 20, "the jobs to run")

    def settled() -> bool:
        samples = scrape(port)
        return samples is not None and value(
            samples, "panqueue_jobs_failed_total", queue=FAIL) == 2 and value(
            samples, "panqueue_jobs_completed_total", queue=ECHO) == 5

    wait_until(settled, 10, "the counters to show 5 completed and 2 failed")
    samples = scrape(port)
    assert samples is not None
    assert value(samples, "panqueue_jobs_completed_total", queue=FAIL) in (None, 0)
    assert value(samples, "panqueue_jobs_failed_total", queue=ECHO) in (None, 0)
    assert value(samples, "panqueue_jobs_retried_total", queue=FAIL) in (None, 0)
    assert value(samples, "panqueue_job_run_seconds_count", queue=ECHO) == 5
    assert value(samples, "panqueue_job_run_seconds_count", queue=FAIL) == 2
    assert value(samples, "panqueue_job_wait_seconds_count", queue=ECHO) == 5
    assert value(samples, "panqueue_job_wait_seconds_count", queue=FAIL) == 2
    wait_sum = value(samples, "panqueue_job_wait_seconds_sum", queue=ECHO)
    assert wait_sum is not None and 0 <= wait_sum < 5 * 20
    claims = value(samples, "panqueue_claim_seconds_count", queue=ECHO)
    assert claims is not None and claims >= 1
    # No label carries a job id: every sample is labelled by queue (and bucket) only.
    for _name, labels in samples:
        assert {key for key, _ in labels} <= {"queue", "le"}, labels
    assert worker.stop() == 0


# One handler per way an attempt can end (the worker process imports this module).
OUTCOMES_APP = """
import os
import time
from pathlib import Path

import anyio

from panqueue import Backoff, Job, Registry

queues = Registry()
now = Backoff.fixed(0)


@queues.handler("m-echo")
async def echo(job: Job) -> object:
    return job.data


@queues.handler("m-fail", attempts=1)
async def fail(job: Job) -> None:
    raise RuntimeError("no")


@queues.handler("m-flaky", attempts=3, backoff=now)
async def flaky(job: Job) -> str:
    if job.attempt == 1:
        raise RuntimeError("first attempt fails")
    return "second attempt"


@queues.handler("m-crash", executor="subprocess", attempts=2, backoff=now)
def crash(job: Job) -> str:
    if job.attempt == 1:
        os._exit(3)  # the child dies mid-job: the executor replaces it
    return "new child"


@queues.handler("m-timeout", executor="thread", attempts=1, timeout=0.2)
def too_slow(job: Job) -> None:
    while not job.should_stop():
        time.sleep(0.01)


# Runs until stopped; the file says it started. A short lock: renewed every 0.5 s.
@queues.handler("m-hold", attempts=1, lock_ttl=1.5)
async def hold(job: Job) -> None:
    Path(job.data).touch()
    await anyio.sleep(60)


# Its lock is taken away while it runs; the sweep then fails it (no stall allowed).
@queues.handler("m-lose", attempts=1, lock_ttl=1.5, max_stalls=0)
async def lose(job: Job) -> None:
    Path(job.data).touch()
    await anyio.sleep(60)
"""


def test_worker_and_exporter_count_every_outcome_of_what_ran(
        private_redis: RedisServer, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = private_redis.url
    port = free_port()
    (tmp_path / "outcomes_app.py").write_text(OUTCOMES_APP)
    worker = WorkerProcess(tmp_path, "--url", url, "--poll-interval", "0.1", "--metrics-port",
                           str(port), app="outcomes_app:queues", path=tmp_path)
    request.addfinalizer(worker.kill)
    wait_until(lambda: scrape(port) is not None, 20, "/metrics to answer")
    held, lost = tmp_path / "held", tmp_path / "lost"
    with SyncQueueClient(url) as client, redis.Redis.from_url(url) as raw:
        for n in range(3):
            client.queue("m-echo").add(n)
        for n in range(2):
            client.queue("m-fail").add(n)
            client.queue("m-flaky").add(n)
        client.queue("m-crash").add(None)
        client.queue("m-timeout").add(None)
        hold = client.queue("m-hold").add(str(held))
        lose = client.queue("m-lose").add(str(lost))

        # Cancel the held job once its lock was renewed at least once. It started before its
        # file was seen and ends after the cancel is sent: it ran at least that long.
        wait_until(held.exists, 20, "the held job to start")
        seen = time.monotonic()
        wait_until(lambda: (value(scrape(port) or {}, "panqueue_lock_renewals_total",
                                  queue="m-hold") or 0) >= 1,
                   20, "the held job's lock to be renewed")
        held_for = time.monotonic() - seen
        assert client.cancel("m-hold", hold.id) is JobState.ACTIVE
        # Take the other job's lock away, as if the lock had expired and another worker had
        # claimed it: the next renewal finds the token changed and stops the attempt.
        wait_until(lost.exists, 20, "the job whose lock will be lost to start")
        raw.hset(f"{{q:m-lose}}:job:{lose.id}", "tk", "someone-else")

        def finished() -> bool:
            c = {q: client.counts(q) for q in ("m-echo", "m-fail", "m-flaky", "m-crash",
                                                "m-timeout", "m-hold", "m-lose")}
            return (c["m-echo"][JobState.COMPLETED] == 3 and c["m-fail"][JobState.FAILED] == 2
                    and c["m-flaky"][JobState.COMPLETED] == 2
                    and c["m-crash"][JobState.COMPLETED] == 1
                    and c["m-timeout"][JobState.FAILED] == 1
                    and c["m-hold"][JobState.CANCELLED] == 1
                    and c["m-lose"][JobState.FAILED] == 1)

        wait_until(finished, 30, "every job to end")
        assert client.get_job("m-lose", lose.id).failure_reason == "stalled"
        assert client.get_job("m-crash", client.list_jobs("m-crash", JobState.COMPLETED)[0].id
                              ).result == "new child"

    # What each queue's attempts ended as: (completed, failed, retried, cancelled, lock_lost).
    expected = {"m-echo": (3, 0, 0, 0, 0), "m-fail": (0, 2, 0, 0, 0),
                "m-flaky": (2, 0, 2, 0, 0), "m-crash": (1, 0, 1, 0, 0),
                "m-timeout": (0, 1, 0, 0, 0), "m-hold": (0, 0, 0, 1, 0),
                "m-lose": (0, 0, 0, 0, 1)}
    names = ("completed", "failed", "retried", "cancelled", "lock_lost")

    def counted() -> dict[str, tuple[float, ...]]:
        samples = scrape(port) or {}
        return {queue: tuple(value(samples, f"panqueue_jobs_{name}_total", queue=queue) or 0
                             for name in names) for queue in expected}

    # The last outcomes are recorded just before their counters move: wait for them.
    wait_until(lambda: counted() == expected, 10, f"the counters to be {expected}")
    samples = scrape(port)
    assert samples is not None
    for queue, ends in expected.items():
        assert value(samples, "panqueue_jobs_released_total", queue=queue) in (None, 0)
        # Every attempt is timed once, whatever its end.
        attempts = sum(ends)
        assert value(samples, "panqueue_job_run_seconds_count", queue=queue) == attempts
        assert value(samples, "panqueue_job_wait_seconds_count", queue=queue) == attempts
    assert value(samples, "panqueue_lock_losses_total", queue="m-lose") == 1
    assert value(samples, "panqueue_lock_losses_total", queue="m-hold") in (None, 0)
    renewals = value(samples, "panqueue_lock_renewals_total", queue="m-hold")
    assert renewals is not None and renewals >= 1
    # The held job's run time covers at least what the test saw of it.
    held_run = value(samples, "panqueue_job_run_seconds_sum", queue="m-hold")
    assert held_run is not None and held_for <= held_run < 30
    assert value(samples, "panqueue_executor_restarts_total", queue="m-crash",
                 executor="subprocess", reason="crashed") == 1
    assert value(samples, "panqueue_executor_restarts_total", queue="m-timeout",
                 executor="thread", reason="timeout") == 1
    restarts = {labels: n for (name, labels), n in samples.items()
                if name == "panqueue_executor_restarts_total"}
    assert sum(restarts.values()) == 2, restarts
    for name, labels in samples:
        assert name.startswith("panqueue_") or name.startswith(("python_", "process_")), name
        assert {key for key, _ in labels} <= {"queue", "le", "executor", "reason"}, labels

    # The exporter reads the same story from Redis.
    exporter_port = free_port()
    exporter = subprocess.Popen(
        panqueue_command("metrics", "--url", url, "--port", str(exporter_port)),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=subprocess_env(), cwd=ROOT)
    try:
        wait_until(lambda: scrape(exporter_port) is not None, 20, "the exporter to answer")
        gauges = scrape(exporter_port)
        assert gauges is not None
        stored = {"m-echo": ("completed", 3), "m-fail": ("failed", 2),
                  "m-flaky": ("completed", 2), "m-crash": ("completed", 1),
                  "m-timeout": ("failed", 1), "m-hold": ("cancelled", 1),
                  "m-lose": ("failed", 1)}
        for queue, (state, n) in stored.items():
            assert value(gauges, "panqueue_jobs", queue=queue, state=state) == n, queue
            assert value(gauges, "panqueue_jobs", queue=queue, state="active") == 0, queue
            assert value(gauges, "panqueue_jobs", queue=queue, state="waiting") == 0, queue
            assert value(gauges, "panqueue_workers", queue=queue) == 1, queue
            assert value(gauges, "panqueue_queue_paused", queue=queue) == 0, queue
            assert value(gauges, "panqueue_queue_lag_seconds", queue=queue) == 0, queue
    finally:
        exporter.terminate()
        _out, err = exporter.communicate(timeout=15)
    assert exporter.returncode == 0, err
    assert worker.stop() == 0, worker.stderr


def test_observability_example_shows_counters_gauges_and_linked_spans(redis_url: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "observability.py")],
                          capture_output=True, text=True, timeout=90, cwd=ROOT,
                          env=subprocess_env(PANQUEUE_URL=redis_url))
    assert proc.returncode == 0, proc.stderr
    for line in ('panqueue_jobs_completed_total{queue="reports"} 1.0',
                 'panqueue_jobs_retried_total{queue="reports"} 2.0',
                 'panqueue_job_run_seconds_count{queue="reports"} 3.0',
                 'panqueue_jobs{queue="reports",state="completed"} 1.0',
                 "attempt 1: failed, child of the request: True, links to attempt(s) []",
                 "attempt 2: failed, child of the request: True, links to attempt(s) [1]",
                 "attempt 3: completed, child of the request: True, links to attempt(s) [2]"):
        assert line in proc.stdout, proc.stdout
    assert proc.stdout.splitlines()[-1] == "done"


def test_worker_metrics_port_taken_is_one_line(private_redis: RedisServer) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            panqueue_command("worker", "cli_app:queues", "--url", private_redis.url,
                             "--metrics-port", str(port)),
            capture_output=True, text=True, timeout=30, env=subprocess_env(), cwd=ROOT)
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stderr
    assert "cannot serve metrics on 127.0.0.1" in proc.stderr


def test_exporter_reports_queue_gauges(private_redis: RedisServer,
                                       start_worker: Callable[..., WorkerProcess]) -> None:
    url = private_redis.url
    worker = start_worker("--url", url, "--poll-interval", "0.1", "-q", ECHO)
    with SyncQueueClient(url) as client:
        for n in range(5):
            client.queue(ECHO).add({"n": n})
        client.pause(FAIL)
        for n in range(3):
            client.queue(FAIL).add(n)
    wait_until(lambda: counts(url, ECHO)[JobState.COMPLETED] == 5, 20, "the echo jobs to run")

    port = free_port()
    exporter = subprocess.Popen(
        panqueue_command("metrics", "--url", url, "--port", str(port)),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=subprocess_env(), cwd=ROOT)
    try:
        wait_until(lambda: scrape(port) is not None, 20, "the exporter to answer")
        samples = scrape(port)
        assert samples is not None
        assert value(samples, "panqueue_up") == 1
        assert value(samples, "panqueue_jobs", queue=ECHO, state="completed") == 5
        assert value(samples, "panqueue_jobs", queue=ECHO, state="waiting") == 0
        assert value(samples, "panqueue_jobs", queue=FAIL, state="waiting") == 3
        assert value(samples, "panqueue_jobs", queue=FAIL, state="failed") == 0
        assert value(samples, "panqueue_workers", queue=ECHO) == 1
        assert value(samples, "panqueue_workers", queue=FAIL) == 0
        assert value(samples, "panqueue_queue_paused", queue=FAIL) == 1
        assert value(samples, "panqueue_queue_paused", queue=ECHO) == 0
        assert value(samples, "panqueue_queue_lag_seconds", queue=ECHO) == 0
        lag = value(samples, "panqueue_queue_lag_seconds", queue=FAIL)
        assert lag is not None and 0 <= lag < 60
        assert value(samples, "panqueue_queue_backlog", queue=FAIL) == 3
        assert value(samples, "panqueue_queue_backlog", queue=ECHO) == 0
        oldest = value(samples, "panqueue_queue_oldest_waiting_seconds", queue=FAIL)
        assert oldest is not None and oldest >= lag
        # Read at scrape time: a stopped worker and more jobs show on the next scrape.
        assert worker.stop() == 0
        with SyncQueueClient(url) as client:
            client.queue(ECHO).add({"n": 5})

        def updated() -> bool:
            s = scrape(port)
            return s is not None and value(s, "panqueue_workers", queue=ECHO) == 0 and value(
                s, "panqueue_jobs", queue=ECHO, state="waiting") == 1

        wait_until(updated, 10, "the next scrape to see the change")
    finally:
        exporter.terminate()
        _out, err = exporter.communicate(timeout=15)
    assert exporter.returncode == 0, err
    assert "Traceback" not in err.decode()


def test_core_does_not_import_prometheus_client_and_a_missing_extra_is_one_line(
        redis_url: str) -> None:
    code = ("import sys; import panqueue, panqueue.cli, panqueue._runtime.worker; "
            "assert 'prometheus_client' not in sys.modules, 'imported'; "
            "sys.modules['prometheus_client'] = None; "
            "sys.exit(panqueue.cli.main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "metrics", "--url", redis_url],
                          capture_output=True, text=True, timeout=30, env=subprocess_env(),
                          cwd=ROOT)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "panqueue[metrics]" in lines[0]


def test_grafana_dashboard_is_json_on_the_documented_names() -> None:
    import json
    import re

    dashboard = json.loads((ROOT / "examples" / "grafana-panqueue.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {re.sub(r"_(bucket|count|sum)$", "", name)
            for expr in exprs for name in re.findall(r"\bpanqueue_\w+", expr)}
    documented = set(re.findall(r"`(panqueue_\w+)`",
                                (ROOT / "docs" / "observability.md").read_text()))
    assert used and used <= documented, used - documented
    from panqueue.metrics import OUTCOMES

    for outcome in OUTCOMES:
        assert f"panqueue_jobs_{outcome}_total" in documented


def test_backlog_counts_waiting_and_due_delayed_jobs_on_every_partition(
        redis_url: str, queue_name: str) -> None:
    """What an autoscaler reads: jobs ready to run (waiting, and delayed ones already due that
    no worker has promoted yet), and how long the longest-ready one has waited."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from panqueue import Registry
    from panqueue.metrics import QueueCollector

    registry = Registry()

    @registry.handler(queue_name, partitions=3)
    async def work(job: object) -> None: ...

    with SyncQueueClient(redis_url) as client:
        queue = client.queue(work)
        queue.add_bulk([1, 2, 3, 4])
        for n in range(5):
            queue.add(n, delay=0.05)
        queue.add("later", delay=3600)
    collector = QueueCollector(redis_url)
    metrics = CollectorRegistry()
    metrics.register(collector)

    def read() -> dict[str, float]:
        found = {}
        for family in text_string_to_metric_families(generate_latest(metrics).decode()):
            for sample in family.samples:
                if sample.labels.get("queue") == queue_name:
                    found[sample.name] = sample.value
        return found

    try:
        wait_until(lambda: read()["panqueue_queue_backlog"] == 9, 10,
                   "the delayed jobs to come due")
        samples = read()
        assert samples["panqueue_queue_oldest_waiting_seconds"] >= samples[
            "panqueue_queue_lag_seconds"]
        assert samples["panqueue_queue_oldest_waiting_seconds"] < 60
    finally:
        collector.close()


@pytest.mark.anyio
async def test_a_failed_attempts_wait_ends_where_it_started_not_after_its_callbacks(
        redis_url: str, queue_name: str) -> None:
    """panqueue_job_wait_seconds runs from the enqueue to the attempt's start. It was taken
    when the outcome was counted, after the failure was written and the on_failure callbacks
    ran: a slow callback was counted as the job's wait."""
    from typing import Any

    import anyio

    from panqueue import Job, QueueClient, Registry
    from panqueue.metrics import WorkerMetrics
    from panqueue.testing import run_worker
    from tests.helpers import async_wait_until

    registry = Registry()

    @registry.handler(queue_name, attempts=1)
    async def work(job: Job[int]) -> None:
        raise RuntimeError("boom")

    @registry.on_failure
    async def slow_report(job: Job[Any], exc: BaseException, final: bool) -> None:
        await anyio.sleep(1.5)

    metrics = WorkerMetrics()

    def sample(name: str) -> float | None:
        value: float | None = metrics.registry.get_sample_value(name, {"queue": queue_name})
        return value

    async with run_worker(registry, queue_name, redis_url, metrics=metrics), \
            QueueClient(redis_url) as client:
        await client.queue(work).add(1)

        async def observed() -> bool:
            return bool(sample("panqueue_job_wait_seconds_count"))

        await async_wait_until(observed, what="the attempt to be counted")
    wait = sample("panqueue_job_wait_seconds_sum")
    assert wait is not None and wait < 1.0, f"a wait of {wait:.2f} s"


@pytest.mark.anyio
async def test_an_attempt_whose_ending_redis_did_not_take_is_counted_once(
        proxy: object, redis_url: str, queue_name: str) -> None:
    """Each attempt ends in exactly one outcome counter. A failure that could not be written
    (Redis away past half the lock TTL: dropped, and the stalled sweep runs the job again)
    was counted in none; it is `unrecorded` now."""
    import anyio

    from panqueue import Job, QueueClient, Registry
    from panqueue.metrics import OUTCOMES, WorkerMetrics
    from panqueue.testing import FaultProxy, drain, run_worker
    from tests.helpers import async_wait_until

    assert isinstance(proxy, FaultProxy)
    registry = Registry()
    started, gate = anyio.Event(), anyio.Event()
    ran: list[int] = []

    @registry.handler(queue_name, attempts=1, lock_ttl=2.0)
    async def work(job: Job[int]) -> None:
        ran.append(job.attempt)
        started.set()
        await gate.wait()
        raise RuntimeError("boom")

    metrics = WorkerMetrics()
    async with QueueClient(redis_url) as client:
        await client.queue(work).add(1)
        async with run_worker(registry, queue_name, proxy.url_for(redis_url), metrics=metrics,
                              stalled_interval=0.5):
            await started.wait()
            proxy.cut()
            gate.set()  # the attempt fails now; Redis is away for longer than the recorder waits

            async def dropped() -> bool:
                value = metrics.registry.get_sample_value("panqueue_jobs_unrecorded_total",
                                                          {"queue": queue_name})
                return bool(value)

            await async_wait_until(dropped, timeout=20, what="the failure to be dropped")
            proxy.restore()
            assert (await drain(redis_url, queue_name, timeout=20))[JobState.FAILED] == 1
    counted = {o: metrics.registry.get_sample_value(f"panqueue_jobs_{o}_total",
                                                    {"queue": queue_name}) or 0
               for o in OUTCOMES}
    assert len(ran) == 2 and sum(counted.values()) == 2, counted


def test_the_oldest_waiting_gauge_counts_a_job_from_when_it_became_ready(
        redis_url: str, queue_name: str) -> None:
    """panqueue_queue_oldest_waiting_seconds: how long the job ready longest has waited, since
    it was added or since it came due. Once promoted to waiting, a delayed job was counted
    from its add, its delay included: a job out of an hour's sleep or backoff read an hour,
    and an autoscaler on it scaled up."""
    from panqueue._keys import QueueKeys
    from panqueue._store import SyncTransport, transitions
    from panqueue.metrics import QueueCollector

    def oldest(collector: QueueCollector) -> float:
        return next(sample.value for family in collector.collect()
                    for sample in family.samples
                    if sample.name == "panqueue_queue_oldest_waiting_seconds"
                    and sample.labels.get("queue") == queue_name)

    with SyncQueueClient(redis_url) as client:
        job = client.queue(queue_name).add(1, delay=1.0)
        wait_until(lambda: time.time() > job.info().enqueued_at.timestamp() + 1.2, 10,
                   "the delay to pass")  # type: ignore[union-attr]
        transport = SyncTransport(redis_url)
        try:
            assert transport.run(transitions.promote(QueueKeys(queue_name))) == 1
        finally:
            transport.close()
        info = job.info()
    assert info.state is JobState.WAITING and info.ready_at is not None
    assert info.enqueued_at is not None and info.ready_at > info.enqueued_at
    collector = QueueCollector(redis_url)
    try:
        assert oldest(collector) < 1.0  # ready for a moment, added over a second ago
    finally:
        collector.close()
