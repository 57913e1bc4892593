"""telemetry.current_span without an exporter gives what the SDK's start_as_current_span gives
when its sampler drops every span: the same trace id, tracestate and flags, a fresh span id,
current within the block and only there."""
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from cutylib import telemetry

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def unsampled(monkeypatch):
    provider = TracerProvider(sampler=ALWAYS_OFF, shutdown_on_exit=False)
    monkeypatch.setattr(telemetry, "_unsampled", provider)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    return provider


def _ids(span):
    sc = span.get_span_context()
    return sc.trace_id, sc.span_id, int(sc.trace_flags), sc.trace_state.to_header(), sc.is_valid, span.is_recording()


@pytest.mark.parametrize("carrier", [
    {},
    {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
    {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-00", "tracestate": "vendor=a,other=b"},
    {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-03"},
    {"traceparent": "00-garbage"},
], ids=["no-caller", "sampled-caller", "tracestate", "random-flag", "invalid-traceparent"])
def test_same_span_context_as_the_sdk(unsampled, carrier):
    ctx = propagate.extract(carrier) if carrier else None
    sdk = unsampled.get_tracer("t")
    with sdk.start_as_current_span("rpc", context=ctx, kind=trace.SpanKind.SERVER) as want:
        want_current = trace.get_current_span() is want
    with telemetry.current_span(sdk, "rpc", context=ctx, kind=trace.SpanKind.SERVER) as got:
        assert trace.get_current_span() is got and want_current
        assert telemetry.current_trace_id() == format(got.get_span_context().trace_id, "032x")
    w, g = _ids(want), _ids(got)
    assert (w[2], w[3], w[4], w[5]) == (g[2], g[3], g[4], g[5])
    assert not w[5] and w[4] and not trace.TraceFlags(g[2]).sampled
    if carrier.get("traceparent", "").startswith(f"00-{TRACE_ID}"):
        assert w[0] == g[0] == int(TRACE_ID, 16)
    else:
        assert w[0] != g[0]  # each a new trace
    assert g[1] != int("00f067aa0ba902b7", 16) and g[1] != w[1]  # a span of its own
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left current


def test_the_enclosing_span_is_the_parent_without_a_caller(unsampled):
    sdk = unsampled.get_tracer("t")
    with telemetry.current_span(sdk, "outer") as outer:
        with telemetry.current_span(sdk, "inner") as inner:
            assert inner.get_span_context().trace_id == outer.get_span_context().trace_id
            assert inner.get_span_context().span_id != outer.get_span_context().span_id
        assert trace.get_current_span() is outer


def test_an_exception_leaves_the_block_and_the_context(unsampled):
    sdk = unsampled.get_tracer("t")
    with pytest.raises(ValueError):
        with telemetry.current_span(sdk, "rpc"):
            raise ValueError("x")
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_the_sdk_decides_when_another_provider_is_installed(monkeypatch):
    recording = TracerProvider(shutdown_on_exit=False)
    monkeypatch.setattr(telemetry, "_unsampled", TracerProvider(sampler=ALWAYS_OFF, shutdown_on_exit=False))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: recording)
    with telemetry.current_span(recording.get_tracer("t"), "rpc") as span:
        assert span.is_recording()
