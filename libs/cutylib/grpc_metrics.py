"""Rate, errors and duration of every gRPC method a server handles, in Prometheus format.

OpenTelemetry's RPC semantic conventions, translated to Prometheus names:
`rpc_server_call_duration_seconds{rpc_system="grpc", rpc_service, rpc_method,
rpc_response_status_code}`; its `_count` is the request count by method and status code, so
rate and errors need no counter of their own. The status is the code's name (`OK`,
`ALREADY_EXISTS`...), as the newer conventions spell it.

The interceptor is the outermost one (GrpcServer puts it first), so it sees the status the
client sees, after domain errors were mapped (TrustAndErrorInterceptor).

Interceptors run for every call; both of cutylib's wrap a method's handler once (`WrappedHandlers`)
and read the call's metadata from its context, instead of building closures and a new handler
per call.
"""
from __future__ import annotations

import asyncio
import inspect
import time

import grpc
from opentelemetry import trace
from prometheus_client import REGISTRY, Histogram

from .metrics import DURATION_BUCKETS

RPC_DURATION = Histogram(
    "rpc_server_call_duration_seconds", "Duration of gRPC calls handled, by method and status code",
    ("rpc_system", "rpc_service", "rpc_method", "rpc_response_status_code"),
    buckets=DURATION_BUCKETS, registry=REGISTRY)

# The reflection service streams for as long as a client browses: its duration means nothing.
_SKIPPED = ("grpc.reflection.",)


def _code_name(context) -> str:
    code = context.code()
    if code is None:
        return "OK"
    if isinstance(code, grpc.StatusCode):
        return code.name
    for c in grpc.StatusCode:  # a bare integer on some grpcio versions
        if c.value[0] == code:
            return c.name
    return "UNKNOWN"


def _trace_id(metadata) -> str | None:
    """The trace this call belongs to: the current span's (OpenTelemetry's interceptor runs
    outside this one when spans are exported), else the caller's traceparent."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        return format(ctx.trace_id, "032x")
    for k, v in metadata or ():
        if k == "traceparent":
            v = v.decode() if isinstance(v, bytes) else v
            return v[3:35] if len(v) >= 55 else None
    return None


class WrappedHandlers:
    """method -> (the handler as found, its wrapped handler): a method's handler is wrapped once
    and reused while the server finds the same handler for it (always, for registered services)."""

    def __init__(self, wrap):
        self._wrap = wrap  # (method, handler) -> wrapped handler
        self._by_method: dict[str, tuple[object, object]] = {}

    def get(self, method: str, handler):
        hit = self._by_method.get(method)
        if hit is not None and hit[0] is handler:
            return hit[1]
        wrapped = self._wrap(method, handler)
        self._by_method[method] = (handler, wrapped)
        return wrapped


class GrpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, histogram: Histogram = RPC_DURATION):
        self.histogram = histogram
        self._children: dict[tuple[str, str], object] = {}
        self._handlers = WrappedHandlers(self._wrap)

    def _observe(self, method: str, code: str, seconds: float, metadata) -> None:
        child = self._children.get((method, code))
        if child is None:
            service, _, name = method[1:].rpartition("/")
            child = self._children[(method, code)] = self.histogram.labels("grpc", service, name, code)
        trace_id = _trace_id(metadata)
        child.observe(seconds, {"trace_id": trace_id} if trace_id else None)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_SKIPPED, 1):
            return handler
        return self._handlers.get(method, handler)

    def _wrap(self, method: str, handler):
        observe = self._observe

        def wrap_unary(behavior):
            async def wrapped(request_or_iterator, context):
                t0 = time.perf_counter()
                code = None
                try:
                    return await behavior(request_or_iterator, context)
                except asyncio.CancelledError:
                    code = "CANCELLED"
                    raise
                finally:
                    observe(method, code or _code_name(context), time.perf_counter() - t0,
                            context.invocation_metadata())
            return wrapped

        def wrap_stream(behavior):
            async def wrapped(request_or_iterator, context):
                t0 = time.perf_counter()
                code = None
                try:
                    async for item in stream_of(behavior(request_or_iterator, context)):
                        yield item
                except (asyncio.CancelledError, GeneratorExit):
                    code = "CANCELLED"
                    raise
                finally:
                    observe(method, code or _code_name(context), time.perf_counter() - t0,
                            context.invocation_metadata())
            return wrapped

        return rewrap(handler, wrap_unary, wrap_stream)


# (handler attribute, its factory, whether it answers with a stream)
_KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler, False),
          ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
          ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
          ("stream_stream", grpc.stream_stream_rpc_method_handler, True))


async def stream_of(result):
    """A streaming behaviour's answers: it is an async generator, or a coroutine that writes them."""
    if inspect.isasyncgen(result):
        async for item in result:
            yield item
    else:
        await result


def rewrap(handler, wrap_unary, wrap_stream):
    """`handler` with its behaviour wrapped: `wrap_unary` for single answers, `wrap_stream` for
    streamed ones (an async generator)."""
    for attr, factory, streams in _KINDS:
        behavior = getattr(handler, attr)
        if behavior:
            wrapped = (wrap_stream if streams else wrap_unary)(behavior)
            return factory(wrapped, handler.request_deserializer, handler.response_serializer)
    return handler
