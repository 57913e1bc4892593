"""Domain errors. Raised by use cases; one interceptor maps them to gRPC status codes.

Each carries what the caller needs to act: the field at fault, a machine-readable reason, and an
optional protobuf detail message (alternatives for a lost slot race, the available count...).

A typed detail is attached one way: the layer that speaks protobuf (a service's
grpc_api, or the saga's adapter of another service's answers) raises the error with `detail=`;
use cases raise their own error type carrying plain facts (booking's SlotTaken, the code pool's
OutOfStock), which that layer translates.
"""
from __future__ import annotations

import grpc
from google.protobuf.message import Message


class DomainError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, reason: str = "", field: str = "", detail: Message | None = None):
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.field = field
        self.detail = detail


class InvalidArgument(DomainError):
    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str, *, reason: str = ""):
        super().__init__(message, field=field, reason=reason)


class NotFound(DomainError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(DomainError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(DomainError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(DomainError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class PermissionDenied(DomainError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(DomainError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Aborted(DomainError):
    code = grpc.StatusCode.ABORTED


class Unavailable(DomainError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(DomainError):
    """The caller's deadline leaves no time for the work (cutylib.deadlines): it was not started,
    or was cut off and rolled back. Like UNAVAILABLE, retryable with the same idempotency key."""
    code = grpc.StatusCode.DEADLINE_EXCEEDED


def require(condition: bool, field: str, message: str) -> None:
    """Validation helper: raise InvalidArgument naming the field unless condition holds."""
    if not condition:
        raise InvalidArgument(field, message)
