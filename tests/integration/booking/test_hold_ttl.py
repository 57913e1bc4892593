"""A hold as long as a payment link (HoldSlot.ttl_seconds): the system's only, at most a day; the
database's clock sets its expiry, and the time is blocked for that long (docs/booking.md)."""
from datetime import timedelta

import grpc
import pytest

from booking_harness import tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cutylib.grpc_errors import bad_field
from cutylib.principal import Principal
from cutylib.testing.ids import new_id
from cutylib.testing.trust import user_of


async def _slot(booking):
    salon, (r,) = await booking.salon()
    start = tomorrow(10) + timedelta(days=2)
    return (await booking.slots(salon, [(r, start, start + timedelta(hours=1))]))[0]


async def test_a_link_long_hold_blocks_the_time_for_its_life(booking, booking_pool):
    slot = await _slot(booking)
    hold = await booking.stub.HoldSlot(pb.HoldSlotRequest(slot_id=slot.id, customer_id=new_id(), request_id=new_id(),
                                                          ttl_seconds=7200))
    lasts = await booking_pool.fetchval("SELECT expires_at - clock_timestamp() FROM holds WHERE id = $1", hold.id)
    assert timedelta(seconds=7190) < lasts <= timedelta(seconds=7200)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await booking.stub.HoldSlot(pb.HoldSlotRequest(slot_id=slot.id, customer_id=new_id(), request_id=new_id()))
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_a_hold_length_is_the_systems_and_at_most_a_day(booking, booking_pool):
    slot = await _slot(booking)
    for ttl in (-1, 86_401):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await booking.stub.HoldSlot(pb.HoldSlotRequest(slot_id=slot.id, customer_id=new_id(), request_id=new_id(),
                                                           ttl_seconds=ttl))
        assert (e.value.code(), bad_field(e.value)) == (grpc.StatusCode.INVALID_ARGUMENT, "ttl_seconds")
    alice = Principal(new_id(), "customer")
    with pytest.raises(grpc.aio.AioRpcError) as e:  # a customer may not keep a time for a day
        await booking.stub.HoldSlot(pb.HoldSlotRequest(slot_id=slot.id, request_id="r1", ttl_seconds=3600),
                                    metadata=user_of(alice))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert await booking_pool.fetchval("SELECT count(*) FROM holds WHERE slot_id = $1", slot.id) == 0
