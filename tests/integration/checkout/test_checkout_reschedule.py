"""In process (real PostgreSQL, the real saga, engine and workers, fake booking and
PSP): a reschedule whose step keeps failing goes to NEEDS_ATTENTION like the other finishing steps
(both bookings kept meanwhile, the money moved once) and an operator's retry finishes it; a step
that fails once is finished by a worker with the same keys; a charge the PSP has not settled yet
waits for the payment's wake-up, and is undone (its intent cancelled, the new hold released) when the
new hold runs out first; a card asking for 3-D Secure undoes the reschedule at once."""
from __future__ import annotations

import uuid

import pytest

from cuty.payments.v1 import checkout_pb2 as pb
from cutylib import errors
from cutylib.principal import Principal
from cutylib.testing.trust import TEST_MERCHANT
from cutylib.testing.procs import wait_for
from payments.checkout.domain import validate_create
from payments.checkout.idempotency import Replay

C = "customer-" + uuid.uuid4().hex[:8]
ME = Principal(C, "customer")


async def purchase(h, price: int = 10_000) -> pb.Checkout:
    slot = h.booking.add_slot(price=price)
    created = await h.service.create(C, validate_create(slot, "", 0), "")
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED
    return paid


async def state_of(h, checkout_id: str) -> str:
    return (await h.row(checkout_id))["state"]


async def test_a_release_that_keeps_failing_needs_attention_and_an_operator_retries_it(make_harness):
    h = make_harness(max_attempts=2)
    paid = await purchase(h)
    new = h.booking.add_slot(price=10_000)
    h.booking.fail_next["CancelBooking"] = ["FAILED_PRECONDITION", "FAILED_PRECONDITION"]
    out = await h.service.reschedule(ME, paid.id, new, "", "")
    assert out.state == pb.CHECKOUT_STATE_RESCHEDULE_CONFIRMING
    h.start_workers(1)

    async def attention():
        row = await h.row(paid.id)
        return row["state"] == "NEEDS_ATTENTION" and row["attention_from"] == "RESCHEDULE_CONFIRMING"
    await wait_for(attention, timeout=15, message="NEEDS_ATTENTION from RESCHEDULE_CONFIRMING")
    # Meanwhile both are kept (never both lost): the new one confirmed, the old one not yet released.
    row = await h.row(paid.id)
    assert h.booking.status_of(row["reschedule_hold_id"]) == "HOLD_STATUS_CONFIRMED"
    assert h.booking.status_of(paid.hold_id) == "HOLD_STATUS_CONFIRMED"
    await h.service.retry(Principal("op-1", "operator"), "ops:op-1", paid.id)

    async def done():
        return await state_of(h, paid.id) == "COMPLETED"
    await wait_for(done, timeout=15, message="the retried reschedule finished")
    row = await h.row(paid.id)
    assert (str(row["slot_id"]), row["reschedule_status"]) == (new, "rescheduled")
    assert h.booking.status_of(paid.hold_id) == "HOLD_STATUS_RELEASED"
    assert h.booking.status_of(row["hold_id"]) == "HOLD_STATUS_CONFIRMED"
    assert h.booking.effects["cancel_booking"] == 1 and not h.psp.refunds


async def test_a_step_that_fails_once_is_finished_by_a_worker_with_the_same_keys(make_harness):
    h = make_harness()
    paid = await purchase(h)
    new = h.booking.add_slot(price=12_500)
    # The charge reaches the PSP, the answer is lost: the worker asks again with the same key.
    h.booking.fail_next["ConfirmHold"] = ["DEADLINE_EXCEEDED_AFTER"]
    out = await h.service.reschedule(ME, paid.id, new, "", "")
    assert out.state == pb.CHECKOUT_STATE_RESCHEDULE_CONFIRMING
    h.start_workers(2)

    async def done():
        return await state_of(h, paid.id) == "COMPLETED"
    await wait_for(done, timeout=15, message="the reschedule finished by a worker")
    row = await h.row(paid.id)
    assert (str(row["slot_id"]), row["amount_minor"]) == (new, 12_500)
    assert h.booking.effects["confirm"] == 2  # the purchase's and the new hold's, each once
    assert len(h.psp.charges) == 2 and set(h.psp.charges.values()) == {1}
    amounts = [r["amount_minor"] for r in await h.pool.fetch(
        "SELECT amount_minor FROM payments WHERE checkout_id = $1 ORDER BY amount_minor", uuid.UUID(paid.id))]
    assert amounts == [2_500, 10_000]


async def test_a_difference_in_flight_waits_for_its_payment_to_settle(make_harness):
    """The PSP has not answered the difference's charge yet (no webhook yet): the saga sleeps in
    RESCHEDULING; when the payment settles (finalize, as the webhook or reconciliation would) the
    database wakes it (trigger payments_wake_checkout, function checkouts_wake_on_payment) and a worker confirms."""
    h = make_harness()
    paid = await purchase(h)
    new = h.booking.add_slot(price=12_500)
    out = await h.service.reschedule(ME, paid.id, new, "pm_card_no_webhook", "")
    assert out.state == pb.CHECKOUT_STATE_RESCHEDULING and out.reschedule.payment_id
    row = await h.row(paid.id)
    assert row["lease_owner"] is None and str(row["payment_id"]) == paid.payment.id  # asleep; its payment kept
    h.start_workers(1)
    await h.core.finalize(out.reschedule.payment_id, "succeeded", "webhook")

    async def done():
        return await state_of(h, paid.id) == "COMPLETED"
    await wait_for(done, timeout=15, message="the woken reschedule finished")
    row = await h.row(paid.id)
    assert (str(row["slot_id"]), row["reschedule_status"], str(row["payment_id"])) == (new, "rescheduled", paid.payment.id)


async def test_a_difference_asking_for_3ds_is_undone(make_harness):
    h = make_harness()
    paid = await purchase(h)
    new = h.booking.add_slot(price=12_500)
    out = await h.service.reschedule(ME, paid.id, new, "pm_card_3ds", "")
    # A card that asks for 3-D Secure cannot pay a difference without the customer: undone.
    assert out.state == pb.CHECKOUT_STATE_COMPLETED and out.slot_id == paid.slot_id
    assert (out.reschedule.status, out.reschedule.failure_reason) == ("reverted", "payment-requires-action")
    row = await h.row(paid.id)
    assert h.booking.status_of(row["reschedule_hold_id"]) == "HOLD_STATUS_RELEASED"
    assert h.booking.status_of(paid.hold_id) == "HOLD_STATUS_CONFIRMED"


async def test_a_new_hold_that_runs_out_while_the_difference_is_unpaid_is_undone(make_harness):
    h = make_harness()
    paid = await purchase(h)
    new = h.booking.add_slot(price=12_500)
    out = await h.service.reschedule(ME, paid.id, new, "pm_card_no_webhook", "")
    assert out.state == pb.CHECKOUT_STATE_RESCHEDULING
    # Time passes: the new hold's five minutes are over (the row's copy of its expiry, which the
    # saga sleeps until; the state and version are untouched).
    await h.pool.execute("UPDATE checkouts SET reschedule_expire_time = clock_timestamp(), "
                         "next_run_at = clock_timestamp() WHERE id = $1", uuid.UUID(paid.id))
    h.start_workers(1)

    async def undone():
        return await state_of(h, paid.id) == "COMPLETED"
    await wait_for(undone, timeout=15, message="the abandoned reschedule undone")
    row = await h.row(paid.id)
    assert (row["reschedule_status"], row["reschedule_failure"]) == ("reverted", "hold-expired-unpaid")
    assert str(row["slot_id"]) == paid.slot_id
    assert (await h.core.get(out.reschedule.payment_id)).status == "canceled"
    assert h.booking.status_of(row["reschedule_hold_id"]) == "HOLD_STATUS_RELEASED"
    assert h.booking.status_of(paid.hold_id) == "HOLD_STATUS_CONFIRMED"


# -- who may spend the customer's card ----------------------------------------------------------------
STAFF = Principal("staff-1", "staff", TEST_MERCHANT)
ADMIN = Principal("admin-1", "admin", TEST_MERCHANT)


@pytest.mark.parametrize("who", [STAFF, ADMIN], ids=["staff", "admin"])
async def test_staff_cannot_move_a_booking_to_a_dearer_slot_and_nothing_changes(make_harness, who):
    """The salon's staff may move a booking, not spend its customer's card: a dearer slot is refused
    (FAILED_PRECONDITION naming the price) before anything is held or charged."""
    h = make_harness()
    paid = await purchase(h, price=10_000)
    before = dict(await h.row(paid.id))
    dearer = h.booking.add_slot(price=10_001)
    with pytest.raises(errors.FailedPrecondition) as e:
        await h.service.reschedule(who, paid.id, dearer, "", "")
    assert e.value.reason == "reschedule-costs-more"
    assert "10001" in e.value.message and "10000" in e.value.message
    # nothing changed: the row, no hold on the new slot, no new payment, one charge at the PSP (the purchase)
    assert dict(await h.row(paid.id)) == before
    assert [x for x in h.booking.holds.values() if x["slot_id"] == dearer] == []
    assert await h.pool.fetchval("SELECT count(*) FROM payments WHERE checkout_id = $1", uuid.UUID(paid.id)) == 1
    assert sum(h.psp.charges.values()) == 1 and not h.psp.refunds
    # not even with a payment method of the staff's choosing
    with pytest.raises(errors.FailedPrecondition):
        await h.service.reschedule(who, paid.id, dearer, "pm_card_ok", "")
    assert sum(h.psp.charges.values()) == 1


async def test_staff_move_a_booking_to_a_cheaper_slot_and_the_difference_is_refunded(make_harness):
    h = make_harness()
    paid = await purchase(h, price=10_000)
    cheaper = h.booking.add_slot(price=7_500)
    out = await h.service.reschedule(STAFF, paid.id, cheaper, "", "")
    assert out.state == pb.CHECKOUT_STATE_COMPLETED and out.slot_id == cheaper
    assert out.reschedule.rescheduled_by == "staff:staff-1"
    assert [r["amount"] for r in h.psp.refunds.values()] == [2_500] and sum(h.psp.charges.values()) == 1
    same = h.booking.add_slot(price=7_500)  # the same price: nothing charged, nothing refunded
    out = await h.service.reschedule(ADMIN, paid.id, same, "", "")
    assert out.slot_id == same and len(h.psp.refunds) == 1 and sum(h.psp.charges.values()) == 1


async def test_the_customer_moving_their_own_booking_to_a_dearer_slot_is_charged(make_harness):
    h = make_harness()
    paid = await purchase(h, price=10_000)
    dearer = h.booking.add_slot(price=12_000)
    out = await h.service.reschedule(ME, paid.id, dearer, "", "")
    assert out.state == pb.CHECKOUT_STATE_COMPLETED and out.slot_id == dearer and out.reschedule.payment_id
    assert sum(h.psp.charges.values()) == 2
    assert (await h.core.get(out.reschedule.payment_id)).amount_minor == 2_000


async def test_a_charge_for_a_reschedule_the_customer_did_not_start_is_never_made(make_harness):
    """Behind the request's check, the step that would charge applies the same rule: a staff
    reschedule that reaches it with a price increase (the slot's price read before the hold, the
    hold's price higher) is undone, its new hold released, nothing charged."""
    h = make_harness()
    paid = await purchase(h, price=10_000)
    slot = h.booking.add_slot(price=10_000)
    real_get_slot = h.booking.GetSlot

    async def get_slot_then_raise_the_price(req, timeout=None):
        answer = await real_get_slot(req, timeout)
        h.booking.slots[slot] = 15_000  # the price changes between the check and the hold
        return answer
    h.booking.GetSlot = get_slot_then_raise_the_price
    out = await h.service.reschedule(STAFF, paid.id, slot, "", "")
    assert out.state == pb.CHECKOUT_STATE_COMPLETED and out.slot_id == paid.slot_id
    assert (out.reschedule.status, out.reschedule.failure_reason) == ("reverted", "reschedule-costs-more")
    row = await h.row(paid.id)
    assert h.booking.status_of(row["reschedule_hold_id"]) == "HOLD_STATUS_RELEASED"
    assert sum(h.psp.charges.values()) == 1 and row["reschedule_payment_id"] is None


# -- a replay is authorised first, and its key is the principal's own -----------------------------------
async def test_a_replayed_reschedule_is_authorised_before_its_stored_answer_is_returned(make_harness):
    """The Idempotency-Key of a reschedule belongs to who sent it: the same subject as staff of another
    merchant is refused as a stranger (NOT_FOUND) even with the key and the request of the first, and
    the same subject in another role of the merchant is refused as a reuse, never given the answer."""
    h = make_harness()
    paid = await purchase(h, price=10_000)
    cheaper = h.booking.add_slot(price=9_000)
    first = await h.service.reschedule(STAFF, paid.id, cheaper, "", "key-1")
    assert first.slot_id == cheaper
    with pytest.raises(Replay) as replayed:  # the sender's own retry: the first answer, unchanged
        await h.service.reschedule(STAFF, paid.id, cheaper, "", "key-1")
    assert pb.Checkout.FromString(replayed.value.response) == first
    elsewhere = Principal(STAFF.subject, "staff", "merchant-elsewhere")
    with pytest.raises(errors.NotFound):
        await h.service.reschedule(elsewhere, paid.id, cheaper, "", "key-1")
    as_admin = Principal(STAFF.subject, "admin", TEST_MERCHANT)
    with pytest.raises(errors.InvalidArgument) as e:
        await h.service.reschedule(as_admin, paid.id, cheaper, "", "key-1")
    assert e.value.reason == "idempotency-key-reused"
    # and the customer's own key is theirs: staff sending it are not given the customer's answer
    back = h.booking.add_slot(price=9_000)
    mine = await h.service.reschedule(ME, paid.id, back, "", "key-2")
    assert mine.slot_id == back
    with pytest.raises(errors.InvalidArgument):
        await h.service.reschedule(Principal(C, "staff", TEST_MERCHANT), paid.id, back, "", "key-2")
    assert sum(h.psp.charges.values()) == 1
