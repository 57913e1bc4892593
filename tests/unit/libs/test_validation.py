"""cutylib.validation: the protos' buf.validate rules as INVALID_ARGUMENT, naming fields as the
proto spells them, every violation listed."""
import asyncio

import pytest

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cuty.payments.v1 import checkout_pb2
from cutylib import grpc_errors, validation
from cutylib.grpc_server import _checked_stream
from google.rpc import error_details_pb2

ID = "8f14e45f-ceea-467f-a0e6-6f3a2a1b9c4d"


def test_a_valid_request_has_no_violations():
    assert validation.violations(booking_pb2.HoldSlotRequest(slot_id=ID, request_id="r-1")) == []
    assert validation.violations(booking_pb2.HoldSlotRequest(slot_id=ID.upper(), request_id="r-1")) == []
    validation.check(checkout_pb2.CreateCheckoutRequest(product_id=ID, quantity=3))


@pytest.mark.parametrize("message, fields", [
    (booking_pb2.HoldSlotRequest(slot_id="s1", request_id="r"), ["slot_id"]),
    (booking_pb2.HoldSlotRequest(slot_id=ID, request_id="   "), ["request_id"]),
    (codepool_pb2.CreateProductRequest(sku="-x", name="n", price={"currency_code": "EUR"}), ["sku"]),
    (codepool_pb2.CreateProductRequest(sku="x" * 65, name="n", price={"currency_code": "EUR"}), ["sku"]),
    (codepool_pb2.ReserveCodesRequest(order_id="o", order_item_id="i", product_id=ID, quantity=0), ["quantity"]),
    (checkout_pb2.CreateCheckoutRequest(slot_id=ID, product_id=ID), ["slot_id"]),  # exactly one of the two
    (checkout_pb2.ListCheckoutsRequest(page_size=501), ["page_size"]),
    (checkout_pb2.ListCheckoutsRequest(state=999), ["state"]),
    (checkout_pb2.ListCheckoutsRequest(salon_id="nope"), ["salon_id"]),
    (booking_pb2.BatchCreateSlotsRequest(salon_id=ID), ["slots"]),
    (booking_pb2.BatchCreateSlotsRequest(salon_id=ID, slots=[booking_pb2.SlotInput(
        resource_id=ID, start_time={"seconds": 1}, end_time={"seconds": 2}, price={"currency_code": "eur"})]),
     ["slots[0].price.currency_code"]),
])
def test_each_violation_names_its_field_path(message, fields):
    assert [f for f, _ in validation.violations(message)] == fields


def test_optional_filters_may_be_left_empty():
    assert validation.violations(checkout_pb2.ListCheckoutsRequest()) == []


def test_the_error_lists_every_violation_and_the_status_carries_each_as_a_field_violation():
    with pytest.raises(validation.RequestInvalid) as e:
        validation.check(booking_pb2.BatchCreateSlotsRequest(salon_id="x", slots=[booking_pb2.SlotInput()]))
    err = e.value
    assert err.field == "salon_id"
    assert err.message.startswith("salon_id: must be a valid UUID; slots[0].resource_id: ")
    status = grpc_errors.to_status(err)
    from grpc_status import rpc_status  # noqa: F401 - the status' details are a google.rpc.Status
    from google.rpc import status_pb2
    st = status_pb2.Status.FromString(dict(status.trailing_metadata)["grpc-status-details-bin"])
    br = error_details_pb2.BadRequest()
    st.details[0].Unpack(br)
    assert [v.field for v in br.field_violations] == [f for f, _ in err.violations]
    assert len(err.violations) == 5


def test_at_most_five_violations_are_spelled_out():
    err = validation.RequestInvalid([(f"f{i}", "bad") for i in range(8)])
    assert err.message.endswith("f4: bad; and 3 more")


def test_a_client_stream_names_repeated_items_by_their_place_across_the_stream():
    async def chunks():
        yield codepool_pb2.ImportCodesChunk(product_id=ID, batch_ref="b", codes=["A"] * 3)
        yield codepool_pb2.ImportCodesChunk(codes=["B", "x" * 300])

    async def drain():
        return [m async for m in _checked_stream(chunks())]

    with pytest.raises(validation.RequestInvalid) as e:
        asyncio.run(drain())
    assert e.value.field == "codes[4]"


def _fields(message) -> list[str]:
    return [path for path, _ in validation.violations(message)]


def test_the_schedule_staff_booking_and_claim_requests_carry_their_rules():
    """What the service, hours, staff-booking and claim handlers enforce is in their contracts:
    a valid request passes, and each broken rule names its field."""
    from cuty.codepool.v1 import claims_pb2

    week = booking_pb2.SetWorkingHoursRequest(salon_id=ID, resource_id=ID, intervals=[
        booking_pb2.WeeklyInterval(weekday=1, opens="09:00", closes="18:00")])
    assert _fields(week) == []
    week.intervals[0].weekday, week.intervals[0].closes = 8, "25:00"
    assert _fields(week) == ["intervals[0].weekday", "intervals[0].closes"]
    assert _fields(booking_pb2.SetBookingSettingsRequest(salon_id=ID, time_step_minutes=7)) == ["time_step_minutes"]
    assert _fields(booking_pb2.SetHoursOverrideRequest(salon_id=ID, day="2026-13-01")) == ["day"]
    assert _fields(booking_pb2.SetHoursOverrideRequest(salon_id=ID, day="0000-01-01")) == ["day"]
    late = booking_pb2.SetHoursOverrideRequest(salon_id=ID, day="2026-03-09", intervals=[
        booking_pb2.TimeInterval(opens="24:00", closes="24:00")])  # a day may close at 24:00, not open then
    assert _fields(late) == ["intervals[0].opens"]
    assert _fields(booking_pb2.GetAvailabilityRequest(salon_id=ID, service_id=ID, start_day="2026-03-09",
                                                      page_size=2001)) == ["page_size"]
    assert _fields(booking_pb2.CreateServiceRequest(salon_id=ID, name="Cut", duration_minutes=4,
                                                    price={"currency_code": "EUR"})) == ["duration_minutes",
                                                                                          "resource_ids"]
    assert _fields(booking_pb2.HoldSlotRequest(slot_id=ID, request_id="r", ttl_seconds=86_401)) == ["ttl_seconds"]

    staff = checkout_pb2.CreateStaffCheckoutRequest(slot_id=ID, customer_id="customer-42",
                                                    settlement=checkout_pb2.SETTLEMENT_AT_VENUE)
    assert _fields(staff) == []
    staff.service_id, staff.settlement = ID, 0
    assert sorted(_fields(staff)) == ["settlement", "slot_id"]
    guest = checkout_pb2.CreateStaffCheckoutRequest(service_id=ID, settlement=checkout_pb2.SETTLEMENT_PAYMENT_LINK,
                                                    contact={"name": "Ana", "phone": "0151 123"})
    assert _fields(guest) == ["contact.phone"]
    assert _fields(checkout_pb2.MarkPaidAtVenueRequest(checkout_id=ID, method=checkout_pb2.VENUE_PAYMENT_METHOD_CASH,
                                                       reference=" ")) == ["amount", "reference"]

    assert _fields(claims_pb2.OpenCodeClaimRequest(checkout_id="order-1", code_id=ID, reason="broken",
                                                   kind=claims_pb2.CLAIM_KIND_DOES_NOT_WORK)) == []
    assert _fields(claims_pb2.OpenCodeClaimRequest(checkout_id="order-1", code_id=ID, reason="  ")) == ["kind", "reason"]
    threshold = claims_pb2.SetClaimThresholdRequest(product_id=ID, claim_quarantine_threshold=0)
    assert _fields(threshold) == ["claim_quarantine_threshold"]
    threshold.ClearField("claim_quarantine_threshold")
    assert _fields(threshold) == []
    assert _fields(claims_pb2.ListCodeClaimsRequest(status=99, batch_id="b")) == ["status", "batch_id"]
