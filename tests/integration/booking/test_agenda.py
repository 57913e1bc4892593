"""A salon's agenda (ListBookings). One local day of the salon (midnight to
midnight on its wall clock: 23 or 25 hours on a DST day), its confirmed bookings (and, asked for,
its live holds) in (start, resource, id) order, paged like ListSlots; staff and admins of the
salon's merchant read it (not the platform's operator: the agenda names customers and booking keeps
no read audit), another merchant's staff find no salon."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import grpc
import pytest

from booking_harness import Booking
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.grpc_errors import bad_field
from cutylib.testing.ids import new_id
from cutylib.testing.trust import user

STAFF = user("agenda-staff", "staff")
OTHER_STAFF = user("agenda-staff", "staff", "merchant-other-" + uuid.uuid4().hex[:6])
UTC = timezone.utc


def utc(*a) -> datetime:
    return datetime(*a, tzinfo=UTC)


async def book(booking: Booking, slot: pb.Slot, *, confirm: bool = True, customer: str | None = None) -> pb.Hold:
    hold = await booking.hold(slot.id, customer)
    if confirm:
        hold = await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=hold.id, payment_ref="pay-" + hold.id[:8]))
    return hold


async def agenda(booking: Booking, salon: str, day: str, metadata=STAFF, **kw) -> list[pb.Booking]:
    out, token = [], ""
    while True:
        got = await booking.stub.ListBookings(pb.ListBookingsRequest(salon_id=salon, day=day, page_token=token, **kw),
                                              metadata=metadata)
        out += got.bookings
        token = got.next_page_token
        if not token:
            return out


async def test_the_agenda_shows_a_days_confirmed_bookings_in_order_and_held_ones_on_request(booking):
    salon, (r1, r2) = await booking.salon(resources=2)  # Europe/Istanbul, UTC+3 all year
    # 2027-02-10 local: 09:00, 10:00 on both chairs; the next day's 01:00 local is not in it.
    slots = await booking.slots(salon, [(r1, utc(2027, 2, 10, 6), utc(2027, 2, 10, 7)),
                                        (r2, utc(2027, 2, 10, 6), utc(2027, 2, 10, 7)),
                                        (r1, utc(2027, 2, 10, 7), utc(2027, 2, 10, 8)),
                                        (r2, utc(2027, 2, 10, 7), utc(2027, 2, 10, 8)),
                                        (r1, utc(2027, 2, 10, 22), utc(2027, 2, 10, 23))])
    confirmed = [await book(booking, slots[i], customer=f"cust-{i}") for i in (0, 1, 4)]
    held = await book(booking, slots[2], confirm=False)
    released = await book(booking, slots[3], confirm=False)
    await booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=released.id))

    day = await agenda(booking, salon, "2027-02-10")
    # the same start on both chairs: by resource id
    assert [b.hold_id for b in day] == [h for _, h in sorted([(slots[0].resource_id, confirmed[0].id),
                                                              (slots[1].resource_id, confirmed[1].id)])]
    first = day[0]
    assert first.status == pb.HOLD_STATUS_CONFIRMED and first.payment_ref.startswith("pay-")
    assert first.customer_id in ("cust-0", "cust-1") and first.slot_id in (slots[0].id, slots[1].id)
    assert first.local_start_time == "2027-02-10T09:00:00+03:00"
    assert first.start_time.ToDatetime(tzinfo=UTC) == utc(2027, 2, 10, 6)
    assert first.end_time.ToDatetime(tzinfo=UTC) == utc(2027, 2, 10, 7)
    # 22:00 UTC is 01:00 on the 11th in Istanbul: the next day's agenda
    assert [b.hold_id for b in await agenda(booking, salon, "2027-02-11")] == [confirmed[2].id]

    with_held = await agenda(booking, salon, "2027-02-10", include_held=True)
    assert {b.hold_id for b in with_held} == {confirmed[0].id, confirmed[1].id, held.id}
    assert [b.status for b in with_held][-1] == pb.HOLD_STATUS_HELD and with_held[-1].payment_ref == ""
    keys = [(b.start_time.ToDatetime(), b.resource_id, b.hold_id) for b in with_held]
    assert keys == sorted(keys)


async def test_an_expired_hold_is_not_on_the_agenda(booking, booking_pool):
    salon, (r1,) = await booking.salon()
    (slot,) = await booking.slots(salon, [(r1, utc(2027, 2, 12, 6), utc(2027, 2, 12, 7))])
    hold = await book(booking, slot, confirm=False)
    await booking_pool.execute("UPDATE holds SET expires_at = clock_timestamp() - interval '1 second' WHERE id = $1",
                               uuid.UUID(hold.id))
    assert await agenda(booking, salon, "2027-02-12", include_held=True) == []


@pytest.mark.parametrize("day,change,inside", [
    # Spring forward (2027-03-28, 23 hours): local midnight is 23:00 UTC the day before (CET),
    # the next one 22:00 UTC (CEST).
    ("2027-03-28", "spring", [utc(2027, 3, 27, 23), utc(2027, 3, 28, 1, 30), utc(2027, 3, 28, 21)]),
    # Fall back (2027-10-31, 25 hours): 22:00 UTC the day before (CEST) to 23:00 UTC (CET).
    ("2027-10-31", "fall", [utc(2027, 10, 30, 22), utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 22)]),
])
async def test_a_dst_day_is_local_midnight_to_midnight(booking, day, change, inside):
    salon, (r1,) = await booking.salon(time_zone="Europe/Berlin")
    first, last = inside[0], inside[-1]
    outside = [first - timedelta(hours=1), (utc(2027, 3, 28, 22) if change == "spring" else utc(2027, 10, 31, 23))]
    starts = sorted(inside + outside)
    slots = await booking.slots(salon, [(r1, s, s + timedelta(minutes=30)) for s in starts])
    for s in slots:
        await book(booking, s)
    got = await agenda(booking, salon, day)
    assert [b.start_time.ToDatetime(tzinfo=UTC) for b in got] == inside, change
    assert got[0].local_start_time.startswith(f"{day}T00:00:00")
    assert got[-1].local_start_time.startswith(f"{day}T23:")
    # the day is 23 or 25 hours long: the offsets at its two ends differ by one hour
    offsets = {b.local_start_time[-6:] for b in got}
    assert offsets == {"+01:00", "+02:00"}, (change, offsets)
    assert (last - first) > timedelta(hours=21)


async def test_pages_walk_the_agenda_once_and_a_token_belongs_to_its_query(booking):
    salon, (r1, r2) = await booking.salon(resources=2)
    spans = [(r, utc(2027, 2, 15, 5 + i), utc(2027, 2, 15, 6 + i)) for i in range(3) for r in (r1, r2)]
    for s in await booking.slots(salon, spans):
        await book(booking, s)
    pages, tokens = [], [""]
    while True:
        got = await booking.stub.ListBookings(pb.ListBookingsRequest(salon_id=salon, day="2027-02-15", page_size=4,
                                                                     page_token=tokens[-1]), metadata=STAFF)
        pages.append([b.hold_id for b in got.bookings])
        if not got.next_page_token:
            break
        tokens.append(got.next_page_token)
    first_token = tokens[1]
    assert [len(p) for p in pages] == [4, 2]
    assert len({h for p in pages for h in p}) == 6
    for other in (dict(day="2027-02-16"), dict(day="2027-02-15", include_held=True)):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await booking.stub.ListBookings(pb.ListBookingsRequest(salon_id=salon, page_token=first_token, **other),
                                            metadata=STAFF)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == "page_token"


@pytest.mark.parametrize("change,field", [
    (dict(day=""), "day"),
    (dict(day="2027-13-01"), "day"),
    (dict(day="2027-2-1"), "day"),
    (dict(day="2027-02-01T00:00:00Z"), "day"),
    (dict(salon_id="not-a-uuid"), "salon_id"),
    (dict(page_size=-1), "page_size"),
    (dict(page_token="not-a-token"), "page_token"),
])
async def test_bad_input_names_the_field(booking, change, field):
    salon, _ = await booking.salon()
    req = dict(salon_id=salon, day="2027-02-01")
    req.update(change)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.ListBookings(pb.ListBookingsRequest(**req), metadata=STAFF)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(e.value) == field


async def test_who_reads_the_agenda(booking):
    salon, (r1,) = await booking.salon()
    (slot,) = await booking.slots(salon, [(r1, utc(2027, 2, 20, 6), utc(2027, 2, 20, 7))])
    hold = await book(booking, slot)
    req = pb.ListBookingsRequest(salon_id=salon, day="2027-02-20")
    for md in (STAFF, user(new_id(), "admin")):
        assert [b.hold_id for b in (await booking.stub.ListBookings(req, metadata=md)).bookings] == [hold.id]
    cases = [(user(new_id(), "operator"), grpc.StatusCode.PERMISSION_DENIED),  # customers' names: unaudited here
             (OTHER_STAFF, grpc.StatusCode.NOT_FOUND),
             (user(new_id(), "admin", "merchant-other-" + uuid.uuid4().hex[:6]), grpc.StatusCode.NOT_FOUND),
             (user(new_id(), "customer"), grpc.StatusCode.PERMISSION_DENIED),
             (user(new_id(), "staff", ""), grpc.StatusCode.UNAUTHENTICATED)]
    for md, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await booking.stub.ListBookings(req, metadata=md)
        assert e.value.code() == code, md
    # a salon that does not exist reads the same as another merchant's
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.ListBookings(pb.ListBookingsRequest(salon_id=str(uuid.uuid4()), day="2027-02-20"),
                                        metadata=STAFF)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_the_hold_names_its_salon(booking):
    salon, (r1,) = await booking.salon()
    (slot,) = await booking.slots(salon, [(r1, utc(2027, 2, 21, 6), utc(2027, 2, 21, 7))])
    assert (await booking.hold(slot.id)).salon_id == salon
