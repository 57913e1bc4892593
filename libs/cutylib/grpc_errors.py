"""One mapping from domain errors to gRPC status (with google.rpc details), and back for clients."""
from __future__ import annotations

import logging

import asyncpg
import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from .errors import DomainError

log = logging.getLogger(__name__)

ERROR_DOMAIN = "cuty.app"
TRANSACTION_CONFLICT = "transaction conflict; retry"
DATABASE_UNAVAILABLE = "database unavailable; retry"
STATEMENT_TIMEOUT = "the request's deadline ran out during a database statement; retry"


def to_status(err: DomainError) -> grpc.Status:
    details = []
    if err.field:
        # A contract violation (cutylib.validation) names every field at fault; others name one.
        pairs = getattr(err, "violations", None) or [(err.field, err.message)]
        details.append(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=f, description=d) for f, d in pairs]))
    if err.reason:
        details.append(error_details_pb2.ErrorInfo(reason=err.reason, domain=ERROR_DOMAIN))
    if err.detail is not None:
        details.append(err.detail)
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    st = status_pb2.Status(code=err.code.value[0], message=err.message, details=packed)
    return rpc_status.to_status(st)


def status_for_exception(exc: BaseException) -> grpc.Status | None:
    """Status for an exception escaping a handler, or None to let grpc handle it."""
    if isinstance(exc, DomainError):
        return to_status(exc)
    # Answers carry stable messages; what the database said goes to the log, with the trace id the
    # client is shown (database text must not reach clients).
    if isinstance(exc, (asyncpg.exceptions.SerializationError, asyncpg.exceptions.DeadlockDetectedError)):
        log.warning("transaction conflict: %s: %s", type(exc).__name__, exc,
                    extra={"error_type": type(exc).__name__, "error": str(exc)})
        return rpc_status.to_status(status_pb2.Status(code=code_pb2.ABORTED, message=TRANSACTION_CONFLICT))
    if isinstance(exc, asyncpg.exceptions.QueryCanceledError):
        # A statement cut off by the statement_timeout a unit of work takes from the request's
        # deadline (db.UnitOfWork); its transaction is rolled back.
        log.warning("statement cancelled", extra={"error_type": type(exc).__name__, "error": str(exc)})
        return rpc_status.to_status(status_pb2.Status(code=code_pb2.DEADLINE_EXCEEDED, message=STATEMENT_TIMEOUT))
    if isinstance(exc, (asyncpg.exceptions.ConnectionDoesNotExistError, asyncpg.exceptions.CannotConnectNowError,
                        asyncpg.exceptions.AdminShutdownError, asyncpg.exceptions.TooManyConnectionsError,
                        asyncpg.exceptions.InterfaceError, asyncpg.exceptions.ConnectionFailureError,
                        # raised when a backend was killed while its connection sat idle in the pool
                        asyncpg.exceptions.InternalClientError,
                        ConnectionError, OSError, TimeoutError)):
        log.warning("database unavailable", extra={"error_type": type(exc).__name__, "error": str(exc)})
        # With a retry hint (google.rpc.RetryInfo; the gateway turns it into Retry-After).
        hint = any_pb2.Any()
        hint.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1)))
        return rpc_status.to_status(status_pb2.Status(code=code_pb2.UNAVAILABLE, details=[hint],
                                                      message=DATABASE_UNAVAILABLE))
    return None


def details_of(err: grpc.aio.AioRpcError | grpc.RpcError) -> list:
    """Unpacked google.rpc.Status details of a client-side error (protobuf Any list)."""
    st = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
    return list(st.details) if st is not None else []


def unpack_detail(err, message_type):
    """The first detail of `message_type` in a client-side RpcError, or None."""
    for a in details_of(err):
        if a.Is(message_type.DESCRIPTOR):
            m = message_type()
            a.Unpack(m)
            return m
    return None


def error_reason(err) -> str:
    info = unpack_detail(err, error_details_pb2.ErrorInfo)
    return info.reason if info else ""


def bad_field(err) -> str:
    br = unpack_detail(err, error_details_pb2.BadRequest)
    return br.field_violations[0].field if br and br.field_violations else ""
