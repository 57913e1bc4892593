"""Client channels with default deadlines and principal propagation."""
from __future__ import annotations

import grpc

from . import principal, telemetry


class _Defaults(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.StreamUnaryClientInterceptor):
    """Give every call a deadline and forward the current caller's principal."""

    def __init__(self, deadline: float):
        self.deadline = deadline

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        timeout = d.timeout if d.timeout is not None else self.deadline
        md = grpc.aio.Metadata(*(d.metadata or ()))
        p = principal.current()
        if p.subject and principal.SUBJECT_KEY not in md:
            for k, v in p.metadata():
                md.add(k, v)
        if telemetry.propagating_by_hand() and "traceparent" not in md:
            for k, v in telemetry.inject_metadata():
                md.add(k, v)
        return grpc.aio.ClientCallDetails(d.method, timeout, md, d.credentials, d.wait_for_ready)

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)

    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


def create_channel(addr: str, *, deadline_seconds: float = 5.0) -> grpc.aio.Channel:
    """An insecure aio channel (in-cluster traffic) whose calls default to `deadline_seconds`."""
    return grpc.aio.insecure_channel(
        addr,
        interceptors=[_Defaults(deadline_seconds)],
        options=[("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.enable_retries", 0)],
    )
