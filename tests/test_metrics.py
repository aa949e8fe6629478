"""Prometheus metrics: ``panqueue worker --metrics-port`` (the worker's counters and histograms)
and ``panqueue metrics`` (queue gauges read from Redis at scrape time), both run as a user runs
them, as child processes, and scraped over HTTP."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from panqueue import JobState, SyncQueueClient
from panqueue.embedded import RedisServer, free_port
from tests.helpers import ROOT, WorkerProcess, panqueue_command, subprocess_env, wait_until
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
