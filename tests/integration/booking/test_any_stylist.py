"""Any free stylist: a hold of a service time without a named resource takes one free able resource,
chosen and inserted in one statement (booking_take_service_hold); the race loser is kept: the first
alternative is held for them at once (docs/booking.md)."""
import asyncio
import random
from datetime import timedelta, timezone

import grpc
import pytest

from booking_harness import ADMIN, availability, service_salon, service_slot
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.grpc_errors import error_reason, unpack_detail
from cutylib.testing.ids import new_id
from test_service_hours import _day_after_tomorrow


async def _first_time(booking, s, hour: str = "10:00"):
    times = await availability(booking, s, _day_after_tomorrow().isoformat())
    return next(t for t in times if t.local_start_time[11:16] == hour).start_time.ToDatetime(tzinfo=timezone.utc)


async def _active(pool, resource_id: str, start) -> int:
    return await pool.fetchval("""
        SELECT count(*) FROM holds WHERE resource_id = $1 AND status IN ('held', 'confirmed')
           AND during && tstzrange($2::timestamptz, $2::timestamptz + interval '1 minute')""", resource_id, start)


async def _hold(booking, slot_id: str, customer: str | None = None, request: str | None = None, offer: int = 0):
    return await booking.stub.HoldSlot(pb.HoldSlotRequest(slot_id=slot_id, customer_id=customer or new_id(),
                                                          request_id=request or new_id(), offer_seconds=offer))


async def test_any_resource_holds_take_each_free_resource_once_then_lose(booking, booking_pool):
    s = await service_salon(booking, resources=3)
    start = await _first_time(booking, s)
    slot = await service_slot(booking, s, start)
    assert slot.resource_id == "" and slot.service_id == s.service.id
    holds = [await _hold(booking, slot.id) for _ in range(3)]
    assert sorted(h.resource_id for h in holds) == sorted(s.resource_ids)
    assert all(h.slot_id == slot.id and h.start_time.ToDatetime(tzinfo=timezone.utc) == start for h in holds)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _hold(booking, slot.id)
    assert (e.value.code(), error_reason(e.value)) == (grpc.StatusCode.ALREADY_EXISTS, "slot-unavailable")
    alts = unpack_detail(e.value, pb.SlotUnavailable).alternatives
    # the same service at the nearest other free times, as "any" slots: everyone is busy 10:00-11:00,
    # so 09:00 and 11:00, then 11:15
    assert len(alts) == 3 and all(a.service_id == s.service.id and a.resource_id == "" for a in alts)
    assert sorted(a.start_time.ToDatetime(tzinfo=timezone.utc) - start for a in alts) == [
        timedelta(minutes=-60), timedelta(minutes=60), timedelta(minutes=75)]
    for r in s.resource_ids:
        assert await _active(booking_pool, r, start) == 1


async def test_the_least_booked_resource_of_the_day_is_chosen(booking):
    s = await service_salon(booking, resources=3)
    nine, eleven = await _first_time(booking, s, "09:00"), await _first_time(booking, s, "11:00")
    busy, quiet = s.resource_ids[0], s.resource_ids[2]
    # resource 0 has two bookings that day, resource 1 one, resource 2 none
    for at, r in ((nine, busy), (eleven, busy), (nine, s.resource_ids[1])):
        await _hold(booking, (await service_slot(booking, s, at, r)).id)
    one = await _first_time(booking, s, "14:00")
    first = await _hold(booking, (await service_slot(booking, s, one)).id)
    assert first.resource_id == quiet
    second = await _hold(booking, (await service_slot(booking, s, one)).id)
    assert second.resource_id == s.resource_ids[1]


async def test_a_resource_not_working_then_is_never_chosen(booking):
    s = await service_salon(booking, resources=2)
    day = _day_after_tomorrow().isoformat()
    await booking.stub.SetHoursOverride(pb.SetHoursOverrideRequest(salon_id=s.salon_id, resource_id=s.resource_ids[0],
                                                                   day=day, closed=True), metadata=ADMIN)
    start = await _first_time(booking, s)
    slot = await service_slot(booking, s, start)
    assert (await _hold(booking, slot.id)).resource_id == s.resource_ids[1]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _hold(booking, slot.id)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_200_buyers_race_for_any_stylist_one_winner_per_resource(booking, booking_pool):
    s = await service_salon(booking, resources=5)
    start = await _first_time(booking, s)
    slot = await service_slot(booking, s, start)
    named = await service_slot(booking, s, start, s.resource_ids[0])
    # any-stylist buyers and buyers of resource 0 by name, all at once
    calls = [_hold(booking, slot.id) for _ in range(150)] + [_hold(booking, named.id) for _ in range(50)]
    random.Random(7).shuffle(calls)
    results = await asyncio.gather(*calls, return_exceptions=True)
    won = [r for r in results if isinstance(r, pb.Hold)]
    lost = [r for r in results if not isinstance(r, pb.Hold)]
    assert len(won) == 5 and sorted(h.resource_id for h in won) == sorted(s.resource_ids)
    assert all(isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.ALREADY_EXISTS for e in lost)
    # the database agrees: exactly one active hold per resource at that time, five in all
    for r in s.resource_ids:
        assert await _active(booking_pool, r, start) == 1
    assert await booking_pool.fetchval(
        "SELECT count(*) FROM holds WHERE salon_id = $1 AND status IN ('held', 'confirmed')", s.salon_id) == 5


async def test_a_named_loser_is_offered_that_stylists_nearest_times_then_another_stylist(booking):
    s = await service_salon(booking, resources=2, opens="09:00", closes="11:00", step=60)
    nine, ten = await _first_time(booking, s, "09:00"), await _first_time(booking, s, "10:00")
    r0, r1 = s.resource_ids
    named = await service_slot(booking, s, ten, r0)
    await _hold(booking, named.id)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _hold(booking, named.id)
    alts = unpack_detail(e.value, pb.SlotUnavailable).alternatives
    # the named stylist's free times first (09:00 that day, then the next days' 09:00 and 10:00)
    assert len(alts) == 3 and all(a.resource_id == r0 and a.service_id == s.service.id for a in alts)
    assert alts[0].start_time.ToDatetime(tzinfo=timezone.utc) == nine
    # once the named stylist has nothing left near it, the same time with another stylist
    day = _day_after_tomorrow()
    for d in range(-2, 3):
        if d:
            await booking.stub.SetHoursOverride(pb.SetHoursOverrideRequest(
                salon_id=s.salon_id, resource_id=r0, day=(day + timedelta(days=d)).isoformat(), closed=True),
                metadata=ADMIN)
    await _hold(booking, (await service_slot(booking, s, nine, r0)).id)
    await asyncio.sleep(1.1)  # a hot slot's losers get alternatives at most 1 s old (booking/taken.py)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _hold(booking, named.id)
    alts = unpack_detail(e.value, pb.SlotUnavailable).alternatives
    assert [(a.resource_id, a.start_time.ToDatetime(tzinfo=timezone.utc)) for a in alts][:1] == [(r1, ten)], \
        [(a.resource_id, a.local_start_time) for a in alts]


# --- the race loser is kept ----------------------------------------------------------------------

async def test_a_loser_gets_the_first_alternative_held_and_takes_it_in_one_call(booking, booking_pool):
    salon, (r1,) = await booking.salon()
    slots = await booking.day(salon, [r1], _tomorrow_nine(), count=3)
    target, alt = slots[r1][1], slots[r1][0]
    await booking.hold(target.id)
    loser = new_id()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _hold(booking, target.id, loser, offer=60)
    detail = unpack_detail(e.value, pb.SlotUnavailable)
    offer = detail.held_alternative
    assert offer.id and offer.offered and offer.customer_id == loser
    assert offer.slot_id == detail.alternatives[0].id
    assert timedelta(seconds=55) < (offer.expire_time.ToDatetime() - offer.create_time.ToDatetime()) <= timedelta(seconds=61)
    assert offer.slot_id in (alt.id, slots[r1][2].id)
    # nobody else can have it meanwhile
    with pytest.raises(grpc.aio.AioRpcError):
        await booking.hold(offer.slot_id)
    # one call accepts it: holding its slot (a checkout of it) adopts the offered hold
    taken = await _hold(booking, offer.slot_id, loser)
    assert taken.id == offer.id and not taken.offered
    assert taken.expire_time.ToDatetime() - offer.expire_time.ToDatetime() > timedelta(seconds=200)
    assert await booking_pool.fetchval("SELECT count(*) FROM holds WHERE customer_id = $1", loser) == 1


async def test_a_retry_of_the_lost_request_finds_the_same_offer(booking, booking_pool):
    salon, (r1,) = await booking.salon()
    slots = await booking.day(salon, [r1], _tomorrow_nine(), count=4)
    await booking.hold(slots[r1][1].id)
    loser, request = new_id(), new_id()
    offers = []
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _hold(booking, slots[r1][1].id, loser, request, offer=60)
        offers.append(unpack_detail(e.value, pb.SlotUnavailable).held_alternative.id)
    assert offers[0] and offers[0] == offers[1]
    assert await booking_pool.fetchval("SELECT count(*) FROM holds WHERE customer_id = $1", loser) == 1


async def test_an_offer_counts_in_the_cap_and_lapses_like_any_hold(short_booking, booking_pool):
    booking = short_booking  # holds (and offers, never longer than a hold) of 1 s
    salon, (r1,) = await booking.salon()
    slots = await booking.day(salon, [r1], _tomorrow_nine(), count=3)
    await booking.hold(slots[r1][1].id)
    loser = new_id()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _hold(booking, slots[r1][1].id, loser, offer=1)
    offer = unpack_detail(e.value, pb.SlotUnavailable).held_alternative
    assert offer.id
    assert await booking_pool.fetchval(
        "SELECT count(*) FROM holds WHERE customer_id = $1 AND status = 'held' AND expires_at > clock_timestamp()",
        loser) == 1
    await asyncio.sleep(1.2)
    # lapsed: anyone may hold its slot now, and the loser's adoption is gone with it
    other = await booking.hold(offer.slot_id)
    assert other.status == pb.HOLD_STATUS_HELD and other.id != offer.id


async def test_a_loser_at_the_cap_is_offered_nothing_but_still_told_alternatives(booking):
    salon, (r1, r2) = await booking.salon(resources=2)
    slots = await booking.day(salon, [r1, r2], _tomorrow_nine(), count=4)
    loser = new_id()
    for s in slots[r2][:3]:  # CUTY_MAX_ACTIVE_HOLDS = 3 by default
        await _hold(booking, s.id, loser)
    await booking.hold(slots[r1][1].id)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _hold(booking, slots[r1][1].id, loser, offer=60)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_any_stylist_loser_is_kept_with_an_any_slot(booking):
    s = await service_salon(booking, resources=1)
    start = await _first_time(booking, s)
    slot = await service_slot(booking, s, start)
    await _hold(booking, slot.id)
    loser = new_id()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _hold(booking, slot.id, loser, offer=60)
    offer = unpack_detail(e.value, pb.SlotUnavailable).held_alternative
    assert offer.offered and offer.resource_id == s.resource_ids[0] and offer.service_id == s.service.id
    taken = await _hold(booking, offer.slot_id, loser)
    assert taken.id == offer.id


def _tomorrow_nine():
    from booking_harness import tomorrow
    return tomorrow(9)


async def test_expired_holds_still_marked_held_give_way_on_every_able_resource(booking, booking_pool):
    """booking_retire_stale_among: a held hold past its expiry (the sweeper not there yet) on any
    able resource is retired before a service hold is placed, so it never blocks one."""
    s = await service_salon(booking, resources=2)
    start = await _first_time(booking, s)
    slot = await service_slot(booking, s, start)
    stale = [await _hold(booking, slot.id) for _ in range(2)]
    assert sorted(h.resource_id for h in stale) == sorted(s.resource_ids)
    await booking_pool.execute("UPDATE holds SET expires_at = clock_timestamp() - interval '1 second' "
                               "WHERE id = ANY ($1::uuid[])", [h.id for h in stale])
    taken = await _hold(booking, slot.id)
    assert taken.resource_id in s.resource_ids
    statuses = dict(await booking_pool.fetch("SELECT id::text, status FROM holds WHERE id = ANY ($1::uuid[])",
                                             [h.id for h in stale]))
    assert sorted(statuses.values()) == ["expired", "expired"]  # both able resources' stale holds retired
    for r in s.resource_ids:
        assert await _active(booking_pool, r, start) == (1 if r == taken.resource_id else 0)


async def _take_in_open_transaction(pool, slot_id: str):
    """A buyer's HoldSlot statement run inside a transaction left open: its hold is inserted but not
    committed (a buyer caught mid-way). Returns (connection, transaction, the resource it took)."""
    conn = await pool.acquire()
    tx = conn.transaction()
    await tx.start()
    taken = await conn.fetchval("SELECT (hold).resource_id::text FROM booking_take_hold($1, $2, $3, $4, 900, 10, 3, 0)",
                                new_id(), slot_id, new_id(), new_id())
    return conn, tx, taken


async def test_an_any_stylist_buyer_is_not_kept_waiting_by_another_buyers_unfinished_hold(booking, booking_pool):
    """Two buyers want the same least booked stylist; the first has inserted its hold but not yet
    committed. The second is not made to wait for that commit (and then lose it): it takes the
    next free stylist at once."""
    s = await service_salon(booking, resources=3)
    nine, two = await _first_time(booking, s, "09:00"), await _first_time(booking, s, "14:00")
    quiet = s.resource_ids[2]  # the others have a booking that day, so every buyer wants this one first
    for r in s.resource_ids[:2]:
        await _hold(booking, (await service_slot(booking, s, nine, r)).id)
    slot = await service_slot(booking, s, two)
    conn, tx, first = await _take_in_open_transaction(booking_pool, slot.id)
    try:
        assert first == quiet
        # it would wait until the transaction ends, which it does not while this runs
        second = await asyncio.wait_for(_hold(booking, slot.id), timeout=20)
        assert second.resource_id in s.resource_ids[:2]
    finally:
        await tx.rollback()
        await booking_pool.release(conn)
    # the rolled back buyer's stylist is free again, and the next buyer takes it
    third = await _hold(booking, slot.id)
    assert third.resource_id == quiet
    for r in (second.resource_id, quiet):
        assert await _active(booking_pool, r, two) == 1


async def test_when_every_free_stylist_is_being_taken_a_buyer_waits_and_gets_one_given_back(booking, booking_pool):
    """A free stylist is never hidden: with both stylists' holds inserted by buyers not yet
    committed, a third buyer waits for them (the constraint decides), and takes the stylist whose
    buyer rolled back."""
    s = await service_salon(booking, resources=2)
    start = await _first_time(booking, s)
    slot = await service_slot(booking, s, start)
    open_ = [await _take_in_open_transaction(booking_pool, slot.id) for _ in range(2)]
    assert sorted(t for _, _, t in open_) == sorted(s.resource_ids)
    (c0, tx0, given_back), (c1, tx1, _) = open_
    third = asyncio.create_task(_hold(booking, slot.id))
    try:
        await asyncio.sleep(0.5)
        assert not third.done()  # waiting on the constraint, not told "taken"
    finally:
        await tx0.rollback()
        await booking_pool.release(c0)
        await tx1.commit()
        await booking_pool.release(c1)
    assert (await asyncio.wait_for(third, timeout=30)).resource_id == given_back
    for r in s.resource_ids:
        assert await _active(booking_pool, r, start) == 1


async def test_buyers_of_overlapping_any_stylist_times_never_share_a_stylist(booking, booking_pool):
    """Real concurrency across starts that overlap (10:00, 10:15, 10:30 of an hour's service on 4
    stylists: the advisory lock is per start, so only the exclusion constraint keeps them apart),
    with buyers of stylist 0 by name among them. The database afterwards: no two active holds of
    one stylist overlap, and every stylist was sold once (each can take one of the three)."""
    s = await service_salon(booking, resources=4)
    starts = [await _first_time(booking, s, h) for h in ("10:00", "10:15", "10:30")]
    slots = [await service_slot(booking, s, t) for t in starts]
    named = await service_slot(booking, s, starts[1], s.resource_ids[0])
    # 90 calls at once: under the service's cap of concurrent calls (128), beyond which grpc
    # itself refuses with RESOURCE_EXHAUSTED before any handler runs.
    calls = [_hold(booking, sl.id) for sl in slots for _ in range(25)] + [_hold(booking, named.id) for _ in range(15)]
    random.Random(11).shuffle(calls)
    results = await asyncio.gather(*calls, return_exceptions=True)
    won = [r for r in results if isinstance(r, pb.Hold)]
    lost = [e.code() if isinstance(e, grpc.aio.AioRpcError) else repr(e) for e in results if not isinstance(e, pb.Hold)]
    assert set(lost) == {grpc.StatusCode.ALREADY_EXISTS}, [(e.code(), e.details()) if isinstance(e, grpc.aio.AioRpcError)
                                                           else repr(e) for e in results if not isinstance(e, pb.Hold)][:5]
    assert sorted(h.resource_id for h in won) == sorted(s.resource_ids)
    rows = await booking_pool.fetch(
        "SELECT resource_id::text, during FROM holds WHERE salon_id = $1 AND status IN ('held', 'confirmed')",
        s.salon_id)
    assert sorted(r["resource_id"] for r in rows) == sorted(s.resource_ids)
    assert await booking_pool.fetchval("""
        SELECT count(*) FROM holds a JOIN holds b ON a.resource_id = b.resource_id AND a.id < b.id AND a.during && b.during
         WHERE a.salon_id = $1 AND a.status IN ('held', 'confirmed') AND b.status IN ('held', 'confirmed')""",
        s.salon_id) == 0
