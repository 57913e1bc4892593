"""One-call checkout: CreateCheckout with a payment method holds and pays in the same request
(docs/checkout.md, "One-call checkout"), over real gRPC and PostgreSQL with the fake booking, code
pool and PSP. The answer is PayCheckout's; the Idempotency-Key covers the whole purchase (a 3-D
Secure one's replay: test_checkout_api_idempotency.py)."""
from __future__ import annotations

import uuid

import grpc
import pytest

from cuty.payments.v1 import checkout_pb2 as pb, checkout_pb2_grpc
from cuty.payments.v1.payments_pb2 import PAYMENT_STATUS_FAILED, PAYMENT_STATUS_SUCCEEDED
from cutylib import errors
from cutylib.grpc_errors import bad_field, error_reason
from cutylib.principal import Principal
from cutylib.testing.procs import wait_for
from payments.checkout.domain import validate_create

from test_checkout_api_idempotency import call_raw, md

# A one-call checkout records its hold with its payment's start: one transition, PENDING -> CHARGING.
# The synchronous capture is recorded with the confirm: CHARGING -> COMPLETED.
PURCHASE = [("PENDING", "CHARGING"), ("CHARGING", "COMPLETED")]
DECLINED = [("PENDING", "CHARGING"), ("CHARGING", "RELEASING"), ("RELEASING", "FAILED")]
# The two-call flow: held, then paid.
TWO_CALL_PURCHASE = [("PENDING", "HELD"), ("HELD", "CHARGING"), ("CHARGING", "COMPLETED")]


@pytest.fixture
async def api(harness):
    return checkout_pb2_grpc.CheckoutServiceStub(await harness.serve())


def customer() -> str:
    return f"c-{uuid.uuid4()}"


async def timeline(h, checkout_id: str) -> list[tuple[str, str]]:
    rows = await h.pool.fetch("SELECT from_status, to_status FROM payment_events "
                              "WHERE checkout_id = $1 AND source = 'saga' ORDER BY seq", uuid.UUID(checkout_id))
    return [(r["from_status"], r["to_status"]) for r in rows]


async def test_one_call_books_a_slot(harness, api):
    h, me = harness, customer()
    slot = h.booking.add_slot(price=12345)
    done = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=slot, payment_method="pm_card_ok"),
                                    metadata=md(me, str(uuid.uuid4())))
    assert done.state == pb.CHECKOUT_STATE_COMPLETED and done.slot_id == slot
    assert done.amount.amount_minor == 12345
    assert done.payment.status == PAYMENT_STATUS_SUCCEEDED
    assert not done.payment.client_secret and not done.payment.HasField("next_action")  # a finished payment
    hold = h.booking.holds[done.hold_id]
    assert hold["status"] == "confirmed" and hold["payment_ref"] == done.payment.id
    assert list(h.psp.charges.values()) == [1]
    assert await timeline(h, done.id) == PURCHASE  # create's hold and pay's start in one transition
    row = await h.row(done.id)
    assert (row["payment_method"], row["lease_owner"], row["next_run_at"]) == ("pm_card_ok", None, None)
    # What GetCheckout says afterwards is what the call answered.
    got = await api.GetCheckout(pb.GetCheckoutRequest(checkout_id=done.id), metadata=md(me))
    assert (got.state, got.payment.id) == (done.state, done.payment.id)


async def test_one_call_buys_codes_and_they_are_the_buyers(harness, api):
    h, me = harness, customer()
    product = h.codepool.add_product(price=2500, stock=5)
    done = await api.CreateCheckout(pb.CreateCheckoutRequest(product_id=product, quantity=2,
                                                             payment_method="pm_card_ok"), metadata=md(me))
    assert done.state == pb.CHECKOUT_STATE_COMPLETED and done.amount.amount_minor == 5000
    assert h.codepool.orders[done.id]["status"] == "delivered"
    assert dict(h.codepool.effects) == {"reserve": 1, "deliver": 1}
    got = await api.GetCheckout(pb.GetCheckoutRequest(checkout_id=done.id), metadata=md(me))
    assert [c.value for c in got.codes] == h.codepool.orders[done.id]["codes"]


async def test_a_declined_one_call_answers_the_failed_checkout_with_its_hold_released(harness, api):
    """The checkout was created, then the card was refused: the answer is the checkout as PayCheckout
    leaves it (FAILED, payment-failed, the hold given back), not an error hiding it."""
    h, me = harness, customer()
    slot = h.booking.add_slot()
    failed = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=slot, payment_method="pm_card_declined"),
                                      metadata=md(me))
    assert failed.state == pb.CHECKOUT_STATE_FAILED and failed.failure_reason == "payment-failed"
    assert failed.payment.status == PAYMENT_STATUS_FAILED
    assert h.booking.holds[failed.hold_id]["status"] == "released"
    assert await timeline(h, failed.id) == DECLINED
    # The slot is free again: the next buyer gets it.
    again = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=slot, payment_method="pm_card_ok"),
                                     metadata=md(customer()))
    assert again.state == pb.CHECKOUT_STATE_COMPLETED


async def test_a_declined_one_call_gives_the_codes_back(harness, api):
    h = harness
    product = h.codepool.add_product(stock=3)
    failed = await api.CreateCheckout(pb.CreateCheckoutRequest(product_id=product, quantity=3,
                                                               payment_method="pm_card_declined"),
                                      metadata=md(customer()))
    assert failed.state == pb.CHECKOUT_STATE_FAILED
    assert h.codepool.orders[failed.id]["status"] == "released"
    assert len(h.codepool.products[product]["stock"]) == 3


async def test_a_one_call_replay_is_the_same_answer_and_charges_once(harness, api):
    h, me, key = harness, customer(), str(uuid.uuid4())
    req = pb.CreateCheckoutRequest(slot_id=h.booking.add_slot(), payment_method="pm_card_ok")
    first = await call_raw(h, "CreateCheckout", req, md(me, key))
    again = await call_raw(h, "CreateCheckout", req, md(me, key))
    assert first == again and pb.Checkout.FromString(first).state == pb.CHECKOUT_STATE_COMPLETED
    assert list(h.psp.charges.values()) == [1]
    assert h.booking.calls["HoldSlot"] == 1 and h.booking.effects["confirm"] == 1
    assert await h.pool.fetchval("SELECT count(*) FROM payments WHERE checkout_id = $1",
                                 uuid.UUID(pb.Checkout.FromString(first).id)) == 1


@pytest.mark.parametrize("other", [
    pb.CreateCheckoutRequest(payment_method="pm_card_declined"),  # another card
    pb.CreateCheckoutRequest(),  # the same slot without paying
], ids=["other-card", "no-payment"])
async def test_the_same_key_with_another_body_is_refused(harness, api, other):
    h, me, key = harness, customer(), str(uuid.uuid4())
    slot = h.booking.add_slot()
    await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=slot, payment_method="pm_card_ok"),
                             metadata=md(me, key))
    other.slot_id = slot
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.CreateCheckout(other, metadata=md(me, key))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_reason(e.value) == "idempotency-key-reused"
    assert list(h.psp.charges.values()) == [1] and h.booking.calls["HoldSlot"] == 1


async def test_a_plain_create_key_is_not_replayed_as_a_one_call(harness, api):
    h, me, key = harness, customer(), str(uuid.uuid4())
    slot = h.booking.add_slot()
    held = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=slot), metadata=md(me, key))
    assert held.state == pb.CHECKOUT_STATE_HELD
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=slot, payment_method="pm_card_ok"),
                                 metadata=md(me, key))
    assert error_reason(e.value) == "idempotency-key-reused"
    assert not h.psp.charges


async def test_the_two_call_flow_is_unchanged(harness, api):
    h, me = harness, customer()
    held = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=h.booking.add_slot()),
                                    metadata=md(me, str(uuid.uuid4())))
    assert held.state == pb.CHECKOUT_STATE_HELD and not held.HasField("payment")
    row = await h.row(held.id)
    assert (row["payment_method"], row["payment_key"], row["lease_owner"]) == (None, None, None)
    paid = await api.PayCheckout(pb.PayCheckoutRequest(checkout_id=held.id, payment_method="pm_card_ok"),
                                 metadata=md(me, str(uuid.uuid4())))
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED and paid.payment.status == PAYMENT_STATUS_SUCCEEDED
    assert await timeline(h, held.id) == TWO_CALL_PURCHASE
    assert list(h.psp.charges.values()) == [1]


async def test_a_one_call_checkout_cannot_be_paid_again(harness, api):
    h, me = harness, customer()
    done = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=h.booking.add_slot(),
                                                             payment_method="pm_card_ok"), metadata=md(me))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.PayCheckout(pb.PayCheckoutRequest(checkout_id=done.id, payment_method="pm_card_ok"),
                              metadata=md(me))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and error_reason(e.value) == "checkout-not-held"
    assert list(h.psp.charges.values()) == [1]


@pytest.mark.parametrize("method", ["", "x" * 65, "pm\ncard"])
async def test_a_bad_payment_method_holds_nothing_and_frees_the_key(harness, api, method):
    h, key = harness, str(uuid.uuid4())
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=h.booking.add_slot(), payment_method=method),
                                 metadata=md(customer(), key))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == "payment_method"
    assert h.booking.calls["HoldSlot"] == 0
    assert await h.pool.fetchval("SELECT count(*) FROM checkout_idempotency_keys WHERE key = $1", key) == 0


async def test_a_one_call_whose_hold_timed_out_is_held_and_paid_by_a_worker(harness):
    """The hold's answer was lost: the request answers UNAVAILABLE and a worker carries the saga on,
    through the payment the customer asked for; the client's retry answers where it stands."""
    h, me, key = harness, customer(), str(uuid.uuid4())
    req = validate_create(h.booking.add_slot(), "", 0, "pm_card_ok")
    h.booking.fail_next["HoldSlot"] = ["DEADLINE_EXCEEDED_AFTER"]
    with pytest.raises(errors.Unavailable):
        await h.service.create(me, req, key)
    row = await h.pool.fetchrow("SELECT id, state FROM checkouts WHERE slot_id = $1", uuid.UUID(req.slot_id))
    assert row["state"] == "PENDING"
    h.start_workers(1)
    await wait_for(lambda: _state_is(h, str(row["id"]), "COMPLETED"), timeout=5, message="held and paid")
    assert h.booking.effects["hold"] == 1 and list(h.psp.charges.values()) == [1]
    retried = await h.service.create(me, req, key)
    assert retried.id == str(row["id"]) and retried.state == pb.CHECKOUT_STATE_COMPLETED
    assert list(h.psp.charges.values()) == [1]
    staff_view = await h.service.get(Principal("staff-1", "staff", retried.merchant_id), retried.id)
    assert staff_view.state == pb.CHECKOUT_STATE_COMPLETED


async def _state_is(h, checkout_id: str, state: str) -> bool:
    return (await h.row(checkout_id))["state"] == state


async def test_a_one_call_whose_hold_was_lost_at_the_confirm_records_the_capture_then_refunds(harness, api):
    """The synchronous capture is recorded with the confirm's outcome only when it completes: a hold
    lost at the confirm (here a started appointment) records CONFIRMING, then REFUNDING, as before,
    without asking booking twice."""
    h, me = harness, customer()
    slot = h.booking.add_slot()
    h.booking.started.add(slot)
    out = await api.CreateCheckout(pb.CreateCheckoutRequest(slot_id=slot, payment_method="pm_card_ok"),
                                   metadata=md(me, str(uuid.uuid4())))
    await wait_for(lambda: _state_is(h, out.id, "REFUNDED"), timeout=5, message="REFUNDED")
    assert await timeline(h, out.id) == [("PENDING", "CHARGING"), ("CHARGING", "CONFIRMING"),
                                         ("CONFIRMING", "REFUNDING"), ("REFUNDING", "REFUNDED")]
    assert h.booking.calls["ConfirmHold"] == 1 and h.booking.effects.get("confirm", 0) == 0
    assert list(h.psp.charges.values()) == [1] and len(h.psp.refunds) == 1


async def test_a_one_call_whose_confirm_keeps_failing_waits_for_an_operator_in_confirming(make_harness):
    """A confirm that fails records the capture (CONFIRMING) before the failure is retried, so the
    retries, their bound and an operator's retry are the CONFIRMING step's, as before."""
    h, me = make_harness(max_attempts=3), customer()
    h.start_workers(1)
    h.booking.fail_next["ConfirmHold"] = ["UNAVAILABLE"] * 50
    done = await h.service.create(me, validate_create(h.booking.add_slot(), "", 0, "pm_card_ok"), str(uuid.uuid4()))
    assert done.state == pb.CHECKOUT_STATE_CONFIRMING and done.payment.status == PAYMENT_STATUS_SUCCEEDED

    async def needs_attention() -> bool:
        row = await h.row(done.id)
        return row["state"] == "NEEDS_ATTENTION" and row["attention_from"] == "CONFIRMING"
    await wait_for(needs_attention, timeout=10, message="NEEDS_ATTENTION from CONFIRMING")
    assert (await h.row(done.id))["payment_id"] is not None
    assert await timeline(h, done.id) == [("PENDING", "CHARGING"), ("CHARGING", "CONFIRMING"),
                                          ("CONFIRMING", "NEEDS_ATTENTION")]
    assert list(h.psp.charges.values()) == [1]
