"""A COMPLETED booking cancelled after purchase, in process (real PostgreSQL, real
saga and payments core with its refunds, fake booking / code pool / PSP): the policy recorded at
purchase decides the refund with the database clock (one second either side of the cutoff, across a
DST change: elapsed hours), the fee rounded down, a 100 % fee, staff's full refund with a reason,
another merchant's staff NOT_FOUND, idempotent repeats, the slot bookable again, the appointment
started, codes, and a failing release finished by a worker without refunding twice."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from cuty.payments.v1 import checkout_pb2 as pb
from cutylib.errors import FailedPrecondition, InvalidArgument, NotFound
from cutylib.principal import Principal
from cutylib.testing.trust import TEST_MERCHANT
from cutylib.testing.procs import wait_for
from payments.checkout.domain import validate_create

C = "customer-" + uuid.uuid4().hex[:8]
STAFF = Principal("staff-7", "staff", TEST_MERCHANT)


async def db_now(h) -> datetime:
    return await h.pool.fetchval("SELECT clock_timestamp()")


async def purchase(h, *, price: int = 10_000, start: datetime | None = None, free_hours: int = 24,
                   fee_percent: int = 0, customer: str = C) -> pb.Checkout:
    slot = h.booking.add_slot(price=price, start=start, free_hours=free_hours, fee_percent=fee_percent)
    created = await h.service.create(customer, validate_create(slot, "", 0), "")
    paid = await h.service.pay(customer, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED
    return paid


async def purchase_before_cutoff(h, *, margin: float = 1.0, **kw) -> pb.Checkout:
    """A booking whose free cancellation ends `margin` seconds after the purchase finished (database
    clock). Buying takes time: if it took too much of the margin, buy again (a loaded machine)."""
    hours = kw.pop("free_hours", 24)
    for _ in range(5):
        t0 = await db_now(h)
        paid = await purchase(h, start=t0 + timedelta(hours=hours, seconds=margin), free_hours=hours, **kw)
        if (await db_now(h) - t0).total_seconds() < margin * 0.6:
            return paid
    pytest.fail("the machine is too slow to buy within the margin")


async def refunded_at_psp(h, checkout: pb.Checkout) -> int:
    intent = await h.pool.fetchval("SELECT psp_intent_id FROM payments WHERE id = $1", uuid.UUID(checkout.payment.id))
    return h.psp.refunded(intent)


async def test_the_checkout_answers_the_policy_recorded_at_purchase(harness):
    h = harness
    paid = await purchase(h, free_hours=48, fee_percent=30)
    assert (paid.free_cancellation_hours, paid.cancellation_fee_percent) == (48, 30)
    assert paid.start_time.ToDatetime(timezone.utc) - paid.free_cancellation_deadline.ToDatetime(timezone.utc) \
        == timedelta(hours=48)
    assert not paid.HasField("refund_amount")
    row = await h.row(paid.id)
    assert (row["free_cancellation_hours"], row["cancellation_fee_percent"]) == (48, 30)


async def test_one_second_before_the_cutoff_the_cancel_is_free(harness):
    h = harness
    paid = await purchase_before_cutoff(h, price=10_000, fee_percent=50)
    out = await h.service.cancel(C, paid.id)
    assert out.state == pb.CHECKOUT_STATE_CANCELLED_AFTER_PURCHASE
    assert (out.refund_amount.amount_minor, out.refund_amount.currency_code) == (10_000, "TRY")
    assert await refunded_at_psp(h, paid) == 10_000
    assert h.booking.status_of(paid.hold_id) == "HOLD_STATUS_RELEASED"
    assert out.payment.status  # the payment as it is now: refunded
    view = await h.core.get(paid.payment.id)
    assert view.status == "refunded"


async def test_one_second_after_the_cutoff_the_fee_is_kept(harness):
    h = harness
    t0 = await db_now(h)
    paid = await purchase(h, price=10_000, start=t0 + timedelta(hours=24, seconds=-1), free_hours=24, fee_percent=50)
    out = await h.service.cancel(C, paid.id)
    assert out.state == pb.CHECKOUT_STATE_CANCELLED_AFTER_PURCHASE
    assert out.refund_amount.amount_minor == 5_000
    assert await refunded_at_psp(h, paid) == 5_000
    assert (await h.core.get(paid.payment.id)).status == "partially_refunded"
    assert h.booking.status_of(paid.hold_id) == "HOLD_STATUS_RELEASED"


def _berlin_start_after_spring_forward(now: datetime, hours: int, seconds: float) -> tuple[datetime, int]:
    """A start on the day after Berlin's next spring-forward night whose cutoff (start - N elapsed
    hours) is `now + seconds`: N whole hours from now to about 10:00 local that day."""
    berlin = ZoneInfo("Europe/Berlin")
    year = now.year if now < datetime(now.year, 3, 25, tzinfo=timezone.utc) else now.year + 1
    # the last Sunday of March: clocks go from 02:00 to 03:00
    last = datetime(year, 3, 31)
    spring = last - timedelta(days=(last.weekday() + 1) % 7)
    target = datetime(spring.year, spring.month, spring.day, 10, 0, tzinfo=berlin) + timedelta(days=1)
    n = int((target - now).total_seconds() // 3600)
    return now + timedelta(hours=n, seconds=seconds), n


@pytest.mark.parametrize("seconds,free", [(1.5, True), (-1.0, False)])
async def test_across_a_dst_change_the_cutoff_is_elapsed_hours(harness, seconds, free):
    """A Berlin salon, the appointment the day after the clocks spring forward: the free
    cancellation ends N real hours before the start instant. Read as wall-clock hours, the cutoff
    would be one hour later (the night lost an hour), and the late cancel would be free."""
    h = harness
    for _ in range(5):
        t0 = await db_now(h)
        start, n = _berlin_start_after_spring_forward(t0, 0, seconds)
        local = start.astimezone(ZoneInfo("Europe/Berlin"))
        wall_clock_cutoff = (local.replace(tzinfo=None) - timedelta(hours=n)).replace(
            tzinfo=ZoneInfo("Europe/Berlin")).astimezone(timezone.utc)
        assert wall_clock_cutoff - (start - timedelta(hours=n)) == timedelta(hours=1)  # the DST change is in between
        assert n <= 8760
        paid = await purchase(h, price=12_345, start=start, free_hours=n, fee_percent=20)
        if not free or (await db_now(h) - t0).total_seconds() < seconds * 0.6:
            break
    out = await h.service.cancel(C, paid.id)
    assert out.state == pb.CHECKOUT_STATE_CANCELLED_AFTER_PURCHASE
    assert out.refund_amount.amount_minor == (12_345 if free else 12_345 * 80 // 100)


async def test_a_checkout_without_a_recorded_policy_shows_and_applies_the_default_cutoff(harness):
    """Bought before policies existed (no free_cancellation_hours): the deadline the checkout shows and
    the cutoff the cancel applies are both the default 24 hours before the start."""
    h = harness
    paid = await purchase(h, price=10_000, free_hours=24, fee_percent=50)
    start = await h.pool.fetchval("UPDATE checkouts SET free_cancellation_hours = NULL, "
                                  "start_time = clock_timestamp() + interval '23 hours' WHERE id = $1 "
                                  "RETURNING start_time", uuid.UUID(paid.id))
    shown = await h.service.get(Principal(C, "customer"), paid.id)
    assert shown.free_cancellation_deadline.ToDatetime(timezone.utc) == start - timedelta(hours=24)
    out = await h.service.cancel(C, paid.id)  # past that deadline: the fee is kept
    assert out.refund_amount.amount_minor == 5_000


async def test_the_fee_is_rounded_down_to_minor_units(harness):
    h = harness
    t0 = await db_now(h)
    paid = await purchase(h, price=9_999, start=t0 + timedelta(hours=1), free_hours=24, fee_percent=15)
    out = await h.service.cancel(C, paid.id)
    # 9999 * 85 % = 8499.15: the customer gets 8499, the merchant keeps 1500
    assert out.refund_amount.amount_minor == 8_499
    assert await refunded_at_psp(h, paid) == 8_499


async def test_a_100_percent_fee_refunds_nothing_but_cancels(harness):
    h = harness
    t0 = await db_now(h)
    paid = await purchase(h, price=7_000, start=t0 + timedelta(hours=2), free_hours=24, fee_percent=100)
    out = await h.service.cancel(C, paid.id)
    assert out.state == pb.CHECKOUT_STATE_CANCELLED_AFTER_PURCHASE
    assert out.refund_amount.amount_minor == 0
    assert await refunded_at_psp(h, paid) == 0
    assert await h.pool.fetchval("SELECT count(*) FROM refunds WHERE payment_id = $1",
                                 uuid.UUID(paid.payment.id)) == 0
    assert h.booking.status_of(paid.hold_id) == "HOLD_STATUS_RELEASED"


async def test_free_cancellation_policy_zero_hours_refunds_everything_until_the_start(harness):
    h = harness
    t0 = await db_now(h)
    paid = await purchase(h, price=5_000, start=t0 + timedelta(minutes=5), free_hours=0, fee_percent=100)
    out = await h.service.cancel(C, paid.id)
    assert out.refund_amount.amount_minor == 5_000


async def test_repeating_the_cancel_answers_the_cancelled_checkout_and_refunds_once(harness):
    h = harness
    paid = await purchase(h, price=10_000)
    first = await h.service.cancel(C, paid.id)
    again = await h.service.cancel(C, paid.id)
    assert again.state == first.state == pb.CHECKOUT_STATE_CANCELLED_AFTER_PURCHASE
    assert again.refund_amount == first.refund_amount
    assert await refunded_at_psp(h, paid) == 10_000 and len(h.psp.refunds) == 1
    assert h.booking.effects["cancel_booking"] == 1
    # The timeline: COMPLETED -> CANCELLING -> CANCELLED_AFTER_PURCHASE, once each.
    moves = await h.pool.fetch("SELECT from_status, to_status FROM payment_events WHERE checkout_id = $1 "
                               "AND source = 'saga' AND from_status IN ('COMPLETED', 'CANCELLING') ORDER BY seq",
                               uuid.UUID(paid.id))
    assert [(m["from_status"], m["to_status"]) for m in moves] == [
        ("COMPLETED", "CANCELLING"), ("CANCELLING", "CANCELLED_AFTER_PURCHASE")]


async def test_the_slot_is_bookable_again_after_the_cancel(harness):
    h = harness
    paid = await purchase(h)
    await h.service.cancel(C, paid.id)
    other = await h.service.create("someone-else", validate_create(paid.slot_id, "", 0), "")
    assert other.state == pb.CHECKOUT_STATE_HELD


async def test_a_started_appointment_is_not_cancelled(harness):
    h = harness
    t0 = await db_now(h)
    paid = await purchase(h, start=t0 - timedelta(minutes=1))
    with pytest.raises(FailedPrecondition) as e:
        await h.service.cancel(C, paid.id)
    assert e.value.reason == "appointment-started"
    assert (await h.row(paid.id))["state"] == "COMPLETED"


async def test_a_codes_purchase_is_not_cancelled_after_delivery(harness):
    h = harness
    product = h.codepool.add_product(price=2_500, stock=3)
    created = await h.service.create(C, validate_create("", product, 1), "")
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED
    with pytest.raises(FailedPrecondition) as e:
        await h.service.cancel(C, paid.id)
    assert e.value.reason == "codes-delivered"
    with pytest.raises(FailedPrecondition) as e:
        await h.service.cancel_by_staff(STAFF, paid.id, "no")
    assert e.value.reason == "codes-delivered"


async def test_another_customers_booking_is_not_found(harness):
    h = harness
    paid = await purchase(h)
    with pytest.raises(NotFound):
        await h.service.cancel("intruder", paid.id)


async def test_staff_cancel_with_a_full_refund_and_a_reason(harness):
    h = harness
    t0 = await db_now(h)
    # Past the cutoff with a 100 % fee: staff still refund everything.
    paid = await purchase(h, price=8_000, start=t0 + timedelta(hours=1), free_hours=24, fee_percent=100)
    out = await h.service.cancel_by_staff(STAFF, paid.id, "  stylist is ill  ")
    assert out.state == pb.CHECKOUT_STATE_CANCELLED_AFTER_PURCHASE
    assert out.refund_amount.amount_minor == 8_000
    assert (out.cancelled_by, out.cancel_reason) == ("staff:staff-7", "stylist is ill")
    assert await refunded_at_psp(h, paid) == 8_000
    refund = await h.pool.fetchrow("SELECT reason, requested_by FROM refunds WHERE payment_id = $1",
                                   uuid.UUID(paid.payment.id))
    assert (refund["reason"], refund["requested_by"]) == ("stylist is ill", "staff:staff-7")
    # The customer sees it cancelled, with the refund; a repeat by staff is the same answer.
    mine = await h.service.get(Principal(C, "customer"), paid.id)
    assert mine.state == pb.CHECKOUT_STATE_CANCELLED_AFTER_PURCHASE and mine.refund_amount.amount_minor == 8_000
    again = await h.service.cancel_by_staff(STAFF, paid.id, "stylist is ill")
    assert again.refund_amount.amount_minor == 8_000 and len(h.psp.refunds) == 1


async def test_staff_need_a_reason_and_their_own_merchants_booking(harness):
    h = harness
    paid = await purchase(h)
    with pytest.raises(InvalidArgument) as e:
        await h.service.cancel_by_staff(STAFF, paid.id, "   ")
    assert e.value.field == "reason"
    with pytest.raises(NotFound):
        await h.service.cancel_by_staff(Principal("staff-x", "staff", "merchant-other"), paid.id, "mine now")
    assert (await h.row(paid.id))["state"] == "COMPLETED"


async def test_staff_refund_before_the_cancel_is_not_refunded_twice(harness):
    """What the merchant refunded already is not refunded again: the cancel refunds what is left."""
    h = harness
    paid = await purchase(h, price=10_000)
    await h.core.issue_refund(TEST_MERCHANT, paid.payment.id, "goodwill", amount_minor=3_000, currency=None,
                              reason="goodwill", actor="staff:staff-7", codes_delivered_ok=False)
    out = await h.service.cancel(C, paid.id)
    assert out.refund_amount.amount_minor == 7_000
    assert (await h.core.get(paid.payment.id)).status == "refunded"


async def test_a_failing_release_after_the_refund_is_finished_by_a_worker(harness):
    """The refund went through, then booking did not answer: the worker repeats the step; the
    refund is a replay of its key (nothing refunded twice) and the release finishes."""
    h = harness
    paid = await purchase(h, price=10_000)
    h.booking.fail_next["CancelBooking"] = ["UNAVAILABLE", "DEADLINE_EXCEEDED_AFTER"]
    out = await h.service.cancel(C, paid.id)
    assert out.state == pb.CHECKOUT_STATE_CANCELLING
    assert out.refund_amount.amount_minor == 10_000
    h.start_workers(1)

    async def done():
        return (await h.row(paid.id))["state"] == "CANCELLED_AFTER_PURCHASE"
    await wait_for(done, timeout=15, message="the cancel finished by a worker")
    assert await refunded_at_psp(h, paid) == 10_000 and len(h.psp.refunds) == 1
    assert h.booking.effects["cancel_booking"] == 1
    assert h.booking.status_of(paid.hold_id) == "HOLD_STATUS_RELEASED"
    again = await h.service.cancel(C, paid.id)
    assert again.state == pb.CHECKOUT_STATE_CANCELLED_AFTER_PURCHASE


async def test_a_cancel_that_keeps_failing_needs_attention_and_an_operator_retries_it(make_harness):
    """Booking keeps refusing the release (an unexpected answer): after the attempts allowed the
    saga waits in NEEDS_ATTENTION (from CANCELLING), the refund done once; an operator's retry
    puts it back to CANCELLING and it finishes."""
    h = make_harness(max_attempts=2)
    paid = await purchase(h, price=10_000)
    h.booking.fail_next["CancelBooking"] = ["FAILED_PRECONDITION", "FAILED_PRECONDITION"]
    out = await h.service.cancel(C, paid.id)
    assert out.state == pb.CHECKOUT_STATE_CANCELLING
    h.start_workers(1)

    async def attention():
        row = await h.row(paid.id)
        return row["state"] == "NEEDS_ATTENTION" and row["attention_from"] == "CANCELLING"
    await wait_for(attention, timeout=15, message="NEEDS_ATTENTION from CANCELLING")
    assert await refunded_at_psp(h, paid) == 10_000
    # The customer's repeat answers where it stands.
    assert (await h.service.cancel(C, paid.id)).state == pb.CHECKOUT_STATE_NEEDS_ATTENTION
    back = await h.service.retry(Principal("op-1", "operator"), "ops:op-1", paid.id)
    assert back.state in (pb.CHECKOUT_STATE_CANCELLING, pb.CHECKOUT_STATE_CANCELLED_AFTER_PURCHASE)

    async def done():
        return (await h.row(paid.id))["state"] == "CANCELLED_AFTER_PURCHASE"
    await wait_for(done, timeout=15, message="the retried cancel finished")
    assert await refunded_at_psp(h, paid) == 10_000 and len(h.psp.refunds) == 1
    assert h.booking.status_of(paid.hold_id) == "HOLD_STATUS_RELEASED"


async def test_a_cancel_after_purchase_is_an_outbound_booking_cancelled_event(harness):
    """The state change writes `booking.cancelled` for the merchant
    (trigger checkouts_merchant_events), with the refund amount and the reason, beside the purchase's own events."""
    h = harness
    start = await db_now(h) + timedelta(hours=2)  # past its 24 hours of free cancellation: a 25 % fee
    paid = await purchase(h, price=20_000, start=start, free_hours=24, fee_percent=25)
    await h.service.cancel(C, paid.id)
    events = await h.pool.fetch("SELECT type, merchant_id, payload FROM merchant_events WHERE checkout_id = $1 "
                                "ORDER BY created_at", uuid.UUID(paid.id))
    assert [e["type"] for e in events] == ["checkout.completed", "booking.confirmed", "booking.cancelled"]
    cancelled = events[-1]
    payload = cancelled["payload"] if isinstance(cancelled["payload"], dict) else __import__("json").loads(
        cancelled["payload"])
    assert cancelled["merchant_id"] == TEST_MERCHANT
    checkout = payload["data"]["checkout"]
    assert checkout["state"] == "CANCELLED_AFTER_PURCHASE"
    assert checkout["refund_amount"] == {"amount_minor": 15_000, "currency_code": "TRY"}
