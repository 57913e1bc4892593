"""RFC 9457 problem documents, and the one mapping from gRPC statuses to them (docs/gateway.md,
"Problems (RFC 9457)").

- `type` is a short slug (a relative URI reference): the `google.rpc.ErrorInfo` reason when the
  service gave one (`slot-unavailable`, `idempotency-key-reused`), else the status' own slug.
- `google.rpc.BadRequest` names the field: it becomes `field`, spelled as in the JSON.
- Our own detail messages (`SlotUnavailable`, `OutOfStock`, ...) are merged in as extension
  members, so `slot-unavailable` carries `alternatives` and `out-of-stock` carries `available`
  without the gateway knowing either message.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.rpc import error_details_pb2, status_pb2

from cutylib.validation import RequestInvalid

from .transcode import dumps

# docs/gateway.md, "Problems": ALREADY_EXISTS, FAILED_PRECONDITION, RESOURCE_EXHAUSTED and ABORTED are all
# conflicts with the current state of a resource (409); 429 is kept for the gateway's own rate
# limit so a client can tell "slow down" from "out of stock". RESOURCE_EXHAUSTED without a domain
# reason is a service shedding load: 503 `overloaded` (from_rpc_error).
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}

# A reason that means something other than its status code's usual answer. Invariant 7: the same
# Idempotency-Key with another body is refused with 422 (the orchestrator says INVALID_ARGUMENT).
REASON_STATUS = {"idempotency-key-reused": 422}

TITLES = {400: "Bad request", 401: "Unauthenticated", 403: "Forbidden", 404: "Not found",
          405: "Method not allowed", 409: "Conflict", 413: "Payload too large", 422: "Unprocessable content",
          429: "Too many requests", 499: "Client closed request", 500: "Internal error",
          501: "Not implemented", 503: "Service unavailable", 504: "Gateway timeout"}

_CORE = {"type", "title", "status", "detail", "instance"}
_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


@dataclass
class Problem(Exception):
    status: int
    type: str
    detail: str = ""
    title: str = ""
    extra: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)

    def body(self, trace_id: str = "") -> bytes:
        doc = {"type": self.type, "title": self.title or _title(self.type, self.status),
               "status": self.status, "detail": self.detail}
        for k, v in self.extra.items():
            if k not in _CORE:
                doc[k] = v
        if trace_id:
            doc["traceId"] = trace_id
        return dumps(doc)


def _title(slug: str, status: int) -> str:
    generic = TITLES.get(status, "Error")
    if not slug or slug == code_slug_for(status):
        return generic
    return slug.replace("-", " ").capitalize()


def code_slug(code: grpc.StatusCode) -> str:
    return code.name.lower().replace("_", "-")


# HTTP status -> the slug of the first gRPC status mapped to it (a refusal's title needs it on
# every refusal: built once).
_SLUG_FOR: dict[int, str] = {}
for _code, _http in HTTP_STATUS.items():
    _SLUG_FOR.setdefault(_http, code_slug(_code))


def code_slug_for(status: int) -> str:
    return _SLUG_FOR.get(status, "")


def bad_request(field: str, detail: str, type_: str = "invalid-argument") -> Problem:
    return Problem(400, type_, detail, extra={"field": field} if field else {})


def invalid_request(violations: list[tuple[str, str]]) -> Problem:
    """400 for a request that breaks its contract (cutylib.validation): the same detail a
    service's INVALID_ARGUMENT carries, `field` the first field at fault in its JSON spelling."""
    err = RequestInvalid(violations)
    return bad_request(json_field_path(err.field), err.message)


OVERLOADED = "overloaded"


def overloaded(detail: str, retry_after: str) -> Problem:
    """503 `overloaded`: refused (or shed by a service) to keep the answers that are admitted
    fast; nothing was done, retry after Retry-After."""
    return Problem(503, OVERLOADED, detail, headers={"retry-after": retry_after})


_SNAKE = re.compile(r"_([a-z0-9])")


def json_field_path(path: str) -> str:
    """`slots[0].start_time` -> `slots[0].startTime`: services name fields as in the proto, the
    client sees JSON names."""
    return _SNAKE.sub(lambda m: m.group(1).upper(), path)


def _status_details(err: grpc.aio.AioRpcError) -> status_pb2.Status | None:
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    return None


def _detail_members(any_msg) -> dict:
    """An unknown-to-the-gateway detail message as problem members (JSON names; small 64-bit
    counts as numbers, since a problem is read by people and scripts, not proto parsers)."""
    try:
        desc = descriptor_pool.Default().FindMessageTypeByName(any_msg.TypeName())
    except KeyError:
        return {}
    msg = message_factory.GetMessageClass(desc)()
    any_msg.Unpack(msg)
    out = json_format.MessageToDict(msg, always_print_fields_with_no_presence=True)  # `available: 0` too
    for f in desc.fields:
        if f.type in _INT64 and not f.is_repeated and f.json_name in out:
            out[f.json_name] = int(out[f.json_name])
    return out


def from_rpc_error(err: grpc.aio.AioRpcError, *, service: str, deadline: float) -> Problem:
    code = err.code()
    status = HTTP_STATUS.get(code, 500)
    st = _status_details(err)
    reason, fld, extra = "", "", {}
    retry_after = ""  # from a google.rpc.RetryInfo detail (the service says when to retry)
    for a in st.details if st is not None else ():
        if a.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            a.Unpack(info)
            reason = info.reason
        elif a.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            a.Unpack(retry)
            retry_after = str(max(1, retry.retry_delay.seconds))
        elif a.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            a.Unpack(br)
            if br.field_violations:
                fld = json_field_path(br.field_violations[0].field)
        elif not a.TypeName().startswith("google.rpc."):
            extra.update(_detail_members(a))
    detail = err.details() or ""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and reason in ("", OVERLOADED):
        # Without a domain reason (out-of-stock, too-many-active-holds, ... stay 409s) it is the
        # service's own load shedding (its concurrency cap): the same answer as the gateway's.
        return overloaded(f"the {service} service is overloaded; nothing was done, retry later", retry_after or "1")
    headers = {"retry-after": retry_after} if retry_after else {}
    if st is None and code == grpc.StatusCode.UNAVAILABLE:
        # A transport failure: the message names internal addresses, say what matters instead.
        detail = f"the {service} service is unavailable; retry later"
        headers["retry-after"] = "1"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        detail = f"the {service} service did not answer within {deadline:g} s; the outcome is unknown, retry with the same Idempotency-Key"
    elif status >= 500 and code != grpc.StatusCode.UNAVAILABLE:
        detail = f"the {service} service failed; quote the trace id when reporting it"
    if reason in REASON_STATUS:
        status = REASON_STATUS[reason]
    if fld:
        extra["field"] = fld
    return Problem(status, reason or code_slug(code), detail, extra=extra, headers=headers)
