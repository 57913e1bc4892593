"""The saga's pure rules: transition table, next step, payment routing, keys, validation."""
from __future__ import annotations

import uuid
from dataclasses import replace as dataclasses_replace
from types import SimpleNamespace
from datetime import datetime, timedelta, timezone

import pytest

from cuty.payments.v1 import checkout_pb2
from cutylib import validation

from cutylib.errors import FailedPrecondition, InvalidArgument
from payments.checkout import domain as d
from payments.checkout import reschedule as rs
from payments.checkout.domain import Saga, Step
from payments.checkout.reschedule import Reschedule

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def saga(state=d.HELD, **kw) -> Saga:
    base = dict(id=str(uuid.uuid4()), customer_id="cust", kind=d.BOOKING, state=state, outcome=None, version=1,
                slot_id=str(uuid.uuid4()), product_id=None, quantity=1, hold_id="h1", order_id=None,
                amount_minor=1000, currency="TRY", expire_time=NOW + timedelta(minutes=5), extended=False,
                payment_key=None, payment_id=None, payment_method=None, failure_reason="", attempts=0,
                lease_owner="w", created_at=NOW, updated_at=NOW, read_at=NOW)
    base.update(kw)
    return Saga(**base)


def test_terminal_states_go_nowhere():
    for s in d.TERMINAL - {d.COMPLETED}:
        assert not d.TRANSITIONS[s]
    # A completed purchase goes on only by a cancel after purchase or a reschedule.
    assert d.TRANSITIONS[d.COMPLETED] == {d.CANCELLING, d.RESCHEDULING}
    assert not d.can_transition(d.COMPLETED, d.REFUNDING)
    assert d.can_transition(d.RELEASING, d.CONFIRMING)  # late capture


def test_step_keys_are_deterministic_and_distinct_per_step_and_checkout():
    a, b = uuid.uuid4(), uuid.uuid4()
    assert d.hold_request_id(a) == d.hold_request_id(str(a))
    keys = {d.hold_request_id(a), d.order_item_id(a), d.payment_attempt_id(a), d.refund_key(a),
            d.hold_request_id(b), d.payment_attempt_id(b)}
    assert len(keys) == 6
    for k in keys:
        uuid.UUID(k)  # every key is a UUID: accepted wherever an id is expected


@pytest.mark.parametrize("state,kw,status,step", [
    (d.PENDING, {}, None, Step.HOLD),
    (d.HELD, {}, None, Step.WAIT),
    (d.HELD, {"expire_time": NOW - timedelta(seconds=1)}, None, Step.EXPIRE),
    (d.HELD, {"expire_time": NOW}, None, Step.EXPIRE),  # expiry instant itself is expired
    # One-call checkout: the payment method came with CreateCheckout, so the payment starts once held.
    (d.HELD, {"payment_method": "pm_card_ok"}, None, Step.PAY),
    (d.HELD, {"payment_method": "pm_card_ok", "expire_time": NOW}, None, Step.EXPIRE),
    (d.CHARGING, {"payment_key": "k"}, None, Step.EXTEND),
    (d.CHARGING, {"payment_key": "k", "extended": True}, None, Step.CHARGE),
    (d.CHARGING, {"payment_key": "k", "kind": d.CODES, "slot_id": None, "product_id": "p"}, None, Step.CHARGE),
    # past expiry without a known payment: still charge first (the request may be at the PSP)
    (d.CHARGING, {"payment_key": "k", "extended": True, "expire_time": NOW - timedelta(1)}, None, Step.CHARGE),
    (d.CHARGING, {"payment_key": "k", "extended": True, "payment_id": "p"}, "processing", Step.OBSERVE),
    (d.AWAITING_ACTION, {"payment_key": "k", "extended": True, "payment_id": "p"}, "requires_action", Step.OBSERVE),
    (d.CONFIRMING, {"payment_id": "p"}, "succeeded", Step.CONFIRM),
    (d.RELEASING, {"outcome": d.EXPIRED}, None, Step.RELEASE),
    (d.RELEASING, {"outcome": d.EXPIRED, "payment_id": "p"}, "requires_action", Step.CANCEL_PAYMENT),
    (d.RELEASING, {"outcome": d.CANCELLED, "payment_id": "p"}, "processing", Step.CANCEL_PAYMENT),
    (d.RELEASING, {"outcome": d.FAILED, "payment_id": "p"}, "failed", Step.RELEASE),
    (d.RELEASING, {"outcome": d.EXPIRED, "payment_id": "p"}, "canceled", Step.RELEASE),
    (d.RELEASING, {"outcome": d.EXPIRED, "payment_id": "p"}, "succeeded", Step.LATE_CAPTURE),
    (d.REFUNDING, {"payment_id": "p"}, "succeeded", Step.REFUND),
    (d.COMPLETED, {}, "succeeded", Step.WAIT),
    (d.REFUNDED, {}, "refunded", Step.WAIT),
])
def test_next_step(state, kw, status, step):
    assert d.next_step(saga(state, **kw), status, NOW) is step


@pytest.mark.parametrize("state,status,expired,expected", [
    (d.CHARGING, "succeeded", False, d.Move(d.CONFIRMING)),
    (d.CHARGING, "succeeded", True, d.Move(d.CONFIRMING)),  # money first: never expire a capture
    (d.CHARGING, "failed", False, d.Move(d.RELEASING, d.FAILED, "payment-failed")),
    (d.AWAITING_ACTION, "canceled", False, d.Move(d.RELEASING, d.FAILED, "payment-canceled")),
    (d.CHARGING, "requires_action", False, d.Move(d.AWAITING_ACTION)),
    (d.AWAITING_ACTION, "requires_action", False, None),
    (d.AWAITING_ACTION, "requires_action", True, d.Move(d.RELEASING, d.EXPIRED, "hold-expired-unpaid")),
    (d.CHARGING, "processing", False, None),
    (d.CHARGING, "created", False, None),
    (d.CHARGING, "created", True, d.Move(d.RELEASING, d.EXPIRED, "hold-expired-unpaid")),
    (d.AWAITING_ACTION, "processing", False, d.Move(d.CHARGING)),
])
def test_route_payment(state, status, expired, expected):
    s = saga(state, payment_id="p", expire_time=NOW - timedelta(seconds=1) if expired else NOW + timedelta(60))
    assert d.route_payment(s, status, NOW) == expected


def test_expiry_grace_delays_cancelling_an_in_flight_payment():
    s = saga(d.AWAITING_ACTION, payment_id="p", expire_time=NOW - timedelta(seconds=5))
    assert d.route_payment(s, "requires_action", NOW, grace_seconds=10) is None
    assert d.route_payment(s, "requires_action", NOW, grace_seconds=5).state == d.RELEASING
    assert d.wait_until(s, 10) == NOW + timedelta(seconds=5)


def test_late_capture_completes_an_expired_checkout_and_refunds_a_cancelled_one():
    assert d.late_capture(saga(d.RELEASING, outcome=d.EXPIRED)).state == d.CONFIRMING
    assert d.late_capture(saga(d.RELEASING, outcome=d.CANCELLED)).state == d.REFUNDING


def test_wait_until_is_the_hold_expiry_only_while_waiting_for_it():
    assert d.wait_until(saga(d.HELD)) == NOW + timedelta(minutes=5)
    assert d.wait_until(saga(d.CONFIRMING)) is None


def test_validate_create():
    sid, pid = str(uuid.uuid4()), str(uuid.uuid4())
    assert d.validate_create(sid, "", 0) == d.CreateRequest(d.BOOKING, sid, None, 1)
    assert d.validate_create("", pid, 3) == d.CreateRequest(d.CODES, None, pid, 3)
    assert d.validate_create(sid.upper(), "", 1).slot_id == sid  # canonical form
    # One-call checkout: a payment method, checked as PayCheckout checks it.
    assert d.validate_create(sid, "", 0, "pm_card_ok") == d.CreateRequest(d.BOOKING, sid, None, 1, "pm_card_ok")
    for bad in ("", "x" * 65, "pm\ncard"):
        with pytest.raises(InvalidArgument) as e:
            d.validate_create(sid, "", 0, bad)
        assert e.value.field == "payment_method"


def test_a_one_call_checkout_is_being_created_until_its_payment_starts():
    assert d.being_created(saga(d.PENDING)) and not d.being_created(saga(d.HELD))
    assert d.being_created(saga(d.HELD, payment_method="pm_card_ok"))
    assert not d.being_created(saga(d.CHARGING, payment_method="pm_card_ok", payment_key="k"))


def test_only_a_customers_one_call_checkout_records_its_hold_with_its_payments_start():
    assert d.holds_and_pays(saga(d.PENDING, payment_method="pm_card_ok"))
    assert not d.holds_and_pays(saga(d.PENDING))  # two-call: held, then PayCheckout
    # Staff-made (a payment link, pay at the venue): HELD first, which their merchant event marks.
    assert not d.holds_and_pays(saga(d.PENDING, payment_method="pm_card_ok", settle="link", created_by="staff-1"))
    assert not d.holds_and_pays(saga(d.PENDING, payment_method="pm_card_ok", payment_key="k"))  # already started
    assert d.can_transition(*d.ONE_CALL_START) and d.ONE_CALL_START == (d.PENDING, d.CHARGING)


@pytest.mark.parametrize("state,status,version,paid,at_once", [
    (d.CHARGING, "succeeded", 2, "p", True),            # captured at its first status change
    (d.CHARGING, "succeeded", 3, "p", False),           # waited first (processing, 3-D Secure) or refunded
    (d.CHARGING, "processing", 2, "p", False),          # not captured: wait, as before
    (d.CHARGING, "requires_action", 2, "p", False),
    (d.CHARGING, "failed", 2, "p", False),
    (d.CHARGING, "succeeded", 2, "another", False),     # not the checkout's payment
    (d.AWAITING_ACTION, "succeeded", 2, "p", False),    # 3-D Secure: captured later, as before
    (d.RELEASING, "succeeded", 2, "p", False),          # late capture keeps its own path
    (d.CONFIRMING, "succeeded", 2, "p", False),         # recorded already
])
def test_the_capture_is_recorded_with_the_confirm_only_when_it_was_the_payments_first_change(
        state, status, version, paid, at_once):
    s = saga(state, payment_key="k", payment_id="p")
    payment = SimpleNamespace(id=paid, status=status, version=version)
    assert d.confirms_with_capture(s, payment) is at_once
    assert not d.confirms_with_capture(s, None)
    assert d.can_transition(*d.CAPTURED_COMPLETION) and d.CAPTURED_COMPLETION == (d.CHARGING, d.COMPLETED)


@pytest.mark.parametrize("slot,product,qty,field", [
    ("", "", 0, "slot_id"),
    ("S", "P", 1, "slot_id"),
    ("not-a-uuid", "", 0, "slot_id"),
    ("", "nope", 1, "product_id"),
    # Fixed ids, not uuid4(): test ids must be the same in every collection (parallel workers).
    ("", "5b0c3e2a-7f4d-4d8e-9a51-0c2f6b1d9e01", 0, "quantity"),
    ("", "5b0c3e2a-7f4d-4d8e-9a51-0c2f6b1d9e01", 101, "quantity"),
    ("", "5b0c3e2a-7f4d-4d8e-9a51-0c2f6b1d9e01", -1, "quantity"),
    ("0e6a1c7b-2d3f-4b5a-8c9d-1e2f3a4b5c6d", "", 2, "quantity"),
])
def test_validate_create_refuses_bad_input(slot, product, qty, field):
    """The contract's rules (checkout.proto, checked by every server before the handler) and the
    domain's together: which of slot and product, UUIDs, quantities."""
    with pytest.raises(InvalidArgument) as e:
        validation.check(checkout_pb2.CreateCheckoutRequest(slot_id=slot, product_id=product, quantity=qty))
        d.validate_create(slot, product, qty)
    assert e.value.field == field


def test_a_payment_extends_the_hold_only_when_less_than_the_pay_window_is_left():
    """The hold expires at NOW + 5 min in these sagas."""
    paying = saga(d.CHARGING, payment_key="k")
    assert d.next_step(paying, None, NOW, pay_window_seconds=120) is Step.CHARGE
    assert d.next_step(paying, None, NOW + timedelta(minutes=3, seconds=1), pay_window_seconds=120) is Step.EXTEND
    assert d.next_step(paying, None, NOW + timedelta(minutes=2, seconds=59), pay_window_seconds=120) is Step.CHARGE
    assert d.next_step(paying, None, NOW) is Step.EXTEND  # no window given: always, as before
    assert d.next_step(saga(d.CHARGING, payment_key="k", expire_time=None), None, NOW,
                       pay_window_seconds=120) is Step.EXTEND  # expiry unknown: extend


# -- reschedule ------------------------------------------------------------------------------------

def rescheduling(**kw) -> Saga:
    """A saga rescheduling; `kw`: the reschedule's facts (Reschedule's fields)."""
    leg = Reschedule(seq=1, status="in_progress", slot_id=str(uuid.uuid4()), from_amount_minor=1000)
    return saga(d.RESCHEDULING, payment_id=str(uuid.uuid4()), reschedule=dataclasses_replace(leg, **kw))


def with_reschedule(s: Saga, **kw) -> Saga:
    return dataclasses_replace(s, reschedule=dataclasses_replace(s.reschedule, **kw))


def test_a_reschedule_holds_then_charges_a_price_increase_then_routes_on_that_payment():
    assert d.next_step(rescheduling(), None, NOW) is Step.RESCHEDULE_HOLD
    held = rescheduling(hold_id="h2", amount_minor=1500, expire_time=NOW)
    assert held.reschedule.difference == 500
    assert d.next_step(held, None, NOW) is Step.RESCHEDULE_CHARGE
    charged = with_reschedule(held, payment_id=str(uuid.uuid4()))
    assert d.next_step(charged, "processing", NOW) is Step.RESCHEDULE_OBSERVE
    assert d.watched_payment_id(charged) == charged.reschedule.payment_id  # not the purchase's
    assert d.next_step(dataclasses_replace(held, state=d.RESCHEDULE_CONFIRMING), None, NOW) is Step.RESCHEDULE_CONFIRM
    assert d.next_step(dataclasses_replace(held, state=d.RESCHEDULE_REVERTING), None, NOW) is Step.RESCHEDULE_REVERT


@pytest.mark.parametrize("status, expected", [
    ("succeeded", d.RESCHEDULE_CONFIRMING), ("partially_refunded", d.RESCHEDULE_CONFIRMING),
    ("failed", d.RESCHEDULE_REVERTING), ("canceled", d.RESCHEDULE_REVERTING),
    ("requires_action", d.RESCHEDULE_REVERTING), ("processing", None), ("created", None)])
def test_the_difference_payment_routes_the_reschedule(status, expected):
    s = rescheduling(hold_id="h2", amount_minor=1500, expire_time=NOW + timedelta(minutes=5),
                     payment_id=str(uuid.uuid4()))
    move = d.route_reschedule_payment(s, status, NOW)
    assert (move.state if move else None) == expected
    # In flight past the new hold's expiry: undone (the new hold is no longer the customer's).
    late = d.route_reschedule_payment(s, "processing", NOW + timedelta(minutes=6))
    assert late.state == d.RESCHEDULE_REVERTING and late.reason == "hold-expired-unpaid"
    assert d.wait_until(s) == s.reschedule.expire_time


def test_reschedule_keys_differ_per_reschedule_and_step():
    c = uuid.uuid4()
    keys = {d.reschedule_key(c, n, step) for n in (1, 2) for step in ("hold", "payment", "refund", "revert-refund")}
    assert len(keys) == 8 and d.reschedule_key(c, 1, "hold") == d.reschedule_key(str(c), 1, "hold")


def test_every_reschedule_state_hands_a_failing_step_to_an_operator():
    assert d.RESCHEDULE_STATES <= d.ATTENTION_STATES
    for s in d.RESCHEDULE_STATES:
        assert d.can_transition(s, d.NEEDS_ATTENTION) and d.can_transition(d.NEEDS_ATTENTION, s)


def test_the_payment_method_of_a_price_increase():
    s = saga(d.COMPLETED, payment_method="pm_card_ok")
    assert d.reschedule_payment_method("", s) == "pm_card_ok"
    assert d.reschedule_payment_method("pm_card_declined", s) == "pm_card_declined"
    with pytest.raises(InvalidArgument) as e:
        d.reschedule_payment_method("x" * 65, s)
    assert e.value.field == "payment_method"


def test_only_the_customer_starts_a_reschedule_that_charges_their_card():
    """A payment method is never reused for an action the customer did not start."""
    rs.refuse_unasked_charge("customer", new_minor=12_000, paid_minor=10_000, currency="TRY")  # their own: charged
    for role in ("staff", "admin", "operator", "system"):
        rs.refuse_unasked_charge(role, new_minor=10_000, paid_minor=10_000, currency="TRY")  # same price
        rs.refuse_unasked_charge(role, new_minor=7_500, paid_minor=10_000, currency="TRY")  # cheaper: refunded
        with pytest.raises(FailedPrecondition) as e:
            rs.refuse_unasked_charge(role, new_minor=10_001, paid_minor=10_000, currency="TRY")
        assert e.value.reason == "reschedule-costs-more"
        assert "10001 TRY" in e.value.message and "10000 TRY" in e.value.message
    assert rs.initiator_role("staff:staff-1") == "staff" and rs.initiator_role("customer:c:1") == "customer"
    assert rs.initiator_role(None) == ""  # unknown: never the customer
    with pytest.raises(FailedPrecondition):
        rs.refuse_unasked_charge(rs.initiator_role(None), new_minor=2, paid_minor=1, currency="TRY")


def test_the_free_cancellation_deadline_defaults_to_the_statements_24_hours():
    start = NOW + timedelta(days=3)
    assert saga(d.COMPLETED, start_time=start, free_cancellation_hours=None).free_cancellation_deadline \
        == start - timedelta(hours=d.DEFAULT_FREE_CANCELLATION_HOURS) == start - timedelta(hours=24)
    assert saga(d.COMPLETED, start_time=start, free_cancellation_hours=0).free_cancellation_deadline == start
    assert saga(d.COMPLETED, start_time=None).free_cancellation_deadline is None


def test_the_watched_payment_follows_the_reschedule_payment_states():
    for state in d.STATES:
        s = saga(state, payment_id="purchase", reschedule=Reschedule(payment_id="difference"))
        expected = "difference" if state in d.RESCHEDULE_PAYMENT_STATES else "purchase"
        assert d.watched_payment_id(s) == expected, state


def test_the_charge_is_not_started_past_the_paying_requests_deadline():
    now = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
    due = now - timedelta(milliseconds=1)
    assert d.pay_deadline_passed(saga(d.CHARGING, pay_deadline=due), now)
    assert d.pay_deadline_passed(saga(d.HELD, payment_method="pm_card_ok", pay_deadline=due), now)
    # Not yet; no deadline; or the charge started already (a payment exists): the saga goes on.
    assert not d.pay_deadline_passed(saga(d.CHARGING, pay_deadline=now + timedelta(seconds=1)), now)
    assert not d.pay_deadline_passed(saga(d.CHARGING), now)
    assert not d.pay_deadline_passed(saga(d.CHARGING, pay_deadline=due, payment_id=str(uuid.uuid4())), now)
    assert not d.pay_deadline_passed(saga(d.CONFIRMING, pay_deadline=due), now)
    assert {Step.PAY, Step.EXTEND, Step.CHARGE} == d.BEFORE_CHARGE


def test_the_database_clock_of_a_row_moves_on_with_the_local_one():
    s = saga(d.CHARGING)
    later = dataclasses_replace(s, read_mono=s.read_mono - 2.0)  # read two seconds ago
    assert later.read_at + timedelta(seconds=1.9) < d.db_now(later) < later.read_at + timedelta(seconds=3)
