"""The checkout saga's rules, with no I/O (docs/architecture.md, "The checkout saga"; docs/checkout.md).

The saga is a row advanced by transitions from TRANSITIONS (the database repeats the table as a
trigger). What a worker does next is decided here from the row and the payment's status, so every
path (the synchronous PayCheckout, a woken worker, a worker resuming after a crash) takes the same
decision from the same facts.
"""
from __future__ import annotations

import enum
import math
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Mapping

from cutylib.errors import InvalidArgument
from cutylib.fields import canonical_uuid

from ..domain import require_payment_method
from .reschedule import Reschedule

# -- states ----------------------------------------------------------------------------------------

PENDING = "PENDING"
HELD = "HELD"
CHARGING = "CHARGING"
AWAITING_ACTION = "AWAITING_ACTION"
CONFIRMING = "CONFIRMING"
COMPLETED = "COMPLETED"
RELEASING = "RELEASING"
REJECTED = "REJECTED"
FAILED = "FAILED"
EXPIRED = "EXPIRED"
CANCELLED = "CANCELLED"
REFUNDING = "REFUNDING"
REFUNDED = "REFUNDED"
# A finishing step (confirm, release, refund) that kept failing: waits for an operator.
NEEDS_ATTENTION = "NEEDS_ATTENTION"
# A COMPLETED booking cancelled after purchase: refund per its policy, free the slot, end.
CANCELLING = "CANCELLING"
CANCELLED_AFTER_PURCHASE = "CANCELLED_AFTER_PURCHASE"
# A COMPLETED booking moved to another slot (docs/checkout.md, "Reschedule"): the new
# slot held (and a price increase charged), then confirmed and the old booking released; or undone.
RESCHEDULING = "RESCHEDULING"
RESCHEDULE_CONFIRMING = "RESCHEDULE_CONFIRMING"
RESCHEDULE_REVERTING = "RESCHEDULE_REVERTING"
RESCHEDULE_STATES = frozenset({RESCHEDULING, RESCHEDULE_CONFIRMING, RESCHEDULE_REVERTING})

# Every state, in the order the schema lists them (checkouts_state_check) and the gauges report them.
STATES = (PENDING, HELD, CHARGING, AWAITING_ACTION, CONFIRMING, COMPLETED, RELEASING, REJECTED, FAILED, EXPIRED,
          CANCELLED, REFUNDING, REFUNDED, NEEDS_ATTENTION, CANCELLING, CANCELLED_AFTER_PURCHASE,
          RESCHEDULING, RESCHEDULE_CONFIRMING, RESCHEDULE_REVERTING)
# The one list of finished states: Python uses these sets, and the schema's lists (CHECKs, partial
# indexes, triggers) are checked against them (tests/integration/payments/test_saga_state_lists.py).
TERMINAL = frozenset({COMPLETED, REJECTED, FAILED, EXPIRED, CANCELLED, REFUNDED, CANCELLED_AFTER_PURCHASE})
# Nothing for a worker to do: finished, or waiting for an operator.
IDLE = TERMINAL | {NEEDS_ATTENTION}
# The states a checkout waits in (the "stuck" gauges and `ops stuck` report these).
NON_TERMINAL = tuple(s for s in STATES if s not in TERMINAL)
RELEASE_OUTCOMES = frozenset({FAILED, EXPIRED, CANCELLED})
# The states whose step routes on the reschedule's own payment (a price increase), not the purchase's.
RESCHEDULE_PAYMENT_STATES = frozenset({RESCHEDULING, RESCHEDULE_REVERTING})

TRANSITIONS: dict[str, frozenset[str]] = {
    # PENDING -> CHARGING: a customer's one-call checkout records its hold with its payment's start
    # (holds_and_pays); the database allows it only with both written (ONE_CALL_START).
    PENDING: frozenset({HELD, REJECTED, CHARGING}),
    HELD: frozenset({CHARGING, RELEASING}),
    # CHARGING -> COMPLETED: the synchronous capture recorded with the confirm (confirms_with_capture);
    # the database allows it only with the checkout's payment captured (CAPTURED_COMPLETION).
    CHARGING: frozenset({AWAITING_ACTION, CONFIRMING, RELEASING, COMPLETED}),
    AWAITING_ACTION: frozenset({CHARGING, CONFIRMING, RELEASING}),
    CONFIRMING: frozenset({COMPLETED, REFUNDING, NEEDS_ATTENTION}),
    # Late capture: the PSP says the payment we tried to cancel already succeeded.
    RELEASING: frozenset({FAILED, EXPIRED, CANCELLED, CONFIRMING, REFUNDING, NEEDS_ATTENTION}),
    REFUNDING: frozenset({REFUNDED, NEEDS_ATTENTION}),
    # An operator's retry goes back to the state it left (checkouts.attention_from).
    NEEDS_ATTENTION: frozenset({CONFIRMING, RELEASING, REFUNDING, CANCELLING, *RESCHEDULE_STATES}),
    CANCELLING: frozenset({CANCELLED_AFTER_PURCHASE, NEEDS_ATTENTION}),
    RESCHEDULING: frozenset({RESCHEDULE_CONFIRMING, RESCHEDULE_REVERTING, COMPLETED, NEEDS_ATTENTION}),
    RESCHEDULE_CONFIRMING: frozenset({COMPLETED, RESCHEDULE_REVERTING, NEEDS_ATTENTION}),
    RESCHEDULE_REVERTING: frozenset({COMPLETED, NEEDS_ATTENTION}),
    **{s: frozenset() for s in TERMINAL},
    # A purchase is finished when COMPLETED; its one way on is a cancel after purchase
    # (a booking's customer per its policy, or the merchant's staff), which starts a new saga leg,
    # or a reschedule, which ends COMPLETED again (on the new slot, or unchanged).
    COMPLETED: frozenset({CANCELLING, RESCHEDULING}),
}

# The one move the database allows only with facts besides the state: a customer's one-call
# checkout (payment method, no staff, no settle) with its hold (price) and payment attempt written.
ONE_CALL_START = (PENDING, CHARGING)
# The other: a checkout completed straight from CHARGING, only with its payment captured.
CAPTURED_COMPLETION = (CHARGING, COMPLETED)

# States whose step, failing too long, hands the saga to an operator (NEEDS_ATTENTION) instead of
# retrying forever: the money is taken or the hold is going back, and only a person can decide.
ATTENTION_STATES = frozenset({CONFIRMING, RELEASING, REFUNDING, CANCELLING, *RESCHEDULE_STATES})

# The customer may cancel while nothing irrevocable is under way. CHARGING only once the payment
# is known: before that the charge request may be on its way to the PSP and there is no intent to
# cancel yet (the synchronous PayCheckout finishes that step within its deadline); and not once it
# is captured: the purchase is being confirmed (repository.START_CANCEL decides both).
CANCELLABLE = frozenset({HELD, AWAITING_ACTION, CHARGING})

BOOKING = "booking"
CODES = "codes"

# Payment statuses (payments/domain.py), as far as the saga cares.
P_CREATED, P_REQUIRES_ACTION, P_PROCESSING = "created", "requires_action", "processing"
P_SUCCEEDED, P_FAILED, P_CANCELED, P_REFUNDED = "succeeded", "failed", "canceled", "refunded"
# Staff refunded part of the payment; for the saga the rest is still captured (succeeded).
P_PARTIALLY_REFUNDED = "partially_refunded"
P_TERMINAL = frozenset({P_SUCCEEDED, P_FAILED, P_CANCELED, P_PARTIALLY_REFUNDED, P_REFUNDED})


def _captured_as_succeeded(payment_status: str | None) -> str | None:
    return P_SUCCEEDED if payment_status == P_PARTIALLY_REFUNDED else payment_status


def captured_status(payment) -> str | None:
    """A payment's status as the saga reads it (partly refunded is still captured: succeeded)."""
    return None if payment is None else _captured_as_succeeded(payment.status)


def can_transition(current: str, new: str) -> bool:
    return new in TRANSITIONS[current]


# -- idempotency keys of the remote steps ---------------------------------------------------------

# Every remote step carries a key derived from (checkout id, step), so a retry after a timeout or a
# crash is recognised by booking, the code pool and the PSP as the same request.
_NAMESPACE = uuid.UUID("6f1c3b0e-4c2a-4b8e-9a57-63757479636b")  # fixed forever: keys must not change


def step_key(checkout_id: str | uuid.UUID, step: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{checkout_id}:{step}"))


def hold_request_id(checkout_id) -> str:
    return step_key(checkout_id, "hold")


def order_item_id(checkout_id) -> str:
    return step_key(checkout_id, "order-item")


def payment_attempt_id(checkout_id) -> str:
    # One attempt per checkout (PayCheckout needs HELD, and a failed payment ends the checkout).
    return step_key(checkout_id, "payment:1")


def refund_key(checkout_id) -> str:
    return step_key(checkout_id, "refund")


def cancel_refund_key(checkout_id) -> str:
    """The refund of a cancel after purchase (one per checkout: a cancel happens once)."""
    return step_key(checkout_id, "cancel-refund")


def reschedule_key(checkout_id, seq: int, step: str) -> str:
    """The key of a step of the checkout's `seq`-th reschedule (hold, payment,
    refund, revert-refund): repeated with the same key after a crash, distinct for the next reschedule."""
    return step_key(checkout_id, f"reschedule:{seq}:{step}")


def payment_ref(saga: "Saga") -> str | None:
    """What confirms the purchase at booking / the code pool: the payment, or for a free item
    (no payment) the payment attempt key, equally stable across retries."""
    return saga.payment_id or saga.payment_key


# -- the saga row ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Held:
    """What a hold (booking) or a reservation (code pool) tells the checkout, which records it
    with its move to HELD."""
    hold_id: str | None
    expire_time: datetime
    amount_minor: int
    currency: str
    merchant_id: str  # whose slot or product it is
    salon_id: str | None = None  # a booking's salon (ListCheckouts' filter)
    # A booking's start and its salon's cancellation policy at purchase.
    start_time: datetime | None = None
    free_cancellation_hours: int | None = None
    cancellation_fee_percent: int | None = None


@dataclass(frozen=True)
class Saga:
    id: str
    customer_id: str
    kind: str
    state: str
    outcome: str | None
    version: int
    slot_id: str | None
    product_id: str | None
    quantity: int
    hold_id: str | None
    order_id: str | None
    amount_minor: int | None
    currency: str | None
    expire_time: datetime | None
    extended: bool
    payment_key: str | None
    payment_id: str | None
    payment_method: str | None
    failure_reason: str
    attempts: int
    lease_owner: str | None
    created_at: datetime
    updated_at: datetime
    # The database clock when the row was read: TTL decisions use it, never the local clock.
    read_at: datetime
    # The W3C traceparent of the request that created the checkout (its steps continue that trace).
    traceparent: str | None = None
    # The merchant of what is bought, from the hold or reservation (None before).
    merchant_id: str | None = None
    # A booking's salon, from the hold (None for code purchases and older checkouts).
    salon_id: str | None = None
    # A booking's cancellation policy and start, from the hold (None for code purchases
    # and older checkouts); a cancel after purchase: the refund it decided, who and why.
    free_cancellation_hours: int | None = None
    cancellation_fee_percent: int | None = None
    start_time: datetime | None = None
    refund_amount_minor: int | None = None
    cancelled_by: str | None = None
    cancel_reason: str | None = None
    # The reschedule under way (or the last one): the checkouts table's reschedule_* columns.
    reschedule: Reschedule = Reschedule()
    # The last instant its charge may start (the paying request's deadline; None: none). Past it, a
    # saga whose charge has not started ends instead (Step.ABANDON): its caller is gone.
    pay_deadline: datetime | None = None
    # Made by the merchant's staff for a customer (docs/checkout.md, "Staff book for a customer"):
    # settle 'link' (paid on the PSP's hosted page; the hold lasts link_ttl_seconds) or 'venue'
    # (confirmed unpaid); None: the customer's own checkout. The venue payment and a no-show.
    settle: str | None = None
    created_by: str | None = None
    link_ttl_seconds: int | None = None
    venue_status: str | None = None
    venue_method: str | None = None
    venue_amount_minor: int | None = None
    venue_reference: str | None = None
    venue_paid_by: str | None = None
    venue_paid_at: datetime | None = None
    no_show_at: datetime | None = None
    no_show_by: str | None = None
    # The no-show fee the customer accepted at purchase (None: none) and its off-session charge:
    # status None until a no-show, then 'due', 'charged' or 'declined' (docs/checkout.md, "No-show fee").
    no_show_fee_minor: int | None = None
    no_show_fee_accepted_at: datetime | None = None
    no_show_fee_status: str | None = None
    no_show_fee_payment_id: str | None = None
    no_show_fee_failure: str | None = None
    # A payment link's offer of the fee (the slot's when staff made the link): its hosted page asks
    # the customer to accept exactly this, and an accepted offer becomes no_show_fee_minor.
    no_show_fee_offered_minor: int | None = None
    # The local monotonic clock when the row was read, to tell how far the database clock has
    # moved since read_at (db_now) without asking it again.
    read_mono: float = field(default_factory=time.monotonic, compare=False, repr=False)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Saga":
        s = lambda v: None if v is None else str(v)  # noqa: E731 - uuid columns arrive as UUID
        return cls(
            id=str(row["id"]), customer_id=row["customer_id"], kind=row["kind"], state=row["state"],
            outcome=row["outcome"], version=row["version"], slot_id=s(row["slot_id"]),
            product_id=s(row["product_id"]), quantity=row["quantity"], hold_id=row["hold_id"],
            order_id=s(row["order_id"]), amount_minor=row["amount_minor"], currency=row["currency"],
            expire_time=row["expire_time"], extended=row["extended"], payment_key=s(row["payment_key"]),
            payment_id=s(row["payment_id"]), payment_method=row["payment_method"],
            failure_reason=row["failure_reason"], attempts=row["attempts"], lease_owner=row["lease_owner"],
            created_at=row["created_at"], updated_at=row["updated_at"], read_at=row["db_now"],
            traceparent=row.get("traceparent"), merchant_id=row.get("merchant_id"),
            salon_id=s(row.get("salon_id")), free_cancellation_hours=row.get("free_cancellation_hours"),
            cancellation_fee_percent=row.get("cancellation_fee_percent"), start_time=row.get("start_time"),
            refund_amount_minor=row.get("refund_amount_minor"), cancelled_by=row.get("cancelled_by"),
            cancel_reason=row.get("cancel_reason"),
            reschedule=Reschedule.from_row(row), pay_deadline=row.get("pay_deadline"),
            settle=row.get("settle"), created_by=row.get("created_by"), link_ttl_seconds=row.get("link_ttl_seconds"),
            venue_status=row.get("venue_status"), venue_method=row.get("venue_method"),
            venue_amount_minor=row.get("venue_amount_minor"), venue_reference=row.get("venue_reference"),
            venue_paid_by=row.get("venue_paid_by"), venue_paid_at=row.get("venue_paid_at"),
            no_show_at=row.get("no_show_at"), no_show_by=row.get("no_show_by"),
            no_show_fee_minor=row.get("no_show_fee_minor"), no_show_fee_accepted_at=row.get("no_show_fee_accepted_at"),
            no_show_fee_status=row.get("no_show_fee_status"), no_show_fee_payment_id=s(row.get("no_show_fee_payment_id")),
            no_show_fee_failure=row.get("no_show_fee_failure"),
            no_show_fee_offered_minor=row.get("no_show_fee_offered_minor"),
        )

    @property
    def free_cancellation_deadline(self) -> datetime | None:
        """Until when a cancel is free: N elapsed hours before the start (not wall-clock), N the policy
        recorded at purchase, else the default (as the statements that decide a cancel or a reschedule)."""
        if self.start_time is None:
            return None
        hours = DEFAULT_FREE_CANCELLATION_HOURS if self.free_cancellation_hours is None else self.free_cancellation_hours
        return self.start_time - timedelta(hours=hours)


# -- what to do next ------------------------------------------------------------------------------

class Step(enum.Enum):
    HOLD = "hold"                      # booking.HoldSlot | codepool.ReserveCodes
    EXTEND = "extend"                  # booking.ExtendHold, once, when payment starts
    CHARGE = "charge"                  # core.create_and_charge (idempotent on the attempt id)
    OBSERVE = "observe"                # read the payment and route on its status
    CONFIRM = "confirm"                # booking.ConfirmHold | codepool.DeliverCodes
    CANCEL_PAYMENT = "cancel_payment"  # core.cancel of a payment that is not terminal
    RELEASE = "release"                # booking.ReleaseHold | codepool.ReleaseReservation
    REFUND = "refund"                  # core.refund, then release
    CANCEL_PURCHASE = "cancel_purchase"  # core.issue_refund (the policy's amount), then booking.CancelBooking
    # reschedule:
    RESCHEDULE_HOLD = "reschedule_hold"        # booking.HoldSlot of the new slot
    RESCHEDULE_CHARGE = "reschedule_charge"    # core.create_and_charge of a price increase
    RESCHEDULE_OBSERVE = "reschedule_observe"  # route on the difference's payment
    RESCHEDULE_CONFIRM = "reschedule_confirm"  # ConfirmHold (new), CancelBooking (old), refund a decrease
    RESCHEDULE_REVERT = "reschedule_revert"    # cancel / refund the difference, release the new hold
    PAY = "pay"                        # a local transition: a one-call checkout starts its payment
    ABANDON = "abandon"                # a local transition: the paying request is gone, nothing charged
    EXPIRE = "expire"                  # a local transition: the hold ran out unpaid
    LATE_CAPTURE = "late_capture"      # a local transition: RELEASING, but the money arrived
    WAIT = "wait"                      # nothing to do until next_run_at / a wake-up


def is_expired(saga: Saga, now: datetime, grace_seconds: float = 0.0) -> bool:
    if saga.expire_time is None:
        return False
    return (now - saga.expire_time).total_seconds() >= grace_seconds


def needs_extension(saga: Saga, now: datetime, pay_window_seconds: float = math.inf) -> bool:
    """A booking about to be charged whose hold has less than the pay window left (or an unknown
    expiry): extend it once first. With more left the extension would only cost a call."""
    if saga.kind != BOOKING or saga.extended or saga.payment_id is not None or saga.settle is not None:
        return False  # (a staff-made checkout's hold was taken for as long as it may wait)
    return saga.expire_time is None or (saga.expire_time - now).total_seconds() < pay_window_seconds


def next_step(saga: Saga, payment_status: str | None, now: datetime, grace_seconds: float = 0.0,
              pay_window_seconds: float = math.inf) -> Step:
    """The next step of a leased saga. `payment_status` is None when no payment is known yet.
    `pay_window_seconds`: CheckoutOptions.pay_window_seconds (infinite: always extend)."""
    payment_status = _captured_as_succeeded(payment_status)
    st = saga.state
    if st == PENDING:
        return Step.HOLD
    if st == HELD:
        if is_expired(saga, now):
            return Step.EXPIRE
        # A one-call checkout (CreateCheckout with a payment method, kept on the row from its
        # insert): the payment starts as soon as the hold is taken, as PayCheckout would start it.
        return Step.PAY if pays_on_create(saga) else Step.WAIT
    if st in (CHARGING, AWAITING_ACTION):
        # Once a payment exists the extension is moot (and failing it must not end the saga as
        # if nothing had been charged): the payment's outcome decides from there.
        if needs_extension(saga, now, pay_window_seconds):
            return Step.EXTEND
        if saga.payment_id is None:
            # Even past the hold's expiry: the charge may already be at the PSP, and only the
            # payment row can tell us which intent to cancel. A capture then follows late capture.
            return Step.CHARGE
        return Step.OBSERVE
    if st == CONFIRMING:
        return Step.CONFIRM
    if st == RELEASING:
        if payment_status is not None and payment_status not in P_TERMINAL:
            return Step.CANCEL_PAYMENT
        if payment_status == P_SUCCEEDED:
            return Step.LATE_CAPTURE
        return Step.RELEASE
    if st == REFUNDING:
        return Step.REFUND
    if st == CANCELLING:
        return Step.CANCEL_PURCHASE
    if st == RESCHEDULING:
        if saga.reschedule.hold_id is None:
            return Step.RESCHEDULE_HOLD
        if saga.reschedule.payment_id is None:
            return Step.RESCHEDULE_CHARGE
        return Step.RESCHEDULE_OBSERVE
    if st == RESCHEDULE_CONFIRMING:
        return Step.RESCHEDULE_CONFIRM
    if st == RESCHEDULE_REVERTING:
        return Step.RESCHEDULE_REVERT
    return Step.WAIT


def db_now(saga: Saga) -> datetime:
    """The database clock now, as far as the row tells: its read_at moved on by the time elapsed
    since it was read (a step may have taken seconds since)."""
    return saga.read_at + timedelta(seconds=max(0.0, time.monotonic() - saga.read_mono))


# Steps that lead to the charge: not started once the paying request is gone (pay_deadline_passed).
BEFORE_CHARGE = frozenset({Step.PAY, Step.EXTEND, Step.CHARGE})


def pay_deadline_passed(saga: Saga, now: datetime) -> bool:
    """The request that asked for the payment can no longer be answered and the charge has not
    started (no payment known: the engine has looked it up by its attempt key before asking):
    nobody waits for this purchase, so it must not be charged. Whether a request still drives the
    saga is the engine's to know; this is the row's view."""
    return (saga.pay_deadline is not None and saga.payment_id is None and now >= saga.pay_deadline
            and saga.state in (HELD, CHARGING))


def pays_on_create(saga: Saga) -> bool:
    """A one-call checkout whose payment has not started yet: its payment method came with
    CreateCheckout (or staff made it: a payment link, or pay at the venue), and no payment attempt
    exists (PayCheckout and the PAY step both set one)."""
    return (saga.payment_method is not None or saga.settle is not None) and saga.payment_key is None


def holds_and_pays(saga: Saga) -> bool:
    """A customer's one-call checkout: its hold's outcome is recorded with its payment's start, in
    one transition (PENDING -> CHARGING), instead of HELD and then the PAY step's HELD -> CHARGING.
    Nothing else differs: the charge is the next step, under the same pay deadline, and a crash
    between the hold and the charge leaves a CHARGING saga without a payment, which a worker charges
    or, once the paying request is gone, releases (Step.ABANDON). Staff-made checkouts (a payment
    link, pay at the venue) keep their HELD, which their merchant event (booking.created_by_staff) marks."""
    return saga.payment_method is not None and saga.settle is None and saga.created_by is None \
        and saga.payment_key is None


def being_created(saga: Saga) -> bool:
    """CreateCheckout is not done with the checkout yet: the hold is still to be taken, or (one-call)
    the payment is still to be started. A retry with the same Idempotency-Key carries it on."""
    return saga.state == PENDING or (saga.state == HELD and pays_on_create(saga))


@dataclass(frozen=True)
class Move:
    """A transition to make: the new state and, for RELEASING, where it leads."""
    state: str
    outcome: str | None = None
    reason: str = ""


def route_payment(saga: Saga, payment_status: str, now: datetime, grace_seconds: float = 0.0) -> Move | None:
    """CHARGING / AWAITING_ACTION: where the payment's status takes the saga (None: stay and wait)."""
    payment_status = _captured_as_succeeded(payment_status)
    if payment_status == P_SUCCEEDED:
        return Move(CONFIRMING)
    if payment_status in (P_FAILED, P_CANCELED, P_REFUNDED):
        return Move(RELEASING, FAILED, "payment-" + payment_status)
    if is_expired(saga, now, grace_seconds):
        # Unpaid past the hold's expiry, including a customer still in 3-D Secure: cancel the
        # intent; if the PSP says it already succeeded, RELEASING turns into late capture.
        return Move(RELEASING, EXPIRED, "hold-expired-unpaid")
    if payment_status == P_REQUIRES_ACTION:
        return None if saga.state == AWAITING_ACTION else Move(AWAITING_ACTION)
    # created / processing: the charge is in flight (or its outcome unknown): wait for the webhook
    # or reconciliation, which wake the saga through the payments trigger (payments_wake_checkout).
    return None if saga.state == CHARGING else Move(CHARGING)


# A payment's version when it is created, and after its first status change (each change is +1:
# the payments_forward_only trigger).
P_FIRST_CHANGE_VERSION = 2


def captured_at_once(payment) -> bool:
    """The payment's first status change was its capture (created -> succeeded, as a card the PSP
    captures synchronously): no status it waited in ever reached the checkout row. The payments
    trigger (checkouts_wake_on_payment) puts the payment on its CHARGING checkout with its first
    status change, in the same statement, so such a checkout never was CHARGING with a payment not
    captured, the only CHARGING a cancel may take (START_CANCEL)."""
    return captured_status(payment) == P_SUCCEEDED and payment.version == P_FIRST_CHANGE_VERSION


def confirms_with_capture(saga: Saga, payment) -> bool:
    """The capture is recorded with the confirm's outcome (CHARGING -> COMPLETED, one transition
    instead of CONFIRMING and then COMPLETED): a CHARGING checkout whose payment was captured at once.
    Nobody can have taken such a checkout from CHARGING into a release: a cancel is refused while its
    payment is not on the row and once it is captured (START_CANCEL), the saga itself routes a capture
    to the confirm whatever the hold's expiry, and a worker that took the lease over from a stalled
    drive confirms the same hold with the same payment. So the confirm may run before anything is
    written. Should it not end COMPLETED (the hold lost, an error), the capture is recorded first
    (CONFIRMING), and from there it goes on exactly as before. A payment that waited first (3-D
    Secure, processing) or was refunded meanwhile goes through CONFIRMING as before."""
    return (saga.state == CHARGING and payment is not None and payment.id == saga.payment_id
            and captured_at_once(payment))


def route_reschedule_payment(saga: Saga, payment_status: str | None, now: datetime) -> Move | None:
    """RESCHEDULING with the difference's payment: captured -> confirm; declined, or asking for
    3-D Secure (the difference is charged without the customer at hand) -> undo; still in flight ->
    wait for its webhook / reconciliation (a wake-up), but not past the new hold's expiry."""
    payment_status = _captured_as_succeeded(payment_status)
    if payment_status == P_SUCCEEDED:
        return Move(RESCHEDULE_CONFIRMING)
    if payment_status in (P_FAILED, P_CANCELED, P_REFUNDED):
        return Move(RESCHEDULE_REVERTING, reason="payment-" + payment_status)
    if payment_status == P_REQUIRES_ACTION:
        return Move(RESCHEDULE_REVERTING, reason="payment-requires-action")
    if saga.reschedule.expire_time is not None and now >= saga.reschedule.expire_time:
        return Move(RESCHEDULE_REVERTING, reason="hold-expired-unpaid")
    return None


def late_capture(saga: Saga) -> Move:
    """RELEASING, but the money arrived. A cancelled checkout is refunded (the buyer changed their
    mind); an expired one tries to confirm (ConfirmHold re-holds a still-free slot, DeliverCodes
    re-reserves while stock allows) and refunds only if that fails."""
    if saga.outcome == CANCELLED:
        return Move(REFUNDING, reason="captured-after-cancel")
    return Move(CONFIRMING, reason="late-capture")


def wait_until(saga: Saga, grace_seconds: float = 0.0) -> datetime | None:
    """When a waiting saga should be looked at again without any wake-up: its hold's expiry."""
    if saga.state in (HELD, CHARGING, AWAITING_ACTION) and saga.expire_time is not None:
        return saga.expire_time + timedelta(seconds=grace_seconds)
    if saga.state == RESCHEDULING and saga.reschedule.expire_time is not None:
        return saga.reschedule.expire_time
    return None


def watched_payment_id(saga: Saga) -> str | None:
    """The payment whose status the current step routes on: a reschedule's difference while it is
    charged or undone, else the purchase's."""
    if saga.state in RESCHEDULE_PAYMENT_STATES:
        return saga.reschedule.payment_id
    return saga.payment_id


# -- cancel after purchase -------------------------------------------------------------------------

# Defaults for a booking held before policies existed (docs/booking.md, "Cancellation policy").
DEFAULT_FREE_CANCELLATION_HOURS, DEFAULT_CANCELLATION_FEE_PERCENT = 24, 0
MAX_CANCEL_REASON = 500


def cancel_reason(reason: str) -> str:
    """Staff's reason for cancelling a booking: required, 1..500 printable characters."""
    reason = reason.strip()
    if not reason or len(reason) > MAX_CANCEL_REASON or not reason.isprintable():
        raise InvalidArgument("reason", f"reason must be 1..{MAX_CANCEL_REASON} printable characters when staff "
                                        f"cancel a booking, got {reason!r}")
    return reason


# -- reschedule ------------------------------------------------------------------------------------

def reschedule_payment_method(requested: str, saga: Saga) -> str | None:
    """The card that pays a price increase: the request's, else the purchase's own (None: none)."""
    if requested:
        return require_payment_method(requested)
    return saga.payment_method


# -- request validation ---------------------------------------------------------------------------

MAX_QUANTITY = 100


@dataclass(frozen=True)
class CreateRequest:
    kind: str
    slot_id: str | None
    product_id: str | None
    quantity: int
    # One-call checkout: pay with this in the same request (None: only hold).
    payment_method: str | None = None


def validate_create(slot_id: str, product_id: str, quantity: int, pay_with: str | None = None) -> CreateRequest:
    """`pay_with`: the request's payment method when it has one (None: absent; empty is invalid)."""
    # Exactly one of slot_id and product_id, each a UUID: the contract's rules (checkout.proto).
    if slot_id:
        if quantity not in (0, 1):
            raise InvalidArgument("quantity", f"a slot is booked once; quantity must be 0 or 1, got {quantity!r}")
        kind, slot_id, product_id, quantity = BOOKING, canonical_uuid("slot_id", slot_id), None, 1
    else:
        if not 1 <= quantity <= MAX_QUANTITY:
            raise InvalidArgument("quantity", f"quantity must be between 1 and {MAX_QUANTITY}, got {quantity!r}")
        kind, slot_id, product_id = CODES, None, canonical_uuid("product_id", product_id)
    return CreateRequest(kind, slot_id, product_id, quantity, None if pay_with is None else require_payment_method(pay_with))


# -- ListCheckouts' filters ------------------------------------------------------------------------

@dataclass(frozen=True)
class ListFilters:
    """The filters of a ListCheckouts request, checked (None: not filtered by it)."""
    salon_id: str | None = None
    product_id: str | None = None
    state: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None

    @property
    def created_after_key(self) -> str:
        return self.created_after.isoformat() if self.created_after else ""

    @property
    def created_before_key(self) -> str:
        return self.created_before.isoformat() if self.created_before else ""


def list_filters(*, salon_id: str, product_id: str, state: str | None, created_after: datetime | None,
                 created_before: datetime | None) -> ListFilters:
    """Ids are canonical uuids; the time window is created_after <= t < created_before."""
    if created_after is not None and created_before is not None and created_before <= created_after:
        raise InvalidArgument("created_before", f"created_before ({created_before.isoformat()}) must be after "
                                                f"created_after ({created_after.isoformat()})")
    return ListFilters(salon_id=canonical_uuid("salon_id", salon_id) if salon_id else None,
                       product_id=canonical_uuid("product_id", product_id) if product_id else None,
                       state=state, created_after=created_after, created_before=created_before)
