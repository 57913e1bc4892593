"""The sweeper marks expired holds; several replicas may sweep at once without double counting."""
import asyncio
import dataclasses

from booking import metrics
from booking.bootstrap import create_server
from booking.workers import Sweeper
from booking_harness import Booking, expired, tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cuty.booking.v1 import booking_pb2_grpc
from booking.grpc_api import CALLERS
from cutylib.testing.trust import acting_channel
from cutylib.testing.procs import wait_for


async def test_two_sweepers_at_once_expire_each_hold_exactly_once(short_booking, booking, booking_pool):
    salon, resources = await booking.salon(resources=4)
    slots = await booking.day(salon, resources, tomorrow(6), count=10, minutes=30)
    stale = [await short_booking.hold(s.id) for r in resources for s in slots[r]]
    # a live hold and a confirmed booking must never be touched
    salon2, (r2,) = await booking.salon()
    s2 = (await booking.day(salon2, [r2], tomorrow(6), count=2))[r2]
    live = await booking.hold(s2[0].id)
    confirmed = await booking.hold(s2[1].id)
    await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=confirmed.id, payment_ref="pay_s"))
    await wait_for(lambda: expired(booking_pool, stale[-1].id), timeout=10, message="the holds to expire")

    # small batches, so that the two really interleave
    a, b = await asyncio.gather(Sweeper(booking_pool, 60, batch=3).sweep_once(),
                                Sweeper(booking_pool, 60, batch=3).sweep_once())

    ours = {h.id for h in stale}
    swept_a, swept_b = {str(i) for i in a}, {str(i) for i in b}
    assert not swept_a & swept_b, "a hold was swept twice"
    assert len(a) == len(swept_a) and len(b) == len(swept_b)
    assert ours <= swept_a | swept_b  # other tests' expired holds may be swept too
    rows = await booking_pool.fetch("SELECT id::text, status FROM holds WHERE id = ANY($1::uuid[])",
                                    list(ours | {live.id, confirmed.id}))
    status = {r["id"]: r["status"] for r in rows}
    assert all(status[i] == "expired" for i in ours)
    assert (status[live.id], status[confirmed.id]) == ("held", "confirmed")


async def test_background_sweeper_runs_and_counts(booking_pool):
    settings = dataclasses.replace(short_settings(), sweep_interval_seconds=0.2)
    server = await create_server(settings, booking_pool, port=0, host="127.0.0.1")  # with its sweeper
    await server.start()
    before = metrics.REGISTRY.value("cuty_booking_holds_swept_total")
    try:
        async with acting_channel(f"127.0.0.1:{server.port}", "booking", CALLERS) as ch:
            b = Booking(server, booking_pb2_grpc.BookingServiceStub(ch), settings)
            salon, (r1,) = await b.salon()
            (slot,) = (await b.day(salon, [r1], tomorrow(9), count=1))[r1]
            hold = await b.hold(slot.id)

            async def swept() -> bool:
                return await booking_pool.fetchval("SELECT status FROM holds WHERE id = $1", hold.id) == "expired"

            await wait_for(swept, timeout=10, message="the background sweeper to expire the hold")
    finally:
        await server.stop()
    assert metrics.REGISTRY.value("cuty_booking_holds_swept_total") > before


def short_settings():
    from cutylib.config import Settings

    return dataclasses.replace(Settings(), hold_ttl_seconds=1)
