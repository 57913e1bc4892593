"""The saga's steps: each performs its remote call (idempotent on its (checkout, step) key) between
two crash-injection points and says what follows, without writing anything itself: the engine
records the result with one fenced statement (engine.py)."""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from opentelemetry import trace

from cutylib import crash, errors
from cutylib.metrics import observe

from ..domain import HOSTED_PAGE, OFF_SESSION_SETUP
from . import domain, repository as repo
from .domain import Move, Saga, Step
from .metrics import CheckoutMetrics
from .ports import Payments
from .remote import HoldLost, Inventory, Refused, Rejected, Retryable
from .reschedule import Learned, initiator_role, refuse_unasked_charge
from .settings import CheckoutOptions

log = logging.getLogger(__name__)

FREE_NOTE = "free: no payment taken"
VENUE_NOTE = "pay at the venue: confirmed unpaid"
# failure_reason of a checkout whose paying request was gone before its charge could start.
PAY_DEADLINE_PASSED = "pay-deadline-passed"
tracer = trace.get_tracer("cuty.checkout")


@dataclass(frozen=True)
class Outcome:
    move: Move | None = None                   # the transition to record (None: only facts learned)
    learned: repo.Fields = repo.Fields()       # facts to write with the next statement
    payment: object | None = None              # a PaymentView the step just read, if any
    note: str = ""                             # "[what happened; ]<step> <ms>ms": the timeline shows it
    raise_after: Exception | None = None       # raised once the move is recorded (a refused hold)


# Steps that undo part of a checkout, counted by kind when they succeed.
_COMPENSATIONS = {Step.RELEASE: "release", Step.CANCEL_PAYMENT: "cancel_intent", Step.REFUND: "refund",
                  Step.RESCHEDULE_REVERT: "reschedule_revert"}


def _link_method(saga: Saga) -> str | None:
    """A payment link's payment: the card is the customer's to present on the PSP's hosted page."""
    return HOSTED_PAGE if saga.settle == "link" else None


def _link_offer(saga: Saga) -> int | None:
    """The no-show fee a payment link offers its customer (None: not a link, or no fee)."""
    return saga.no_show_fee_offered_minor if saga.settle == "link" else None


class Steps:
    def __init__(self, holds: Inventory, payments: Payments, metrics: CheckoutMetrics, options: CheckoutOptions):
        self.holds = holds
        self.payments = payments
        self.metrics = metrics
        self.options = options

    async def perform(self, step: Step, saga: Saga, payment, status: str | None) -> Outcome:
        t0 = time.perf_counter()
        with tracer.start_as_current_span(f"checkout.{step.value}") as span:
            span.set_attribute("cuty.checkout.id", saga.id)
            for k, v in (("cuty.payment.id", saga.payment_id), ("cuty.hold.id", saga.hold_id),
                         ("cuty.order.id", saga.order_id)):
                if v:
                    span.set_attribute(k, v)
            out = await getattr(self, "_" + step.value)(saga, payment, status)
            if out.payment is not None:
                span.set_attribute("cuty.payment.id", out.payment.id)
            elapsed = time.perf_counter() - t0
            observe(self.metrics.step_duration.labels(step.value), elapsed)
            kind = _COMPENSATIONS.get(step)
            if kind is not None:
                self.metrics.compensations.labels(kind).inc()
        took = f"{step.value} {1000 * elapsed:.1f}ms"
        return dataclasses.replace(out, note=f"{out.note}; {took}" if out.note else took)

    async def _remote(self, step: Step, call):
        """A remote call between the crash-injection points of its step."""
        crash.point(f"{step.value}:before")
        result = await call
        crash.point(f"{step.value}:after")
        return result

    # -- one method per Step ----------------------------------------------------------------------
    async def _hold(self, saga: Saga, payment, status) -> Outcome:
        holds = self.holds.of(saga)
        try:
            held = await self._remote(Step.HOLD, holds.hold(saga))
        except Rejected as rej:
            return Outcome(Move(domain.REJECTED, reason=rej.error.reason), raise_after=rej)
        if saga.merchant_id is not None and held.merchant_id != saga.merchant_id:
            # A staff-made checkout is its staff's merchant's from the start (the hold's answer names
            # the slot's): another merchant's slot does not exist for them. The hold goes back at
            # once, and they are answered as for a missing slot.
            await holds.release(saga, held.hold_id)
            raise Refused(errors.NotFound(f"slot {saga.slot_id} not found", field="slot_id"))
        if domain.holds_and_pays(saga):
            # A one-call checkout: the hold and the payment's start in one transition (the PAY
            # step's move and note, without a HELD row in between).
            return Outcome(Move(domain.CHARGING), repo.Fields(held=held, payment_key=domain.payment_attempt_id(saga.id)),
                           note=f"pay {saga.payment_method}")
        return Outcome(Move(domain.HELD), repo.Fields(held=held))

    async def _pay(self, saga: Saga, payment, status) -> Outcome:
        # A one-call checkout, held: HELD -> CHARGING with its payment attempt, the move PayCheckout's
        # first write makes (START_CHARGING); the charge and what follows are the same steps after it.
        how = {"link": "pay through a payment link", "venue": "pay at the venue"}.get(saga.settle or "")
        return Outcome(Move(domain.CHARGING), repo.Fields(payment_key=domain.payment_attempt_id(saga.id)),
                       note=f"{how} (made by {saga.created_by})" if how else f"pay {saga.payment_method}")

    async def _abandon(self, saga: Saga, payment, status) -> Outcome:
        # The request that asked for the payment is gone before the charge started: release, no charge.
        return Outcome(Move(domain.RELEASING, domain.FAILED, PAY_DEADLINE_PASSED))

    async def _expire(self, saga: Saga, payment, status) -> Outcome:
        return Outcome(Move(domain.RELEASING, domain.EXPIRED, "hold-expired-unpaid"))

    async def _extend(self, saga: Saga, payment, status) -> Outcome:
        expire = await self._remote(Step.EXTEND, self.holds.of(saga).extend(saga))
        if expire is None:
            # The hold ran out between PayCheckout's check and the extension: nothing has been
            # charged yet (the charge step comes after), so give up cleanly.
            return Outcome(Move(domain.RELEASING, domain.EXPIRED, "hold-expired"), repo.Fields(extended=True))
        # Recorded with the charge's result: a crash before that repeats the extension, which
        # booking answers with the same hold (one extension, idempotent).
        return Outcome(learned=repo.Fields(extended=True, expire_time=expire))

    async def _charge(self, saga: Saga, payment, status) -> Outcome:
        if saga.amount_minor == 0:
            # A free item: nothing to charge and no PSP call. The payment attempt
            # key stands in for the payment as the confirm step's reference.
            return Outcome(Move(domain.CONFIRMING), note=FREE_NOTE)
        if saga.settle == "venue":
            # Paid at the desk: confirmed without an online payment, unpaid until staff mark it paid.
            return Outcome(Move(domain.CONFIRMING), note=VENUE_NOTE)
        try:
            payment = await self._remote(Step.CHARGE, self.payments.create_and_charge(
                checkout_id=saga.id, amount_minor=saga.amount_minor, currency=saga.currency,
                payment_method=saga.payment_method or _link_method(saga), idempotency_key=saga.payment_key,
                customer_id=saga.customer_id, merchant_id=saga.merchant_id,
                # A no-show fee accepted at purchase: the PSP saves the card for that one charge. A
                # payment link's offer: its hosted page asks the customer, and saves it if they accept.
                off_session=OFF_SESSION_SETUP if saga.no_show_fee_minor is not None
                or _link_offer(saga) is not None else None,
                consent_minor=_link_offer(saga)))
        except (errors.InvalidArgument, errors.FailedPrecondition) as refused:
            # Refused before reaching the PSP (e.g. a zero amount): nothing was charged, and
            # retrying cannot help.
            log.warning("payment refused", extra={"checkout_id": saga.id, "error": refused.message})
            return Outcome(Move(domain.RELEASING, domain.FAILED, "payment-refused"))
        return Outcome(learned=repo.Fields(payment_id=payment.id), payment=payment)

    async def _observe(self, saga: Saga, payment, status) -> Outcome:
        return Outcome(domain.route_payment(saga, status, saga.read_at, self.options.expiry_grace_seconds))

    async def _confirm(self, saga: Saga, payment, status) -> Outcome:
        # A payment link's customer may have accepted its no-show fee on the PSP's page: recorded
        # with the move to COMPLETED, as a customer's own acceptance is with their purchase.
        accepted_at = None
        if _link_offer(saga) is not None and saga.no_show_fee_minor is None and saga.payment_id:
            accepted_at = await self._remote(Step.CONFIRM, self.payments.consent_accepted_at(saga.payment_id))
        try:
            await self._remote(Step.CONFIRM, self.holds.of(saga).confirm(saga))
        except HoldLost as lost:
            log.warning("hold lost before confirm; refunding", extra={"checkout_id": saga.id, "detail": str(lost)})
            return Outcome(Move(domain.REFUNDING, reason="hold-lost"))
        if accepted_at is None:
            return Outcome(Move(domain.COMPLETED))
        return Outcome(Move(domain.COMPLETED), repo.Fields(no_show_fee_accepted_at=accepted_at),
                       note=f"no-show fee {saga.no_show_fee_offered_minor} {saga.currency} minor units accepted "
                            "on the payment page")

    async def _cancel_payment(self, saga: Saga, payment, status) -> Outcome:
        payment = await self._remote(Step.CANCEL_PAYMENT, self.payments.cancel(saga.payment_id))
        if not payment.terminal:
            raise Retryable(f"payment {payment.id} still {payment.status} after cancel")
        return Outcome(payment=payment)  # the next round releases, or follows late capture

    async def _late_capture(self, saga: Saga, payment, status) -> Outcome:
        self.metrics.late_captures.inc()
        log.warning("late capture", extra={"checkout_id": saga.id, "outcome": saga.outcome})
        return Outcome(domain.late_capture(saga))

    async def _release(self, saga: Saga, payment, status) -> Outcome:
        await self._remote(Step.RELEASE, self.holds.of(saga).release(saga))
        return Outcome(Move(saga.outcome))

    async def _refund(self, saga: Saga, payment, status) -> Outcome:
        if saga.payment_id is None and saga.amount_minor == 0:
            # A free checkout whose hold was lost: nothing was taken, so nothing goes back but the hold.
            await self._remote(Step.RELEASE, self.holds.of(saga).release(saga))
            return Outcome(Move(domain.REFUNDED), note=f"{FREE_NOTE}: nothing to refund")
        payment = await self._remote(Step.REFUND, self.payments.refund(saga.payment_id, domain.refund_key(saga.id)))
        if payment.status != domain.P_REFUNDED:
            raise Retryable(f"payment {payment.id} is {payment.status} after refund")
        # Give back whatever is still held (a cancelled checkout's slot; a no-op when it was lost).
        await self._remote(Step.RELEASE, self.holds.of(saga).release(saga))
        return Outcome(Move(domain.REFUNDED), payment=payment)

    async def _cancel_purchase(self, saga: Saga, payment, status) -> Outcome:
        """A COMPLETED booking cancelled after purchase. The refund the cancel decided
        (refund_amount_minor, fixed when CANCELLING began) through the payments core's refunds, on
        the key of (checkout, cancel-refund), then booking's CancelBooking frees the slot. Both are
        idempotent, so a crash between them (crash points cancel_refund:after, cancel_release:before)
        repeats the refund as a replay and finishes the release."""
        amount = saga.refund_amount_minor or 0
        refunded = None
        if amount > 0:
            reason = saga.cancel_reason or "cancelled by the customer under the booking's cancellation policy"
            # The purchase's payment first, then what reschedules to dearer slots charged, each
            # on a key of its own; a repeat asks each what it asked the first time.
            left = amount
            for payment_id, remaining, asked in await self.payments.captured_payments(
                    saga.id, saga.payment_id, domain.cancel_refund_key(saga.id), domain.cancel_refund_key(saga.id) + ":"):
                take = asked if asked is not None else min(left, remaining)
                if take <= 0:
                    continue
                key = domain.cancel_refund_key(saga.id)
                if payment_id != saga.payment_id:
                    key += f":{payment_id}"
                crash.point("cancel_refund:before")
                refunded = await self.payments.issue_refund(
                    saga.merchant_id, payment_id, key, amount_minor=take,
                    currency=None, reason=reason, actor=saga.cancelled_by or "system", codes_delivered_ok=True,
                    note=f"cancel after purchase by {saga.cancelled_by}: {reason}")
                crash.point("cancel_refund:after")
                if refunded.status != "succeeded":
                    raise Retryable(f"refund {refunded.id} of checkout {saga.id} is {refunded.status}")
                left -= take
                if left <= 0:
                    break
        crash.point("cancel_release:before")
        await self.holds.booking.cancel_booking(saga)
        crash.point("cancel_release:after")
        note = f"refunded {amount} {saga.currency or ''} minor units" if refunded is not None else "nothing refunded"
        return Outcome(Move(domain.CANCELLED_AFTER_PURCHASE), note=note)

    # -- reschedule (docs/checkout.md "Reschedule") ------------------------------
    # Hold the new slot, charge a price increase, confirm the new hold, cancel the old booking,
    # refund a price decrease; each call on a key of (checkout, reschedule number, step). The old
    # booking is given up only after the new one is confirmed (never both lost), in the same step,
    # repeated until done (never both kept).

    async def _reschedule_hold(self, saga: Saga, payment, status) -> Outcome:
        try:
            held = await self._remote(Step.RESCHEDULE_HOLD, self.holds.booking.hold_slot(
                saga.reschedule.slot_id, saga.customer_id, domain.reschedule_key(saga.id, saga.reschedule.seq, "hold")))
        except (Rejected, Refused) as refused:
            # Taken by another buyer (the database decided; the detail carries the alternatives), or
            # refused: nothing was held, so the booking stays as it is.
            reason = refused.error.reason or type(refused.error).__name__
            return Outcome(Move(domain.COMPLETED, reason=reason), note=f"new slot refused: {reason}",
                           raise_after=Rejected(refused.error))
        facts = repo.Fields(reschedule=Learned(hold_id=held.hold_id, amount_minor=held.amount_minor,
                                               start_time=held.start_time, expire_time=held.expire_time))
        if (held.merchant_id, held.salon_id, held.currency) != (saga.merchant_id, saga.salon_id, saga.currency):
            # RescheduleCheckout checked the slot's salon first; a slot never changes salon.
            return Outcome(Move(domain.RESCHEDULE_REVERTING, reason="slot-of-another-salon"), facts)
        difference = held.amount_minor - (saga.reschedule.from_amount_minor or 0)
        state = domain.RESCHEDULING if difference > 0 else domain.RESCHEDULE_CONFIRMING
        return Outcome(Move(state), facts, note=f"new hold {held.hold_id}, difference {difference:+d} minor units")

    async def _reschedule_charge(self, saga: Saga, payment, status) -> Outcome:
        difference = saga.reschedule.difference or 0
        if difference <= 0:
            return Outcome(Move(domain.RESCHEDULE_CONFIRMING))
        try:
            # The request checked the slot's price; this is the price held, just before the charge.
            refuse_unasked_charge(initiator_role(saga.reschedule.by),
                                         new_minor=saga.reschedule.amount_minor or 0,
                                         paid_minor=saga.reschedule.from_amount_minor or 0, currency=saga.currency)
        except errors.FailedPrecondition as refused:
            log.warning("reschedule charge not started by the customer; undoing",
                        extra={"checkout_id": saga.id, "rescheduled_by": saga.reschedule.by})
            return Outcome(Move(domain.RESCHEDULE_REVERTING, reason=refused.reason))
        try:
            payment = await self._remote(Step.RESCHEDULE_CHARGE, self.payments.create_and_charge(
                checkout_id=saga.id, amount_minor=difference, currency=saga.currency,
                payment_method=saga.reschedule.payment_method or "",
                idempotency_key=domain.reschedule_key(saga.id, saga.reschedule.seq, "payment"),
                customer_id=saga.customer_id, merchant_id=saga.merchant_id))
        except (errors.InvalidArgument, errors.FailedPrecondition) as refused:
            log.warning("reschedule payment refused", extra={"checkout_id": saga.id, "error": refused.message})
            return Outcome(Move(domain.RESCHEDULE_REVERTING, reason="payment-refused"))
        # Recorded at once (the same state): a wake-up for this payment finds the saga watching it.
        return Outcome(Move(domain.RESCHEDULING), repo.Fields(reschedule=Learned(payment_id=payment.id)), payment=payment,
                       note=f"difference charged: payment {payment.id} {payment.status}")

    async def _reschedule_observe(self, saga: Saga, payment, status) -> Outcome:
        return Outcome(domain.route_reschedule_payment(saga, status, saga.read_at))

    async def _reschedule_confirm(self, saga: Saga, payment, status) -> Outcome:
        crash.point("reschedule_confirm:before")
        try:
            await self.holds.booking.confirm(saga, saga.reschedule.hold_id)
        except HoldLost as lost:
            log.warning("new hold lost before confirm; undoing the reschedule",
                        extra={"checkout_id": saga.id, "detail": str(lost)})
            return Outcome(Move(domain.RESCHEDULE_REVERTING, reason="hold-lost"))
        crash.point("reschedule_confirm:after")
        crash.point("reschedule_release:before")
        await self.holds.booking.cancel_booking(saga)  # the old booking (hold_id until the swap)
        crash.point("reschedule_release:after")
        difference = saga.reschedule.difference or 0
        note = f"rescheduled from slot {saga.slot_id} to {saga.reschedule.slot_id}"
        if difference < 0 and saga.payment_id is not None:
            crash.point("reschedule_refund:before")
            refund = await self.payments.issue_refund(
                saga.merchant_id, saga.payment_id, domain.reschedule_key(saga.id, saga.reschedule.seq, "refund"),
                amount_minor=-difference, currency=None, reason="rescheduled to a cheaper slot",
                actor=saga.reschedule.by or "system", codes_delivered_ok=True,
                note=f"reschedule #{saga.reschedule.seq}: difference refunded")
            crash.point("reschedule_refund:after")
            if refund.status != "succeeded":
                raise Retryable(f"refund {refund.id} of checkout {saga.id} is {refund.status}")
            note += f"; refunded {-difference} {saga.currency} minor units"
        elif difference > 0:
            note += f"; charged {difference} {saga.currency} minor units"
        return Outcome(Move(domain.COMPLETED), note=note)

    async def _reschedule_revert(self, saga: Saga, payment, status) -> Outcome:
        """Compensation: the difference's payment cancelled (or refunded when it was captured, even
        late), then the new hold released; the booking stays as it was."""
        if saga.reschedule.payment_id is not None:
            if payment is None or payment.id != saga.reschedule.payment_id:
                payment = await self.payments.get(saga.reschedule.payment_id)
            if not payment.terminal:
                payment = await self._remote(Step.RESCHEDULE_REVERT, self.payments.cancel(payment.id))
                if not payment.terminal:
                    raise Retryable(f"payment {payment.id} still {payment.status} after cancel")
            if payment.status in (domain.P_SUCCEEDED, domain.P_PARTIALLY_REFUNDED):
                payment = await self.payments.refund(payment.id, domain.reschedule_key(
                    saga.id, saga.reschedule.seq, "revert-refund"), note="reschedule undone: difference refunded")
                if payment.status != domain.P_REFUNDED:
                    raise Retryable(f"payment {payment.id} is {payment.status} after refund")
        if saga.reschedule.hold_id is not None:
            crash.point("reschedule_unhold:before")
            await self.holds.booking.release(saga, saga.reschedule.hold_id)
            crash.point("reschedule_unhold:after")
        return Outcome(Move(domain.COMPLETED), payment=payment,
                       note=f"reschedule undone ({saga.reschedule.failure or 'abandoned'})")
