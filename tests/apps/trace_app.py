"""A traced worker process for tests/test_tracing.py.

``python tests/apps/trace_app.py URL QUEUE SPANS_FILE`` sets up the OpenTelemetry SDK with an
exporter that appends each finished span to SPANS_FILE as one JSON line, then runs a Worker
on QUEUE until it is killed. A job whose data has ``"fail": true`` raises ``ValueError``, and
so does each of its first N attempts with ``"fail_attempts": N``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from panqueue import Job, Registry, Worker


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                ctx = span.get_span_context()
                assert ctx is not None
                out.write(json.dumps({
                    "name": span.name,
                    "kind": span.kind.name,
                    "trace_id": format(ctx.trace_id, "032x"),
                    "span_id": format(ctx.span_id, "016x"),
                    "parent_span_id": format(span.parent.span_id, "016x") if span.parent
                    else None,
                    "parent_remote": span.parent.is_remote if span.parent else None,
                    "trace_state": ctx.trace_state.to_header(),
                    "attributes": dict(span.attributes or {}),
                    "status": span.status.status_code.name,
                    "status_description": span.status.description,
                    "events": [{"name": e.name, "attributes": dict(e.attributes or {})}
                               for e in span.events],
                    "links": [{"trace_id": format(link.context.trace_id, "032x"),
                               "span_id": format(link.context.span_id, "016x")}
                              for link in span.links],
                }) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


async def traced(job: Job) -> str:
    # A span the handler makes is a child of the attempt's span.
    with trace.get_tracer("trace_app").start_as_current_span("inside handler"):
        pass
    if isinstance(job.data, dict) and (job.data.get("fail")
                                       or job.attempt <= job.data.get("fail_attempts", 0)):
        raise ValueError(f"job {job.id} was asked to fail")
    return "ok"


def main(argv: list[str]) -> None:
    url, queue, path = argv
    queues = Registry()
    queues.handler(queue, attempts=1)(traced)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)

    async def run() -> Any:
        await Worker(queues, queue, url=url, summary_interval=None).run()

    anyio.run(run)


if __name__ == "__main__":
    main(sys.argv[1:])
