"""Crash matrix: the orchestrator SIGKILLs itself at every saga step, before and after the remote
call (CUTY_CRASH_AT), and right after the move to COMPLETED committed, and is restarted. Every saga must end COMPLETED or fully compensated (no held
slot, no reserved code, no un-refunded capture) and the PSP must have charged each attempt at most
once. Clients behave like real ones: they retry with the same Idempotency-Key until answered.

One incarnation per crash point: the process armed with point i+1 also finishes the sagas the
crash at point i left behind (crashing again if their path crosses i+1: a crash during recovery).
"""
from __future__ import annotations

import asyncio
import uuid

import pytest_asyncio


from checkout_e2e import CheckoutStack, crash_at_each_point, persist, start_stack

PROC = "payments-0"


async def buy(shop: CheckoutStack, *, method: str, kind: str, one_call: bool = False) -> str:
    """Two calls (create, then pay), or with `one_call` one CreateCheckout with the payment method."""
    customer = f"crash-{uuid.uuid4().hex[:8]}"
    ck, pk = str(uuid.uuid4()), str(uuid.uuid4())
    pay_with = method if one_call else None
    if kind == "booking":
        (slot,) = await shop.new_slots(1)
        c = await persist(lambda: shop.create(customer, slot=slot, key=ck, pay_with=pay_with))
    else:
        product = await shop.new_product(stock=2)
        c = await persist(lambda: shop.create(customer, product=product, quantity=2, key=ck, pay_with=pay_with))
    if not one_call:
        await persist(lambda: shop.pay(customer, c.id, method, key=pk))
    return c.id


async def happy(shop):
    # Both flows: the synchronous capture is recorded with the confirm (CHARGING -> COMPLETED), so a
    # crash at the confirm leaves CHARGING without the payment, which recovery finds by its key.
    return await asyncio.gather(buy(shop, method="pm_card_ok", kind="booking"),
                                buy(shop, method="pm_card_ok", kind="codes"),
                                buy(shop, method="pm_card_ok", kind="booking", one_call=True),
                                buy(shop, method="pm_card_ok", kind="codes", one_call=True))


async def declined(shop):
    return await asyncio.gather(buy(shop, method="pm_card_declined", kind="booking"),
                                buy(shop, method="pm_card_declined", kind="codes"))


async def cancel_during_3ds(shop):
    async def one(kind):
        cid = await buy(shop, method="pm_card_3ds", kind=kind)
        customer = (await shop.db["payments"].fetchval("SELECT customer_id FROM checkouts WHERE id = $1",
                                                        uuid.UUID(cid)))
        await persist(lambda: shop.cancel(customer, cid))
        return cid
    return await asyncio.gather(one("booking"), one("codes"))


async def hold_lost_then_captured(shop):
    """3-D Secure drags on, the hold lapses and someone else takes the slot; then the customer
    completes 3-D Secure: the saga must refund (the refund step is where the crash lands)."""
    cid = await buy(shop, method="pm_card_3ds", kind="booking")
    row = await shop.db["payments"].fetchrow("SELECT hold_id, slot_id, payment_id FROM checkouts WHERE id = $1",
                                             uuid.UUID(cid))
    await shop.db["booking"].execute("UPDATE holds SET expires_at = clock_timestamp() - interval '1 second' "
                                     "WHERE id = $1", uuid.UUID(row["hold_id"]))
    from cuty.booking.v1 import booking_pb2 as bpb

    await shop.booking.HoldSlot(bpb.HoldSlotRequest(slot_id=str(row["slot_id"]), customer_id="rival",
                                                    request_id=str(uuid.uuid4())))
    intent = await shop.db["payments"].fetchval("SELECT psp_intent_id FROM payments WHERE id = $1", row["payment_id"])
    assert (await shop.psp("GET", f"{shop.stack.psp_url}/3ds/{intent}/complete")).status_code == 200
    return [cid]


async def cancel_after_purchase(shop):
    """A completed booking cancelled by its customer (the salon's default policy: a full
    refund): the crash lands on the refund or on booking's CancelBooking; the restarted process
    finishes the cancel, refunding once."""
    async def one():
        cid = await buy(shop, method="pm_card_ok", kind="booking")
        await shop.until(cid, timeout=30)
        customer = (await shop.db["payments"].fetchval("SELECT customer_id FROM checkouts WHERE id = $1",
                                                        uuid.UUID(cid)))
        await persist(lambda: shop.cancel(customer, cid))
        return cid
    return [await one()]


MATRIX = [
    ("hold:before", happy), ("hold:after", happy),
    ("extend:before", happy), ("extend:after", happy),
    ("charge:before", happy), ("charge:after", happy),
    ("confirm:before", happy), ("confirm:after", happy),
    # Right after COMPLETED (and its outbox events) committed.
    ("recorded:COMPLETED", happy),
    ("release:before", declined), ("release:after", declined),
    ("cancel_payment:before", cancel_during_3ds), ("cancel_payment:after", cancel_during_3ds),
    ("refund:before", hold_lost_then_captured), ("refund:after", hold_lost_then_captured),
    # Cancel after purchase, refund first, then the slot.
    ("cancel_refund:before", cancel_after_purchase), ("cancel_refund:after", cancel_after_purchase),
    ("cancel_release:before", cancel_after_purchase), ("cancel_release:after", cancel_after_purchase),
]


@pytest_asyncio.fixture(scope="module")
async def crashy(pg, tmp_path_factory):
    # Every payment extends its hold here (an infinite pay window), so extend:before|after are reached.
    s = await start_stack(pg, tmp_path_factory.mktemp("checkout-crash"), CUTY_CHECKOUT_PAY_WINDOW_SECONDS="inf")
    yield s
    await s.close()


async def test_sigkill_at_every_saga_step_then_recover(crashy):
    shop = crashy
    results = await crash_at_each_point(shop, MATRIX, PROC, timeout=30)
    ids = [cid for batch in results for cid in batch]
    for cid in ids:
        await shop.until(cid, timeout=30)
    states = await shop.check_invariants(ids)
    assert set(states.values()) <= {"COMPLETED", "FAILED", "CANCELLED", "REFUNDED", "CANCELLED_AFTER_PURCHASE"}, states
    by_point = dict(zip([p for p, _ in MATRIX], results))
    assert all(states[c] == "COMPLETED" for c in by_point["confirm:after"])
    assert all(states[c] == "FAILED" for c in by_point["release:before"])
    assert all(states[c] == "REFUNDED" for c in by_point["refund:after"])
    assert all(states[c] == "COMPLETED" for c in by_point["recorded:COMPLETED"])
    # Whatever the crashes, every state change has its event and every event its
    # state change (the outbox trigger writes them in one statement).
    assert await shop.check_outbox() >= 2 * sum(s == "COMPLETED" for s in states.values())
    for point in ("cancel_refund:before", "cancel_refund:after", "cancel_release:before", "cancel_release:after"):
        assert all(states[c] == "CANCELLED_AFTER_PURCHASE" for c in by_point[point]), point
