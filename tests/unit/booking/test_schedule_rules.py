"""Services and working hours: the input rules (booking/schedule.py), without a database."""
import uuid
from datetime import date, datetime, timezone

import pytest

from booking import schedule
from cuty.booking.v1 import booking_pb2 as pb
from cuty.common.v1 import common_pb2
from cutylib import validation
from cutylib.errors import InvalidArgument

R = str(uuid.uuid4())


def _field(call) -> str:
    with pytest.raises(InvalidArgument) as e:
        call()
    return e.value.field


def _refused(request) -> str:
    """The field the request's annotations refuse it for (the server checks them before a handler)."""
    return _field(lambda: validation.check(request))


S = str(uuid.uuid4())


def test_a_service_draft_is_checked_field_by_field():
    ok = schedule.service_draft(" Cut ", 45, "EUR", 4500, 0, 15, [R])
    assert (ok.name, ok.duration_minutes, ok.price_minor, ok.buffer_after_minutes) == ("Cut", 45, 4500, 15)
    assert _field(lambda: schedule.service_draft("Cut", 30, "XXX", 1, 0, 0, [R])) == "price.currency_code"
    assert _field(lambda: schedule.service_draft("Cut", 30, "EUR", 10**9, 0, 0, [R])) == "price.amount_minor"
    assert _field(lambda: schedule.service_draft("Cut", 30, "EUR", 1, 0, 0, [R, R.upper()])) == "resource_ids"

    def service(**over):
        base = dict(salon_id=S, name="Cut", duration_minutes=30, resource_ids=[R],
                    price=common_pb2.Money(currency_code="EUR", amount_minor=1))
        return pb.CreateServiceRequest(**{**base, **over})
    validation.check(service())
    assert _refused(service(duration_minutes=4)) == "duration_minutes"
    assert _refused(service(buffer_before_minutes=-1)) == "buffer_before_minutes"
    assert _refused(service(resource_ids=[])) == "resource_ids"
    assert _refused(service(resource_ids=[R, R])) == "resource_ids"
    assert _refused(service(resource_ids=[R, "x"])) == "resource_ids[1]"


def test_weekly_hours_take_wall_times_midnight_and_night_shifts():
    week = schedule.weekly_hours([(1, "09:00", "17:00"), (5, "20:00", "02:00"), (6, "00:00", "24:00")])
    assert [(i.weekday, i.opens, i.closes) for i in week] == [(1, "09:00", "17:00"), (5, "20:00", "02:00"),
                                                              (6, "00:00", "24:00")]
    assert _field(lambda: schedule.weekly_hours([(1, "09:00", "09:00")])) == "intervals[0].closes"
    assert _field(lambda: schedule.weekly_hours([(1, "09:00", "10:00"), (1, "09:00", "12:00")])) == "intervals[1]"

    def hours(*intervals):
        return pb.SetWorkingHoursRequest(salon_id=S, resource_id=R, intervals=[
            pb.WeeklyInterval(weekday=w, opens=o, closes=c) for w, o, c in intervals])
    validation.check(hours((6, "00:00", "24:00")))
    assert _refused(hours((8, "09:00", "10:00"))) == "intervals[0].weekday"
    assert _refused(hours((1, "24:00", "10:00"))) == "intervals[0].opens"
    assert _refused(hours((1, "09:00", "9:30"))) == "intervals[0].closes"
    assert _refused(hours(*[(1, "09:00", "10:00")] * 71)) == "intervals"


def test_a_day_override_is_closed_or_hours_or_neither():
    assert schedule.day_override("2027-03-28", True, []) == (date(2027, 3, 28), True, [])
    d, closed, ivs = schedule.day_override("2027-03-28", False, [("20:00", "02:00")])
    assert not closed and [(i.opens, i.closes) for i in ivs] == [("20:00", "02:00")]
    assert schedule.day_override("2027-03-28", False, [])[2] == []  # neither: the override goes
    assert _field(lambda: schedule.day_override("2027-3-28", True, [])) == "day"
    assert _field(lambda: schedule.day_override("2027-03-28", True, [("09:00", "10:00")])) == "intervals"


def test_settings_and_ranges():
    assert schedule.settings_change(None, None, 30) == schedule.Settings(None, None, 30)
    validation.check(pb.SetBookingSettingsRequest(salon_id=S, time_step_minutes=30))
    assert _refused(pb.SetBookingSettingsRequest(salon_id=S)) == "min_notice_minutes"  # at least one
    assert _refused(pb.SetBookingSettingsRequest(salon_id=S, time_step_minutes=7)) == "time_step_minutes"
    assert _refused(pb.SetBookingSettingsRequest(salon_id=S, booking_horizon_days=0)) == "booking_horizon_days"
    assert _refused(pb.SetBookingSettingsRequest(salon_id=S, min_notice_minutes=-1)) == "min_notice_minutes"
    assert _refused(pb.SetCancellationPolicyRequest(salon_id=S)) == "free_cancellation_hours"
    validation.check(pb.SetCancellationPolicyRequest(salon_id=S, cancellation_fee_percent=0))
    assert schedule.day_range("2027-01-01", "") == (date(2027, 1, 1), date(2027, 1, 1))
    assert _field(lambda: schedule.day_range("2027-01-02", "2027-01-01")) == "end_day"
    assert _field(lambda: schedule.day_range("2027-01-01", "2027-02-01")) == "end_day"  # 32 days


def test_availability_tokens_are_bound_to_their_query():
    service = uuid.uuid4()
    q = schedule.availability_query(service, date(2027, 1, 1), date(2027, 1, 7), None)
    at = datetime(2027, 1, 1, 9, tzinfo=timezone.utc)
    assert schedule.decode_times_token(schedule.encode_times_token(q, at), q) == at
    other = schedule.availability_query(service, date(2027, 1, 1), date(2027, 1, 8), None)
    assert _field(lambda: schedule.decode_times_token(schedule.encode_times_token(q, at), other)) == "page_token"


def test_an_offer_is_never_longer_than_a_hold():
    from booking import domain
    assert domain.offer_seconds(0, 300) == 0
    assert domain.offer_seconds(60, 300) == 60
    assert domain.offer_seconds(60, 2) == 2  # a short hold (tests, demos) offers what it has
    assert _field(lambda: domain.offer_seconds(-1, 300)) == "offer_seconds"
