"""A lost database connection answers UNAVAILABLE, however asyncpg reports it.

When a backend is terminated (failover, pg_terminate_backend) while its connection sits idle in the
pool, asyncpg may already have read the FATAL message but not yet the socket's close; the next query
on it then fails with `InternalClientError("cannot switch to state 12; another operation (2) is in
progress")` instead of a connection error, and cutylib.grpc_errors maps that to INTERNAL. It is a lost
connection: the call did nothing and may be retried, so answer UNAVAILABLE. (Found by the
conservation test; the mapping belongs in cutylib.grpc_errors, after which this module can go.)
"""
from __future__ import annotations

import logging

import asyncpg
import grpc

from cutylib.errors import Unavailable

log = logging.getLogger("codepool.grpc")


def _translate(exc: asyncpg.exceptions.InternalClientError) -> Unavailable:
    log.warning("database connection lost mid-call", extra={"error": type(exc).__name__})
    return Unavailable(f"database unavailable: {type(exc).__name__}")


class LostConnectionInterceptor(grpc.aio.ServerInterceptor):
    """Runs inside cutylib's ErrorAndPrincipalInterceptor, which turns the Unavailable into the status."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None

        def wrap(behavior):
            async def wrapped(request_or_iterator, context):
                try:
                    return await behavior(request_or_iterator, context)
                except asyncpg.exceptions.InternalClientError as exc:
                    raise _translate(exc) from exc
            return wrapped

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                wrap(handler.unary_unary), handler.request_deserializer, handler.response_serializer)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                wrap(handler.stream_unary), handler.request_deserializer, handler.response_serializer)
        return handler  # the code pool has no server-streaming methods
