"""Services and working hours: bookable times are computed from weekly hours, date overrides and
the salon's settings, minus holds and bookings with their buffers (docs/booking.md)."""
from datetime import date, datetime, timedelta, timezone

import asyncpg
import grpc
import pytest

from booking_harness import ADMIN, availability, local_times, service_salon, service_slot
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.grpc_errors import bad_field, error_reason
from cutylib.testing.ids import new_id

BERLIN = "Europe/Berlin"


def _last_sunday(year: int, month: int) -> date:
    d = date(year, month + 1, 1) - timedelta(days=1)
    return d - timedelta(days=(d.weekday() - 6) % 7)


def _next_year() -> int:
    return datetime.now(timezone.utc).year + 1


def _day_after_tomorrow() -> date:
    return datetime.now(timezone.utc).date() + timedelta(days=2)


async def test_free_times_follow_working_hours_and_the_grid(booking):
    s = await service_salon(booking, opens="09:00", closes="12:00", duration=60, step=30)
    day = _day_after_tomorrow()
    times = await availability(booking, s, day.isoformat())
    wall = [t[11:16] for t in local_times(times)]
    assert wall == ["09:00", "09:30", "10:00", "10:30", "11:00"]  # the last ends at closing
    assert all(sorted(t.resource_ids) == sorted(s.resource_ids) for t in times)
    assert all(t.end_time.ToDatetime() - t.start_time.ToDatetime() == timedelta(hours=1) for t in times)


async def test_a_hold_blocks_its_time_and_its_buffers_on_its_resource_only(booking, booking_pool):
    s = await service_salon(booking, opens="09:00", closes="14:00", duration=60, buffer_before=15,
                            buffer_after=30, step=15)
    day = _day_after_tomorrow()
    before = await availability(booking, s, day.isoformat())
    ten = next(t for t in before if t.local_start_time[11:16] == "10:00")
    slot = await service_slot(booking, s, ten.start_time.ToDatetime(tzinfo=timezone.utc), s.resource_ids[0])
    hold = await booking.hold(slot.id)
    assert (hold.resource_id, hold.service_id) == (s.resource_ids[0], s.service.id)
    assert (hold.buffer_before_minutes, hold.buffer_after_minutes) == (15, 30)
    after = await availability(booking, s, day.isoformat())
    r1_starts = [t.local_start_time[11:16] for t in after if s.resource_ids[0] in t.resource_ids]
    # the day's first start is 09:15 (its buffer before opens at 09:00), the last 12:30 (its buffer
    # after closes at 14:00)
    assert [t.local_start_time[11:16] for t in before][::len(before) - 1] == ["09:15", "12:30"]
    # the hold blocks 09:45-11:30; a start s needs [s - 15, s + 90) free: none before it, from 11:45 after
    assert r1_starts == ["11:45", "12:00", "12:15", "12:30"]
    r2_starts = [t.local_start_time[11:16] for t in after if s.resource_ids[1] in t.resource_ids]
    assert r2_starts == [t.local_start_time[11:16] for t in before]
    # the database's constraint agrees: the buffers are part of the blocked range
    during = await booking_pool.fetchval("SELECT during FROM holds WHERE id = $1", hold.id)
    assert during.upper - during.lower == timedelta(minutes=105)


async def test_buffers_overlap_is_refused_by_the_exclusion_constraint(booking, booking_pool):
    s = await service_salon(booking, buffer_after=30, resources=1)
    day = _day_after_tomorrow()
    first = (await availability(booking, s, day.isoformat()))[0]
    start = first.start_time.ToDatetime(tzinfo=timezone.utc)
    hold = await booking.hold((await service_slot(booking, s, start)).id)
    # a plain slot right after the service (in its buffer) on the same chair: the constraint refuses it
    plain = await booking.slots(s.salon_id, [(s.resource_ids[0], start + timedelta(minutes=60),
                                              start + timedelta(minutes=90))])
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.hold(plain[0].id)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    # and directly, without any function in between
    with pytest.raises(asyncpg.ExclusionViolationError):
        await booking_pool.execute("""
            INSERT INTO holds (id, merchant_id, slot_id, salon_id, resource_id, customer_id, request_id, start_time,
                               end_time, price_minor, currency, expires_at)
            SELECT gen_random_uuid(), merchant_id, id, salon_id, resource_id, 'c', 'r', start_time, end_time,
                   price_minor, currency, clock_timestamp() + interval '5 minutes' FROM slots WHERE id = $1""",
                                   plain[0].id)
    assert hold.status == pb.HOLD_STATUS_HELD


async def test_spring_forward_day_has_no_times_in_the_gap(booking):
    day = _last_sunday(_next_year(), 3)
    s = await service_salon(booking, time_zone=BERLIN, opens="01:00", closes="05:00", duration=60, step=60,
                            resources=1)
    wall = local_times(await availability(booking, s, day.isoformat()))
    d = day.isoformat()
    # 01:00-05:00 is three real hours that day: 01:00 (+01), then 03:00 and 04:00 (+02); the 01:00
    # service ends at 03:00 (+02) wall time, one real hour later.
    assert wall == [f"{d}T01:00:00+01:00", f"{d}T03:00:00+02:00", f"{d}T04:00:00+02:00"]
    assert not any("T02:" in t for t in wall)


async def test_fall_back_day_has_the_repeated_hour_twice(booking):
    day = _last_sunday(_next_year(), 10)
    s = await service_salon(booking, time_zone=BERLIN, opens="01:00", closes="05:00", duration=60, step=60,
                            resources=1)
    wall = local_times(await availability(booking, s, day.isoformat()))
    d = day.isoformat()
    # five real hours: 01:00 and 02:00 in summer time, 02:00 again in winter time, then 03:00, 04:00
    assert wall == [f"{d}T01:00:00+02:00", f"{d}T02:00:00+02:00", f"{d}T02:00:00+01:00",
                    f"{d}T03:00:00+01:00", f"{d}T04:00:00+01:00"]


async def test_a_dst_day_of_ordinary_hours_is_nine_real_hours(booking):
    for day in (_last_sunday(_next_year(), 3), _last_sunday(_next_year(), 10)):
        s = await service_salon(booking, time_zone=BERLIN, opens="09:00", closes="18:00", duration=60, step=60,
                                resources=1)
        wall = [t[11:16] for t in local_times(await availability(booking, s, day.isoformat()))]
        assert wall == [f"{h:02d}:00" for h in range(9, 18)]


async def test_an_override_crossing_midnight_replaces_the_day_and_runs_into_the_next(booking):
    s = await service_salon(booking, opens="09:00", closes="17:00", duration=60, step=60, resources=1)
    day = _day_after_tomorrow()
    nxt = day + timedelta(days=1)
    await booking.stub.SetHoursOverride(pb.SetHoursOverrideRequest(
        salon_id=s.salon_id, resource_id=s.resource_ids[0], day=day.isoformat(),
        intervals=[pb.TimeInterval(opens="20:00", closes="02:00")]), metadata=ADMIN)
    wall = local_times(await availability(booking, s, day.isoformat(), nxt.isoformat()))
    days = {t[:10]: [] for t in wall}
    for t in wall:
        days[t[:10]].append(t[11:16])
    # the day's weekly 09-17 is replaced by 20:00-02:00; the next day opens as usual
    assert days[day.isoformat()] == ["20:00", "21:00", "22:00", "23:00"]
    assert days[nxt.isoformat()] == ["00:00", "01:00"] + [f"{h:02d}:00" for h in range(9, 17)]
    # a service at 01:00 the next morning can be held (it is inside the override)
    one = next(t for t in await availability(booking, s, nxt.isoformat()) if t.local_start_time[11:16] == "01:00")
    hold = await booking.hold((await service_slot(booking, s, one.start_time.ToDatetime(tzinfo=timezone.utc))).id)
    assert hold.resource_id == s.resource_ids[0]


async def test_a_salon_holiday_closes_every_resource_unless_one_has_its_own_hours(booking):
    s = await service_salon(booking, opens="09:00", closes="12:00", duration=60, step=60, resources=2)
    day = _day_after_tomorrow().isoformat()
    await booking.stub.SetHoursOverride(pb.SetHoursOverrideRequest(salon_id=s.salon_id, day=day, closed=True),
                                        metadata=ADMIN)
    assert await availability(booking, s, day) == []
    await booking.stub.SetHoursOverride(pb.SetHoursOverrideRequest(
        salon_id=s.salon_id, resource_id=s.resource_ids[1], day=day,
        intervals=[pb.TimeInterval(opens="10:00", closes="12:00")]), metadata=ADMIN)
    times = await availability(booking, s, day)
    assert [(t.local_start_time[11:16], list(t.resource_ids)) for t in times] == [
        ("10:00", [s.resource_ids[1]]), ("11:00", [s.resource_ids[1]])]
    # neither closed nor intervals: the salon's override is removed, the weekly hours are back
    await booking.stub.SetHoursOverride(pb.SetHoursOverrideRequest(salon_id=s.salon_id, day=day), metadata=ADMIN)
    times = await availability(booking, s, day)
    assert [t.local_start_time[11:16] for t in times if s.resource_ids[0] in t.resource_ids] == ["09:00", "10:00", "11:00"]


async def test_notice_and_horizon_bound_the_times_and_the_hold(booking):
    s = await service_salon(booking, opens="00:00", closes="24:00", duration=60, step=60, resources=1,
                            notice=180, horizon=3)
    today = datetime.now(timezone.utc)
    times = await availability(booking, s, (today - timedelta(days=1)).date().isoformat(),
                               (today + timedelta(days=6)).date().isoformat())
    first = times[0].start_time.ToDatetime(tzinfo=timezone.utc)
    last = times[-1].start_time.ToDatetime(tzinfo=timezone.utc)
    assert today + timedelta(minutes=180) <= first <= today + timedelta(minutes=180 + 60)
    assert last <= today + timedelta(days=3)
    # a time inside the notice cannot be held
    soon = first - timedelta(hours=1)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.hold((await service_slot(booking, s, soon)).id)
    assert (e.value.code(), error_reason(e.value)) == (grpc.StatusCode.FAILED_PRECONDITION, "outside-booking-window")


async def test_availability_pages_without_repeats(booking):
    s = await service_salon(booking, opens="08:00", closes="20:00", duration=30, step=15, resources=2)
    day = _day_after_tomorrow()
    whole = await availability(booking, s, day.isoformat(), (day + timedelta(days=1)).isoformat())
    paged = await availability(booking, s, day.isoformat(), (day + timedelta(days=1)).isoformat(), page_size=7)
    assert [t.start_time.ToDatetime() for t in paged] == [t.start_time.ToDatetime() for t in whole]
    assert len(whole) == 2 * 47  # 08:00 .. 19:30 each day


@pytest.mark.parametrize("req, field", [
    (dict(duration_minutes=0), "duration_minutes"),
    (dict(buffer_after_minutes=241), "buffer_after_minutes"),
    (dict(resource_ids=[]), "resource_ids"),
    (dict(resource_ids=["nope"]), "resource_ids[0]"),
    (dict(name=" "), "name"),
])
async def test_bad_services_name_the_field_and_change_nothing(booking, booking_pool, req, field):
    salon, (r,) = await booking.salon()
    base = dict(salon_id=salon, name="Cut", duration_minutes=30, resource_ids=[r],
                price=pb.common__pb2.Money(currency_code="EUR", amount_minor=100) if hasattr(pb, "common__pb2") else None)
    base.update(req)
    if base["price"] is None:
        from cuty.common.v1 import common_pb2
        base["price"] = common_pb2.Money(currency_code="EUR", amount_minor=100)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.CreateService(pb.CreateServiceRequest(**base), metadata=ADMIN)
    assert (e.value.code(), bad_field(e.value)) == (grpc.StatusCode.INVALID_ARGUMENT, field)
    assert await booking_pool.fetchval("SELECT count(*) FROM services WHERE salon_id = $1", salon) == 0


async def test_a_resource_of_another_salon_is_refused_and_nothing_is_created(booking, booking_pool):
    salon, (r,) = await booking.salon()
    _, (other,) = await booking.salon()
    from cuty.common.v1 import common_pb2
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.CreateService(pb.CreateServiceRequest(
            salon_id=salon, name="Cut", duration_minutes=30, resource_ids=[r, other],
            price=common_pb2.Money(currency_code="EUR", amount_minor=100)), metadata=ADMIN)
    assert (e.value.code(), bad_field(e.value)) == (grpc.StatusCode.NOT_FOUND, "resource_ids[1]")
    assert await booking_pool.fetchval("SELECT count(*) FROM services WHERE salon_id = $1", salon) == 0


@pytest.mark.parametrize("intervals, field", [
    ([pb.WeeklyInterval(weekday=0, opens="09:00", closes="10:00")], "intervals[0].weekday"),
    ([pb.WeeklyInterval(weekday=1, opens="9:00", closes="10:00")], "intervals[0].opens"),
    ([pb.WeeklyInterval(weekday=1, opens="09:00", closes="09:00")], "intervals[0].closes"),
    ([pb.WeeklyInterval(weekday=1, opens="09:00", closes="25:00")], "intervals[0].closes"),
])
async def test_bad_working_hours_name_the_field(booking, intervals, field):
    salon, (r,) = await booking.salon()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.SetWorkingHours(pb.SetWorkingHoursRequest(salon_id=salon, resource_id=r,
                                                                     intervals=intervals), metadata=ADMIN)
    assert (e.value.code(), bad_field(e.value)) == (grpc.StatusCode.INVALID_ARGUMENT, field)


async def test_a_customer_may_ask_availability_but_not_change_hours(booking):
    from cutylib.testing.trust import user
    s = await service_salon(booking, resources=1)
    customer = user(new_id(), "customer")
    page = await booking.stub.GetAvailability(pb.GetAvailabilityRequest(
        salon_id=s.salon_id, service_id=s.service.id, start_day=_day_after_tomorrow().isoformat()), metadata=customer)
    assert page.times
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.SetWorkingHours(pb.SetWorkingHoursRequest(salon_id=s.salon_id, resource_id=s.resource_ids[0]),
                                           metadata=customer)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_another_merchants_admin_sees_no_service(booking):
    from cutylib.testing.trust import user
    s = await service_salon(booking, resources=1)
    other = user(new_id(), "admin", "m-" + new_id())
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.GetAvailability(pb.GetAvailabilityRequest(
            salon_id=s.salon_id, service_id=s.service.id, start_day=_day_after_tomorrow().isoformat()), metadata=other)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
