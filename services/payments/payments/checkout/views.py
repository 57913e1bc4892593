"""What callers are told about a checkout, as protos: built from the use cases' answers
(checkout/answers.py: the saga row and the payment as re-read), for the gRPC API and the replays
its Idempotency-Keys store.

The customer action (redirect URL / client secret) appears only while the checkout waits for the
customer (AWAITING_ACTION) and the payment still requires the action (docs/architecture.md, invariant
6; the PaymentView already drops it for any other payment status). Code values only reach the owner of a
completed code purchase (the caller decides `codes`)."""
from __future__ import annotations

from cuty.common.v1 import common_pb2
from cuty.payments.v1 import checkout_pb2, payments_pb2
from cutylib.timestamps import to_timestamp

from . import domain, staffbook
from .answers import CheckoutAnswer, CheckoutPage, Diagnostics
from .domain import Saga

# Enum values carry their type's prefix (protobuf style): the row's HELD is the proto's
# CHECKOUT_STATE_HELD.
STATE_PREFIX = "CHECKOUT_STATE_"
_KIND = {domain.BOOKING: checkout_pb2.CHECKOUT_KIND_BOOKING, domain.CODES: checkout_pb2.CHECKOUT_KIND_CODES}


def to_proto(saga: Saga, payment=None, codes: list[tuple[str, str]] = ()) -> checkout_pb2.Checkout:
    c = checkout_pb2.Checkout(
        id=saga.id,
        kind=_KIND[saga.kind],
        state=checkout_pb2.CheckoutState.Value(STATE_PREFIX + saga.state),
        hold_id=saga.hold_id or "",
        order_id=saga.order_id or "",
        expire_time=to_timestamp(saga.expire_time),
        create_time=to_timestamp(saga.created_at),
        slot_id=saga.slot_id or "",
        product_id=saga.product_id or "",
        quantity=saga.quantity,
        failure_reason=saga.failure_reason,
        merchant_id=saga.merchant_id or "",
        salon_id=saga.salon_id or "",
    )
    if saga.free_cancellation_hours is not None:
        c.free_cancellation_hours = saga.free_cancellation_hours
        c.cancellation_fee_percent = saga.cancellation_fee_percent or 0
    if saga.start_time is not None:
        c.start_time.CopyFrom(to_timestamp(saga.start_time))
        c.free_cancellation_deadline.CopyFrom(to_timestamp(saga.free_cancellation_deadline))
    if saga.refund_amount_minor is not None:
        c.refund_amount.CopyFrom(common_pb2.Money(currency_code=saga.currency or "",
                                                  amount_minor=saga.refund_amount_minor))
        c.cancelled_by = saga.cancelled_by or ""
        c.cancel_reason = saga.cancel_reason or ""
    if saga.reschedule.status is not None:
        r = c.reschedule
        r.status, r.slot_id = saga.reschedule.status, saga.reschedule.slot_id or ""
        r.previous_slot_id = saga.reschedule.from_slot_id or ""
        r.payment_id, r.failure_reason = saga.reschedule.payment_id or "", saga.reschedule.failure
        r.rescheduled_by, r.count = saga.reschedule.by or "", saga.reschedule.count
        if saga.reschedule.status == "rescheduled":
            r.slot_id, r.previous_slot_id = saga.slot_id or "", saga.reschedule.from_slot_id or ""
        difference = saga.reschedule.difference
        if difference is not None:
            r.difference.CopyFrom(common_pb2.Money(currency_code=saga.currency or "", amount_minor=difference))
    if saga.amount_minor is not None:
        c.amount.CopyFrom(common_pb2.Money(currency_code=saga.currency or "", amount_minor=saga.amount_minor))
    if payment is not None:
        c.payment.id = payment.id
        c.payment.status = payments_pb2.PaymentStatus.Value(f"PAYMENT_STATUS_{payment.status.upper()}")
        if saga.state == domain.AWAITING_ACTION:
            if payment.redirect_url:
                c.payment.next_action.redirect_url = payment.redirect_url
            if payment.client_secret:
                c.payment.client_secret = payment.client_secret
    for code_id, value in codes:
        c.codes.add(id=code_id, value=value)
    _staff_booking(c, saga, payment)
    if saga.no_show_fee_minor is not None:
        f = c.no_show_fee
        f.amount.CopyFrom(common_pb2.Money(currency_code=saga.currency or "", amount_minor=saga.no_show_fee_minor))
        f.accept_time.CopyFrom(to_timestamp(saga.no_show_fee_accepted_at))
        f.status, f.payment_id = saga.no_show_fee_status or "", saga.no_show_fee_payment_id or ""
        f.failure_reason = saga.no_show_fee_failure or ""
    return c


def _staff_booking(c: checkout_pb2.Checkout, saga: Saga, payment) -> None:
    """Who made it and how it is paid (a staff-made checkout), and a booking's no-show. The link is
    the PSP's hosted page, shown while the checkout waits for the customer to pay on it."""
    if saga.settle is None and saga.no_show_at is None:
        return
    b = c.staff_booking
    if saga.settle is not None:
        b.created_by, b.customer_id = saga.created_by or "", saga.customer_id
        b.settlement = staffbook.SETTLEMENT_PB[saga.settle]
    if saga.settle == staffbook.LINK:
        if saga.expire_time is not None:
            b.link_expire_time.CopyFrom(to_timestamp(saga.expire_time))
        if saga.state == domain.AWAITING_ACTION and payment is not None and payment.redirect_url:
            b.link_url = payment.redirect_url
    if saga.venue_status is not None:
        v = b.venue_payment
        v.status = saga.venue_status
        if saga.venue_status == "paid":
            v.method = staffbook.VENUE_METHOD_PB[saga.venue_method]
            v.amount.CopyFrom(common_pb2.Money(currency_code=saga.currency or "", amount_minor=saga.venue_amount_minor))
            v.reference, v.paid_by = saga.venue_reference or "", saga.venue_paid_by or ""
            v.paid_time.CopyFrom(to_timestamp(saga.venue_paid_at))
    if saga.no_show_at is not None:
        b.no_show_time.CopyFrom(to_timestamp(saga.no_show_at))
        b.no_show_by = saga.no_show_by or ""


def checkout_pb(answer: CheckoutAnswer) -> checkout_pb2.Checkout:
    """A use case's answer as the API gives it."""
    c = to_proto(answer.saga, answer.payment, answer.codes)
    if not answer.for_buyer:
        # Staff see the state; the redirect URL and client secret are the buyer's to use only.
        c.payment.ClearField("next_action")
        c.payment.client_secret = ""
    if answer.diagnostics is not None:  # attempts, last error, trace id: never the customer's
        c.diagnostics.CopyFrom(diagnostics_pb(answer.diagnostics))
    return c


def diagnostics_pb(d: Diagnostics) -> checkout_pb2.CheckoutDiagnostics:
    return checkout_pb2.CheckoutDiagnostics(
        attempts=d.attempts, last_error=d.last_error, failing_since=to_timestamp(d.failing_since),
        attention_from=d.attention_from, trace_id=d.trace_id, update_time=to_timestamp(d.updated_at),
        version=d.version)


def page_pb(page: CheckoutPage) -> checkout_pb2.ListCheckoutsResponse:
    return checkout_pb2.ListCheckoutsResponse(checkouts=[in_list(s, status) for s, status in page.checkouts],
                                              next_page_token=page.next_page_token)


def stored(answer: CheckoutAnswer) -> bytes:
    """What an Idempotency-Key keeps of an answer for its replays: the proto without secrets."""
    return without_secrets(checkout_pb(answer)).SerializeToString()


def in_list(saga: Saga, payment_status: str | None) -> checkout_pb2.Checkout:
    """A checkout as a list shows it: the state, amounts and ids, the payment's id and
    status, never a client secret, redirect URL or code value (GetCheckout has them for the buyer)."""
    c = to_proto(saga)
    if saga.payment_id and payment_status:
        c.payment.id = saga.payment_id
        c.payment.status = payments_pb2.PaymentStatus.Value(f"PAYMENT_STATUS_{payment_status.upper()}")
    return c


def without_secrets(c: checkout_pb2.Checkout) -> checkout_pb2.Checkout:
    """The answer as stored for Idempotency-Key replays: no client secret, no redirect
    URL, no code values. Kept for 24 h, it must not hand out the action after the payment ended
    (invariant 6); `with_current_action` puts the action back while it is still needed."""
    out = checkout_pb2.Checkout()
    out.CopyFrom(c)
    if out.HasField("payment"):  # (assigning into an absent payment would add an empty one)
        out.payment.ClearField("next_action")
        out.payment.client_secret = ""
    out.ClearField("codes")
    return out


def with_current_action(stored: checkout_pb2.Checkout, saga: Saga | None, payment) -> checkout_pb2.Checkout:
    """A replayed answer with the customer action of the payment as it is now: present only while
    the checkout still waits for the customer and the payment still requires the action."""
    out = without_secrets(stored)
    if saga is None or payment is None or payment.id != stored.payment.id:
        return out
    now = to_proto(saga, payment)
    if now.payment.HasField("next_action"):
        out.payment.next_action.CopyFrom(now.payment.next_action)
    if now.payment.client_secret:
        out.payment.client_secret = now.payment.client_secret
    return out
