"""Salons, resources and slots as the admin creates them and customers list them."""
from datetime import timedelta, timezone

from booking_harness import ADMIN, at, tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.testing.ids import new_id


async def test_created_things_read_back_as_sent(booking):
    salon = await booking.stub.CreateSalon(pb.CreateSalonRequest(name="  Kuaför Ayşe ", time_zone="Europe/Istanbul"),
                                           metadata=ADMIN)
    assert (salon.name, salon.time_zone) == ("Kuaför Ayşe", "Europe/Istanbul") and len(salon.id) == 36
    chair = await booking.stub.CreateResource(pb.CreateResourceRequest(salon_id=salon.id, name="Ayşe"), metadata=ADMIN)
    assert (chair.salon_id, chair.name) == (salon.id, "Ayşe")

    start = tomorrow(9)
    spans = [(chair.id, start + timedelta(hours=h), start + timedelta(hours=h + 1)) for h in (3, 0, 2)]
    made = await booking.slots(salon.id, spans, price=75000, currency="TRY")
    # answered in the order sent, with the salon's wall time alongside the UTC instant
    assert [s.start_time.ToDatetime() for s in made] == [s.replace(tzinfo=None) for _, s, _ in spans]
    istanbul = timezone(timedelta(hours=3))  # no DST since 2016
    assert made[1].local_start_time == start.astimezone(istanbul).isoformat()  # 09:00Z is 12:00+03:00
    assert all((s.price.currency_code, s.price.amount_minor, s.salon_id, s.available) == ("TRY", 75000, salon.id, True)
               for s in made)
    got = await booking.stub.GetSlot(pb.GetSlotRequest(slot_id=made[0].id))
    assert got == made[0]


async def test_list_slots_in_time_order_with_availability(booking):
    salon, (r1, r2) = await booking.salon(resources=2)
    start = tomorrow(9)
    slots = await booking.day(salon, [r1, r2], start, count=3)
    held = await booking.hold(slots[r1][1].id)
    released = await booking.hold(slots[r2][2].id)
    await booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=released.id))
    window = dict(salon_id=salon, start_time=at(start), end_time=at(start + timedelta(hours=3)))

    everything = (await booking.stub.ListSlots(pb.ListSlotsRequest(**window))).slots
    assert [(s.start_time.ToDatetime(), s.resource_id) for s in everything] == sorted(
        (s.start_time.ToDatetime(), s.resource_id) for r in (r1, r2) for s in slots[r])
    assert {s.id for s in everything if not s.available} == {held.slot_id}

    free = (await booking.stub.ListSlots(pb.ListSlotsRequest(**window, available_only=True))).slots
    assert {s.id for s in free} == {s.id for r in (r1, r2) for s in slots[r]} - {held.slot_id}

    # the window is [start, end) on start times
    narrow = (await booking.stub.ListSlots(pb.ListSlotsRequest(
        salon_id=salon, start_time=at(start + timedelta(hours=1)), end_time=at(start + timedelta(hours=2))))).slots
    assert {s.id for s in narrow} == {slots[r1][1].id, slots[r2][1].id}


async def test_available_only_on_a_fully_booked_salon_is_empty_not_missing(booking):
    salon, (r1,) = await booking.salon()
    (slot,) = (await booking.day(salon, [r1], tomorrow(9), count=1))[r1]
    await booking.hold(slot.id, new_id())
    listed = await booking.stub.ListSlots(pb.ListSlotsRequest(
        salon_id=salon, start_time=at(tomorrow(0)), end_time=at(tomorrow(23)), available_only=True))
    assert list(listed.slots) == []
