"""A late payment never confirms an appointment that has started, or that starts
within CUTY_CONFIRM_CUTOFF_SECONDS, whether its hold is still live or expired (re-take)."""
import dataclasses
from datetime import datetime, timedelta, timezone

import grpc
import pytest

from booking_harness import Booking, tomorrow
from cuty.booking.v1 import booking_pb2 as pb, booking_pb2_grpc
from cutylib.config import Settings
from booking.grpc_api import CALLERS
from cutylib.testing.trust import acting_channel
from cutylib.grpc_errors import error_reason
from cutylib.testing.ids import new_id

from booking.bootstrap import create_server


async def _held(b: Booking):
    salon, (r1,) = await b.salon()
    (slot,) = (await b.day(salon, [r1], tomorrow(9), count=1))[r1]
    return await b.hold(slot.id)


async def _move_start(pool, hold_id: str, start: str, *, expire: bool) -> None:
    """Put the hold's time (copied from its slot) at `start` from now, and expire the hold if asked."""
    await pool.execute(
        "UPDATE holds SET start_time = clock_timestamp() + $2::text::interval, "
        "end_time = clock_timestamp() + $2::text::interval + interval '1 hour', "
        "expires_at = CASE WHEN $3 THEN clock_timestamp() - interval '1 second' ELSE expires_at END "
        "WHERE id = $1", hold_id, start, expire)


async def _refused(b: Booking, hold_id: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await b.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=hold_id, payment_ref="pay-" + new_id()))
    return e.value


@pytest.mark.parametrize("expire", [False, True], ids=["live-hold", "expired-hold"])
async def test_a_started_slot_is_never_confirmed(booking, booking_pool, expire):
    hold = await _held(booking)
    await _move_start(booking_pool, hold.id, "-1 minute", expire=expire)
    err = await _refused(booking, hold.id)
    assert (err.code(), error_reason(err)) == (grpc.StatusCode.FAILED_PRECONDITION, "slot-started")
    assert await booking_pool.fetchval("SELECT status FROM holds WHERE id = $1", hold.id) == "held"
    assert await booking_pool.fetchval("SELECT payment_ref FROM holds WHERE id = $1", hold.id) is None


async def test_a_confirmed_booking_repeats_its_answer_after_the_start(booking, booking_pool):
    hold = await _held(booking)
    req = pb.ConfirmHoldRequest(hold_id=hold.id, payment_ref="pay-" + new_id())
    await booking.stub.ConfirmHold(req)
    await _move_start(booking_pool, hold.id, "-1 minute", expire=False)
    again = await booking.stub.ConfirmHold(req)
    assert again.status == pb.HOLD_STATUS_CONFIRMED


async def test_the_cutoff_refuses_a_slot_about_to_start(booking_pool):
    settings = dataclasses.replace(Settings(), sweep_interval_seconds=3600, confirm_cutoff_seconds=3600)
    server = await create_server(settings, booking_pool, port=0, host="127.0.0.1", sweeper=False)
    await server.start()
    try:
        async with acting_channel(f"127.0.0.1:{server.port}", "booking", CALLERS, deadline_seconds=20) as channel:
            b = Booking(server, booking_pb2_grpc.BookingServiceStub(channel), settings)
            soon, later = await _held(b), await _held(b)
            await _move_start(booking_pool, soon.id, "30 minutes", expire=True)
            err = await _refused(b, soon.id)
            assert error_reason(err) == "slot-started"
            await _move_start(booking_pool, later.id, "2 hours", expire=True)  # re-taken: still free
            confirmed = await b.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=later.id, payment_ref="p-" + new_id()))
            assert confirmed.status == pb.HOLD_STATUS_CONFIRMED
    finally:
        await server.stop()
