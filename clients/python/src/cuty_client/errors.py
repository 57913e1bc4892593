"""Typed errors from the services' real answers: the gRPC status and its google.rpc details
(`BadRequest` field violations, `ErrorInfo` reason, `RetryInfo`, and the platform's own detail
messages: booking's `SlotUnavailable`, the code pool's `OutOfStock`).

Every error is a `CutyError`; `problem()` gives it as RFC 9457 problem details, the shape the
HTTP gateway answers with, so one handler can log or show both.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from ._pb.cuty.booking.v1 import booking_pb2
from ._pb.cuty.codepool.v1 import codepool_pb2

# The HTTP status the gateway gives each code (problem details' `status`).
HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500, grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.RESOURCE_EXHAUSTED: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409, grpc.StatusCode.ABORTED: 409, grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500, grpc.StatusCode.UNAUTHENTICATED: 401,
}


@dataclass(frozen=True)
class FieldViolation:
    field: str        # the request field's path, as in the proto (`slots[2].price.amount_minor`)
    description: str


@dataclass(eq=False)
class CutyError(Exception):
    """A refused or failed call. `reason`: the platform's machine-readable reason (ErrorInfo), e.g.
    `slot-unavailable`, `idempotency-key-reused`; `retry_after`: seconds the service asked to wait."""
    code: grpc.StatusCode
    message: str
    reason: str = ""
    violations: list[FieldViolation] = field(default_factory=list)
    retry_after: float | None = None
    rpc: str = ""

    def __post_init__(self):
        super().__init__(self.message)

    def __str__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.rpc}: {self.code.name}{why}: {self.message}" if self.rpc else f"{self.code.name}{why}: {self.message}"

    @property
    def retryable(self) -> bool:
        """Whether the same call (the same idempotency key) may succeed later."""
        return self.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED)

    def problem(self) -> dict:
        """RFC 9457 problem details."""
        status = HTTP_STATUS.get(self.code, 500)
        slug = self.reason or self.code.name.lower().replace("_", "-")
        out = {"type": f"urn:cuty:problem:{slug}", "title": slug.replace("-", " "), "status": status,
               "detail": self.message, "code": self.code.name}
        if self.reason:
            out["reason"] = self.reason
        if self.violations:
            out["errors"] = [{"field": v.field, "detail": v.description} for v in self.violations]
        if self.retry_after is not None:
            out["retryAfter"] = self.retry_after
        return out


class InvalidArgument(CutyError):
    """The request breaks its contract; `violations` names every field at fault. Nothing was changed."""


class NotFound(CutyError):
    """No such thing, or not yours (another merchant's, another customer's): the same answer."""


class PermissionDenied(CutyError):
    """This caller may not do this: its certificate is not registered as an internal client, the
    RPC is not public, or the role (its own or its user's) is not admitted."""


class Unauthenticated(CutyError):
    """The forwarded user token is missing, expired, or not valid for this platform."""


class Unavailable(CutyError):
    """The service could not be reached or is overloaded (retried, with the same idempotency key)."""


class DeadlineExceeded(CutyError):
    """No answer within the deadline; the outcome is unknown: retry with the same idempotency key."""


@dataclass(eq=False)
class SlotTaken(CutyError):
    """The slot went to another buyer. `alternatives`: other free slots; `held_offer`: one of them
    held for this caller for a short while (buying its slot_id takes it), when the service kept one."""
    slot_id: str = ""
    alternatives: list = field(default_factory=list)      # booking_pb2.Slot
    held_offer: object | None = None                       # booking_pb2.Hold, or None


@dataclass(eq=False)
class OutOfStock(CutyError):
    """Fewer codes are left than asked for."""
    product_id: str = ""
    requested: int = 0
    available: int = 0


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument, grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied, grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable, grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def from_rpc_error(err: grpc.RpcError, rpc: str = "") -> CutyError:
    """The typed error of a failed call, from its status and details."""
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    message = (err.details() if callable(getattr(err, "details", None)) else "") or ""
    try:
        st = rpc_status.from_call(err)
    except Exception:  # noqa: BLE001 - a status whose details do not match its code: use the code alone
        st = None
    reason, violations, retry_after = "", [], None
    slot, stock = None, None
    for a in st.details if st is not None else ():
        if a.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            a.Unpack(info)
            reason = info.reason
        elif a.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            a.Unpack(br)
            violations = [FieldViolation(v.field, v.description) for v in br.field_violations]
        elif a.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            ri = error_details_pb2.RetryInfo()
            a.Unpack(ri)
            retry_after = ri.retry_delay.seconds + ri.retry_delay.nanos / 1e9
        elif a.Is(booking_pb2.SlotUnavailable.DESCRIPTOR):
            slot = booking_pb2.SlotUnavailable()
            a.Unpack(slot)
        elif a.Is(codepool_pb2.OutOfStock.DESCRIPTOR):
            stock = codepool_pb2.OutOfStock()
            a.Unpack(stock)
    common = dict(code=code, message=message, reason=reason, violations=violations, retry_after=retry_after, rpc=rpc)
    if slot is not None:
        return SlotTaken(**common, slot_id=slot.slot_id, alternatives=list(slot.alternatives),
                         held_offer=slot.held_alternative if slot.HasField("held_alternative") else None)
    if stock is not None:
        return OutOfStock(**common, product_id=stock.product_id, requested=stock.requested, available=stock.available)
    return _BY_CODE.get(code, CutyError)(**common)
