"""The operator's view, in process (real PostgreSQL, fake booking / PSP): `ops story` finds
a checkout by whichever id the on-call engineer has and names the failing step and its error,
`ops stuck` lists it, `ops retry` / `ops refund` go through the gRPC API as the payments identity
and are recorded with who did them; staff see attempts and last error, customers do not; staff find
a payment by its PSP intent id."""
from __future__ import annotations

import uuid

import grpc
import pytest

from cuty.payments.v1 import checkout_pb2 as pb, checkout_pb2_grpc, payments_pb2, payments_pb2_grpc
from cutylib.principal import Principal
from cutylib.testing.procs import wait_for
from cutylib.testing.trust import TEST_MERCHANT, acting_channel, channel_as, user
from payments import ops
from payments.checkout.domain import validate_create
from payments.grpc_api import CALLERS as PAYMENT_CALLERS

C = "customer-" + uuid.uuid4().hex[:8]
STAFF = user("staff-9", "staff")


async def _state(h, checkout_id: str) -> str:
    return (await h.row(checkout_id))["state"]


async def notes(h, checkout_id: str) -> list[str]:
    rows = await h.pool.fetch("SELECT e.note FROM payment_events e LEFT JOIN checkouts c ON c.payment_id = e.payment_id "
                              "WHERE e.checkout_id = $1 OR c.id = $1 ORDER BY e.seq", uuid.UUID(checkout_id))
    return [r["note"] for r in rows]


async def _is(h, checkout_id, expected):
    return await _state(h, checkout_id) == expected


async def test_story_finds_the_checkout_by_any_id_and_names_the_failing_step(served):
    h, checkout_id, payment_id = served
    payment = await h.core.get(payment_id)
    attempt_id = await h.pool.fetchval("SELECT idempotency_key FROM payments WHERE id = $1", uuid.UUID(payment_id))
    for query in (checkout_id, payment_id, payment.psp_intent_id, attempt_id):
        (s,) = await ops.story(h.pool, query)
        assert s.checkout["id"] == checkout_id and [p["id"] for p in s.payments] == [payment_id], query
    assert (await ops.story(h.pool, str(uuid.uuid4()))) == []
    s = s.to_json()
    assert s["checkout"]["state"] == "NEEDS_ATTENTION" and s["checkout"]["attention_from"] == "REFUNDING"
    assert s["checkout"]["attempts"] == 3 and "refund_refused_by_bank" in s["checkout"]["last_error"]
    assert s["failing_step"].startswith("refund") and "NEEDS ATTENTION" in s["diagnosis"]
    assert "charged" in s["diagnosis"] and f"ops retry {checkout_id}" in s["diagnosis"]
    moves = [(e["source"], e["from_status"], e["to_status"]) for e in s["timeline"]]
    assert ("saga", "CONFIRMING", "REFUNDING") in moves and ("saga", "REFUNDING", "NEEDS_ATTENTION") in moves
    assert ("sync", "processing", "succeeded") in moves or ("sync", "created", "succeeded") in moves
    assert any(e["step"] == "confirm" and e["step_ms"] >= 0 for e in s["timeline"])  # step durations
    text = ops.render((await ops.story(h.pool, checkout_id))[0])
    assert "failing step: refund" in text and "refund_refused_by_bank" in text and payment.psp_intent_id in text
    stuck = await ops.stuck(h.pool, 0)
    assert checkout_id in [r["id"] for r in stuck]
    assert checkout_id not in [r["id"] for r in await ops.stuck(h.pool, 3600)]
    assert checkout_id in ops.render_stuck(stuck, 0)


def test_trace_links_follow_the_template(monkeypatch):
    monkeypatch.setenv(ops.TRACE_URL_TEMPLATE, "http://jaeger:16686/trace/{trace_id}")
    assert ops.trace_link("4bf92f3577b34da6a3ce929d0e0e4736") == "http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"
    monkeypatch.delenv(ops.TRACE_URL_TEMPLATE)
    assert ops.trace_link("4bf92f3577b34da6a3ce929d0e0e4736") == ""


async def test_staff_see_attempts_and_last_error_customers_do_not(served):
    h, checkout_id, _ = served
    staff = await h.service.get(Principal("staff-1", "staff", TEST_MERCHANT), checkout_id)
    assert staff.HasField("diagnostics")
    d = staff.diagnostics
    assert (d.attempts, d.attention_from) == (3, "REFUNDING") and "refund_refused_by_bank" in d.last_error
    assert d.failing_since.seconds > 0 and d.version >= 1
    mine = await h.service.get(Principal(h.attention_customer, "customer"), checkout_id)
    assert mine.state == pb.CHECKOUT_STATE_NEEDS_ATTENTION and not mine.HasField("diagnostics")


async def test_ops_retry_is_recorded_with_who_and_a_user_cannot_name_someone_else(served):
    h, checkout_id, payment_id = served
    # An admin through the gateway is recorded from the signed assertion; the metadata is ignored.
    gateway = checkout_pb2_grpc.CheckoutServiceStub(channel_as("gateway", h.addr, "payments"))
    with pytest.raises(grpc.aio.AioRpcError) as e:  # still refusing: the retry leads back here
        await gateway.RetryCheckout(pb.RetryCheckoutRequest(checkout_id=str(uuid.uuid4())),
                                    metadata=(*user("admin-1", "admin"), ("cuty-operator", "mallory")))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    h.psp.refusing["refund"] = 0  # the bank relents
    again = await ops.retry(h.addr, checkout_id, "alice")
    assert again.state == pb.CHECKOUT_STATE_REFUNDING
    await wait_for(lambda: _is(h, checkout_id, "REFUNDED"), timeout=10, message="REFUNDED")
    assert "retried by ops:alice" in await notes(h, checkout_id)
    assert len(h.psp.refunds) == 1 and (await h.core.get(payment_id)).status == "refunded"


async def test_admin_retry_through_the_gateway_names_the_admin_not_the_metadata(served):
    h, checkout_id, _ = served
    h.psp.refusing["refund"] = 0
    gateway = checkout_pb2_grpc.CheckoutServiceStub(channel_as("gateway", h.addr, "payments"))
    await gateway.RetryCheckout(pb.RetryCheckoutRequest(checkout_id=checkout_id),
                                metadata=(*user("admin-1", "admin"), ("cuty-operator", "mallory")))
    await wait_for(lambda: _is(h, checkout_id, "REFUNDED"), timeout=10, message="REFUNDED")
    recorded = await notes(h, checkout_id)
    assert "retried by admin:admin-1" in recorded and not any("mallory" in n for n in recorded)


async def test_ops_refund_uses_the_sagas_key_and_is_recorded(served):
    h, checkout_id, payment_id = served
    h.psp.refusing["refund"] = 0
    found_checkout, p = await ops.refund(h.addr, h.pool, payment_id, "bob", "customer called,  twice", False)
    assert found_checkout == checkout_id and p.status == payments_pb2.PAYMENT_STATUS_REFUNDED
    assert any(n.startswith("refund requested by ops:bob: customer called, twice")
               for n in await notes(h, checkout_id))
    # The saga, retried, finds the refund done: one refund at the PSP (the same idempotency key).
    await ops.retry(h.addr, checkout_id, "bob")
    await wait_for(lambda: _is(h, checkout_id, "REFUNDED"), timeout=10, message="REFUNDED")
    assert len(h.psp.refunds) == 1
    again = await ops.refund(h.addr, h.pool, payment_id, "bob", "", False)  # idempotent
    assert again[1].status == payments_pb2.PAYMENT_STATUS_REFUNDED and len(h.psp.refunds) == 1


async def test_ops_refund_of_a_completed_checkout_needs_force(served):
    h, _, _ = served
    h.psp.refusing["refund"] = 0
    done = await h.service.create(C, validate_create(h.booking.add_slot(price=500), "", 0), "")
    paid = await h.service.pay(C, done.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED
    with pytest.raises(PermissionError):
        await ops.refund(h.addr, h.pool, paid.payment.id, "bob", "", False)
    with pytest.raises(LookupError):
        await ops.refund(h.addr, h.pool, str(uuid.uuid4()), "bob", "", False)
    _, p = await ops.refund(h.addr, h.pool, paid.payment.id, "bob", "goodwill", True)
    assert p.status == payments_pb2.PAYMENT_STATUS_REFUNDED


async def test_staff_look_a_payment_up_by_its_psp_intent_id(served):
    h, checkout_id, payment_id = served
    intent = (await h.core.get(payment_id)).psp_intent_id
    stub = payments_pb2_grpc.PaymentServiceStub(acting_channel(h.addr, "payments", PAYMENT_CALLERS))
    got = await stub.LookupPayment(payments_pb2.LookupPaymentRequest(psp_intent_id=intent), metadata=STAFF)
    assert (got.id, got.checkout_id, got.psp_intent_id) == (payment_id, checkout_id, intent)
    assert not got.client_secret and not got.HasField("next_action")
    for md, request, code in [
        (user(C, "customer"), intent, grpc.StatusCode.PERMISSION_DENIED),
        (STAFF, "pi_unknown", grpc.StatusCode.NOT_FOUND),
        (STAFF, " ", grpc.StatusCode.INVALID_ARGUMENT),
        ((), intent, grpc.StatusCode.UNAUTHENTICATED),  # the gateway without a user
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.LookupPayment(payments_pb2.LookupPaymentRequest(psp_intent_id=request), metadata=md)
        assert e.value.code() == code, (md, request)
    ours = payments_pb2_grpc.PaymentServiceStub(channel_as("payments", h.addr, "payments"))
    with pytest.raises(grpc.aio.AioRpcError) as e:  # not in its caller table: staff's, over HTTP
        await ours.LookupPayment(payments_pb2.LookupPaymentRequest(psp_intent_id=intent))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED

