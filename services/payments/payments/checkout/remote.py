"""The saga's calls to booking and the code pool, and what their answers mean for the saga.

One adapter per purchase kind behind the same four verbs (hold / extend / confirm / release), so
the engine never branches on the kind. Every call carries the idempotency key of (checkout, step)
(docs/checkout.md, "Keys"), so any of them may be retried any number of times.

Errors are sorted into what the saga can act on:
- `Retryable`: UNAVAILABLE, DEADLINE_EXCEEDED (the outcome is unknown, never assumed failed), ABORTED,
  INTERNAL...: back off and repeat the step with the same key.
- `Rejected`: the hold was refused for a business reason (slot taken, out of stock): the detail is
  passed on to the buyer as it came.
- `HoldLost`: confirm refused because the hold expired and the time / stock is gone: refund.
- `Refused`: a client error to hand back unchanged (unknown slot, malformed id, hold cap).
"""
from __future__ import annotations

import logging
from datetime import datetime

import grpc

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cutylib import errors, principal
from cutylib.grpc_errors import bad_field, error_reason, unpack_detail
from cutylib.timestamps import from_timestamp

from . import domain
from .domain import Held, Saga

log = logging.getLogger(__name__)

_RETRYABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED,
})


class Retryable(Exception):
    """No definitive answer: repeat the step later with the same idempotency key."""


class Rejected(Exception):
    def __init__(self, error: errors.DomainError):
        super().__init__(error.message)
        self.error = error


class Refused(Exception):
    def __init__(self, error: errors.DomainError):
        super().__init__(error.message)
        self.error = error


class HoldLost(Exception):
    pass


# A release refused because the purchase went through. No saga path releases after a confirm, so
# this is a bug somewhere: never report the release as done (the saga would be refunded while the
# buyer keeps the booking); keep retrying, loudly, until a human looks.
_RELEASE_REFUSED = frozenset({"hold-confirmed", "order-delivered"})


def _release_refused(err: grpc.aio.AioRpcError, what: str) -> bool:
    if err.code() in _RETRYABLE:
        raise _retryable(err, what) from None
    if err.code() == grpc.StatusCode.FAILED_PRECONDITION and error_reason(err) in _RELEASE_REFUSED:
        raise RuntimeError(f"{what} refused: {err.details()}") from None
    # NOT_FOUND / FAILED_PRECONDITION otherwise: nothing left to give back (already expired or
    # released): the goal of the step holds.
    return err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


async def _confirm(call, what: str, lost: frozenset) -> None:
    """A confirm step (ConfirmHold / DeliverCodes): retryable errors retry, `lost` codes mean the
    hold is gone (the saga refunds), anything else is a bug and propagates."""
    try:
        with _as_system():
            await call()
    except grpc.aio.AioRpcError as e:
        if e.code() in _RETRYABLE:
            raise _retryable(e, what) from None
        if e.code() in lost:
            raise HoldLost(e.details()) from None
        raise


async def _release(call, what: str, saga) -> None:
    """A compensation (ReleaseHold / ReleaseReservation): done when released or nothing is left."""
    try:
        with _as_system():
            await call()
    except grpc.aio.AioRpcError as e:
        if not _release_refused(e, what):
            raise
        log.info("release: nothing left to release", extra={"checkout_id": saga.id, "step": what,
                                                             "detail": e.details()})


def _as_system():
    """Calls to booking / the code pool are made by the orchestrator itself (role system), not in
    the name of the customer whose request we are serving: the customer is passed explicitly."""
    return principal.acting_as(principal.SYSTEM)


def _retryable(err: grpc.aio.AioRpcError, what: str) -> Retryable:
    return Retryable(f"{what}: {err.code().name}: {err.details()}")


def _refused(err: grpc.aio.AioRpcError) -> Refused:
    code = err.code()
    msg = err.details() or code.name
    if code == grpc.StatusCode.NOT_FOUND:
        return Refused(errors.NotFound(msg))
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return Refused(errors.InvalidArgument(bad_field(err), msg))
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # A per-customer cap (booking's holds, the code pool's reservations): passed on under its own reason.
        return Refused(errors.ResourceExhausted(msg, reason=error_reason(err) or "too-many-holds"))
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return Refused(errors.PermissionDenied(msg))
    return Refused(errors.FailedPrecondition(msg))


# A buyer who loses the time at checkout keeps the first alternative for this long, held for them by
# booking (docs/booking.md, "The race loser is kept"); a checkout of its slot within it takes it.
LOSER_OFFER_SECONDS = 60


class BookingHolds:
    def __init__(self, stub):
        self.stub = stub

    async def hold(self, saga: Saga) -> Held:
        # A staff-made checkout is not a buyer racing for a time: no offer; a payment link's hold lasts
        # as long as the link.
        return await self.hold_slot(saga.slot_id, saga.customer_id, domain.hold_request_id(saga.id),
                                    offer_seconds=0 if saga.settle else LOSER_OFFER_SECONDS,
                                    ttl_seconds=saga.link_ttl_seconds or 0)

    async def hold_slot(self, slot_id: str, customer_id: str, request_id: str, offer_seconds: int = 0,
                        ttl_seconds: int = 0) -> Held:
        """booking.HoldSlot, idempotent on `request_id` (a purchase's hold, or a reschedule's new one).
        `offer_seconds`: a lost time leaves the buyer with an alternative held that long.
        `ttl_seconds`: the hold's length (0: booking's default)."""
        req = booking_pb2.HoldSlotRequest(slot_id=slot_id, customer_id=customer_id, request_id=request_id,
                                          offer_seconds=offer_seconds, ttl_seconds=ttl_seconds)
        try:
            with _as_system():
                h = await self.stub.HoldSlot(req)
        except grpc.aio.AioRpcError as e:
            if e.code() in _RETRYABLE:
                raise _retryable(e, "booking.HoldSlot") from None
            if e.code() == grpc.StatusCode.ALREADY_EXISTS:
                detail = unpack_detail(e, booking_pb2.SlotUnavailable) or booking_pb2.SlotUnavailable(
                    slot_id=slot_id)
                raise Rejected(errors.AlreadyExists(e.details() or "the slot is taken", reason="slot-unavailable",
                                                    detail=detail)) from None
            raise _refused(e) from None
        return Held(h.id, from_timestamp(h.expire_time), h.price.amount_minor, h.price.currency_code, h.merchant_id,
                    h.salon_id or None, from_timestamp(h.start_time), h.free_cancellation_hours,
                    h.cancellation_fee_percent)

    async def extend(self, saga: Saga) -> datetime | None:
        """The hold's expiry after the one extension; None when it can no longer be extended
        (already expired: the expiry rules take over)."""
        try:
            with _as_system():
                h = await self.stub.ExtendHold(booking_pb2.ExtendHoldRequest(hold_id=saga.hold_id))
            return from_timestamp(h.expire_time)
        except grpc.aio.AioRpcError as e:
            if e.code() in _RETRYABLE:
                raise _retryable(e, "booking.ExtendHold") from None
            if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
        # Refused: extended already (a retry after a crash) or no longer held. Its current expiry
        # tells which, and is what the saga must go by either way.
        try:
            with _as_system():
                h = await self.stub.GetHold(booking_pb2.GetHoldRequest(hold_id=saga.hold_id))
        except grpc.aio.AioRpcError as e:
            if e.code() in _RETRYABLE:
                raise _retryable(e, "booking.GetHold") from None
            raise
        return from_timestamp(h.expire_time) if h.status == booking_pb2.HOLD_STATUS_HELD else None

    async def confirm(self, saga: Saga, hold_id: str | None = None) -> None:
        # payment_ref = the payment id: ConfirmHold is idempotent on it, and re-acquires an
        # expired hold whose time is still free. `hold_id`: a reschedule's new hold (issue 12),
        # confirmed with the purchase's payment ref too, so a later cancel finds it the same way.
        req = booking_pb2.ConfirmHoldRequest(hold_id=hold_id or saga.hold_id, payment_ref=domain.payment_ref(saga))
        await _confirm(lambda: self.stub.ConfirmHold(req), "booking.ConfirmHold",
                       frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS,
                                  grpc.StatusCode.NOT_FOUND}))

    async def release(self, saga: Saga, hold_id: str | None = None) -> None:
        req = booking_pb2.ReleaseHoldRequest(hold_id=hold_id or saga.hold_id)
        await _release(lambda: self.stub.ReleaseHold(req), "booking.ReleaseHold", saga)

    async def get_slot(self, slot_id: str) -> booking_pb2.Slot:
        """A slot as booking has it (a reschedule checks the target's salon before anything is held)."""
        try:
            with _as_system():
                return await self.stub.GetSlot(booking_pb2.GetSlotRequest(slot_id=slot_id))
        except grpc.aio.AioRpcError as e:
            if e.code() in _RETRYABLE:
                raise errors.Unavailable("booking is unavailable; retry") from None
            raise _refused(e).error from None

    async def get_slot_of_caller(self, slot_id: str) -> booking_pb2.Slot:
        """A slot as the caller (a merchant's staff, whose assertion goes along) may see it: another
        merchant's is NOT_FOUND, as a missing one."""
        try:
            return await self.stub.GetSlot(booking_pb2.GetSlotRequest(slot_id=slot_id))
        except grpc.aio.AioRpcError as e:
            if e.code() in _RETRYABLE:
                raise errors.Unavailable("booking is unavailable; retry") from None
            raise _refused(e).error from None

    async def service_slot(self, service_id: str, start, resource_id: str) -> str:
        """The slot id naming a service time (booking.GetServiceSlot, made on first use), so a
        checkout of a service time is a checkout of that slot."""
        req = booking_pb2.GetServiceSlotRequest(service_id=service_id, start_time=start, resource_id=resource_id)
        try:
            with _as_system():
                return (await self.stub.GetServiceSlot(req)).id
        except grpc.aio.AioRpcError as e:
            if e.code() in _RETRYABLE:
                raise errors.Unavailable("booking is unavailable; retry") from None
            raise _refused(e).error from None

    async def cancel_booking(self, saga: Saga) -> None:
        """Issue 12: the confirmed booking cancelled after purchase (its time bookable again);
        idempotent on (hold, payment ref). Any refusal is retried and ends in NEEDS_ATTENTION."""
        req = booking_pb2.CancelBookingRequest(hold_id=saga.hold_id, payment_ref=domain.payment_ref(saga))
        try:
            with _as_system():
                await self.stub.CancelBooking(req)
        except grpc.aio.AioRpcError as e:
            if e.code() in _RETRYABLE:
                raise _retryable(e, "booking.CancelBooking") from None
            raise


# The code pool's per-customer caps (issue 10): the buyer's own doing, not the product's stock.
_CUSTOMER_CAPS = frozenset({"too-many-active-reservations", "quantity-limit"})


class CodeReservations:
    def __init__(self, stub):
        self.stub = stub

    async def hold(self, saga: Saga) -> Held:
        req = codepool_pb2.ReserveCodesRequest(order_id=saga.id, order_item_id=domain.order_item_id(saga.id),
                                               product_id=saga.product_id, quantity=saga.quantity,
                                               customer_id=saga.customer_id)
        try:
            with _as_system():
                r = await self.stub.ReserveCodes(req)
        except grpc.aio.AioRpcError as e:
            if e.code() in _RETRYABLE:
                raise _retryable(e, "codepool.ReserveCodes") from None
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_reason(e) in _CUSTOMER_CAPS:
                raise _refused(e) from None
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                detail = unpack_detail(e, codepool_pb2.OutOfStock) or codepool_pb2.OutOfStock(
                    product_id=saga.product_id, requested=saga.quantity)
                raise Rejected(errors.ResourceExhausted(e.details() or "out of stock", reason="out-of-stock",
                                                        detail=detail)) from None
            raise _refused(e) from None
        return Held(None, from_timestamp(r.expire_time), r.unit_price.amount_minor * saga.quantity,
                    r.unit_price.currency_code, r.merchant_id)

    async def extend(self, saga: Saga) -> datetime | None:
        return saga.expire_time  # reservations are long (CUTY_CODE_RESERVATION_TTL_SECONDS); never extended

    async def confirm(self, saga: Saga) -> None:
        req = codepool_pb2.DeliverCodesRequest(order_id=saga.id, payment_transaction_id=domain.payment_ref(saga))
        await _confirm(lambda: self.stub.DeliverCodes(req), "codepool.DeliverCodes",
                       frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  grpc.StatusCode.NOT_FOUND}))

    async def release(self, saga: Saga) -> None:
        req = codepool_pb2.ReleaseReservationRequest(order_id=saga.id)
        await _release(lambda: self.stub.ReleaseReservation(req), "codepool.ReleaseReservation", saga)

    async def delivered_codes(self, saga: Saga) -> list[tuple[str, str]]:
        req = codepool_pb2.GetDeliveredCodesRequest(order_id=saga.id, customer_id=saga.customer_id)
        try:
            with _as_system():
                r = await self.stub.GetDeliveredCodes(req)
        except grpc.aio.AioRpcError as e:
            if e.code() in _RETRYABLE:
                log.warning("code pool unavailable", extra={"checkout_id": saga.id, "detail": e.details()})
                raise errors.Unavailable("the code pool is unavailable; retry") from None
            raise
        return [(c.id, c.value) for c in r.codes]


class Inventory:
    """What a checkout buys from: booking (a slot's hold) or the code pool (a reservation), by the
    checkout's kind. (Not booking's `Holds` repository: this is the saga's side of the wire.)"""

    def __init__(self, booking_stub, codepool_stub):
        self.booking = BookingHolds(booking_stub)
        self.codes = CodeReservations(codepool_stub)

    def of(self, saga: Saga):
        return self.booking if saga.kind == domain.BOOKING else self.codes
