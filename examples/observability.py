"""Observability: a worker's Prometheus counters, the queue exporter's gauges, and the
OpenTelemetry spans of a job that fails twice before it completes.

    pip install 'panqueue[metrics,otel]' opentelemetry-sdk
    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/observability.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
The worker runs in this process, so one tracer provider sees the producer's span and the
worker's. In production, `panqueue worker --metrics-port 9809` and `panqueue metrics` serve the
same two endpoints (see docs/observability.md).
"""

from __future__ import annotations

import urllib.request

import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from panqueue import Backoff, Job, QueueClient, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server
from panqueue.metrics import WorkerMetrics, serve, serve_queues

queues = Registry()


@queues.handler("reports", attempts=3, backoff=Backoff.fixed(0.01))
async def build_report(job: Job) -> dict[str, int]:
    if job.attempt < 3:
        raise ConnectionError(f"storage not ready (attempt {job.attempt})")
    return {"pages": 3}


def scrape(port: int, *prefixes: str) -> list[str]:
    """The sample lines of http://127.0.0.1:port/metrics that start with one of ``prefixes``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return [line for line in text.splitlines() if line.startswith(prefixes)]


async def main(url: str) -> None:
    # The application configures the SDK; panqueue only uses the API.
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("example")

    # Port 0: any free port (the worker's endpoint, like `panqueue worker --metrics-port`).
    metrics = WorkerMetrics()
    worker_endpoint = serve(metrics.registry, 0)
    worker_port = worker_endpoint.server_address[1]
    worker = Worker(queues, "reports", url=url, metrics=metrics, summary_interval=None)
    async with anyio.create_task_group() as tg, QueueClient(url) as client:
        await client.purge("reports")  # start from an empty queue, for exact gauges below
        await tg.start(worker.run)
        with tracer.start_as_current_span("request /reports") as request:
            handle = await client.queue("reports").add({"month": "2026-10"})
        print(f"result: {await handle.result(timeout=10)}")
        await worker.shutdown()

    print("worker counters:")
    for line in await anyio.to_thread.run_sync(
            scrape, worker_port, 'panqueue_jobs_completed_total{queue="reports"}',
            'panqueue_jobs_retried_total{queue="reports"}',
            'panqueue_job_run_seconds_count{queue="reports"}'):
        print(f"  {line}")
    worker_endpoint.shutdown()

    # The cluster exporter (`panqueue metrics`): gauges read from Redis at each scrape.
    exporter, collector = serve_queues(url, 0)
    try:
        print("queue gauges:")
        for line in await anyio.to_thread.run_sync(
                scrape, exporter.server_address[1],
                'panqueue_jobs{queue="reports",state="completed"}',
                'panqueue_queue_lag_seconds{queue="reports"}'):
            print(f"  {line}")
    finally:
        exporter.shutdown()
        collector.close()

    # Three attempt spans, children of the request's span; each retry links the attempt before.
    attempt_of: dict[int, int] = {}  # span id -> attempt number
    for span in spans.get_finished_spans():
        if span.name == "process reports" and span.context and span.attributes:
            attempt_of[span.context.span_id] = int(str(span.attributes["panqueue.attempt"]))
    parent_id = request.get_span_context().span_id
    for span in sorted((s for s in spans.get_finished_spans() if s.name == "process reports"),
                       key=lambda s: attempt_of[s.context.span_id if s.context else 0]):
        assert span.context is not None and span.attributes is not None
        links = [attempt_of[link.context.span_id] for link in span.links]
        child = span.parent is not None and span.parent.span_id == parent_id
        print(f"span 'process reports' attempt {attempt_of[span.context.span_id]}: "
              f"{span.attributes['panqueue.outcome']!s}, child of the request: {child}, "
              f"links to attempt(s) {links}")

if __name__ == "__main__":
    configure_logging(level="error")  # the two failed attempts are expected
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
