"""Every PSP test payment method, for a slot and for codes, through the real services; the booking
and code-pool databases and the simulator's ledger are checked afterwards."""
from __future__ import annotations

import uuid

import grpc
import pytest

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cuty.payments.v1 import checkout_pb2 as pb
from cutylib.grpc_errors import error_reason, unpack_detail

from checkout_e2e import name

# method -> (state PayCheckout may answer with, final state)
METHODS = {
    "pm_card_ok": ({pb.CHECKOUT_STATE_COMPLETED}, pb.CHECKOUT_STATE_COMPLETED),
    "pm_card_declined": ({pb.CHECKOUT_STATE_FAILED}, pb.CHECKOUT_STATE_FAILED),
    "pm_card_3ds": ({pb.CHECKOUT_STATE_AWAITING_ACTION}, pb.CHECKOUT_STATE_COMPLETED),
    "pm_card_webhook_first": ({pb.CHECKOUT_STATE_COMPLETED}, pb.CHECKOUT_STATE_COMPLETED),
    "pm_card_duplicate_webhooks": ({pb.CHECKOUT_STATE_COMPLETED}, pb.CHECKOUT_STATE_COMPLETED),
    "pm_card_no_webhook": ({pb.CHECKOUT_STATE_CHARGING, pb.CHECKOUT_STATE_COMPLETED}, pb.CHECKOUT_STATE_COMPLETED),
    "pm_card_sync_timeout": ({pb.CHECKOUT_STATE_CHARGING, pb.CHECKOUT_STATE_CONFIRMING, pb.CHECKOUT_STATE_COMPLETED}, pb.CHECKOUT_STATE_COMPLETED),
}


@pytest.mark.parametrize("kind", ["booking", "codes"])
@pytest.mark.parametrize("method", list(METHODS))
async def test_payment_method_end_to_end(shop, kind, method):
    customer = f"cust-{uuid.uuid4().hex[:8]}"
    if kind == "booking":
        (slot,) = await shop.new_slots(1, price=75000)
        created = await shop.create(customer, slot=slot)
        assert created.amount.amount_minor == 75000 and created.hold_id
    else:
        product = await shop.new_product(stock=3, price=2500)
        created = await shop.create(customer, product=product, quantity=2)
        assert created.amount.amount_minor == 5000 and created.order_id == created.id
    assert created.state == pb.CHECKOUT_STATE_HELD and created.expire_time.seconds > 0

    answered, final = METHODS[method]
    paid = await shop.pay(customer, created.id, method)
    assert paid.state in answered, name(paid.state)
    if paid.state == pb.CHECKOUT_STATE_AWAITING_ACTION:
        url = paid.payment.next_action.redirect_url
        assert url and paid.payment.client_secret
        assert (await shop.psp("GET", url)).status_code == 200  # the customer passes 3-D Secure
    done = await shop.until(created.id)
    assert done.state == final, name(done.state)
    assert not done.payment.client_secret and not done.payment.next_action.redirect_url

    states = await shop.check_invariants([created.id])
    assert states[created.id] == name(final)
    ledger = await shop.ledger()
    charges = [c for c in ledger["charges"] if c["idempotency_key"] == _key(created.id)]
    assert len(charges) == (0 if final == pb.CHECKOUT_STATE_FAILED else 1)
    if kind == "booking":
        assert await shop.hold_status(created.hold_id) == ("confirmed" if final == pb.CHECKOUT_STATE_COMPLETED else "released")
    else:
        assert await shop.order_status(created.id) == ("delivered" if final == pb.CHECKOUT_STATE_COMPLETED else "released")
        mine = await shop.get(created.id, customer)
        if final == pb.CHECKOUT_STATE_COMPLETED:
            assert len(mine.codes) == 2 and all(c.value.startswith("CODE-") for c in mine.codes)
        else:
            assert not mine.codes


def _key(checkout_id: str) -> str:
    from payments.checkout.domain import payment_attempt_id

    return payment_attempt_id(checkout_id)


async def test_taken_slot_is_rejected_with_alternatives_and_recorded(shop):
    slots = await shop.new_slots(3)
    first = await shop.create("alice-" + uuid.uuid4().hex[:6], slot=slots[0])
    assert first.state == pb.CHECKOUT_STATE_HELD
    loser = "bob-" + uuid.uuid4().hex[:6]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await shop.create(loser, slot=slots[0])
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS and error_reason(e.value) == "slot-unavailable"
    alternatives = unpack_detail(e.value, booking_pb2.SlotUnavailable).alternatives
    assert 1 <= len(alternatives) <= 3 and {a.id for a in alternatives} & set(slots[1:])
    n = await shop.db["payments"].fetchval(
        "SELECT count(*) FROM checkouts WHERE customer_id = $1 AND state = 'REJECTED'", loser)
    assert n == 1


async def test_out_of_stock(shop):
    product = await shop.new_product(stock=2)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await shop.create("carol", product=product, quantity=3)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_reason(e.value) == "out-of-stock"
    assert unpack_detail(e.value, codepool_pb2.OutOfStock).available == 2
    assert await shop.db["codepool"].fetchval(
        "SELECT count(*) FROM codes WHERE product_id = $1 AND status = 'available'", uuid.UUID(product)) == 2


async def test_bad_input_changes_nothing(shop):
    before = await shop.db["payments"].fetchval("SELECT count(*) FROM checkouts")
    cases = [
        (dict(slot=str(uuid.uuid4())), grpc.StatusCode.NOT_FOUND),
        (dict(slot="not-a-uuid"), grpc.StatusCode.INVALID_ARGUMENT),
        (dict(product=str(uuid.uuid4()), quantity=1), grpc.StatusCode.INVALID_ARGUMENT),
        (dict(product=str(uuid.uuid4()), quantity=0), grpc.StatusCode.INVALID_ARGUMENT),
        (dict(product=str(uuid.uuid4()), quantity=101), grpc.StatusCode.INVALID_ARGUMENT),
        (dict(), grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for kw, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await shop.create("dave", **kw)
        assert e.value.code() == code, (kw, e.value.code())
    assert await shop.db["payments"].fetchval("SELECT count(*) FROM checkouts") == before
