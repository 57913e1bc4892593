"""The saga's paths through the real engine and database, with fake booking / code pool / PSP."""
from __future__ import annotations

import uuid

import pytest

from cuty.payments.v1 import checkout_pb2 as pb
from cuty.payments.v1.payments_pb2 import PAYMENT_STATUS_SUCCEEDED
from cutylib import errors
from cutylib.principal import SYSTEM, Principal
from cutylib.testing.procs import wait_for
from payments.checkout import metrics as m
from payments.checkout.domain import validate_create
from cutylib.testing.trust import TEST_MERCHANT

C = "customer-" + uuid.uuid4().hex[:8]


def booking_req(h):
    return validate_create(h.booking.add_slot(price=12345), "", 0)


async def timeline(h, checkout_id):
    rows = await h.pool.fetch("SELECT from_status, to_status, source, payment_id FROM payment_events "
                              "WHERE checkout_id = $1 AND source = 'saga' ORDER BY seq", checkout_id)
    return [(r["from_status"], r["to_status"]) for r in rows]


async def state(h, checkout_id):
    return (await h.row(checkout_id))["state"]


async def test_a_hold_with_more_than_the_pay_window_left_is_charged_without_an_extension(make_harness):
    """PayCheckout extends the hold only when less than the pay window is left of it; a
    buyer paying early costs no ExtendHold call, and the hold keeps its own expiry."""
    h = make_harness(hold_ttl=300, pay_window_seconds=120)
    created = await h.service.create(C, booking_req(h), "")
    expires = h.booking.holds[created.hold_id]["expire"]
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED
    assert dict(h.booking.effects) == {"hold": 1, "confirm": 1}
    hold = h.booking.holds[created.hold_id]
    assert hold["status"] == "confirmed" and not hold["extended"] and hold["expire"] == expires


async def test_a_hold_with_less_than_the_pay_window_left_is_extended_before_the_charge(make_harness):
    h = make_harness(hold_ttl=60, pay_window_seconds=120)
    created = await h.service.create(C, booking_req(h), "")
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED
    assert dict(h.booking.effects) == {"hold": 1, "extend": 1, "confirm": 1}
    assert h.booking.holds[created.hold_id]["extended"]


async def test_booking_happy_path_completes_inside_pay(harness):
    h = harness
    created = await h.service.create(C, booking_req(h), "")
    assert created.state == pb.CHECKOUT_STATE_HELD
    assert created.amount.amount_minor == 12345 and created.amount.currency_code == "TRY"
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED
    assert paid.payment.status == PAYMENT_STATUS_SUCCEEDED and not paid.payment.client_secret and not paid.payment.next_action.redirect_url
    hold = h.booking.holds[created.hold_id]
    assert hold["status"] == "confirmed" and hold["extended"]
    assert hold["payment_ref"] == paid.payment.id
    assert dict(h.booking.effects) == {"hold": 1, "extend": 1, "confirm": 1}
    assert list(h.psp.charges.values()) == [1]
    # The synchronous capture is recorded with the confirm: CHARGING -> COMPLETED.
    assert await timeline(h, created.id) == [("PENDING", "HELD"), ("HELD", "CHARGING"), ("CHARGING", "COMPLETED")]
    row = await h.row(created.id)
    assert row["next_run_at"] is None and row["lease_owner"] is None


async def test_codes_happy_path_and_codes_only_for_the_owner(harness):
    h = harness
    pid = h.codepool.add_product(price=2500, stock=5)
    created = await h.service.create(C, validate_create("", pid, 3), "")
    assert created.amount.amount_minor == 7500 and created.order_id == created.id
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED
    assert h.codepool.orders[created.id]["status"] == "delivered"
    assert h.codepool.effects == {"reserve": 1, "deliver": 1}
    from cutylib.principal import Principal

    mine = await h.service.get(Principal(C, "customer"), created.id)
    assert [c.value for c in mine.codes] == h.codepool.orders[created.id]["codes"]
    staff = await h.service.get(Principal("staff-1", "staff", TEST_MERCHANT), created.id)
    assert staff.state == pb.CHECKOUT_STATE_COMPLETED and not staff.codes
    with pytest.raises(errors.NotFound):
        await h.service.get(Principal("intruder", "customer"), created.id)


async def test_declined_card_releases_the_hold_and_fails(harness):
    h = harness
    created = await h.service.create(C, booking_req(h), "")
    paid = await h.service.pay(C, created.id, "pm_card_declined", "")
    assert paid.state == pb.CHECKOUT_STATE_FAILED
    assert paid.failure_reason == "payment-failed"
    assert h.booking.holds[created.hold_id]["status"] == "released"
    assert await timeline(h, created.id) == [
        ("PENDING", "HELD"), ("HELD", "CHARGING"), ("CHARGING", "RELEASING"), ("RELEASING", "FAILED")]


async def test_slot_taken_is_rejected_with_alternatives(harness):
    h = harness
    req = booking_req(h)
    h.booking.take(req.slot_id)
    with pytest.raises(errors.AlreadyExists) as e:
        await h.service.create(C, req, "")
    assert e.value.reason == "slot-unavailable" and len(e.value.detail.alternatives) == 1
    n = await h.pool.fetchval("SELECT count(*) FROM checkouts WHERE slot_id = $1 AND state = 'REJECTED'",
                              uuid.UUID(req.slot_id))
    assert n == 1


async def test_out_of_stock_is_rejected_with_the_available_count(harness):
    h = harness
    pid = h.codepool.add_product(stock=2)
    with pytest.raises(errors.ResourceExhausted) as e:
        await h.service.create(C, validate_create("", pid, 3), "")
    assert e.value.reason == "out-of-stock" and e.value.detail.available == 2


async def test_unknown_slot_changes_nothing(harness):
    h = harness
    before = await h.pool.fetchval("SELECT count(*) FROM checkouts")
    with pytest.raises(errors.NotFound):
        await h.service.create(C, validate_create(str(uuid.uuid4()), "", 0), "")
    assert await h.pool.fetchval("SELECT count(*) FROM checkouts") == before


async def test_pay_refusals_change_nothing(harness):
    h = harness
    created = await h.service.create(C, booking_req(h), "")
    with pytest.raises(errors.NotFound):
        await h.service.pay("someone-else", created.id, "pm_card_ok", "")
    with pytest.raises(errors.NotFound):
        await h.service.pay(C, str(uuid.uuid4()), "pm_card_ok", "")
    with pytest.raises(errors.InvalidArgument):
        await h.service.pay(C, "nope", "pm_card_ok", "")
    with pytest.raises(errors.InvalidArgument):
        await h.service.pay(C, created.id, "", "")
    assert await state(h, created.id) == "HELD"
    await h.service.pay(C, created.id, "pm_card_ok", "")
    with pytest.raises(errors.FailedPrecondition) as e:
        await h.service.pay(C, created.id, "pm_card_ok", "")
    assert e.value.reason == "checkout-not-held"
    assert list(h.psp.charges.values()) == [1]


async def test_three_ds_waits_then_completes_when_the_webhook_arrives(harness):
    h = harness
    h.start_workers(1)
    created = await h.service.create(C, booking_req(h), "")
    paid = await h.service.pay(C, created.id, "pm_card_3ds", "")
    assert paid.state == pb.CHECKOUT_STATE_AWAITING_ACTION
    assert paid.payment.next_action.redirect_url.startswith("https://psp.example/3ds/")
    assert paid.payment.client_secret
    from cutylib.principal import Principal

    staff = await h.service.get(Principal("staff-1", "staff", TEST_MERCHANT), created.id)
    assert staff.state == pb.CHECKOUT_STATE_AWAITING_ACTION and staff.payment.id == paid.payment.id
    assert not staff.payment.HasField("next_action") and not staff.payment.client_secret  # the buyer's only
    pi = (await h.core.get(paid.payment.id)).psp_intent_id
    # The customer completes 3-D Secure; the PSP's webhook reaches finalize (whose hook wakes the saga).
    await h.core.finalize(paid.payment.id, "succeeded", "webhook", intent=h.psp.set_status(pi))
    await wait_for(lambda: _is(h, created.id, "COMPLETED"), timeout=5, message="COMPLETED after webhook")
    done = await h.service.get(Principal(C, "customer"), created.id)
    assert not done.payment.next_action.redirect_url and not done.payment.client_secret
    assert h.booking.effects["confirm"] == 1


async def _is(h, checkout_id, expected):
    return await state(h, checkout_id) == expected


async def test_unpaid_hold_expires_and_is_released(make_harness):
    h = make_harness(hold_ttl=0.3)
    h.start_workers(1)
    created = await h.service.create(C, booking_req(h), "")
    await wait_for(lambda: _is(h, created.id, "EXPIRED"), timeout=5, message="EXPIRED")
    assert h.booking.holds[created.hold_id]["status"] == "released"
    assert await timeline(h, created.id) == [("PENDING", "HELD"), ("HELD", "RELEASING"), ("RELEASING", "EXPIRED")]


async def test_three_ds_unpaid_past_expiry_cancels_the_intent(make_harness):
    h = make_harness()
    h.start_workers(1)
    created = await h.service.create(C, booking_req(h), "")
    paid = await h.service.pay(C, created.id, "pm_card_3ds", "")
    assert paid.state == pb.CHECKOUT_STATE_AWAITING_ACTION
    await h.pool.execute("UPDATE checkouts SET expire_time = clock_timestamp(), next_run_at = clock_timestamp() "
                         "WHERE id = $1", uuid.UUID(created.id))
    await wait_for(lambda: _is(h, created.id, "EXPIRED"), timeout=5, message="EXPIRED")
    assert (await h.core.get(paid.payment.id)).status == "canceled"
    assert h.booking.holds[created.hold_id]["status"] == "released"


@pytest.mark.parametrize("slot_taken,final", [(True, "REFUNDED"), (False, "COMPLETED")])
async def test_late_capture(make_harness, slot_taken, final):
    """3-D Secure completed after the hold ran out: the saga cancels, the PSP says it already
    succeeded; a still-free slot is re-held and confirmed, a taken one is refunded at once."""
    h = make_harness()
    h.start_workers(1)
    created = await h.service.create(C, booking_req(h), "")
    paid = await h.service.pay(C, created.id, "pm_card_3ds", "")
    pi = (await h.core.get(paid.payment.id)).psp_intent_id
    h.booking.expire(created.hold_id)
    if slot_taken:
        h.booking.take(created.slot_id)
    h.psp.set_status(pi)  # captured at the PSP; its webhook is late
    await h.pool.execute("UPDATE checkouts SET expire_time = clock_timestamp(), next_run_at = clock_timestamp() "
                         "WHERE id = $1", uuid.UUID(created.id))
    await wait_for(lambda: _is(h, created.id, final), timeout=5, message=final)
    payment = await h.core.get(paid.payment.id)
    if slot_taken:
        assert payment.status == "refunded" and len(h.psp.refunds) == 1
        assert h.booking.holds[created.hold_id]["status"] != "confirmed"
    else:
        assert payment.status == "succeeded" and not h.psp.refunds
        assert h.booking.effects["re-hold"] == 1 and h.booking.holds[created.hold_id]["status"] == "confirmed"
    steps = await timeline(h, created.id)
    assert ("AWAITING_ACTION", "RELEASING") in steps and ("RELEASING", "CONFIRMING") in steps


async def test_a_payment_landing_after_the_slot_started_is_refunded(harness):
    """Booking refuses to confirm a started appointment (slot-started); the saga
    takes its hold-lost path and refunds the captured payment."""
    h = harness
    created = await h.service.create(C, booking_req(h), "")
    h.booking.started.add(created.slot_id)
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    if paid.state != pb.CHECKOUT_STATE_REFUNDED:
        await wait_for(lambda: _is(h, created.id, "REFUNDED"), timeout=5, message="REFUNDED")
    assert (await h.core.get(paid.payment.id)).status == "refunded" and len(h.psp.refunds) == 1
    assert h.booking.holds[created.hold_id]["status"] != "confirmed"
    assert ("CONFIRMING", "REFUNDING") in await timeline(h, created.id)


async def test_cancel_releases_and_is_idempotent(harness):
    h = harness
    created = await h.service.create(C, booking_req(h), "")
    out = await h.service.cancel(C, created.id)
    assert out.state == pb.CHECKOUT_STATE_CANCELLED
    assert h.booking.holds[created.hold_id]["status"] == "released"
    again = await h.service.cancel(C, created.id)
    assert again.state == pb.CHECKOUT_STATE_CANCELLED and h.booking.effects["release"] == 1
    with pytest.raises(errors.NotFound):
        await h.service.cancel("someone-else", created.id)


async def test_cancel_during_three_ds_cancels_the_intent(harness):
    h = harness
    created = await h.service.create(C, booking_req(h), "")
    paid = await h.service.pay(C, created.id, "pm_card_3ds", "")
    out = await h.service.cancel(C, created.id)
    assert out.state == pb.CHECKOUT_STATE_CANCELLED
    assert (await h.core.get(paid.payment.id)).status == "canceled"


async def test_cancel_after_capture_refunds(harness):
    """The customer cancels while the PSP already captured (webhook not yet in): refund, not keep."""
    h = harness
    created = await h.service.create(C, booking_req(h), "")
    paid = await h.service.pay(C, created.id, "pm_card_3ds", "")
    h.psp.set_status((await h.core.get(paid.payment.id)).psp_intent_id)
    out = await h.service.cancel(C, created.id)
    assert out.state == pb.CHECKOUT_STATE_REFUNDED
    assert h.booking.holds[created.hold_id]["status"] == "released"
    assert len(h.psp.refunds) == 1


async def test_completed_codes_cannot_be_cancelled(harness):
    """A completed code purchase is delivered: not cancelled (a completed booking is cancelled
    after purchase, test_checkout_cancel_after_purchase.py)."""
    h = harness
    created = await h.service.create(C, validate_create("", h.codepool.add_product(), 1), "")
    await h.service.pay(C, created.id, "pm_card_ok", "")
    with pytest.raises(errors.FailedPrecondition) as e:
        await h.service.cancel(C, created.id)
    assert e.value.reason == "codes-delivered"


@pytest.mark.parametrize("mode", ["UNAVAILABLE", "DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED_AFTER"])
async def test_confirm_retried_after_transient_failure_takes_effect_once(harness, mode):
    h = harness
    h.start_workers(1)
    created = await h.service.create(C, booking_req(h), "")
    h.booking.fail_next["ConfirmHold"] = [mode, mode]
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_CONFIRMING  # the step failed, a worker retries it
    await wait_for(lambda: _is(h, created.id, "COMPLETED"), timeout=5, message="COMPLETED after retries")
    assert h.booking.calls["ConfirmHold"] == 3 and h.booking.effects["confirm"] == 1
    row = await h.row(created.id)
    assert row["attempts"] == 0  # reset by the transition


async def test_hold_unavailable_leaves_pending_that_a_worker_finishes(harness):
    h = harness
    req = booking_req(h)
    h.booking.fail_next["HoldSlot"] = ["DEADLINE_EXCEEDED_AFTER"]
    with pytest.raises(errors.Unavailable):
        await h.service.create(C, req, "")
    row = await h.pool.fetchrow("SELECT * FROM checkouts WHERE slot_id = $1", uuid.UUID(req.slot_id))
    assert row["state"] == "PENDING"
    h.start_workers(1)
    await wait_for(lambda: _is(h, row["id"], "HELD"), timeout=5, message="HELD by the worker")
    assert h.booking.effects["hold"] == 1  # the retry found the same hold by its request id


async def test_psp_unavailable_on_refund_is_retried(harness):
    h = harness
    h.start_workers(1)
    created = await h.service.create(C, booking_req(h), "")
    paid = await h.service.pay(C, created.id, "pm_card_3ds", "")
    h.psp.set_status((await h.core.get(paid.payment.id)).psp_intent_id)
    h.psp.unavailable["refund"] = 2
    await h.service.cancel(C, created.id)
    await wait_for(lambda: _is(h, created.id, "REFUNDED"), timeout=5, message="REFUNDED")
    assert len(h.psp.refunds) == 1 and h.psp.calls["refund"] == 3


async def test_a_drive_cancelled_mid_step_hands_the_saga_back_at_once(harness):
    """Shutdown (or a client hanging up) cancels a drive during ConfirmHold: the saga must not wait
    for its lease to expire; any worker takes it over immediately and confirms it once."""
    import asyncio

    h = harness
    created = await h.service.create(C, booking_req(h), "")
    h.booking.delay["ConfirmHold"] = 0.5
    pay = asyncio.ensure_future(h.service.pay(C, created.id, "pm_card_ok", ""))
    await wait_for(lambda: h.booking.calls["ConfirmHold"], timeout=5, message="confirm under way")
    pay.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pay
    row = await h.row(created.id)
    # The capture is recorded with the confirm's outcome, so the row still says CHARGING (with its
    # payment, which the payments trigger wrote with the capture): a worker confirms again
    # (idempotent) and records COMPLETED.
    payment_id = await h.pool.fetchval("SELECT id FROM payments WHERE checkout_id = $1", uuid.UUID(created.id))
    assert (row["state"], row["payment_id"], row["lease_owner"]) == ("CHARGING", payment_id, None)
    assert row["next_run_at"] <= await h.pool.fetchval("SELECT clock_timestamp()")
    h.booking.delay["ConfirmHold"] = 0
    h.start_workers(1)
    await wait_for(lambda: _is(h, created.id, "COMPLETED"), timeout=5, message="COMPLETED by a worker")
    assert h.booking.effects["confirm"] == 1 and list(h.psp.charges.values()) == [1]
    assert await timeline(h, created.id) == [("PENDING", "HELD"), ("HELD", "CHARGING"), ("CHARGING", "COMPLETED")]


async def test_a_checkout_whose_payment_was_captured_cannot_be_cancelled_while_it_is_confirmed(harness):
    """A card captured at once is confirmed before anything is written (CHARGING -> COMPLETED): a
    cancel arriving meanwhile is refused, as in CONFIRMING, so a confirmed booking is never refunded
    and released behind the confirm's back."""
    import asyncio

    h = harness
    created = await h.service.create(C, booking_req(h), "")
    h.booking.delay["ConfirmHold"] = 0.5
    pay = asyncio.ensure_future(h.service.pay(C, created.id, "pm_card_ok", ""))
    await wait_for(lambda: h.booking.calls["ConfirmHold"], timeout=5, message="confirm under way")
    with pytest.raises(errors.FailedPrecondition) as refused:
        await h.service.cancel(C, created.id)
    assert refused.value.reason == "checkout-not-cancellable"
    paid = await pay
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED and not h.psp.refunds
    assert h.booking.holds[created.hold_id]["status"] == "confirmed"


async def test_charge_whose_result_was_lost_is_found_by_its_key(make_harness):
    """Review finding (invariant 4): the charge reached the PSP and captured, but the orchestrator
    never learned the payment id (a crash, or a PSP answer that timed out) and the hold then ran
    out. The saga must find the payment by its attempt key, not release as if nothing was charged."""
    h = make_harness()
    created = await h.service.create(C, booking_req(h), "")
    key = str(uuid.uuid4())
    # What PayCheckout's first statement does, before the charge whose result is lost:
    await h.pool.execute("UPDATE checkouts SET state = 'CHARGING', version = version + 1, payment_key = $2, "
                         "payment_method = 'pm_card_ok' WHERE id = $1", uuid.UUID(created.id), uuid.UUID(key))
    h.psp.unavailable["create"] = 1_000  # every answer of the PSP is lost...
    try:
        await h.core.create_and_charge(checkout_id=created.id, amount_minor=12345, currency="TRY",
                                       payment_method="pm_card_ok", idempotency_key=key, customer_id=C,
                                       merchant_id=TEST_MERCHANT)
    except Exception:  # noqa: BLE001 - "unknown" is what the caller saw
        pass
    h.psp.unavailable["create"] = 0
    # ...yet the PSP captured the money (as pm_card_sync_timeout does).
    await h.psp.create_intent(key, {"amount": 12345, "currency": "TRY", "payment_method": "pm_card_ok",
                                    "metadata": {"checkout_id": created.id}})
    assert h.psp.charges[key] == 1
    assert (await h.row(created.id))["payment_id"] is None
    # The hold runs out before anyone looks again; then a worker resumes the saga.
    h.booking.expire(created.hold_id)
    h.booking.take(created.slot_id)
    await h.pool.execute("UPDATE checkouts SET expire_time = clock_timestamp(), next_run_at = clock_timestamp() "
                         "WHERE id = $1", uuid.UUID(created.id))
    h.start_workers(1)
    await wait_for(lambda: _is(h, created.id, "REFUNDED"), timeout=10, message="REFUNDED")
    row = await h.row(created.id)
    assert row["payment_id"] is not None
    assert (await h.core.get(str(row["payment_id"]))).status == "refunded"
    assert len(h.psp.refunds) == 1


# -- Bounded retries of the finishing steps ------------------------------------------

async def _needs_attention(h, checkout_id) -> bool:
    return await _is(h, checkout_id, "NEEDS_ATTENTION")


async def test_a_refund_the_psp_keeps_refusing_needs_attention_and_an_operator_retries_it(make_harness):
    h = make_harness(max_attempts=4)
    h.start_workers(1)
    h.psp.refusing["refund"] = 10_000
    created = await h.service.create(C, booking_req(h), "")
    h.booking.started.add(created.slot_id)  # confirm refused: the saga must refund
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    await wait_for(lambda: _needs_attention(h, created.id), timeout=10, message="NEEDS_ATTENTION")
    row = await h.row(created.id)
    assert row["attention_from"] == "REFUNDING" and row["attempts"] == 4
    assert row["next_run_at"] is None and row["lease_owner"] is None  # off the queue, never dropped
    assert h.core.metrics.value(m.SAGAS_NEED_ATTENTION) == 1
    calls = h.psp.calls["refund"]
    assert calls == 4
    assert ("REFUNDING", "NEEDS_ATTENTION") in await timeline(h, created.id)
    staff = await h.service.get(Principal("staff-1", "staff", TEST_MERCHANT), created.id)
    assert staff.state == pb.CHECKOUT_STATE_NEEDS_ATTENTION
    # It stays put: a payment change (the trigger's wake-up) does not put it back in the queue.
    async with h.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("UPDATE payments SET status = 'refunded', version = version + 1, "
                           "refunded_minor = amount_minor, refund_settled_minor = amount_minor WHERE id = $1",
                           uuid.UUID(paid.payment.id))
        assert (await conn.fetchval("SELECT next_run_at FROM checkouts WHERE id = $1", uuid.UUID(created.id))) is None
        await tx.rollback()  # the refund is the operator's retry's to make
    assert h.psp.calls["refund"] == calls

    h.psp.refusing["refund"] = 0  # the bank relents
    retried = await h.service.retry(SYSTEM, "operator:ops-1", created.id)
    assert retried.state == pb.CHECKOUT_STATE_REFUNDING
    await wait_for(lambda: _is(h, created.id, "REFUNDED"), timeout=10, message="REFUNDED after the retry")
    assert (await h.core.get(paid.payment.id)).status == "refunded" and len(h.psp.refunds) == 1
    assert ("NEEDS_ATTENTION", "REFUNDING") in await timeline(h, created.id)
    with pytest.raises(errors.FailedPrecondition):
        await h.service.retry(SYSTEM, "operator:ops-1", created.id)  # only a NEEDS_ATTENTION checkout


async def test_an_unexpected_answer_to_a_release_needs_attention_after_the_time_bound(make_harness):
    h = make_harness(max_attempts=1_000, attention_after_seconds=0.5)
    h.start_workers(1)
    created = await h.service.create(C, booking_req(h), "")
    h.booking.fail_next["ReleaseHold"] = ["PERMISSION_DENIED"] * 10_000  # never a definitive answer
    out = await h.service.cancel(C, created.id)
    assert out.state in (pb.CHECKOUT_STATE_RELEASING, pb.CHECKOUT_STATE_NEEDS_ATTENTION)
    await wait_for(lambda: _needs_attention(h, created.id), timeout=10, message="NEEDS_ATTENTION")
    row = await h.row(created.id)
    assert row["attention_from"] == "RELEASING" and row["outcome"] == "CANCELLED" and row["attempts"] < 1_000
    h.booking.fail_next["ReleaseHold"] = []
    await h.service.retry(SYSTEM, "admin:a-1", created.id)
    await wait_for(lambda: _is(h, created.id, "CANCELLED"), timeout=10, message="CANCELLED after the retry")
    assert h.booking.holds[created.hold_id]["status"] == "released"


# -- Free items ----------------------------------------------------------------------

async def _notes(h, checkout_id):
    return [r["note"] for r in await h.pool.fetch(
        "SELECT note FROM payment_events WHERE checkout_id = $1 AND source = 'saga' ORDER BY seq", checkout_id)]


async def test_a_free_booking_completes_without_a_psp_call_and_says_so(harness):
    h = harness
    created = await h.service.create(C, validate_create(h.booking.add_slot(price=0), "", 0), "")
    assert created.amount.amount_minor == 0
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED and not paid.HasField("payment")
    assert sum(h.psp.calls.values()) == 0 and not h.psp.intents  # the PSP was never asked
    hold = h.booking.holds[created.hold_id]
    assert hold["status"] == "confirmed" and hold["payment_ref"]
    assert await timeline(h, created.id) == [
        ("PENDING", "HELD"), ("HELD", "CHARGING"), ("CHARGING", "CONFIRMING"), ("CONFIRMING", "COMPLETED")]
    assert any(n.startswith("free: no payment taken") for n in await _notes(h, created.id))
    assert (await h.row(created.id))["payment_id"] is None


async def test_free_codes_are_delivered_and_a_lost_free_hold_refunds_nothing(harness):
    h = harness
    pid = h.codepool.add_product(price=0, stock=2)
    created = await h.service.create(C, validate_create("", pid, 2), "")
    paid = await h.service.pay(C, created.id, "pm_card_ok", "")
    assert paid.state == pb.CHECKOUT_STATE_COMPLETED and h.codepool.orders[created.id]["status"] == "delivered"
    assert sum(h.psp.calls.values()) == 0

    lost = await h.service.create(C, validate_create(h.booking.add_slot(price=0), "", 0), "")
    h.booking.started.add(lost.slot_id)  # confirm refused: the hold-lost path
    out = await h.service.pay(C, lost.id, "pm_card_ok", "")
    if out.state != pb.CHECKOUT_STATE_REFUNDED:
        await wait_for(lambda: _is(h, lost.id, "REFUNDED"), timeout=5, message="REFUNDED")
    assert sum(h.psp.calls.values()) == 0
    assert any("nothing to refund" in n for n in await _notes(h, lost.id))
