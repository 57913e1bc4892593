"""DST in a salon's zone (America/New_York): times travel as UTC instants, the wall clock is only
for display. No slot starts in the spring-forward gap; the two fall-back 01:30s are two instants."""
from datetime import date, datetime, time, timedelta, timezone

from booking.domain import wall_clock_starts
from booking_harness import at
from cuty.booking.v1 import booking_pb2 as pb

NY = "America/New_York"


def _next_sunday(year: int, month: int, nth: int) -> date:
    first = date(year, month, 1)
    return first + timedelta(days=(6 - first.weekday()) % 7 + 7 * (nth - 1))


def _next_transitions() -> tuple[date, date]:
    """The next US spring-forward (2nd Sunday of March) and fall-back (1st Sunday of November) days
    that are still ahead, so their slots can be created."""
    today = datetime.now(timezone.utc).date()
    year = today.year + 1
    return _next_sunday(year, 3, 2), _next_sunday(year, 11, 1)


async def _salon_with_wall_clock_slots(booking, day: date):
    salon, (r1,) = await booking.salon(time_zone=NY)
    starts = wall_clock_starts(NY, day, time(0, 0), time(4, 0), timedelta(minutes=30))
    await booking.slots(salon, [(r1, s, s + timedelta(minutes=30)) for s in starts])
    listed = await booking.stub.ListSlots(pb.ListSlotsRequest(
        salon_id=salon, start_time=at(datetime.combine(day, time(0), timezone.utc)),
        end_time=at(datetime.combine(day + timedelta(days=1), time(0), timezone.utc))))
    return salon, r1, list(listed.slots)


def _check_local_matches_instant(slots) -> None:
    for s in slots:
        local = datetime.fromisoformat(s.local_start_time)
        assert local.utcoffset() is not None
        assert local == s.start_time.ToDatetime(tzinfo=timezone.utc)


async def test_spring_forward_has_no_slot_in_the_gap(booking):
    spring, _ = _next_transitions()
    _, _, slots = await _salon_with_wall_clock_slots(booking, spring)
    local = [s.local_start_time for s in slots]
    d = spring.isoformat()
    assert local == [f"{d}T00:00:00-05:00", f"{d}T00:30:00-05:00", f"{d}T01:00:00-05:00", f"{d}T01:30:00-05:00",
                     f"{d}T03:00:00-04:00", f"{d}T03:30:00-04:00"]
    assert not any("T02:" in t for t in local)
    _check_local_matches_instant(slots)


async def test_fall_back_keeps_both_one_thirties_as_distinct_instants(booking):
    _, fall = _next_transitions()
    _, _, slots = await _salon_with_wall_clock_slots(booking, fall)
    d = fall.isoformat()
    local = [s.local_start_time for s in slots]
    assert local == [f"{d}T00:00:00-04:00", f"{d}T00:30:00-04:00", f"{d}T01:00:00-04:00", f"{d}T01:30:00-04:00",
                     f"{d}T01:00:00-05:00", f"{d}T01:30:00-05:00",
                     f"{d}T02:00:00-05:00", f"{d}T02:30:00-05:00", f"{d}T03:00:00-05:00", f"{d}T03:30:00-05:00"]
    first, second = (s for s in slots if "T01:30:00" in s.local_start_time)
    assert second.start_time.ToDatetime() - first.start_time.ToDatetime() == timedelta(hours=1)
    _check_local_matches_instant(slots)
    # two instants, two independent slots: both can be held at once
    assert (await booking.hold(first.id)).status == pb.HOLD_STATUS_HELD
    assert (await booking.hold(second.id)).status == pb.HOLD_STATUS_HELD


async def test_a_utc_instant_in_the_local_gap_hour_reads_as_the_real_wall_time(booking):
    spring, _ = _next_transitions()
    salon, (r1,) = await booking.salon(time_zone=NY)
    # 07:00Z is the very instant clocks jump from 02:00 EST to 03:00 EDT
    start = datetime.combine(spring, time(7, 0), timezone.utc)
    (slot,) = await booking.slots(salon, [(r1, start, start + timedelta(hours=1))])
    assert slot.local_start_time == f"{spring.isoformat()}T03:00:00-04:00"
    got = await booking.stub.GetSlot(pb.GetSlotRequest(slot_id=slot.id))
    assert got.local_start_time == slot.local_start_time and got.start_time == slot.start_time
