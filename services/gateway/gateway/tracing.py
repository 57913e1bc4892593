"""A server span per HTTP request, starting our trace and linking the caller's W3C trace.

The incoming `traceparent` becomes a link of the span (`baggage` is ignored), the span is made
current, and `inject` writes it into the metadata of the backend call, so one trace runs
gateway -> orchestrator -> booking/codepool. The
gateway injects explicitly instead of installing the grpc.aio client interceptor: the same
propagation without a Python interceptor (and a client span) on every call's hot path. The
answer's `traceparent` names this span, so a support engineer can find the trace of any response.
"""
from __future__ import annotations

import contextlib

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanKind

from cutylib import telemetry

_tracer = trace.get_tracer("cuty.gateway")
_TRACE_CONTEXT = TraceContextTextMapPropagator()
_ROOT = Context()  # no parent, no baggage


class _Headers:
    """Getter over ASGI's raw header list for the propagator (names are lower-case bytes)."""

    @staticmethod
    def get(carrier: dict, key: str):
        v = carrier.get(key.lower())
        return [v] if v is not None else None

    @staticmethod
    def keys(carrier: dict):
        return list(carrier)


def start_server_span(name: str, headers: dict[str, str]):
    """A context manager for the request's span; `headers` are lower-cased str -> str.

    The span starts a trace of its own: a client's `traceparent` is a link, never the parent (a
    client would otherwise put its spans into our traces and choose, by its sampled flag, which
    requests we record), and its `baggage` is not read at all, so it never travels to a service."""
    links = None
    if "traceparent" in headers:
        remote = trace.get_current_span(_TRACE_CONTEXT.extract(headers, getter=_Headers)).get_span_context()
        if remote.is_valid:
            links = [trace.Link(remote)]
    return telemetry.current_span(_tracer, name, context=_ROOT, kind=SpanKind.SERVER, links=links)


def passive_span(headers: dict[str, str]):
    """A context manager yielding a span that records nothing (a health probe starts no trace):
    the caller's when it sent a traceparent, else fresh ids, unsampled, so every answer still
    names a trace id."""
    span = trace.get_current_span(propagate.extract(headers, getter=_Headers))
    if not span.get_span_context().is_valid:
        span = trace.NonRecordingSpan(trace.SpanContext(
            _ids.generate_trace_id(), _ids.generate_span_id(), is_remote=False, trace_flags=trace.TraceFlags(0)))
    return contextlib.nullcontext(span)


_ids = RandomIdGenerator()


def inject() -> list[tuple[str, str]]:
    """The current context as gRPC metadata pairs (traceparent, tracestate)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return list(carrier.items())


def traceparent(span) -> tuple[str, str]:
    """(traceparent, trace id) for the response headers."""
    sc = span.get_span_context()
    if not sc.is_valid:
        return "", ""
    trace_id = format(sc.trace_id, "032x")
    return f"00-{trace_id}-{format(sc.span_id, '016x')}-{int(sc.trace_flags):02x}", trace_id
