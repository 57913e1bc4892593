"""An expired hold never blocks (docs/architecture.md, invariant 2), swept or not; confirming an expired hold
re-acquires its time when it is still free and fails when someone else has it.

`short_booking` gives 1-second holds; `booking` (same database, 300-second holds) plays the other
customers, so their holds cannot expire while a test watches them.
"""
import asyncio

import grpc
import pytest

from booking import metrics
from booking.workers import Sweeper
from booking_harness import expired, tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.grpc_errors import error_reason
from cutylib.testing.procs import wait_for


async def _status(pool, hold_id: str) -> str:
    return await pool.fetchval("SELECT status FROM holds WHERE id = $1", hold_id)


async def _active(pool, resource_id: str) -> list[str]:
    rows = await pool.fetch("SELECT id::text FROM holds WHERE resource_id = $1 AND status IN ('held', 'confirmed')",
                            resource_id)
    return [r["id"] for r in rows]


async def _one_slot(b):
    salon, (r1,) = await b.salon()
    (slot,) = (await b.day(salon, [r1], tomorrow(9), count=1))[r1]
    return r1, slot


async def test_expired_hold_is_taken_over_by_one_of_many_without_the_sweeper(short_booking, booking, booking_pool):
    r1, slot = await _one_slot(booking)
    first = await short_booking.hold(slot.id)
    with pytest.raises(grpc.aio.AioRpcError) as e:  # while it lives, it blocks
        await booking.hold(slot.id)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS

    await wait_for(lambda: expired(booking_pool, first.id), timeout=10, message="the first hold to expire")
    assert await _status(booking_pool, first.id) == "held"  # not swept: no sweeper runs here

    taken_over = metrics.REGISTRY.value("cuty_booking_expired_holds_taken_over_total")
    results = await asyncio.gather(*(booking.hold(slot.id) for _ in range(50)), return_exceptions=True)
    winners = [r for r in results if isinstance(r, pb.Hold)]
    assert len(winners) == 1
    assert all(r.code() == grpc.StatusCode.ALREADY_EXISTS for r in results if not isinstance(r, pb.Hold))
    assert await _status(booking_pool, first.id) == "expired"
    assert await _active(booking_pool, r1) == [winners[0].id]
    got = await booking.stub.GetHold(pb.GetHoldRequest(hold_id=first.id))
    assert got.status == pb.HOLD_STATUS_EXPIRED
    # The winner took the expired hold over (the operator's "expired holds taken over" metric).
    assert metrics.REGISTRY.value("cuty_booking_expired_holds_taken_over_total") - taken_over == 1


async def test_hold_reads_expired_as_soon_as_its_time_is_up(short_booking, booking_pool):
    r1, slot = await _one_slot(short_booking)
    hold = await short_booking.hold(slot.id)
    assert hold.status == pb.HOLD_STATUS_HELD
    await wait_for(lambda: expired(booking_pool, hold.id), timeout=10, message="expiry")
    got = await short_booking.stub.GetHold(pb.GetHoldRequest(hold_id=hold.id))
    assert got.status == pb.HOLD_STATUS_EXPIRED
    assert (await short_booking.stub.GetSlot(pb.GetSlotRequest(slot_id=slot.id))).available


@pytest.mark.parametrize("swept", [False, True], ids=["unswept", "swept"])
async def test_confirm_after_expiry_reacquires_free_time(short_booking, booking_pool, swept):
    r1, slot = await _one_slot(short_booking)
    hold = await short_booking.hold(slot.id)
    await wait_for(lambda: expired(booking_pool, hold.id), timeout=10, message="expiry")
    if swept:
        await Sweeper(booking_pool, 60).sweep_once()
        assert await _status(booking_pool, hold.id) == "expired"

    confirmed = await short_booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=hold.id, payment_ref="pay_1"))

    assert (confirmed.id, confirmed.status, confirmed.payment_ref) == (hold.id, pb.HOLD_STATUS_CONFIRMED, "pay_1")
    assert await _status(booking_pool, hold.id) == "confirmed"
    assert await _active(booking_pool, r1) == [hold.id]


async def test_confirm_after_expiry_fails_when_the_time_was_taken(short_booking, booking, booking_pool):
    r1, slot = await _one_slot(booking)
    mine = await short_booking.hold(slot.id)
    await wait_for(lambda: expired(booking_pool, mine.id), timeout=10, message="expiry")
    theirs = await booking.hold(slot.id)

    with pytest.raises(grpc.aio.AioRpcError) as e:
        await short_booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=mine.id, payment_ref="pay_2"))

    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(e.value) == "hold-lost"
    assert await _status(booking_pool, mine.id) == "expired"
    assert await _active(booking_pool, r1) == [theirs.id]


async def test_confirm_reacquires_over_another_expired_unswept_hold(short_booking, booking_pool):
    """A expired and was swept; B took the time and expired too, unswept. A's confirm must not be
    blocked by B's stale row."""
    r1, slot = await _one_slot(short_booking)
    a = await short_booking.hold(slot.id)
    await wait_for(lambda: expired(booking_pool, a.id), timeout=10, message="A's expiry")
    b = await short_booking.hold(slot.id)
    await wait_for(lambda: expired(booking_pool, b.id), timeout=10, message="B's expiry")
    assert (await _status(booking_pool, a.id), await _status(booking_pool, b.id)) == ("expired", "held")

    confirmed = await short_booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=a.id, payment_ref="pay_3"))

    assert confirmed.status == pb.HOLD_STATUS_CONFIRMED
    assert await _status(booking_pool, b.id) == "expired"
    assert await _active(booking_pool, r1) == [a.id]


async def test_late_confirm_racing_takeovers_leaves_exactly_one_owner(short_booking, booking, booking_pool):
    r1, slot = await _one_slot(booking)
    mine = await short_booking.hold(slot.id)
    await wait_for(lambda: expired(booking_pool, mine.id), timeout=10, message="expiry")

    confirm = booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=mine.id, payment_ref="pay_4"))
    results = await asyncio.gather(confirm, *(booking.hold(slot.id) for _ in range(20)), return_exceptions=True)

    confirm_result, holds = results[0], results[1:]
    winners = [h for h in holds if isinstance(h, pb.Hold)]
    if isinstance(confirm_result, pb.Hold):
        assert confirm_result.status == pb.HOLD_STATUS_CONFIRMED and winners == []
        assert await _active(booking_pool, r1) == [mine.id]
    else:
        assert confirm_result.code() == grpc.StatusCode.FAILED_PRECONDITION and len(winners) == 1
        assert await _active(booking_pool, r1) == [winners[0].id]
    assert all(h.code() == grpc.StatusCode.ALREADY_EXISTS for h in holds if not isinstance(h, pb.Hold))


async def test_an_expired_hold_cannot_be_extended(short_booking, booking_pool):
    r1, slot = await _one_slot(short_booking)
    hold = await short_booking.hold(slot.id)
    await wait_for(lambda: expired(booking_pool, hold.id), timeout=10, message="expiry")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await short_booking.stub.ExtendHold(pb.ExtendHoldRequest(hold_id=hold.id))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(e.value) == "hold-expired"
    # releasing it succeeds (the saga's cleanup of an unpaid checkout) and it stays expired
    released = await short_booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=hold.id))
    assert released.status == pb.HOLD_STATUS_EXPIRED
