"""The race for a slot is decided by the database: one winner, everybody else told at once with
alternatives; slots of different lengths on one chair can't double-book either."""
import asyncio
import random
from datetime import timedelta

import grpc

from cuty.booking.v1 import booking_pb2 as pb
from cutylib.grpc_errors import error_reason, unpack_detail
from cutylib.testing.ids import new_id

from booking_harness import tomorrow


async def _active_holds(pool, resource_id: str) -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM holds WHERE resource_id = $1 AND status IN ('held', 'confirmed')", resource_id)


async def test_200_concurrent_holds_on_one_slot_make_exactly_one_hold(booking, booking_pool):
    salon, (r1, r2) = await booking.salon(resources=2)
    slots = await booking.day(salon, [r1, r2], tomorrow(9), count=4)
    target = slots[r1][1]  # 10:00 on chair 1

    results = await asyncio.gather(*(booking.hold(target.id) for _ in range(200)), return_exceptions=True)

    holds = [r for r in results if isinstance(r, pb.Hold)]
    errors = [r for r in results if not isinstance(r, pb.Hold)]
    assert len(holds) == 1
    assert holds[0].status == pb.HOLD_STATUS_HELD and holds[0].slot_id == target.id
    assert len(errors) == 199
    assert all(isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.ALREADY_EXISTS for e in errors), \
        {e.code() if isinstance(e, grpc.aio.AioRpcError) else repr(e) for e in errors}
    for e in errors:
        assert error_reason(e) == "slot-unavailable"
        detail = unpack_detail(e, pb.SlotUnavailable)
        assert detail.slot_id == target.id
        assert len(detail.alternatives) == 3
        assert target.id not in {a.id for a in detail.alternatives}
    # the database agrees: exactly one active hold on the chair, and it is the winner's
    assert await _active_holds(booking_pool, r1) == 1
    assert await booking_pool.fetchval("SELECT id::text FROM holds WHERE slot_id = $1", target.id) == holds[0].id


async def test_alternatives_are_nearest_same_length_same_resource_first(booking):
    salon, (r1, r2) = await booking.salon(resources=2)
    start = tomorrow(9)
    hour = timedelta(hours=1)
    hourly = await booking.day(salon, [r1, r2], start, count=5)          # 09..14 on both chairs
    short = await booking.slots(salon, [(r1, start + 5 * hour, start + 5 * hour + timedelta(minutes=30))])
    target = hourly[r1][2]                                               # 11:00 on chair 1
    await booking.hold(hourly[r1][1].id)                                 # 10:00 on chair 1 is taken
    await booking.hold(target.id)

    try:
        await booking.hold(target.id)
        raise AssertionError("second hold of a held slot succeeded")
    except grpc.aio.AioRpcError as e:
        alts = unpack_detail(e, pb.SlotUnavailable).alternatives
    # On chair 1: 12:00 is 1 h away, 09:00 and 13:00 are 2 h away (the earlier start breaks the
    # tie; 10:00 is taken). Chair 2's free 11:00 is nearer but comes after chair 1's; the
    # 30-minute slot never comes (another length).
    assert [(a.resource_id, a.start_time.ToDatetime()) for a in alts] == [
        (r1, (start + 3 * hour).replace(tzinfo=None)),
        (r1, start.replace(tzinfo=None)),
        (r1, (start + 4 * hour).replace(tzinfo=None)),
    ]
    assert short[0].id not in {a.id for a in alts}
    assert all(a.available and a.local_start_time.endswith("+03:00") for a in alts)


async def test_overlapping_slots_of_different_lengths_never_double_book(booking, booking_pool):
    salon, (r1,) = await booking.salon()
    start = tomorrow(10)
    long_, short, adjacent = await booking.slots(salon, [
        (r1, start, start + timedelta(hours=1)),                                       # 10:00-11:00
        (r1, start + timedelta(minutes=30), start + timedelta(hours=1)),               # 10:30-11:00
        (r1, start + timedelta(hours=1), start + timedelta(hours=1, minutes=30)),      # 11:00-11:30
    ])
    # many buyers race for the two overlapping slots at once: only one of them can win
    racers = [random.choice([long_.id, short.id]) for _ in range(60)]
    results = await asyncio.gather(*(booking.hold(s) for s in racers), return_exceptions=True)
    winners = [r for r in results if isinstance(r, pb.Hold)]
    assert len(winners) == 1
    assert all(e.code() == grpc.StatusCode.ALREADY_EXISTS for e in results if not isinstance(e, pb.Hold))
    assert await _active_holds(booking_pool, r1) == 1
    # a slot added later inside the held time reads as taken
    (inner,) = await booking.slots(salon, [(r1, start + timedelta(minutes=15), start + timedelta(minutes=45))])
    assert inner.available is False
    # back-to-back is not overlap: the 11:00 slot is still free
    assert (await booking.hold(adjacent.id)).status == pb.HOLD_STATUS_HELD
    assert await _active_holds(booking_pool, r1) == 2


async def test_a_confirmed_booking_blocks_like_a_hold(booking):
    salon, (r1,) = await booking.salon()
    (slot,) = (await booking.day(salon, [r1], tomorrow(9), count=1))[r1]
    hold = await booking.hold(slot.id)
    await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=hold.id, payment_ref="pay_" + new_id()))
    try:
        await booking.hold(slot.id)
        raise AssertionError("a booked slot was held again")
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.ALREADY_EXISTS
        assert list(unpack_detail(e, pb.SlotUnavailable).alternatives) == []  # the salon has no other slot
    got = await booking.stub.GetSlot(pb.GetSlotRequest(slot_id=slot.id))
    assert got.available is False
