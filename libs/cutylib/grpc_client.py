"""Client channels: mutual TLS as this process's identity, default deadlines, the user forwarded."""
from __future__ import annotations

import grpc

from . import principal, telemetry
from .identity import ASSERTION_KEY
from .tls import Transport


class _Defaults(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.StreamUnaryClientInterceptor):
    """Give every call a deadline and forward the current user's signed assertion, unchanged.

    Work done as `system` (the saga) forwards no user: the callee then sees only this service."""

    def __init__(self, deadline: float, transport: Transport):
        self.deadline = deadline
        self.declared = transport.metadata()

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        timeout = d.timeout if d.timeout is not None else self.deadline
        md = grpc.aio.Metadata(*(d.metadata or ()), *self.declared)
        p = principal.current()
        if p.assertion and ASSERTION_KEY not in md:
            md.add(ASSERTION_KEY, p.assertion)
        if telemetry.propagating_by_hand() and "traceparent" not in md:
            for k, v in telemetry.inject_metadata():
                md.add(k, v)
        return grpc.aio.ClientCallDetails(d.method, timeout, md, d.credentials, d.wait_for_ready)

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)

    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


def create_channel(addr: str, target: str, transport: Transport, *, deadline_seconds: float = 5.0,
                   options: list[tuple] | None = None) -> grpc.aio.Channel:
    """A channel to the service named `target` at `addr`, as `transport`'s identity, whose calls
    default to `deadline_seconds`."""
    return transport.channel(
        addr, target,
        interceptors=[_Defaults(deadline_seconds, transport)],
        options=[("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.enable_retries", 0),
                 *(options or [])],
    )
