"""Staff book for a customer (docs/checkout.md, "Staff book for a customer"): the rules, no I/O.

A merchant's staff make a checkout for a named customer (an existing customer id, or a contact that
becomes the merchant's guest customer) and say how it is paid: through a payment link (the
customer presents a card on the PSP's hosted page) or at the venue (confirmed unpaid; staff mark it
paid). Staff never choose a payment method and never charge a card: the request refuses one.
"""
from __future__ import annotations

from dataclasses import dataclass

from cuty.payments.v1 import checkout_pb2
from cutylib.errors import FailedPrecondition, InvalidArgument
from cutylib.money import require_money

LINK, VENUE = "link", "venue"
SETTLEMENTS = {checkout_pb2.SETTLEMENT_PAYMENT_LINK: LINK, checkout_pb2.SETTLEMENT_AT_VENUE: VENUE}
SETTLEMENT_PB = {v: k for k, v in SETTLEMENTS.items()}
CASH, CARD_TERMINAL = "cash", "card_terminal"
VENUE_METHODS = {checkout_pb2.VENUE_PAYMENT_METHOD_CASH: CASH,
                 checkout_pb2.VENUE_PAYMENT_METHOD_CARD_TERMINAL: CARD_TERMINAL}
VENUE_METHOD_PB = {v: k for k, v in VENUE_METHODS.items()}
# A payment link lives at most a day (its hold blocks the time meanwhile).
MAX_LINK_TTL_SECONDS = 86_400
GUEST_PREFIX = "guest:"
MAX_NAME = 200
MAX_CUSTOMER_ID = 200
MAX_REFERENCE = 100
# A phone (E.164) and an e-mail's shape are GuestContact's annotations; an e-mail's local part is
# at most this long (RFC 5321), which its pattern cannot also say.
MAX_EMAIL_LOCAL = 64
# Staff mark a booking no-show from its start until this long after (the database decides).
NO_SHOW_WINDOW_HOURS = 24


@dataclass(frozen=True)
class Contact:
    name: str
    phone: str | None
    email: str | None


@dataclass(frozen=True)
class StaffRequest:
    slot_id: str | None          # None: a service time, resolved to its slot by booking
    customer_id: str | None      # an existing customer (None: `contact` becomes a guest customer)
    contact: Contact | None
    settle: str
    link_ttl_seconds: int | None


def _printable(field: str, value: str, limit: int) -> str:
    value = value.strip()
    if not value or len(value) > limit or not value.isprintable():
        raise InvalidArgument(field, f"{field} must be 1..{limit} printable characters, got {value[:40]!r}")
    return value


def require_email(value: str) -> str:
    if len(value.split("@", 1)[0]) > MAX_EMAIL_LOCAL:
        raise InvalidArgument("contact.email", f"contact.email's local part (before @) is at most {MAX_EMAIL_LOCAL} "
                                               f"characters, got {value[:60]!r}")
    return value


def contact_of(pb: checkout_pb2.GuestContact) -> Contact:
    name = _printable("contact.name", pb.name, MAX_NAME)  # a phone or an e-mail: the annotation's
    return Contact(name, pb.phone or None, require_email(pb.email) if pb.email else None)


def validate(request: checkout_pb2.CreateStaffCheckoutRequest, default_link_ttl: int) -> StaffRequest:
    """The request's rules beyond its contract's annotations (which the server checked already: no
    payment method, a settlement, exactly one of slot/service and of customer/contact), before
    anything is read or written."""
    settle = SETTLEMENTS[request.settlement]
    ttl = None
    if settle == LINK:
        ttl = request.link_ttl_seconds or default_link_ttl
        if not 0 < ttl <= MAX_LINK_TTL_SECONDS:
            raise InvalidArgument("link_ttl_seconds", f"link_ttl_seconds must be 1..{MAX_LINK_TTL_SECONDS} "
                                                      f"(0: the default), got {request.link_ttl_seconds}")
    elif request.link_ttl_seconds:
        raise InvalidArgument("link_ttl_seconds", "link_ttl_seconds is for a payment link only")
    has_contact = request.HasField("contact")
    customer_id = _printable("customer_id", request.customer_id, MAX_CUSTOMER_ID) if request.customer_id else None
    contact = contact_of(request.contact) if has_contact else None
    if request.slot_id and (request.HasField("start_time") or request.resource_id):
        raise InvalidArgument("service_id", "give a slot_id or a service time (service_id, start_time), not both")
    return StaffRequest(request.slot_id or None, customer_id, contact, settle, ttl)


def guest_customer_id(guest_id) -> str:
    return f"{GUEST_PREFIX}{guest_id}"


def venue_payment(request: checkout_pb2.MarkPaidAtVenueRequest) -> tuple[str, int, str, str]:
    """(method, amount_minor, currency, reference) of a payment at the desk (its contract's
    annotations, checked by the server already, require a method and an amount)."""
    method = VENUE_METHODS[request.method]
    currency, amount = require_money("amount", request.amount.currency_code, request.amount.amount_minor)
    reference = _printable("reference", request.reference, MAX_REFERENCE)
    return method, amount, currency, reference


def refuse_mark_paid(saga, method: str, amount: int, reference: str) -> None:
    """Why MarkPaidAtVenue wrote nothing (the statement decided; this only names the reason).
    Returns when the same payment was recorded already (a repeat)."""
    if saga.venue_status == "paid":
        if (saga.venue_method, saga.venue_amount_minor, saga.venue_reference) == (method, amount, reference):
            return
        raise FailedPrecondition(f"checkout {saga.id} was marked paid already", reason="already-paid")
    if saga.settle != VENUE:
        raise FailedPrecondition(f"checkout {saga.id} is not paid at the venue", reason="not-paid-at-venue")
    if saga.no_show_at is not None:
        raise FailedPrecondition(f"checkout {saga.id} was marked no-show", reason="no-show")
    raise FailedPrecondition(f"checkout {saga.id} is {saga.state}, not a completed booking",
                             reason="checkout-not-completed")


def refuse_no_show(saga) -> None:
    """Why MarkNoShow wrote nothing; returns when it was marked already (a repeat)."""
    if saga.no_show_at is not None:
        return
    if saga.kind != "booking" or saga.state != "COMPLETED":
        raise FailedPrecondition(f"checkout {saga.id} is {saga.state}, not a completed booking",
                                 reason="checkout-not-completed")
    if saga.venue_status == "paid":
        raise FailedPrecondition(f"checkout {saga.id} was paid at the venue: the customer came", reason="already-paid")
    raise FailedPrecondition(f"a no-show is marked from the booking's start until {NO_SHOW_WINDOW_HOURS} h after "
                             f"(checkout {saga.id} starts at {saga.start_time})", reason="outside-no-show-window")
