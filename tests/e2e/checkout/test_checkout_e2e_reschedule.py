"""A COMPLETED booking rescheduled to another slot of its salon, with real processes
(booking, the PSP simulator, the orchestrator) on PostgreSQL: the same price, a dearer slot (the
difference charged through the PSP), a cheaper one (the difference refunded), a declined difference
(undone: the booking unchanged, nothing kept), the new slot raced by another buyer with real
concurrency (exactly one wins; the loser's booking unchanged, alternatives in the answer; each slot
held by exactly one booking in the database), the outbox event, refusals and idempotent repeats."""
from __future__ import annotations

import asyncio
import json
import uuid

from datetime import datetime, timedelta, timezone

import grpc
import pytest

from cuty.booking.v1 import booking_pb2 as bpb
from cuty.common.v1 import common_pb2
from cuty.payments.v1 import checkout_pb2 as pb, payments_pb2
from cutylib.grpc_errors import bad_field, error_reason, unpack_detail
from cutylib.timestamps import to_timestamp

from checkout_e2e import ADMIN, CheckoutStack, name


def customer() -> str:
    return f"resched-{uuid.uuid4().hex[:8]}"


async def bought(shop: CheckoutStack, who: str, slot: str, method: str = "pm_card_ok") -> pb.Checkout:
    c = await shop.create(who, slot=slot)
    await shop.pay(who, c.id, method)
    done = await shop.until(c.id)
    assert name(done.state) == "COMPLETED", done
    return done


async def intents_of(shop: CheckoutStack, checkout_id: str) -> list[str]:
    return [r["psp_intent_id"] for r in await shop.db["payments"].fetch(
        "SELECT psp_intent_id FROM payments WHERE checkout_id = $1 ORDER BY created_at", uuid.UUID(checkout_id))]


async def test_the_same_price_moves_the_booking_and_no_money(shop):
    a, b = await shop.new_slots(2)
    me = customer()
    done = await bought(shop, me, a)
    out = await shop.reschedule(me, done.id, b)
    assert name(out.state) == "COMPLETED" and out.slot_id == b and out.hold_id != done.hold_id
    r = out.reschedule
    assert (r.status, r.slot_id, r.previous_slot_id, r.difference.amount_minor, r.count) == ("rescheduled", b, a, 0, 1)
    assert r.rescheduled_by == f"customer:{me}" and not r.payment_id
    assert await shop.hold_status(done.hold_id) == "released"
    assert await shop.hold_status(out.hold_id) == "confirmed"
    (row,) = (await shop.check_reschedules([done.id])).values()
    assert row["amount_minor"] == 75000 and len(await intents_of(shop, done.id)) == 1
    # The old time is bookable again.
    other = await shop.create(customer(), slot=a)
    assert name(other.state) == "HELD"
    # The timeline tells the story, the outbox tells the merchant once.
    notes = [(e["from_status"], e["to_status"]) for e in await shop.db["payments"].fetch(
        "SELECT from_status, to_status FROM payment_events WHERE checkout_id = $1 AND source = 'saga' ORDER BY seq",
        uuid.UUID(done.id))]
    assert notes[-3:] == [("COMPLETED", "RESCHEDULING"), ("RESCHEDULING", "RESCHEDULE_CONFIRMING"),
                          ("RESCHEDULE_CONFIRMING", "COMPLETED")]
    events = await shop.db["payments"].fetch("SELECT type, payload FROM merchant_events WHERE checkout_id = $1 "
                                             "ORDER BY created_at", uuid.UUID(done.id))
    assert [e["type"] for e in events] == ["checkout.completed", "booking.confirmed", "booking.rescheduled"]
    payload = events[-1]["payload"]
    payload = payload if isinstance(payload, dict) else json.loads(payload)
    checkout = payload["data"]["checkout"]
    assert (checkout["slot_id"], checkout["previous_slot_id"], checkout["state"]) == (b, a, "COMPLETED")
    assert checkout["hold_id"] == out.hold_id and checkout["previous_hold_id"] == done.hold_id


async def test_a_dearer_slot_charges_the_difference_with_the_purchase_card(shop):
    (a,) = await shop.new_slots(1, price=75000)
    (b,) = await shop.new_slots(1, price=90000)
    me = customer()
    done = await bought(shop, me, a)
    out = await shop.reschedule(me, done.id, b)
    assert name(out.state) == "COMPLETED" and out.slot_id == b and out.amount.amount_minor == 90000
    assert out.reschedule.difference.amount_minor == 15000 and out.reschedule.payment_id
    ledger = await shop.ledger()
    (charge,) = [c for c in ledger["charges"] if c["intent_id"] == (await intents_of(shop, done.id))[1]]
    assert (charge["amount"], charge["payment_method"]) == (15000, "pm_card_ok")
    await shop.check_reschedules([done.id])
    # A cancel afterwards (the default policy: all of it) gives back both payments: the new price.
    cancelled = await shop.cancel(me, done.id)
    assert name(cancelled.state) == "CANCELLED_AFTER_PURCHASE" and cancelled.refund_amount.amount_minor == 90000
    intents = await intents_of(shop, done.id)
    refunds = sorted(x["amount"] for x in (await shop.ledger())["refunds"] if x["intent_id"] in intents)
    assert refunds == [15000, 75000]


async def test_a_cheaper_slot_refunds_the_difference(shop):
    (a,) = await shop.new_slots(1, price=75000)
    (b,) = await shop.new_slots(1, price=50000)
    me = customer()
    done = await bought(shop, me, a)
    out = await shop.reschedule(me, done.id, b)
    assert name(out.state) == "COMPLETED" and out.amount.amount_minor == 50000
    assert out.reschedule.difference.amount_minor == -25000 and not out.reschedule.payment_id
    assert out.payment.status == payments_pb2.PAYMENT_STATUS_PARTIALLY_REFUNDED
    (intent,) = await intents_of(shop, done.id)
    assert [x["amount"] for x in (await shop.ledger())["refunds"] if x["intent_id"] == intent] == [25000]
    await shop.check_reschedules([done.id])
    # A cancel afterwards refunds what is left of the new price (the salon's default policy: all of it).
    cancelled = await shop.cancel(me, done.id)
    assert name(cancelled.state) == "CANCELLED_AFTER_PURCHASE" and cancelled.refund_amount.amount_minor == 50000


async def test_a_declined_difference_undoes_the_reschedule_and_keeps_nothing(shop):
    (a,) = await shop.new_slots(1, price=75000)
    (b,) = await shop.new_slots(1, price=90000)
    me = customer()
    done = await bought(shop, me, a)
    out = await shop.reschedule(me, done.id, b, method="pm_card_declined")
    assert name(out.state) == "COMPLETED" and out.slot_id == a and out.hold_id == done.hold_id
    assert (out.reschedule.status, out.reschedule.failure_reason) == ("reverted", "payment-failed")
    assert await shop.hold_status(done.hold_id) == "confirmed"
    await shop.check_reschedules([done.id])
    # The new slot is free for anyone.
    assert name((await shop.create(customer(), slot=b)).state) == "HELD"
    # And no booking.rescheduled was written.
    types = [r["type"] for r in await shop.db["payments"].fetch(
        "SELECT type FROM merchant_events WHERE checkout_id = $1", uuid.UUID(done.id))]
    assert "booking.rescheduled" not in types


async def test_refusals_change_nothing(shop):
    a, b = await shop.new_slots(2)
    me = customer()
    done = await bought(shop, me, a)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await shop.reschedule(customer(), done.id, b)  # another customer's booking does not exist for them
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    for bad in ("", "not-a-uuid", a):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await shop.reschedule(me, done.id, bad)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == "slot_id", bad
    # A slot of another salon (of the same merchant), and a slot that does not exist.
    salon = await shop.booking.CreateSalon(bpb.CreateSalonRequest(name="elsewhere", time_zone="Europe/Istanbul"),
                                           metadata=ADMIN)
    chair = await shop.booking.CreateResource(bpb.CreateResourceRequest(salon_id=salon.id, name="c"), metadata=ADMIN)
    start = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) + timedelta(days=5)
    elsewhere = (await shop.booking.BatchCreateSlots(bpb.BatchCreateSlotsRequest(salon_id=salon.id, slots=[
        bpb.SlotInput(resource_id=chair.id, start_time=to_timestamp(start),
                      end_time=to_timestamp(start + timedelta(hours=1)),
                      price=common_pb2.Money(currency_code="TRY", amount_minor=75000))]), metadata=ADMIN)).slots[0].id
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await shop.reschedule(me, done.id, elsewhere)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == "slot_id"
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await shop.reschedule(me, done.id, str(uuid.uuid4()))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # A codes purchase is not rescheduled.
    product = await shop.new_product(stock=1)
    codes = await shop.create(me, product=product, quantity=1)
    await shop.pay(me, codes.id, "pm_card_ok")
    await shop.until(codes.id)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await shop.reschedule(me, codes.id, b)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and error_reason(e.value) == "not-a-booking"
    again = await shop.get(done.id, me)
    assert again.slot_id == a and not again.HasField("reschedule") and again.state == done.state


async def test_a_repeat_with_the_same_key_is_the_first_answer(shop):
    a, b, c = await shop.new_slots(3)
    me = customer()
    done = await bought(shop, me, a)
    key = str(uuid.uuid4())
    first = await shop.reschedule(me, done.id, b, key=key)
    again = await shop.reschedule(me, done.id, b, key=key)
    assert again == first
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await shop.reschedule(me, done.id, c, key=key)
    assert error_reason(e.value) == "idempotency-key-reused"
    # A second reschedule (a new key) moves it again, with keys of its own.
    second = await shop.reschedule(me, done.id, c)
    assert second.slot_id == c and second.reschedule.count == 2 and second.reschedule.previous_slot_id == b
    await shop.check_reschedules([done.id])


async def test_staff_reschedule_any_booking_of_their_merchant(shop):
    a, b = await shop.new_slots(2)
    me = customer()
    done = await bought(shop, me, a)
    out = await shop.reschedule("e2e-staff", done.id, b, role="staff")
    assert out.slot_id == b and out.reschedule.rescheduled_by == "staff:e2e-staff"
    await shop.check_reschedules([done.id])


async def test_staff_never_move_a_booking_to_a_dearer_slot(shop):
    """Staff may not spend the customer's card: a dearer slot is refused before anything is held or
    charged (booking's holds and the PSP's ledger unchanged); the customer may, and pays the difference."""
    (a,), (dearer,) = await shop.new_slots(1), await shop.new_slots(1, price=90000)
    me = customer()
    done = await bought(shop, me, a)
    charges = len((await shop.ledger())["charges"])
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await shop.reschedule("e2e-staff", done.id, dearer, role="staff")
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and error_reason(e.value) == "reschedule-costs-more"
    assert "90000" in e.value.details() and "75000" in e.value.details()
    assert not await shop.db["booking"].fetchval("SELECT count(*) FROM holds WHERE slot_id = $1", uuid.UUID(dearer))
    assert len((await shop.ledger())["charges"]) == charges
    out = await shop.reschedule(me, done.id, dearer)
    assert out.slot_id == dearer and out.reschedule.payment_id
    assert len((await shop.ledger())["charges"]) == charges + 1
    await shop.check_reschedules([done.id])


ROUNDS = 6


async def live_holds(shop, slots: list[str]) -> dict[str, int]:
    """slot id -> live bookings on it (confirmed, or held and not expired), from booking's database.
    A race loser's offer (a short hold on the first alternative, `offered`) is no booking: the
    rival who lost B may be offered A as soon as the reschedule frees it."""
    return {r["slot_id"]: r["n"] for r in await shop.db["booking"].fetch(
        "SELECT slot_id::text, count(*) AS n FROM holds WHERE slot_id = ANY($1::uuid[]) AND (status = 'confirmed' "
        "OR (status = 'held' AND NOT offered AND expires_at > clock_timestamp())) GROUP BY slot_id", slots)}


async def test_a_reschedule_races_another_buyer_for_the_new_slot(shop):
    """Each round: a booking on slot A is rescheduled to B while another buyer takes B, at the same
    moment (separate connections, no ordering). The database decides: exactly one gets B; the loser
    of a reschedule keeps A and is told why with alternatives; afterwards each slot is held by
    exactly one live booking."""
    outcomes = []
    for _ in range(ROUNDS):
        a, b, _spare = await shop.new_slots(3)  # a free slot to offer the loser, at least
        me, rival = customer(), customer()
        done = await bought(shop, me, a)

        async def move():
            try:
                return await shop.reschedule(me, done.id, b)
            except grpc.aio.AioRpcError as e:
                return e

        async def take():
            try:
                return await shop.create(rival, slot=b)
            except grpc.aio.AioRpcError as e:
                return e

        moved, taken = await asyncio.gather(move(), take())
        rescheduled = isinstance(moved, pb.Checkout)
        assert rescheduled != isinstance(taken, pb.Checkout), (moved, taken)  # exactly one wins
        if rescheduled:
            assert moved.slot_id == b
            assert taken.code() == grpc.StatusCode.ALREADY_EXISTS
        else:
            assert moved.code() == grpc.StatusCode.ALREADY_EXISTS and error_reason(moved) == "slot-unavailable"
            detail = unpack_detail(moved, bpb.SlotUnavailable)
            # Free slots of the salon instead (booking prefers the same local date, so a spare of an
            # earlier round may come before this round's when this one's falls after midnight there).
            offered = [s.id for s in detail.alternatives] if detail is not None else []
            assert detail is not None and detail.slot_id == b and offered and not {a, b} & set(offered), offered
            assert await live_holds(shop, offered) == {}, "an offered slot is taken"
            mine = await shop.get(done.id, me)
            assert (mine.slot_id, mine.hold_id, name(mine.state)) == (a, done.hold_id, "COMPLETED")
            assert (mine.reschedule.status, mine.reschedule.failure_reason) == ("reverted", "slot-unavailable")
        live = await live_holds(shop, [a, b])
        assert live == ({b: 1} if rescheduled else {a: 1, b: 1}), live
        await shop.check_reschedules([done.id])
        outcomes.append(rescheduled)
    assert len(outcomes) == ROUNDS
