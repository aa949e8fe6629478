"""OpenTelemetry traces: the producer's context travels with the job, and a real worker
process runs each attempt in a CONSUMER span that is its child (see docs/observability.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from panqueue import Backoff, JobState, QueueClient, SyncQueueClient
from panqueue._store.ops.add import TRACE_OPTION
from tests.helpers import APPS, WorkerProcess, subprocess_env, wait_until
from tests.test_cli import FAIL


@pytest.fixture
def producer() -> tuple[trace.Tracer, InMemorySpanExporter]:
    """A tracer of the test's own (no global provider is set in the test process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("producer"), exporter


class TracedWorker:
    """A worker child process exporting its spans as JSON lines to a file."""

    def __init__(self, url: str, queue: str, path: Path) -> None:
        self.path = path
        self.proc = subprocess.Popen(
            [sys.executable, str(APPS / "trace_app.py"), url, queue, str(path)],
            env=subprocess_env(PANQUEUE_URL=url), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)

    def spans(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def attempt_spans(self, job_id: str, n: int = 1) -> list[dict[str, Any]]:
        def found() -> bool:
            return len(self._of(job_id)) >= n
        wait_until(found, timeout=20, what=f"{n} attempt span(s) of job {job_id}")
        return sorted(self._of(job_id), key=lambda s: s["attributes"]["panqueue.attempt"])

    def _of(self, job_id: str) -> list[dict[str, Any]]:
        return [s for s in self.spans()
                if s["attributes"].get("messaging.message.id") == job_id]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def worker(redis_url: str, queue_name: str, tmp_path: Path) -> Iterator[TracedWorker]:
    traced = TracedWorker(redis_url, queue_name, tmp_path / "spans.jsonl")
    try:
        yield traced
    finally:
        traced.stop()


def _hex(span: Any) -> tuple[str, str]:
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def _assert_child_of(span: dict[str, Any], parent: Any, queue: str, job_id: str,
                     attempt: int = 1) -> None:
    trace_id, span_id = _hex(parent)
    assert span["trace_id"] == trace_id
    assert span["parent_span_id"] == span_id
    assert span["parent_remote"] is True
    assert span["name"] == f"process {queue}"
    assert span["kind"] == "CONSUMER"
    attributes = span["attributes"]
    assert attributes["messaging.system"] == "panqueue"
    assert attributes["messaging.destination.name"] == queue
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.message.id"] == job_id
    assert attributes["panqueue.attempt"] == attempt


def test_a_worker_span_is_the_child_of_the_producer_span_sync_add(
        redis_url: str, queue_name: str, worker: TracedWorker,
        producer: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    tracer, exported = producer
    with SyncQueueClient(redis_url) as client:
        with tracer.start_as_current_span("send") as send:
            handle = client.queue(queue_name).add({"n": 1})
        with tracer.start_as_current_span("send bulk") as send_bulk:
            bulk = client.queue(queue_name).add_bulk([{"n": 2}, {"n": 3}])
        assert handle.result(timeout=20) == "ok"
        assert [h.result(timeout=20) for h in bulk] == ["ok", "ok"]
    [span] = worker.attempt_spans(handle.id)
    _assert_child_of(span, send, queue_name, handle.id)
    for h in bulk:
        [bulk_span] = worker.attempt_spans(h.id)
        _assert_child_of(bulk_span, send_bulk, queue_name, h.id)
    assert span["status"] == "UNSET"
    assert span["attributes"]["panqueue.outcome"] == "completed"
    assert [s.name for s in exported.get_finished_spans()] == ["send", "send bulk"]
    # A span made inside the handler is a child of the attempt's span.
    [inner] = [s for s in worker.spans() if s["name"] == "inside handler"
               and s["parent_span_id"] == span["span_id"]]
    assert inner["trace_id"] == span["trace_id"]


def test_a_failing_attempt_records_the_exception_and_sets_error_status(
        redis_url: str, queue_name: str, worker: TracedWorker,
        producer: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    tracer, _ = producer
    with SyncQueueClient(redis_url) as client:
        with tracer.start_as_current_span("send") as send:
            handle = client.queue(queue_name).add({"fail": True})
        wait_until(lambda: handle.info().state is JobState.FAILED, timeout=20,
                   what="the job to fail")
    [span] = worker.attempt_spans(handle.id)
    _assert_child_of(span, send, queue_name, handle.id)
    assert span["status"] == "ERROR"
    assert "ValueError" in span["status_description"]
    assert span["attributes"]["error.type"] == "ValueError"
    assert span["attributes"]["panqueue.outcome"] == "failed"
    [event] = [e for e in span["events"] if e["name"] == "exception"]
    assert event["attributes"]["exception.type"] == "ValueError"
    assert "asked to fail" in event["attributes"]["exception.message"]
    assert "Traceback" in event["attributes"]["exception.stacktrace"]


def test_retried_attempts_are_siblings_under_the_producer_span_each_linked_to_the_last(
        redis_url: str, queue_name: str, worker: TracedWorker,
        producer: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    tracer, _ = producer
    with SyncQueueClient(redis_url) as client:
        with tracer.start_as_current_span("send") as send:
            handle = client.queue(queue_name).add(
                {"fail_attempts": 2}, attempts=3, backoff=Backoff("fixed", 0.01))
        assert handle.result(timeout=20) == "ok"
        stored = handle.info().options[TRACE_OPTION]
    first, second, third = worker.attempt_spans(handle.id, 3)
    for n, span in enumerate((first, second, third), 1):
        _assert_child_of(span, send, queue_name, handle.id, attempt=n)
    assert first["status"] == second["status"] == "ERROR"
    assert [first["attributes"]["panqueue.outcome"], second["attributes"]["panqueue.outcome"],
            third["attributes"]["panqueue.outcome"]] == ["failed", "failed", "completed"]
    assert third["status"] == "UNSET"
    # Attempt N+1 links to attempt N (and the first links to nothing).
    assert first["links"] == []
    assert second["links"] == [{"trace_id": first["trace_id"], "span_id": first["span_id"]}]
    assert third["links"] == [{"trace_id": second["trace_id"], "span_id": second["span_id"]}]
    # What the job keeps: the producer's context, and the last failed attempt's.
    assert stored["traceparent"].split("-")[1:3] == list(_hex(send))
    assert stored["link"].split("-")[:3] == ["00", second["trace_id"], second["span_id"]]


def test_a_job_without_a_producer_span_still_links_its_retries(
        redis_url: str, queue_name: str, worker: TracedWorker) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue(queue_name).add({"fail_attempts": 1}, attempts=2,
                                              backoff=Backoff("fixed", 0.01))
        assert handle.result(timeout=20) == "ok"
    first, second = worker.attempt_spans(handle.id, 2)
    assert first["parent_span_id"] is None and second["parent_span_id"] is None
    assert second["trace_id"] != first["trace_id"]  # two roots, told apart, and linked
    assert second["links"] == [{"trace_id": first["trace_id"], "span_id": first["span_id"]}]


def test_an_untraced_worker_writes_nothing_back_on_failure(
        redis_url: str, start_worker: Callable[..., WorkerProcess],
        producer: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    """A worker without a tracer provider keeps the zero-cost path: the fail transition gets
    no options, and the job's stored trace headers stay the producer's."""
    tracer, _ = producer
    worker = start_worker("--url", redis_url, "-q", FAIL)
    with SyncQueueClient(redis_url) as client:
        with tracer.start_as_current_span("send"):
            handle = client.queue(FAIL).add({"n": 1}, job_id=f"untraced-{uuid.uuid4().hex}")
        before = handle.info().options
        wait_until(lambda: handle.info().state is JobState.FAILED, timeout=20,
                   what="the job to fail")
        assert handle.info().options == before
        assert set(before[TRACE_OPTION]) == {"traceparent"}
    assert worker.stop() == 0


@pytest.mark.anyio
async def test_async_add_and_add_bulk_carry_the_context_and_tracestate(
        redis_url: str, queue_name: str, worker: TracedWorker,
        producer: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    tracer, _ = producer
    # A remote parent with a tracestate: the tracestate travels too.
    remote = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("vendor", "v1")]))
    parent = trace.set_span_in_context(NonRecordingSpan(remote))
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        with tracer.start_as_current_span("send", context=parent) as send:
            one = await queue.add({"n": 1})
            bulk = await queue.add_bulk([{"n": 2}, {"n": 3}])
        stored = (await client.get_job(queue_name, one.id)).options[TRACE_OPTION]
        assert stored["traceparent"] == f"00-{0x1234:032x}-{_hex(send)[1]}-01"
        assert stored["tracestate"] == "vendor=v1"
        for handle in (one, *bulk):
            assert await handle.result(timeout=20) == "ok"
    for handle in (one, *bulk):
        [span] = worker.attempt_spans(handle.id)
        _assert_child_of(span, send, queue_name, handle.id)
        assert span["trace_state"] == "vendor=v1"


def test_without_an_active_span_nothing_is_stored_and_the_attempt_span_is_a_root(
        redis_url: str, queue_name: str, worker: TracedWorker) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue(queue_name).add({"n": 1}, job_id=f"plain-{uuid.uuid4().hex}")
        assert TRACE_OPTION not in handle.info().options
        assert handle.result(timeout=20) == "ok"
    [span] = worker.attempt_spans(handle.id)
    assert span["parent_span_id"] is None
    assert span["attributes"]["messaging.destination.name"] == queue_name


def test_an_add_under_a_span_carries_it_between_plain_adds_of_the_same_handle(
        redis_url: str, queue_name: str, worker: TracedWorker,
        producer: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    """A handle's add(data) with no option reuses the job it validated at its first such add,
    but not while a span is current: that add carries the span, and the ones around it
    nothing."""
    tracer, _ = producer
    with SyncQueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        before = queue.add({"n": 0})
        with tracer.start_as_current_span("send") as send:
            traced = queue.add({"n": 1})
        after = queue.add({"n": 2})
        assert [h.result(timeout=20) for h in (before, traced, after)] == ["ok"] * 3
        assert TRACE_OPTION not in after.info().options
    [span] = worker.attempt_spans(traced.id)
    _assert_child_of(span, send, queue_name, traced.id)
    for handle in (before, after):
        [root] = worker.attempt_spans(handle.id)
        assert root["parent_span_id"] is None


def test_without_opentelemetry_tracing_is_off_and_adds_work() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from panqueue import _tracing\n"
        "from panqueue._store.ops import new_job\n"
        "assert not _tracing.enabled()\n"
        "assert _tracing.current_carrier() is None\n"
        "assert new_job({}, {'n': 1}, {}).options == b''\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=subprocess_env(), timeout=60)
    assert done.returncode == 0, done.stderr


def test_attempts_are_traced_only_once_the_application_sets_a_tracer_provider() -> None:
    """With the API installed but no SDK configured every span would record nothing: the worker
    then makes none (no cost on the hot path)."""
    import subprocess
    import sys

    code = ("from opentelemetry import trace\n"
            "from opentelemetry.sdk.trace import TracerProvider\n"
            "from panqueue import _tracing\n"
            "before = _tracing.enabled()\n"
            "trace.set_tracer_provider(TracerProvider())\n"
            "print(before, _tracing.enabled())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["False", "True"]
