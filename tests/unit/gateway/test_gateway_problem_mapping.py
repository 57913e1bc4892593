"""gRPC status (with google.rpc details) -> RFC 9457 problem, built from real statuses."""
import json

import grpc
import pytest

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cutylib import errors
from cutylib.grpc_errors import to_status
from gateway.problems import Problem, from_rpc_error, json_field_path


def rpc_error(err: errors.DomainError | None = None, code=grpc.StatusCode.UNAVAILABLE, details="x"):
    if err is None:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)
    st = to_status(err)
    return grpc.aio.AioRpcError(st.code, grpc.aio.Metadata(), grpc.aio.Metadata(*st.trailing_metadata),
                                details=st.details)


def doc(p: Problem) -> dict:
    return json.loads(p.body("t" * 32))


@pytest.mark.parametrize("err, status, type_", [
    (errors.AlreadyExists("taken"), 409, "already-exists"),
    (errors.FailedPrecondition("not HELD"), 409, "failed-precondition"),
    (errors.NotFound("no such checkout"), 404, "not-found"),
    (errors.InvalidArgument("slot_id", "malformed"), 400, "invalid-argument"),
    (errors.ResourceExhausted("too many holds", reason="too-many-holds"), 409, "too-many-holds"),
    (errors.PermissionDenied("no"), 403, "permission-denied"),
    (errors.Aborted("busy", reason="idempotency-key-in-flight"), 409, "idempotency-key-in-flight"),
    (errors.InvalidArgument("", "other body", reason="idempotency-key-reused"), 422, "idempotency-key-reused"),
    (errors.Unavailable("db down"), 503, "unavailable"),
    (errors.Unauthenticated("bad signature"), 401, "unauthenticated"),
])
def test_status_mapping(err, status, type_):
    p = from_rpc_error(rpc_error(err), service="payments", deadline=5)
    d = doc(p)
    assert (d["status"], d["type"]) == (status, type_)
    assert d["title"] and d["traceId"] == "t" * 32


def test_slot_unavailable_carries_alternatives_as_slot_json():
    alt = booking_pb2.Slot(id="s2", resource_id="r1", local_start_time="2026-03-08T12:00:00+03:00")
    alt.price.currency_code, alt.price.amount_minor = "TRY", 75000
    err = errors.AlreadyExists("slot s1 is taken", reason="slot-unavailable",
                               detail=booking_pb2.SlotUnavailable(slot_id="s1", alternatives=[alt]))
    d = doc(from_rpc_error(rpc_error(err), service="payments", deadline=5))
    assert (d["status"], d["type"]) == (409, "slot-unavailable")
    assert d["alternatives"] == [{"id": "s2", "salonId": "", "resourceId": "r1",
                                  "localStartTime": "2026-03-08T12:00:00+03:00",
                                  "price": {"currencyCode": "TRY", "amountMinor": "75000"}, "available": False,
                                  "serviceId": "", "merchantId": ""}]


def test_slot_unavailable_names_the_alternative_held_for_the_loser():
    offer = booking_pb2.Hold(id="h9", slot_id="s2", offered=True, customer_id="c1")
    err = errors.AlreadyExists("slot s1 is taken", reason="slot-unavailable",
                               detail=booking_pb2.SlotUnavailable(slot_id="s1", held_alternative=offer))
    d = doc(from_rpc_error(rpc_error(err), service="payments", deadline=5))
    assert (d["heldAlternative"]["id"], d["heldAlternative"]["slotId"], d["heldAlternative"]["offered"]) == (
        "h9", "s2", True)


def test_out_of_stock_carries_available_as_a_number():
    err = errors.ResourceExhausted("only 2 left", reason="out-of-stock",
                                   detail=codepool_pb2.OutOfStock(product_id="p", requested=5, available=2))
    d = doc(from_rpc_error(rpc_error(err), service="payments", deadline=5))
    assert (d["status"], d["type"], d["available"], d["requested"]) == (409, "out-of-stock", 2, 5)


def test_bad_request_field_becomes_json_name():
    err = errors.InvalidArgument("slots[2].start_time", "start_time must have an offset")
    d = doc(from_rpc_error(rpc_error(err), service="booking", deadline=5))
    assert d["field"] == "slots[2].startTime" and d["detail"] == "start_time must have an offset"


def test_transport_failures_do_not_leak_addresses():
    d = doc(from_rpc_error(rpc_error(details="failed to connect to all addresses; 10.0.0.7:50051"),
                           service="booking", deadline=5))
    assert d["status"] == 503 and "10.0.0.7" not in d["detail"]
    d = doc(from_rpc_error(rpc_error(code=grpc.StatusCode.DEADLINE_EXCEEDED), service="payments", deadline=2.5))
    assert d["status"] == 504 and "2.5 s" in d["detail"]
    d = doc(from_rpc_error(rpc_error(code=grpc.StatusCode.INTERNAL, details="Traceback: secret"), service="x", deadline=1))
    assert d["status"] == 500 and "secret" not in d["detail"]


def test_problem_extension_members_cannot_overwrite_core_members():
    p = Problem(409, "conflict", "d", extra={"status": 200, "type": "ok", "x": 1})
    d = json.loads(p.body())
    assert (d["status"], d["type"], d["x"]) == (409, "conflict", 1)


def test_json_field_path():
    assert json_field_path("slots[0].start_time") == "slots[0].startTime"
    assert json_field_path("Idempotency-Key") == "Idempotency-Key"


def test_a_service_shedding_load_is_503_overloaded_with_retry_after():
    """RESOURCE_EXHAUSTED without a domain reason (a server's concurrency cap) is the gateway's own
    `overloaded` answer; with one (out-of-stock, too-many-holds) it stays a 409 conflict."""
    for err in (rpc_error(code=grpc.StatusCode.RESOURCE_EXHAUSTED, details="Concurrent RPC limit exceeded!"),
                rpc_error(errors.ResourceExhausted("busy", reason="overloaded"))):
        p = from_rpc_error(err, service="payments", deadline=5)
        assert (p.status, p.type) == (503, "overloaded") and int(p.headers["retry-after"]) >= 1
        assert "payments" in p.detail and "RPC limit" not in p.detail
    p = from_rpc_error(rpc_error(errors.ResourceExhausted("short", reason="out-of-stock")), service="payments", deadline=5)
    assert (p.status, p.type) == (409, "out-of-stock") and "retry-after" not in p.headers
