"""OpenTelemetry traces, when ``opentelemetry-api`` is installed (the ``otel`` extra).

A producer's current trace context (W3C ``traceparent``, and ``tracestate`` if any) is stored
with each job it adds while a span is active; the worker runs each attempt in a CONSUMER span
that is a child of that context. An attempt that fails leaves its own context with the job
(``link`` in the stored headers, written by the fail transition), and the next attempt's span
links to it. Without the package, tracing is off: the import is tried once, on first use, and
every call after that returns at once (see docs/observability.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["LINK", "attempt_span", "current_carrier", "enabled", "end_attempt", "traceparent"]

#: The key, among a job's stored trace headers, of the last failed attempt's span context (a W3C
#: ``traceparent`` value); the next attempt's span links to it.
LINK = "link"

_MISSING: Any = object()
# (trace module, propagator, tracer, context module), or None without opentelemetry-api
_api: Any = _MISSING
# The API loads a provider named by this variable on first use.
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _load() -> Any:
    global _api
    try:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        _api = None
    else:
        from panqueue._version import __version__

        _api = (trace, TraceContextTextMapPropagator(),
                trace.get_tracer("panqueue", __version__), context)
    return _api


# Whether a provider was seen set (once set, it stays: the API sets it only once).
_provider_set = False


def enabled() -> bool:
    """Whether attempts are traced: opentelemetry-api is importable and the application has set
    a tracer provider (an SDK). With the API's default provider every span would record nothing,
    so the worker makes none: an installed but unconfigured API costs the hot path one attribute
    read (the API's own lookup reads the environment on every call, too dear for every job)."""
    global _provider_set
    if _provider_set:
        return True
    api = _load() if _api is _MISSING else _api
    if api is None:
        return False
    trace = api[0]
    if getattr(trace, "_TRACER_PROVIDER", _MISSING) is None and not _PROVIDER_FROM_ENV:
        return False  # nothing set yet, and the environment names no provider to load
    _provider_set = not isinstance(trace.get_tracer_provider(),
                                   (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
    return _provider_set


def current_carrier() -> dict[str, str] | None:
    """The current span's context as W3C trace-context headers, or ``None`` when no valid span
    is active (or opentelemetry-api is not installed)."""
    api = _load() if _api is _MISSING else _api
    if api is None:
        return None
    trace, propagator, _, context = api
    # An empty context (no span, no baggage: the common case) needs no further look.
    if not context.get_current() or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    return carrier or None


@contextmanager
def attempt_span(queue: str, job_id: str, attempt: int,
                 carrier: object) -> Iterator[Any]:
    """A CONSUMER span for one attempt of a job, current inside the block, a child of the
    producer's context ``carrier`` (the stored headers; anything else means none), linked to
    the previous attempt's span when the carrier names it (:data:`LINK`)."""
    api = _load() if _api is _MISSING else _api
    trace, propagator, tracer, _ = api
    parent = None
    links = None
    if isinstance(carrier, dict) and all(isinstance(k, str) and isinstance(v, str)
                                         for k, v in carrier.items()):
        parent = propagator.extract(carrier)
        if LINK in carrier:
            previous = trace.get_current_span(
                propagator.extract({"traceparent": carrier[LINK]})).get_span_context()
            if previous.is_valid:
                links = [trace.Link(previous)]
    attributes = {
        "messaging.system": "panqueue",
        "messaging.destination.name": queue,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": job_id,
        "panqueue.attempt": attempt,
    }
    with tracer.start_as_current_span(f"process {queue}", context=parent,
                                      kind=trace.SpanKind.CONSUMER, attributes=attributes,
                                      links=links,
                                      record_exception=True,
                                      set_status_on_exception=True) as span:
        yield span


def traceparent(span: Any) -> str:
    """``span``'s context as a W3C ``traceparent`` value (what :data:`LINK` holds)."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def end_attempt(span: Any, ending: str, error: Any = None) -> None:
    """Mark the attempt's span with how it ended; ``error`` (an ``ErrorInfo``) on failure is
    recorded as the span's exception event and sets its status to ERROR."""
    span.set_attribute("panqueue.outcome", ending)
    if error is None:
        return
    api = _api
    trace = api[0]
    span.set_attribute("error.type", error.type)
    attributes = {"exception.type": error.type, "exception.message": error.message}
    if error.traceback:
        attributes["exception.stacktrace"] = error.traceback
    span.add_event("exception", attributes)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{error.type}: {error.message}"))
