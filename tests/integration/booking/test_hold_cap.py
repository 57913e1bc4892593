"""A customer has at most CUTY_MAX_ACTIVE_HOLDS (3) active holds, also when asking in parallel."""
import asyncio
import uuid
from collections import Counter

import grpc
import pytest

from booking.repository import Holds
from booking_harness import expired, tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.db import create_pool
from cutylib.grpc_errors import error_reason
from cutylib.testing.ids import new_id
from cutylib.testing.procs import wait_for


async def _slots(b, n):
    salon, (r1,) = await b.salon()
    return (await b.day(salon, [r1], tomorrow(6), count=n, minutes=30))[r1]


async def _held(pool, customer: str) -> int:
    return await pool.fetchval("SELECT count(*) FROM holds WHERE customer_id = $1 AND status = 'held'", customer)


async def test_fourth_hold_is_refused_until_one_is_released(booking, booking_pool):
    assert booking.settings.max_active_holds == 3
    slots = await _slots(booking, 5)
    me = new_id()
    holds = [await booking.hold(s.id, me) for s in slots[:3]]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.hold(slots[3].id, me)
    assert (e.value.code(), error_reason(e.value)) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "too-many-active-holds")
    assert await booking_pool.fetchval("SELECT count(*) FROM holds WHERE slot_id = $1", slots[3].id) == 0

    await booking.stub.ReleaseHold(pb.ReleaseHoldRequest(hold_id=holds[0].id))
    assert (await booking.hold(slots[3].id, me)).status == pb.HOLD_STATUS_HELD
    # a confirmed booking is not a hold: it does not count against the cap
    await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=holds[1].id, payment_ref="pay_cap"))
    assert (await booking.hold(slots[4].id, me)).status == pb.HOLD_STATUS_HELD
    assert await _held(booking_pool, me) == 3


async def test_cap_holds_under_concurrent_requests(booking, booking_pool):
    slots = await _slots(booking, 12)
    me = new_id()
    results = await asyncio.gather(*(booking.hold(s.id, me) for s in slots), return_exceptions=True)
    won = [r for r in results if isinstance(r, pb.Hold)]
    refused = [r for r in results if not isinstance(r, pb.Hold)]
    assert len(won) == 3
    assert {r.code() for r in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert await _held(booking_pool, me) == 3


async def test_expired_holds_do_not_count(short_booking, booking, booking_pool):
    slots = await _slots(booking, 4)
    me = new_id()
    holds = [await short_booking.hold(s.id, me) for s in slots[:3]]
    await wait_for(lambda: expired(booking_pool, holds[-1].id), timeout=10, message="the holds to expire")
    assert (await booking.hold(slots[3].id, me)).status == pb.HOLD_STATUS_HELD


async def test_cap_is_enforced_by_the_database_under_heavy_parallelism(booking, booking_dsn, booking_pool):
    """Below gRPC, straight at the statement from 40 connections: 5 customers each ask for 16 slots
    at once. Python could not stop this race; the database must."""
    salon, resources = await booking.salon(resources=5)
    slots = await booking.day(salon, resources, tomorrow(6), count=16, minutes=30)
    customers = {r: new_id() for r in resources}
    pool = await create_pool(booking_dsn, min_size=40, max_size=40)
    try:
        holds = Holds(pool)
        outcomes = await asyncio.gather(*(
            holds.take(uuid.UUID(s.id), customers[r], new_id(), ttl_seconds=300, max_active=3, max_alternatives=3)
            for r in resources for s in slots[r]))
    finally:
        await pool.close()
    assert Counter(o[0] for o in outcomes) == {"held": 15, "cap": 65}
    for c in customers.values():
        assert await _held(booking_pool, c) == 3
