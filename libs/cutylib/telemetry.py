"""OpenTelemetry bootstrap and JSON logs that carry trace and span ids."""
from __future__ import annotations

import json
import logging
import os
import sys
import time

from opentelemetry import context as context_api
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

_initialised = False
# The provider init_telemetry installed when no span can ever be recorded (no exporter: sampler
# ALWAYS_OFF, SDK enabled); None otherwise. See current_span.
_unsampled: TracerProvider | None = None
# True when gRPC trace context is propagated by our own interceptors instead of OpenTelemetry's
# instrumentation (see init_telemetry).
_by_hand = False

_STD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, trace/span ids and `extra` fields."""

    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            out["trace_id"] = format(ctx.trace_id, "032x")
            out["span_id"] = format(ctx.span_id, "016x")
        for k, v in record.__dict__.items():
            if k not in _STD_ATTRS and not k.startswith("_"):
                out[k] = v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(service: str, level: str | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or os.environ.get("CUTY_LOG_LEVEL", "INFO"))
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def init_telemetry(service: str, *, instrument_grpc: bool = True, instrument_asyncpg: bool = True) -> TracerProvider:
    """Tracer provider for `service`; OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set.

    Instrumentation patches grpc.aio and asyncpg, so call this before creating servers, channels or pools.
    """
    global _initialised
    setup_logging(service)
    if _initialised:
        return trace.get_tracer_provider()  # type: ignore[return-value]
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    # With nowhere to send spans, recording them is pure cost (10-30% of a HoldSlot's CPU). An
    # unsampled span still gets real trace and span ids, so logs, the payment timeline and the
    # traceparent headers keep working.
    # With an exporter the SDK's own choice stands (OTEL_TRACES_SAMPLER, default parent-based always-on).
    kwargs = {} if endpoint else {"sampler": ALWAYS_OFF}
    name = os.environ.get("OTEL_SERVICE_NAME") or f"cuty-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}), **kwargs)
    if endpoint:
        provider.add_span_processor(BatchSpanProcessor(_exporter(endpoint)))
    trace.set_tracer_provider(provider)
    global _unsampled
    disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    _unsampled = provider if provider.sampler is ALWAYS_OFF and not disabled else None
    global _by_hand
    if instrument_grpc and endpoint:
        from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, GrpcAioInstrumentorServer
        from opentelemetry.instrumentation.grpc import filters

        # Health checks and reflection start no trace: probes every few seconds would bury the real ones.
        quiet = filters.negate(filters.any_of(filters.health_check(), filters.service_prefix("grpc.reflection")))
        GrpcAioInstrumentorServer(filter_=quiet).instrument(skip_dep_check=True)
        GrpcAioInstrumentorClient(filter_=quiet).instrument(skip_dep_check=True)
    elif instrument_grpc:
        # Nothing exports spans: OpenTelemetry's gRPC interceptors would cost up to 40% of a cheap
        # RPC's CPU (measured with bench/booking.py) for spans nobody sees. cutylib's server
        # interceptor and client channels carry `traceparent` themselves, so trace ids still run
        # gateway -> orchestrator -> booking/codepool into logs and the payment timeline.
        _by_hand = True
    # A span per SQL statement is worth its cost (~0.3 ms a request here) only when someone can
    # look at it; trace ids in logs and the payment timeline come from the gRPC spans.
    if instrument_asyncpg and endpoint:
        from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

        AsyncPGInstrumentor().instrument(skip_dep_check=True)
    _initialised = True
    return provider


def _exporter(endpoint: str):
    """The OTLP span exporter OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL names: grpc (default) or
    http/protobuf; each reads the rest of the standard OTEL_EXPORTER_OTLP_* variables itself."""
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc").strip().lower()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()  # OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces
    if protocol != "grpc":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL must be grpc or http/protobuf, got {protocol!r}")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))


def current_trace_id() -> str:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


def set_span_attributes(**attrs: str) -> None:
    """Tag the current span: `checkout_id=...` -> `cuty.checkout.id` (also payment, hold, order)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    for k, v in attrs.items():
        if v:
            span.set_attribute("cuty." + k.replace("_", "."), v)


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span (None without a valid one): stored with a saga so
    its later steps continue the trace that created it."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


def context_of(traceparent: str | None):
    """An OpenTelemetry context whose parent is `traceparent` (None when there is none)."""
    return propagate.extract({"traceparent": traceparent}) if traceparent else None


def link_to(traceparent: str | None) -> list[trace.Link]:
    """A span link to `traceparent`'s span, for work caused by it but not part of its request."""
    sc = trace.get_current_span(context_of(traceparent)).get_span_context() if traceparent else None
    return [trace.Link(sc)] if sc is not None and sc.is_valid else []


def record_background(name: str, start_ns: int, **attributes) -> None:
    """A span for background work that turned out to change something (it ran under quiet()),
    from `start_ns` (time.time_ns()) to now: the change is traced, idle rounds are not."""
    span = _background_tracer.start_span(name, start_time=start_ns, attributes=attributes)
    span.end()


_background_tracer = trace.get_tracer("cuty.background")


def quiet():
    """A context in which instrumentation starts no span: a background loop's polling query
    (claim due work, sweep) must not make a trace of its own when it finds nothing to do."""
    from opentelemetry.instrumentation.utils import suppress_instrumentation

    return suppress_instrumentation()


def untraced_call_metadata() -> tuple[tuple[str, str], ...]:
    """gRPC metadata asking the callee not to trace this call: a W3C traceparent with the sampled
    flag off. For a background loop that polls another service (the stock.low relay): quiet() only
    silences this process, and the callee would otherwise start a trace of its own every round; its
    parent-based sampler records nothing under an unsampled parent."""
    return (("traceparent", f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-00"),)


_tracer = trace.get_tracer("cuty.grpc")


def propagating_by_hand() -> bool:
    return _by_hand


def server_span(method: str, metadata) -> "trace.Span":
    """A SERVER span continuing the caller's `traceparent` from gRPC metadata (a context manager)."""
    carrier = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in (metadata or ())
               if k in ("traceparent", "tracestate")}
    ctx = propagate.extract(carrier) if carrier else None
    return current_span(_tracer, method, context=ctx, kind=trace.SpanKind.SERVER,
                        record_exception=False, set_status_on_exception=False)


def current_span(tracer: trace.Tracer, name: str, *, context=None, kind=trace.SpanKind.INTERNAL, **options):
    """`tracer.start_as_current_span(name, context=context, kind=kind, **options)`, the same span
    context made current, built directly when init_telemetry's provider records nothing.

    Without an exporter every span is dropped (ALWAYS_OFF), and the SDK then returns a
    NonRecordingSpan that only carries ids: the caller's trace id (or a new one), a new span id,
    the caller's tracestate, trace flags "not sampled" (with the random-trace-id flag as the SDK
    sets it). Going through the SDK for that (proxy tracer, sampler, attributes, two
    context-manager layers) was ~20 µs of every RPC a server handled, the largest share of its
    interceptors (docs/benchmarks.md, "The checkout redesign, part 2"). With an exporter, another provider
    installed first (tests), or OTEL_SDK_DISABLED, the SDK decides as before."""
    if _unsampled is None or trace.get_tracer_provider() is not _unsampled:
        return tracer.start_as_current_span(name, context=context, kind=kind, **options)
    parent = trace.get_current_span(context).get_span_context()
    ids = _unsampled.id_generator
    if parent.is_valid:
        trace_id, state, random_id = parent.trace_id, parent.trace_state, parent.trace_flags.random_trace_id
    else:
        trace_id, state, random_id = ids.generate_trace_id(), None, ids.is_trace_id_random()
    flags = trace.TraceFlags.RANDOM_TRACE_ID if random_id else trace.TraceFlags.DEFAULT
    return _Current(trace.NonRecordingSpan(trace.SpanContext(
        trace_id, ids.generate_span_id(), is_remote=False, trace_flags=trace.TraceFlags(flags), trace_state=state)))


class _Current:
    """`trace.use_span` for a span that records nothing: current within the block, in the context
    current when the block starts (as start_as_current_span attaches it)."""

    __slots__ = ("span", "_token")

    def __init__(self, span: trace.Span):
        self.span = span
        self._token = None

    def __enter__(self) -> trace.Span:
        self._token = context_api.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, *exc) -> bool:
        context_api.detach(self._token)
        return False


def inject_metadata() -> list[tuple[str, str]]:
    """The current trace context as gRPC metadata pairs (traceparent, tracestate)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return list(carrier.items())
