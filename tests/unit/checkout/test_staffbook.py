"""The rules of a staff-made checkout (payments/checkout/staffbook.py): a precise error naming the
field for every bad request, before anything is read or written."""
import pytest

from cuty.common.v1 import common_pb2
from cuty.payments.v1 import checkout_pb2 as pb
from cutylib import validation
from cutylib.errors import FailedPrecondition, InvalidArgument
from payments.checkout import staffbook
from payments.checkout.domain import Saga

SLOT = "7b0f3c54-5b5e-4a53-9d57-1f0c0d6b1a11"


def req(**over) -> pb.CreateStaffCheckoutRequest:
    base = dict(slot_id=SLOT, customer_id="customer-1", settlement=pb.SETTLEMENT_AT_VENUE)
    base.update(over)
    return pb.CreateStaffCheckoutRequest(**base)


def field_of(request) -> str:
    """The field a bad request is refused for, as the server refuses it: its contract's annotations
    first (cutylib.validation, in every server), then staffbook's own rules."""
    with pytest.raises(InvalidArgument) as e:
        validation.check(request)
        staffbook.validate(request, 86_400)
    return e.value.field


def test_a_venue_booking_for_a_customer():
    r = staffbook.validate(req(), 86_400)
    assert (r.slot_id, r.customer_id, r.contact, r.settle, r.link_ttl_seconds) == (SLOT, "customer-1", None, "venue", None)


def test_a_link_lives_the_default_or_what_is_asked_up_to_a_day():
    assert staffbook.validate(req(settlement=pb.SETTLEMENT_PAYMENT_LINK), 3600).link_ttl_seconds == 3600
    assert staffbook.validate(req(settlement=pb.SETTLEMENT_PAYMENT_LINK, link_ttl_seconds=60), 3600).link_ttl_seconds == 60
    assert field_of(req(settlement=pb.SETTLEMENT_PAYMENT_LINK, link_ttl_seconds=86_401)) == "link_ttl_seconds"
    assert field_of(req(settlement=pb.SETTLEMENT_PAYMENT_LINK, link_ttl_seconds=-1)) == "link_ttl_seconds"
    assert field_of(req(link_ttl_seconds=60)) == "link_ttl_seconds"  # a venue booking has no link


@pytest.mark.parametrize("over, field", [
    (dict(payment_method="pm_card_ok"), "payment_method"),
    (dict(payment_method=""), "payment_method"),
    (dict(settlement=pb.SETTLEMENT_UNSPECIFIED), "settlement"),
    (dict(customer_id=""), "customer_id"),
    (dict(contact=pb.GuestContact(name="A", phone="+905321234567")), "customer_id"),  # both
    (dict(customer_id="x" * 201), "customer_id"),
    (dict(slot_id=""), "slot_id"),
    (dict(service_id=SLOT), "slot_id"),  # a slot and a service time
    (dict(resource_id=SLOT), "service_id"),  # a slot and a service time's resource
])
def test_bad_requests_name_the_field(over, field):
    assert field_of(req(**over)) == field


@pytest.mark.parametrize("phone", ["+905321234567", "+12025550123", "+4915112345678"])
def test_e164_phones(phone):
    c = staffbook.validate(req(customer_id="", contact=pb.GuestContact(name="Ayşe", phone=phone)), 1).contact
    assert c.phone == phone and c.email is None


@pytest.mark.parametrize("phone", ["05321234567", "+90 532 123 45 67", "+0532123456", "+12345", "+1234567890123456",
                                   "+90-532-1234567", "tel:+905321234567", "+９０５３２１２３４５６７"])
def test_other_phones_are_refused(phone):
    assert field_of(req(customer_id="", contact=pb.GuestContact(name="A", phone=phone))) == "contact.phone"


@pytest.mark.parametrize("email", ["ayse@example.com", "a.b+tag@sub.example.co", "x_y@e-x.io"])
def test_emails(email):
    assert staffbook.validate(req(customer_id="", contact=pb.GuestContact(name="A", email=email)), 1).contact.email == email


@pytest.mark.parametrize("email", ["a@b", "no-at.example.com", "a@@b.com", ".a@b.com", "a.@b.com", "a..b@c.com",
                                   "a@-b.com", "a@b-.com", "a b@c.com", "a@b.c0m", "a" * 65 + "@b.com",
                                   "a@" + "b" * 250 + ".com"])
def test_other_emails_are_refused(email):
    assert field_of(req(customer_id="", contact=pb.GuestContact(name="A", email=email))) == "contact.email"


def test_a_contact_needs_a_name_and_a_phone_or_email():
    assert field_of(req(customer_id="", contact=pb.GuestContact(phone="+905321234567"))) == "contact.name"
    assert field_of(req(customer_id="", contact=pb.GuestContact(name="A"))) == "contact.phone"


def test_a_venue_payment_names_its_bad_part():
    good = dict(checkout_id=SLOT, method=pb.VENUE_PAYMENT_METHOD_CARD_TERMINAL,
                amount=common_pb2.Money(currency_code="TRY", amount_minor=75000), reference="T-1")
    assert staffbook.venue_payment(pb.MarkPaidAtVenueRequest(**good)) == ("card_terminal", 75000, "TRY", "T-1")
    for over, field in ((dict(method=0), "method"), (dict(amount=None), "amount"),
                        (dict(amount=common_pb2.Money(currency_code="XXQ", amount_minor=1)), "amount.currency_code"),
                        (dict(amount=common_pb2.Money(currency_code="TRY", amount_minor=-1)), "amount.amount_minor"),
                        (dict(reference=" "), "reference"), (dict(reference="r" * 101), "reference")):
        with pytest.raises(InvalidArgument) as e:
            request = pb.MarkPaidAtVenueRequest(**{**good, **over})
            validation.check(request)
            staffbook.venue_payment(request)
        assert e.value.field == field, over


def _saga(**over) -> Saga:
    import datetime as dt
    now = dt.datetime.now(dt.timezone.utc)
    base = dict(id=SLOT, customer_id="c", kind="booking", state="COMPLETED", outcome=None, version=5, slot_id=SLOT,
                product_id=None, quantity=1, hold_id="h", order_id=None, amount_minor=100, currency="TRY",
                expire_time=now, extended=False, payment_key="k", payment_id=None, payment_method=None,
                failure_reason="", attempts=0, lease_owner=None, created_at=now, updated_at=now, read_at=now,
                settle="venue", venue_status="unpaid", start_time=now)
    base.update(over)
    return Saga(**base)


def test_why_a_mark_wrote_nothing():
    paid = _saga(venue_status="paid", venue_method="cash", venue_amount_minor=100, venue_reference="r")
    staffbook.refuse_mark_paid(paid, "cash", 100, "r")  # the same payment again: no error
    for saga, reason in ((paid, "already-paid"), (_saga(settle=None, venue_status=None), "not-paid-at-venue"),
                         (_saga(no_show_at=paid.created_at), "no-show"), (_saga(state="CANCELLING"), "checkout-not-completed")):
        with pytest.raises(FailedPrecondition) as e:
            staffbook.refuse_mark_paid(saga, "cash", 100, "other")
        assert e.value.reason == reason
    staffbook.refuse_no_show(_saga(no_show_at=paid.created_at))  # marked already: no error
    for saga, reason in ((_saga(kind="codes"), "checkout-not-completed"), (paid, "already-paid"),
                         (_saga(), "outside-no-show-window")):
        with pytest.raises(FailedPrecondition) as e:
            staffbook.refuse_no_show(saga)
        assert e.value.reason == reason
